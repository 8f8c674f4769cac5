//! Stopping an instance's whole process tree: the spec's stop command (as the
//! run-as user, bounded by the grace period), TERM to every process, the
//! grace period, then KILL (`cgroup.kill` plus each remaining process) until
//! nothing is left, and finally the removal of its cgroups.

use std::path::Path;
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::time::Instant;

use super::spawn::{self, Launch};
use super::{ProcessController, ProcessError, StopRequest, cgroup, tree};
use crate::ids::InstanceId;
use crate::storage::agent_records::PidIdentity;

/// How long KILLed processes may take to disappear before stop gives up.
const KILL_WAIT: Duration = Duration::from_secs(5);
const FIRST_BACKOFF: Duration = Duration::from_millis(5);
const MAX_BACKOFF: Duration = Duration::from_millis(50);

/// True when every one of `members` is in the cgroup at `cg`.
fn all_inside(cg: &Path, members: &[tree::Member]) -> bool {
    let inside: std::collections::HashSet<u32> = cgroup::procs(cg).into_iter().collect();
    members.iter().all(|m| inside.contains(&m.pid))
}

impl ProcessController {
    /// Stops the whole tree of the instance. Idempotent: returns whether
    /// anything was running (`false` when nothing was, doing nothing else
    /// than removing a leftover empty cgroup).
    pub async fn stop(&self, req: &StopRequest<'_>) -> Result<bool, ProcessError> {
        // A stop that fails confirms nothing.
        self.confirmed().remove(req.instance);
        let cg = self.cgroup_of(req.instance);
        let cg = cg.as_deref();
        let known = self.known_alive(req.instance, req.current);
        let grace = Duration::from_millis(req.spec.stop_grace_ms);
        let stop_command = req.spec.stop.as_ref().filter(|a| !a.is_empty());
        // Whether everything of the instance this stop saw was inside its
        // cgroup: only then may it confirm (see `confirm`).
        let mut contained_all = false;
        let was_running = match (cg, stop_command) {
            (Some(cg), None) => {
                let (was, contained) = self.stop_in_cgroup(req.instance, &known, cg, grace).await?;
                contained_all = contained;
                was
            }
            _ => {
                let mut members = self.members(req.instance, &known, cg).await?;
                if members.is_empty() {
                    self.finish(req.instance, cg).await;
                    return Ok(false);
                }
                if let Some(argv) = stop_command {
                    self.run_stop_command(req, argv, grace).await;
                    // What the stop command left (and anything it started).
                    members = self.members(req.instance, &known, cg).await?;
                }
                if !members.is_empty() {
                    // Before the signal: afterwards the quick ones are gone already.
                    let contained = cg.filter(|cg| all_inside(cg, &members));
                    let n = tree::signal(&members, Signal::SIGTERM);
                    tracing::debug!(instance = %req.instance, signalled = n, "sent SIGTERM");
                    self.term_then_kill(req.instance, &known, cg, contained, Instant::now() + grace).await?;
                }
                true
            }
        };
        self.finish(req.instance, cg).await;
        if contained_all {
            self.confirm(req.instance, cg);
        }
        Ok(was_running)
    }

    /// After the TERM: waits until nothing of the instance runs, at most
    /// until `deadline`, then KILLs what is left. An error when something
    /// survives the KILL or `/proc` cannot be read.
    pub(super) async fn term_then_kill(
        &self,
        instance: &InstanceId,
        known: &[PidIdentity],
        cg: Option<&Path>,
        contained: Option<&Path>,
        deadline: Instant,
    ) -> Result<(), ProcessError> {
        if self.wait_gone(instance, known, cg, contained, deadline).await? {
            return Ok(());
        }
        tracing::info!(%instance, "grace period over: sending SIGKILL");
        let remaining = self.kill_tree(instance, known, cg).await?;
        if remaining.is_empty() {
            Ok(())
        } else {
            Err(ProcessError::Stop { instance: instance.to_string(), remaining })
        }
    }

