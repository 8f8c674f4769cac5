//! `ClusterActor`: one per cluster. It owns the cluster record and its
//! instance actors, and runs the cluster's operations one at a time; a
//! second mutating request while one runs answers `409 cluster_busy` naming
//! the running operation.
//!
//! A request is validated in the handler (no side effect, [`prepare`]),
//! then the operation record and the cluster record are written in one
//! durable batch, then the caller gets `202` and the operation runs as a
//! future spawned in the actor's context — so the mailbox stays free for
//! the next request to be answered (with 409) while a long install runs.
//!
//! Cluster actors are spread over the master's arbiters (threads): each
//! lives on one, with its instance actors, so its state needs no locks and
//! independent clusters progress in parallel.
//!
//! - [`request`]: the mutating requests ([`OpRequest`])
//! - [`run_operation`]: a request accepted: journaled, then run
//! - [`prepare`]: validation of a request into a plan
//! - [`ops`]: the operation context (journal, end, definition changes)
//! - [`steps`]: how actions reach instances: in parallel, by role order,
//!   rolling in batches
//! - [`failures`]: members failing: observations, `Error`, failures kept
//!   while an operation runs
//! - [`await_nodes`]: placement waiting for a node request (the pools)

mod await_nodes;
mod failures;
mod ops;
mod prepare;
mod preview;
mod replace;
mod request;
mod run_operation;
mod steps;
pub mod submit;
mod writes;

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use actix::prelude::*;
use futures::FutureExt;
use time::OffsetDateTime;

use self::ops::ClusterOps;
use super::Shared;
use super::instance::{ClusterEnv, InstanceActor, InstanceHandle, Observation};
use super::node_manager::Ack;
use super::read_model::{ActorStats, ClusterCell, Reservation};
use super::registry::ClusterHandle;
use super::supervisor::{ClusterPanicked, Supervisor};
use crate::error::Error;
use crate::ids::{InstanceId, NodeId, OperationId};
use crate::operations::Plan;
use crate::operations::runner::{self, Outcome};
use crate::spec::ComponentSpec;
use crate::storage::records::{
    ClusterRecord, ClusterStatus, InstanceRecord, InstanceStatus, OperationKind, OperationRecord, OperationStatus,
    PackageRecord, RECORD_VERSION, Resumable,
};
use crate::storage::{WriteOp, events};

pub use failures::InstanceObserved;
use prepare::new_groups;
pub use prepare::{MAX_BATCH, group_by_order};
pub use preview::{PlacedInstance, PlanPreview, Preview, PreviewCreate, PreviewStep};
pub use request::{Accepted, OpRequest, RoleToPlace, RunOperation};
pub(crate) use writes::{END_RETRIES, commit_retrying, commit_until_landed};

/// What the actor owns, shared with the running operation's context (both
/// live on the actor's arbiter thread; borrows never cross an `.await`).
pub struct Core {
    /// The durable record (changed only after a write is acknowledged,
    /// except `operation`, which marks the cluster busy at once).
    pub record: ClusterRecord,
    pub instances: BTreeMap<InstanceId, InstanceHandle>,
    /// Instances decided during validation, created by the `allocate` step.
    pub pending: BTreeMap<InstanceId, InstanceRecord>,
    /// Ended operations still stored (creation nanos, id), oldest first:
    /// past the retention limit the oldest are deleted.
    pub history: VecDeque<(u64, OperationId)>,
}

impl Core {
    /// The members' records, by role then ordinal.
    pub fn members(&self) -> Vec<Arc<InstanceRecord>> {
        let mut v: Vec<Arc<InstanceRecord>> = self.instances.values().map(|i| i.record()).collect();
        v.sort_by(|a, b| (&*a.role, a.ordinal).cmp(&(&*b.role, b.ordinal)));
        v
    }
}

pub struct ClusterActor {
    core: Rc<RefCell<Core>>,
    env: Rc<ClusterEnv>,
    shared: Shared,
    supervisor: Addr<Supervisor>,
    stats: Arc<ActorStats>,
    /// An operation a master restart interrupted, resumed once started.
    resume: Option<OperationRecord>,
    /// Its create is not durable yet (or failed): it takes nothing else, so
    /// no operation can be recorded for a cluster that does not exist.
    /// Until then nothing shows it (actors list, events).
    creating: bool,
}

/// What a cluster actor starts from.
pub struct Start {
    pub record: ClusterRecord,
    pub instances: Vec<InstanceRecord>,
    /// An operation a master restart interrupted.
    pub resume: Option<OperationRecord>,
    pub history: VecDeque<(u64, OperationId)>,
    /// Show the cluster at once (it is durable: boot); a new cluster is
    /// shown once its create is.
    pub visible: bool,
    /// The incarnation it replaces (a restart): its restarts and last exit
    /// carry over, and its listing in the actor tree is taken over in
    /// place, with no moment unlisted.
    pub predecessor: Option<Arc<ActorStats>>,
}

