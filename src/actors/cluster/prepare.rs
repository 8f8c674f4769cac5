//! Validation of a mutating request on a cluster, before any side effect:
//! it turns an [`OpRequest`] into a plan, or into the precise error the
//! caller gets (`409` wrong state, `404` unknown instance or package, `422`
//! a rule of the spec, naming the field and the rule). Nothing here writes.

use std::collections::BTreeSet;
use std::sync::Arc;

use super::{ClusterActor, OpRequest, Prepared};
use crate::actors::supervisor::NewPlacement;
use crate::error::Error;
use crate::ids::{InstanceId, NodeId};
use crate::operations::lifecycle::InstanceVerb;
use crate::operations::{self, Action, Rolling};
use crate::spec::ComponentSpec;
use crate::storage::records::{
    ClusterStatus, DesiredState, InstanceRecord, InstanceStatus, Limits, OperationKind, PackageRef, PendingRestart,
};

/// The most instances a request may ask a rolling operation to touch at
/// once (`batch`); without one, a quarter of each role (see `steps`).
pub const MAX_BATCH: usize = crate::spec::model::MAX_COUNT as usize;

impl ClusterActor {
    pub(super) fn prepare(&mut self, req: OpRequest, spec: &ComponentSpec) -> Result<Prepared, Error> {
        let status = self.core.borrow().record.status;
        let simple = |kind, plan, on_success| Prepared {
            kind,
            plan,
            params: "{}".into(),
            pending: vec![],
            on_success,
            force: false,
        };
        let all: Vec<InstanceId> = self.core.borrow().members().iter().map(|m| m.id.clone()).collect();
        Ok(match req {
            OpRequest::Create { roles, params } => {
                let placed = {
                    let core = self.core.borrow();
                    crate::actors::supervisor::place_new_cluster(&self.shared, &core.record, spec, &roles)?
                };
                let groups = new_groups(spec, &placed.pending, &placed.waits);
                let plan = operations::await_nodes::first(
                    placed.waits,
                    Some(ClusterStatus::Validating),
                    false,
                    operations::create::plan(&groups),
                );
                Prepared {
                    params,
                    pending: placed.pending,
                    ..simple(OperationKind::Create, plan, Some(ClusterStatus::Active))
                }
            }
            OpRequest::Start => {
                let running = self
                    .core
                    .borrow()
                    .members()
                    .iter()
                    .filter(|m| m.status == InstanceStatus::Running)
                    .map(|m| m.id.clone())
                    .collect();
                simple(
                    OperationKind::Start,
                    operations::lifecycle::start(&self.groups(spec, None), running),
                    Some(ClusterStatus::Active),
                )
            }
            OpRequest::Stop => simple(
                OperationKind::Stop,
                operations::lifecycle::stop(&self.groups(spec, None)),
                Some(ClusterStatus::Stopped),
            ),
            OpRequest::Restart => simple(
                OperationKind::Restart,
                operations::lifecycle::restart(&self.groups(spec, None)),
                Some(ClusterStatus::Active),
            ),
            OpRequest::Delete { force } => Prepared {
                force,
                params: serde_json::json!({ "force": force }).to_string(),
                ..simple(OperationKind::Delete, operations::delete::plan(&self.groups(spec, None), force), None)
            },
            OpRequest::Instance { id, verb } => {
                if !self.core.borrow().instances.contains_key(&id) {
                    return Err(Error::not_found("instance", &id));
                }
                let kind = match verb {
                    InstanceVerb::Start => OperationKind::StartInstance,
                    InstanceVerb::Stop => OperationKind::StopInstance,
                    InstanceVerb::Restart => OperationKind::RestartInstance,
                };
                let params = serde_json::json!({ "instance": id.as_str() }).to_string();
                Prepared { params, ..simple(kind, operations::lifecycle::instance(verb, &id), None) }
            }
            OpRequest::ScaleOut { role, add, nodes } => {
                require_active(status, "scale")?;
                let placed = self.place_new(spec, &role, add, nodes.as_deref())?;
                let new = new_groups(spec, &placed.pending, &placed.waits);
                let params = serde_json::json!({ "role": role, "add": add }).to_string();
                let plan = operations::await_nodes::first(
                    placed.waits,
                    Some(ClusterStatus::Scaling),
                    true,
                    operations::scale::scale_out(&new, &all, self.membership_rolling(spec, &all)),
                );
                Prepared {
                    params,
                    pending: placed.pending,
                    ..simple(OperationKind::ScaleOut, plan, Some(ClusterStatus::Active))
                }
            }
            OpRequest::ScaleIn { role, remove } => {
                require_active(status, "scale")?;
                let members = self.members();
                check_removal(&members, &role, &remove)?;
                let left = members.iter().filter(|m| *m.role == *role).count() as u32 - remove.len() as u32;
                spec.check_count(&role, left)?;
                let removed = group_by_order(spec, members.iter().map(|m| &**m).filter(|m| remove.contains(&m.id)));
                let remaining: Vec<InstanceId> =
                    members.iter().filter(|m| !remove.contains(&m.id)).map(|m| m.id.clone()).collect();
                let ids: Vec<&str> = remove.iter().map(|i| i.as_str()).collect();
                let params = serde_json::json!({ "role": role, "remove": ids }).to_string();
                Prepared {
                    params,
                    ..simple(
                        OperationKind::ScaleIn,
                        operations::scale::scale_in(&removed, &remaining, self.membership_rolling(spec, &remaining)),
                        Some(ClusterStatus::Active),
                    )
                }
            }
            OpRequest::Reconfigure { values, batch } => {
                require_active(status, "reconfigure")?;
                let asked = batch;
                let batch = check_batch(batch)?;
                let old = self.core.borrow().record.config.clone();
                let new = spec.resolve_config(&values, Some(&old))?;
                let shown = crate::storage::records::mask_secrets(&values, &new);
                let params = serde_json::json!({ "config": shown, "batch": asked }).to_string();
                Prepared {
                    params,
                    ..simple(
                        OperationKind::Reconfigure,
                        operations::change::reconfigure(old, new, self.rolling(&all, batch)),
                        Some(ClusterStatus::Active),
                    )
                }
            }
            OpRequest::Upgrade { version, batch } => {
                require_active(status, "upgrade")?;
                let asked = batch;
                let batch = check_batch(batch)?;
                let old = self.core.borrow().record.package.clone();
                let new = PackageRef { name: old.name.clone(), version: version.clone() };
                let new_spec = self.upgrade_target(&new)?;
                check_compatible(spec, &new_spec, &self.members())?;
                let params = serde_json::json!({ "version": version, "batch": asked }).to_string();
                Prepared {
                    params,
                    ..simple(
                        OperationKind::Upgrade,
                        operations::change::upgrade(old, new, self.rolling(&all, batch)),
                        Some(ClusterStatus::Active),
                    )
                }
            }
            OpRequest::Replace { id } => self.prepare_replace(spec, id)?,
            OpRequest::Resize { role, limits, batch } => {
                require_active(status, "resize")?;
                let asked = batch;
                let batch = check_batch(batch)?;
                if spec.role(&role).is_none() {
                    return Err(Error::spec(format!("roles.{role}"), "the package has no such role"));
                }
                check_limits(&limits)?;
                let members: Vec<Arc<InstanceRecord>> =
                    self.members().into_iter().filter(|m| *m.role == *role).collect();
                self.check_nodes_enforce_limits(&role, members.iter().map(|m| &m.node))?;
                let old = self.core.borrow().record.roles.get(&role).and_then(|r| r.limits);
                let ids: Vec<InstanceId> = members.iter().map(|m| m.id.clone()).collect();
                let params = serde_json::json!({ "role": role, "memory_bytes": limits.memory_bytes, "cpu": limits.cpu, "batch": asked }).to_string();
                Prepared {
                    params,
                    ..simple(
                        OperationKind::Resize,
                        operations::change::resize(&role, old, Some(limits), self.rolling(&ids, batch)),
                        Some(ClusterStatus::Active),
                    )
                }
            }
        })
    }

