//! Starts a master: opens storage, loads the read model, starts the actors,
//! the agent listener and the admin API. Runs inside an actix `System`.

use std::net::SocketAddr;
use std::sync::Arc;

use actix::{Arbiter, ArbiterHandle};
use actix_web::{App, HttpServer};
use tokio::net::TcpListener;

use crate::actors::agent_listener::ListenerConfig;
use crate::actors::node_link::NodeLinks;
use crate::actors::packages::{Packages, UploadLimits};
use crate::actors::placement::PortAllocator;
use crate::actors::priority::Priority;
use crate::actors::read_model::{ActorStats, PackageView, ReadModel};
use crate::actors::registry::Registry;
use crate::actors::supervisor::{Boot, Supervisor};
use crate::actors::tokens::ApiTokens;
use crate::actors::trust::Trust;
use crate::actors::{Limits, Shared, Timing};
use crate::config::MasterConfig;
use crate::spec::ComponentSpec;
use crate::storage::meta::ClusterState;
use crate::storage::{BlobStore, MetaStore, meta};

#[derive(Debug, thiserror::Error)]
pub enum MasterError {
    #[error("cannot open storage")]
    Storage(#[source] crate::storage::StorageError),
    #[error("cannot listen on {addr}")]
    Listen {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write {path}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot start an actor thread")]
    Runtime {
        #[source]
        source: std::io::Error,
    },
    #[error("cannot create the first API token")]
    Token(#[source] crate::error::Error),
    #[error("cannot set up the agent link's TLS")]
    Trust(#[source] crate::actors::trust::TrustError),
    #[error("cannot set up the node pools")]
    Pools(#[source] crate::providers::pool_config::PoolConfigError),
    /// A child whose death cannot be survived (`supervision::GiveUp::ExitMaster`).
    #[error("the master cannot go on: {0}")]
    Fatal(String),
}

/// What `flotilla master --init` asks for: when the store has no API token
/// yet, create one (named `initial`) and hand it over. With tokens in the
/// store, it does nothing (a restart with the same command line is safe).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Init {
    #[default]
    No,
    /// Print the token on stdout (logs go to stderr).
    Print,
    /// Write it to this file (mode 0600, atomically).
    File(std::path::PathBuf),
}

/// Creates the first token if `init` asks for it and there is none.
async fn first_token(tokens: &Arc<ApiTokens>, init: &Init) -> Result<(), MasterError> {
    if !tokens.is_empty() {
        if *init != Init::No {
            tracing::info!("API tokens exist already: --init created none");
        }
        return Ok(());
    }
    if *init == Init::No {
        tracing::warn!("no API token exists, so every /api/v1 request is refused: start once with --init");
        return Ok(());
    }
    // Handed over before it is stored: a token file that cannot be written
    // leaves no token behind, and the next start with --init tries again.
    let new = tokens
        .create_then("initial", crate::scope::Scope::Admin, |new| match init {
            Init::File(path) => write_private(path, format!("{}\n", new.token).as_bytes())
                .map_err(|e| crate::error::Error::invalid("token_file", format!("{}: {e}", path.display()))),
            _ => {
                use std::io::Write;
                writeln!(std::io::stdout(), "{}", new.token)
                    .and_then(|()| std::io::stdout().flush())
                    .map_err(|e| crate::error::Error::invalid("token_file", format!("printing the token: {e}")))
            }
        })
        .await
        .map_err(MasterError::Token)?;
    match init {
        Init::File(path) => tracing::info!(id = %new.record.id, file = %path.display(), "first API token written"),
        _ => tracing::info!(id = %new.record.id, "first API token printed on stdout; it is not shown again"),
    }
    Ok(())
}

pub use crate::private_file::write_private;

/// Threads each of the master's runtimes (the system's, each actor
/// arbiter's, each HTTP worker's) may run blocking work on: reads of package
/// blobs streamed to agents, operations read from the store. With tokio's
/// default (512 per runtime) an install to 1,000 agents at once ran the
/// master with 324 threads (225 of them blocking ones). Beyond this bound,
/// blocking work queues.
pub const BLOCKING_THREADS: usize = 8;

/// Blocking threads of each HTTP worker: store reads of operations, and
/// package uploads' file writes, each short. actix-web keeps an idle one
/// (and its allocator heap) for tokio's default 10 s.
pub const HTTP_BLOCKING_THREADS: usize = 2;

/// How long the master waits at exit for its actor threads to end.
const EXIT_JOIN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// How long an idle blocking thread lives (tokio's default is 10 s). Each
/// keeps its allocator heap while it lives: after an install to 1,000
/// agents the master held 25 MiB more for those 10 s.
pub const BLOCKING_KEEP_ALIVE: std::time::Duration = std::time::Duration::from_secs(1);

/// A runtime for one of the master's threads (see [`BLOCKING_THREADS`]).
pub fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .max_blocking_threads(BLOCKING_THREADS)
        .thread_keep_alive(BLOCKING_KEEP_ALIVE)
        .build()
}

/// Runs the master until the HTTP server stops (SIGINT / SIGTERM).
pub async fn run(cfg: MasterConfig, init: Init) -> Result<(), MasterError> {
    crate::fd_limit::raise();
    let io_err = |path: &std::path::Path| {
        let path = path.display().to_string();
        move |source| MasterError::Io { path, source }
    };
    // Everything the master writes is its own: the store holds config
    // values (passwords among them), the trust dir the CA's key. So files
    // are made 0600 and directories 0700 (umask 077), and the data dir
    // itself is 0700 whatever made it before.
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));
    crate::private_file::private_dir(&cfg.data_dir).map_err(io_err(&cfg.data_dir))?;
    // Installed before anything records: a gauge moved before it (a
    // supervised task counted live as it starts) would be lost for good.
    let metrics = match crate::http::metrics::install() {
        Ok(h) => Some(h),
        Err(e) => {
            tracing::warn!(error = %e, "metrics are not recorded");
            None
        }
    };
    // Bound first: its address names this master to the others (a
    // standby campaigns with it); it answers once the master has booted.
    let http_listener = std::net::TcpListener::bind(&cfg.http_addr)
        .map_err(|source| MasterError::Listen { addr: cfg.http_addr.clone(), source })?;
    let http_addr =
        http_listener.local_addr().map_err(|source| MasterError::Listen { addr: cfg.http_addr.clone(), source })?;
    let named = crate::actors::role::Named::of(&cfg, http_addr);
    let opened = crate::open_store::open(&cfg, named, &http_listener).await.map_err(|e| match e {
        crate::open_store::OpenError::Storage(e) => MasterError::Storage(e),
        crate::open_store::OpenError::Listen(source) => MasterError::Listen { addr: cfg.http_addr.clone(), source },
    })?;
    let (store, role, peers, handover) = (opened.store, opened.role, opened.peers, opened.handover);
    let (won, view) = (opened.won, opened.view);
    // Where a takeover's time goes (logged once serving).
    let opened_at = std::time::Instant::now();
    let verified = view.as_ref().map(|(_, v)| *v);
    let view = view.map(|(state, _)| state);
    let blobs = BlobStore::open(&cfg.data_dir.join("packages")).map_err(MasterError::Storage)?;
    let loader = store.clone();
    let check_view = cfg.etcd.takeover == crate::storage::etcd::Takeover::Checked;
    let (snapshot, history, gone) = tokio::task::spawn_blocking(move || {
        if let (true, Some(view)) = (check_view, &view)
            && let Some(diff) = ClusterState::load(&*loader).map_err(MasterError::Storage)?.difference(view)
        {
            return Err(MasterError::Fatal(format!(
                "the view this master kept as a follower differs from the store ([etcd] takeover = \"checked\"): {diff}"
            )));
        }
        let snap = meta::load_boot_with(&*loader, view).map_err(MasterError::Storage)?;
        let (history, gone) = meta::ended_operations(&*loader, &snap).map_err(MasterError::Storage)?;
        Ok((snap, history, gone))
    })
    .await
    .map_err(|e| MasterError::Storage(crate::storage::StorageError::Codec(e.to_string())))??;
    let read_at = std::time::Instant::now();

    // Instances of a cluster that is gone (a delete a crash cut short
    // between its steps) are not the master's to run: not indexed, their
    // ports not held. Left in the store for the operator to see, not deleted.
    let mut snapshot = snapshot;
    let clusters: std::collections::HashSet<_> = snapshot.clusters.iter().map(|c| c.id).collect();
    let before = snapshot.instances.len();
    snapshot.instances.retain(|i| clusters.contains(&i.cluster_id));
    if snapshot.instances.len() < before {
        tracing::warn!(
            orphans = before - snapshot.instances.len(),
            "instance records of clusters that no longer exist; ignored"
        );
    }
    let tokens = ApiTokens::load(store.clone()).map_err(MasterError::Storage)?;
    first_token(&tokens, &init).await?;
    if role.leadership.is_some() {
        crate::actors::trust::shared_ca::sync(&store, &cfg.data_dir.join("ca"), init != Init::No)
            .await
            .map_err(MasterError::Trust)?;
    }
    let trust = Trust::load(store.clone(), &cfg.data_dir.join("ca"), init != Init::No).map_err(MasterError::Trust)?;
    let read_model = ReadModel::new(store.clone());
    for p in snapshot.packages {
        match ComponentSpec::parse(&p.spec_toml) {
            Ok(spec) => read_model.put_package(PackageView { record: Arc::new(p), spec: Arc::new(spec) }),
            Err(e) => {
                tracing::error!(package = %p.name, version = %p.package_version, error = %e, "stored package spec no longer parses; skipped")
            }
        }
    }
    read_model.put_leftovers(&snapshot.leftovers);
    for n in snapshot.nodes {
        read_model.register_node(n);
    }
    let cordons = Arc::new(
        crate::actors::cordons::Cordons::load(store.clone(), read_model.clone()).map_err(MasterError::Storage)?,
    );
    let (timing, limits) = (Timing::of(&cfg), Limits::of(&cfg));
    // Cluster actors are spread over these threads.
    let threads = if cfg.actor_threads == 0 {
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2)
    } else {
        cfg.actor_threads
    };
    // Owned by the guard, stopped and joined however `run` ends (an error
    // below included); the actors get handles.
    let mut exit = ExitGuard { threads: Vec::new(), store: store.clone() };
    let mut arbiter = || -> Result<ArbiterHandle, MasterError> {
        let a = Arbiter::try_with_tokio_rt(runtime).map_err(|source| MasterError::Runtime { source })?;
        let handle = a.handle();
        exit.threads.push(a);
        Ok(handle)
    };
    let arbiters: Vec<ArbiterHandle> = (0..threads).map(|_| arbiter()).collect::<Result<_, _>>()?;
    // One gate for all of them: bulk work on any actor thread waits while
    // a request to any cluster does (they share the cores).
    let gate = Arc::new(crate::actors::priority::Gate::default());
    let priorities: Vec<Arc<Priority>> = arbiters.iter().map(|_| Arc::new(Priority::sharing(gate.clone()))).collect();
    for (i, (a, p)) in arbiters.iter().zip(&priorities).enumerate() {
        a.spawn(crate::actors::priority::measure_lag(i.to_string(), Some(p.clone())));
        let (p, by) = (p.clone(), cfg.bulk_nice);
        a.spawn(async move { p.lower_thread(by) });
    }
    // Agents' connections on threads of their own: their frames are never
    // held for a request, so they stay off the threads requests wait for.
    let link_threads = match cfg.link_threads {
        0 => (threads / 2).max(1),
        n => n,
    };
    let link_arbiters: Vec<ArbiterHandle> = (0..link_threads).map(|_| arbiter()).collect::<Result<_, _>>()?;
    for (i, a) in link_arbiters.iter().enumerate() {
        a.spawn(crate::actors::priority::measure_lag(format!("link-{i}"), None));
        let by = cfg.bulk_nice;
        a.spawn(async move { crate::actors::priority::lower_for_good(by) });
    }
    let shared = Shared {
        in_flight: Default::default(),
        store: store.clone(),
        blobs: Arc::new(blobs),
        read_model: read_model.clone(),
        links: NodeLinks::default(),
        registry: Registry::default(),
        // Instances an interrupted operation will still create keep their ports.
        ports: Arc::new(PortAllocator::from_instances(
            snapshot.instances.iter().chain(
                snapshot
                    .operations
                    .iter()
                    .filter(|o| !o.status.is_terminal())
                    .filter_map(|o| o.resume.as_ref())
                    .flat_map(|r| r.pending.iter()),
            ),
        )),
        timing,
        limits,
        supervisor: ActorStats::new("supervisor", "supervisor", None),
        priorities: Arc::new(priorities),
        arbiters: Arc::new(arbiters.clone()),
        link_arbiters: Arc::new(link_arbiters.clone()),
        chunk_budget: Arc::new(tokio::sync::Semaphore::new(crate::actors::node_link::CHUNK_BUDGET)),
        tasks: Arc::default(),
        pools: Arc::default(),
        role: role.clone(),
        peers: peers.clone(),
    };
    for l in &snapshot.leftovers {
        shared.ports.reserve(&l.node, l.ports.iter().copied());
    }
    {
        let s = shared.clone();
        crate::actors::supervised::task(&shared, "leaked_sweep", move || {
            let s = s.clone();
            async move {
                crate::actors::leaked::sweep(s).await;
                Err("the sweep stopped".into())
            }
        });
    }
    if let Some(peers) = peers {
        let (blobs, rm) = (shared.blobs.clone(), read_model.clone());
        crate::actors::supervised::task(&shared, "peer_blobs", move || {
            let (peers, blobs, rm) = (peers.clone(), blobs.clone(), rm.clone());
            async move {
                crate::actors::peer_blobs::keep_complete(peers, blobs, rm, || None).await;
                Err("the package fetcher stopped".into())
            }
        });
    }
    // From the start (SIGUSR2's default action would end the master); the
    // pools join the dump once they run.
    actix::spawn(crate::actors::dump::on_sigusr2(read_model.clone(), shared.pools.clone()));
    // Listed in `GET /actors` under the root, as the tree declares it.
    let writer = ActorStats::new("store_writer", "store_writer", Some("master".into()));
    read_model.register_actor(&writer);
    actix::spawn(crate::actors::supervised::watch_store_writer(
        store.clone(),
        shared.tasks.clone(),
        cfg.store_stall_limit,
        writer,
    ));
    if let Some(leadership) = &role.leadership {
        let stats = ActorStats::new("leadership", "leadership", Some("master".into()));
        read_model.register_actor(&stats);
        actix::spawn(crate::actors::role::watch_leadership(
            leadership.clone(),
            shared.tasks.clone(),
            stats,
            shared.links.clone(),
        ));
    }
    let (started, booted) = tokio::sync::oneshot::channel();
    let boot = Boot {
        clusters: snapshot.clusters,
        instances: snapshot.instances,
        operations: snapshot.operations,
        history,
        gone,
        started: Some(started),
    };
    // The root's child: its panic ends the master (`supervision::spec("supervisor")`).
    let supervisor = {
        let (s, tasks) = (shared.clone(), shared.tasks.clone());
        crate::actors::supervised::start_in_arbiter(
            &Arbiter::current(),
            move |_| Supervisor::new(s, boot),
            move || -> crate::actors::supervised::OnPanic {
                Box::new(move |reason| tasks.fatal(format!("the supervisor failed: {reason}")))
            },
        )
    };
    {
        let (s, sup, every) = (shared.clone(), supervisor.clone(), cfg.heartbeat_interval);
        crate::actors::supervised::task(&shared, "node_watcher", move || {
            let (s, sup) = (s.clone(), sup.clone());
            async move {
                crate::actors::announce::watch_nodes(s, sup, every).await;
                Err("the node watcher stopped".into())
            }
        });
    }
    // Agents are admitted once every cluster actor runs (see `Boot::started`).
    // A failure the master cannot survive (the leadership lost while it
    // boots) ends it here too.
    tokio::select! {
        _ = booted => {}
        cause = shared.tasks.fatal_failure() => return Err(MasterError::Fatal(cause)),
    }
    let booted_at = std::time::Instant::now();