static STARTED: AtomicU64 = AtomicU64::new(0);

/// A validated request, ready to run.
pub(super) struct Prepared {
    pub kind: OperationKind,
    pub plan: Plan,
    pub params: String,
    pub pending: Vec<InstanceRecord>,
    /// The cluster status when the operation succeeds (None: keep it).
    pub on_success: Option<ClusterStatus>,
    /// A force delete.
    pub force: bool,
}

impl ClusterActor {
    /// Starts the actor, on one of the master's arbiters, with its record
    /// and existing instances; it goes on with `start.resume`.
    pub fn start(start: Start, shared: Shared, supervisor: Addr<Supervisor>) -> ClusterHandle {
        let name = start.record.name.clone();
        let cluster = start.record.id;
        let stats = ActorStats::new("cluster", name.as_str(), Some("supervisor".into()));
        stats.set_state(format!("{:?}", start.record.status));
        if let Some(dead) = &start.predecessor {
            stats.inherit(dead);
        }
        if start.visible {
            shared.read_model.register_actor(&stats);
        }
        let n = STARTED.fetch_add(1, Ordering::Relaxed);
        let (arbiter, priority) = (shared.arbiter_for(n), shared.priority_for(n));
        let gate = priority.clone();
        let cell = ClusterCell::new(start.record.clone());
        let s = stats.clone();
        // A panic is reported to the supervisor, which starts the actor
        // again from the store (`supervisor::ClusterPanicked`).
        let on_panic = {
            let (supervisor, stats, name, id) = (supervisor.clone(), stats.clone(), name.clone(), start.record.id);
            let (counter, read_model) = (shared.supervisor.clone(), shared.read_model.clone());
            move || -> super::supervised::OnPanic {
                Box::new(move |reason| {
                    // Listed all along: its context's drop unregistered it,
                    // and the supervisor acts only when it gets to this.
                    stats.set_state("restarting");
                    read_model.register_actor(&stats);
                    let slot = Reservation::counted(&counter);
                    supervisor.do_send(ClusterPanicked { name, cluster: id, stats, reason, slot });
                })
            }
        };
        let addr = super::supervised::start_in_arbiter(
            &arbiter,
            move |ctx| {
                let env = Rc::new(ClusterEnv {
                    shared: shared.clone(),
                    cell: cell.clone(),
                    progress: Arc::default(),
                    answered: AtomicU64::new(0),
                    priority: gate,
                    stats: s.clone(),
                    failures: Default::default(),
                    record_writes: Default::default(),
                    in_flight: shared.in_flight.of(start.record.id),
                });
                let handles: BTreeMap<InstanceId, InstanceHandle> =
                    start.instances.into_iter().map(|r| (r.id.clone(), InstanceActor::quiet(r, env.clone()))).collect();
                cell.put_instances(handles.values().map(|h| h.entry()));
                if start.visible {
                    shared.read_model.add_cluster(&name, cell.clone());
                }
                let core =
                    Core { record: start.record, instances: handles, pending: BTreeMap::new(), history: start.history };
                let core = Rc::new(RefCell::new(core));
                *env.failures.borrow_mut() = Some(ClusterActor::escalation(&core, &env, &s, ctx.address()));
                ClusterActor { core, env, shared, supervisor, stats: s, resume: start.resume, creating: !start.visible }
            },
            on_panic,
        );
        ClusterHandle { cluster, addr, stats, priority, arbiter }
    }

    pub(super) fn package(&self) -> Result<(Arc<PackageRecord>, Arc<ComponentSpec>), Error> {
        let pkg = self.core.borrow().record.package.clone();
        self.shared
            .read_model
            .package(&pkg.name, &pkg.version)
            .map(|p| (p.record, p.spec))
            .ok_or_else(|| Error::internal(std::io::Error::other(format!("package {pkg} of the cluster is missing"))))
    }

    /// Instance ids by role order (ascending), optionally only `only`.
    pub(super) fn groups(&self, spec: &ComponentSpec, only: Option<&[InstanceId]>) -> Vec<(i32, Vec<InstanceId>)> {
        let members = self.core.borrow().members();
        group_by_order(spec, members.iter().map(|m| &**m).filter(|m| only.is_none_or(|o| o.contains(&m.id))))
    }

