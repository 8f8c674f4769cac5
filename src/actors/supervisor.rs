//! `Supervisor`: the root of the actor tree. It starts one `ClusterActor`
//! per cluster at boot, creates new clusters (validating the request before
//! anything exists), removes deleted ones, routes process exits to their
//! cluster, and turns escalated failures into a cluster `Error` with a
//! description that says why.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use actix::prelude::*;
use serde::Serialize;
use time::OffsetDateTime;

use super::Shared;
use super::cluster::{ClusterActor, EnterError, InstanceObserved, OpRequest, RunOperation};
use super::instance::Observation;
use super::read_model::ActorStats;
use crate::error::Error;
use crate::ids::{ClusterId, InstanceId, NodeId, OperationId, validate_name};
use crate::spec::RoleSpec;
use crate::storage::WriteOp;
use crate::storage::records::{
    ClusterRecord, ClusterStatus, DesiredState, InstanceRecord, InstanceStatus, OperationRecord, OperationStatus,
    PackageRef, PendingRestart, RECORD_VERSION, RoleState,
};

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

impl Message for CreateCluster {
    type Result = Result<OperationRecord, Error>;
}

/// Looks up a cluster's actor by name.
#[derive(Message)]
#[rtype(result = "Option<Addr<ClusterActor>>")]
pub struct GetCluster(pub String);

/// A cluster finished its delete; its name is free.
#[derive(Message)]
#[rtype(result = "()")]
pub struct ClusterGone {
    pub name: String,
}

/// An agent reported an unexpected process exit.
#[derive(Message)]
#[rtype(result = "()")]
pub struct InstanceExited {
    pub node: NodeId,
    pub instance: InstanceId,
    pub pid: u32,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub stderr_tail: String,
    /// The agent restarts it after this delay; `None`: it stays down.
    pub restart_in: Option<std::time::Duration>,
}

/// From a node manager: how an agent's restart of a crashed instance went.
#[derive(Message)]
#[rtype(result = "()")]
pub struct InstanceRestarted {
    pub node: NodeId,
    pub instance: InstanceId,
    pub pid: Option<u32>,
    pub error: Option<String>,
}

/// A failure a cluster could not handle itself.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Escalate {
    pub cluster: String,
    pub operation: Option<OperationId>,
    pub description: String,
    /// True when the cluster actor already recorded `Error` (an operation's
    /// end writes the cluster's status and the operation in one batch).
    pub recorded: bool,
}

pub struct Supervisor {
    clusters: HashMap<String, Addr<ClusterActor>>,
    shared: Shared,
    boot: Option<Boot>,
    stats: Arc<ActorStats>,
}

/// What the supervisor starts from.
pub struct Boot {
    pub clusters: Vec<ClusterRecord>,
    pub instances: Vec<InstanceRecord>,
    pub operations: Vec<OperationRecord>,
}

impl Supervisor {
    pub fn shared(&self) -> &Shared {
        &self.shared
    }

    pub fn new(shared: Shared, boot: Boot) -> Self {
        let stats = ActorStats::new("supervisor", "supervisor", None);
        shared.read_model.register_actor(&stats);
        Supervisor { clusters: HashMap::new(), shared, boot: Some(boot), stats }
    }
}

impl Actor for Supervisor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        self.stats.set_state("running");
        let Some(boot) = self.boot.take() else { return };
        let mut by_cluster: HashMap<ClusterId, Vec<InstanceRecord>> = HashMap::new();
        for i in boot.instances {
            by_cluster.entry(i.cluster_id).or_default().push(i);
        }
        let mut writes = Vec::new();
        let now = OffsetDateTime::now_utc();
        // Operations that were running when the master stopped are resumed
        // from their journal by their cluster's actor. One that cannot be
        // (no stored plan, or its cluster is gone) ends Failed, saying so,
        // and its cluster goes Error so the operator looks before acting.
        let mut resumable: HashMap<OperationId, OperationRecord> = HashMap::new();
        for mut op in boot.operations {
            if !op.status.is_terminal() {
                let cluster_known = boot.clusters.iter().any(|c| c.operation == Some(op.id));
                if op.resume.is_some() && cluster_known {
                    resumable.insert(op.id, op.clone());
                } else {
                    op.status = OperationStatus::Failed;
                    op.error = Some("interrupted: the master stopped while this operation ran".into());
                    op.ended_at = Some(now);
                    if let Ok(w) = WriteOp::put_operation(&op) {
                        writes.push(w);
                    }
                }
            }
            self.shared.read_model.put_operation(&op);
        }
        for mut c in boot.clusters {
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
            }
            let instances = by_cluster.remove(&c.id).unwrap_or_default();
            let name = c.name.clone();
            let addr = ClusterActor::start(c, instances, resume, self.shared.clone(), ctx.address());
            self.clusters.insert(name, addr);
        }
        if !writes.is_empty() {
            let store = self.shared.store.clone();
            actix::spawn(async move {
                if let Err(e) = store.commit(writes).await {
                    tracing::error!(error = %e, "cannot record interrupted operations");
                }
            });
        }
    }
}

