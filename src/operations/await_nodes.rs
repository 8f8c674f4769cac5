//! Placement that waits for nodes (issue 24): a role whose instances need
//! more nodes carrying its labels than are `Ready` gets a step that files a
//! node request and places the instances once it is served. Those steps
//! come first, before the `allocate` step that creates every new instance.

use super::{Action, Plan, Step};
use crate::storage::records::ClusterStatus;

/// `plan` with a step waiting for each of `waits` (each an
/// [`Action::AwaitNodes`]) in front, named `await-nodes-<role>`.
/// `reversible`: a failure there leaves things as they were (a scale-out
/// rolls back); a create's does not (its cluster stays, in `Error`, as
/// after any failed create), so it ends `Failed`.
pub fn first(waits: Vec<Action>, status: Option<ClusterStatus>, reversible: bool, plan: Plan) -> Plan {
    let mut out = Plan::default();
    for w in waits {
        let Action::AwaitNodes { role, .. } = &w else { continue };
        let name = format!("await-nodes-{role}");
        // Nothing to undo: the placement goes with the operation, the
        // nodes are their pool's.
        let step = Step::new(name, status, w, vec![]);
        out.push(if reversible { step.covered_by_earlier_undo() } else { step });
    }
    out.steps.extend(plan.steps);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::InstanceId;

    #[test]
    fn each_wait_comes_first_and_only_a_scale_out_rolls_back_from_it() {
        let ids = vec![InstanceId::new("c-w-1"), InstanceId::new("c-w-2")];
        let wait = Action::AwaitNodes { role: "w".into(), first_ordinal: 1, nodes: 2, ids: ids.clone() };
        let p = first(vec![wait.clone()], Some(ClusterStatus::Scaling), true, super::super::create::plan(&[(0, ids)]));
        let names: Vec<&str> = p.steps.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names[..2], ["await-nodes-w", "allocate"]);
        assert_eq!(p.steps[0].action, wait);
        assert!(p.steps[0].reversible && p.steps[0].undo.is_empty());
        let create = first(vec![wait], None, false, Plan::default());
        assert!(!create.steps[0].reversible, "a create waiting for nodes fails as any create");
        // An empty wait (no instances) is left out, as any no-op step.
        let empty = Action::AwaitNodes { role: "x".into(), first_ordinal: 1, nodes: 1, ids: vec![] };
        assert_eq!(first(vec![empty], None, true, Plan::default()).steps.len(), 0);
    }
}