    /// The operation context for `prepared` (or a bare one to save the record).
    fn ops(&self, prepared: Option<&Prepared>) -> ClusterOps {
        ClusterOps {
            core: self.core.clone(),
            env: self.env.clone(),
            shared: self.shared.clone(),
            kind: prepared.map(|p| p.kind).unwrap_or(OperationKind::Start),
            force: prepared.is_some_and(|p| p.force),
            on_success: prepared.and_then(|p| p.on_success),
            supervisor: self.supervisor.clone(),
            journaled: Default::default(),
            running: Default::default(),
            ended: Default::default(),
            plan: Default::default(),
            holds: Default::default(),
        }
    }

    fn spawn_operation(&mut self, ctx: &mut Context<Self>, prepared: Prepared, op: OperationRecord) {
        let ops = self.ops(Some(&prepared));
        *ops.plan.borrow_mut() = Some((
            op.id,
            Resumable {
                plan: prepared.plan.clone(),
                pending: prepared.pending.clone(),
                on_success: prepared.on_success,
                force: prepared.force,
            },
        ));
        // A resumed operation's steps were announced before the restart.
        *ops.journaled.borrow_mut() = op.steps.iter().map(|s| s.status).collect();
        let plan = prepared.plan;
        let kind = prepared.kind;
        let mut op = op;
        self.stats.set_state(format!("running {kind:?}"));
        // One span per operation: every log line of its steps carries it.
        let span = tracing::info_span!("operation", id = %op.id, kind = ?kind, cluster = %op.cluster);
        let live = super::live_tasks::LiveTask::new("operation");
        ctx.spawn(
            tracing::Instrument::instrument(
                async move {
                    let _live = live;
                    // Its commands take turns with other tasks on this
                    // thread, and all of it waits while a request does.
                    let gate = ops.env.priority.clone();
                    ops.env.in_flight.before_operation(&op.id, &ops.env.stats).await;
                    let run = gate.behind_requests(runner::run(&ops, &mut op, &plan));
                    let outcome = crate::actors::priority::sliced(run).await;
                    (outcome, op, ops.ended.get())
                },
                span,
            )
            .into_actor(self)
            .map(move |(outcome, op, recorded), act, ctx| act.finish(ctx, outcome, op, kind, recorded)),
        );
    }

    /// After an operation has completed: its end and the cluster's new
    /// status are durable and published by `ClusterOps::complete`, unless
    /// `recorded` is false: then nothing of the end is shown, and the
    /// cluster stays busy with the operation until the next master resumes
    /// or ends it from its journal.
    fn finish(
        &mut self,
        ctx: &mut Context<Self>,
        outcome: Outcome,
        op: OperationRecord,
        kind: OperationKind,
        recorded: bool,
    ) {
        if !recorded {
            let why = format!("the end of operation {} is not recorded; busy with it until the master restarts", op.id);
            self.stats.end(Some(why.clone()));
            self.stats.set_state(format!("paused: {why}"));
            return;
        }
        match outcome {
            Outcome::Succeeded if kind == OperationKind::Delete => {
                tracing::info!(cluster = %op.cluster, "cluster deleted");
                ctx.stop();
                return;
            }
            Outcome::Succeeded => self.stats.succeeded(),
            Outcome::Failed { error, .. } | Outcome::Halted { error, .. } => self.stats.end(Some(error)),
        }
        // An operation that succeeded may still leave the cluster in Error
        // (a member it did not touch died while it ran).
        let status = self.core.borrow().record.status;
        if status == ClusterStatus::Active {
            self.stats.set_state("idle");
            // A member whose failure landed after the end was decided.
            self.check_members(ctx);
        } else {
            self.stats.set_state(format!("{status:?}"));
        }
    }
}

/// An actor's instances are retired with it: commands a dead actor (one
/// that panicked) left running write nothing more, so the actor started in
/// its place from the store is the only writer of their records.
impl Drop for ClusterActor {
    fn drop(&mut self) {
        if let Ok(core) = self.core.try_borrow() {
            for h in core.instances.values() {
                h.set_forgotten(true);
            }
        }
    }
}

