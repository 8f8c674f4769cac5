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

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;

use actix::prelude::*;
use serde::Serialize;
use time::OffsetDateTime;

use super::Shared;
use super::cluster::{ClusterActor, EnterError, InstanceObserved, OpRequest, RunOperation, Shutdown, Start};
use super::gone_operations::GoneOperations;
use super::instance::Observation;
use super::placement::Candidate;
use super::read_model::{ActorStats, Reservation};
use crate::error::Error;
use crate::ids::{ClusterId, InstanceId, NodeId, OperationId, validate_name};
use crate::spec::RoleSpec;
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

#[derive(Debug, Clone, Default, Serialize)]
pub struct RoleRequest {
    pub count: Option<u32>,
    pub nodes: Option<Vec<NodeId>>,
}

/// [`CreateCluster`] with its place in the supervisor's mailbox.
pub struct Create(pub CreateCluster, pub Reservation);

impl Message for Create {
    type Result = Result<OperationRecord, Error>;
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

/// A failure a cluster could not handle itself.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Escalate {
    pub cluster: String,
    pub operation: Option<OperationId>,
    pub description: String,
    /// The member whose failure it is, if one.
    pub instance: Option<InstanceId>,
    /// True when the cluster actor already recorded `Error` (an operation's
    /// end writes the cluster's status and the operation in one batch).
    pub recorded: bool,
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

/// Restarts of one cluster's actor allowed within [`RESTART_WINDOW`]; past
/// them it stays down (answering `503`) until the master restarts, as
/// Erlang's supervisors give up on a child that keeps crashing.
const MAX_RESTARTS: usize = 3;
const RESTART_WINDOW: std::time::Duration = std::time::Duration::from_secs(60);

pub struct Supervisor {
    shared: Shared,
    boot: Option<Boot>,
    stats: Arc<ActorStats>,
    gone: GoneOperations,
    /// When each cluster's actor was last restarted after a panic.
    restarts: HashMap<String, VecDeque<std::time::Instant>>,
}

/// What the supervisor starts from.
pub struct Boot {
    pub clusters: Vec<ClusterRecord>,
    pub instances: Vec<InstanceRecord>,
    /// Operations that had not ended (with their plans).
    pub operations: Vec<OperationRecord>,
    /// Each cluster's ended operations still stored, oldest first.
    pub history: HashMap<ClusterId, VecDeque<(u64, OperationId)>>,
    /// Operations still stored of clusters that no longer exist.
    pub gone: Vec<(u64, OperationId, ClusterId)>,
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
        for i in boot.instances {
            by_node.entry(i.node.clone()).or_default().push((i.id.clone(), Arc::from(i.cluster.as_str())));
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
                let start = Start { record: c, instances, resume, history, visible: true };
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

/// Places `n` new instances of `role` (ordinals from `first_ordinal`),
/// allocating their ports. `in_cluster`: how many instances of the cluster
/// each node holds already. Nothing is persisted here.
pub fn place_instances(
    shared: &Shared,
    cluster: &ClusterRecord,
    role: &RoleSpec,
    first_ordinal: u32,
    n: u32,
    pinned: Option<&[NodeId]>,
    in_cluster: &BTreeMap<NodeId, usize>,
) -> Result<Vec<InstanceRecord>, Error> {
    let timing = shared.timing;
    let now = OffsetDateTime::now_utc();
    let nodes = shared.read_model.nodes();
    let ready = |id: &NodeId| {
        nodes.get(id).is_some_and(|e| {
            e.live.status_at(now, timing.node_unknown_after, timing.node_down_after) == NodeStatus::Ready
        })
    };
    let ids: Vec<NodeId> = match pinned {
        Some(list) => {
            if list.is_empty() {
                return Err(Error::invalid("invalid_request", "nodes: must not be empty when given"));
            }
            for id in list {
                if !nodes.contains_key(id) {
                    return Err(Error::spec("nodes", format!("unknown node {id:?}")));
                }
                if !ready(id) {
                    return Err(Error::unavailable(format!("node {id} is not Ready")));
                }
            }
            list.to_vec()
        }
        None => nodes.keys().filter(|id| ready(id)).cloned().collect(),
    };
    let candidates = ids
        .into_iter()
        .map(|id| Candidate {
            in_cluster: in_cluster.get(&id).copied().unwrap_or(0),
            total: nodes.get(&id).map(|e| e.instance_count()).unwrap_or(0),
            id,
        })
        .collect();
    let chosen = super::placement::place(candidates, n as usize)?;
    let limited = role.resources.is_some() || cluster.roles.get(&role.name).is_some_and(|r| r.limits.is_some());
    if limited && let Some(n) = chosen.iter().find(|n| !nodes.get(*n).is_some_and(|v| v.record().resource_limits)) {
        return Err(Error::conflict(
            "limits_unsupported",
            format!(
                "role {} has resource limits, and the agent of node {n} cannot enforce them (no cgroup controllers it may write); nothing was created",
                role.name
            ),
        ));
    }
    let mut out: Vec<InstanceRecord> = Vec::with_capacity(chosen.len());
    for (k, node) in chosen.into_iter().enumerate() {
        let Some(record) = nodes.get(&node).map(|e| e.record()) else {
            continue;
        };
        let ports = match shared.ports.allocate(&node, record.port_range, role.ports.len()) {
            Ok(p) => p,
            Err(e) => {
                for r in &out {
                    shared.ports.release(&r.node, r.ports.values().copied());
                }
                return Err(e);
            }
        };
        let ordinal = first_ordinal + k as u32;
        let id = InstanceId::generate(&cluster.name, &cluster.id, &role.name, ordinal);
        let dir = format!("{}/{}", record.instance_root.trim_end_matches('/'), id);
        out.push(InstanceRecord {
            version: RECORD_VERSION,
            id,
            cluster_id: cluster.id,
            cluster: cluster.name.clone(),
            role: role.name.clone(),
            ordinal,
            node: node.clone(),
            host: record.address.clone(),
            ports: role.ports.iter().cloned().zip(ports).collect(),
            status: InstanceStatus::Pending,
            desired: DesiredState::Installed,
            pid: None,
            generation: 0,
            dir,
            last_error: None,
            applied: None,
            pending_restart: PendingRestart::No,
        });
    }
    Ok(out)
}

impl Supervisor {
    pub(crate) fn validate_create(&self, req: &CreateCluster) -> Result<(ClusterRecord, Vec<InstanceRecord>), Error> {
        validate_name(&req.name).map_err(|m| Error::invalid("invalid_name", format!("name: {m}")))?;
        if self.shared.registry.contains(&req.name) {
            return Err(Error::AlreadyExists { kind: "cluster", id: req.name.clone() });
        }
        let spec = self
            .shared
            .read_model
            .package(&req.package.name, &req.package.version)
            .map(|p| p.spec)
            .ok_or_else(|| Error::not_found("package", &req.package))?;
        for role in req.roles.keys() {
            if spec.role(role).is_none() {
                let known: Vec<&str> = spec.roles.iter().map(|r| r.name.as_str()).collect();
                return Err(Error::spec(
                    format!("roles.{role}"),
                    format!("package {} has no role {role:?} (roles: {})", req.package, known.join(", ")),
                ));
            }
        }
        let config = spec.resolve_config(&req.config, None)?;
        let now = OffsetDateTime::now_utc();
        let mut record = ClusterRecord {
            version: RECORD_VERSION,
            id: ClusterId::random(),
            name: req.name.clone(),
            package: req.package.clone(),
            status: ClusterStatus::Validating,
            status_description: "validated; waiting to install".into(),
            config,
            roles: BTreeMap::new(),
            operation: None,
            created_at: now,
            updated_at: now,
        };
        let mut counts = Vec::new();
        for role in &spec.roles {
            let r = req.roles.get(&role.name).cloned().unwrap_or_default();
            let count = r.count.unwrap_or(role.count.min);
            spec.check_count(&role.name, count)?;
            counts.push((role, count, r.nodes));
        }
        let mut pending: Vec<InstanceRecord> = Vec::new();
        let mut in_cluster: BTreeMap<NodeId, usize> = BTreeMap::new();
        for (role, count, nodes) in counts {
            record.roles.insert(role.name.clone(), RoleState { next_ordinal: count + 1, limits: None });
            if count == 0 {
                continue;
            }
            match place_instances(&self.shared, &record, role, 1, count, nodes.as_deref(), &in_cluster) {
                Ok(v) => {
                    for i in &v {
                        *in_cluster.entry(i.node.clone()).or_default() += 1;
                    }
                    pending.extend(v)
                }
                Err(e) => {
                    for p in &pending {
                        self.shared.ports.release(&p.node, p.ports.values().copied());
                    }
                    return Err(e);
                }
            }
        }
        Ok((record, pending))
    }
}

impl Handler<Create> for Supervisor {
    type Result = ResponseActFuture<Self, Result<OperationRecord, Error>>;

    fn handle(&mut self, msg: Create, ctx: &mut Context<Self>) -> Self::Result {
        let Create(req, slot) = msg;
        slot.begin("create cluster");
        let (record, pending) = match self.validate_create(&req) {
            Ok(v) => v,
            Err(e) => {
                self.stats.end(None);
                return Box::pin(fut::ready(Err(e)));
            }
        };
        let name = record.name.clone();
        let params = serde_json::to_string(&req).unwrap_or_default();
        // The name is taken from here on, so a concurrent create of the same
        // name gets 409 even before this one is durable. The cluster becomes
        // visible to readers once its create is durable.
        let start = Start { record, instances: Vec::new(), resume: None, history: VecDeque::new(), visible: false };
        let handle = ClusterActor::start(start, self.shared.clone(), ctx.address());
        self.shared.registry.insert(&name, handle.clone());
        self.stats.end(None);
        let slot = Reservation::counted(&handle.stats);
        // Sent now, not when the future is first polled: the create is the
        // actor's first message.
        let sent = handle.addr.send(RunOperation(OpRequest::Create { pending, params }, slot));
        Box::pin(sent.into_actor(self).map(move |res, act, _| {
            let res = res.unwrap_or_else(|e| Err(Error::unavailable(format!("cluster actor: {e}"))));
            if res.is_err()
                && let Some(h) = act.shared.registry.remove(&name)
            {
                h.addr.do_send(Shutdown(Reservation::counted(&h.stats)));
            }
            res
        }))
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
        let Escalate { cluster, operation, instance, description, recorded, slot } = msg;
        slot.begin("escalate");
        tracing::error!(%cluster, ?operation, reason = %description, "cluster failed");
        self.stats.end(Some(format!("{cluster}: {description}")));
        if recorded {
            // Its Error is durable already: the event may follow.
            crate::actors::announce::actor(
                &self.shared,
                "actor.failed",
                "cluster",
                &cluster,
                Some(&cluster),
                Some(&description),
            );
            return;
        }
        // The cluster writes the event with its Error status.
        if let Some(h) = self.shared.registry.get(&cluster) {
            let slot = Reservation::counted(&h.stats);
            h.addr.do_send(EnterError { description, operation, instance, slot });
        }
    }
}

impl Handler<ClusterPanicked> for Supervisor {
    type Result = ();

    /// Starts the cluster's actor again from its stored records (the dead
    /// one's memory is not trusted), and resumes the operation it was
    /// running from its journal, as a master restart would.
    fn handle(&mut self, msg: ClusterPanicked, ctx: &mut Context<Self>) {
        let ClusterPanicked { name, cluster, stats, reason, slot } = msg;
        slot.begin("restart cluster actor");
        self.stats.end(Some(format!("cluster actor {name} panicked: {reason}")));
        self.shared.read_model.unregister_actor(&stats);
        // A later incarnation (or none: deleted) is not this one's to replace.
        if !self.shared.registry.get(&name).is_some_and(|h| Arc::ptr_eq(&h.stats, &stats)) {
            return;
        }
        let now = std::time::Instant::now();
        let recent = self.restarts.entry(name.clone()).or_default();
        recent.retain(|t| now.duration_since(*t) < RESTART_WINDOW);
        if recent.len() >= MAX_RESTARTS {
            tracing::error!(cluster = %name, %reason, restarts = recent.len(), "cluster actor panicked again; it keeps crashing, so it stays down until the master restarts");
            let why = format!("panicked: {reason}; {} restarts within {RESTART_WINDOW:?}, not restarted", recent.len());
            crate::actors::announce::actor(&self.shared, "actor.failed", "cluster", &name, Some(&name), Some(&why));
            return;
        }
        recent.push_back(now);
        tracing::error!(cluster = %name, %reason, "cluster actor panicked; restarting it from its stored records");
        let shared = self.shared.clone();
        let why = format!("panicked: {reason}; restarted from its stored records");
        let failed = events::actor("actor.failed", "cluster", &name, Some(&name), Some(&why));
        let load = async move {
            // The event's write also lets every write queued before it (the
            // dead actor's last ones) land before the records are read.
            let event = events::append(&failed)?;
            match shared.store.commit(vec![event]).await {
                Ok(()) | Err(crate::storage::StorageError::Frozen) => {}
                Err(e) => tracing::warn!(error = %e, "cannot record an event"),
            }
            let store = shared.store.clone();
            tokio::task::spawn_blocking(move || crate::storage::meta::load_cluster(&*store, &cluster))
                .await
                .map_err(|e| crate::storage::StorageError::Codec(e.to_string()))?
        };
        ctx.spawn(load.into_actor(self).map(move |loaded, act, ctx| act.restart_cluster(ctx, &name, &stats, loaded)));
    }
}

impl Supervisor {
    fn restart_cluster(
        &mut self,
        ctx: &mut Context<Self>,
        name: &str,
        dead: &Arc<ActorStats>,
        loaded: Result<Option<crate::storage::meta::StoredCluster>, crate::storage::StorageError>,
    ) {
        if !self.shared.registry.get(name).is_some_and(|h| Arc::ptr_eq(&h.stats, dead)) {
            return;
        }
        let stored = match loaded {
            Ok(Some(s)) => s,
            Ok(None) => {
                // Its create never became durable: there is nothing to run.
                tracing::warn!(cluster = %name, "the panicked cluster actor's cluster is not stored; its name is free");
                self.shared.registry.remove(name);
                self.shared.read_model.remove_cluster(name);
                return;
            }
            Err(e) => {
                tracing::error!(cluster = %name, error = %crate::error::ErrorChain(&e), "cannot read the cluster to restart its actor; it stays down until the master restarts");
                return;
            }
        };
        // Its running operation goes on from its journal; one that cannot
        // (ended meanwhile, or no plan) is not resumed, and the cluster
        // stays busy with it until a master restart ends it.
        let resume = stored.operation.filter(|o| !o.status.is_terminal() && o.resume.is_some());
        if let Some(op) = &resume {
            tracing::info!(cluster = %name, operation = %op.id, "the restarted cluster actor resumes its operation");
            self.shared.read_model.put_operation(op);
        }
        let start = Start {
            record: stored.record,
            instances: stored.instances,
            resume,
            history: stored.history,
            visible: true,
        };
        let handle = ClusterActor::start(start, self.shared.clone(), ctx.address());
        self.shared.registry.insert(name, handle);
    }
}

/// Removes a force delete's leftover from its agent, then forgets it.
async fn remove_leftover(shared: Shared, node: NodeId, instance: InstanceId, generation: u64) {
    let Some(link) = shared.links.get(&node) else { return };
    let req =
        crate::protocol::messages::AgentRequest::Delete { instance: instance.clone(), generation: generation + 1 };
    match link.call(req, "Delete").await {
        Ok(_) => forget_leftover(&shared, &instance).await,
        Err(e) => tracing::warn!(%instance, %node, error = %e, "cannot remove the leftover of a force delete yet"),
    }
}

/// Drops a leftover that is gone from its node, and frees its ports.
async fn forget_leftover(shared: &Shared, instance: &InstanceId) {
    if let Err(e) = shared.store.commit(vec![WriteOp::delete_leftover(instance)]).await {
        tracing::error!(%instance, error = %e, "cannot forget a removed leftover");
        return;
    }
    if let Some(l) = shared.read_model.remove_leftover(instance) {
        shared.ports.release(&l.node, l.ports.iter().copied());
        tracing::info!(%instance, node = %l.node, "the leftover of a force delete is gone from its node");
    }
}

/// An agent's inventory, sent when it (re)connects.
#[derive(Message)]
#[rtype(result = "()")]
pub struct NodeInventory {
    pub node: NodeId,
    pub reports: Vec<crate::protocol::messages::InstanceReport>,
    /// Instance directories the agent holds no record of.
    pub unrecorded: Vec<InstanceId>,
    pub slot: Reservation,
}

impl Handler<NodeInventory> for Supervisor {
    type Result = ();

    /// Reconciles what the master believes of a node with what its agent
    /// holds: a running process updates its instance; a missing or dead one
    /// marks it Lost or Failed (and its Active cluster Error). Instances the
    /// agent holds but the master does not know are leaked (see
    /// `actors::leaked`): reported, and removed after `leaked_grace`.
    fn handle(&mut self, msg: NodeInventory, _ctx: &mut Context<Self>) {
        let NodeInventory { node, reports, unrecorded, slot } = msg;
        slot.begin("inventory");
        let msg = (node, reports);
        let ours = self.shared.read_model.node(&msg.0).map(|n| n.instances()).unwrap_or_default();
        let reports: HashMap<&InstanceId, &crate::protocol::messages::InstanceReport> =
            msg.1.iter().map(|r| (&r.instance, r)).collect();
        // The connection whose Hello carried the inventory (the newest: an
        // older one's inventory is then taken as this one's, and ignored
        // for instances already commanded on it; the newer one's follows).
        let connection = self.shared.links.get(&msg.0).map(|l| l.connection);
        for (id, cluster) in ours.iter() {
            let report = reports.get(id);
            let observation = Observation::Inventory {
                present: report.is_some(),
                running: report.is_some_and(|r| r.running),
                pid: report.and_then(|r| r.pid),
                generation: report.map(|r| r.generation),
                connection,
            };
            if let Some(h) = self.shared.registry.get(cluster) {
                // Not bounded by the mailbox: one message per instance of a
                // node that just connected, and they must all arrive.
                let slot = Reservation::counted(&h.stats);
                h.addr.do_send(InstanceObserved { instance: id.clone(), observation, ack: None, slot });
            }
        }
        // Leftovers the agent no longer holds (it finished the delete itself,
        // e.g. from its tombstone after a restart): nothing left to remove.
        let leftovers = self.shared.read_model.leftovers();
        let dirs: std::collections::HashSet<&InstanceId> = unrecorded.iter().collect();
        let held = |id: &InstanceId| reports.contains_key(id) || dirs.contains(id);
        for l in leftovers.values().filter(|l| l.node == msg.0 && !held(&l.instance)) {
            let shared = self.shared.clone();
            let id = l.instance.clone();
            actix::spawn(async move { forget_leftover(&shared, &id).await });
        }
        let mut leaked = Vec::new();
        // A directory without a record: generation 0 (its Delete, at 1,
        // removes the directory and whatever carries the instance's marker).
        let only_dirs = unrecorded.iter().filter(|id| !reports.contains_key(id)).map(|id| super::leaked::Seen {
            instance: id.clone(),
            generation: 0,
            running: false,
            pid: None,
            unrecorded: true,
        });
        let recorded = msg.1.iter().map(|r| super::leaked::Seen {
            instance: r.instance.clone(),
            generation: r.generation,
            running: r.running,
            pid: r.pid,
            unrecorded: false,
        });
        for seen in recorded.chain(only_dirs) {
            if ours.contains_key(&seen.instance) {
                continue;
            }
            if leftovers.get(&seen.instance).is_some_and(|l| l.node == msg.0) {
                // A force delete could not remove it then; finish the job now.
                actix::spawn(remove_leftover(self.shared.clone(), msg.0.clone(), seen.instance, seen.generation));
            } else if !super::leaked::known(&self.shared, &seen.instance) {
                // Not ours and not known to be garbage: leaked. Reported at
                // once, removed only after `leaked_grace` (0: never), so a
                // master restored from an old backup can be stopped before
                // it wipes newer instances.
                leaked.push(seen);
            } else {
                tracing::warn!(node = %msg.0, instance = %seen.instance, running = seen.running,
                    "agent holds an instance the master places on another node; left alone");
            }
        }
        super::leaked::found(&self.shared, &msg.0, leaked);
        self.stats.end(None);
    }
}