    /// `ids` for a rolling action: those the operator wants running now
    /// must be running when it is done.
    /// `batch` 0: the default (see `steps`).
    fn rolling(&self, ids: &[InstanceId], batch: usize) -> Rolling {
        let core = self.core.borrow();
        let running = ids
            .iter()
            .filter(|id| core.instances.get(*id).is_some_and(|i| i.record().desired == DesiredState::Running))
            .cloned()
            .collect();
        Rolling { ids: ids.to_vec(), batch, running }
    }

    /// The members a membership change re-renders: all of them when a
    /// template reads the membership; else only those that owe a restart
    /// or are not running (the configure step brings those in line, as it
    /// would have), since no other member's files can change.
    pub(super) fn membership_rolling(&self, spec: &ComponentSpec, ids: &[InstanceId]) -> Rolling {
        if spec.templates.uses_members() {
            return self.rolling(ids, 0);
        }
        let owing: Vec<InstanceId> = {
            let core = self.core.borrow();
            ids.iter()
                .filter(|id| {
                    core.instances.get(*id).is_some_and(|i| {
                        let r = i.record();
                        r.pending_restart != PendingRestart::No || r.status != InstanceStatus::Running
                    })
                })
                .cloned()
                .collect()
        };
        self.rolling(&owing, 0)
    }