impl Actor for ClusterActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        let name = self.core.borrow().record.name.clone();
        if !self.creating {
            crate::actors::announce::actor(&self.shared, "actor.started", "cluster", &name, Some(&name), None);
        }
        let Some(op) = self.resume.take() else {
            // A free cluster: an older master (or this actor's dead
            // predecessor) may have left a failed member in an Active one.
            self.check_members(ctx);
            return;
        };
        let Some(r) = op.resume.clone() else { return };
        tracing::info!(operation = %op.id, kind = ?op.kind, cluster = %op.cluster, "resuming an operation interrupted by a master restart");
        {
            let mut core = self.core.borrow_mut();
            for p in &r.pending {
                if !core.instances.contains_key(&p.id) {
                    core.pending.insert(p.id.clone(), p.clone());
                }
            }
        }
        // The agents reconnect by themselves after a master restart: wait for
        // the nodes the operation touches, each until it would count as
        // Down (`node_down_after` of silence, counted from its last frame
        // or the master's start), so a resumed step does not fail on a link
        // that is about to come back. A node silent that long already (an
        // actor restarted long after its agents left) is not waited for:
        // an actor killed again and again would otherwise wait anew each
        // time and never resume.
        let mut nodes: BTreeSet<NodeId> = r.pending.iter().map(|p| p.node.clone()).collect();
        nodes.extend(self.core.borrow().members().iter().map(|i| i.node.clone()));
        let prepared = Prepared {
            kind: op.kind,
            plan: r.plan,
            params: op.params.clone(),
            pending: r.pending,
            on_success: r.on_success,
            force: r.force,
        };
        let shared = self.shared.clone();
        let (unknown, patience) = (self.shared.timing.node_unknown_after, self.shared.timing.node_down_after);
        let wait = async move {
            let deadline = tokio::time::Instant::now() + patience;
            loop {
                let now = std::time::Instant::now();
                let coming = |n: &NodeId| {
                    shared.read_model.node(n).is_some_and(|v| {
                        !v.live.connected()
                            && v.live.status_at(now, unknown, patience) != crate::storage::records::NodeStatus::Down
                    })
                };
                if !nodes.iter().any(coming) || tokio::time::Instant::now() >= deadline {
                    return;
                }
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        };
        ctx.spawn(wait.into_actor(self).map(move |(), act, ctx| act.spawn_operation(ctx, prepared, op)));
    }

    fn stopped(&mut self, _ctx: &mut Context<Self>) {
        if super::supervised::dropped_after_panic() {
            // Its supervisor acts on it (`on_panic`): it stays listed,
            // restarting, with no moment unlisted in between.
            return;
        }
        self.shared.read_model.unregister_actor(&self.stats);
        if self.creating {
            // Never shown: a create that did not become durable.
            return;
        }
        let name = self.core.borrow().record.name.clone();
        crate::actors::announce::actor(&self.shared, "actor.stopped", "cluster", &name, Some(&name), None);
    }
}

/// Stops the actor as if it failed (the operator's kill, and the
/// supervision tests): it panics with `reason`, and its supervisor acts on
/// that as on any failure (`supervisor::ClusterPanicked`).
#[derive(Message)]
#[rtype(result = "()")]
pub struct Kill {
    pub reason: String,
}

impl Handler<Kill> for ClusterActor {
    type Result = ();

    fn handle(&mut self, msg: Kill, _ctx: &mut Context<Self>) {
        let name = self.core.borrow().record.name.clone();
        tracing::warn!(cluster = %name, reason = %msg.reason, "cluster actor killed");
        std::panic::panic_any(format!("{} (cluster {name})", msg.reason));
    }
}

/// Test hooks: the actor takes no message for this long (its thread
/// stays free for other actors).
#[derive(Message)]
#[rtype(result = "()")]
pub struct Stall(pub std::time::Duration);

impl Handler<Stall> for ClusterActor {
    type Result = ();

    fn handle(&mut self, msg: Stall, ctx: &mut Context<Self>) {
        ctx.wait(actix::fut::wrap_future(tokio::time::sleep(msg.0)));
    }
}

/// Test hooks: the actor blocks its thread this long (a saturated thread:
/// no actor there takes a message meanwhile).
#[derive(Message)]
#[rtype(result = "()")]
pub struct Block(pub std::time::Duration);

impl Handler<Block> for ClusterActor {
    type Result = ();

    fn handle(&mut self, msg: Block, _ctx: &mut Context<Self>) {
        // Shown (`GET /actors` reads it off this thread), so a test knows
        // the thread is blocked before it acts.
        self.stats.busy_with(format!("blocked by a test hook for {:?}", msg.0));
        std::thread::sleep(msg.0);
        self.stats.end(None);
    }
}

/// Test hooks: the next turn of instance actor `.0` panics where it runs
/// (`InstanceActor::inject_panic`); `false` when the cluster has no such
/// instance.
#[derive(Message)]
#[rtype(result = "bool")]
pub struct InjectInstancePanic(pub InstanceId);

impl Handler<InjectInstancePanic> for ClusterActor {
    type Result = bool;

    fn handle(&mut self, msg: InjectInstancePanic, _ctx: &mut Context<Self>) -> bool {
        let core = self.core.borrow();
        core.instances.get(&msg.0).map(|h| h.inject_panic()).is_some()
    }
}
