//! Runs a [`Plan`]: journal, watchdog, undo in reverse.
//!
//! The journal is written before each step starts and after it ends, so a
//! master that dies mid-operation finds on restart which step was running.
//! Each write carries the operation's header and the results of the steps
//! that changed since the last write that succeeded (normally the one step
//! that just ended), never every step's results again. A step stays
//! "unsaved" until a write carried it, so a failed write loses nothing: the
//! next one that succeeds brings the disk up to date.
//!
//! A journal write that fails (the context has retried it already) stops
//! the operation where it is: nothing more is done or undone, since none
//! of it could be recorded, and the operation ends [`Outcome::Halted`]
//! (the end carries the results no write carried). Readers only ever see
//! what a write made durable.
//!
//! The watchdog fails a step that makes no progress for its deadline
//! ([`OperationContext::progress`]); a step that keeps moving may take as
//! long as it needs (a 1,000-instance install streams for minutes).

use time::OffsetDateTime;

use super::{Action, OperationContext, Plan, StepFailure};
use crate::storage::records::{OperationRecord, OperationStatus, StepRecord, StepStatus};

/// How an operation ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Succeeded,
    /// A step failed; `undone` says whether every completed step was undone.
    Failed {
        step: String,
        error: String,
        undone: bool,
        rolled_back: bool,
        /// When an undo failed: what each failed undo left as the
        /// operation made it (see [`not_put_back`]); empty otherwise.
        not_put_back: Vec<String>,
    },
    /// Its journal could not be written at `step`: it stopped there,
    /// nothing more done and nothing undone.
    Halted {
        step: String,
        error: String,
    },
}

/// Fills `record.steps` from `plan` (all `Pending`).
pub fn prepare(record: &mut OperationRecord, plan: &Plan) {
    record.steps = plan
        .steps
        .iter()
        .map(|s| StepRecord { name: s.name.clone(), status: StepStatus::Pending, error: None, results: Vec::new() })
        .collect();
}

