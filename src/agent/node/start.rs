//! Starting an instance: its process spawned, recorded and watched, then
//! (a master's start) its settle window or its health check before the
//! start answers; a death before then fails the start.

use super::*;

impl Node {
    /// Starts the instance, answering at once (see [`Self::start_settled`]).
    pub async fn start(self: &Arc<Self>, id: &InstanceId, generation: u64) -> AgentResponse {
        self.start_settled(id, generation, std::time::Duration::ZERO).await
    }

    /// Starts the instance; a foreground process that exits within
    /// `settle` is a failed start.
    pub async fn start_settled(
        self: &Arc<Self>,
        id: &InstanceId,
        generation: u64,
        settle: std::time::Duration,
    ) -> AgentResponse {
        self.start_as(id, generation, settle, Starter::Master).await
    }

    /// A start the restart policy makes after a crash: a process that dies
    /// before it is healthy is one more crash, left to the policy (its
    /// next attempt, or giving up), not a failed start that ends it.
    pub(in crate::agent) async fn start_for_restart(
        self: &Arc<Self>,
        id: &InstanceId,
        generation: u64,
    ) -> AgentResponse {
        self.start_as(id, generation, std::time::Duration::ZERO, Starter::RestartPolicy).await
    }

    async fn start_as(
        self: &Arc<Self>,
        id: &InstanceId,
        generation: u64,
        settle: std::time::Duration,
        starter: Starter,
    ) -> AgentResponse {
        let waited = tokio::time::Instant::now();
        let slot = self.slot(id);
        let mut guard = slot.lock("start").await;
        // The start timeout covers the health check too (see `gate_start`);
        // counted from here, not including the wait for the lock.
        let begun = tokio::time::Instant::now();
        let rec = match admit(&mut guard, id, generation) {
            Ok(rec) => rec,
            Err(refused) => return refused,
        };
        let run_as = match self.run_as_of(rec, FailureKind::Start) {
            Ok(u) => u,
            Err(resp) => return resp,
        };
        rec.generation = generation;
        rec.desired_running = true;
        let dir = self.instance_dir(id);
        let req = StartRequest {
            instance: id,
            dir: &dir,
            spec: &rec.process,
            run_as: &run_as,
            current: rec.pid.as_ref(),
            // The settle window is waited below, once the pid is recorded
            // and the master told of it.
            settle: std::time::Duration::ZERO,
        };
        let started = self.processes.start(&req).await;
        let spawned = tokio::time::Instant::now();
        match started {
            Ok(s) => {
                let pid = s.identity.pid;
                let already = s.already_running;
                rec.pid = Some(s.identity.clone());
                let r = rec.clone();
                if let Err(e) = self.persist(&r).await {
                    return failure(FailureKind::Internal, e);
                }
                let persisted = tokio::time::Instant::now();
                let identity = s.identity.clone();
                if !already {
                    self.watch(id.clone(), s.identity);
                }
                let settled = if already || settle.is_zero() {
                    Ok(())
                } else {
                    self.settle(id, generation, pid, &rec.process, (begun, spawned), settle, s.exit.clone()).await
                };
                let gated = match settled {
                    Ok(()) => self.gate_start(id, rec, &run_as, begun, s.exit).await,
                    Err(resp) => Err(resp),
                };
                if let Err(resp) = gated {
                    if starter == Starter::Master && !self.processes.is_alive(&identity) {
                        // It died before it was healthy: the answer says
                        // the start failed, and what happens next is the
                        // master's (an undo, the operator). Forgetting the
                        // pid keeps the restart policy from also taking
                        // the death for a crash and starting it again.
                        rec.pid = None;
                        let r = rec.clone();
                        let _ = self.persist(&r).await;
                    }
                    return resp;
                }
                let ms = |a: tokio::time::Instant, b: tokio::time::Instant| (b - a).as_secs_f64() * 1000.0;
                tracing::debug!(
                    instance = %id, pid, lock_ms = ms(waited, begun), start_ms = ms(begun, spawned),
                    persist_ms = ms(spawned, persisted), gate_ms = ms(persisted, tokio::time::Instant::now()),
                    "started"
                );
                AgentResponse::Started { pid, already_running: already }
            }
            Err(e) => {
                rec.pid = None;
                let r = rec.clone();
                let _ = self.persist(&r).await;
                process_failure(FailureKind::Start, &e)
            }
        }
    }

