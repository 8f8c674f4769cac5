//! Delete a cluster (the seed's flow): stop every instance (highest role
//! order first), run the `destroy` hook, remove them from their agents,
//! forget them and their ports. The cluster actor then removes the cluster
//! record, and the name is free at once.
//!
//! A `destroy` hook that exits non-zero vetoes the delete (nothing is
//! removed yet; the cluster goes `Error` with the hook's output, and the
//! processes stay stopped). With `force`, every step is best-effort: a
//! failing hook or an unreachable agent is recorded in the operation and the
//! delete goes on; what could not be removed on an agent is remembered as a
//! leftover and removed when that agent reconnects.
//!
//! Nothing is undone: a delete that fails half-way has already destroyed
//! data, so the cluster goes `Error` with the reason and the operator
//! deletes again (each step is idempotent, so a retry finishes the job).

use super::{Action, Hook, Plan, Step};
use crate::ids::InstanceId;
use crate::storage::records::ClusterStatus;

pub fn plan(groups: &[(i32, Vec<InstanceId>)], force: bool) -> Plan {
    let all: Vec<InstanceId> = groups.iter().flat_map(|(_, ids)| ids.iter().cloned()).collect();
    let mut p = Plan::default();
    let mut stops = Plan::default();
    super::lifecycle::push_stops(&mut stops, groups, Some(ClusterStatus::Deleting));
    for s in stops.steps {
        p.push(s.best_effort(force));
    }
    let destroy = Action::Hook { hook: Hook::Destroy, ids: all.clone() };
    p.push(Step::new("destroy", Some(ClusterStatus::Deleting), destroy, vec![]).best_effort(force));
    p.push(Step::new("delete-instances", None, Action::DeleteOnAgent(all.clone()), vec![]).best_effort(force));
    p.push(Step::new("forget", None, Action::Forget(all), vec![]));
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stops_in_reverse_order_then_deletes() {
        let p = plan(&[(0, vec![InstanceId::new("a")]), (1, vec![InstanceId::new("b")])], false);
        let names: Vec<_> = p.steps.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["stop-order-1", "stop-order-0", "destroy", "delete-instances", "forget"]);
        assert!(p.steps.iter().all(|s| !s.best_effort));
        let forced = plan(&[(0, vec![InstanceId::new("a")])], true);
        assert!(forced.steps.iter().filter(|s| s.name != "forget").all(|s| s.best_effort));
    }
}
