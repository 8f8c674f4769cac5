//! `ClusterActor`: one per cluster. It owns the cluster record and runs the
//! cluster's operations one at a time; a second mutating request while one
//! runs answers `409 cluster_busy` naming the running operation.
//!
//! A request is validated in the handler (no side effect), then the
//! operation record and the cluster record are written in one durable batch,
//! then the caller gets `202` and the operation runs as a future spawned in
//! the actor's context — so the mailbox stays free for the next request to
//! be answered (with 409) while a long install runs.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;
use std::sync::Arc;

use actix::prelude::*;
use time::OffsetDateTime;

use super::Shared;
use super::cluster_ops::ClusterOps;
use super::instance::{InstanceActor, InstanceHandle, Observation, Observe, Retire};
use super::read_model::ActorStats;
use super::supervisor::{Escalate, Supervisor};
use crate::error::Error;
use crate::ids::{InstanceId, NodeId, OperationId};
use crate::operations::Plan;
use crate::operations::lifecycle::InstanceVerb;
use crate::operations::runner::{self, Outcome};
use crate::spec::ComponentSpec;
use crate::storage::WriteOp;
use crate::storage::records::{
    ClusterRecord, ClusterStatus, InstanceRecord, Limits, OperationKind, OperationRecord, OperationStatus,
    PackageRecord, RECORD_VERSION, Resumable,
};

/// What the actor owns, shared with the running operation's context (both
/// live on the actor's arbiter thread; borrows never cross an `.await`).
pub struct Core {
    pub record: ClusterRecord,
    pub instances: BTreeMap<InstanceId, InstanceHandle>,
    /// Instances decided during validation, created by the `allocate` step.
    pub pending: BTreeMap<InstanceId, InstanceRecord>,
}

/// A mutating request on a cluster.
#[derive(Debug, Clone)]
pub enum OpRequest {
    /// Sent by the supervisor for a new cluster; `pending` are the placed instances.
    Create {
        pending: Vec<InstanceRecord>,
        params: String,
    },
    Start,
    Stop,
    Restart,
    ScaleOut {
        role: String,
        add: u32,
        nodes: Option<Vec<NodeId>>,
    },
    ScaleIn {
        role: String,
        remove: Vec<InstanceId>,
    },
    Delete {
        force: bool,
    },
    /// New config values (`PATCH /clusters/{name}/config`).
    Reconfigure {
        values: BTreeMap<String, serde_json::Value>,
        batch: usize,
    },
    Upgrade {
        version: String,
        batch: usize,
    },
    /// Vertical scale (`PATCH /clusters/{name}/roles/{role}`).
    Resize {
        role: String,
        limits: Limits,
        batch: usize,
    },
    Instance {
        id: InstanceId,
        verb: InstanceVerb,
    },
}

#[derive(Message)]
#[rtype(result = "Result<OperationRecord, Error>")]
pub struct RunOperation(pub OpRequest);

/// From the supervisor: what an agent observed about one of our instances.
#[derive(Message)]
#[rtype(result = "()")]
pub struct InstanceObserved {
    pub instance: InstanceId,
    pub observation: Observation,
}

/// From the supervisor, after an escalation: show `Error` with the reason.
#[derive(Message)]
#[rtype(result = "()")]
pub struct EnterError {
    pub description: String,
    pub operation: Option<OperationId>,
}

