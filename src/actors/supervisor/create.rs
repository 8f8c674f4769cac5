//! Validating a new cluster and placing its instances: nothing is
//! persisted here; the caller (a create, a scale-out) makes the records
//! durable.

use super::*;
use crate::storage::plan::Action;

/// The labels role `role` requires in `cluster`, each with its value: the
/// cluster's own, else the spec's.
pub fn wanted_labels<'a>(cluster: &'a ClusterRecord, role: &'a RoleSpec) -> &'a BTreeMap<String, String> {
    cluster.roles.get(&role.name).and_then(|r| r.node_labels.as_ref()).unwrap_or(&role.node_labels)
}

/// The nodes placement may use now: every `Ready` one, those of them open
/// (uncordoned, not being removed by their pool), and those of the open
/// ones that carry `wanted`.
struct Eligible {
    ready: Vec<NodeId>,
    open: Vec<NodeId>,
    fit: Vec<NodeId>,
}

fn eligible(shared: &Shared, wanted: &BTreeMap<String, String>) -> Eligible {
    let timing = shared.timing;
    let now = std::time::Instant::now();
    let nodes = shared.read_model.nodes();
    let ready: Vec<NodeId> = nodes
        .iter()
        .filter(|(_, e)| e.live.status_at(now, timing.node_unknown_after, timing.node_down_after) == NodeStatus::Ready)
        .map(|(id, _)| id.clone())
        .collect();
    let open: Vec<NodeId> = ready
        .iter()
        .filter(|id| shared.read_model.cordon_of(id).is_none() && !shared.read_model.removals.is_marked(id))
        .cloned()
        .collect();
    let fit =
        open.iter().filter(|id| nodes.get(*id).is_some_and(|e| carries(&e.record().labels, wanted))).cloned().collect();
    Eligible { ready, open, fit }
}

/// The open `Ready` nodes carrying `wanted`.
pub fn fitting_nodes(shared: &Shared, wanted: &BTreeMap<String, String>) -> Vec<NodeId> {
    eligible(shared, wanted).fit
}