    let agent_listener = TcpListener::bind(&cfg.agent_addr)
        .await
        .map_err(|source| MasterError::Listen { addr: cfg.agent_addr.clone(), source })?;
    let agent_addr =
        agent_listener.local_addr().map_err(|source| MasterError::Listen { addr: cfg.agent_addr.clone(), source })?;
    let listener_cfg = ListenerConfig {
        heartbeat_interval: cfg.heartbeat_interval,
        handshake_timeout: cfg.handshake_timeout,
        first_bytes_timeout: cfg.first_bytes_timeout,
        own_addrs: vec![agent_addr, http_addr],
        limits: crate::actors::agent_listener::admission::Limits {
            max_connections: cfg.max_agent_connections,
            general: cfg.max_agent_handshakes,
            reserved: cfg.reserved_agent_handshakes,
            per_source: cfg.max_agent_handshakes_per_source,
            per_subnet: cfg.max_agent_handshakes_per_subnet,
        },
    };
    {
        let listener = Arc::new(agent_listener);
        let (s, sup, t) = (shared.clone(), supervisor.clone(), trust.clone());
        crate::actors::supervised::task(&shared, "agent_listener", move || {
            let run = crate::actors::agent_listener::run(
                listener.clone(),
                s.clone(),
                sup.clone(),
                t.clone(),
                listener_cfg.clone(),
            );
            async move {
                run.await;
                Err("the agent listener stopped".into())
            }
        });
    }
    let pools = crate::actors::pools::start(&shared, trust.clone(), cordons.lock(), &cfg, agent_addr)
        .map_err(MasterError::Pools)?;
    let _ = shared.pools.set(pools.clone());
    if cfg.test_hooks {
        tracing::warn!(
            "test hooks are on (test_hooks): /test-hooks/... injects faults into actors; never in production"
        );
    }
    let state = crate::http::AppState {
        supervisor,
        shared: shared.clone(),
        packages: Packages::new(shared.clone(), UploadLimits::of(&cfg)),
        max_upload_bytes: cfg.max_upload_bytes,
        tokens,
        trust,
        open_health: cfg.open_health,
        open_metrics: cfg.open_metrics,
        log_readers: Default::default(),
        test_hooks: cfg.test_hooks,
        cordons,
        pools,
        request_body_timeout: cfg.request_body_timeout,
        metrics,
    };
    let max_json = cfg.max_json_bytes;
    // The follower's server (on etcd) answered reads while this master
    // booted; it stops taking connections now, and this one takes them.
    if let Some(h) = handover {
        h.finish().await;
    }
    let server = HttpServer::new(move || {
        App::new()
            .wrap(actix_web::middleware::from_fn(crate::http::metrics::track))
            .configure(|c| crate::http::configure(c, state.clone(), max_json))
    })
    .workers(cfg.http_workers.max(1))
    .worker_max_blocking_threads(HTTP_BLOCKING_THREADS)
    // Signals are ours (below): the store must freeze before anything closes.
    .disable_signals()
    // Long polls (`?wait=`) would hold a graceful stop for their full wait.
    .shutdown_timeout(5)
    // A request's head must be in within this (else 408 and closed); its
    // body has `request_body_timeout` (`http::body_deadline`). Set here,
    // not left to actix's default, so a change there cannot lift it.
    .client_request_timeout(crate::http::HEAD_TIMEOUT)
    .listen(http_listener)
    .map_err(|source| MasterError::Listen { addr: cfg.http_addr.clone(), source })?
    .run();