    fn members(&self) -> Vec<Arc<InstanceRecord>> {
        self.core.borrow().members()
    }

    fn upgrade_target(&self, new: &PackageRef) -> Result<Arc<ComponentSpec>, Error> {
        self.shared
            .read_model
            .package(&new.name, &new.version)
            .map(|p| p.spec)
            .ok_or_else(|| Error::not_found("package", new))
    }

    /// Refuses (before any side effect) limits on a node whose agent cannot
    /// enforce them: never a half-applied vertical scale.
    pub(super) fn check_nodes_enforce_limits<'a>(
        &self,
        role: &str,
        nodes: impl Iterator<Item = &'a NodeId>,
    ) -> Result<(), Error> {
        let unable: BTreeSet<String> = nodes
            .filter(|n| !self.shared.read_model.node(n).is_some_and(|v| v.record().resource_limits))
            .map(|n| n.to_string())
            .collect();
        if unable.is_empty() {
            return Ok(());
        }
        Err(Error::conflict(
            "limits_unsupported",
            format!(
                "role {role}: the agents of node(s) {} cannot enforce memory/CPU limits (no cgroup controllers they may write); nothing was changed",
                unable.into_iter().collect::<Vec<_>>().join(", ")
            ),
        ))
    }

    /// Places `add` new instances of `role`: ordinals, nodes, ports.
    fn place_new(
        &mut self,
        spec: &ComponentSpec,
        role: &str,
        add: u32,
        nodes: Option<&[NodeId]>,
    ) -> Result<NewPlacement, Error> {
        if add == 0 {
            return Err(Error::invalid("invalid_request", "add: must be at least 1"));
        }
        let role_spec =
            spec.role(role).ok_or_else(|| Error::spec("role", format!("the package has no role {role:?}")))?;
        let record = self.core.borrow().record.clone();
        let current = self.members().iter().filter(|m| &*m.role == role).count() as u32;
        let total = current.checked_add(add).ok_or_else(|| {
            Error::spec(format!("roles.{role}.count"), format!("adding {add} to {current} overflows"))
        })?;
        spec.check_count(role, total)?;
        // New members start before the old ones learn the new membership: in
        // a quorum role, as many new members as old ones would be a majority
        // of the new membership and could elect a leader of their own, with
        // none of the data (tried: ZooKeeper 1 -> 3 loses it).
        if role_spec.count.odd && current > 0 && add >= current {
            return Err(Error::spec(
                format!("roles.{role}.count"),
                format!(
                    "quorum role: adding {add} to {current} members would let the new members outvote the old ones and lose data; add fewer than {current} at a time"
                ),
            ));
        }
        let next = record.roles.get(role).map(|r| r.next_ordinal).unwrap_or(1);
        let mut in_cluster: std::collections::BTreeMap<NodeId, usize> = std::collections::BTreeMap::new();
        let mut taken: BTreeSet<NodeId> = BTreeSet::new();
        for m in self.members() {
            *in_cluster.entry(m.node.clone()).or_default() += 1;
            if *m.role == *role {
                taken.insert(m.node.clone());
            }
        }
        let placed = crate::actors::supervisor::place_or_wait(
            &self.shared,
            &record,
            role_spec,
            next,
            add,
            nodes,
            &taken,
            &in_cluster,
        )?;
        let mut core = self.core.borrow_mut();
        core.record.roles.entry(role.to_string()).or_default().next_ordinal = next + add;
        Ok(placed)
    }
}

/// The new instances by their role's order, ascending: those placed now
/// and those a step waits for nodes to place (`waits`).
pub(super) fn new_groups(
    spec: &ComponentSpec,
    pending: &[InstanceRecord],
    waits: &[Action],
) -> Vec<(i32, Vec<InstanceId>)> {
    let mut all: Vec<(&str, u32, &InstanceId)> = pending.iter().map(|i| (&*i.role, i.ordinal, &i.id)).collect();
    for w in waits {
        if let Action::AwaitNodes { role, first_ordinal, ids, .. } = w {
            all.extend(ids.iter().enumerate().map(|(k, id)| (role.as_str(), first_ordinal + k as u32, id)));
        }
    }
    group_ids(spec, all.into_iter())
}