fn carries(labels: &BTreeMap<String, String>, wanted: &BTreeMap<String, String>) -> bool {
    wanted.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// Where `n` new instances of `role` go when a node pool offers the
/// labels the role requires: each wants a node of its own, open, carrying
/// the labels and holding none of the role's instances (`taken`).
#[derive(Debug, PartialEq, Eq)]
pub enum Room {
    /// No pool offers the labels (or the nodes are pinned): placed on the
    /// nodes there are, as without pools.
    AsIs,
    /// Enough free nodes: placed on these.
    On(Vec<NodeId>),
    /// This many nodes short: a node request is filed and the instances
    /// are placed once it is served (`Action::AwaitNodes`).
    Short(u32),
}

pub fn room(
    shared: &Shared,
    cluster: &ClusterRecord,
    role: &RoleSpec,
    n: u32,
    pinned: bool,
    taken: &BTreeSet<NodeId>,
) -> Room {
    if pinned || n == 0 {
        return Room::AsIs;
    }
    let Some(pools) = shared.pools.get() else { return Room::AsIs };
    let wanted = wanted_labels(cluster, role);
    if !pools.pools.iter().any(|p| p.config.offers(wanted)) {
        return Room::AsIs;
    }
    let free: Vec<NodeId> = eligible(shared, wanted).fit.into_iter().filter(|id| !taken.contains(id)).collect();
    match n.saturating_sub(free.len() as u32) {
        0 => Room::On(free),
        short => Room::Short(short.min(crate::actors::pools::MAX_REQUEST_COUNT)),
    }
}

/// Places `n` instances of `role` (ordinals from `first`) as [`room`]
/// says: now, or once a node request is served (a wait for the plan).
#[allow(clippy::too_many_arguments)]
pub fn place_or_wait(
    shared: &Shared,
    cluster: &ClusterRecord,
    role: &RoleSpec,
    first: u32,
    n: u32,
    pinned: Option<&[NodeId]>,
    taken: &BTreeSet<NodeId>,
    in_cluster: &BTreeMap<NodeId, usize>,
) -> Result<NewPlacement, Error> {
    let placed = |on: Option<&[NodeId]>| place_instances(shared, cluster, role, first, n, on, in_cluster);
    Ok(match room(shared, cluster, role, n, pinned.is_some(), taken) {
        Room::AsIs => NewPlacement { pending: placed(pinned)?, waits: vec![] },
        Room::On(free) => NewPlacement { pending: placed(Some(&free))?, waits: vec![] },
        Room::Short(nodes) => {
            NewPlacement { pending: vec![], waits: vec![await_nodes(cluster, role, first, n, nodes)] }
        }
    })
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
    let now = std::time::Instant::now();
    let nodes = shared.read_model.nodes();
    let ready = |id: &NodeId| {
        nodes.get(id).is_some_and(|e| {
            e.live.status_at(now, timing.node_unknown_after, timing.node_down_after) == NodeStatus::Ready
        })
    };
    let wanted = wanted_labels(cluster, role);
    let pairs: Vec<String> = wanted.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let shown = || pairs.join(",");
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
                if let Some(c) = shared.read_model.cordon_of(id) {
                    return Err(Error::conflict(
                        "node_cordoned",
                        format!("node {id} is cordoned ({}); uncordon it first", why(&c.reason)),
                    ));
                }
                if !nodes.get(id).is_some_and(|e| carries(&e.record().labels, wanted)) {
                    return Err(Error::spec(
                        "nodes",
                        format!("node {id} lacks the labels role {} requires ({})", role.name, shown()),
                    ));
                }
            }
            list.to_vec()
        }
        None => {
            let Eligible { ready, open, fit } = eligible(shared, wanted);
            if open.is_empty() && !ready.is_empty() {
                return Err(Error::conflict(
                    "no_matching_nodes",
                    format!("every Ready node ({}) is cordoned: uncordon one, or start another agent", ready.len()),
                ));
            }
            let pools = shared.pools.get().filter(|p| !p.pools.iter().any(|x| x.config.offers(wanted)));
            let pools = pools.filter(|p| !p.pools.is_empty());
            if fit.is_empty() && !ready.is_empty() {
                // Not a moment's wait (no `Retry-After`): a node with
                // them must be started first (a pool offering them would
                // have been asked: see `nodes_short`).
                let offered = match pools {
                    Some(p) => format!(", and no node pool offers them ({})", p.offered()),
                    None => String::new(),
                };
                return Err(Error::conflict(
                    "no_matching_nodes",
                    format!(
                        "no Ready node carries the labels role {} requires ({}): none of the {} Ready uncordoned nodes does{offered}; an agent started with --label {} would",
                        role.name,
                        shown(),
                        open.len(),
                        pairs.join(" --label ")
                    ),
                ));
            }
            fit
        }
    };
    let candidates = ids
        .into_iter()
        .map(|id| Candidate {
            in_cluster: in_cluster.get(&id).copied().unwrap_or(0),
            total: nodes.get(&id).map(|e| e.instance_count()).unwrap_or(0),
            id,
        })
        .collect();
    let chosen = crate::actors::placement::place(candidates, n as usize)?;
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
    // Shared by every record placed here (see `InstanceRecord`).
    let cluster_name: Arc<str> = cluster.name.as_str().into();
    let role_name: Arc<str> = role.name.as_str().into();
    let port_names: Vec<Arc<str>> = role.ports.iter().map(|p| Arc::from(p.as_str())).collect();
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
            cluster: cluster_name.clone(),
            role: role_name.clone(),
            ordinal,
            node: node.clone(),
            host: record.address.clone(),
            ports: port_names.iter().cloned().zip(ports).collect(),
            status: InstanceStatus::Pending,
            desired: DesiredState::Installed,
            pid: None,
            generation: 0,
            dir: dir.into(),
            last_error: None,
            applied: None,
            pending_restart: PendingRestart::No,
        });
    }
    Ok(out)
}

