//! Stopping and deleting instances on this node: the stop command (as
//! the instance's user, never the agent's own), TERM and KILL for the
//! rest, the tombstone that finishes a delete after a crash, and
//! stopping everything when the agent exits.

use super::*;

/// What stopping an instance's processes did.
struct Stopped {
    was_running: bool,
    /// Why its stop command was not run, when it was not.
    skipped: Option<String>,
}

impl Node {
    pub async fn stop(&self, id: &InstanceId, generation: u64) -> AgentResponse {
        let slot = self.slot(id);
        let mut guard = slot.lock("stop").await;
        if guard.is_none() {
            // Never installed here (its install failed), or deleted: nothing
            // of it runs, so the stop is done. Refusing it would leave a
            // cluster whose create failed at install undeletable.
            tracing::info!(instance = %id, generation, "stop of an instance not installed on this node: nothing to stop");
            return AgentResponse::Stopped { was_running: false };
        }
        let rec = match admit(&mut guard, id, generation) {
            Ok(rec) => rec,
            Err(refused) => return refused,
        };
        rec.generation = generation;
        // Intent first: the exit watcher sees desired_running == false and
        // does not report this exit as unexpected.
        rec.desired_running = false;
        let r = rec.clone();
        if let Err(e) = self.persist(&r).await {
            return failure(FailureKind::Internal, e);
        }
        match self.stop_processes(id, rec).await {
            Ok(stopped) => {
                rec.pid = None;
                let r = rec.clone();
                if let Err(e) = self.persist(&r).await {
                    return failure(FailureKind::Internal, e);
                }
                // Stopped, but not as the package asked: the operator hears.
                match stopped.skipped {
                    Some(reason) => failure(FailureKind::Stop, reason),
                    None => AgentResponse::Stopped { was_running: stopped.was_running },
                }
            }
            Err(resp) => resp,
        }
    }

    /// Stops the instance's processes: its stop command, then TERM and
    /// KILL for what is left. A root agent runs that command as the
    /// instance's user and never as its own: when the user no longer
    /// resolves (removed from the node), the command is skipped and the
    /// tree gets TERM, then KILL after the grace; `skipped` says so.
    async fn stop_processes(&self, id: &InstanceId, rec: &AgentInstanceRecord) -> Result<Stopped, AgentResponse> {
        let resolved =
            if nix::unistd::geteuid().is_root() { users::resolve(&rec.run_as) } else { Ok(users::current()) };
        let (run_as, skipped, spec) = match resolved {
            Ok(u) => (u, None, std::borrow::Cow::Borrowed(&rec.process)),
            Err(e) => {
                let reason = format!(
                    "run_as {}: {e}; its stop command was not run (never as the agent's own user): its processes got TERM, then KILL after {} ms",
                    rec.run_as, rec.process.stop_grace_ms
                );
                let mut spec = rec.process.clone();
                spec.stop = None;
                // Only the stop command runs as `run_as`, and there is none.
                (users::current(), Some(reason), std::borrow::Cow::Owned(spec))
            }
        };
        let dir = self.instance_dir(id);
        let req = StopRequest { instance: id, dir: &dir, spec: &spec, run_as: &run_as, current: rec.pid.as_ref() };
        let was_running = self.processes.stop(&req).await.map_err(|e| process_failure(FailureKind::Stop, &e))?;
        if let Some(reason) = &skipped {
            tracing::warn!(instance = %id, "{reason}");
        }
        Ok(Stopped { was_running, skipped })
    }

