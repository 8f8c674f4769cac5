//! `Supervisor`: the root of the actor tree. It starts one `ClusterActor`
//! per cluster at boot, creates new clusters (validating the request before
//! anything exists), removes deleted ones (it alone writes the cluster
//! registry, so a name is taken once), reconciles an agent's inventory when
//! it connects, and turns escalated failures into a cluster `Error` with a
//! description that says why.
//!
//! It is on no hot path: requests reach cluster actors through the
//! registry, and agents' reports go from their node manager straight to the
//! instance's cluster.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;

use actix::prelude::*;
use serde::Serialize;
use time::OffsetDateTime;

mod children;
mod create;
mod inject;
mod nodes;

pub use children::{ActorVerb, ActorVerbAnswer, Fault, Verb};
pub use create::{
    NewPlacement, Room, await_nodes, fitting_nodes, place_instances, place_new_cluster, place_or_wait, room,
    wanted_labels,
};
pub use nodes::{NodeDown, NodeInventory};

use super::Shared;
use super::cluster::{ClusterActor, InstanceObserved, OpRequest, RoleToPlace, RunOperation, Start};
use super::gone_operations::GoneOperations;
use super::instance::Observation;
use super::placement::Candidate;
use super::read_model::{ActorStats, Claim, Reservation};
use super::supervision::{Intensity, spec};
use crate::error::Error;
use crate::ids::{ClusterId, InstanceId, NodeId, OperationId, validate_name};
use crate::spec::{ComponentSpec, RoleSpec};
use crate::storage::records::{
    ClusterRecord, ClusterStatus, DesiredState, InstanceRecord, InstanceStatus, NodeStatus, OperationRecord,
    OperationStatus, PackageRef, PendingRestart, RECORD_VERSION, RoleState,
};
use crate::storage::{WriteOp, events};

/// A request to create a cluster (already parsed from JSON).
#[derive(Debug, Clone, Serialize)]
pub struct CreateCluster {
    pub name: String,
    pub package: PackageRef,
    pub roles: BTreeMap<String, RoleRequest>,
    pub config: BTreeMap<String, serde_json::Value>,
}

impl CreateCluster {
    /// What the create's operation record keeps of the request: its
    /// secret values (as `typed`, the record's resolved config, says) shown
    /// only as set.
    pub fn params(&self, typed: &BTreeMap<String, crate::storage::records::ConfigValue>) -> String {
        let shown =
            CreateCluster { config: crate::storage::records::mask_secrets(&self.config, typed), ..self.clone() };
        serde_json::to_string(&shown).unwrap_or_default()
    }
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct RoleRequest {
    pub count: Option<u32>,
    pub nodes: Option<Vec<NodeId>>,
    /// Over the spec's `node_labels` for this cluster (kept in its record).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_labels: Option<BTreeMap<String, String>>,
}

/// [`CreateCluster`] with its place in the supervisor's mailbox. Answered
/// once the new cluster's actor has the create: await its [`CreateAnswer`].
pub struct Create(pub CreateCluster, pub Reservation);

impl Message for Create {
    type Result = Result<CreateAnswer, Error>;
}

/// The answer of the cluster actor a create was handed to: its operation
/// once durable and published, or why it was refused (the actor has then
/// freed the name and stopped). Forwarded from the cluster's thread to the
/// caller's, not through the supervisor's: a burst of creates no longer
/// queues for the supervisor's turn twice. The new actor must take the
/// create within the caller's limit, as any request: the [`Claim`] decides
/// (an abandoned create is dropped by the actor, which frees the name).
pub struct CreateAnswer {
    answer: tokio::sync::oneshot::Receiver<Result<Result<OperationRecord, Error>, MailboxError>>,
    claim: Claim,
}

impl CreateAnswer {
    /// The actor's answer (`Err`: its mailbox closed before it answered),
    /// and the claim that decides whether it took the create.
    pub fn into_parts(
        self,
    ) -> (impl Future<Output = Result<Result<OperationRecord, Error>, MailboxError>> + Send + 'static, Claim) {
        let answer = async move { self.answer.await.unwrap_or(Err(MailboxError::Closed)) };
        (answer, self.claim)
    }

