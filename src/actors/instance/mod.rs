//! `InstanceActor`: one per instance, the only writer of its record.
//! Every message (a command, an observation) is handled to completion in
//! turn: the actor takes the next only when the agent has answered and the
//! new state is durable, so commands on one instance never interleave.
//! Reads go to the read model, never through this mailbox.
//!
//! A light actor: it lives on its cluster actor's arbiter thread, and its
//! mailbox is a FIFO async lock (tokio's mutex queues waiters in order), so
//! 100,000 of them cost a record (shared, by `Arc`, with the published
//! snapshot) and a few counters each, not an actix context. Each message
//! runs in its own task, so a caller that stops waiting (the step watchdog)
//! never cancels a command half-way.
//!
//! Each command bumps the instance's generation and persists the intent
//! (desired state, transitional status) before it is sent, so after a crash
//! the master knows what it was doing, and the agent refuses any older
//! command that arrives late.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::node_link::NodeError;
use super::read_model::{InstanceEntry, InstanceStats};
use crate::ids::{InstanceId, NodeId};
use crate::protocol::messages::{AgentRequest, AgentResponse, FailureKind, InstallBegin, RenderedFile};
use crate::storage::WriteOp;
use crate::storage::records::{Applied, DesiredState, InstanceRecord, InstanceResult, InstanceStatus, PendingRestart};

mod cmd;
pub mod in_flight;
mod observe;
mod save;
mod send;

pub use cmd::{
    ChangeRule, ClusterEnv, InstallPayload, InstanceCmd, InstanceOutcome, MemberFailures, Observation, Window,
};
use send::Sent;

/// Why a forgotten instance's command is not sent.
const FORGOTTEN: &str = "its cluster's actor stopped or forgot the instance; nothing sent";

pub struct InstanceActor {
    /// The durable record; replaced (never mutated) after each write.
    record: RefCell<Arc<InstanceRecord>>,
    /// The digest of the files and environment the agent last confirmed
    /// (in memory: after a master restart the first write is sent anyway).
    /// A `WriteFiles` with the same digest changes nothing on the node and
    /// is not sent: a scale-out does not rewrite every member whose files
    /// do not depend on the membership.
    written: std::cell::Cell<Option<FilesDigest>>,
    /// Forgotten by its cluster (its record deleted): work still queued in
    /// its mailbox (a command the watchdog abandoned, an observation) must
    /// not write the record back.
    forgotten: std::cell::Cell<bool>,
    /// A test hook's panic, for its next turn (`supervisor::inject`).
    panic_injected: std::cell::Cell<bool>,
    /// What the agent said a settling start spawned (generation, pid),
    /// for the start command waiting for its answer ([`Self::spawned`]).
    spawned: std::cell::Cell<Option<(u64, u32)>>,
    spawned_news: tokio::sync::Notify,
    /// The mailbox: one message at a time, in arrival order.
    mailbox: tokio::sync::Mutex<()>,
    stats: Arc<InstanceStats>,
    env: Rc<ClusterEnv>,
}

/// The first half of a SHA-256: 128 bits tell two versions of one
/// instance's files apart as surely as 256, and keep the actor (one per
/// instance, 100,000 in a master) in a smaller allocation.
type FilesDigest = [u8; 16];

/// A digest of rendered files and an environment.
fn files_digest(files: &[RenderedFile], env: &[(String, String)]) -> FilesDigest {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    for f in files {
        for part in [f.path.as_bytes(), &f.contents, &f.mode.to_le_bytes()] {
            h.update((part.len() as u64).to_le_bytes());
            h.update(part);
        }
    }
    h.update([0xff]);
    for (k, v) in env {
        for part in [k.as_bytes(), v.as_bytes()] {
            h.update((part.len() as u64).to_le_bytes());
            h.update(part);
        }
    }
    let full: [u8; 32] = h.finalize().into();
    let mut half = [0u8; 16];
    half.copy_from_slice(&full[..16]);
    half
}

/// How an answer changes what the process owes.
enum Owed {
    Keep,
    Clear,
    Add(PendingRestart),
}

/// A cluster's handle on one of its instance actors.
pub type InstanceHandle = Rc<InstanceActor>;

impl From<InstanceResult> for InstanceOutcome {
    fn from(result: InstanceResult) -> Self {
        InstanceOutcome { result, changed: Vec::new(), not_held: false }
    }
}

impl InstanceActor {
    /// Creates the actor of a durable record and publishes it.
    pub fn start(record: InstanceRecord, env: Rc<ClusterEnv>) -> InstanceHandle {
        let actor = Self::quiet(record, env);
        actor.env.cell.put_instance(actor.entry());
        actor
    }

