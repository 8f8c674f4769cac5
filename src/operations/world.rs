//! A model of a cluster for testing every operation's plan against the
//! rules of DESIGN.md §6, without actors or agents: a failure injected at
//! each step in turn must leave the cluster as it was (or the operation
//! honestly `Failed`).
//!
//! Running each step twice is tested on the real system instead
//! (`tests/integration/faults_steps/twice.rs`: the master SIGKILLed inside
//! each step, the operation resumed by the next master, the end compared
//! with an uninterrupted run): this model, whose actions were idempotent
//! by construction, could not fail that test.
//!
//! The model keeps what an operator would check: the cluster's definition
//! (version, config, limits), the master's members, and per instance on its
//! agent the installed version and limits, the rendered files, whether it
//! runs, and which files its running process loaded (a restart or reload
//! loads them). An injected failure first does half of the action to the
//! first of its instances, like a real step that fails half-way: a rolling
//! action leaves it stopped (mid-restart, mid-replace).

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use super::runner::{self, Outcome};
use super::{Action, OperationContext, Plan, StepFailure};
use crate::ids::{ClusterId, InstanceId, OperationId};
use crate::storage::records::{
    ClusterStatus, ConfigValue, InstanceResult, Limits, OperationKind, OperationRecord, OperationStatus, RECORD_VERSION,
};

#[derive(Debug, Clone, PartialEq)]
pub struct OnAgent {
    pub version: String,
    pub limits: Option<Limits>,
    pub files: String,
    pub running: bool,
    /// The files the running process started (or reloaded) with.
    pub loaded: String,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct State {
    pub version: String,
    pub config: BTreeMap<String, ConfigValue>,
    pub limits: Option<Limits>,
    pub members: BTreeSet<InstanceId>,
    pub agents: BTreeMap<InstanceId, OnAgent>,
}

impl State {
    fn render(&self) -> String {
        let m: Vec<&str> = self.members.iter().map(|i| i.as_str()).collect();
        format!("{}|{:?}", m.join(","), self.config)
    }

    fn in_line(&self, a: &OnAgent) -> bool {
        a.version == self.version && a.limits == self.limits
    }

    /// A running cluster of `ids`, everything in line.
    pub fn running(ids: &[InstanceId]) -> State {
        let mut s = State { version: "1".into(), ..State::default() };
        s.members = ids.iter().cloned().collect();
        let files = s.render();
        for id in ids {
            let a = OnAgent {
                version: "1".into(),
                limits: None,
                files: files.clone(),
                running: true,
                loaded: files.clone(),
            };
            s.agents.insert(id.clone(), a);
        }
        s
    }
}

pub struct World {
    pub state: RefCell<State>,
    /// Fail the n-th action run (0-based), counting undo actions too.
    pub fail_at: Cell<Option<usize>>,
    pub calls: Cell<usize>,
}

impl World {
    pub fn new(state: State) -> World {
        World { state: RefCell::new(state), fail_at: Cell::new(None), calls: Cell::new(0) }
    }