    /// The answer, however long the actor takes (the unit tests').
    #[cfg(test)]
    pub async fn answer(self) -> Result<OperationRecord, Error> {
        let (answer, _) = self.into_parts();
        answer.await.unwrap_or_else(|e| Err(Error::unavailable(format!("cluster actor: {e}"))))
    }
}

/// A cluster finished its delete; its name is free.
#[derive(Message)]
#[rtype(result = "()")]
pub struct ClusterGone {
    pub name: String,
    pub cluster: ClusterId,
    /// Its ended operations still stored (the delete among them).
    pub operations: Vec<(u64, OperationId)>,
    pub slot: Reservation,
}

/// A cluster went `Error` at an operation's end (already durable: the
/// end writes the cluster's status and the operation in one batch): the
/// supervisor logs it and announces the failure.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Escalate {
    pub cluster: String,
    pub operation: Option<OperationId>,
    pub description: String,
    pub slot: Reservation,
}

/// A cluster actor panicked (see `actors::supervised`): it is started again
/// from the cluster's stored records.
#[derive(Message)]
#[rtype(result = "()")]
pub struct ClusterPanicked {
    pub name: String,
    pub cluster: ClusterId,
    /// The dead actor's counters: which incarnation it was.
    pub stats: Arc<ActorStats>,
    pub reason: String,
    pub slot: Reservation,
}

pub struct Supervisor {
    shared: Shared,
    boot: Option<Boot>,
    stats: Arc<ActorStats>,
    gone: GoneOperations,
    /// Each cluster actor's recent restarts, against its child spec
    /// (`supervision::spec("cluster")`).
    restarts: HashMap<String, Intensity>,
}

