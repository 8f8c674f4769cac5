//! Start, stop and restart of a whole cluster (in role order; stop in
//! reverse order) or of one instance.
//!
//! These have no undo: they change only whether processes run, and a
//! failure leaves the cluster `Error` with the reason, which is the honest
//! state to show (undoing a half-done stop by starting again could hide why).

use super::{Action, Plan, Rolling, Step};
use crate::ids::InstanceId;
use crate::storage::records::ClusterStatus;

/// Appends one start step per order group (ascending). With `undo`, each
/// step's undo stops its group again.
pub fn push_starts(p: &mut Plan, groups: &[(i32, Vec<InstanceId>)], status: Option<ClusterStatus>, undo: bool) {
    for (i, (order, ids)) in groups.iter().enumerate() {
        let undo = if undo { vec![Action::Stop(ids.clone())] } else { vec![] };
        p.push(Step::new(
            format!("start-order-{order}"),
            if i == 0 { status } else { None },
            Action::Start(ids.clone()),
            undo,
        ));
    }
}

/// Appends one stop step per order group, highest order first.
pub fn push_stops(p: &mut Plan, groups: &[(i32, Vec<InstanceId>)], status: Option<ClusterStatus>) {
    for (i, (order, ids)) in groups.iter().rev().enumerate() {
        p.push(Step::new(
            format!("stop-order-{order}"),
            if i == 0 { status } else { None },
            Action::Stop(ids.clone()),
            vec![],
        ));
    }
}

/// The operator's start: every member's files put in line first (an undo
/// that could not reach a node may have left them stale; `running` are the
/// members running now, reloaded or restarted if theirs changed), then the
/// starts in role order.
pub fn start(groups: &[(i32, Vec<InstanceId>)], running: Vec<InstanceId>) -> Plan {
    let mut p = Plan::default();
    let ids: Vec<InstanceId> = groups.iter().flat_map(|(_, ids)| ids.iter().cloned()).collect();
    let refresh = Action::RefreshFiles(Rolling { ids, batch: 0, running });
    p.push(Step::new("refresh-files", Some(ClusterStatus::Starting), refresh, vec![]));
    push_starts(&mut p, groups, None, false);
    p
}

pub fn stop(groups: &[(i32, Vec<InstanceId>)]) -> Plan {
    let mut p = Plan::default();
    push_stops(&mut p, groups, Some(ClusterStatus::Stopping));
    p
}

pub fn restart(groups: &[(i32, Vec<InstanceId>)]) -> Plan {
    let mut p = Plan::default();
    push_stops(&mut p, groups, Some(ClusterStatus::Restarting));
    push_starts(&mut p, groups, None, false);
    p
}

/// One instance: `verb` is start, stop or restart.
pub fn instance(verb: InstanceVerb, id: &InstanceId) -> Plan {
    let ids = vec![id.clone()];
    let mut p = Plan::default();
    if matches!(verb, InstanceVerb::Stop | InstanceVerb::Restart) {
        p.push(Step::new(format!("stop-{id}"), None, Action::Stop(ids.clone()), vec![]));
    }
    if matches!(verb, InstanceVerb::Start | InstanceVerb::Restart) {
        p.push(Step::new(format!("start-{id}"), None, Action::Start(ids), vec![]));
    }
    p
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InstanceVerb {
    Start,
    Stop,
    Restart,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn groups() -> Vec<(i32, Vec<InstanceId>)> {
        vec![(0, vec![InstanceId::new("coord")]), (5, vec![InstanceId::new("w1"), InstanceId::new("w2")])]
    }

    #[test]
    fn restart_stops_in_reverse_then_starts_in_order() {
        let names: Vec<_> = restart(&groups()).steps.into_iter().map(|s| s.name).collect();
        assert_eq!(names, ["stop-order-5", "stop-order-0", "start-order-0", "start-order-5"]);
    }

    #[test]
    fn a_start_puts_files_in_line_first_then_starts_in_order() {
        let running = vec![InstanceId::new("w1")];
        let p = start(&groups(), running.clone());
        let names: Vec<_> = p.steps.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["refresh-files", "start-order-0", "start-order-5"]);
        let all = vec![InstanceId::new("coord"), InstanceId::new("w1"), InstanceId::new("w2")];
        assert_eq!(p.steps[0].action, Action::RefreshFiles(Rolling { ids: all, batch: 0, running }));
        assert_eq!(p.steps[0].status, Some(ClusterStatus::Starting));
    }

    #[test]
    fn instance_restart_is_stop_then_start() {
        let p = instance(InstanceVerb::Restart, &InstanceId::new("x"));
        assert_eq!(p.steps.len(), 2);
        assert!(matches!(p.steps[0].action, Action::Stop(_)));
        assert!(matches!(p.steps[1].action, Action::Start(_)));
    }
}