    tracing::info!(api = %format!("http://{http_addr}/api/v1"), agents = %agent_addr, threads, "master ready");
    if let Some((at, marked)) = won {
        let revision = marked.unwrap_or_default();
        let took = crate::actors::role::TookOver {
            from: if verified.is_some() { "view" } else { "store" },
            verified: verified.map(|v| v.as_str()),
            ms: at.elapsed().as_millis() as u64,
        };
        let ms =
            |from: std::time::Instant, to: std::time::Instant| to.saturating_duration_since(from).as_millis() as u64;
        tracing::info!(
            from = took.from,
            verified = took.verified,
            ms = took.ms,
            revision,
            // The store opened and the view there; the rest read; every
            // cluster actor started; the agent listener, pools and server up.
            open_ms = ms(at, opened_at),
            read_ms = ms(opened_at, read_at),
            actors_ms = ms(read_at, booted_at),
            serve_ms = ms(booted_at, std::time::Instant::now()),
            "took over as the leader"
        );
        let _ = role.took_over.set(took);
    }
    if let Some(path) = &cfg.endpoints_file {
        write_endpoints(path, http_addr, agent_addr).map_err(io_err(path))?;
    }
    let handle = server.handle();
    let tasks = shared.tasks.clone();
    actix::spawn(async move {
        tokio::select! {
            () = crate::shutdown::signal() => {
                tracing::info!("shutting down: the store is frozen, running operations resume at the next start");
                // A fatal failure during the stop (the disk hangs) gets
                // its deadline too.
                let tasks = tasks.clone();
                actix::spawn(async move { exit_within(FATAL_EXIT_DEADLINE, tasks.fatal_failure().await) });
            }
            cause = tasks.fatal_failure() => {
                tracing::error!(%cause, "exiting: the store is frozen, running operations resume at the next start");
                exit_within(FATAL_EXIT_DEADLINE, cause);
            }
        }
        store.freeze();
        handle.stop(true).await;
    });
    let served = server.await.map_err(|source| MasterError::Listen { addr: http_addr.to_string(), source });
    drop(exit);
    // A child the master cannot go on without failed: exit non-zero with
    // the cause, so a service manager starts it again.
    if let Some(cause) = shared.tasks.fatal_cause() {
        return Err(MasterError::Fatal(cause));
    }
    served
}