/// What the supervisor starts from.
pub struct Boot {
    pub clusters: Vec<ClusterRecord>,
    pub instances: Vec<InstanceRecord>,
    /// Operations that had not ended (with their plans).
    pub operations: Vec<OperationRecord>,
    /// Each cluster's ended operations still stored, oldest first.
    pub history: crate::storage::meta::Histories,
    /// Operations still stored of clusters that no longer exist.
    pub gone: crate::storage::meta::Orphaned,
    /// Told once every cluster actor runs (and the registry is full): the
    /// master admits agents only then, so no report of theirs finds a
    /// cluster missing (and is acknowledged as unknown).
    pub started: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Supervisor {
    pub fn shared(&self) -> &Shared {
        &self.shared
    }

    /// Counters of the supervisor (its mailbox bound, for the API).
    pub fn stats(&self) -> Arc<ActorStats> {
        self.stats.clone()
    }

    pub fn new(shared: Shared, boot: Boot) -> Self {
        let stats = shared.supervisor.clone();
        shared.read_model.register_actor(&stats);
        let limit = shared.limits.operations_retained;
        Supervisor { shared, boot: Some(boot), stats, gone: GoneOperations::new(limit, []).0, restarts: HashMap::new() }
    }
}

impl Actor for Supervisor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        self.stats.set_state("running");
        let Some(boot) = self.boot.take() else { return };
        let mut by_cluster: HashMap<ClusterId, Vec<InstanceRecord>> = HashMap::new();
        let mut by_node: HashMap<NodeId, Vec<(InstanceId, Arc<str>)>> = HashMap::new();
        let mut strings = crate::storage::shared_strings::SharedStrings::default();
        for mut i in boot.instances {
            strings.share_record(&mut i);
            by_node.entry(i.node.clone()).or_default().push((i.id.clone(), i.cluster.clone()));
            by_cluster.entry(i.cluster_id).or_default().push(i);
        }
        for (node, ids) in by_node {
            if let Some(n) = self.shared.read_model.node(&node) {
                n.add_instances(&ids);
            }
        }
        let mut writes = Vec::new();
        let mut history = boot.history;
        let mut gone = boot.gone;
        let now = OffsetDateTime::now_utc();
        // Operations that were running when the master stopped are resumed
        // from their journal by their cluster's actor. One that cannot be
        // (no stored plan, or its cluster is gone) ends Failed, saying so,
        // and its cluster goes Error so the operator looks before acting.
        let mut resumable: HashMap<OperationId, OperationRecord> = HashMap::new();
        // Those that cannot be, as stored: shown as they are if their end
        // cannot be recorded.
        let mut held: HashMap<OperationId, OperationRecord> = HashMap::new();
        for mut op in boot.operations {
            if op.status.is_terminal() {
                continue;
            }
            let cluster_known = boot.clusters.iter().any(|c| c.operation == Some(op.id));
            if op.resume.is_some() && cluster_known {
                self.shared.read_model.put_operation(&op);
                resumable.insert(op.id, op);
            } else {
                held.insert(op.id, op.clone());
                op.status = OperationStatus::Failed;
                op.error = Some("interrupted: the master stopped while this operation ran".into());
                op.ended_at = Some(now);
                op.resume = None;
                if let Ok(w) = WriteOp::put_operation(&op) {
                    writes.push(w);
                }
                writes.push(WriteOp::delete_op_plan(&op.id));
                if let Ok(w) = events::append(&events::operation("operation.ended", &op)) {
                    writes.push(w);
                }
                metrics::counter!("flotilla_operations_total", "kind" => format!("{:?}", op.kind), "result" => "Failed")
                    .increment(1);
                // Ended now: counted with its cluster's ended ones (or the
                // deleted clusters') for retention.
                let created = crate::storage::keys::nanos(op.created_at);
                match history.get_mut(&op.cluster_id) {
                    Some(ended) => {
                        ended.push_back((created, op.id));
                        ended.make_contiguous().sort();
                    }
                    None => gone.push((created, op.id, op.cluster_id)),
                }
            }
        }
        // Deleted clusters' operations past the bound (left by a master
        // from before it, or by a trim whose write failed) go now.
        let (gone, trims) = GoneOperations::new(self.shared.limits.operations_retained, gone);
        self.gone = gone;
        writes.extend(trims);
        // (as decided, as stored, resume): what is shown is the decided
        // record once its write is durable, the stored one otherwise.
        let mut clusters = Vec::new();
        for stored in boot.clusters {
            let mut c = stored.clone();
            let resume = c.operation.and_then(|id| resumable.remove(&id));
            if let Some(op) = c.operation.filter(|_| resume.is_none()) {
                c.operation = None;
                c.status = ClusterStatus::Error;
                c.status_description = format!(
                    "operation {op} was interrupted by a master restart and cannot be resumed; check the instances, then start, stop or delete the cluster"
                );
                if let Ok(w) = WriteOp::put_cluster(&c) {
                    writes.push(w);
                }
                if let Some(w) = events::cluster_changed(&stored, &c).and_then(|e| events::append(&e).ok()) {
                    writes.push(w);
                }
            }
            clusters.push((c, stored, resume));
        }
        let mut started = boot.started;
        let start_all = move |act: &mut Supervisor, ctx: &mut Context<Supervisor>, durable: bool| {
            for (decided, stored, resume) in clusters {
                // A decision the store did not take is not shown: the
                // cluster stays busy with the interrupted operation (`409`
                // names it) until a master can record its end.
                let c = if durable {
                    decided
                } else {
                    if let Some(op) = stored.operation.and_then(|id| held.get(&id)) {
                        act.shared.read_model.put_operation(op);
                    }
                    stored
                };
                let instances = by_cluster.remove(&c.id).unwrap_or_default();
                let name = c.name.clone();
                let history = history.remove(&c.id).unwrap_or_default();
                let start = Start { record: c, instances, resume, history, visible: true, predecessor: None };
                let handle = ClusterActor::start(start, act.shared.clone(), ctx.address());
                act.shared.registry.insert(&name, handle);
            }
            if let Some(tx) = started.take() {
                let _ = tx.send(());
            }
        };
        if writes.is_empty() {
            start_all(self, ctx, true);
            return;
        }
        // What the boot decided (interrupted operations that cannot go on)
        // is durable before any cluster shows it.
        let shared = self.shared.clone();
        let retries = super::cluster::END_RETRIES;
        let what = "what the boot decided";
        ctx.wait(
            async move { super::cluster::commit_retrying(&shared, writes, &retries, what).await }
                .into_actor(self)
                .map(move |res, act, ctx| {
                    if let Err(e) = &res {
                        tracing::error!(error = %crate::error::ErrorChain(e), "cannot record what the boot decided (interrupted operations that cannot be resumed, old operations of deleted clusters): those clusters stay busy with their operations until a master can record their end");
                    }
                    start_all(act, ctx, res.is_ok());
                }),
        );
    }
}