/// Runs every step of `plan` in order; on the first failure undoes the
/// completed steps in reverse. Ends with the record journaled in its final
/// status (`Succeeded`, `RolledBack` or `Failed`).
///
/// The same call resumes an operation a master restart interrupted, from
/// its journal: steps already `Done` are skipped, the step that was running
/// runs again (actions are idempotent), and an operation that was unwinding
/// finishes unwinding (steps already `Undone` are not undone twice).
pub async fn run<C: OperationContext>(ctx: &C, record: &mut OperationRecord, plan: &Plan) -> Outcome {
    if record.steps.len() != plan.steps.len() {
        prepare(record, plan);
    }
    record.status = OperationStatus::Running;
    // Steps whose results no successful journal write has carried yet.
    let mut unsaved = Vec::new();
    let first = record.steps.iter().find(|s| s.status != StepStatus::Done).map(|s| s.name.clone());
    if let Err(e) = journal(ctx, record, &mut unsaved, None).await {
        return halt(ctx, record, &unsaved, first.unwrap_or_default(), e).await;
    }

    let unwinding = record.steps.iter().rposition(|s| {
        matches!(s.status, StepStatus::Failed | StepStatus::Undoing | StepStatus::Undone | StepStatus::UndoFailed)
    });
    let mut failure = unwinding.map(|i| {
        let error = record.steps[i].error.clone();
        (i, error.unwrap_or_else(|| "interrupted by a master restart while unwinding".into()))
    });
    let mut resumed_past = false;
    for (i, step) in plan.steps.iter().enumerate() {
        if failure.is_some() {
            break;
        }
        if record.steps[i].status == StepStatus::Done {
            resumed_past = true;
            continue;
        }
        // Resuming after skipped steps: show the status the plan had reached.
        let status = match step.status {
            Some(s) => Some(s),
            None if resumed_past => plan.steps[..i].iter().rev().find_map(|s| s.status),
            None => None,
        };
        resumed_past = false;
        if let Some(status) = status
            && let Err(e) = ctx.set_status(status, &format!("{}: {}", kind_label(record), step.name)).await
        {
            failure = Some((i, format!("cannot record cluster status: {e}")));
            break;
        }
        let before = record.steps[i].status;
        record.steps[i].status = StepStatus::Running;
        if let Err(e) = journal(ctx, record, &mut unsaved, None).await {
            // Not started: the end says so.
            record.steps[i].status = before;
            return halt(ctx, record, &unsaved, step.name.clone(), e).await;
        }
        match run_with_deadline(ctx, &step.action).await {
            Ok(results) => {
                record.steps[i].status = StepStatus::Done;
                record.steps[i].results = results;
                if let Err(e) = journal(ctx, record, &mut unsaved, Some(i)).await {
                    return halt(ctx, record, &unsaved, step.name.clone(), e).await;
                }
            }
            Err(f) if step.best_effort => {
                // Recorded, not fatal: the step is done as far as it could be.
                tracing::warn!(step = %step.name, error = %f.message, "best-effort step failed; going on");
                record.steps[i].status = StepStatus::Done;
                record.steps[i].error = Some(format!("best effort, not all done: {}", f.message));
                record.steps[i].results = f.results;
                if let Err(e) = journal(ctx, record, &mut unsaved, Some(i)).await {
                    return halt(ctx, record, &unsaved, step.name.clone(), e).await;
                }
            }
            Err(f) => {
                record.steps[i].status = StepStatus::Failed;
                record.steps[i].error = Some(f.message.clone());
                record.steps[i].results = f.results;
                if let Err(e) = journal(ctx, record, &mut unsaved, Some(i)).await {
                    return halt(ctx, record, &unsaved, step.name.clone(), e).await;
                }
                failure = Some((i, f.message));
                break;
            }
        }
    }

    let Some((failed_at, error)) = failure else {
        finish(record, OperationStatus::Succeeded, None);
        complete(ctx, record, &unsaved, Outcome::Succeeded).await;
        return Outcome::Succeeded;
    };

    // Undo completed steps, newest first. The failed step itself is undone
    // too: it may have half-happened (some instances started), and undo
    // actions are idempotent, so undoing what never happened is harmless.
    let mut undone = true;
    let mut left = Vec::new();
    for i in (0..=failed_at).rev() {
        // Past a completed step that cannot be put back (data deleted, a
        // create's install kept for the operator), undoing older steps
        // would act on a world that is no longer theirs: stop there.
        if i < failed_at && !plan.steps[i].reversible {
            break;
        }
        if plan.steps[i].undo.is_empty() || record.steps[i].status == StepStatus::Undone {
            continue;
        }
        let name = plan.steps[i].name.clone();
        let before = record.steps[i].status;
        record.steps[i].status = StepStatus::Undoing;
        if let Err(e) = journal(ctx, record, &mut unsaved, None).await {
            record.steps[i].status = before;
            return halt(ctx, record, &unsaved, name, e).await;
        }
        record.steps[i].status = StepStatus::Undone;
        for undo in &plan.steps[i].undo {
            if let Err(f) = run_with_deadline(ctx, undo).await {
                undone = false;
                left.push(not_put_back(&name, undo, &f));
                record.steps[i].status = StepStatus::UndoFailed;
                let prev = record.steps[i].error.take().map(|e| format!("{e}; ")).unwrap_or_default();
                record.steps[i].error = Some(format!("{prev}undo failed: {}", f.message));
                record.steps[i].results.extend(f.results);
                // Go on: undo as much as can be undone, and say what was not.
            }
        }
        if let Err(e) = journal(ctx, record, &mut unsaved, Some(i)).await {
            return halt(ctx, record, &unsaved, name, e).await;
        }
    }
    let step = plan.steps[failed_at].name.clone();
    // RolledBack only when every step that ran (the failed one included)
    // was put back; anything less is Failed, however much was undone.
    let rolled_back = undone && plan.steps[..=failed_at].iter().all(|s| s.reversible);
    let status = if rolled_back { OperationStatus::RolledBack } else { OperationStatus::Failed };
    let message = if undone {
        format!("step {step} failed: {error}")
    } else {
        format!("step {step} failed: {error}; rollback failed, not put back: {}", left.join("; "))
    };
    finish(record, status, Some(message));
    let outcome = Outcome::Failed { step, error, undone, rolled_back, not_put_back: left };
    complete(ctx, record, &unsaved, outcome.clone()).await;
    outcome
}

