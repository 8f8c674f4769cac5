//! Replace one member with a new one on another node: the cluster's normal
//! scale-out of the replacement, then its normal scale-in of the old
//! member, as one operation (`add-*` then `remove-*` steps). A quorum role
//! goes from n to n+1 members and back to n, never below n, so a majority
//! of the old membership is there throughout (the caller refuses a replace
//! while another member of the role is not running). A failure up to the
//! scale-out hook rolls back as a scale-out does (the replacement stopped,
//! removed and forgotten, the old membership rendered again); past it (a
//! scale-in hook's veto, a stop that fails) the operation fails with both
//! members running on one membership (n + 1), since what the hook did
//! cannot be undone; the scale-in hook runs once the replacement exists,
//! so it may move the old member's data onto it.
//!
//! `gone`: the old member's node is `Down` (a repair): its stop and
//! delete are best effort, and the caller leaves it out of the hooks and
//! the re-rendering, which could not reach it.

use super::{Action, Plan, Rolling, Step};
use crate::ids::InstanceId;

/// What a replace needs.
pub struct Replace<'a> {
    /// The replacement, with its role's order.
    pub new: (i32, InstanceId),
    /// The member it replaces, with its role's order.
    pub old: (i32, InstanceId),
    /// Every member the scale-out hook runs on (the old one unless gone).
    pub existing: &'a [InstanceId],
    /// The members after (the replacement included): the scale-in hook's.
    pub remaining: &'a [InstanceId],
    /// Re-rendered once the replacement runs (the membership with both).
    pub grow: Rolling,
    /// Re-rendered once the old member is forgotten.
    pub shrink: Rolling,
    pub gone: bool,
}

pub fn plan(r: Replace<'_>) -> Plan {
    let new = [(r.new.0, vec![r.new.1.clone()])];
    let old = [(r.old.0, vec![r.old.1.clone()])];
    let mut p = Plan::default();
    for mut s in super::scale::scale_out(&new, r.existing, r.grow).steps {
        s.name = format!("add-{}", s.name);
        p.push(s);
    }
    for s in super::scale::scale_in(&old, r.remaining, r.shrink).steps {
        let unreachable = r.gone && matches!(s.action, Action::Stop(_) | Action::DeleteOnAgent(_));
        let mut s: Step = s.best_effort(unreachable);
        s.name = format!("remove-{}", s.name);
        p.push(s);
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> InstanceId {
        InstanceId::new(s)
    }

    #[test]
    fn a_replace_is_a_scale_out_then_a_scale_in_and_rolls_back_like_one() {
        let (a, b, x, y) = (id("a"), id("b"), id("x"), id("y"));
        let existing = [a.clone(), b.clone(), x.clone()];
        let remaining = [a.clone(), b.clone(), y.clone()];
        let p = plan(Replace {
            new: (0, y.clone()),
            old: (0, x.clone()),
            existing: &existing,
            remaining: &remaining,
            grow: Rolling::all_running(&existing, 1),
            shrink: Rolling::all_running(&remaining, 1),
            gone: false,
        });
        let names: Vec<&str> = p.steps.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "add-allocate",
                "add-install",
                "add-init",
                "add-start-order-0",
                "add-configure",
                "add-scale-out-hook",
                "remove-scale-in-hook",
                "remove-decommission-order-0",
                "remove-delete-instances",
                "remove-forget",
                "remove-configure"
            ]
        );
        assert_eq!(p.steps[0].undo[0], Action::Forget(vec![y.clone()]), "a failure forgets the replacement");
        assert_eq!(p.steps[7].action, Action::Stop(vec![x.clone()]));
        assert!(p.steps.iter().all(|s| !s.best_effort), "a reachable member is removed for real");
        // Its node Down: the old member's stop and delete are best effort.
        let gone = plan(Replace {
            new: (0, y.clone()),
            old: (0, x.clone()),
            existing: &[a.clone(), b.clone()],
            remaining: &remaining,
            grow: Rolling::all_running(&[a.clone(), b.clone()], 1),
            shrink: Rolling::all_running(&remaining, 1),
            gone: true,
        });
        let best: Vec<&str> = gone.steps.iter().filter(|s| s.best_effort).map(|s| s.name.as_str()).collect();
        assert_eq!(best, ["remove-decommission-order-0", "remove-delete-instances"]);
    }
}