    fn apply(&self, action: &Action, ids: &[InstanceId]) -> Result<(), String> {
        let mut s = self.state.borrow_mut();
        let should_run = |id: &InstanceId| match action {
            Action::Reconfigure(r) | Action::Roll(r) => r.running.contains(id),
            _ => false,
        };
        for id in ids {
            let render = s.render();
            let (version, limits) = (s.version.clone(), s.limits);
            match action {
                Action::Allocate(_) => {
                    s.members.insert(id.clone());
                    continue;
                }
                Action::Forget(_) => {
                    s.members.remove(id);
                    continue;
                }
                Action::Install(_) => {
                    let a = OnAgent { version, limits, files: render, running: false, loaded: String::new() };
                    s.agents.insert(id.clone(), a);
                    continue;
                }
                Action::DeleteOnAgent(_) => {
                    s.agents.remove(id);
                    continue;
                }
                // A member its node does not hold is left to the start after.
                // Places, nothing more: the allocate after it adds them.
                Action::AwaitNodes { .. } => continue,
                Action::RefreshFiles(_) => {
                    if let Some(a) = s.agents.get_mut(id) {
                        a.files = render;
                    }
                    continue;
                }
                _ => {}
            }
            let a = s.agents.get_mut(id).ok_or(format!("{id} not installed"))?;
            match action {
                Action::WriteFiles(_) => a.files = render,
                // A running member whose files changed under it is
                // restarted (or reloaded) by its start.
                Action::Start(_) => {
                    a.running = true;
                    a.loaded = a.files.clone();
                }
                Action::Hook { .. } => {}
                Action::Stop(_) => a.running = false,
                Action::Reconfigure(_) => {
                    a.files = render;
                    if should_run(id) && (!a.running || a.loaded != a.files) {
                        a.running = true;
                        a.loaded = a.files.clone();
                    }
                }
                Action::Roll(_) => {
                    if a.version != version || a.limits != limits {
                        let running = should_run(id);
                        let loaded = if running { render.clone() } else { String::new() };
                        *a = OnAgent { version, limits, files: render, running, loaded };
                    } else if should_run(id) && !a.running {
                        a.running = true;
                        a.loaded = a.files.clone();
                    }
                }
                _ => unreachable!("handled above"),
            }
        }
        match action {
            Action::SetPackage(p) => s.version = p.version.clone(),
            Action::SetConfig(c) => s.config = c.clone(),
            Action::SetLimits { limits, .. } => s.limits = *limits,
            _ => {}
        }
        Ok(())
    }