/// Groups instances by their role's order, ascending; ids sorted within a group.
pub fn group_by_order<'a>(
    spec: &ComponentSpec,
    instances: impl Iterator<Item = &'a InstanceRecord>,
) -> Vec<(i32, Vec<InstanceId>)> {
    group_ids(spec, instances.map(|i| (&*i.role, i.ordinal, &i.id)))
}

/// [`group_by_order`] of (role, ordinal, id).
fn group_ids<'a>(
    spec: &ComponentSpec,
    instances: impl Iterator<Item = (&'a str, u32, &'a InstanceId)>,
) -> Vec<(i32, Vec<InstanceId>)> {
    let mut groups: std::collections::BTreeMap<i32, Vec<(&str, u32, InstanceId)>> = Default::default();
    for (role, ordinal, id) in instances {
        let order = spec.role(role).map(|r| r.order).unwrap_or_default();
        groups.entry(order).or_default().push((role, ordinal, id.clone()));
    }
    groups
        .into_iter()
        .map(|(order, mut v)| {
            v.sort();
            (order, v.into_iter().map(|(_, _, id)| id).collect())
        })
        .collect()
}

pub(super) fn require_active(status: ClusterStatus, what: &str) -> Result<(), Error> {
    if status != ClusterStatus::Active {
        return Err(Error::conflict(
            "invalid_state",
            format!("cannot {what} a cluster in status {status:?}; it must be Active"),
        ));
    }
    Ok(())
}

/// A request's batch: `None` is the default (0: a quarter of each role).
fn check_batch(batch: Option<usize>) -> Result<usize, Error> {
    match batch {
        None => Ok(0),
        Some(b) if b == 0 || b > MAX_BATCH => {
            Err(Error::invalid("invalid_request", format!("batch: must be between 1 and {MAX_BATCH}, got {b}")))
        }
        Some(b) => Ok(b),
    }
}

fn check_limits(l: &Limits) -> Result<(), Error> {
    if l.memory_bytes.is_none() && l.cpu.is_none() {
        return Err(Error::invalid("invalid_request", "resources: give memory, cpu or both"));
    }
    if let Some(m) = l.memory_bytes
        && m < 4 * 1024 * 1024
    {
        return Err(Error::spec("resources.memory", format!("{m} bytes is below the minimum of 4 MiB")));
    }
    if let Some(c) = l.cpu
        && !(0.01..=1024.0).contains(&c)
    {
        return Err(Error::spec("resources.cpu", format!("{c} is outside 0.01..=1024 CPUs")));
    }
    Ok(())
}

fn check_removal(members: &[Arc<InstanceRecord>], role: &str, remove: &[InstanceId]) -> Result<(), Error> {
    if remove.is_empty() {
        return Err(Error::invalid("invalid_request", "remove: list at least one instance"));
    }
    let mut seen = BTreeSet::new();
    for id in remove {
        if !seen.insert(id) {
            return Err(Error::invalid("invalid_request", format!("remove: {id} is listed twice")));
        }
        match members.iter().find(|m| &m.id == id) {
            None => return Err(Error::not_found("instance", id)),
            Some(m) if &*m.role != role => {
                return Err(Error::invalid(
                    "invalid_request",
                    format!("remove: {id} is a {} instance, not {role}", m.role),
                ));
            }
            Some(_) => {}
        }
    }
    Ok(())
}

/// An upgrade keeps every instance, its ports and its place: the new
/// version must have every role the cluster uses, with the same ports, and
/// accept the current counts.
fn check_compatible(old: &ComponentSpec, new: &ComponentSpec, members: &[Arc<InstanceRecord>]) -> Result<(), Error> {
    if new.component.name != old.component.name {
        return Err(Error::spec(
            "component.name",
            format!("the package is {}, the cluster runs {}", new.component.name, old.component.name),
        ));
    }
    let roles: BTreeSet<&str> = members.iter().map(|m| &*m.role).collect();
    for role in roles {
        let Some(r) = new.role(role) else {
            return Err(Error::spec(format!("roles.{role}"), "the new version has no such role"));
        };
        let old_ports = old.role(role).map(|o| o.ports.clone()).unwrap_or_default();
        if r.ports != old_ports {
            return Err(Error::spec(
                format!("roles.{role}.ports"),
                format!("the new version declares ports {:?}, the cluster has {:?}", r.ports, old_ports),
            ));
        }
        let count = members.iter().filter(|m| &*m.role == role).count() as u32;
        new.check_count(role, count)?;
    }
    Ok(())
}