pub struct ClusterActor {
    pub(super) core: Rc<RefCell<Core>>,
    pub(super) shared: Shared,
    supervisor: Addr<Supervisor>,
    stats: Arc<ActorStats>,
    /// An operation a master restart interrupted, resumed once started.
    resume: Option<OperationRecord>,
}

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
    /// Starts the actor with its record and existing instances, and goes on
    /// with `resume`, the operation that was running when the master stopped.
    pub fn start(
        record: ClusterRecord,
        instances: Vec<InstanceRecord>,
        resume: Option<OperationRecord>,
        shared: Shared,
        supervisor: Addr<Supervisor>,
    ) -> Addr<ClusterActor> {
        let stats = ActorStats::new("cluster", record.name.as_str(), Some("supervisor".into()));
        stats.set_state(format!("{:?}", record.status));
        shared.read_model.register_actor(&stats);
        shared.read_model.write().clusters.insert(record.name.clone(), record.clone());
        let handles = instances
            .into_iter()
            .map(|r| {
                let id = r.id.clone();
                (id, InstanceActor::start(r, shared.links.clone(), shared.store.clone(), shared.read_model.clone()))
            })
            .collect();
        let core = Rc::new(RefCell::new(Core { record, instances: handles, pending: BTreeMap::new() }));
        ClusterActor { core, shared, supervisor, stats, resume }.start()
    }

    pub(super) fn package(&self) -> Result<(PackageRecord, Arc<ComponentSpec>), Error> {
        let pkg = self.core.borrow().record.package.clone();
        let state = self.shared.read_model.read();
        state
            .packages
            .get(&(pkg.name.clone(), pkg.version.clone()))
            .map(|p| (p.record.clone(), p.spec.clone()))
            .ok_or_else(|| Error::internal(std::io::Error::other(format!("package {pkg} of the cluster is missing"))))
    }

    /// Instance ids by role order (ascending), optionally only `only`.
    pub(super) fn groups(&self, spec: &ComponentSpec, only: Option<&[InstanceId]>) -> Vec<(i32, Vec<InstanceId>)> {
        let name = self.core.borrow().record.name.clone();
        let members = self.shared.read_model.read().cluster_instances(&name);
        group_by_order(spec, members.iter().filter(|m| only.is_none_or(|o| o.contains(&m.id))))
    }

    fn spawn_operation(&mut self, ctx: &mut Context<Self>, prepared: Prepared, op: OperationRecord) {
        let ops = ClusterOps {
            core: self.core.clone(),
            shared: self.shared.clone(),
            kind: prepared.kind,
            force: prepared.force,
            on_success: prepared.on_success,
            supervisor: self.supervisor.clone(),
        };
        let plan = prepared.plan;
        let kind = prepared.kind;
        let mut op = op;
        self.stats.set_state(format!("running {kind:?}"));
        // One span per operation: every log line of its steps carries it.
        let span = tracing::info_span!("operation", id = %op.id, kind = ?kind, cluster = %op.cluster);
        ctx.spawn(
            tracing::Instrument::instrument(
                async move {
                    let outcome = runner::run(&ops, &mut op, &plan).await;
                    (outcome, op)
                },
                span,
            )
            .into_actor(self)
            .map(move |(outcome, op), act, ctx| act.finish(ctx, outcome, op, kind)),
        );
    }

    /// After an operation has completed (its end and the cluster's new
    /// status are durable and published by `ClusterOps::complete`).
    fn finish(&mut self, ctx: &mut Context<Self>, outcome: Outcome, op: OperationRecord, kind: OperationKind) {
        match outcome {
            Outcome::Succeeded if kind == OperationKind::Delete => {
                tracing::info!(cluster = %op.cluster, "cluster deleted");
                ctx.stop();
            }
            Outcome::Succeeded => self.stats.set_state("idle"),
            Outcome::Failed { error, .. } => {
                self.stats.end(Some(error));
                let status = self.core.borrow().record.status;
                self.stats.set_state(format!("{status:?}"));
            }
        }
    }
}

/// Groups instances by their role's order, ascending; ids sorted within a group.
pub fn group_by_order<'a>(
    spec: &ComponentSpec,
    instances: impl Iterator<Item = &'a InstanceRecord>,
) -> Vec<(i32, Vec<InstanceId>)> {
    let mut groups: BTreeMap<i32, Vec<(String, u32, InstanceId)>> = BTreeMap::new();
    for i in instances {
        let order = spec.role(&i.role).map(|r| r.order).unwrap_or_default();
        groups.entry(order).or_default().push((i.role.clone(), i.ordinal, i.id.clone()));
    }
    groups
        .into_iter()
        .map(|(order, mut v)| {
            v.sort();
            (order, v.into_iter().map(|(_, _, id)| id).collect())
        })
        .collect()
}