    pub async fn delete(&self, id: &InstanceId, generation: u64) -> AgentResponse {
        if !id.is_safe_path_component() {
            return failure(FailureKind::BadRequest, format!("instance id {id:?} is not a safe name"));
        }
        let slot = self.slot(id);
        let mut guard = slot.lock("delete").await;
        if let Some(rec) = guard.as_ref()
            && generation < rec.generation
        {
            return stale(id, generation, rec.generation);
        }
        self.restarts.forget(id);
        let existed = guard.is_some() || self.instance_dir(id).exists();
        // The tombstone makes the delete finish after a crash.
        let tomb = Tombstone { version: RECORD_VERSION, id: id.clone(), generation };
        let op = match WriteOp::put_tombstone(&tomb) {
            Ok(op) => op,
            Err(e) => return failure(FailureKind::Internal, e.to_string()),
        };
        if let Err(e) = self.store.writer().commit(vec![op]).await {
            return failure(FailureKind::Internal, e.to_string());
        }
        if let Some(rec) = guard.as_mut() {
            rec.desired_running = false;
            let r = rec.clone();
            if self.processes.confirmed_stopped(id).await {
                // The usual case (stop, then delete): no pass over /proc.
                tracing::debug!(instance = %id, "its stop confirmed that nothing of it runs");
            } else if let Err(resp) = self.stop_processes(id, &r).await {
                return resp;
            }
        } else {
            // No record (e.g. an install that never completed): still make
            // sure nothing of the instance runs.
            let spec = crate::protocol::messages::ProcessSpec {
                start: vec![],
                stop: None,
                pidfile: None,
                stop_grace_ms: 1000,
                start_timeout_ms: 1000,
                env: vec![],
                health: None,
                limits: None,
            };
            let me = users::current();
            let dir = self.instance_dir(id);
            let req = StopRequest { instance: id, dir: &dir, spec: &spec, run_as: &me, current: None };
            let _ = self.processes.stop(&req).await;
            self.processes.forget_confirmation(id);
        }
        // Through directory fds, never following a link the instance left
        // in its tree (`agent::beneath`).
        let dir = self.instance_dir(id);
        let removed = tokio::task::spawn_blocking(move || crate::agent::beneath::tree::remove_path(&dir)).await;
        match removed {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return failure(FailureKind::Internal, crate::error::ErrorChain(&e).to_string()),
            Err(e) => return failure(FailureKind::Internal, format!("the removal task failed: {e}")),
        }
        let ops = vec![WriteOp::delete_agent_instance(id), WriteOp::delete_restarts(id), WriteOp::delete_tombstone(id)];
        if let Err(e) = self.store.writer().commit(ops).await {
            return failure(FailureKind::Internal, e.to_string());
        }
        // Its cluster's dynamic user is released with its last instance
        // here (a failure only keeps the uid until the next boot prunes it).
        if let Err(e) = self.users.leave(&self.store, id).await {
            tracing::warn!(instance = %id, error = %e, "cannot release its dynamic user");
        }
        *guard = None;
        drop(guard);
        lock(&self.slots).remove(id);
        AgentResponse::Deleted { existed }
    }

    /// Stops every instance (dev mode's Ctrl-C: leave no process behind).
    pub async fn stop_all(&self) {
        // First, so no exit from here on is taken for a crash: a watcher
        // that already saw one and waits out its restart delay finds the
        // flag and starts nothing.
        self.closing.store(true, std::sync::atomic::Ordering::SeqCst);
        let ids: Vec<InstanceId> = lock(&self.slots).keys().cloned().collect();
        let mut tasks = Vec::new();
        for id in ids {
            tasks.push(async move {
                let slot = self.slot(&id);
                let guard = slot.lock("stop all").await;
                // The record still says "wanted running" (and the watcher
                // stores it so): the agent's next start brings it back.
                if let Some(rec) = guard.as_ref()
                    && let Err(AgentResponse::Failed(f)) = self.stop_processes(&id, rec).await
                {
                    tracing::error!(instance = %id, error = %f.message, "cannot stop instance at exit");
                }
            });
        }
        futures::future::join_all(tasks).await;
    }
}

#[cfg(test)]
mod tests {
    use crate::agent::testkit::{TestNode, marked, spec};
    use crate::ids::InstanceId;
    use crate::protocol::messages::AgentResponse;

    /// An installed instance running `sleep 1000` in the foreground.
    async fn running(t: &TestNode, name: &str) -> InstanceId {
        let me = crate::agent::process::users::current().name;
        let id = t.install(name, &me, spec(&["sleep", "1000"]), &[]).await;
        assert!(matches!(t.node.start(&id, 2).await, AgentResponse::Started { .. }));
        assert_eq!(marked(&id).len(), 1, "the instance runs");
        id
    }

