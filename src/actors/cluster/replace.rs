//! A replace request checked and built into a plan
//! (`operations::replace`): the member's replacement is placed on another
//! node (one of its own when a pool offers the role's labels, after a node
//! request when there is none), with the next ordinal of its role.

use std::collections::{BTreeMap, BTreeSet};

use super::prepare::require_active;
use super::{ClusterActor, Prepared};
use crate::actors::supervisor::{NewPlacement, Room, await_nodes, fitting_nodes, place_instances, room, wanted_labels};
use crate::error::Error;
use crate::ids::{InstanceId, NodeId};
use crate::operations::{self, Rolling};
use crate::spec::ComponentSpec;
use crate::storage::records::{ClusterStatus, DesiredState, InstanceRecord, InstanceStatus, NodeStatus, OperationKind};

impl ClusterActor {
    pub(super) fn prepare_replace(&mut self, spec: &ComponentSpec, id: InstanceId) -> Result<Prepared, Error> {
        let members = self.core.borrow().members();
        let old = members.iter().find(|m| m.id == id).cloned().ok_or_else(|| Error::not_found("instance", &id))?;
        let role = spec.role(&old.role).ok_or_else(|| Error::spec("role", format!("no role {:?}", old.role)))?;
        let now = std::time::Instant::now();
        let t = self.shared.timing;
        let node_status = |m: &InstanceRecord| {
            self.shared
                .read_model
                .node(&m.node)
                .map(|n| n.live.status_at(now, t.node_unknown_after, t.node_down_after))
                .unwrap_or(NodeStatus::Down)
        };
        let broken = |m: &InstanceRecord| matches!(m.status, InstanceStatus::Failed | InstanceStatus::Lost);
        // Members nothing can reach (their node Down): no hook, no render
        // is sent to them. One whose node is only silent for now (Unknown)
        // would miss the new membership: asked again once it answers.
        let unreachable: BTreeSet<InstanceId> =
            members.iter().filter(|m| node_status(m) == NodeStatus::Down).map(|m| m.id.clone()).collect();
        if let Some(m) = members.iter().find(|m| m.id != id && node_status(m) == NodeStatus::Unknown) {
            return Err(Error::unavailable(format!(
                "member {} is on node {}, which is silent for now (Unknown): it would miss the new membership; retry once it answers or is Down",
                m.id, m.node
            )));
        }
        // The member itself: on a Down node, or not running (a crash
        // loop, a lost process), it is stopped and deleted best effort and
        // left out of the hooks and renders.
        let gone = unreachable.contains(&id) || old.status != InstanceStatus::Running;
        // Active; or in Error because this member broke (and no other but
        // ones on Down nodes), not because an operation failed: replacing
        // it is the repair.
        let (status, description) = {
            let core = self.core.borrow();
            (core.record.status, core.record.status_description.clone())
        };
        let repairable = status == ClusterStatus::Error
            && member_error(&description)
            && broken(&old)
            && members.iter().filter(|m| broken(m)).all(|m| m.id == id || unreachable.contains(&m.id));
        if !repairable {
            require_active(status, "replace")?;
        }
        // A quorum role keeps a majority of its old membership only if
        // every other member runs, on a node that answers.
        if role.count.odd
            && let Some(m) = members.iter().find(|m| {
                *m.role == *old.role
                    && m.id != id
                    && (m.status != InstanceStatus::Running
                        || m.desired != DesiredState::Running
                        || unreachable.contains(&m.id))
            })
        {
            let why = if unreachable.contains(&m.id) {
                "on a node that does not answer".to_string()
            } else {
                format!("{:?}", m.status)
            };
            return Err(Error::conflict(
                "unsafe_replace",
                format!(
                    "role {} is a quorum; member {} is {why}: replacing {id} now could leave it without a majority; bring {} back first",
                    old.role, m.id, m.id
                ),
            ));
        }
        let record = self.core.borrow().record.clone();
        let next = record.roles.get(&*old.role).map(|r| r.next_ordinal).unwrap_or(1);
        let mut in_cluster: BTreeMap<NodeId, usize> = BTreeMap::new();
        let mut taken: BTreeSet<NodeId> = BTreeSet::new();
        for m in &members {
            *in_cluster.entry(m.node.clone()).or_default() += 1;
            if m.role == old.role {
                taken.insert(m.node.clone());
            }
        }
        let placed = match room(&self.shared, &record, role, 1, false, &taken) {
            Room::Short(nodes) => {
                NewPlacement { pending: vec![], waits: vec![await_nodes(&record, role, next, 1, nodes)] }
            }
            Room::On(free) => NewPlacement {
                pending: place_instances(&self.shared, &record, role, next, 1, Some(&free), &in_cluster)?,
                waits: vec![],
            },
            Room::AsIs => {
                let others: Vec<NodeId> = fitting_nodes(&self.shared, wanted_labels(&record, role))
                    .into_iter()
                    .filter(|n| *n != old.node)
                    .collect();
                if others.is_empty() {
                    return Err(Error::conflict(
                        "no_matching_nodes",
                        format!(
                            "no other Ready, uncordoned node carries what role {} requires: {id} has nowhere to go",
                            old.role
                        ),
                    ));
                }
                NewPlacement {
                    pending: place_instances(&self.shared, &record, role, next, 1, Some(&others), &in_cluster)?,
                    waits: vec![],
                }
            }
        };
        self.core.borrow_mut().record.roles.entry(old.role.to_string()).or_default().next_ordinal = next + 1;
        let new_id = InstanceId::generate(&record.name, &record.id, &old.role, next);
        let all: Vec<InstanceId> = members.iter().map(|m| m.id.clone()).collect();
        let touched = |m: &&InstanceId| **m != id && !unreachable.contains(*m);
        // The scale-out hook's and the first render's: every member that
        // answers, the old one too unless it is gone.
        let existing: Vec<InstanceId> = all.iter().filter(|m| touched(m) || (!gone && **m == id)).cloned().collect();
        let others: Vec<InstanceId> = all.iter().filter(touched).cloned().collect();
        let mut remaining = others.clone();
        remaining.push(new_id.clone());
        let grow = self.membership_rolling(spec, &existing);
        let shrink = {
            let r = self.membership_rolling(spec, &others);
            let mut ids = r.ids;
            let mut running = r.running;
            // The replacement runs by then; its files name the old member.
            ids.push(new_id.clone());
            running.push(new_id.clone());
            Rolling { ids, batch: r.batch, running }
        };
        let plan = operations::replace::plan(operations::replace::Replace {
            new: (role.order, new_id.clone()),
            old: (role.order, id.clone()),
            existing: &existing,
            remaining: &remaining,
            grow,
            shrink,
            gone,
        });
        let params = serde_json::json!({ "instance": id.as_str(), "replacement": new_id.as_str(), "role": &*old.role,
                "node_down": unreachable.contains(&id), "best_effort": gone })
        .to_string();
        Ok(Prepared {
            kind: OperationKind::Replace,
            plan: operations::await_nodes::first(placed.waits, Some(ClusterStatus::Scaling), true, plan),
            params,
            pending: placed.pending,
            on_success: Some(ClusterStatus::Active),
            force: false,
        })
    }
}

