//! `InstanceActor`: one per instance. It owns the instance record and is
//! the only writer of it. Every mutating message is handled atomically
//! (`AtomicResponse`): the actor takes no other message until the agent has
//! answered and the new state is durable, so commands on one instance never
//! interleave. Reads go to the read model, never through this mailbox.
//!
//! Each command bumps the instance's generation and persists the intent
//! (desired state, transitional status) before it is sent, so after a crash
//! the master knows what it was doing, and the agent refuses any older
//! command that arrives late.

use std::cell::RefCell;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::Arc;

use actix::prelude::*;

use super::node_manager::{NodeError, NodeLinks};
use super::read_model::{ActorStats, ReadModel};
use std::time::Duration;

use crate::ids::{InstanceId, NodeId};
use crate::protocol::messages::{AgentRequest, AgentResponse, ENV_CHANGED, InstallBegin, ProcessSpec, RenderedFile};
use crate::storage::StoreWriter;
use crate::storage::WriteOp;
use crate::storage::records::{Applied, DesiredState, InstanceRecord, InstanceResult, InstanceStatus, PendingRestart};

/// What one instance should do now.
#[derive(Debug, Clone)]
pub enum InstanceCmd {
    Install(Box<InstallPayload>),
    /// Start and wait until healthy; `wait` is the role's start timeout.
    Start {
        wait: Duration,
    },
    Stop,
    /// Re-rendered files and environment.
    WriteFiles {
        files: Vec<RenderedFile>,
        env: Vec<(String, String)>,
    },
    Delete,
    RunHook {
        hook: &'static str,
        argv: Vec<String>,
        timeout: Duration,
    },
    CheckHealth {
        timeout: Duration,
    },
}

impl InstanceCmd {
    fn verb(&self) -> &'static str {
        match self {
            InstanceCmd::Install(_) => "install",
            InstanceCmd::Start { .. } => "start",
            InstanceCmd::Stop => "stop",
            InstanceCmd::WriteFiles { .. } => "write files",
            InstanceCmd::Delete => "delete",
            InstanceCmd::RunHook { hook, .. } => hook,
            InstanceCmd::CheckHealth { .. } => "health check",
        }
    }
}

/// Everything an install needs besides the instance itself.
#[derive(Debug, Clone)]
pub struct InstallPayload {
    pub run_as: Option<String>,
    pub process: ProcessSpec,
    pub files: Vec<RenderedFile>,
    pub package_sha256: String,
    pub package_size: u64,
    pub blob: PathBuf,
    /// Recorded on the instance once the install succeeded.
    pub applied: Applied,
}

/// The answer to one command: the result an operation journals, and for
/// `WriteFiles` the files that changed.
#[derive(Debug, Clone)]
pub struct InstanceOutcome {
    pub result: InstanceResult,
    pub changed: Vec<String>,
}

/// Runs one command on the instance. The answer is the per-instance result
/// an operation journals, `ok == false` on failure.
#[derive(Message)]
#[rtype(result = "InstanceOutcome")]
pub struct RunInstanceCommand(pub InstanceCmd);

/// What an agent reported about the instance outside of a command.
#[derive(Debug, Clone)]
pub enum Observation {
    /// Its process exited without being asked to; `restarting`: its agent
    /// will start it again (restart policy), so it is not Failed (yet).
    Exited { pid: u32, description: String, restarting: bool },
    /// How the agent's restart went: the new pid, or why it failed.
    Restarted { pid: Option<u32>, error: Option<String> },
    /// The agent's inventory after it (re)connected.
    Inventory { present: bool, running: bool, pid: Option<u32> },
}

/// Applies an observation; answers whether the instance newly failed.
#[derive(Message)]
#[rtype(result = "bool")]
pub struct Observe(pub Observation);

/// Stops the actor (the instance was forgotten).
#[derive(Message)]
#[rtype(result = "()")]
pub struct Retire;

pub struct InstanceActor {
    record: Rc<RefCell<InstanceRecord>>,
    links: NodeLinks,
    store: StoreWriter,
    read_model: Arc<ReadModel>,
    stats: Arc<ActorStats>,
}