/// Places `n` new instances of `role` (ordinals from `first_ordinal`),
/// allocating their ports. Nothing is persisted here.
pub fn place_instances(
    shared: &Shared,
    cluster: &ClusterRecord,
    role: &RoleSpec,
    first_ordinal: u32,
    n: u32,
    pinned: Option<&[NodeId]>,
) -> Result<Vec<InstanceRecord>, Error> {
    let timing = shared.timing;
    let now = OffsetDateTime::now_utc();
    let state = shared.read_model.read();
    let nodes = super::placement::place(&state, &cluster.name, n as usize, pinned, now, |v, now| {
        v.status_at(now, timing.node_unknown_after, timing.node_down_after)
    })?;
    let limited = role.resources.is_some() || cluster.roles.get(&role.name).is_some_and(|r| r.limits.is_some());
    if limited && let Some(n) = nodes.iter().find(|n| !state.nodes.get(*n).is_some_and(|v| v.record.resource_limits)) {
        return Err(Error::conflict(
            "limits_unsupported",
            format!(
                "role {} has resource limits, and the agent of node {n} cannot enforce them (no cgroup controllers it may write); nothing was created",
                role.name
            ),
        ));
    }
    let mut out: Vec<InstanceRecord> = Vec::new();
    for (k, node) in nodes.into_iter().enumerate() {
        let view = &state.nodes[&node];
        let ports = match shared.ports.allocate(&node, view.record.port_range, role.ports.len()) {
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
        let dir = format!("{}/{}", view.record.instance_root.trim_end_matches('/'), id);
        out.push(InstanceRecord {
            version: RECORD_VERSION,
            id,
            cluster_id: cluster.id,
            cluster: cluster.name.clone(),
            role: role.name.clone(),
            ordinal,
            node: node.clone(),
            host: view.record.address.clone(),
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
    fn validate_create(&self, req: &CreateCluster) -> Result<(ClusterRecord, Vec<InstanceRecord>), Error> {
        validate_name(&req.name).map_err(|m| Error::invalid("invalid_name", format!("name: {m}")))?;
        if self.clusters.contains_key(&req.name) {
            return Err(Error::AlreadyExists { kind: "cluster", id: req.name.clone() });
        }
        let spec = {
            let state = self.shared.read_model.read();
            state
                .packages
                .get(&(req.package.name.clone(), req.package.version.clone()))
                .map(|p| p.spec.clone())
                .ok_or_else(|| Error::not_found("package", &req.package))?
        };
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
        for (role, count, nodes) in counts {
            record.roles.insert(role.name.clone(), RoleState { next_ordinal: count + 1, limits: None });
            if count == 0 {
                continue;
            }
            match place_instances(&self.shared, &record, role, 1, count, nodes.as_deref()) {
                Ok(v) => pending.extend(v),
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

impl Handler<CreateCluster> for Supervisor {
    type Result = ResponseActFuture<Self, Result<OperationRecord, Error>>;

    fn handle(&mut self, req: CreateCluster, ctx: &mut Context<Self>) -> Self::Result {
        self.stats.begin("create cluster");
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
        // name gets 409 even before this one is durable.
        let addr = ClusterActor::start(record, Vec::new(), None, self.shared.clone(), ctx.address());
        self.clusters.insert(name.clone(), addr.clone());
        self.stats.end(None);
        Box::pin(
            async move { addr.send(RunOperation(OpRequest::Create { pending, params })).await }.into_actor(self).map(
                move |res, act, _| {
                    let res = res.unwrap_or_else(|e| Err(Error::unavailable(format!("cluster actor: {e}"))));
                    if res.is_err() {
                        if let Some(addr) = act.clusters.remove(&name) {
                            addr.do_send(super::cluster::Shutdown);
                        }
                        act.shared.read_model.write().clusters.remove(&name);
                    }
                    res
                },
            ),
        )
    }
}

impl Handler<GetCluster> for Supervisor {
    type Result = Option<Addr<ClusterActor>>;

    fn handle(&mut self, msg: GetCluster, _ctx: &mut Context<Self>) -> Self::Result {
        self.clusters.get(&msg.0).cloned()
    }
}

impl Handler<ClusterGone> for Supervisor {
    type Result = ();

    fn handle(&mut self, msg: ClusterGone, _ctx: &mut Context<Self>) {
        self.clusters.remove(&msg.name);
        tracing::info!(cluster = %msg.name, "cluster deleted");
    }
}

impl Handler<InstanceExited> for Supervisor {
    type Result = ();

    fn handle(&mut self, msg: InstanceExited, _ctx: &mut Context<Self>) {
        let cluster = self.shared.read_model.read().instances.get(&msg.instance).map(|i| i.cluster.clone());
        let Some(addr) = cluster.and_then(|c| self.clusters.get(&c).cloned()) else {
            tracing::warn!(instance = %msg.instance, node = %msg.node, "exit of an instance the master does not know");
            return;
        };
        let how = match (msg.exit_code, msg.signal) {
            (Some(c), _) => format!("exit code {c}"),
            (None, Some(s)) => format!("signal {s}"),
            _ => "unknown status".into(),
        };
        let mut description = format!("instance {} on node {} exited unexpectedly ({how})", msg.instance, msg.node);
        if !msg.stderr_tail.trim().is_empty() {
            description.push_str(&format!("; stderr: {}", msg.stderr_tail.trim()));
        }
        match msg.restart_in {
            Some(d) => description.push_str(&format!("; its agent restarts it in {}", humantime::format_duration(d))),
            None => description.push_str("; its agent's restart policy gave up (or is off)"),
        }
        addr.do_send(InstanceObserved {
            instance: msg.instance,
            observation: Observation::Exited { pid: msg.pid, description, restarting: msg.restart_in.is_some() },
        });
    }
}

impl Handler<InstanceRestarted> for Supervisor {
    type Result = ();

    fn handle(&mut self, msg: InstanceRestarted, _ctx: &mut Context<Self>) {
        let cluster = self.shared.read_model.read().instances.get(&msg.instance).map(|i| i.cluster.clone());
        let Some(addr) = cluster.and_then(|c| self.clusters.get(&c).cloned()) else { return };
        let error =
            msg.error.map(|e| format!("instance {} on node {} could not be restarted: {e}", msg.instance, msg.node));
        addr.do_send(InstanceObserved {
            instance: msg.instance,
            observation: Observation::Restarted { pid: msg.pid, error },
        });
    }
}

impl Handler<Escalate> for Supervisor {
    type Result = ();

    fn handle(&mut self, msg: Escalate, _ctx: &mut Context<Self>) {
        tracing::error!(cluster = %msg.cluster, operation = ?msg.operation, reason = %msg.description, "cluster failed");
        self.stats.end(Some(format!("{}: {}", msg.cluster, msg.description)));
        if msg.recorded {
            return;
        }
        if let Some(addr) = self.clusters.get(&msg.cluster) {
            addr.do_send(EnterError { description: msg.description, operation: msg.operation });
        }
    }
}

/// Removes a force delete's leftover from its agent, then forgets it.
async fn remove_leftover(shared: Shared, node: NodeId, instance: InstanceId, generation: u64) {
    let link = shared.links.lock().unwrap_or_else(|p| p.into_inner()).get(&node).cloned();
    let Some(link) = link else { return };
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
    let removed = shared.read_model.write().leftovers.remove(instance);
    if let Some(l) = removed {
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
}

impl Handler<NodeInventory> for Supervisor {
    type Result = ();

    /// Reconciles what the master believes of a node with what its agent
    /// holds: a running process updates its instance; a missing or dead one
    /// marks it Lost or Failed (and its Active cluster Error). Instances the
    /// agent holds but the master does not know are reported in the log.
    fn handle(&mut self, msg: NodeInventory, _ctx: &mut Context<Self>) {
        let ours: Vec<(InstanceId, String)> = self
            .shared
            .read_model
            .read()
            .instances
            .values()
            .filter(|i| i.node == msg.node)
            .map(|i| (i.id.clone(), i.cluster.clone()))
            .collect();
        for (id, cluster) in &ours {
            let report = msg.reports.iter().find(|r| &r.instance == id);
            let observation = Observation::Inventory {
                present: report.is_some(),
                running: report.is_some_and(|r| r.running),
                pid: report.and_then(|r| r.pid),
            };
            if let Some(addr) = self.clusters.get(cluster) {
                addr.do_send(InstanceObserved { instance: id.clone(), observation });
            }
        }
        // Leftovers the agent no longer holds (it finished the delete itself,
        // e.g. from its tombstone after a restart): nothing left to remove.
        let gone: Vec<InstanceId> = self
            .shared
            .read_model
            .read()
            .leftovers
            .values()
            .filter(|l| l.node == msg.node && !msg.reports.iter().any(|r| r.instance == l.instance))
            .map(|l| l.instance.clone())
            .collect();
        for id in gone {
            let shared = self.shared.clone();
            actix::spawn(async move { forget_leftover(&shared, &id).await });
        }
        for r in &msg.reports {
            if ours.iter().any(|(id, _)| id == &r.instance) {
                continue;
            }
            let leftover = self.shared.read_model.read().leftovers.get(&r.instance).is_some_and(|l| l.node == msg.node);
            if leftover {
                // A force delete could not remove it then; finish the job now.
                actix::spawn(remove_leftover(self.shared.clone(), msg.node.clone(), r.instance.clone(), r.generation));
            } else {
                // Not ours and not known to be garbage: never delete what we
                // cannot prove is ours (a master restored from an old backup
                // must not wipe newer instances).
                tracing::warn!(node = %msg.node, instance = %r.instance, running = r.running, "agent holds an instance the master does not know; left alone");
            }
        }
    }
}