    /// Creates the actor without publishing (boot publishes many at once).
    pub fn quiet(record: InstanceRecord, env: Rc<ClusterEnv>) -> InstanceHandle {
        Rc::new(InstanceActor {
            record: RefCell::new(Arc::new(record)),
            written: Default::default(),
            forgotten: Default::default(),
            panic_injected: Default::default(),
            spawned: Default::default(),
            spawned_news: tokio::sync::Notify::new(),
            mailbox: tokio::sync::Mutex::new(()),
            stats: Arc::default(),
            env,
        })
    }

    /// Marks it forgotten (before its record's delete is queued, so no
    /// write of it can be queued after); `false` undoes that when the
    /// delete failed.
    pub fn set_forgotten(&self, yes: bool) {
        self.forgotten.set(yes);
    }

    pub fn record(&self) -> Arc<InstanceRecord> {
        self.record.borrow().clone()
    }

    pub fn id(&self) -> InstanceId {
        self.record.borrow().id.clone()
    }

    /// As the read model shows it.
    pub fn entry(&self) -> InstanceEntry {
        InstanceEntry { record: self.record(), stats: self.stats.clone() }
    }

    /// Runs a command to completion, in turn with the instance's other
    /// messages, in its own task: the caller may stop waiting, the command
    /// still finishes.
    pub async fn run(self: &Rc<Self>, cmd: InstanceCmd) -> InstanceOutcome {
        let me = self.clone();
        let verb = cmd.verb();
        // Counted until it ends, even if the step stops waiting for it.
        let counted = self.env.in_flight.enter();
        // Boxed: the command's whole state machine (a package stream, a
        // reply wait) lives on the heap only while it runs, and the future
        // a step holds for each queued command stays small.
        let out = self
            .in_turn(
                verb,
                Box::pin(async move {
                    let _counted = counted;
                    // One span per instance command, inside the operation's span.
                    let span = tracing::info_span!("instance", id = %me.id(), verb);
                    // Bulk work: it waits while an API request to a cluster
                    // on this thread is being answered (`priority`).
                    let out = tracing::Instrument::instrument(me.env.priority.gated(me.execute(cmd)), span).await;
                    if !out.result.ok {
                        tracing::warn!(error = %out.result.message, "instance command failed");
                    }
                    me.env.progress.fetch_add(1, Ordering::Relaxed);
                    me.env.answered.fetch_add(1, Ordering::Relaxed);
                    out
                }),
            )
            .await;
        out.unwrap_or_else(|e| InstanceResult::failed(&self.id(), e).into())
    }