    /// After a delete: nothing of the instance runs, its directory and
    /// cgroup are gone, the node holds nothing of it.
    async fn assert_deleted(t: &TestNode, id: &InstanceId) {
        assert_eq!(marked(id), Vec::<u32>::new(), "a process of the deleted instance survives");
        assert!(!t.node.instance_dir(id).exists(), "the instance directory is left");
        if let Some(cg) = t.node.processes.cgroup_of(id) {
            assert!(!cg.exists(), "cgroup {} is left", cg.display());
        }
        assert!(t.node.inventory().await.iter().all(|r| r.instance != *id));
    }

    /// Stop, then delete (a scale-in): the stop saw the cgroup empty and a
    /// pass find nothing, so the delete takes no pass of its own.
    #[tokio::test]
    async fn a_delete_after_a_confirmed_stop_takes_no_pass() {
        let t = TestNode::with_cgroups();
        let id = running(&t, "del-skip").await;
        assert_eq!(t.node.stop(&id, 3).await, AgentResponse::Stopped { was_running: true });
        assert_eq!(marked(&id), Vec::<u32>::new());
        let passes = t.node.processes.passes_over_proc();
        assert_eq!(t.node.delete(&id, 4).await, AgentResponse::Deleted { existed: true });
        assert_eq!(t.node.processes.passes_over_proc(), passes, "the delete scanned /proc again");
        assert_deleted(&t, &id).await;
    }

    /// Stop, then start (a cluster stopped and started): the stop confirmed
    /// nothing of it runs, so the start looks for no leftover (no pass),
    /// and starts it. Once started, the next start after an unconfirmed
    /// end looks again.
    #[tokio::test]
    async fn a_start_after_a_confirmed_stop_takes_no_pass() {
        let t = TestNode::with_cgroups();
        let id = running(&t, "start-skip").await;
        assert_eq!(t.node.stop(&id, 3).await, AgentResponse::Stopped { was_running: true });
        let passes = t.node.processes.passes_over_proc();
        assert!(matches!(t.node.start(&id, 4).await, AgentResponse::Started { already_running: false, .. }));
        assert_eq!(t.node.processes.passes_over_proc(), passes, "the start scanned /proc for leftovers");
        assert_eq!(marked(&id).len(), 1, "the instance runs");
        // Killed behind the agent's back (no stop confirmed it): the
        // restart's start looks for leftovers again.
        let pid = marked(&id)[0];
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGKILL).unwrap();
        for _ in 0..250 {
            if marked(&id).is_empty() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        let passes = t.node.processes.passes_over_proc();
        assert!(matches!(t.node.start(&id, 5).await, AgentResponse::Started { already_running: false, .. }));
        assert!(t.node.processes.passes_over_proc() > passes, "a start without a confirmed stop took no pass");
    }

    /// Started again after its stop: the delete stops it, with its passes.
    #[tokio::test]
    async fn a_delete_after_a_later_start_stops_the_instance() {
        let t = TestNode::with_cgroups();
        let id = running(&t, "del-restarted").await;
        assert_eq!(t.node.stop(&id, 3).await, AgentResponse::Stopped { was_running: true });
        assert!(matches!(t.node.start(&id, 4).await, AgentResponse::Started { .. }));
        assert_eq!(marked(&id).len(), 1);
        let passes = t.node.processes.passes_over_proc();
        assert_eq!(t.node.delete(&id, 5).await, AgentResponse::Deleted { existed: true });
        assert!(t.node.processes.passes_over_proc() > passes, "the delete took no pass");
        assert_deleted(&t, &id).await;
    }

