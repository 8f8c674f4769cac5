//! Running and stopping the processes of instances (DESIGN.md §12).
//!
//! [`ProcessController`] starts an instance's command as its run-as user,
//! in the instance directory, with a clean environment and its output in
//! `logs/`; with a pidfile it waits for the daemon's pid and adopts it only
//! if it belongs to the instance's process tree. Every instance runs in its
//! own cgroup v2 where the agent can create one ([`cgroup`]), else in its own
//! process group; either way every process carries the environment marker
//! `FLOTILLA_INSTANCE=<id>` ([`tree`]). Stopping kills the whole tree: stop
//! command, TERM, grace period, KILL. Resource limits go into per-instance
//! cgroups of whichever hierarchy (v2 or v1) holds the memory and cpu
//! controllers ([`limits`]); a start that asks for limits this agent cannot
//! enforce fails instead of running unlimited.
//!
//! A process is known by its [`PidIdentity`] (pid + start time + boot id):
//! nothing is signalled whose identity does not match, so a recycled pid is
//! safe.

pub mod cgroup;
mod child;
mod error;
pub mod identity;
pub mod limits;
pub mod oneshot;
pub mod pidfile;
pub mod probe;
mod scan;
mod spawn;
mod start;
mod stop;
mod stop_cgroup;
mod sys;
pub mod tree;
pub mod users;
mod vfork;
mod watch;

#[cfg(test)]
mod tests;

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

pub use cgroup::CgroupRoot;
pub use error::ProcessError;
pub use limits::{LimitRoot, LimitsError};
pub use oneshot::{Ending, OneShot, OneShotResult, run_oneshot};
pub use users::RunAs;
pub use watch::{ExitInfo, ExitWatch};

use crate::ids::InstanceId;
use crate::protocol::messages::ProcessSpec;
use crate::storage::agent_records::PidIdentity;

/// What to start.
#[derive(Debug, Clone, Copy)]
pub struct StartRequest<'a> {
    pub instance: &'a InstanceId,
    /// The instance directory: working directory, base of relative paths.
    pub dir: &'a Path,
    pub spec: &'a ProcessSpec,
    pub run_as: &'a RunAs,
    /// The process the agent last started, if it recorded one.
    pub current: Option<&'a PidIdentity>,
    /// A foreground process that exits within this is a failed start; one
    /// that exits later is a crash (reported after the fact). Zero: answer
    /// at once.
    pub settle: std::time::Duration,
}

/// What to stop.
#[derive(Debug, Clone, Copy)]
pub struct StopRequest<'a> {
    pub instance: &'a InstanceId,
    pub dir: &'a Path,
    /// For the stop command and the grace period.
    pub spec: &'a ProcessSpec,
    /// Who runs the stop command.
    pub run_as: &'a RunAs,
    /// The main process the agent recorded, if any.
    pub current: Option<&'a PidIdentity>,
}

/// A started (or already running) instance.
#[derive(Debug, Clone)]
pub struct Started {
    pub identity: PidIdentity,
    pub already_running: bool,
    /// Resolves when this process is gone (see [`ProcessController::watch`]).
    pub exit: ExitWatch,
}

/// The main process the controller started for an instance.
#[derive(Debug)]
struct Tracked {
    identity: PidIdentity,
    exit: ExitWatch,
}

/// Starts, stops and watches the processes of the instances of one agent.
#[derive(Debug)]
pub struct ProcessController {
    cgroups: Option<CgroupRoot>,
    /// Where limits go, or why this agent cannot enforce them.
    limits: Result<LimitRoot, String>,
    boot_id: String,
    tracked: Mutex<HashMap<InstanceId, Tracked>>,
    /// Passes over `/proc`, shared by concurrent starts and stops.
    scanner: scan::Scanner,
    /// Instances whose last stop, in this controller's lifetime, saw their
    /// cgroup empty and then a pass find nothing of them, and that no start
    /// has touched since (see [`ProcessController::confirmed_stopped`]).
    confirmed: Mutex<HashSet<InstanceId>>,
}

impl ProcessController {
    /// `node_scope` names this agent's cgroup subtree (several agents may
    /// share a machine); `use_cgroups == false` forces process groups and
    /// leaves every cgroup alone, so no resource limits either.
    pub fn new(node_scope: &str, use_cgroups: bool) -> Self {
        let cgroups = if use_cgroups { CgroupRoot::detect(node_scope) } else { None };
        match &cgroups {
            Some(c) => tracing::info!(base = %c.base().display(), "instances run in their own cgroup v2"),
            None => tracing::info!(use_cgroups, "no writable cgroup v2: instances run in their own process group"),
        }
        let limits = if use_cgroups {
            LimitRoot::detect(node_scope)
        } else {
            Err("cgroups are disabled (use_cgroups = false)".into())
        };
        match &limits {
            Ok(l) => tracing::info!(
                memory = %l.memory().mount.display(),
                cpu = %l.cpu().mount.display(),
                "resource limits are enforced"
            ),
            Err(reason) => tracing::info!(%reason, "resource limits cannot be enforced"),
        }
        let boot_id = identity::boot_id().unwrap_or_else(|e| {
            tracing::warn!(error = %e, "cannot read the boot id");
            String::new()
        });
        ProcessController {
            cgroups,
            limits,
            boot_id,
            tracked: Mutex::new(HashMap::new()),
            scanner: Default::default(),
            confirmed: Mutex::default(),
        }
    }

