//! How an instance actor applies what its agent observed (an exit, a
//! restart by the agent) to the record, durably.

use super::*;

impl InstanceActor {
    /// What an observation means for the record, applied durably; answers
    /// whether the instance newly failed (`None`: not applied).
    pub(super) async fn apply(&self, observation: Observation) -> Option<bool> {
        let (status, desired, pid, node, generation) = {
            let r = self.record.borrow();
            (r.status, r.desired, r.pid, r.node.clone(), r.generation)
        };
        if let Observation::Inventory { generation: seen, connection: Some(connection), .. } = &observation {
            // A command sent on this connection (or a later one) came
            // after the inventory was taken: applying it would mark a
            // healthy instance Lost or Failed. A command sent on an
            // earlier connection is in it if the agent ever got it (the
            // agent reports only once its last connection's requests have
            // finished), so a lower generation there means the command
            // never arrived: the inventory is the truth, not the command.
            // Nor does a replaced connection's inventory, arriving late,
            // override a newer one's.
            let entry = self.env.shared.read_model.node(&node);
            if self.forgotten.get() || entry.is_some_and(|n| !n.inventory_applies(&self.id(), *connection)) {
                tracing::debug!(instance = %self.id(), ?seen, generation, connection, "an inventory older than a command or an inventory since; ignored");
                return Some(false);
            }
        }
        // Decide the new (status, pid, error) from what was observed; None
        // when the observation changes nothing.
        let change: Option<(InstanceStatus, Option<u32>, Option<String>)> = match observation {
            Observation::Exited { pid: exited, description, restarting } => {
                let status = if restarting { InstanceStatus::Restarting } else { InstanceStatus::Failed };
                (pid == Some(exited) && desired == DesiredState::Running).then_some((status, None, Some(description)))
            }
            Observation::Restarted { pid: Some(new), .. } if desired == DesiredState::Running && pid.is_none() => {
                Some((InstanceStatus::Running, Some(new), None))
            }
            Observation::Restarted { pid: None, error: Some(e) }
                if desired == DesiredState::Running
                    && matches!(status, InstanceStatus::Restarting | InstanceStatus::Starting)
                    && pid.is_none() =>
            {
                Some((InstanceStatus::Failed, None, Some(e)))
            }
            // What runs (or may) there is unknown now; one that failed,
            // or is not placed yet or being deleted, says enough already.
            Observation::NodeDown { silent_for }
                if matches!(
                    status,
                    InstanceStatus::Installing
                        | InstanceStatus::Installed
                        | InstanceStatus::Starting
                        | InstanceStatus::Running
                        | InstanceStatus::Restarting
                        | InstanceStatus::Stopping
                        | InstanceStatus::Stopped
                ) =>
            {
                Some((
                    InstanceStatus::Lost,
                    None,
                    Some(format!(
                        "node {node} is down: no word from its agent for {} s; its process may still run there",
                        silent_for.as_secs()
                    )),
                ))
            }
            // Lost while its node was down, and held but not running when
            // the agent came back: what the operator wanted decides.
            Observation::Inventory { present: true, running: false, .. } if status == InstanceStatus::Lost => {
                Some(match desired {
                    DesiredState::Running => (
                        InstanceStatus::Failed,
                        None,
                        Some(format!("not running on node {node} when its agent reconnected")),
                    ),
                    DesiredState::Stopped => (InstanceStatus::Stopped, None, None),
                    DesiredState::Installed => (InstanceStatus::Installed, None, None),
                    DesiredState::Deleted => (InstanceStatus::Deleting, None, None),
                })
            }
            Observation::Inventory { present: false, .. }
                if !matches!(status, InstanceStatus::Pending | InstanceStatus::Deleting) =>
            {
                Some((InstanceStatus::Lost, None, Some(format!("node {node} no longer holds this instance"))))
            }
            Observation::Inventory { running: true, pid: seen, .. }
                if status != InstanceStatus::Running || pid != seen =>
            {
                Some((InstanceStatus::Running, seen, None))
            }
            // Running, or Starting with a restart the agent never reported
            // (it disconnected or restarted meanwhile).
            Observation::Inventory { present: true, running: false, .. }
                if matches!(
                    status,
                    InstanceStatus::Running | InstanceStatus::Starting | InstanceStatus::Restarting
                ) =>
            {
                Some((
                    InstanceStatus::Failed,
                    None,
                    Some(format!("not running on node {node} when its agent reconnected")),
                ))
            }
            _ => None,
        };
        let Some((status, pid, error)) = change else {
            return Some(false);
        };
        let failed = matches!(status, InstanceStatus::Failed | InstanceStatus::Lost);
        if status == InstanceStatus::Lost {
            // Its node no longer holds it: nothing of its files is known.
            self.written.set(None);
        }
        let change = |r: &mut InstanceRecord| {
            r.status = status;
            r.pid = pid;
            if error.is_some() {
                r.last_error = error.clone();
            }
        };
        let saved = if failed { self.save_failure(change).await } else { self.save(change).await };
        match saved {
            Ok(()) => Some(failed),
            // Forgotten meanwhile: nothing to record, nothing owed.
            Err(_) if self.forgotten.get() => Some(false),
            Err(e) => {
                tracing::error!(instance = %self.id(), error = %e, "cannot record an observation");
                None
            }
        }
    }
}