/// A cluster's handle on one instance actor.
#[derive(Clone)]
pub struct InstanceHandle {
    pub addr: Addr<InstanceActor>,
    pub stats: Arc<ActorStats>,
}

impl InstanceHandle {
    /// Runs a command to completion, even if the caller stops waiting: the
    /// send runs in its own task, because actix drops a message whose
    /// requester is gone, and a state-changing message must not vanish.
    pub async fn run(&self, cmd: InstanceCmd) -> InstanceOutcome {
        self.stats.enqueue();
        let addr = self.addr.clone();
        let id = self.stats.id.clone();
        let task = actix::spawn(async move { addr.send(RunInstanceCommand(cmd)).await });
        match task.await {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => {
                InstanceResult::failed(&InstanceId::new(id), format!("instance actor unavailable: {e}")).into()
            }
            Err(e) => InstanceResult::failed(&InstanceId::new(id), format!("instance command task failed: {e}")).into(),
        }
    }
}

impl From<InstanceResult> for InstanceOutcome {
    fn from(result: InstanceResult) -> Self {
        InstanceOutcome { result, changed: Vec::new() }
    }
}

impl InstanceActor {
    pub fn start(
        record: InstanceRecord,
        links: NodeLinks,
        store: StoreWriter,
        read_model: Arc<ReadModel>,
    ) -> InstanceHandle {
        let stats = ActorStats::new("instance", record.id.as_str(), Some(format!("cluster/{}", record.cluster)));
        stats.set_state(format!("{:?}", record.status));
        read_model.register_actor(&stats);
        read_model.write().instances.insert(record.id.clone(), record.clone());
        let actor =
            InstanceActor { record: Rc::new(RefCell::new(record)), links, store, read_model, stats: stats.clone() };
        InstanceHandle { addr: actor.start(), stats }
    }
}

impl InstanceActor {
    /// What a command's future needs, without borrowing the actor.
    fn env(&self) -> Env {
        Env {
            record: self.record.clone(),
            links: self.links.clone(),
            store: self.store.clone(),
            read_model: self.read_model.clone(),
            stats: self.stats.clone(),
        }
    }
}

impl Actor for InstanceActor {
    type Context = Context<Self>;

    fn stopped(&mut self, _ctx: &mut Context<Self>) {
        self.read_model.unregister_actor(&self.stats);
    }
}

/// Shared pieces the command future needs, without borrowing the actor.
struct Env {
    record: Rc<RefCell<InstanceRecord>>,
    links: NodeLinks,
    store: StoreWriter,
    read_model: Arc<ReadModel>,
    stats: Arc<ActorStats>,
}

impl Env {
    /// Applies `change` to the record, persists it, then publishes it.
    async fn save(&self, change: impl FnOnce(&mut InstanceRecord)) -> Result<(), String> {
        let snapshot = {
            let mut r = self.record.borrow_mut();
            change(&mut r);
            r.clone()
        };
        let op = WriteOp::put_instance(&snapshot).map_err(|e| e.to_string())?;
        self.store.commit(vec![op]).await.map_err(|e| format!("cannot persist instance record: {e}"))?;
        self.stats.set_state(format!("{:?}", snapshot.status));
        self.read_model.write().instances.insert(snapshot.id.clone(), snapshot);
        Ok(())
    }