impl Actor for ClusterActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        let Some(op) = self.resume.take() else { return };
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
        // the nodes the operation touches (at most until a silent node would
        // count as Down), so a resumed step does not fail on a link that is
        // about to come back.
        let mut nodes: BTreeSet<NodeId> = r.pending.iter().map(|p| p.node.clone()).collect();
        {
            let state = self.shared.read_model.read();
            let name = &self.core.borrow().record.name;
            nodes.extend(state.cluster_instances(name).into_iter().map(|i| i.node));
        }
        let prepared = Prepared {
            kind: op.kind,
            plan: r.plan,
            params: op.params.clone(),
            pending: r.pending,
            on_success: r.on_success,
            force: r.force,
        };
        let shared = self.shared.clone();
        let patience = self.shared.timing.node_down_after;
        let wait = async move {
            let deadline = tokio::time::Instant::now() + patience;
            loop {
                let connected = {
                    let s = shared.read_model.read();
                    nodes.iter().all(|n| s.nodes.get(n).is_some_and(|v| v.connected))
                };
                if connected || tokio::time::Instant::now() >= deadline {
                    return;
                }
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        };
        ctx.spawn(wait.into_actor(self).map(move |(), act, ctx| act.spawn_operation(ctx, prepared, op)));
    }

    fn stopped(&mut self, _ctx: &mut Context<Self>) {
        for h in self.core.borrow().instances.values() {
            h.addr.do_send(Retire);
        }
        self.shared.read_model.unregister_actor(&self.stats);
    }
}

impl Handler<RunOperation> for ClusterActor {
    type Result = ResponseActFuture<Self, Result<OperationRecord, Error>>;

    fn handle(&mut self, msg: RunOperation, _ctx: &mut Context<Self>) -> Self::Result {
        self.stats.begin(format!("{:?}", msg.0).split([' ', '{', '(']).next().unwrap_or("op").to_string());
        let busy = self.core.borrow().record.operation;
        if let Some(running) = busy {
            let kind = self
                .shared
                .read_model
                .read()
                .operations
                .get(&running)
                .map(|o| format!("{:?}", o.kind))
                .unwrap_or_default();
            let name = self.core.borrow().record.name.clone();
            self.stats.end(None);
            return Box::pin(fut::ready(Err(Error::conflict(
                "cluster_busy",
                format!("cluster {name} is busy with operation {running} ({kind}); retry when it has ended"),
            ))));
        }
        let is_change = matches!(
            msg.0,
            OpRequest::ScaleOut { .. }
                | OpRequest::ScaleIn { .. }
                | OpRequest::Reconfigure { .. }
                | OpRequest::Upgrade { .. }
                | OpRequest::Resize { .. }
        );
        let prepared = self.package().and_then(|(_, spec)| self.prepare(msg.0, &spec));
        let prepared = match prepared {
            Ok(p) => p,
            Err(e) => {
                self.stats.end(Some(e.to_string()));
                if is_change && self.core.borrow().record.status == ClusterStatus::Active {
                    // Sahara: a refused scale leaves the cluster Active, with the reason.
                    let description = format!("request refused, nothing changed: {e}");
                    let ops = self.shared.clone();
                    let core = self.core.clone();
                    actix::spawn(async move {
                        let snapshot = {
                            let mut c = core.borrow_mut();
                            c.record.status_description = description;
                            c.record.clone()
                        };
                        if let Ok(op) = WriteOp::put_cluster(&snapshot)
                            && ops.store.commit(vec![op]).await.is_ok()
                        {
                            ops.read_model.write().clusters.insert(snapshot.name.clone(), snapshot);
                        }
                    });
                }
                return Box::pin(fut::ready(Err(e)));
            }
        };
        let now = OffsetDateTime::now_utc();
        let op = {
            let mut core = self.core.borrow_mut();
            let op = OperationRecord {
                version: RECORD_VERSION,
                id: OperationId::random(),
                cluster_id: core.record.id,
                cluster: core.record.name.clone(),
                kind: prepared.kind,
                params: prepared.params.clone(),
                status: OperationStatus::Pending,
                steps: vec![],
                error: None,
                created_at: now,
                ended_at: None,
                resume: Some(Resumable {
                    plan: prepared.plan.clone(),
                    pending: prepared.pending.clone(),
                    on_success: prepared.on_success,
                    force: prepared.force,
                }),
            };
            // Busy from here on, before any await.
            core.record.operation = Some(op.id);
            core.record.updated_at = now;
            for p in &prepared.pending {
                core.pending.insert(p.id.clone(), p.clone());
            }
            op
        };
        let mut op = op;
        runner::prepare(&mut op, &prepared.plan);
        let cluster = self.core.borrow().record.clone();
        let writes = WriteOp::put_cluster(&cluster).and_then(|a| WriteOp::put_operation(&op).map(|b| vec![a, b]));
        let store = self.shared.store.clone();
        Box::pin(
            async move {
                match writes {
                    Ok(w) => store.commit(w).await.map_err(Error::from),
                    Err(e) => Err(Error::from(e)),
                }
            }
            .into_actor(self)
            .map(move |res, act, ctx| {
                act.stats.end(res.as_ref().err().map(|e| e.to_string()));
                match res {
                    Ok(()) => {
                        act.shared.read_model.write().clusters.insert(cluster.name.clone(), cluster);
                        act.shared.read_model.put_operation(&op);
                        act.spawn_operation(ctx, prepared, op.clone());
                        Ok(op)
                    }
                    Err(e) => {
                        let mut core = act.core.borrow_mut();
                        core.record.operation = None;
                        for p in &prepared.pending {
                            core.pending.remove(&p.id);
                            act.shared.ports.release(&p.node, p.ports.values().copied());
                        }
                        Err(e)
                    }
                }
            }),
        )
    }
}