/// Whether a cluster's `Error` description says a member broke (and
/// nothing else): it starts with the member's failure (`member X failed:
/// ...`, written by `failures`), or with an operation that failed and was
/// rolled back (everything put back, a member broken beside it). Judged by
/// its head only: a member's own error text, later in it, may say anything.
fn member_error(description: &str) -> bool {
    if description.starts_with("member ") {
        return true;
    }
    // `<verb> failed at step <step> and was rolled back: ...`
    let mut words = description.split(' ');
    let verb = words.next().unwrap_or("");
    let rest: Vec<&str> = words.take(6).collect();
    !verb.is_empty()
        && verb.chars().all(|c| c.is_ascii_lowercase() || c == '_')
        && rest.len() == 6
        && rest[..3] == ["failed", "at", "step"]
        && rest[4..] == ["and", "was"]
        && description.contains(" and was rolled back: ")
}

#[cfg(test)]
mod tests {
    use super::member_error;

    #[test]
    fn only_a_member_failure_or_a_rolled_back_change_make_an_error_repairable() {
        assert!(member_error("member c-q-1-ab failed: node n1 is down: failed at step 3 in its log"));
        assert!(member_error(
            "replace failed at step add-start-order-0 and was rolled back: timeout, but member x failed: lost"
        ));
        assert!(!member_error("upgrade failed at step roll: exit 1"));
        assert!(!member_error("scale_out stopped at step install: journal"));
        assert!(!member_error(
            "operation 01 was interrupted by a master restart and cannot be resumed; member x failed"
        ));
        assert!(!member_error("the cluster's actor gave up after 4 failures within 60s: member x failed"));
    }
}
