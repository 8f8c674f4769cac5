//! The runner against a fake context: journal, undo, resume, halt.

use std::cell::RefCell;
use std::time::Duration;

use super::*;
use crate::ids::InstanceId;
use crate::operations::Step;
use crate::storage::records::ClusterStatus;

/// A fake world: remembers which actions ran, fails the ones told to.
#[derive(Default)]
struct Fake {
    log: RefCell<Vec<String>>,
    fail: RefCell<Vec<String>>,
    statuses: RefCell<Vec<ClusterStatus>>,
    journaled: RefCell<usize>,
    /// Journal writes (counted from 0) that fail.
    fail_journal: RefCell<Vec<usize>>,
    journal_calls: RefCell<usize>,
    /// The steps each successful journal write carried, in order.
    saved: RefCell<Vec<Vec<usize>>>,
    /// The steps whose results the end carried, and its status.
    ended: RefCell<Option<(Vec<usize>, OperationStatus)>>,
    hang: RefCell<Option<String>>,
    /// Progress made while hanging (a slow step that still advances).
    moves: RefCell<u64>,
    crawl: RefCell<Option<(String, u32)>>,
}

fn label(a: &Action) -> String {
    format!("{:?}", a).split('(').next().unwrap_or_default().to_string() + ":" + a.instances()[0].as_str()
}

impl OperationContext for Fake {
    async fn run_action(&self, action: &Action) -> Result<Vec<crate::storage::records::InstanceResult>, StepFailure> {
        let l = label(action);
        if self.hang.borrow().as_deref() == Some(l.as_str()) {
            futures::future::pending::<()>().await;
        }
        let crawl = self.crawl.borrow().clone();
        if let Some((c, ticks)) = crawl.filter(|(c, _)| *c == l) {
            // Slower than the deadline in all, but moving all the time.
            for _ in 0..ticks {
                tokio::time::sleep(Duration::from_millis(20)).await;
                *self.moves.borrow_mut() += 1;
            }
            let _ = c;
        }
        self.log.borrow_mut().push(l.clone());
        if self.fail.borrow().contains(&l) {
            return Err(StepFailure { message: format!("{l} broke"), results: vec![] });
        }
        Ok(vec![])
    }
    async fn journal(&self, _r: &OperationRecord, steps: &[usize]) -> Result<(), String> {
        let n = *self.journal_calls.borrow();
        *self.journal_calls.borrow_mut() += 1;
        if self.fail_journal.borrow().contains(&n) {
            return Err(format!("journal write {n} failed"));
        }
        *self.journaled.borrow_mut() += 1;
        self.saved.borrow_mut().push(steps.to_vec());
        Ok(())
    }
    async fn complete(&self, r: &OperationRecord, steps: &[usize], _o: &Outcome) -> Result<(), String> {
        *self.journaled.borrow_mut() += 1;
        *self.ended.borrow_mut() = Some((steps.to_vec(), r.status));
        Ok(())
    }
    async fn set_status(&self, s: ClusterStatus, _d: &str) -> Result<(), String> {
        self.statuses.borrow_mut().push(s);
        Ok(())
    }
    fn deadline(&self, _a: &Action) -> Duration {
        Duration::from_millis(50)
    }
    fn progress(&self) -> u64 {
        *self.moves.borrow()
    }
}

fn ids(s: &str) -> Vec<InstanceId> {
    vec![InstanceId::new(s)]
}

fn plan() -> Plan {
    let mut p = Plan::default();
    p.push(Step::new(
        "install",
        Some(ClusterStatus::Installing),
        Action::Install(ids("a")),
        vec![Action::DeleteOnAgent(ids("a"))],
    ));
    p.push(Step::new("start-0", Some(ClusterStatus::Starting), Action::Start(ids("a")), vec![Action::Stop(ids("a"))]));
    p.push(Step::new("start-1", None, Action::Start(ids("b")), vec![Action::Stop(ids("b"))]));
    p.push(Step::new("empty", None, Action::Start(vec![]), vec![]));
    p
}

use crate::operations::world::record;

