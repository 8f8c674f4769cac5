//! The agent's instance manager: the local truth about every instance on
//! this node (its RocksDB records), and the handlers for the master's
//! commands. Commands on one instance are serialized by that instance's
//! lock; commands on different instances run concurrently.
//!
//! Every handler is idempotent (start on a running instance, stop on a
//! stopped one, delete of a deleted one all succeed without doing anything)
//! and checks the command's generation: one older than the newest applied
//! is refused, so a late duplicate can never undo a newer intent.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::files::{file_sha256, write_rendered_files};
use super::installer;
use super::process::{ProcessController, StartRequest, StopRequest, users};
use super::restart::{RestartHistory, RestartPolicy};
use crate::ids::InstanceId;
use crate::protocol::messages::{
    AgentEvent, AgentResponse, CommandFailure, FailureKind, InstallBegin, InstanceReport, RenderedFile,
};
use crate::storage::agent_records::{AgentInstanceRecord, Tombstone};
use crate::storage::records::RECORD_VERSION;
use crate::storage::{AgentStore, WriteOp};

pub mod dynamic_users;
mod install;
mod logs;
mod policy;
mod start;
mod stop;

pub use install::InstallUser;
pub use policy::RunAsPolicy;

/// One instance's slot: its record behind the lock that serializes
/// commands, and who holds that lock now (for `SIGUSR2` dumps).
#[derive(Default)]
pub struct Slot {
    pub record: tokio::sync::Mutex<Option<AgentInstanceRecord>>,
    holder: Mutex<Option<(&'static str, std::time::Instant)>>,
    /// The answer to the last command (by generation) that changed the
    /// instance: see [`Node::replay`].
    answered: Mutex<Option<(u64, &'static str, AgentResponse)>>,
}

/// The slot's lock, held for `what`; the holder is cleared on drop.
pub struct SlotGuard<'a> {
    guard: tokio::sync::MutexGuard<'a, Option<AgentInstanceRecord>>,
    slot: &'a Slot,
}

impl Slot {
    /// Waits for the lock and records `what` holds it.
    pub async fn lock(&self, what: &'static str) -> SlotGuard<'_> {
        let guard = self.record.lock().await;
        *lock(&self.holder) = Some((what, std::time::Instant::now()));
        SlotGuard { guard, slot: self }
    }

    /// `(what, for how long)` holds the lock now, if anything.
    pub fn holder(&self) -> Option<(&'static str, std::time::Duration)> {
        lock(&self.holder).map(|(what, since)| (what, since.elapsed()))
    }
}

impl Drop for SlotGuard<'_> {
    fn drop(&mut self) {
        *lock(&self.slot.holder) = None;
    }
}

impl std::ops::Deref for SlotGuard<'_> {
    type Target = Option<AgentInstanceRecord>;
    fn deref(&self) -> &Self::Target {
        &self.guard
    }
}

impl std::ops::DerefMut for SlotGuard<'_> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.guard
    }
}

pub struct Node {
    pub store: AgentStore,
    pub processes: ProcessController,
    pub root: PathBuf,
    pub package_cache: PathBuf,
    /// The address instances bind to, as announced in `Hello`; TCP health
    /// probes dial it.
    pub address: String,
    policy: RunAsPolicy,
    slots: Mutex<HashMap<InstanceId, Arc<Slot>>>,
    /// Reports (process exits, restarts) until the master acknowledges them.
    pub outbox: Arc<super::outbox::Outbox>,
    pub(super) restart_policy: Mutex<RestartPolicy>,
    pub(super) restarts: RestartHistory,
    /// The agent is stopping its instances to exit (`stop_all`): an exit
    /// now is one it caused, never restarted.
    pub(super) closing: std::sync::atomic::AtomicBool,
    /// The uids given to clusters whose specs name no user.
    pub users: dynamic_users::DynamicUsers,
    /// Log reads under way (`logs`): bounded per instance and per node.
    pub(super) log_reads: Arc<logs::LogReads>,
    /// The master's requests being worked on, over every connection: a
    /// new connection's inventory waits until those of the last one have
    /// finished (see `connection::session`).
    pub requests: Arc<tokio::sync::Semaphore>,
    /// The highest master term seen (several masters: a deposed one is refused).
    pub master_term: crate::agent::master_term::MasterTerm,
}