    /// Half of `action` on `id`: a rolling action stopped it and went no further.
    fn half(&self, action: &Action, id: &InstanceId) -> Result<(), String> {
        match action {
            Action::Reconfigure(_) | Action::Roll(_) => {
                let render = self.state.borrow().render();
                let mut s = self.state.borrow_mut();
                let a = s.agents.get_mut(id).ok_or(format!("{id} not installed"))?;
                if matches!(action, Action::Reconfigure(_)) {
                    a.files = render;
                }
                a.running = false;
                Ok(())
            }
            _ => self.apply(action, std::slice::from_ref(id)),
        }
    }
}

impl OperationContext for World {
    async fn run_action(&self, action: &Action) -> Result<Vec<InstanceResult>, StepFailure> {
        let n = self.calls.get();
        self.calls.set(n + 1);
        let ids = action.instances();
        let fail = |m: String| StepFailure { message: m, results: vec![] };
        if self.fail_at.get() == Some(n) {
            // Half-way: the first instance got part of the action, then it failed.
            match ids.first() {
                Some(first) => self.half(action, first).map_err(fail)?,
                None => self.apply(action, ids).map_err(fail)?,
            }
            return Err(fail(format!("injected failure at action {n}")));
        }
        self.apply(action, ids).map_err(fail)?;
        Ok(ids.iter().map(|i| InstanceResult::ok(i, "done")).collect())
    }
    async fn journal(&self, _r: &OperationRecord, _steps: &[usize]) -> Result<(), String> {
        Ok(())
    }
    async fn set_status(&self, _s: ClusterStatus, _d: &str) -> Result<(), String> {
        Ok(())
    }
    async fn complete(&self, _r: &OperationRecord, _steps: &[usize], _o: &Outcome) -> Result<(), String> {
        Ok(())
    }
    fn deadline(&self, _a: &Action) -> Duration {
        Duration::from_secs(5)
    }
    fn progress(&self) -> u64 {
        0
    }
}

pub fn record() -> OperationRecord {
    OperationRecord {
        version: RECORD_VERSION,
        id: OperationId::random(),
        cluster_id: ClusterId::random(),
        cluster: "c".into(),
        kind: OperationKind::Create,
        params: "{}".into(),
        status: OperationStatus::Pending,
        steps: vec![],
        error: None,
        created_at: time::OffsetDateTime::now_utc(),
        ended_at: None,
        resume: None,
    }
}

/// Runs `plan` on `before` with a failure at each step in turn; returns
/// (step index, outcome, state after) for each.
pub async fn fail_each_step(before: &State, plan: &Plan) -> Vec<(usize, Outcome, State)> {
    let mut out = Vec::new();
    for k in 0..plan.steps.len() {
        let w = World::new(before.clone());
        w.fail_at.set(Some(k));
        let mut r = record();
        let outcome = runner::run(&w, &mut r, plan).await;
        out.push((k, outcome, w.state.into_inner()));
    }
    out
}

/// The state after running every step once.
pub async fn run_once(before: &State, plan: &Plan) -> State {
    let once = World::new(before.clone());
    let mut r = record();
    assert_eq!(runner::run(&once, &mut r, plan).await, Outcome::Succeeded);
    once.state.into_inner()
}

pub fn ids(names: &[&str]) -> Vec<InstanceId> {
    names.iter().map(|n| InstanceId::new(*n)).collect()
}

/// Whether the instances are all in line with the definition.
pub fn all_in_line(s: &State) -> bool {
    s.agents.values().all(|a| s.in_line(a))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operations::{Rolling, change, create, lifecycle, scale};
    use crate::storage::records::PackageRef;

    fn rolling(ids: &[InstanceId]) -> Rolling {
        Rolling::all_running(ids, 1)
    }

    fn pkg(v: &str) -> PackageRef {
        PackageRef { name: "zk".into(), version: v.into() }
    }

    fn config(tick: i64) -> BTreeMap<String, ConfigValue> {
        BTreeMap::from([("tick_time".to_string(), ConfigValue::Int(tick))])
    }

    /// Every plan that promises a rollback, with its starting state.
    fn reversible_plans() -> Vec<(&'static str, State, Plan)> {
        let three = ids(&["s1", "s2", "s3"]);
        let before = State::running(&three);
        let limits = Some(Limits { memory_bytes: Some(64 << 20), cpu: Some(0.5) });
        vec![
            ("scale out", before.clone(), scale::scale_out(&[(0, ids(&["s4", "s5"]))], &three, rolling(&three))),
            ("upgrade", before.clone(), change::upgrade(pkg("1"), pkg("2"), rolling(&three))),
            ("reconfigure", before.clone(), change::reconfigure(BTreeMap::new(), config(3000), rolling(&three))),
            ("resize", before.clone(), change::resize("server", None, limits, rolling(&three))),
        ]
    }

    #[tokio::test]
    async fn a_failure_at_any_step_leaves_the_cluster_as_it_was() {
        for (name, before, plan) in reversible_plans() {
            for (k, outcome, after) in fail_each_step(&before, &plan).await {
                let step = &plan.steps[k].name;
                // Everything is put back either way; only a step whose own
                // effects cannot be undone (a hook) makes it an honest Failed.
                let rolled_back = plan.steps[..=k].iter().all(|s| s.reversible);
                assert!(
                    matches!(outcome, Outcome::Failed { rolled_back: r, undone: true, .. } if r == rolled_back),
                    "{name}, failing {step}: {outcome:?}"
                );
                assert_eq!(after, before, "{name}, failing {step}");
            }
        }
    }

    #[tokio::test]
    async fn the_changes_reach_every_instance() {
        let three = ids(&["s1", "s2", "s3"]);
        let before = State::running(&three);
        let two_at_a_time = Rolling { batch: 2, ..rolling(&three) };
        let after = run_once(&before, &change::upgrade(pkg("1"), pkg("2"), two_at_a_time)).await;
        assert!(after.agents.values().all(|a| a.version == "2" && a.running));
        assert!(all_in_line(&after));
        let after = run_once(&before, &scale::scale_out(&[(0, ids(&["s4", "s5"]))], &three, rolling(&three))).await;
        let files: BTreeSet<&String> = after.agents.values().map(|a| &a.files).collect();
        assert_eq!(files.len(), 1, "every member rendered from the same membership");
        assert!(files.iter().all(|f| f.contains("s5")));
        assert_eq!(after.agents.len(), 5);
        assert!(all_in_line(&after));
    }

    #[tokio::test]
    async fn a_replace_rolls_back_up_to_its_scale_out_hook_then_fails_with_both_members_running() {
        use crate::operations::replace::{Replace, plan};
        let three = ids(&["s1", "s2", "s3"]);
        let remaining = ids(&["s1", "s2", "s4"]);
        let before = State::running(&three);
        let replace = plan(Replace {
            new: (0, InstanceId::new("s4")),
            old: (0, InstanceId::new("s3")),
            existing: &three,
            remaining: &remaining,
            grow: rolling(&three),
            shrink: rolling(&remaining),
            gone: false,
        });
        let after = run_once(&before, &replace).await;
        assert_eq!(after.agents.keys().cloned().collect::<Vec<_>>(), remaining);
        assert!(after.agents.values().all(|a| a.running && a.files.contains("s4") && !a.files.contains("s3")));
        assert!(all_in_line(&after));
        // Up to the scale-out hook (whose effects stay), a failure puts
        // everything back; past it and until the old member's data is
        // deleted, it fails honestly with both members running, rendered
        // from one membership (n + 1, never fewer than n); after, it fails.
        let hook = replace.steps.iter().position(|s| s.name == "add-scale-out-hook").unwrap();
        let delete = replace.steps.iter().position(|s| s.name == "remove-delete-instances").unwrap();
        for (k, outcome, after) in fail_each_step(&before, &replace).await {
            let step = replace.steps[k].name.as_str();
            if k <= hook {
                assert!(matches!(outcome, Outcome::Failed { undone: true, .. }), "{step}: {outcome:?}");
                assert_eq!(after, before, "{step}");
            } else {
                assert!(matches!(outcome, Outcome::Failed { rolled_back: false, .. }), "{step}: {outcome:?}");
            }
            if k > hook && k < delete {
                assert_eq!(after.agents.len(), 4, "{step}: {after:?}");
                assert!(after.agents.values().all(|a| a.running), "{step}: {after:?}");
                assert!(all_in_line(&after), "{step}: {after:?}");
            }
        }
    }

    #[tokio::test]
    async fn scale_in_rolls_back_until_data_is_deleted_then_fails_honestly() {
        let three = ids(&["s1", "s2", "s3"]);
        let before = State::running(&three);
        let plan = scale::scale_in(&[(0, ids(&["s3"]))], &ids(&["s1", "s2"]), rolling(&ids(&["s1", "s2"])));
        for (k, outcome, after) in fail_each_step(&before, &plan).await {
            let step = plan.steps[k].name.as_str();
            if matches!(step, "scale-in-hook" | "decommission-order-0") {
                assert!(matches!(outcome, Outcome::Failed { rolled_back: true, .. }), "{step}: {outcome:?}");
                assert_eq!(after, before, "{step}");
            } else {
                assert!(matches!(outcome, Outcome::Failed { rolled_back: false, .. }), "{step}: {outcome:?}");
            }
        }
    }

    #[tokio::test]
    async fn lifecycle_failures_are_reported_as_failed_never_as_rolled_back() {
        // Start, stop and restart change only whether processes run; a
        // failure half-way is reported as it is (the cluster goes Error with
        // the reason) rather than "undone" by flipping processes back.
        let three = ids(&["s1", "s2", "s3"]);
        let groups = [(0, ids(&["s1"])), (1, ids(&["s2", "s3"]))];
        let mut stopped = State::running(&three);
        stopped.agents.values_mut().for_each(|a| a.running = false);
        let cases = [
            ("start", stopped, lifecycle::start(&groups, Vec::new())),
            ("stop", State::running(&three), lifecycle::stop(&groups)),
            ("restart", State::running(&three), lifecycle::restart(&groups)),
        ];
        for (name, before, plan) in cases {
            for (k, outcome, _) in fail_each_step(&before, &plan).await {
                assert!(matches!(outcome, Outcome::Failed { rolled_back: false, .. }), "{name} step {k}: {outcome:?}");
            }
        }
    }

    #[tokio::test]
    async fn a_failed_create_leaves_nothing_running() {
        let empty = State { version: "1".into(), ..State::default() };
        let plan = create::plan(&[(0, ids(&["a"])), (1, ids(&["b", "c"]))]);
        for (k, outcome, after) in fail_each_step(&empty, &plan).await {
            assert!(matches!(outcome, Outcome::Failed { rolled_back: false, .. }), "{k}: {outcome:?}");
            assert!(after.agents.values().all(|a| !a.running), "step {}: {after:?}", plan.steps[k].name);
        }
    }
}