#[tokio::test]
async fn all_steps_run_in_order_and_empty_steps_are_left_out() {
    let ctx = Fake::default();
    let mut r = record();
    let p = plan();
    assert_eq!(p.steps.len(), 3);
    assert_eq!(run(&ctx, &mut r, &p).await, Outcome::Succeeded);
    assert_eq!(*ctx.log.borrow(), vec!["Install:a", "Start:a", "Start:b"]);
    assert_eq!(*ctx.statuses.borrow(), vec![ClusterStatus::Installing, ClusterStatus::Starting]);
    assert_eq!(r.status, OperationStatus::Succeeded);
    assert_eq!(r.progress(), (3, 3));
    assert!(*ctx.journaled.borrow() >= 8);
}

#[tokio::test]
async fn a_failure_at_each_step_undoes_the_completed_ones_in_reverse() {
    let expected_undo =
        [vec!["DeleteOnAgent:a"], vec!["Stop:a", "DeleteOnAgent:a"], vec!["Stop:b", "Stop:a", "DeleteOnAgent:a"]];
    let failing = ["Install:a", "Start:a", "Start:b"];
    for (i, f) in failing.iter().enumerate() {
        let ctx = Fake::default();
        ctx.fail.borrow_mut().push(f.to_string());
        let mut r = record();
        let out = run(&ctx, &mut r, &plan()).await;
        assert!(matches!(out, Outcome::Failed { undone: true, rolled_back: true, .. }), "{out:?}");
        let log = ctx.log.borrow();
        assert_eq!(&log[i + 1..], expected_undo[i].as_slice(), "failing {f}");
        assert_eq!(r.status, OperationStatus::RolledBack);
        assert_eq!(r.steps[i].status, StepStatus::Undone);
        assert!(r.error.as_deref().unwrap_or_default().contains("broke"));
    }
}

#[tokio::test]
async fn a_failed_undo_is_reported_not_hidden() {
    let ctx = Fake::default();
    ctx.fail.borrow_mut().extend(["Start:b".to_string(), "Stop:a".to_string()]);
    let mut r = record();
    let out = run(&ctx, &mut r, &plan()).await;
    assert!(matches!(out, Outcome::Failed { undone: false, .. }));
    assert_eq!(r.status, OperationStatus::Failed);
    assert_eq!(r.steps[1].status, StepStatus::UndoFailed);
    let error = r.error.unwrap();
    assert!(error.contains("rollback failed, not put back: a (undo of step start-0: Stop:a broke)"), "{error}");
    assert!(
        matches!(&out, Outcome::Failed { not_put_back, .. } if *not_put_back == ["a (undo of step start-0: Stop:a broke)"]),
        "{out:?}"
    );
    // The undo went on past the failed one.
    assert_eq!(ctx.log.borrow().last().unwrap(), "DeleteOnAgent:a");
}

#[test]
fn what_a_failed_undo_did_not_put_back_is_named() {
    use crate::storage::records::InstanceResult;
    let id = |s: &str| InstanceId::new(s);
    // A rolling undo that failed on a and stopped before c; b is back.
    let roll = Action::Start(vec![id("a"), id("c"), id("b")]);
    let f = StepFailure {
        message: "a broke".into(),
        results: vec![InstanceResult::ok(&id("b"), "back"), InstanceResult::failed(&id("a"), "a broke")],
    };
    assert_eq!(not_put_back("s", &roll, &f), "a, c (undo of step s: a broke)");
    // An instance with an ok result and a failed one is not back.
    let f = StepFailure {
        message: "a broke".into(),
        results: vec![
            InstanceResult::ok(&id("a"), "files"),
            InstanceResult::ok(&id("b"), "files"),
            InstanceResult::ok(&id("c"), "files"),
            InstanceResult::failed(&id("a"), "a broke"),
        ],
    };
    assert_eq!(not_put_back("s", &roll, &f), "a (undo of step s: a broke)");
    // No result at all (the watchdog): none is known to be back.
    let f = StepFailure { message: "watchdog".into(), results: vec![] };
    assert_eq!(not_put_back("s", &roll, &f), "a, c, b (undo of step s: watchdog)");
    let define = Action::SetConfig(Default::default());
    assert_eq!(not_put_back("s", &define, &f), "the cluster's definition (undo of step s: watchdog)");
    // A 1,000-instance role and a long failure stay bounded.
    let many: Vec<InstanceId> = (0..1000).map(|i| InstanceId::new(format!("i{i}"))).collect();
    let roll = Action::Start(many);
    let f = StepFailure { message: "x".repeat(100_000), results: Vec::new() };
    let text = not_put_back("s", &roll, &f);
    assert!(text.starts_with("i0, i1, "), "{}", &text[..40]);
    assert!(text.contains("i19 and 980 more (undo of step s: xxx"), "{}", &text[..200]);
    assert!(text.len() < 2000 && text.ends_with("(the operation's steps say the rest))"), "{}", text.len());
}