/// Who asked for a start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Starter {
    /// The master: a process that dies before it is healthy makes the
    /// start fail, and what comes next is the master's.
    Master,
    /// The restart policy, after a crash.
    RestartPolicy,
}

pub fn failure(kind: FailureKind, message: impl Into<String>) -> AgentResponse {
    AgentResponse::Failed(CommandFailure {
        kind,
        message: message.into(),
        exit_code: None,
        stderr_tail: String::new(),
        stdout_tail: String::new(),
    })
}

/// The answer for a start or stop that failed, with the process's exit code
/// and stderr tail when it has them.
fn process_failure(kind: FailureKind, e: &super::process::ProcessError) -> AgentResponse {
    AgentResponse::Failed(CommandFailure {
        kind,
        message: crate::error::ErrorChain(e).to_string(),
        exit_code: e.exit_code(),
        stderr_tail: e.stderr_tail().to_string(),
        stdout_tail: String::new(),
    })
}

/// Removes every entry of `dir` whose name starts with `prefix`; how many.
/// The names of the directories in `root` that can be instance ids (not
/// `.staging-*`, not a symlink), sorted.
fn instance_dirs(root: &Path) -> Vec<InstanceId> {
    let Ok(entries) = std::fs::read_dir(root) else { return Vec::new() };
    let mut out: Vec<InstanceId> = entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| e.file_name().to_str().map(InstanceId::new))
        .filter(|id| id.is_safe_path_component() && !id.as_str().starts_with('.'))
        .collect();
    out.sort();
    out
}

