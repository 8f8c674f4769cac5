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
mod tests;