    /// Records that a stop just ended with nothing of the instance left:
    /// every way out of [`Self::stop`] with `Ok` ends with a pass over
    /// `/proc` that found nothing, taken after the last signal. Recorded
    /// only when everything of the instance the stop saw was inside its
    /// cgroup, and the cgroup is empty (or removed): a process outside it
    /// (started by an agent without cgroups and adopted, or moved out) can
    /// hide from a pass (mid-`exec`), and only the delete's own pass would
    /// catch it.
    fn confirm(&self, instance: &InstanceId, cg: Option<&Path>) {
        if cg.is_some_and(cgroup::is_empty) {
            self.confirmed().insert(instance.clone());
        }
    }

    /// For a delete: true when the instance's last stop in this
    /// controller's lifetime confirmed that nothing of it runs (see
    /// [`Self::confirm`]), no start has begun since, and its cgroup is
    /// still empty (or gone). Then nothing of it can run: its processes
    /// were all inside the cgroup when it emptied (the pass saw none
    /// outside), their descendants are born inside it, and only a start
    /// creates it again. The delete then skips its own pass over `/proc`;
    /// leftover cgroups are removed as a stop would. Forgets the
    /// confirmation either way (the delete is the instance's last word).
    pub async fn confirmed_stopped(&self, instance: &InstanceId) -> bool {
        let was = self.confirmed().remove(instance);
        let cg = self.cgroup_of(instance);
        if !was || !cg.as_deref().is_some_and(cgroup::is_empty) {
            return false;
        }
        self.finish(instance, cg.as_deref()).await;
        true
    }

    /// Forgets a stop's confirmation without using it: a stop whose
    /// instance has no record (a leftover's, an unrecorded instance's) must
    /// not leave an entry behind for the agent's lifetime.
    pub fn forget_confirmation(&self, instance: &InstanceId) {
        self.confirmed().remove(instance);
    }

    /// KILLs whatever runs of `instances`, which the agent holds no live
    /// process of (see `Node::recover`), and removes their cgroups. Two
    /// passes over `/proc` a moment apart find them for all at once (a
    /// process in the middle of `exec` can hide its marker from one, as
    /// [`Self::kill_tree`] says); those that have any are killed together,
    /// so the whole takes at most about [`KILL_WAIT`] however many there
    /// are. Answers each of those with how many processes it had, or why
    /// some survive; an error when `/proc` cannot be read.
    pub async fn kill_orphans(
        &self,
        instances: &[InstanceId],
    ) -> Result<Vec<(InstanceId, Result<usize, ProcessError>)>, ProcessError> {
        let scan = || async { self.scanner.fresh().await.map_err(|e| ProcessError::io("scanning /proc", e)) };
        let first = scan().await?;
        tokio::time::sleep(FIRST_BACKOFF).await;
        let second = scan().await?;
        let found = instances.iter().filter_map(|id| {
            let cg = self.cgroup_of(id);
            let mut seen = tree::collect_in(&first, id, &[], cg.as_deref());
            seen.extend(tree::collect_in(&second, id, &[], cg.as_deref()));
            seen.sort();
            seen.dedup();
            (!seen.is_empty()).then_some((id, cg, seen.len()))
        });
        let kills = found.map(|(id, cg, n)| async move {
            let killed = self.kill_all_of(id, cg.as_deref()).await;
            if killed.is_ok() {
                self.finish(id, cg.as_deref()).await;
            }
            (id.clone(), killed.map(|()| n))
        });
        Ok(futures::future::join_all(kills).await)
    }

    /// [`Self::kill_tree`] of what runs of the instance (no main process
    /// known); an error naming what survives it.
    pub(super) async fn kill_all_of(&self, instance: &InstanceId, cg: Option<&Path>) -> Result<(), ProcessError> {
        let remaining = self.kill_tree(instance, &[], cg).await?;
        if remaining.is_empty() {
            Ok(())
        } else {
            Err(ProcessError::Stop { instance: instance.to_string(), remaining })
        }
    }