    /// True when instances get their own cgroup.
    pub fn cgroups_enabled(&self) -> bool {
        self.cgroups.is_some()
    }

    /// True when this agent can enforce `ProcessSpec::limits`.
    pub fn resource_limits_enabled(&self) -> bool {
        self.limits.is_ok()
    }

    /// Removes this node's own cgroup directories (`flotilla/<node>` in each
    /// hierarchy) when nothing is left in them: at agent exit, so a stopped
    /// agent leaves no directory behind. A directory that still holds an
    /// instance's cgroup is kept (rmdir refuses), so running instances lose
    /// nothing.
    pub fn remove_empty_bases(&self) {
        let mut bases: Vec<PathBuf> = self.limits.as_ref().map(|l| l.bases()).unwrap_or_default();
        bases.extend(self.cgroups.as_ref().map(|c| c.base().to_path_buf()));
        for b in bases {
            match std::fs::remove_dir(&b) {
                Ok(()) => tracing::debug!(cgroup = %b.display(), "removed the node's cgroup directory"),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => tracing::debug!(cgroup = %b.display(), error = %e, "kept the node's cgroup directory"),
            }
        }
    }

    /// The limit cgroup directories of `instance` (existing or not); empty
    /// when limits are not enforced.
    pub fn limit_cgroups_of(&self, instance: &InstanceId) -> Vec<PathBuf> {
        self.limits.as_ref().ok().and_then(|l| l.dirs_of(instance).ok()).unwrap_or_default()
    }

    /// The boot id identities are recorded with.
    pub fn boot_id(&self) -> &str {
        &self.boot_id
    }

    /// True when the process `id` describes still runs (see [`identity::is_alive`]).
    pub fn is_alive(&self, id: &PidIdentity) -> bool {
        identity::is_alive(id)
    }

    /// The cgroup directory of `instance`, when cgroups are in use.
    pub fn cgroup_of(&self, instance: &InstanceId) -> Option<PathBuf> {
        self.cgroups.as_ref().and_then(|c| c.path_of(instance).ok())
    }

    /// Every live process of the instance (main process, children, daemons).
    pub fn instance_pids(&self, instance: &InstanceId) -> Vec<u32> {
        let known: Vec<PidIdentity> = self.tracked().get(instance).map(|t| t.identity.clone()).into_iter().collect();
        let members = tree::collect(instance, &known, self.cgroup_of(instance).as_deref());
        members.unwrap_or_default().into_iter().map(|m| m.pid).collect()
    }

    /// Every live process of the instance, from a pass over `/proc` that
    /// started after this call (shared with concurrent callers); an error
    /// when `/proc` could not be read whole.
    pub(crate) async fn members(
        &self,
        instance: &InstanceId,
        known: &[PidIdentity],
        cg: Option<&std::path::Path>,
    ) -> Result<Vec<tree::Member>, ProcessError> {
        let snap = self.scanner.fresh().await.map_err(|e| ProcessError::io("scanning /proc", e))?;
        Ok(tree::collect_in(&snap, instance, known, cg))
    }

    /// Resolves when the process with this identity is gone, with its exit
    /// status when it was the agent's child. Subscribe right after a start:
    /// an exit that happened meanwhile resolves at once. For a process the
    /// controller did not start (re-adopted after an agent restart) the
    /// identity is polled.
    pub fn watch(
        &self,
        instance: &InstanceId,
        identity: &PidIdentity,
    ) -> impl Future<Output = ExitInfo> + Send + 'static {
        self.exit_watch_for(instance, identity).wait()
    }

    /// Something to await (or poll with [`ExitWatch::try_exited`]) for the
    /// end of the process with this identity; see [`Self::watch`].
    pub fn exit_watch(&self, instance: &InstanceId, identity: &PidIdentity) -> ExitWatch {
        self.exit_watch_for(instance, identity)
    }

    /// Passes over `/proc` taken so far.
    pub fn passes_over_proc(&self) -> u64 {
        self.scanner.passes()
    }

    fn confirmed(&self) -> MutexGuard<'_, HashSet<InstanceId>> {
        // Single inserts and removes: consistent after a panic.
        self.confirmed.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn tracked(&self) -> MutexGuard<'_, HashMap<InstanceId, Tracked>> {
        // A panic while holding this lock leaves the map consistent (every
        // update is a single insert/remove), so poisoning is ignored.
        self.tracked.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Identities known to belong to the instance that still run.
    fn known_alive(&self, instance: &InstanceId, current: Option<&PidIdentity>) -> Vec<PidIdentity> {
        let mut known: Vec<PidIdentity> = current.cloned().into_iter().collect();
        if let Some(t) = self.tracked().get(instance)
            && !known.contains(&t.identity)
        {
            known.push(t.identity.clone());
        }
        known.retain(identity::is_alive);
        known
    }
}