fn sweep(dir: &Path, prefix: &str) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    let mut removed = 0;
    for e in entries.flatten() {
        if !e.file_name().to_string_lossy().starts_with(prefix) {
            continue;
        }
        let path = e.path();
        let gone = match e.file_type() {
            Ok(t) if t.is_dir() => std::fs::remove_dir_all(&path),
            _ => std::fs::remove_file(&path),
        };
        match gone {
            Ok(()) => removed += 1,
            Err(err) => tracing::warn!(path = %path.display(), error = %err, "cannot remove a leftover of an install"),
        }
    }
    removed
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Node {
    pub fn new(
        store: AgentStore,
        processes: ProcessController,
        data_dir: &Path,
        policy: RunAsPolicy,
        address: String,
    ) -> std::io::Result<Arc<Node>> {
        let root = data_dir.join("instances");
        let package_cache = data_dir.join("packages");
        std::fs::create_dir_all(&root)?;
        std::fs::create_dir_all(&package_cache)?;
        // Instances run as other users; they must be able to reach their
        // directory, while the package cache stays private to the agent.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755))?;
        std::fs::set_permissions(&package_cache, std::fs::Permissions::from_mode(0o700))?;
        let root = std::fs::canonicalize(&root)?;
        let users = dynamic_users::DynamicUsers::new(policy.dynamic_users);
        let master_term = crate::agent::master_term::MasterTerm::load(&store).map_err(std::io::Error::other)?;
        Ok(Arc::new(Node {
            master_term,
            store,
            processes,
            root,
            package_cache,
            address,
            policy,
            slots: Mutex::default(),
            outbox: Arc::default(),
            restart_policy: Mutex::default(),
            restarts: RestartHistory::default(),
            closing: std::sync::atomic::AtomicBool::new(false),
            users,
            log_reads: Arc::default(),
            requests: Arc::new(tokio::sync::Semaphore::new(super::connection::MAX_REQUESTS_IN_FLIGHT)),
        }))
    }

    /// Sets what happens to an instance whose process exits unexpectedly.
    pub fn set_restart_policy(&self, policy: RestartPolicy) {
        *lock(&self.restart_policy) = policy;
    }

    pub fn instance_dir(&self, id: &InstanceId) -> PathBuf {
        self.root.join(id.as_str())
    }

    pub fn slot(&self, id: &InstanceId) -> Arc<Slot> {
        lock(&self.slots).entry(id.clone()).or_default().clone()
    }

    /// The answer already given to the command (`kind`) at `generation` of
    /// `id`, if that was the last one it got. The master sends a command again, at
    /// the same generation (each command has its own), only when the link
    /// that carried it closed before its answer came; by then the first
    /// has finished (the agent reconnects only once its requests have:
    /// `settle_requests`). Answering it again, instead of running it again,
    /// tells the master what the first did: the files it changed, the
    /// start that died in its settle window.
    pub fn replay(&self, id: &InstanceId, generation: u64, kind: &'static str) -> Option<AgentResponse> {
        let slot = lock(&self.slots).get(id).cloned()?;
        let answered = lock(&slot.answered);
        answered.as_ref().filter(|(g, k, _)| *g == generation && *k == kind).map(|(_, _, r)| r.clone())
    }

    /// Keeps `answer` as the answer to the command (`kind`) at `generation`
    /// of `id` (not one to an older command, refused as stale).
    pub fn answered(&self, id: &InstanceId, generation: u64, kind: &'static str, answer: &AgentResponse) {
        let slot = self.slot(id);
        let mut answered = lock(&slot.answered);
        if answered.as_ref().is_none_or(|(g, _, _)| *g <= generation) {
            *answered = Some((generation, kind, answer.clone()));
        }
    }

    /// Every instance slot, one line each, for a `SIGUSR2` dump: its
    /// record (generation, desired state, pid identity) unless a command
    /// holds the lock, and who holds it for how long.
    pub fn dump(&self) -> Vec<String> {
        let mut slots: Vec<(InstanceId, Arc<Slot>)> =
            lock(&self.slots).iter().map(|(id, s)| (id.clone(), s.clone())).collect();
        slots.sort_by(|a, b| a.0.cmp(&b.0));
        slots
            .iter()
            .map(|(id, slot)| {
                let held = match slot.holder() {
                    Some((what, d)) => format!("lock held by {what} for {} ms", d.as_millis()),
                    None => "lock free".into(),
                };
                let record = match slot.record.try_lock() {
                    Ok(g) => match g.as_ref() {
                        Some(r) => {
                            let pid = r.pid.as_ref().map_or("none".into(), |p| {
                                format!("{} (start time {}, boot {})", p.pid, p.start_time, p.boot_id)
                            });
                            format!(
                                "generation {}, desired {}, pid {pid}",
                                r.generation,
                                if r.desired_running { "running" } else { "stopped" }
                            )
                        }
                        None => "no record".into(),
                    },
                    Err(_) => "record locked".into(),
                };
                format!("instance {id}: {record}; {held}")
            })
            .collect()
    }

    /// Queues a report for the master; kept until it is acknowledged.
    pub(super) fn report(&self, event: AgentEvent) {
        self.outbox.push(event);
    }

    /// Loads the records at start: finishes deletes that were in progress,
    /// and re-adopts processes that still run.
    pub async fn recover(self: &Arc<Self>) -> Result<(), crate::storage::StorageError> {
        // No install runs before the link is up: whatever an install left
        // half-done when the agent died (a staging dir, a package being
        // received) is garbage now, and the master sends the install again.
        let (root, cache) = (self.root.clone(), self.package_cache.clone());
        let swept = tokio::task::spawn_blocking(move || sweep(&root, ".staging-") + sweep(&cache, ".incoming-"))
            .await
            .unwrap_or(0);
        if swept > 0 {
            tracing::info!(swept, "removed what installs cut short by the agent's end left behind");
        }
        let store = self.store.clone();
        let snapshot = tokio::task::spawn_blocking(move || store.load_all())
            .await
            .map_err(|e| crate::storage::StorageError::Codec(e.to_string()))??;
        let held: std::collections::HashSet<InstanceId> = snapshot.instances.iter().map(|r| r.id.clone()).collect();
        self.users
            .load(&self.store, snapshot.users, snapshot.users_next, &held)
            .await
            .map_err(crate::storage::StorageError::Codec)?;
        for rec in snapshot.instances {
            let slot = self.slot(&rec.id);
            *slot.lock("recover").await = Some(rec);
        }
        // The restarts an earlier run spent still count (issue 9: restart
        // counts never go down across an agent restart).
        for r in snapshot.restarts.into_iter().filter(|r| held.contains(&r.id)) {
            tracing::info!(instance = %r.id, restarts = r.times_ms.len(), "restart history loaded");
            self.restarts.load(&r.id, r.times_ms);
        }
        for t in snapshot.tombstones {
            tracing::info!(instance = %t.id, "finishing a delete interrupted by an agent restart");
            let _ = self.delete(&t.id, t.generation).await;
        }
        let slots: Vec<(InstanceId, Arc<Slot>)> =
            lock(&self.slots).iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        let mut idle = Vec::new();
        for (id, slot) in slots {
            let mut guard = slot.lock("recover").await;
            let Some(rec) = guard.as_mut() else { continue };
            match &rec.pid {
                Some(pid) if self.processes.is_alive(pid) => {
                    tracing::info!(instance = %id, pid = pid.pid, "re-adopted running process");
                    self.watch(id.clone(), pid.clone());
                    continue;
                }
                Some(_) => {
                    tracing::warn!(instance = %id, "process is gone since the agent stopped");
                    rec.pid = None;
                    let r = rec.clone();
                    drop(guard);
                    let _ = self.persist(&r).await;
                }
                None => {}
            }
            idle.push(id);
        }
        self.kill_orphans(&idle).await;
        Ok(())
    }

    /// Kills what still runs of instances the agent holds no live process
    /// of: what a start left when the agent died between its spawn and the
    /// record of its pid (or a daemon whose recorded process died). Nobody
    /// would watch, stop or report such a process, and the master was never
    /// told of it (`ProcessSpawned` follows the record); its record says it
    /// does not run, and it is made true. What carries an instance's marker
    /// or sits in its cgroup is found; a hook, a health check or a stop
    /// command carries neither, and one the agent's death cut off is not.
    async fn kill_orphans(&self, idle: &[InstanceId]) {
        match self.processes.kill_orphans(idle).await {
            Err(e) => tracing::warn!(error = %crate::error::ErrorChain(&e), "cannot look for orphaned processes"),
            Ok(found) => {
                for (id, killed) in found {
                    match killed {
                        Ok(n) => {
                            tracing::warn!(instance = %id, processes = n, "killed what an interrupted start left running")
                        }
                        Err(e) => {
                            tracing::error!(instance = %id, error = %crate::error::ErrorChain(&e), "cannot kill what an interrupted start left running")
                        }
                    }
                }
            }
        }
    }

    /// What the agent holds, for the handshake.
    pub async fn inventory(&self) -> Vec<InstanceReport> {
        let slots: Vec<Arc<Slot>> = lock(&self.slots).values().cloned().collect();
        let mut out = Vec::new();
        for slot in slots {
            if let Some(r) = slot.lock("inventory").await.as_ref() {
                let running = r.pid.as_ref().is_some_and(|p| self.processes.is_alive(p));
                out.push(InstanceReport {
                    instance: r.id.clone(),
                    generation: r.generation,
                    desired_running: r.desired_running,
                    running,
                    pid: if running { r.pid.as_ref().map(|p| p.pid) } else { None },
                });
            }
        }
        out
    }

    /// Instance directories under the root the agent holds no record of
    /// (tombstones are finished at the start), for the handshake: the
    /// master removes those it does not know either after its grace.
    pub async fn unrecorded(&self) -> Vec<InstanceId> {
        let root = self.root.clone();
        let names = tokio::task::spawn_blocking(move || instance_dirs(&root)).await.unwrap_or_default();
        let mut out = Vec::new();
        for id in names {
            let slot = lock(&self.slots).get(&id).cloned();
            let held = match slot {
                Some(s) => s.lock("unrecorded").await.is_some(),
                None => false,
            };
            if !held {
                out.push(id);
                if out.len() == crate::protocol::messages::MAX_UNRECORDED {
                    break;
                }
            }
        }
        out
    }

    pub(super) async fn persist(&self, rec: &AgentInstanceRecord) -> Result<(), String> {
        let op = WriteOp::put_agent_instance(rec).map_err(|e| e.to_string())?;
        self.store.writer().commit(vec![op]).await.map_err(|e| format!("cannot persist instance record: {e}"))
    }

    pub async fn write_files(
        &self,
        id: &InstanceId,
        generation: u64,
        files: Vec<RenderedFile>,
        env: Option<Vec<(String, String)>>,
    ) -> AgentResponse {
        let slot = self.slot(id);
        let mut guard = slot.lock("write files").await;
        let rec = match admit(&mut guard, id, generation) {
            Ok(rec) => rec,
            Err(refused) => return refused,
        };
        if let Some(why) = env.as_deref().and_then(|e| self.policy.refuse_env(e)) {
            return failure(FailureKind::BadRequest, format!("instance {id}: {why}"));
        }
        let owner = match users::resolve(&rec.run_as) {
            Ok(u) if nix::unistd::geteuid().is_root() => Some((u.uid, u.gid)),
            _ => None,
        };
        let dir = self.instance_dir(id);
        let f = files.clone();
        let written = tokio::task::spawn_blocking(move || write_rendered_files(&dir, &f, owner)).await;
        let mut changed = match written {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => {
                return failure(
                    FailureKind::Install,
                    format!("writing files of {id}: {}", crate::error::ErrorChain(&e)),
                );
            }
            Err(e) => return failure(FailureKind::Internal, format!("write task failed: {e}")),
        };
        rec.generation = generation;
        rec.file_hashes.extend(hashes(&files));
        if let Some(env) = env
            && env != rec.process.env
        {
            rec.process.env = env;
            changed.push(crate::protocol::messages::ENV_CHANGED.to_string());
        }
        let r = rec.clone();
        if let Err(e) = self.persist(&r).await {
            return failure(FailureKind::Internal, e);
        }
        AgentResponse::FilesWritten { changed }
    }

    /// Sends `signal` to the instance's main process (a file's
    /// `change_mode = "signal"`), checked by pid identity.
    pub async fn signal(&self, id: &InstanceId, generation: u64, signal: i32) -> AgentResponse {
        let Ok(sig) = nix::sys::signal::Signal::try_from(signal) else {
            return failure(FailureKind::BadRequest, format!("{signal} is not a signal number"));
        };
        let slot = self.slot(id);
        let mut guard = slot.lock("signal").await;
        let rec = match admit(&mut guard, id, generation) {
            Ok(rec) => rec,
            Err(refused) => return refused,
        };
        rec.generation = generation;
        let delivered = match &rec.pid {
            Some(p) if self.processes.is_alive(p) => {
                let member = super::process::tree::Member { pid: p.pid, start_time: p.start_time };
                super::process::tree::signal(&[member], sig) == 1
            }
            _ => false,
        };
        let r = rec.clone();
        if let Err(e) = self.persist(&r).await {
            return failure(FailureKind::Internal, e);
        }
        AgentResponse::Signalled { delivered }
    }
}

