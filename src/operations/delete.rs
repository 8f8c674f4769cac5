//! Delete a cluster: stop every instance (highest role order first), remove
//! them from their agents, forget them. The cluster actor then removes the
//! cluster record, and the name is free at once.
//!
//! Nothing is undone: a delete that fails half-way has already destroyed
//! data, so the cluster goes `Error` with the reason and the operator
//! deletes again (each step is idempotent, so a retry finishes the job).

use super::{Action, Plan, Step};
use crate::ids::InstanceId;
use crate::storage::records::ClusterStatus;

pub fn plan(groups: &[(i32, Vec<InstanceId>)]) -> Plan {
    let all: Vec<InstanceId> = groups.iter().flat_map(|(_, ids)| ids.iter().cloned()).collect();
    let mut p = Plan::default();
    super::lifecycle::push_stops(&mut p, groups, Some(ClusterStatus::Deleting));
    p.push(Step::new("delete-instances", Some(ClusterStatus::Deleting), Action::DeleteOnAgent(all.clone()), vec![]));
    p.push(Step::new("forget", None, Action::Forget(all), vec![]));
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stops_in_reverse_order_then_deletes() {
        let p = plan(&[(0, vec![InstanceId::new("a")]), (1, vec![InstanceId::new("b")])]);
        let names: Vec<_> = p.steps.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["stop-order-1", "stop-order-0", "delete-instances", "forget"]);
    }
}
