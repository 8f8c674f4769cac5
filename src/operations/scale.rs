//! Scale a role out (add instances) or in (remove listed instances).
//!
//! Scale out: `Scaling → AddingInstances → Configuring → Active`. Every step
//! has an undo, so a failure puts the cluster back as it was: the new
//! instances are stopped, removed from their agents and forgotten (ports
//! released, ordinals not reused), and the existing members' files are
//! rendered again from the old membership.
//!
//! Scale in: `Decommissioning → DeletingInstances → Configuring → Active`.
//! Only decommissioning (stopping) can be undone; once an instance's
//! directory is deleted its data is gone, so later failures are reported
//! as they are.

use super::{Action, Plan, Step};
use crate::ids::InstanceId;
use crate::storage::records::ClusterStatus;

/// `new`: the new instances by role order; `existing`: every current member.
pub fn scale_out(new: &[(i32, Vec<InstanceId>)], existing: &[InstanceId]) -> Plan {
    let all_new: Vec<InstanceId> = new.iter().flat_map(|(_, ids)| ids.iter().cloned()).collect();
    let mut members: Vec<InstanceId> = existing.to_vec();
    members.extend(all_new.iter().cloned());
    let mut p = Plan::default();
    p.push(Step::new(
        "allocate",
        Some(ClusterStatus::Scaling),
        Action::Allocate(all_new.clone()),
        vec![Action::Forget(all_new.clone()), Action::WriteFiles(existing.to_vec())],
    ));
    p.push(Step::new(
        "install",
        Some(ClusterStatus::AddingInstances),
        Action::Install(all_new.clone()),
        vec![Action::DeleteOnAgent(all_new)],
    ));
    super::lifecycle::push_starts(&mut p, new, None, true);
    // No undo of its own: the allocate step's undo renders the old membership.
    p.push(
        Step::new("configure", Some(ClusterStatus::Configuring), Action::WriteFiles(members), vec![])
            .covered_by_earlier_undo(),
    );
    p
}

/// `removed`: the instances to remove by role order; `remaining`: members after.
pub fn scale_in(removed: &[(i32, Vec<InstanceId>)], remaining: &[InstanceId]) -> Plan {
    let all: Vec<InstanceId> = removed.iter().flat_map(|(_, ids)| ids.iter().cloned()).collect();
    let mut p = Plan::default();
    for (i, (order, ids)) in removed.iter().rev().enumerate() {
        p.push(Step::new(
            format!("decommission-order-{order}"),
            if i == 0 { Some(ClusterStatus::Decommissioning) } else { None },
            Action::Stop(ids.clone()),
            vec![Action::Start(ids.clone())],
        ));
    }
    // No undo: the directories and their data are gone.
    p.push(Step::new(
        "delete-instances",
        Some(ClusterStatus::DeletingInstances),
        Action::DeleteOnAgent(all.clone()),
        vec![],
    ));
    p.push(Step::new("forget", None, Action::Forget(all), vec![]));
    p.push(Step::new("configure", Some(ClusterStatus::Configuring), Action::WriteFiles(remaining.to_vec()), vec![]));
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> InstanceId {
        InstanceId::new(s)
    }

    #[test]
    fn scale_out_undo_forgets_then_rerenders_the_old_members() {
        let p = scale_out(&[(0, vec![id("n4"), id("n5")])], &[id("e1")]);
        let names: Vec<_> = p.steps.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["allocate", "install", "start-order-0", "configure"]);
        assert_eq!(p.steps[0].undo, vec![Action::Forget(vec![id("n4"), id("n5")]), Action::WriteFiles(vec![id("e1")])]);
        assert_eq!(p.steps[3].action, Action::WriteFiles(vec![id("e1"), id("n4"), id("n5")]));
    }

    #[test]
    fn scale_in_stops_then_deletes_then_reconfigures_the_rest() {
        let p = scale_in(&[(0, vec![id("x")])], &[id("a"), id("b")]);
        let names: Vec<_> = p.steps.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["decommission-order-0", "delete-instances", "forget", "configure"]);
        assert_eq!(p.steps[0].undo, vec![Action::Start(vec![id("x")])]);
    }
}