    /// KILLs everything of the instance until nothing is left (at most a few
    /// seconds). Returns the pids that survived; an error when `/proc`
    /// cannot be read (then what survives is unknown).
    pub(super) async fn kill_tree(
        &self,
        instance: &InstanceId,
        known: &[PidIdentity],
        cg: Option<&Path>,
    ) -> Result<Vec<u32>, ProcessError> {
        let deadline = Instant::now() + KILL_WAIT;
        let mut backoff = FIRST_BACKOFF;
        let mut empty_once = false;
        loop {
            if let Some(cg) = cg
                && let Err(e) = cgroup::kill_all(cg)
            {
                tracing::warn!(cgroup = %cg.display(), error = %e, "cgroup.kill failed");
            }
            let members = self.members(instance, known, cg).await?;
            // Done only after two empty scans a moment apart: a process in
            // the middle of exec (a backgrounded `sleep &` of a script that
            // just exited) can briefly hide its environment, and with it
            // the marker, from one scan; it ran on after the kill (seen once
            // in CI, a failed start's `sleep 1000 &` left running).
            if members.is_empty() {
                if empty_once {
                    return Ok(Vec::new());
                }
                empty_once = true;
                tokio::time::sleep(FIRST_BACKOFF).await;
                continue;
            }
            empty_once = false;
            tree::signal(&members, Signal::SIGKILL);
            if Instant::now() >= deadline {
                return Ok(members.iter().map(|m| m.pid).collect());
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }

    /// Runs the spec's stop command in its own process group (not in the
    /// instance's tree), at most `grace`; its failure is logged, not fatal:
    /// TERM and KILL follow anyway.
    async fn run_stop_command(&self, req: &StopRequest<'_>, argv: &[String], grace: Duration) {
        let logs = match spawn::open_logs(req.dir, req.run_as) {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(instance = %req.instance, error = %crate::error::ErrorChain(&e), "cannot run the stop command");
                return;
            }
        };
        let launch = Launch {
            argv,
            dir: req.dir,
            env: &req.spec.env,
            marker: None,
            run_as: req.run_as,
            cgroup_procs: &[],
            stdout: &logs.stdout,
            stderr: &logs.stderr,
        };
        let mut child = match spawn::spawn(&launch) {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(instance = %req.instance, error = %crate::error::ErrorChain(&e), "cannot run the stop command");
                return;
            }
        };
        match tokio::time::timeout(grace, child.wait()).await {
            Ok(Ok(status)) if status.success() => {}
            Ok(Ok(status)) => tracing::warn!(
                instance = %req.instance,
                status = %status,
                stderr = %spawn::tail(&logs.stderr, logs.stderr_start),
                "the stop command failed"
            ),
            Ok(Err(e)) => tracing::warn!(instance = %req.instance, error = %e, "cannot wait for the stop command"),
            Err(_) => {
                tracing::warn!(instance = %req.instance, grace_ms = grace.as_millis() as u64, "the stop command did not finish within the grace period");
                // Not reaped yet, so its pid still names the group we created.
                if let Some(pgid) = child.id().and_then(|p| i32::try_from(p).ok()) {
                    let _ = killpg(Pid::from_raw(pgid), Signal::SIGKILL);
                }
                let _ = child.wait().await;
            }
        }
    }

    /// After everything is gone: removes the cgroups (its own and its limit
    /// cgroups) and forgets the process.
    async fn finish(&self, instance: &InstanceId, cg: Option<&Path>) {
        if let Some(cg) = cg
            && let Err(e) = cgroup::remove(cg).await
        {
            tracing::warn!(cgroup = %cg.display(), error = %e, "cannot remove the instance's cgroup");
        }
        self.remove_limit_cgroups(instance).await;
        self.tracked().remove(instance);
    }

    /// Waits until nothing of the instance runs, or `deadline`. True when
    /// gone; an error when `/proc` cannot be read.
    async fn wait_gone(
        &self,
        instance: &InstanceId,
        known: &[PidIdentity],
        cg: Option<&Path>,
        mut contained: Option<&Path>,
        deadline: Instant,
    ) -> Result<bool, ProcessError> {
        // `contained`: everything signalled was inside this cgroup (its
        // descendants are born inside it too), so the cgroup is watched
        // until it is empty, and one pass over /proc then confirms (a
        // process that moved itself out, as root can, is not missed).
        // Otherwise, passes all along.
        let mut backoff = FIRST_BACKOFF;
        loop {
            let gone = match contained {
                Some(cg) if !cgroup::is_empty(cg) => false,
                _ => {
                    let left = self.members(instance, known, cg).await?;
                    // Something outside the cgroup: from now on, passes.
                    contained = contained.filter(|_| left.is_empty());
                    left.is_empty()
                }
            };
            if gone {
                return Ok(true);
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(false);
            }
            tokio::time::sleep_until(deadline.min(now + backoff)).await;
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }
}