/// Where a new cluster's instances go: placed now (`pending`, with their
/// ports), or, for a role a node pool must first give nodes to, a step
/// that waits for them (`waits`, each an [`Action::AwaitNodes`]).
#[derive(Default)]
pub struct NewPlacement {
    pub pending: Vec<InstanceRecord>,
    pub waits: Vec<Action>,
}

/// Places every role of a new cluster (`record`, already validated), in
/// the spec's role order, each spread over the nodes the earlier roles
/// left emptiest; a role short of nodes a pool offers waits for them. On
/// a refusal, the ports taken so far are given back.
pub fn place_new_cluster(
    shared: &Shared,
    record: &ClusterRecord,
    spec: &ComponentSpec,
    roles: &[RoleToPlace],
) -> Result<NewPlacement, Error> {
    let mut out = NewPlacement::default();
    let mut in_cluster: BTreeMap<NodeId, usize> = BTreeMap::new();
    for r in roles.iter().filter(|r| r.count > 0) {
        let placed = spec
            .role(&r.role)
            .ok_or_else(|| Error::spec(format!("roles.{}", r.role), "no such role"))
            .and_then(|role| {
                place_or_wait(shared, record, role, 1, r.count, r.nodes.as_deref(), &BTreeSet::new(), &in_cluster)
            });
        match placed {
            Ok(v) => {
                for i in &v.pending {
                    *in_cluster.entry(i.node.clone()).or_default() += 1;
                }
                out.pending.extend(v.pending);
                out.waits.extend(v.waits);
            }
            Err(e) => {
                for p in &out.pending {
                    shared.ports.release(&p.node, p.ports.values().copied());
                }
                return Err(e);
            }
        }
    }
    Ok(out)
}

/// The step action placing `count` instances of `role` (ordinals from
/// `first`) once a node request for `nodes` is served.
pub fn await_nodes(cluster: &ClusterRecord, role: &RoleSpec, first: u32, count: u32, nodes: u32) -> Action {
    let ids = (first..first + count).map(|o| InstanceId::generate(&cluster.name, &cluster.id, &role.name, o)).collect();
    Action::AwaitNodes { role: role.name.clone(), first_ordinal: first, nodes, ids }
}

impl Supervisor {
    /// Checks a create and builds the new cluster's record, with the roles
    /// its actor is to place: the placement (a pass over every node per
    /// role) runs on the cluster's own thread, not the supervisor's, so a
    /// burst of creates does not queue for it in one mailbox.
    pub(crate) fn validate_create(&self, req: &CreateCluster) -> Result<(ClusterRecord, Vec<RoleToPlace>), Error> {
        validate_name(&req.name).map_err(|m| Error::invalid("invalid_name", format!("name: {m}")))?;
        if self.shared.registry.contains(&req.name) {
            if self.shared.read_model.cluster(&req.name).is_none() {
                // Held by a create not yet durable: one under way, or one
                // its caller gave up on that its actor has not dropped yet.
                return Err(Error::unavailable(format!(
                    "a create of cluster {} is under way (or being dropped after its caller gave up); \
                     retry in a moment: it either appears (GET /api/v1/clusters/{}) or frees the name",
                    req.name, req.name
                )));
            }
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
        let mut roles = Vec::new();
        for role in &spec.roles {
            let r = req.roles.get(&role.name).cloned().unwrap_or_default();
            let count = r.count.unwrap_or(role.count.min);
            spec.check_count(&role.name, count)?;
            if let Some(labels) = &r.node_labels {
                crate::ids::validate_labels(labels.iter()).map_err(|(key, m)| {
                    let at = format!("roles.{}.node_labels", role.name);
                    Error::spec(key.map(|k| format!("{at}.{k}")).unwrap_or(at), m)
                })?;
            }
            let state = RoleState { next_ordinal: count + 1, limits: None, node_labels: r.node_labels.clone() };
            record.roles.insert(role.name.clone(), state);
            roles.push(RoleToPlace { role: role.name.clone(), count, nodes: r.nodes });
        }
        Ok((record, roles))
    }
}

/// A cordon's reason for a message.
fn why(reason: &str) -> &str {
    if reason.is_empty() { "no reason given" } else { reason }
}