#[tokio::test]
async fn undoing_some_steps_is_not_a_rollback_when_others_stay() {
    // Like a failed create: the install stays, only the start is undone.
    let mut p = Plan::default();
    p.push(Step::new("install", None, Action::Install(ids("a")), vec![]));
    p.push(Step::new("start", None, Action::Start(ids("a")), vec![Action::Stop(ids("a"))]));
    let ctx = Fake::default();
    ctx.fail.borrow_mut().push("Start:a".into());
    let mut r = record();
    let out = run(&ctx, &mut r, &p).await;
    assert!(matches!(out, Outcome::Failed { undone: true, rolled_back: false, .. }), "{out:?}");
    assert_eq!(r.status, OperationStatus::Failed);
    assert_eq!(r.steps[1].status, StepStatus::Undone);
    assert_eq!(r.steps[0].status, StepStatus::Done);
}

#[tokio::test]
async fn a_best_effort_failure_is_recorded_and_the_operation_goes_on() {
    let mut p = Plan::default();
    p.push(Step::new("stop", None, Action::Stop(ids("a")), vec![]).best_effort(true));
    p.push(Step::new("delete", None, Action::DeleteOnAgent(ids("a")), vec![]));
    let ctx = Fake::default();
    ctx.fail.borrow_mut().push("Stop:a".into());
    let mut r = record();
    assert_eq!(run(&ctx, &mut r, &p).await, Outcome::Succeeded);
    assert_eq!(*ctx.log.borrow(), vec!["Stop:a", "DeleteOnAgent:a"]);
    assert_eq!(r.steps[0].status, StepStatus::Done);
    assert!(r.steps[0].error.as_deref().unwrap_or_default().contains("Stop:a broke"));
}

#[tokio::test]
async fn a_resumed_operation_skips_done_steps_and_reruns_the_interrupted_one() {
    let ctx = Fake::default();
    let mut r = record();
    let p = plan();
    prepare(&mut r, &p);
    r.steps[0].status = StepStatus::Done;
    r.steps[1].status = StepStatus::Running; // the master died here
    assert_eq!(run(&ctx, &mut r, &p).await, Outcome::Succeeded);
    assert_eq!(*ctx.log.borrow(), vec!["Start:a", "Start:b"]);
    // The status of the step it resumed at, although that step sets one itself.
    assert_eq!(*ctx.statuses.borrow(), vec![ClusterStatus::Starting]);
    assert_eq!(r.progress(), (3, 3));
}

#[tokio::test]
async fn a_resumed_unwinding_finishes_without_undoing_twice() {
    let ctx = Fake::default();
    let mut r = record();
    let p = plan();
    prepare(&mut r, &p);
    r.steps[0].status = StepStatus::Done;
    r.steps[1].status = StepStatus::Done;
    r.steps[2].status = StepStatus::Undone;
    r.steps[2].error = Some("Start:b broke".into());
    r.steps[1].status = StepStatus::Undoing; // the master died here
    let out = run(&ctx, &mut r, &p).await;
    assert!(matches!(&out, Outcome::Failed { step, rolled_back: true, .. } if step == "start-1"), "{out:?}");
    assert_eq!(*ctx.log.borrow(), vec!["Stop:a", "DeleteOnAgent:a"]);
    assert_eq!(r.status, OperationStatus::RolledBack);
}