    async fn execute(&self, cmd: InstanceCmd) -> InstanceOutcome {
        let (id, node) = {
            let r = self.record.borrow();
            (r.id.clone(), r.node.clone())
        };
        let verb = cmd.verb();
        let (transitional, desired) = match &cmd {
            InstanceCmd::Install(_) => (Some(InstanceStatus::Installing), None),
            InstanceCmd::Start { .. } => (Some(InstanceStatus::Starting), Some(DesiredState::Running)),
            InstanceCmd::Stop => (Some(InstanceStatus::Stopping), Some(DesiredState::Stopped)),
            InstanceCmd::Delete => (Some(InstanceStatus::Deleting), Some(DesiredState::Deleted)),
            InstanceCmd::WriteFiles { .. } | InstanceCmd::RunHook { .. } | InstanceCmd::CheckHealth { .. } => {
                (None, None)
            }
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
        let probe = matches!(cmd, InstanceCmd::RunHook { .. } | InstanceCmd::CheckHealth { .. });
        let mut applied = None;
        let link = self.links.lock().unwrap_or_else(|p| p.into_inner()).get(&node).cloned();
        let reply = match link {
            None => Err(NodeError::Disconnected(node.clone())),
            Some(link) => {
                let instance = id.clone();
                match cmd {
                    InstanceCmd::Install(p) => {
                        applied = Some(p.applied.clone());
                        let begin = InstallBegin {
                            instance,
                            generation,
                            run_as: p.run_as,
                            process: p.process,
                            files: p.files,
                            package_sha256: p.package_sha256,
                            package_size: p.package_size,
                        };
                        link.install(begin, p.blob).await
                    }
                    InstanceCmd::Start { wait } => {
                        link.call_within(AgentRequest::Start { instance, generation }, "Start", wait).await
                    }
                    InstanceCmd::Stop => link.call(AgentRequest::Stop { instance, generation }, "Stop").await,
                    InstanceCmd::WriteFiles { files, env } => {
                        let req = AgentRequest::WriteFiles { instance, generation, files, env: Some(env) };
                        link.call(req, "WriteFiles").await
                    }
                    InstanceCmd::Delete => link.call(AgentRequest::Delete { instance, generation }, "Delete").await,
                    InstanceCmd::RunHook { hook, argv, timeout } => {
                        let timeout_ms = timeout.as_millis() as u64;
                        let req = AgentRequest::RunHook { instance, generation, hook: hook.into(), argv, timeout_ms };
                        link.call_within(req, "RunHook", timeout).await
                    }
                    InstanceCmd::CheckHealth { timeout } => {
                        let req = AgentRequest::CheckHealth { instance, timeout_ms: timeout.as_millis() as u64 };
                        link.call_within(req, "CheckHealth", timeout).await
                    }
                }
            }
        };
        match reply {
            Ok(resp) => self.succeeded(&id, &node, verb, resp, applied).await,
            Err(err) => self.failed_with(&id, &node, verb, err, probe).await,
        }
    }

    /// Records what a successful answer means for the instance.
    async fn succeeded(
        &self,
        id: &InstanceId,
        node: &NodeId,
        verb: &str,
        resp: AgentResponse,
        applied: Option<Applied>,
    ) -> InstanceOutcome {
        let mut out = InstanceOutcome::from(InstanceResult::ok(id, ""));
        // Whether a reload or restart is owed now: set when files changed
        // under a running process, cleared when a process (re)loads them.
        let mut pending_restart = None;
        // (new status, new pid, message)
        let (status, pid, message) = match resp {
            AgentResponse::InstallResult { files_written } => {
                (Some(InstanceStatus::Installed), None, format!("installed ({files_written} files written)"))
            }
            AgentResponse::Started { pid, already_running } => {
                if !already_running {
                    pending_restart = Some(PendingRestart::No);
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
                if changed.iter().any(|c| c == ENV_CHANGED) {
                    pending_restart = Some(PendingRestart::Restart);
                } else if !changed.is_empty() {
                    pending_restart = Some(PendingRestart::Reload);
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
                    pending_restart = Some(PendingRestart::No);
                }
                out.result.exit_code = Some(exit_code);
                out.result.stdout_tail = stdout_tail;
                out.result.stderr_tail = stderr_tail;
                (None, None, format!("{verb} hook exited {exit_code}"))
            }
            AgentResponse::Healthy => (None, None, "healthy".into()),
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
                // Never downgrade an owed restart to a reload.
                match pending_restart {
                    Some(PendingRestart::Reload) if r.pending_restart == PendingRestart::Restart => {}
                    Some(p) => r.pending_restart = p,
                    None => {}
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
    /// state is in doubt (install, start, stop, delete); a failed hook or
    /// health check only records the error.
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
        let _ = self
            .save(|r| {
                if !keeps_status {
                    r.status = InstanceStatus::Failed;
                }
                r.last_error = Some(m);
            })
            .await;
        let result = InstanceResult { exit_code, stderr_tail, stdout_tail, ..InstanceResult::failed(id, message) };
        result.into()
    }
}

impl Handler<RunInstanceCommand> for InstanceActor {
    type Result = AtomicResponse<Self, InstanceOutcome>;

    fn handle(&mut self, msg: RunInstanceCommand, _ctx: &mut Context<Self>) -> Self::Result {
        self.stats.begin(msg.0.verb());
        let env = self.env();
        let stats = self.stats.clone();
        // One span per instance command, inside the operation's span.
        let span = tracing::info_span!("instance", id = %stats.id, verb = msg.0.verb());
        AtomicResponse::new(Box::pin(
            tracing::Instrument::instrument(
                async move {
                    let out = env.execute(msg.0).await;
                    let result = &out.result;
                    if !result.ok {
                        tracing::warn!(error = %result.message, "instance command failed");
                    }
                    stats.end(if result.ok { None } else { Some(result.message.clone()) });
                    out
                },
                span,
            )
            .into_actor(self),
        ))
    }
}

impl Handler<Observe> for InstanceActor {
    type Result = AtomicResponse<Self, bool>;

    fn handle(&mut self, msg: Observe, _ctx: &mut Context<Self>) -> Self::Result {
        self.stats.begin("observe");
        let (status, desired, pid, node) = {
            let r = self.record.borrow();
            (r.status, r.desired, r.pid, r.node.clone())
        };
        // Decide the new (status, pid, error) from what was observed; None
        // when the observation changes nothing.
        let change: Option<(InstanceStatus, Option<u32>, Option<String>)> = match msg.0 {
            Observation::Exited { pid: exited, description, restarting } => {
                let status = if restarting { InstanceStatus::Starting } else { InstanceStatus::Failed };
                (pid == Some(exited) && desired == DesiredState::Running).then_some((status, None, Some(description)))
            }
            Observation::Restarted { pid: Some(new), .. } if desired == DesiredState::Running && pid.is_none() => {
                Some((InstanceStatus::Running, Some(new), None))
            }
            Observation::Restarted { pid: None, error: Some(e) }
                if desired == DesiredState::Running && status == InstanceStatus::Starting && pid.is_none() =>
            {
                Some((InstanceStatus::Failed, None, Some(e)))
            }
            Observation::Inventory { present: false, .. }
                if !matches!(status, InstanceStatus::Pending | InstanceStatus::Deleting) =>
            {
                Some((InstanceStatus::Lost, None, Some(format!("node {node} no longer holds this instance"))))
            }
            Observation::Inventory { running: true, pid: seen, .. }
                if status != InstanceStatus::Running || pid != seen =>
            {
                Some((InstanceStatus::Running, seen, None))
            }
            // Running, or Starting with a restart the agent never reported
            // (it disconnected or restarted meanwhile).
            Observation::Inventory { present: true, running: false, .. }
                if matches!(status, InstanceStatus::Running | InstanceStatus::Starting) =>
            {
                Some((
                    InstanceStatus::Failed,
                    None,
                    Some(format!("not running on node {node} when its agent reconnected")),
                ))
            }
            _ => None,
        };
        let env = self.env();
        let stats = self.stats.clone();
        AtomicResponse::new(Box::pin(
            async move {
                let Some((status, pid, error)) = change else {
                    stats.end(None);
                    return false;
                };
                let failed = matches!(status, InstanceStatus::Failed | InstanceStatus::Lost);
                let e = error.clone();
                let _ = env
                    .save(|r| {
                        r.status = status;
                        r.pid = pid;
                        if e.is_some() {
                            r.last_error = e;
                        }
                    })
                    .await;
                stats.end(error);
                failed
            }
            .into_actor(self),
        ))
    }
}

impl Handler<Retire> for InstanceActor {
    type Result = ();

    fn handle(&mut self, _msg: Retire, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}
