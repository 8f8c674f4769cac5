//! A property test of the plan runner: random plans (steps with zero to
//! two undo actions, some covered by an earlier undo, some best effort)
//! meet random failures of any forward or undo action, and the runner's
//! actions, outcome and journaled record are held to the rules written out
//! independently below (`expect`), not to the runner's own code.

use std::cell::RefCell;
use std::collections::HashSet;
use std::time::Duration;

use proptest::prelude::*;

use super::runner::{Outcome, run};
use super::world::record;
use super::{Action, OperationContext, Plan, Step, StepFailure};
use crate::ids::InstanceId;
use crate::storage::records::{ClusterStatus, InstanceResult, OperationRecord, OperationStatus, StepStatus};

#[derive(Debug, Clone)]
struct StepShape {
    undos: usize,
    covered: bool,
    best_effort: bool,
}

fn fwd(i: usize) -> String {
    format!("f{i}")
}

fn undo(i: usize, j: usize) -> String {
    format!("u{i}-{j}")
}

fn plan(shapes: &[StepShape]) -> Plan {
    let mut p = Plan::default();
    for (i, s) in shapes.iter().enumerate() {
        let undo = (0..s.undos).map(|j| Action::Stop(vec![InstanceId::new(undo(i, j))])).collect();
        let mut step = Step::new(format!("step-{i}"), None, Action::Start(vec![InstanceId::new(fwd(i))]), undo);
        if s.covered {
            step = step.covered_by_earlier_undo();
        }
        p.push(step.best_effort(s.best_effort));
    }
    p
}

/// What the runner must do, from the rules: steps run in order; a failed
/// best-effort step is recorded and passed; the first other failure stops
/// the steps, then the failed step and the completed ones are undone,
/// newest first, each step's undo actions in order, all of them even after
/// one fails, stopping below a completed step that is not reversible;
/// `RolledBack` only when every undo succeeded and every step up to the
/// failed one is reversible.
fn expect(shapes: &[StepShape], fail: &HashSet<String>) -> (Vec<String>, Option<(usize, bool, bool)>) {
    let mut log = Vec::new();
    let mut failed_at = None;
    for (i, s) in shapes.iter().enumerate() {
        log.push(fwd(i));
        if fail.contains(&fwd(i)) && !s.best_effort {
            failed_at = Some(i);
            break;
        }
    }
    let Some(at) = failed_at else { return (log, None) };
    let mut undone = true;
    for i in (0..=at).rev() {
        let reversible = shapes[i].undos > 0 || shapes[i].covered;
        if i < at && !reversible {
            break;
        }
        for j in 0..shapes[i].undos {
            log.push(undo(i, j));
            undone &= !fail.contains(&undo(i, j));
        }
    }
    let rolled_back = undone && shapes[..=at].iter().all(|s| s.undos > 0 || s.covered);
    (log, Some((at, undone, rolled_back)))
}

#[derive(Default)]
struct Fake {
    fail: HashSet<String>,
    log: RefCell<Vec<String>>,
    last: RefCell<Option<OperationRecord>>,
}

impl OperationContext for Fake {
    async fn run_action(&self, action: &Action) -> Result<Vec<InstanceResult>, StepFailure> {
        let label = action.instances()[0].as_str().to_string();
        self.log.borrow_mut().push(label.clone());
        if self.fail.contains(&label) {
            return Err(StepFailure { message: format!("{label} broke"), results: vec![] });
        }
        Ok(vec![])
    }
    async fn journal(&self, r: &OperationRecord, _steps: &[usize]) -> Result<(), String> {
        *self.last.borrow_mut() = Some(r.clone());
        Ok(())
    }
    async fn set_status(&self, _s: ClusterStatus, _d: &str) -> Result<(), String> {
        Ok(())
    }
    async fn complete(&self, r: &OperationRecord, _steps: &[usize], _o: &Outcome) -> Result<(), String> {
        *self.last.borrow_mut() = Some(r.clone());
        Ok(())
    }
    fn deadline(&self, _a: &Action) -> Duration {
        Duration::from_secs(5)
    }
    fn progress(&self) -> u64 {
        0
    }
}

fn shapes() -> impl Strategy<Value = Vec<StepShape>> {
    proptest::collection::vec(
        (0usize..3, any::<bool>(), prop::bool::weighted(0.2)).prop_map(|(undos, covered, best_effort)| StepShape {
            undos,
            covered,
            best_effort,
        }),
        1..7,
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn the_runner_follows_the_rules_under_any_failures(shapes in shapes(), picks in proptest::collection::vec(any::<u8>(), 0..6)) {
        let labels: Vec<String> = shapes
            .iter()
            .enumerate()
            .flat_map(|(i, s)| std::iter::once(fwd(i)).chain((0..s.undos).map(move |j| undo(i, j))))
            .collect();
        let fail: HashSet<String> = picks.iter().map(|p| labels[*p as usize % labels.len()].clone()).collect();
        let ctx = Fake { fail: fail.clone(), ..Fake::default() };
        let mut r = record();
        let p = plan(&shapes);
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let out = rt.block_on(run(&ctx, &mut r, &p));
        let (log, failure) = expect(&shapes, &fail);
        prop_assert_eq!(&*ctx.log.borrow(), &log);
        let journaled = ctx.last.borrow().clone().expect("the end was recorded");
        prop_assert_eq!(&journaled.status, &r.status, "the last record written is the final one");
        match failure {
            None => {
                prop_assert_eq!(out, Outcome::Succeeded);
                prop_assert_eq!(r.status, OperationStatus::Succeeded);
                prop_assert!(r.steps.iter().all(|s| s.status == StepStatus::Done));
            }
            Some((at, undone, rolled_back)) => {
                let step = format!("step-{at}");
                prop_assert!(
                    matches!(&out, Outcome::Failed { step: s, undone: u, rolled_back: b, .. }
                        if *s == step && *u == undone && *b == rolled_back),
                    "{:?}, expected step {} undone {} rolled back {}", out, step, undone, rolled_back
                );
                let want = if rolled_back { OperationStatus::RolledBack } else { OperationStatus::Failed };
                prop_assert_eq!(r.status, want);
                prop_assert!(r.steps[at + 1..].iter().all(|s| s.status == StepStatus::Pending), "{:?}", r.steps);
                let broke = format!("{} broke", fwd(at));
                prop_assert!(r.error.as_deref().unwrap_or_default().contains(&broke), "{:?}", r.error);
                if !undone {
                    prop_assert!(r.steps.iter().any(|s| s.status == StepStatus::UndoFailed), "{:?}", r.steps);
                    prop_assert!(r.error.as_deref().unwrap_or_default().contains("rollback failed"));
                }
            }
        }
    }
}