impl Handler<InstanceObserved> for ClusterActor {
    type Result = ResponseActFuture<Self, ()>;

    fn handle(&mut self, msg: InstanceObserved, _ctx: &mut Context<Self>) -> Self::Result {
        let handle = self.core.borrow().instances.get(&msg.instance).cloned();
        let Some(handle) = handle else {
            return Box::pin(fut::ready(()));
        };
        handle.stats.enqueue();
        let description = match &msg.observation {
            Observation::Exited { description, .. } => description.clone(),
            Observation::Restarted { error, .. } => error.clone().unwrap_or_default(),
            Observation::Inventory { .. } => {
                format!("instance {} is not running after its agent reconnected", msg.instance)
            }
        };
        Box::pin(async move { handle.addr.send(Observe(msg.observation)).await.unwrap_or(false) }.into_actor(self).map(
            move |failed, act, _| {
                let (busy, status, name) = {
                    let c = act.core.borrow();
                    (c.record.operation.is_some(), c.record.status, c.record.name.clone())
                };
                // During an operation the operation reports failures
                // itself. Otherwise an Active cluster whose member died
                // is in Error, saying which member, where and why.
                if failed && !busy && status == ClusterStatus::Active {
                    act.supervisor.do_send(Escalate { cluster: name, operation: None, description, recorded: false });
                }
            },
        ))
    }
}

impl Handler<EnterError> for ClusterActor {
    type Result = ResponseActFuture<Self, ()>;

    fn handle(&mut self, msg: EnterError, _ctx: &mut Context<Self>) -> Self::Result {
        if self.core.borrow().record.operation.is_some() {
            // An operation started meanwhile; its own end decides the status.
            return Box::pin(fut::ready(()));
        }
        let snapshot = {
            let mut c = self.core.borrow_mut();
            c.record.status = ClusterStatus::Error;
            c.record.status_description = msg.description;
            c.record.updated_at = OffsetDateTime::now_utc();
            c.record.clone()
        };
        self.stats.set_state("Error");
        let shared = self.shared.clone();
        Box::pin(
            async move {
                match WriteOp::put_cluster(&snapshot) {
                    Ok(op) => {
                        if let Err(e) = shared.store.commit(vec![op]).await {
                            tracing::error!(cluster = %snapshot.name, error = %e, "cannot persist Error status");
                        }
                    }
                    Err(e) => tracing::error!(error = %e, "cannot encode cluster"),
                }
                shared.read_model.write().clusters.insert(snapshot.name.clone(), snapshot);
            }
            .into_actor(self),
        )
    }
}

/// Stops the actor without touching storage (a create that never became durable).
#[derive(Message)]
#[rtype(result = "()")]
pub struct Shutdown;

impl Handler<Shutdown> for ClusterActor {
    type Result = ();

    fn handle(&mut self, _msg: Shutdown, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}