impl Node {
    /// The user an instance's commands run as: its recorded run-as user when
    /// the agent is root, else the agent's own user. Checked again against
    /// this agent's policy (the record may predate it, or the user database
    /// may have changed since the install): a user gone from the node, one
    /// that is now root or not allowed, or a loader variable in the env
    /// fails the command with `kind`.
    pub(super) fn run_as_of(
        &self,
        rec: &AgentInstanceRecord,
        kind: FailureKind,
    ) -> Result<users::RunAs, AgentResponse> {
        if let Some(why) = self.policy.refuse_env(&rec.process.env) {
            return Err(failure(kind, format!("instance {}: {why}", rec.id)));
        }
        if !nix::unistd::geteuid().is_root() {
            return Ok(users::current());
        }
        let user = users::resolve(&rec.run_as).map_err(|e| failure(kind, format!("run_as {}: {e}", rec.run_as)))?;
        match self.policy.refuse_user(&user) {
            Some(why) => Err(failure(kind, format!("instance {}: {why}", rec.id))),
            None => Ok(user),
        }
    }
}

/// The instance's record for a command of `generation`, or the refusal:
/// not installed, or older than the generation already applied.
pub(super) fn admit<'a>(
    guard: &'a mut Option<AgentInstanceRecord>,
    id: &InstanceId,
    generation: u64,
) -> Result<&'a mut AgentInstanceRecord, AgentResponse> {
    let rec = guard.as_mut().ok_or_else(|| not_installed(id))?;
    if generation < rec.generation {
        return Err(stale(id, generation, rec.generation));
    }
    Ok(rec)
}

pub fn not_installed(id: &InstanceId) -> AgentResponse {
    failure(FailureKind::UnknownInstance, format!("instance {id} is not installed on this node"))
}

pub fn stale(id: &InstanceId, got: u64, have: u64) -> AgentResponse {
    failure(
        FailureKind::StaleGeneration,
        format!("command for {id} has generation {got}, older than the applied {have}; refused"),
    )
}

fn hashes(files: &[RenderedFile]) -> BTreeMap<String, String> {
    files.iter().map(|f| (f.path.clone(), file_sha256(&f.contents))).collect()
}
