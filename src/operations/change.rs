//! Changes to a running cluster's definition, applied as rolling,
//! health-gated operations: new config values (`Reconfiguring`), a new
//! package version (`Upgrading`) and new resource limits for a role (vertical
//! scale, `Scaling`).
//!
//! Each plan has the same two steps: change the definition (durably), then
//! bring the instances in line with it, `batch` at a time. The first step's
//! undo puts the old definition back and brings the instances in line with
//! that, which touches only the instances the second step had already
//! changed (the actions skip instances that already match). So a failure
//! anywhere rolls the cluster back to where it was, and says so, or, if the
//! rollback fails too, leaves it `Error` with the reason.

use std::collections::BTreeMap;

use super::{Action, Plan, Rolling, Step};
use crate::storage::records::{ClusterStatus, ConfigValue, Limits, PackageRef};

/// New config values: re-render every instance's files; changed instances
/// reload or restart, `batch` at a time.
pub fn reconfigure(old: BTreeMap<String, ConfigValue>, new: BTreeMap<String, ConfigValue>, all: Rolling) -> Plan {
    let define = ("set-config", ClusterStatus::Reconfiguring, Action::SetConfig(new), Action::SetConfig(old));
    two_steps(define, ("reconfigure", Action::Reconfigure(all)))
}

/// A new package version: every instance replaced, keeping its data.
pub fn upgrade(old: PackageRef, new: PackageRef, all: Rolling) -> Plan {
    let define = ("set-version", ClusterStatus::Upgrading, Action::SetPackage(new), Action::SetPackage(old));
    two_steps(define, ("upgrade", Action::Roll(all)))
}

/// New limits for `role`: its instances restarted with them, `batch` at a time.
pub fn resize(role: &str, old: Option<Limits>, new: Option<Limits>, instances: Rolling) -> Plan {
    let set = |limits| Action::SetLimits { role: role.to_string(), limits };
    two_steps(("set-limits", ClusterStatus::Scaling, set(new), set(old)), ("resize", Action::Roll(instances)))
}

fn two_steps(define: (&str, ClusterStatus, Action, Action), apply: (&str, Action)) -> Plan {
    let (name, status, action, put_back) = define;
    let mut p = Plan::default();
    p.push(Step::new(name, Some(status), action, vec![put_back, apply.1.clone()]));
    // No undo of its own: the first step's undo puts back the definition
    // and then brings the instances it changed back in line.
    p.push(Step::new(apply.0, None, apply.1, vec![]).covered_by_earlier_undo());
    p
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::InstanceId;

    #[test]
    fn upgrade_undo_restores_the_version_then_rolls_back() {
        let a = vec![InstanceId::new("a"), InstanceId::new("b")];
        let old = PackageRef { name: "zk".into(), version: "1".into() };
        let new = PackageRef { name: "zk".into(), version: "2".into() };
        let p = upgrade(old.clone(), new.clone(), Rolling::all_running(&a, 1));
        assert_eq!(p.steps.len(), 2);
        assert_eq!(p.steps[0].action, Action::SetPackage(new));
        assert_eq!(p.steps[0].undo, vec![Action::SetPackage(old), Action::Roll(Rolling::all_running(&a, 1))]);
        assert!(p.steps[1].reversible && p.steps[1].undo.is_empty());
    }
}
