//! The stop of an instance that has a cgroup and no stop command: TERM to
//! the cgroup's processes at once, then a single pass over `/proc`.
//!
//! Its processes are listed by the cgroup itself, so the TERM needs no
//! pass. The one pass that follows is asked once the cgroup is empty (or
//! after [`PASS_AFTER`], for processes slow to exit): it finds anything of
//! the instance outside the cgroup (moved out, as root can), which gets its
//! TERM then; and when it finds nothing and was asked after the cgroup was
//! seen empty, it is the confirmation the stop ends with. A stop whose
//! processes honour TERM quickly costs one pass, where listing the members
//! first, then confirming, cost two (a pass reads every process on the
//! machine: with a thousand instances, most of a stop's time).

use std::collections::HashSet;
use std::path::Path;
use std::time::Duration;

use nix::sys::signal::Signal;
use tokio::time::Instant;

use super::identity::{matches_stat, read_stat};
use super::tree::{self, Member};
use super::{ProcessController, ProcessError, cgroup};
use crate::ids::InstanceId;
use crate::storage::agent_records::PidIdentity;

/// How long the pass waits for the cgroup to empty before it is asked
/// anyway: how late a process outside the cgroup may get its TERM.
pub(super) const PASS_AFTER: Duration = Duration::from_millis(50);

/// The processes in the cgroup now, with their start times. The list is
/// read again after the stats: a pid that exited meanwhile and now names a
/// process outside the cgroup (reused) is dropped, so only processes of
/// the cgroup are ever signalled.
pub(super) fn in_cgroup(cg: &Path) -> Vec<Member> {
    let listed: Vec<Member> = cgroup::procs(cg)
        .into_iter()
        .filter_map(|pid| {
            let stat = read_stat(pid).filter(|s| s.is_running())?;
            Some(Member { pid, start_time: stat.start_time })
        })
        .collect();
    let still: HashSet<u32> = cgroup::procs(cg).into_iter().collect();
    listed.into_iter().filter(|m| still.contains(&m.pid)).collect()
}

/// Polls until the cgroup is empty or `until`; true when it is.
async fn empty_by(cg: &Path, until: Instant) -> bool {
    let mut backoff = Duration::from_millis(2);
    loop {
        if cgroup::is_empty(cg) {
            return true;
        }
        let now = Instant::now();
        if now >= until {
            return false;
        }
        tokio::time::sleep_until(until.min(now + backoff)).await;
        backoff = (backoff * 2).min(Duration::from_millis(10));
    }
}

impl ProcessController {
    /// TERM, grace, KILL for an instance in cgroup `cg` (see the module
    /// doc). Returns whether anything of it was running, and whether
    /// everything of it the stop saw was inside the cgroup (the recorded
    /// main process among them, and the pass found nothing besides).
    pub(super) async fn stop_in_cgroup(
        &self,
        instance: &InstanceId,
        known: &[PidIdentity],
        cg: &Path,
        grace: Duration,
    ) -> Result<(bool, bool), ProcessError> {
        let deadline = Instant::now() + grace;
        let mut termed = in_cgroup(cg);
        let listed = termed.len();
        // The recorded main process, should it be outside (identities are
        // checked: a recycled pid is not it).
        for k in known {
            let m = Member { pid: k.pid, start_time: k.start_time };
            if !termed.contains(&m) {
                termed.push(m);
            }
        }
        let n = tree::signal(&termed, Signal::SIGTERM);
        tracing::debug!(%instance, signalled = n, "sent SIGTERM to the cgroup's processes");
        let emptied = empty_by(cg, (Instant::now() + PASS_AFTER).min(deadline)).await;
        // Asked after the cgroup was seen empty (when `emptied`): nothing
        // in it then, so what this pass does not show does not run.
        let found = self.members(instance, known, Some(cg)).await?;
        if found.is_empty() && emptied {
            // Contained when the recorded main process was among the
            // cgroup's own: nothing was signalled from outside it.
            return Ok((!termed.is_empty(), termed.len() == listed));
        }
        // Never a second TERM (some programs take it as "quit now").
        let late: Vec<Member> = found.iter().filter(|m| !termed.contains(m)).copied().collect();
        let n = tree::signal(&late, Signal::SIGTERM);
        tracing::debug!(%instance, signalled = n, "sent SIGTERM to what the pass found besides");
        // Alive and outside the cgroup: its end is watched through passes.
        let inside: HashSet<u32> = cgroup::procs(cg).into_iter().collect();
        let outside = found.iter().any(|m| !inside.contains(&m.pid) && matches_stat(m.pid, m.start_time));
        let contained = (!outside).then_some(cg);
        self.term_then_kill(instance, known, Some(cg), contained, deadline).await?;
        Ok((!termed.is_empty() || !found.is_empty(), false))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::tests::{Fixture, wait_until};
    use super::cgroup;
    use crate::agent::testkit::spec;

    /// A process of the instance moved out of its cgroup (root can) gets
    /// TERM and the grace to honour it, not only KILL once the grace is
    /// over: the stop's pass finds it.
    #[tokio::test]
    async fn a_process_outside_the_cgroup_gets_term_at_stop() {
        assert!(nix::unistd::geteuid().is_root(), "this test needs root (run it as root, as .ci/run does)");
        let f = Fixture::new("outside-term", true);
        assert!(f.ctl.cgroups_enabled(), "root on this machine must get cgroups");
        let flag = f.dir.join("termed");
        let body = format!(
            "sh -c 'trap \"echo yes > {}; exit 0\" TERM; while :; do sleep 0.05; done' &\nexec sleep 1000",
            flag.display()
        );
        f.script("bin/run.sh", &body);
        let mut spec = spec(&["bin/run.sh"]);
        spec.stop_grace_ms = 5000;
        let started = f.ctl.start(&f.start_req(&spec, None)).await.unwrap();
        let cgp = f.cgroup().unwrap();
        wait_until("the loop runs in the cgroup", || cgroup::procs(&cgp).len() >= 2).await;
        let shell = *cgroup::procs(&cgp).iter().find(|p| **p != started.identity.pid).unwrap();
        // Into the cgroup2 mount's root: <mount>/flotilla/<scope>/<instance>.
        let mount = cgp.ancestors().nth(3).unwrap();
        std::fs::write(mount.join("cgroup.procs"), shell.to_string()).unwrap();
        assert!(!cgroup::procs(&cgp).contains(&shell), "{shell} did not leave the cgroup");
        let began = tokio::time::Instant::now();
        assert!(f.ctl.stop(&f.stop_req(&spec, Some(&started.identity))).await.unwrap());
        assert!(flag.exists(), "the process outside the cgroup got no TERM");
        assert!(began.elapsed() < Duration::from_secs(4), "the stop waited out the grace: {:?}", began.elapsed());
        f.assert_nothing_left();
    }
}