    /// Applies an observation; answers whether the instance newly failed,
    /// or `None` when it could not be applied (its record could not be
    /// written): then it must not be acknowledged to the agent.
    ///
    /// Its turn is taken when this is called, not when the answer is first
    /// awaited: observations take their turns in the order they are handed
    /// over (an inventory before the reports that follow it).
    pub fn observe(self: &Rc<Self>, observation: Observation) -> impl Future<Output = Option<bool>> + 'static {
        let me = self.clone();
        let turn = self.in_turn("observe", async move { me.apply(observation).await });
        async move { turn.await.ok().flatten() }
    }

    /// The agent spawned `pid` for the start of `generation`, which is
    /// settling: the start command (which holds the mailbox) shows it
    /// `Running` with the pid before its answer. A start that has already
    /// answered, or an older generation, ignores it.
    pub fn spawned(&self, generation: u64, pid: u32) {
        self.spawned.set(Some((generation, pid)));
        self.spawned_news.notify_one();
    }

    /// Waits for the news of a process spawned by the start of `generation`.
    async fn spawned_by(&self, generation: u64) -> u32 {
        loop {
            self.spawned_news.notified().await;
            match self.spawned.take() {
                Some((g, pid)) if g == generation => return pid,
                _ => {}
            }
        }
    }

    /// Queues `work` behind the instance's earlier messages, in its own task.
    /// Its place in the queue is taken now (the task is spawned at once).
    fn in_turn<T: 'static>(
        self: &Rc<Self>,
        verb: &'static str,
        work: impl Future<Output = T> + 'static,
    ) -> impl Future<Output = Result<T, String>> + 'static {
        self.stats.enqueue();
        let cluster = self.env.stats.clone();
        cluster.inner.fetch_add(1, Ordering::Relaxed);
        let me = self.clone();
        let live = crate::actors::live_tasks::LiveTask::new("instance_turn");
        let task = actix::spawn(async move {
            use futures::FutureExt;
            let _live = live;
            let _turn = me.mailbox.lock().await;
            cluster.inner.fetch_sub(1, Ordering::Relaxed);
            me.stats.begin(verb);
            let injected = me.panic_injected.take().then(|| me.id());
            let turn = async move {
                if let Some(id) = injected {
                    panic!("a panic injected by a test hook (instance {id})");
                }
                work.await
            };
            match std::panic::AssertUnwindSafe(turn).catch_unwind().await {
                Ok(out) => {
                    me.stats.end();
                    Ok(out)
                }
                Err(payload) => Err(me.panicked(verb, payload.as_ref())),
            }
        });
        async move { task.await.map_err(|e| format!("instance command task failed: {e}")).and_then(|out| out) }
    }

    /// A turn panicked: the instance actor fails, and with it its group
    /// (`supervision::spec("instance")`: one_for_all with its cluster's
    /// actor, which its supervisor restarts from the store). What the turn
    /// was doing is left to the successor (an unacknowledged report is sent
    /// again; an operation is resumed from its journal). The turn's caller
    /// hears why.
    fn panicked(&self, verb: &str, payload: &(dyn std::any::Any + Send)) -> String {
        let reason = crate::actors::supervised::panic_message(payload);
        let why = format!("its instance actor {} panicked in {verb}: {reason}", self.id());
        tracing::error!(instance = %self.id(), %reason, "an instance actor failed; its cluster's actor fails with it");
        self.stats.end();
        // To the actor that made this instance actor: once that one is
        // dead, its successor is not told (the message finds a closed
        // mailbox), whatever the turn was.
        let failures = self.env.failures.borrow().clone();
        if let Some(f) = failures {
            f.linked_failed(why.clone());
        }
        why
    }

    /// Test hooks: its next turn panics (see [`Self::panicked`]).
    pub fn inject_panic(&self) {
        self.panic_injected.set(true);
    }

    async fn execute(&self, cmd: InstanceCmd) -> InstanceOutcome {
        let (id, node) = {
            let r = self.record.borrow();
            (r.id.clone(), r.node.clone())
        };
        // Its cluster actor is gone (dead, or the instance deleted): a turn
        // queued before that sends nothing more (a health check writes no
        // intent that would refuse it).
        if self.forgotten.get() {
            return InstanceResult::failed(&id, format!("{} of {id}: {}", cmd.verb(), FORGOTTEN)).into();
        }
        // What the agent will hold once this command succeeds.
        let digest = match &cmd {
            InstanceCmd::WriteFiles { files, env, .. } => Some(files_digest(files, env)),
            InstanceCmd::Install(p) => Some(files_digest(&p.files, &p.process.env)),
            _ => None,
        };
        if let InstanceCmd::WriteFiles { .. } = &cmd
            && digest.is_some()
            && digest == self.written.get()
        {
            return InstanceResult::ok(&id, "files unchanged; nothing sent").into();
        }
        if digest.is_some() || matches!(cmd, InstanceCmd::Delete) {
            // Unknown until the agent answers (and gone with a delete).
            self.written.set(None);
        }
        let verb = cmd.verb();
        let (transitional, desired) = match &cmd {
            InstanceCmd::Install(_) => (Some(InstanceStatus::Installing), None),
            InstanceCmd::Start { .. } => (Some(InstanceStatus::Starting), Some(DesiredState::Running)),
            InstanceCmd::Stop => (Some(InstanceStatus::Stopping), Some(DesiredState::Stopped)),
            InstanceCmd::Delete => (Some(InstanceStatus::Deleting), Some(DesiredState::Deleted)),
            InstanceCmd::WriteFiles { .. }
            | InstanceCmd::RunHook { .. }
            | InstanceCmd::CheckHealth { .. }
            | InstanceCmd::Signal { .. } => (None, None),
        };
        // Intent first: a new generation, durable before the agent hears of
        // it. A health check changes nothing, so it carries no generation.
        if !matches!(cmd, InstanceCmd::CheckHealth { .. }) {
            let installing = matches!(cmd, InstanceCmd::Install(_));
            let intent = self
                .save(|r| {
                    r.generation += 1;
                    if installing {
                        // Until the install answers, what is on the node is
                        // unknown: a roll must redo it, never skip it.
                        r.applied = None;
                    }
                    if let Some(s) = transitional {
                        r.status = s;
                    }
                    if let Some(d) = desired {
                        r.desired = d;
                    }
                })
                .await;
            if let Err(e) = intent {
                return InstanceResult::failed(&id, format!("{verb} of {id} on {node}: {e}")).into();
            }
        }
        let generation = self.record.borrow().generation;
        // Whether an inventory taken before this command no longer tells
        // the truth: these change what the agent holds or runs. Writing
        // files or running a hook does not (a process they end is
        // reported as an exit), so an inventory may still be applied.
        let changes_state = matches!(
            cmd,
            InstanceCmd::Install(_) | InstanceCmd::Start { .. } | InstanceCmd::Stop | InstanceCmd::Delete
        );
        let probe = matches!(cmd, InstanceCmd::RunHook { .. } | InstanceCmd::CheckHealth { .. });
        // A command cut off by its link's end (the node manager killed, a
        // reconnect) is sent once more, at the same generation, when the
        // agent is back within `RESEND_WAIT`: the first, if it arrived, has
        // finished by then, and the agent answers the repeat with the
        // first's answer (`agent::node::Node::replay`; an install or a
        // health check is simply done again).
        let again = matches!(
            cmd,
            InstanceCmd::Install(_)
                | InstanceCmd::Start { .. }
                | InstanceCmd::Stop
                | InstanceCmd::WriteFiles { .. }
                | InstanceCmd::Delete
                | InstanceCmd::CheckHealth { .. }
        )
        .then(|| cmd.clone());
        let link = self.env.shared.links.get(&node);
        let mut sent = match &link {
            None => Sent::not_connected(&node),
            Some(link) => self.send(link, cmd, generation, changes_state).await,
        };
        if let (Err(NodeError::Disconnected(_)), Some(cmd)) = (&sent.reply, again)
            && let Some(link) = self.reconnected(&node, link.as_ref()).await
            && !self.forgotten.get()
        {
            tracing::info!(instance = %id, %node, verb, "sent again on the node's new connection");
            sent = self.send(&link, cmd, generation, changes_state).await;
        }
        let Sent { reply, applied, rule } = sent;
        if reply.is_ok() && digest.is_some() {
            self.written.set(digest);
        }
        match reply {
            Ok(resp) => self.succeeded(&id, &node, verb, resp, applied, rule).await,
            Err(err) => self.failed_with(&id, &node, verb, err, probe).await,
        }
    }

    /// Waits for the answer of a start with a settle window; meanwhile, once
    /// the agent says it spawned the process, records it `Running` with its
    /// pid (durably, then shown) and gives its step's `window` back: the
    /// operation waits for the settle, the operator sees the process at
    /// once, and the step sends its next start. A death in the window
    /// fails the start ([`Self::failed_with`] clears that pid).
    async fn settling(
        &self,
        call: impl Future<Output = Result<AgentResponse, NodeError>>,
        generation: u64,
        window: &Window,
    ) -> Result<AgentResponse, NodeError> {
        // A notice from an earlier start is not this one's.
        self.spawned.set(None);
        let mut call = std::pin::pin!(call);
        tokio::select! {
            biased;
            reply = &mut call => return reply,
            pid = self.spawned_by(generation) => {
                let shown = self
                    .save(|r| {
                        r.status = InstanceStatus::Running;
                        r.pid = Some(pid);
                    })
                    .await;
                if let Err(e) = shown {
                    tracing::warn!(instance = %self.id(), error = %e, "cannot record the spawned process; shown when its start answers");
                }
                window.release();
            }
        }
        call.await
    }

    /// Records what a successful answer means for the instance.
    async fn succeeded(
        &self,
        id: &InstanceId,
        node: &NodeId,
        verb: &str,
        resp: AgentResponse,
        applied: Option<Arc<Applied>>,
        rule: Option<ChangeRule>,
    ) -> InstanceOutcome {
        let mut out = InstanceOutcome::from(InstanceResult::ok(id, ""));
        // What the process owes now: added to when files changed under it,
        // cleared when it (re)loads them.
        let mut owed = Owed::Keep;
        // (new status, new pid, message)
        let (status, pid, message) = match resp {
            AgentResponse::InstallResult { files_written } => {
                (Some(InstanceStatus::Installed), None, format!("installed ({files_written} files written)"))
            }
            AgentResponse::Started { pid, already_running } => {
                if !already_running {
                    owed = Owed::Clear;
                }
                (
                    Some(InstanceStatus::Running),
                    Some(Some(pid)),
                    if already_running {
                        format!("already running as pid {pid}")
                    } else {
                        format!("started as pid {pid}")
                    },
                )
            }
            AgentResponse::Stopped { was_running } => (
                Some(InstanceStatus::Stopped),
                Some(None),
                if was_running { "stopped".into() } else { "was not running".into() },
            ),
            AgentResponse::FilesWritten { changed } => {
                // Owed whether or not it runs now: a process the master thinks
                // down may still run (a start that failed its health check),
                // and a stopped one is cleared by its next start anyway.
                if let Some(p) = rule.as_ref().and_then(|r| r.owed(&changed)) {
                    owed = Owed::Add(p);
                }
                let m = if changed.is_empty() {
                    "no file changed".into()
                } else {
                    format!("changed: {}", changed.join(", "))
                };
                out.changed = changed;
                (None, None, m)
            }
            AgentResponse::Deleted { .. } => {
                (Some(InstanceStatus::Deleting), Some(None), "deleted from its node".into())
            }
            AgentResponse::HookDone { exit_code, stdout_tail, stderr_tail } => {
                if verb == "reload" {
                    owed = Owed::Clear;
                }
                out.result.exit_code = Some(exit_code);
                out.result.stdout_tail = stdout_tail;
                out.result.stderr_tail = stderr_tail;
                (None, None, format!("{verb} hook exited {exit_code}"))
            }
            AgentResponse::Healthy => (None, None, "healthy".into()),
            AgentResponse::Signalled { delivered } => {
                if delivered {
                    owed = Owed::Clear;
                }
                (None, None, if delivered { "signalled".into() } else { "not running; nothing signalled".into() })
            }
            other => {
                let m = format!("{verb} of {id} on {node}: unexpected answer {other:?}");
                let _ = self.save(|r| r.status = InstanceStatus::Failed).await;
                return InstanceResult::failed(id, m).into();
            }
        };
        let saved = self
            .save(|r| {
                if let Some(s) = status {
                    r.status = s;
                }
                if let Some(p) = pid {
                    r.pid = p;
                }
                if applied.is_some() {
                    r.applied = applied;
                }
                // Never downgrade an owed restart to a reload (or a signal).
                match owed {
                    Owed::Keep => {}
                    Owed::Clear => r.pending_restart = PendingRestart::No,
                    Owed::Add(p) => r.pending_restart = r.pending_restart.max(p),
                }
                r.last_error = None;
            })
            .await;
        match saved {
            Ok(()) => {
                out.result.message = message;
                out
            }
            Err(e) => InstanceResult::failed(id, format!("{verb} of {id} on {node}: {e}")).into(),
        }
    }

    /// Records a failed command: the instance is `Failed` when its process
    /// state is in doubt (install, start, stop, delete), or `Lost` when the
    /// doubt is its node's (not connected, or its link closed before the
    /// answer: what runs there is unknown until the agent reports again);
    /// a failed hook or health check only records the error.
    async fn failed_with(
        &self,
        id: &InstanceId,
        node: &NodeId,
        verb: &str,
        err: NodeError,
        keeps_status: bool,
    ) -> InstanceOutcome {
        let (exit_code, stderr_tail, stdout_tail) = match &err {
            NodeError::Failed(f) => (f.exit_code, f.stderr_tail.clone(), f.stdout_tail.clone()),
            _ => (None, String::new(), String::new()),
        };
        let mut message = format!("{verb} of instance {id} on node {node} failed: {err}");
        if let Some(code) = exit_code.filter(|_| !message.contains("exit code")) {
            message.push_str(&format!(" (exit code {code})"));
        }
        if !stderr_tail.trim().is_empty() {
            message.push_str(&format!("; stderr: {}", stderr_tail.trim()));
        }
        let m = message.clone();
        let lost = matches!(err, NodeError::Disconnected(_));
        // A start that failed on the agent left no process of it (the pid a
        // settling start showed is gone).
        let no_process = matches!(&err, NodeError::Failed(f) if f.kind == FailureKind::Start);
        let change = |r: &mut InstanceRecord| {
            if !keeps_status {
                r.status = if lost { InstanceStatus::Lost } else { InstanceStatus::Failed };
            }
            if no_process {
                r.pid = None;
            }
            r.last_error = Some(m.clone());
        };
        // A member that fails: with what it does to its cluster (nothing
        // while an operation runs, which judges it at its end; an `Error`
        // when the command outlived its operation, abandoned by the step
        // watchdog).
        let _ = if keeps_status { self.save(change).await } else { self.save_failure(change).await };
        let not_held = matches!(&err, NodeError::Failed(f) if f.kind == FailureKind::UnknownInstance);
        let result = InstanceResult { exit_code, stderr_tail, stdout_tail, ..InstanceResult::failed(id, message) };
        InstanceOutcome { not_held, ..result.into() }
    }
}
