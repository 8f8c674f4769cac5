//! A cluster's members failing: what an agent observed about an instance
//! (applied durably, then escalated if it failed), the `Error` status the
//! supervisor sends back, and the failures kept while an operation runs.

use super::*;

/// What an agent observed about one of our instances (a report, routed by
/// its node manager; the inventory of a reconnect, by the supervisor).
/// `ack` is sent once the observation is applied and durable.
#[derive(Message)]
#[rtype(result = "()")]
pub struct InstanceObserved {
    pub instance: InstanceId,
    pub observation: Observation,
    pub ack: Option<Ack>,
    pub slot: Reservation,
}

/// From the supervisor, after an escalation: show `Error` with the reason.
#[derive(Message)]
#[rtype(result = "()")]
pub struct EnterError {
    pub description: String,
    pub operation: Option<OperationId>,
    /// The member whose failure it is, if one.
    pub instance: Option<InstanceId>,
    pub slot: Reservation,
}

/// A member's failure that came while an operation ran: escalated when the
/// operation has ended, if the cluster is `Active` then and the member
/// still failed (the operation did not put it right).
pub(super) struct Deferred {
    instance: Option<InstanceId>,
    description: String,
}

impl ClusterActor {
    /// Escalates the member failures that came while `op` ran and that it
    /// did not put right, now that the cluster is free (an `Active`
    /// cluster only: one the operation left in `Error` or stopped says so
    /// already).
    pub(super) fn escalate_deferred(&mut self, op: &OperationRecord) {
        let deferred = std::mem::take(&mut self.deferred);
        let core = self.core.borrow();
        if deferred.is_empty() || core.record.operation.is_some() || core.record.status != ClusterStatus::Active {
            return;
        }
        let still: Vec<String> = deferred
            .into_iter()
            .filter(|d| match &d.instance {
                Some(id) => core.instances.get(id).is_some_and(|h| {
                    matches!(
                        h.record().status,
                        crate::storage::records::InstanceStatus::Failed | crate::storage::records::InstanceStatus::Lost
                    )
                }),
                None => true,
            })
            .map(|d| d.description)
            .collect();
        if still.is_empty() {
            return;
        }
        let name = core.record.name.clone();
        let description = format!("while operation {} ({:?}) ran: {}", op.id, op.kind, still.join("; "));
        tracing::warn!(cluster = %name, reason = %description, "member failures during an operation, escalated now that it ended");
        let slot = Reservation::counted(&self.shared.supervisor);
        self.supervisor.do_send(Escalate {
            cluster: name,
            operation: None,
            instance: None,
            description,
            recorded: false,
            slot,
        });
    }

    /// Keeps a member's failure for when the running operation has ended.
    pub(super) fn defer(&mut self, instance: Option<InstanceId>, description: String) {
        let (name, running) = {
            let c = self.core.borrow();
            (c.record.name.clone(), c.record.operation)
        };
        tracing::warn!(cluster = %name, operation = ?running, reason = %description, "a member failed while an operation runs; escalated when it ends unless the operation puts it right");
        self.stats.end(Some(description.clone()));
        self.deferred.push(Deferred { instance, description });
    }
}

impl Handler<InstanceObserved> for ClusterActor {
    type Result = ResponseActFuture<Self, ()>;

    fn handle(&mut self, msg: InstanceObserved, _ctx: &mut Context<Self>) -> Self::Result {
        let InstanceObserved { instance, observation, ack, slot } = msg;
        slot.begin("observe");
        self.stats.end(None);
        let handle = self.core.borrow().instances.get(&instance).cloned();
        let Some(handle) = handle else {
            // Not (or no longer) ours: nothing to apply.
            if let Some(a) = ack {
                a.send();
            }
            return Box::pin(fut::ready(()));
        };
        let description = match &observation {
            Observation::Spawned { generation, pid } => {
                // News for the start that waits for its answer: not queued
                // behind it (it holds the instance's mailbox).
                handle.spawned(*generation, *pid);
                if let Some(a) = ack {
                    a.send();
                }
                return Box::pin(fut::ready(()));
            }
            Observation::Exited { description, .. } => description.clone(),
            Observation::Restarted { error, .. } => error.clone().unwrap_or_default(),
            Observation::NodeDown { silent_for } => format!(
                "its node {} is down: no word from its agent for {} s",
                handle.record().node,
                silent_for.as_secs()
            ),
            Observation::Inventory { .. } => {
                format!("instance {} is not running after its agent reconnected", instance)
            }
        };
        Box::pin(async move { handle.observe(observation).await }.into_actor(self).map(move |applied, act, _| {
            // Applied and durable (or nothing to change): the agent may
            // forget it. Not applied: it sends it again.
            let Some(failed) = applied else { return };
            if let Some(a) = ack {
                a.send();
            }
            let (busy, status, name) = {
                let c = act.core.borrow();
                (c.record.operation.is_some(), c.record.status, c.record.name.clone())
            };
            if !failed {
                return;
            }
            let description = format!("member {instance} failed: {description}");
            if busy {
                // The operation may not touch this member (a scale-out
                // adds others): kept, and escalated once it has ended if
                // the member is still failed then.
                act.defer(Some(instance), description);
            } else if status == ClusterStatus::Active {
                // An Active cluster whose member died is in Error, saying
                // which member, where and why.
                let slot = Reservation::counted(&act.shared.supervisor);
                act.supervisor.do_send(Escalate {
                    cluster: name,
                    operation: None,
                    instance: Some(instance),
                    description,
                    recorded: false,
                    slot,
                });
            }
        }))
    }
}

impl Handler<EnterError> for ClusterActor {
    type Result = ResponseActFuture<Self, ()>;

    fn handle(&mut self, msg: EnterError, _ctx: &mut Context<Self>) -> Self::Result {
        let EnterError { description, instance, slot, .. } = msg;
        slot.begin("enter error");
        self.stats.end(None);
        if self.core.borrow().record.operation.is_some() {
            // An operation started meanwhile: kept for when it has ended.
            self.defer(instance, description);
            return Box::pin(fut::ready(()));
        }
        let ops = self.ops(None);
        let name = self.core.borrow().record.name.clone();
        // The failure's event is durable with the status it causes, and
        // neither is shown before.
        let failed = events::actor("actor.failed", "cluster", &name, Some(&name), Some(&description));
        Box::pin(
            async move {
                let event = events::append(&failed).map_err(|e| e.to_string());
                match event {
                    Ok(event) => {
                        ops.save_cluster_with(
                            |r| {
                                r.status = ClusterStatus::Error;
                                r.status_description = description;
                            },
                            vec![event],
                            &ops::END_RETRIES,
                        )
                        .await
                    }
                    Err(e) => Err(e),
                }
            }
            .into_actor(self)
            .map(|saved, act, _| match saved {
                Ok(()) => act.stats.set_state("Error"),
                Err(e) => {
                    // Not shown: the cluster stays as the store has it.
                    tracing::error!(error = %e, "cannot record the Error status of a cluster");
                    act.stats.end(Some(format!("cannot record the Error status: {e}")));
                }
            }),
        )
    }
}