    /// The settle window of a master's start: the master hears of the
    /// spawned process at once (it shows it running), and the start
    /// answers once the process has lived `settle` (at most until the start
    /// timeout); a death in the window fails the start with its exit code
    /// and stderr. The instance's lock is held meanwhile, so the exit
    /// watcher does not take that death for a crash to restart.
    #[allow(clippy::too_many_arguments)]
    async fn settle(
        &self,
        id: &InstanceId,
        generation: u64,
        pid: u32,
        spec: &crate::protocol::messages::ProcessSpec,
        (begun, spawned): (tokio::time::Instant, tokio::time::Instant),
        settle: std::time::Duration,
        exit: crate::agent::process::ExitWatch,
    ) -> Result<(), AgentResponse> {
        self.report(AgentEvent::ProcessSpawned { instance: id.clone(), generation, pid });
        // The process's own time alive (from its spawn, not from the lock),
        // within what the start may take in all.
        let until = (begun + std::time::Duration::from_millis(spec.start_timeout_ms.max(1))).min(spawned + settle);
        match tokio::time::timeout_at(until, exit.wait()).await {
            Err(_) => Ok(()),
            Ok(info) => {
                let e = crate::agent::process::ProcessError::StartFailed {
                    exit_code: info.exit_code,
                    signal: info.signal,
                    stderr_tail: info.stderr_tail,
                };
                Err(process_failure(FailureKind::Start, &e))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::agent::process::tree::MARKER_VAR;
    use crate::agent::testkit::{TestNode, marked, spec};
    use crate::protocol::messages::AgentResponse;

    /// An agent killed between a start's spawn and the record of its pid
    /// left the process running, unrecorded: at its next start the agent
    /// kills it (nobody else would watch, stop or report it), and leaves
    /// alone the process it re-adopts.
    async fn orphans_are_killed_at_recover(t: TestNode) {
        let me = crate::agent::process::users::current().name;
        let kept = t.install("orph-kept", &me, spec(&["sleep", "1000"]), &[]).await;
        assert!(matches!(t.node.start(&kept, 2).await, AgentResponse::Started { .. }));
        let kept_pid = marked(&kept);
        assert_eq!(kept_pid.len(), 1, "the started instance runs");
        // The orphan: what the spawn made, its pid never recorded (the
        // record says installed, no pid), and a child of its own.
        let lost = t.install("orph-lost", &me, spec(&["sleep", "1000"]), &[]).await;
        let mut orphan = std::process::Command::new("sh")
            .args(["-c", "sleep 1000 & exec sleep 1000"])
            .env(MARKER_VAR, lost.as_str())
            .spawn()
            .unwrap();
        until("the orphan and its child run", || marked(&lost).len() == 2).await;

        t.node.recover().await.unwrap();

        until("the orphan is killed", || matches!(orphan.try_wait(), Ok(Some(_)))).await;
        until("the orphan's child is gone", || marked(&lost).is_empty()).await;
        assert_eq!(t.persisted(&lost).pid, None, "the record still says nothing runs");
        assert_eq!(marked(&kept), kept_pid, "the re-adopted process was touched");
        let inv = t.node.inventory().await;
        let running = |id: &crate::ids::InstanceId| inv.iter().find(|r| r.instance == *id).map(|r| r.running);
        assert_eq!((running(&kept), running(&lost)), (Some(true), Some(false)));
    }

    /// An instance runs in a session of its own: a process of another
    /// session (here one of the agent's, standing for another instance's)
    /// cannot join its process group, and so cannot be taken for one of
    /// its processes and signalled with it (`tree::collect_in` follows
    /// groups whose leader is gone).
    #[tokio::test]
    async fn an_instance_has_a_session_no_other_process_can_join() {
        let t = TestNode::new();
        let me = crate::agent::process::users::current().name;
        let id = t.install("own-session", &me, spec(&["sleep", "1000"]), &[]).await;
        let AgentResponse::Started { pid, .. } = t.node.start(&id, 2).await else { panic!("not started") };
        let stat = crate::agent::process::identity::read_stat(pid).expect("its stat");
        assert_eq!(stat.pgid, pid as i32, "a group of its own");
        let sid = nix::unistd::getsid(Some(nix::unistd::Pid::from_raw(pid as i32))).unwrap();
        assert_eq!(sid.as_raw(), pid as i32, "a session of its own");
        // Another process asks to join its group, as a hostile one would
        // for itself: refused.
        let joined = std::process::Command::new("python3")
            .args(["-c", "import os, sys; os.setpgid(0, int(sys.argv[1]))", &pid.to_string()])
            .output()
            .expect("python3 (installed by scripts/setup.sh)");
        let said = String::from_utf8_lossy(&joined.stderr);
        assert!(
            !joined.status.success() && said.contains("Operation not permitted"),
            "a process of another session joined its group: {:?} {said}",
            joined.status
        );
    }

    async fn until(what: &str, mut cond: impl FnMut() -> bool) {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !cond() {
            assert!(std::time::Instant::now() < deadline, "not within 5 s: {what}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[tokio::test]
    async fn orphans_are_killed_at_recover_with_process_groups() {
        orphans_are_killed_at_recover(TestNode::new()).await;
    }

    #[tokio::test]
    async fn orphans_are_killed_at_recover_with_cgroups() {
        orphans_are_killed_at_recover(TestNode::with_cgroups()).await;
    }
}
