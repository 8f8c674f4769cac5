//! Create a cluster: `Installing → Configuring → Starting → Active`; the
//! `init` hook runs once, after the files are written, before the first start.
//!
//! Validation (package, spec, counts, config, placement, ports) happens in
//! the supervisor before the operation exists. A failed create keeps the
//! cluster and its installed instances in `Error` until the operator deletes
//! it (Sahara's rule), so only the start steps have an undo: nothing is left
//! running after a failed create.

use super::{Action, Hook, Plan, Step};
use crate::ids::InstanceId;
use crate::storage::records::ClusterStatus;

/// `groups`: instance ids by role order, ascending.
pub fn plan(groups: &[(i32, Vec<InstanceId>)]) -> Plan {
    let all: Vec<InstanceId> = groups.iter().flat_map(|(_, ids)| ids.iter().cloned()).collect();
    let mut p = Plan::default();
    // No undo: the records stay so the Error cluster shows its instances;
    // delete removes them.
    p.push(Step::new("allocate", Some(ClusterStatus::Installing), Action::Allocate(all.clone()), vec![]));
    // No undo, as above: delete removes the installed directories.
    p.push(Step::new("install", None, Action::Install(all.clone()), vec![]));
    p.push(Step::new("configure", Some(ClusterStatus::Configuring), Action::WriteFiles(all.clone()), vec![]));
    // No undo: init prepares the first start (e.g. formats data); a failed
    // create keeps the cluster in Error until it is deleted.
    p.push(Step::new("init", None, Action::Hook { hook: Hook::Init, ids: all }, vec![]));
    super::lifecycle::push_starts(&mut p, groups, Some(ClusterStatus::Starting), true);
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_follow_role_order_and_only_starts_undo() {
        let g = vec![(0, vec![InstanceId::new("a")]), (1, vec![InstanceId::new("b"), InstanceId::new("c")])];
        let p = plan(&g);
        let names: Vec<_> = p.steps.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["allocate", "install", "configure", "init", "start-order-0", "start-order-1"]);
        assert_eq!(p.steps[5].action, Action::Start(vec![InstanceId::new("b"), InstanceId::new("c")]));
        assert_eq!(p.steps[5].undo, vec![Action::Stop(vec![InstanceId::new("b"), InstanceId::new("c")])]);
        assert!(p.steps[..4].iter().all(|s| s.undo.is_empty()));
    }
}