impl Handler<Create> for Supervisor {
    type Result = Result<CreateAnswer, Error>;

    fn handle(&mut self, msg: Create, ctx: &mut Context<Self>) -> Self::Result {
        let Create(req, slot) = msg;
        slot.take("create cluster")?;
        let (record, roles) = match self.validate_create(&req) {
            Ok(v) => v,
            Err(e) => {
                self.stats.end(None);
                return Err(e);
            }
        };
        let name = record.name.clone();
        let params = req.params(&record.config);
        // The name is taken from here on, so a concurrent create of the same
        // name gets 409 even before this one is durable. The cluster becomes
        // visible to readers once its create is durable.
        let start = Start {
            record,
            instances: Vec::new(),
            resume: None,
            history: VecDeque::new(),
            visible: false,
            predecessor: None,
        };
        let handle = ClusterActor::start(start, self.shared.clone(), ctx.address());
        self.shared.registry.insert(&name, handle.clone());
        self.stats.end(None);
        // An API request like any other: ahead of bulk work on its thread.
        let (slot, claim) = Reservation::counted(&handle.stats).with_urgent(handle.priority.urgent()).claimable();
        // Sent now, not when the answer is first awaited: the create is the
        // actor's first message. The actor places the instances; a refused
        // create frees its name and stops its actor itself, before it answers.
        let request = handle.addr.send(RunOperation(OpRequest::Create { roles, params }, slot, None));
        // Awaited on the cluster's thread, where the answer is made, not by
        // the caller: actix skips a message whose sender stopped waiting,
        // and a client that hangs up would leave the name taken by an
        // actor that never ran its create.
        let (tx, rx) = tokio::sync::oneshot::channel();
        handle.arbiter.spawn(async move {
            let _ = tx.send(request.await);
        });
        Ok(CreateAnswer { answer: rx, claim })
    }
}

impl Handler<ClusterGone> for Supervisor {
    /// Answered once the trim is durable, so the delete ends only then:
    /// `GET /operations` right after it shows the bounded set.
    type Result = ResponseFuture<()>;

    fn handle(&mut self, msg: ClusterGone, _ctx: &mut Context<Self>) -> Self::Result {
        let ClusterGone { name, cluster, operations, slot } = msg;
        slot.begin("cluster gone");
        self.shared.registry.remove(&name);
        // Its restarts were its own: a new cluster of the same name starts
        // with none (and a churn of names keeps no history).
        self.restarts.remove(&name);
        self.shared.in_flight.forget(&cluster);
        tracing::info!(cluster = %name, "cluster deleted");
        let writes = self.gone.add(cluster, operations);
        self.stats.end(None);
        let store = self.shared.store.clone();
        Box::pin(async move {
            // Best effort: what a failed write leaves is trimmed at the next boot.
            if !writes.is_empty()
                && let Err(e) = store.commit(writes).await
            {
                tracing::warn!(error = %e, "cannot delete old operations of deleted clusters");
            }
        })
    }
}

impl Handler<Escalate> for Supervisor {
    type Result = ();

    fn handle(&mut self, msg: Escalate, _ctx: &mut Context<Self>) {
        let Escalate { cluster, operation, description, slot } = msg;
        slot.begin("escalate");
        tracing::error!(%cluster, ?operation, reason = %description, "cluster failed");
        self.stats.end(Some(format!("{cluster}: {description}")));
        // Its Error is durable already: the event may follow.
        crate::actors::announce::actor(
            &self.shared,
            "actor.failed",
            "cluster",
            &cluster,
            Some(&cluster),
            Some(&description),
        );
    }
}