    /// A process in the instance's cgroup again after a confirmed stop
    /// (here put there by hand): the delete does not trust the stop, finds
    /// it and stops it.
    #[tokio::test]
    async fn a_delete_finds_a_process_in_the_cgroup_after_the_stop() {
        let t = TestNode::with_cgroups();
        let id = running(&t, "del-cgroup").await;
        assert_eq!(t.node.stop(&id, 3).await, AgentResponse::Stopped { was_running: true });
        let cg = t.node.processes.cgroup_of(&id).unwrap();
        assert!(!cg.exists(), "the stop removes the cgroup");
        std::fs::create_dir(&cg).unwrap();
        let mut stray = tokio::process::Command::new("sleep").arg("1000").kill_on_drop(true).spawn().unwrap();
        let pid = stray.id().unwrap();
        std::fs::write(cg.join("cgroup.procs"), pid.to_string()).unwrap();
        let passes = t.node.processes.passes_over_proc();
        assert_eq!(t.node.delete(&id, 4).await, AgentResponse::Deleted { existed: true });
        assert!(t.node.processes.passes_over_proc() > passes, "the delete took no pass");
        let ended = tokio::time::timeout(std::time::Duration::from_secs(5), stray.wait()).await;
        assert!(ended.is_ok(), "the process in the instance's cgroup survives its delete");
        assert_deleted(&t, &id).await;
    }

    /// The main process outside the instance's cgroup when it is stopped
    /// (moved out here; an agent without cgroups started it, in life): the
    /// stop cannot vouch for what it did not contain, so the delete looks
    /// again.
    #[tokio::test]
    async fn a_stop_that_signalled_outside_the_cgroup_confirms_nothing() {
        let t = TestNode::with_cgroups();
        let id = running(&t, "del-outside").await;
        let cg = t.node.processes.cgroup_of(&id).unwrap();
        let main = marked(&id)[0];
        // Into the cgroup2 mount's root: <mount>/flotilla/<scope>/<instance>.
        let mount = cg.ancestors().nth(3).unwrap();
        std::fs::write(mount.join("cgroup.procs"), main.to_string()).unwrap();
        assert!(!crate::agent::process::cgroup::procs(&cg).contains(&main), "{main} did not leave the cgroup");
        assert_eq!(t.node.stop(&id, 3).await, AgentResponse::Stopped { was_running: true });
        assert_eq!(marked(&id), Vec::<u32>::new());
        let passes = t.node.processes.passes_over_proc();
        assert_eq!(t.node.delete(&id, 4).await, AgentResponse::Deleted { existed: true });
        assert!(
            t.node.processes.passes_over_proc() > passes,
            "the delete trusted a stop that signalled outside the cgroup"
        );
        assert_deleted(&t, &id).await;
    }

    /// Without a cgroup a pass alone cannot be sure (a process mid-exec
    /// hides its marker), so the delete looks again.
    #[tokio::test]
    async fn without_cgroups_a_delete_after_a_stop_looks_again() {
        let t = TestNode::new();
        let id = running(&t, "del-no-cgroup").await;
        assert_eq!(t.node.stop(&id, 3).await, AgentResponse::Stopped { was_running: true });
        let passes = t.node.processes.passes_over_proc();
        assert_eq!(t.node.delete(&id, 4).await, AgentResponse::Deleted { existed: true });
        assert!(t.node.processes.passes_over_proc() > passes, "the delete took no pass");
        assert_deleted(&t, &id).await;
    }

    /// Stop and delete of an instance this node does not hold (its install
    /// failed, or it was deleted) are done, not refused: `Error → delete`
    /// always works.
    #[tokio::test]
    async fn stop_and_delete_of_an_instance_not_held_succeed() {
        let t = TestNode::new();
        let id = InstanceId::new("never-installed");
        assert_eq!(t.node.stop(&id, 3).await, AgentResponse::Stopped { was_running: false });
        let destroy = t.node.run_hook(&id, 3, "destroy", &["bin/destroy.sh".to_string()], 1000).await;
        assert!(matches!(destroy, AgentResponse::HookDone { exit_code: 0, .. }), "{destroy:?}");
        assert_eq!(t.node.delete(&id, 4).await, AgentResponse::Deleted { existed: false });
        assert_eq!(t.node.stop(&id, 5).await, AgentResponse::Stopped { was_running: false }, "after the delete");
        assert!(t.node.inventory().await.is_empty());
    }
}
