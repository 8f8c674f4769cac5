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
            if let Err(resp) = self.stop_processes(id, &r).await {
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
        }
        let dir = self.instance_dir(id);
        if let Err(e) = tokio::fs::remove_dir_all(&dir).await
            && e.kind() != std::io::ErrorKind::NotFound
        {
            return failure(FailureKind::Internal, format!("cannot remove {}: {e}", dir.display()));
        }
        let ops = vec![WriteOp::delete_agent_instance(id), WriteOp::delete_restarts(id), WriteOp::delete_tombstone(id)];
        if let Err(e) = self.store.writer().commit(ops).await {
            return failure(FailureKind::Internal, e.to_string());
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
    use crate::agent::testkit::TestNode;
    use crate::ids::InstanceId;
    use crate::protocol::messages::AgentResponse;

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