/// Journal writes of `plan()`: 0 the start, then per step k: 2k+1
/// running, 2k+2 done (with its results).
#[tokio::test]
async fn a_journal_write_that_fails_stops_the_operation_where_it_is() {
    // Step 0's end cannot be written: nothing more runs, nothing is
    // undone (none of it could be recorded), and the end carries step
    // 0's results.
    let ctx = Fake::default();
    ctx.fail_journal.borrow_mut().push(2);
    let mut r = record();
    let out = run(&ctx, &mut r, &plan()).await;
    assert!(
        matches!(&out, Outcome::Halted { step, error } if step == "install" && error.contains("journal write 2 failed")),
        "{out:?}"
    );
    assert_eq!(*ctx.log.borrow(), vec!["Install:a"]);
    assert_eq!(r.status, OperationStatus::Failed);
    assert!(r.error.as_deref().unwrap_or_default().contains("could not be written"), "{:?}", r.error);
    assert_eq!(r.steps[0].status, StepStatus::Done);
    assert_eq!(*ctx.ended.borrow(), Some((vec![0], OperationStatus::Failed)));

    // The write that marks step 1 running fails: it never runs, and the
    // end says it is still pending.
    let ctx = Fake::default();
    ctx.fail_journal.borrow_mut().push(3);
    let mut r = record();
    assert!(matches!(run(&ctx, &mut r, &plan()).await, Outcome::Halted { step, .. } if step == "start-0"));
    assert_eq!(*ctx.log.borrow(), vec!["Install:a"]);
    assert_eq!(r.steps[1].status, StepStatus::Pending);
    assert_eq!(*ctx.ended.borrow(), Some((vec![], OperationStatus::Failed)));

    // The first write fails: nothing runs at all.
    let ctx = Fake::default();
    ctx.fail_journal.borrow_mut().push(0);
    let mut r = record();
    assert!(matches!(run(&ctx, &mut r, &plan()).await, Outcome::Halted { step, .. } if step == "install"));
    assert!(ctx.log.borrow().is_empty());

    // While unwinding: the failed step's write fails, so nothing of the
    // undo runs (it could not be recorded either).
    let ctx = Fake::default();
    ctx.fail.borrow_mut().push("Start:b".into());
    ctx.fail_journal.borrow_mut().push(6);
    let mut r = record();
    assert!(matches!(run(&ctx, &mut r, &plan()).await, Outcome::Halted { step, .. } if step == "start-1"));
    assert_eq!(*ctx.log.borrow(), vec!["Install:a", "Start:a", "Start:b"]);
    assert_eq!(r.steps[2].status, StepStatus::Failed);
    assert_eq!(*ctx.ended.borrow(), Some((vec![2], OperationStatus::Failed)));

    // An undo's write fails: the older steps are not undone.
    let ctx = Fake::default();
    ctx.fail.borrow_mut().push("Start:b".into());
    ctx.fail_journal.borrow_mut().push(8);
    let mut r = record();
    assert!(matches!(run(&ctx, &mut r, &plan()).await, Outcome::Halted { step, .. } if step == "start-1"));
    assert_eq!(*ctx.log.borrow(), vec!["Install:a", "Start:a", "Start:b", "Stop:b"]);
}

#[tokio::test]
async fn a_slow_step_that_keeps_moving_is_not_cut_short() {
    let ctx = Fake::default();
    // 10 x 20 ms = 200 ms against a 50 ms idle deadline.
    *ctx.crawl.borrow_mut() = Some(("Start:b".into(), 10));
    let mut r = record();
    assert_eq!(run(&ctx, &mut r, &plan()).await, Outcome::Succeeded);
}

#[tokio::test]
async fn the_watchdog_fails_a_step_past_its_deadline() {
    let ctx = Fake::default();
    *ctx.hang.borrow_mut() = Some("Start:b".into());
    let mut r = record();
    let out = run(&ctx, &mut r, &plan()).await;
    match out {
        Outcome::Failed { step, error, undone, .. } => {
            assert_eq!(step, "start-1");
            assert!(error.contains("watchdog"), "{error}");
            assert!(undone);
        }
        o => panic!("{o:?}"),
    }
}