/// What an undo action that failed left as the operation had made it:
/// each instance of the action it did not put back (one it failed on, or
/// one it never reached: a rolling undo stops at the first batch that
/// fails), or the cluster's definition for an action on no instance; with
/// the step and why.
pub fn not_put_back(step: &str, undo: &Action, f: &StepFailure) -> String {
    use std::collections::HashSet;
    let all = undo.instances();
    let failed: HashSet<&crate::ids::InstanceId> = f.results.iter().filter(|r| !r.ok).map(|r| &r.instance).collect();
    let reached: HashSet<&crate::ids::InstanceId> = f.results.iter().map(|r| &r.instance).collect();
    let mut left: Vec<&str> =
        all.iter().filter(|i| failed.contains(i) || !reached.contains(i)).map(|i| i.as_str()).collect();
    if left.is_empty() {
        left = all.iter().map(|i| i.as_str()).collect();
    }
    let what = if left.is_empty() {
        "the cluster's definition".to_string()
    } else if left.len() > NAMED_MAX {
        format!("{} and {} more", left[..NAMED_MAX].join(", "), left.len() - NAMED_MAX)
    } else {
        left.join(", ")
    };
    // The step's message joins every instance's (stderr tails included):
    // the cluster's description keeps its start, the step keeps it all.
    let mut why = f.message.clone();
    if why.len() > WHY_MAX {
        let cut = (0..=WHY_MAX).rev().find(|&i| why.is_char_boundary(i)).unwrap_or(0);
        why.truncate(cut);
        why.push_str("... (the operation's steps say the rest)");
    }
    format!("{what} (undo of step {step}: {why})")
}

/// Instances named in one [`not_put_back`] at most; the rest are counted.
const NAMED_MAX: usize = 20;
/// Bytes of the undo's failure kept in one [`not_put_back`].
const WHY_MAX: usize = 1024;

async fn complete<C: OperationContext>(ctx: &C, record: &OperationRecord, unsaved: &[usize], outcome: Outcome) {
    if let Err(e) = ctx.complete(record, unsaved, &outcome).await {
        tracing::error!(operation = %record.id, error = %e, "cannot record the end of an operation");
    }
}

/// Ends the operation at `step` because its journal could not be written:
/// `Failed`, saying so; nothing more is run, nothing is undone.
async fn halt<C: OperationContext>(
    ctx: &C,
    record: &mut OperationRecord,
    unsaved: &[usize],
    step: String,
    error: String,
) -> Outcome {
    tracing::error!(operation = %record.id, %step, %error, "the journal cannot be written: the operation stops here");
    let error = format!("its journal could not be written ({error}); nothing more was done and nothing was undone");
    finish(record, OperationStatus::Failed, Some(format!("stopped at step {step}: {error}")));
    let outcome = Outcome::Halted { step, error };
    complete(ctx, record, unsaved, outcome.clone()).await;
    outcome
}

async fn run_with_deadline<C: OperationContext>(
    ctx: &C,
    action: &Action,
) -> Result<Vec<crate::storage::records::InstanceResult>, StepFailure> {
    let idle = ctx.deadline(action);
    let work = ctx.run_action(action);
    tokio::pin!(work);
    let mut seen = ctx.progress();
    loop {
        match tokio::time::timeout(idle, &mut work).await {
            Ok(r) => return r,
            Err(_) => {
                let now = ctx.progress();
                if now == seen {
                    return Err(StepFailure {
                        message: format!("watchdog: step made no progress for {}", humantime::format_duration(idle)),
                        results: Vec::new(),
                    });
                }
                seen = now;
            }
        }
    }
}

fn finish(record: &mut OperationRecord, status: OperationStatus, error: Option<String>) {
    record.status = status;
    record.error = error;
    record.ended_at = Some(OffsetDateTime::now_utc());
}

/// Journals `record` with the results of `step` (the one that just
/// changed, if any) and of every step in `unsaved`.
///
/// A write that fails (the context retried it) is the caller's to stop
/// on: going on would change the world with nothing recorded of it, and
/// the next master would resume from a journal that is behind. The steps
/// it would have written stay in `unsaved`, for the end to carry.
async fn journal<C: OperationContext>(
    ctx: &C,
    record: &OperationRecord,
    unsaved: &mut Vec<usize>,
    step: Option<usize>,
) -> Result<(), String> {
    if let Some(i) = step
        && !unsaved.contains(&i)
    {
        unsaved.push(i);
        unsaved.sort_unstable();
    }
    ctx.journal(record, unsaved).await?;
    unsaved.clear();
    Ok(())
}

fn kind_label(record: &OperationRecord) -> String {
    format!("{:?}", record.kind).to_lowercase()
}

#[cfg(test)]
mod tests {
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
        async fn run_action(
            &self,
            action: &Action,
        ) -> Result<Vec<crate::storage::records::InstanceResult>, StepFailure> {
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
        p.push(Step::new(
            "start-0",
            Some(ClusterStatus::Starting),
            Action::Start(ids("a")),
            vec![Action::Stop(ids("a"))],
        ));
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
}
