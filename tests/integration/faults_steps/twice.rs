//! Each step twice, on the real system: the master SIGKILLed while a
//! step runs (its script held, so the journal says `Running`), the script
//! let go while no master runs, the master started again. The next master
//! resumes the operation and runs that step again; the end must be that
//! of an uninterrupted run (`as_uninterrupted`): same members, one
//! process each, each start script run as often as it would have been.
//! A hook held at the kill runs exactly twice (the step ran again); a
//! start or a stop runs its script once (the agent answers "already
//! running" / "was not running" the second time).
//!
//! This replaces the in-memory model's "each step twice" test
//! (`operations::world`), which ran each action twice on a model that
//! could not tell.

use std::time::Instant;

use super::{Bench, Kind, as_uninterrupted};
use crate::common::faulty::wait_held;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_step_runs_again_after_a_master_killed_inside_it() {
    each_step_twice("faults-steps-twice", "st", &Kind::ALL, 24).await;
}

/// A member's replace (a scale-out then a scale-in in one operation), each
/// of its scripted steps run twice the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_step_of_a_replace_runs_again_after_a_master_killed_inside_it() {
    each_step_twice("faults-steps-twice-replace", "sr", &[Kind::Replace], 7).await;
}

async fn each_step_twice(env: &str, prefix: &'static str, kinds: &[Kind], scenarios: usize) {
    let mut b = Bench::start(env, prefix).await;
    let mut count = 0;
    for &kind in kinds {
        for (step, what, tag) in kind.scripted() {
            let began = Instant::now();
            let (name, ctl) = b.next();
            let before = b.prepare(kind, &name, &ctl).await;
            ctl.hold(what, tag);
            let earlier = ctl.runs(what, tag);
            let id = b.request(kind, &name, &ctl, before.as_ref()).await;
            let at = format!("{kind:?}, master killed in step {step} ({what} of {tag} held)");
            wait_held(&b.env, &ctl, &id, step, what, tag).await;
            let resumed = b.env.master_log().matches("resuming an operation").count();
            b.env.kill_master();
            ctl.release(what, tag);
            b.env.start_master_again().await;
            b.env.wait_ready().await;
            let op = b.wait(&id).await;
            assert_eq!(op["status"], "Succeeded", "{at}: {op:#}");
            let log = b.env.master_log();
            assert_eq!(log.matches("resuming an operation").count(), resumed + 1, "{at}: not resumed");
            let runs = ctl.runs(what, tag) - earlier;
            // How often an uninterrupted run runs it: once, but a replace
            // re-renders (reloads) its old members twice, growing and
            // shrinking (the new one, a-3, only when shrinking).
            let once = if kind == Kind::Replace && what == "reload" && tag != "a-3" { 2 } else { 1 };
            let expected = if matches!(what, "start" | "stop") { once } else { once + 1 };
            assert_eq!(runs, expected, "{at}: {what} of {tag} ran {runs} times: {:?}", ctl.ran());
            let mut all = before.as_ref().map(super::ids).unwrap_or_default();
            all.extend(as_uninterrupted(&b, kind, &name, &ctl, &at).await);
            b.clean(&name, &all).await;
            b.took(format!("{kind:?} {step}"), began);
            count += 1;
        }
    }
    assert_eq!(count, scenarios);
    b.summary();
}
