//! Scale a role out (add instances) or in (remove listed instances).
//!
//! Scale out: `Scaling → AddingInstances → Configuring → Active`. The new
//! instances are allocated, installed, initialised (`init`) and started
//! (health-gated); then the existing members get the new membership
//! (re-rendered files; reload or a rolling restart of the changed ones) and
//! run the `scale_out` hook. Every step up to the hook is covered by an
//! undo, so a failure puts the cluster back as it was: the new instances are
//! stopped, removed from their agents and forgotten (ports released,
//! ordinals not reused), and the existing members get the old membership
//! back the same way. A failing `scale_out` hook is unwound the same way but
//! reported as a failure: what it did on the members cannot be undone.
//!
//! Scale in: `Scaling → Decommissioning → DeletingInstances → Configuring →
//! Active`. The `scale_in` hook runs on the remaining members first; a
//! non-zero exit vetoes the scale-in before anything changed. Only
//! decommissioning (stopping) can be undone; once an instance's directory
//! is deleted its data is gone, so later failures are reported as they are.
//!
//! The hooks run on every member; the re-rendering (`reconfigure`) covers
//! the members the caller names: every member when a template reads the
//! membership, else only those that still owe a restart (a member's files
//! cannot change with the membership then, and a role of 1,000 members
//! grown 200 at a time rendered ~2 old members' files per new member).

use super::{Action, Hook, Plan, Rolling, Step};
use crate::ids::InstanceId;
use crate::storage::records::ClusterStatus;

/// `new`: the new instances by role order; `existing`: every current
/// member (the hook's); `reconfigure`: the members to re-render.
pub fn scale_out(new: &[(i32, Vec<InstanceId>)], existing: &[InstanceId], reconfigure: Rolling) -> Plan {
    let all_new: Vec<InstanceId> = new.iter().flat_map(|(_, ids)| ids.iter().cloned()).collect();
    let existing_ids = existing.to_vec();
    let reconfigure = Action::Reconfigure(reconfigure);
    let mut p = Plan::default();
    p.push(Step::new(
        "allocate",
        Some(ClusterStatus::Scaling),
        Action::Allocate(all_new.clone()),
        vec![Action::Forget(all_new.clone()), reconfigure.clone()],
    ));
    p.push(Step::new(
        "install",
        Some(ClusterStatus::AddingInstances),
        Action::Install(all_new.clone()),
        vec![Action::DeleteOnAgent(all_new.clone())],
    ));
    // Covered: the install's undo deletes the new instances.
    p.push(Step::new("init", None, Action::Hook { hook: Hook::Init, ids: all_new }, vec![]).covered_by_earlier_undo());
    super::lifecycle::push_starts(&mut p, new, None, true);
    // Covered: the allocate step's undo forgets the new members and then
    // reconfigures the existing ones from the old membership.
    p.push(Step::new("configure", Some(ClusterStatus::Configuring), reconfigure, vec![]).covered_by_earlier_undo());
    // Not reversible: what the hook did on the existing members stays. A
    // failure here still removes the new members (the earlier undos), and
    // the operation says it failed rather than claiming a rollback.
    let hook = Action::Hook { hook: Hook::ScaleOut, ids: existing_ids };
    p.push(Step::new("scale-out-hook", None, hook, vec![]));
    p
}

/// `removed`: the instances to remove by role order; `remaining`: members
/// after (the hook's); `reconfigure`: the members to re-render.
pub fn scale_in(removed: &[(i32, Vec<InstanceId>)], remaining: &[InstanceId], reconfigure: Rolling) -> Plan {
    let all: Vec<InstanceId> = removed.iter().flat_map(|(_, ids)| ids.iter().cloned()).collect();
    let mut p = Plan::default();
    // Changes nothing that needs undoing; a non-zero exit is the veto.
    let hook = Action::Hook { hook: Hook::ScaleIn, ids: remaining.to_vec() };
    p.push(Step::new("scale-in-hook", Some(ClusterStatus::Scaling), hook, vec![]).covered_by_earlier_undo());
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
    p.push(Step::new("configure", Some(ClusterStatus::Configuring), Action::Reconfigure(reconfigure), vec![]));
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
        let p = scale_out(&[(0, vec![id("n4"), id("n5")])], &[id("e1")], Rolling::all_running(&[id("e1")], 1));
        let names: Vec<_> = p.steps.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["allocate", "install", "init", "start-order-0", "configure", "scale-out-hook"]);
        let old_members = Action::Reconfigure(Rolling::all_running(&[id("e1")], 1));
        assert_eq!(p.steps[0].undo, vec![Action::Forget(vec![id("n4"), id("n5")]), old_members.clone()]);
        assert_eq!(p.steps[4].action, old_members);
        assert!(p.steps[..5].iter().all(|s| s.reversible));
        assert!(!p.steps[5].reversible, "a hook's effects cannot be undone");
    }

    #[test]
    fn scale_in_stops_then_deletes_then_reconfigures_the_rest() {
        let p = scale_in(&[(0, vec![id("x")])], &[id("a"), id("b")], Rolling::all_running(&[id("a"), id("b")], 1));
        let names: Vec<_> = p.steps.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["scale-in-hook", "decommission-order-0", "delete-instances", "forget", "configure"]);
        assert_eq!(p.steps[1].undo, vec![Action::Start(vec![id("x")])]);
        assert!(p.steps[0].reversible, "a vetoing hook changed nothing");
    }

    /// Members with nothing to re-render still run the hooks.
    #[test]
    fn the_hooks_reach_every_member_whatever_is_re_rendered() {
        let out = scale_out(&[(0, vec![id("n3")])], &[id("e1"), id("e2")], Rolling::all_running(&[id("e2")], 1));
        let action = |p: &Plan, name: &str| p.steps.iter().find(|s| s.name == name).map(|s| s.action.clone());
        assert_eq!(action(&out, "configure"), Some(Action::Reconfigure(Rolling::all_running(&[id("e2")], 1))));
        let hook = Action::Hook { hook: Hook::ScaleOut, ids: vec![id("e1"), id("e2")] };
        assert_eq!(action(&out, "scale-out-hook"), Some(hook));
        let r#in = scale_in(&[(0, vec![id("x")])], &[id("a"), id("b")], Rolling::all_running(&[id("b")], 1));
        let hook = Action::Hook { hook: Hook::ScaleIn, ids: vec![id("a"), id("b")] };
        assert_eq!(action(&r#in, "scale-in-hook"), Some(hook));
        assert_eq!(action(&r#in, "configure"), Some(Action::Reconfigure(Rolling::all_running(&[id("b")], 1))));
    }
}
