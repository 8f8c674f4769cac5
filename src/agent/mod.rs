//! The node manager (agent): one per machine. It dials the master, installs
//! packages into per-instance directories, writes rendered config, and runs,
//! watches and stops the instances' processes (DESIGN.md §12).
//!
//! - [`connection`]: dial, TLS, handshake, request loop, heartbeats
//! - [`enroll`]: this node's certificate, kept or got with a join token
//! - [`node`]: the instance records and the command handlers
//! - [`installer`]: streaming, checked tar extraction into a staging dir
//! - [`beneath`]: every file operation inside an instance directory, never following its links
//! - [`files`]: rendered files, written atomically, never through a link
//! - [`health`]: health probes gating `Started`, and `CheckHealth`
//! - [`hooks`]: lifecycle hooks (`RunHook`), serialized with the instance's commands
//! - [`process`]: spawn, pid identity, pidfiles, cgroups, tree kill
//! - [`restart`]: the restart policy for crashed instances
//! - [`outbox`]: reports of exits and restarts, kept until the master acknowledges them

pub mod beneath;
pub mod connection;
pub mod enroll;
pub mod files;
pub mod health;
pub mod hooks;
mod install_feed;
pub mod installer;
pub mod master_term;
pub mod masters;
pub mod node;
pub mod outbox;
pub mod process;
pub mod restart;
#[cfg(test)]
mod testkit;

use std::sync::Arc;

use crate::config::AgentConfig;
use crate::ids::NodeId;
use crate::storage::AgentStore;

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("invalid configuration")]
    Config(#[source] crate::config::ConfigError),
    #[error("cannot open the agent's store")]
    Storage(#[source] crate::storage::StorageError),
    #[error("cannot enroll with the master")]
    Enroll(#[source] enroll::EnrollError),
    #[error("cannot prepare {path}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// Creates `dir` (and its parents) if missing and sets its mode.
pub fn data_dir_mode(dir: &std::path::Path, mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode))
}

/// Runs an agent until `shutdown` resolves.
pub async fn run(cfg: AgentConfig, shutdown: impl std::future::Future<Output = ()>) -> Result<(), AgentError> {
    crate::fd_limit::raise();
    let port_range = cfg.ports().map_err(AgentError::Config)?;
    let masters = masters::Masters::parse(&cfg.master_addr)
        .map_err(|message| AgentError::Config(crate::config::ConfigError::Invalid { key: "master_addr", message }))?;
    // The agent's store, package cache and certificate are its own: files
    // 0600, directories 0700 (umask 077; instances get 022, see
    // `process::vfork`). The data dir is 0711: instance users must pass
    // through it to their directories under `instances/`, but may not list
    // it.
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));
    data_dir_mode(&cfg.data_dir, 0o711)
        .map_err(|source| AgentError::Io { path: cfg.data_dir.display().to_string(), source })?;
    // Everything in it but `instances/` is the agent's alone, whatever mode
    // an earlier release (umask 022) left: the store holds every instance's
    // rendered environment, secrets included.
    for private in ["db", "packages", "tls"] {
        use std::os::unix::fs::PermissionsExt;
        let dir = cfg.data_dir.join(private);
        if dir.is_dir() {
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
                .map_err(|source| AgentError::Io { path: dir.display().to_string(), source })?;
        }
    }
    let node_id = NodeId::new(cfg.node_id.clone());
    let enrolling = enroll::credentials(
        &cfg.data_dir,
        &node_id,
        cfg.join_token.as_ref().map(|t| t.0.as_str()),
        masters.clone(),
        &cfg.address,
        cfg.handshake_timeout,
        cfg.reconnect_max_backoff,
    );
    tokio::pin!(shutdown);
    let credentials = tokio::select! {
        c = enrolling => c.map_err(AgentError::Enroll)?,
        _ = &mut shutdown => return Ok(()),
    };
    let tls = credentials.client_config().map_err(|e| AgentError::Enroll(e.into()))?;
    let store = AgentStore::open(&cfg.data_dir.join("db")).map_err(AgentError::Storage)?;
    let processes = process::ProcessController::new(&cfg.node_id, cfg.use_cgroups);
    let cgroups = processes.cgroups_enabled();
    let resource_limits = processes.resource_limits_enabled();
    let policy = node::RunAsPolicy::from_config(&cfg);
    let node = node::Node::new(store, processes, &cfg.data_dir, policy, cfg.address.clone())
        .map_err(|source| AgentError::Io { path: cfg.data_dir.display().to_string(), source })?;
    node.set_restart_policy(restart::RestartPolicy {
        max: cfg.restart_max,
        window: cfg.restart_window,
        backoff: cfg.restart_backoff,
    });
    node.recover().await.map_err(AgentError::Storage)?;
    tracing::info!(node = %cfg.node_id, root = %node.root.display(), cgroups, resource_limits, "agent ready");

    let identity = connection::Identity {
        node_id,
        address: cfg.address.clone(),
        port_range,
        labels: cfg.labels.clone(),
        cgroups,
        resource_limits,
    };
    let dumper = tokio::spawn(dump_on_sigusr2(Arc::clone(&node)));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let link = tokio::spawn(connection::serve(
        Arc::clone(&node),
        identity,
        masters,
        tls,
        cfg.handshake_timeout,
        cfg.reconnect_max_backoff,
        stop_rx,
    ));
    shutdown.await;
    let _ = stop_tx.send(true);
    let _ = link.await;
    if cfg.stop_instances_on_exit {
        tracing::info!("stopping every instance before exit");
        node.stop_all().await;
    }
    node.processes.remove_empty_bases();
    dumper.abort();
    Ok(())
}

/// `kill -USR2 <agent>`: every instance slot, with its pid identity and
/// who holds its lock, to the log.
async fn dump_on_sigusr2(node: Arc<node::Node>) {
    use tokio::signal::unix::{SignalKind, signal};
    let Ok(mut usr2) = signal(SignalKind::user_defined2()) else { return };
    while usr2.recv().await.is_some() {
        let lines = node.dump();
        tracing::info!(target: "flotilla::dump", slots = lines.len(), "SIGUSR2: instance slots");
        for line in lines {
            tracing::info!(target: "flotilla::dump", "{line}");
        }
    }
}