/// How long a master that cannot go on has to stop in order; past it the
/// process ends at once. What made it fatal may hold the orderly stop for
/// good (a writer thread stuck in a write of a hung disk, which the store's
/// drop would join): a master that cannot go on must not linger half working.
const FATAL_EXIT_DEADLINE: std::time::Duration = std::time::Duration::from_secs(20);

/// Ends the process with status 1 if it is still running `after` from now.
fn exit_within(after: std::time::Duration, cause: String) {
    let spawned = std::thread::Builder::new().name("flotilla-exit-deadline".into()).spawn(move || {
        std::thread::sleep(after);
        tracing::error!(%cause, "the orderly stop did not end within {after:?}; exiting now");
        eprintln!("flotilla: the master cannot go on: {cause}");
        // `_exit`, not `exit`: exit handlers and static destructors (the
        // C++ of RocksDB's) could wait on the very thread that is stuck.
        #[allow(unsafe_code)]
        // SAFETY: `_exit` has no precondition; it ends the process at once.
        unsafe {
            libc::_exit(1)
        }
    });
    if let Err(e) = spawned {
        tracing::error!(error = %e, "cannot start the exit deadline's thread");
    }
}

/// Nothing left running when the master exits: its actor threads stopped
/// and joined (their actors hold the store), then the store's background
/// work stopped (RocksDB aborted with `pthread lock: Invalid argument` when
/// the process exited around threads inside it). An actor thread stuck in
/// a blocking call (a hung disk) holds the exit at most
/// [`EXIT_JOIN_TIMEOUT`].
struct ExitGuard {
    threads: Vec<Arbiter>,
    store: Arc<dyn MetaStore>,
}

impl Drop for ExitGuard {
    fn drop(&mut self) {
        for a in &self.threads {
            a.stop();
        }
        let threads = std::mem::take(&mut self.threads);
        let (tx, rx) = std::sync::mpsc::channel();
        let joiner = std::thread::spawn(move || {
            for a in threads {
                let _ = a.join();
            }
            let _ = tx.send(());
        });
        if rx.recv_timeout(EXIT_JOIN_TIMEOUT).is_ok() {
            let _ = joiner.join();
        } else {
            tracing::warn!("actor threads still running {EXIT_JOIN_TIMEOUT:?} after the stop; exiting anyway");
        }
        self.store.quiesce();
    }
}

/// Writes `{"api_url", "agent_addr"}` atomically (temp file + rename), so a
/// script polling for it never reads half a file.
pub fn write_endpoints(path: &std::path::Path, http: SocketAddr, agents: SocketAddr) -> std::io::Result<()> {
    let body = serde_json::json!({ "api_url": format!("http://{http}"), "agent_addr": agents.to_string() });
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(&body).unwrap_or_default())?;
    std::fs::rename(tmp, path)
}
