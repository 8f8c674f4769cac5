//! A cluster's members failing: what an agent observed about an instance,
//! applied durably by its instance actor, and the cluster's `Error` that a
//! member's failure causes, written in the same batch (never a failed
//! member in an `Active` cluster for a reader to see, nor for a crash to
//! leave behind). A failure while an operation runs is the operation's to
//! judge: its end puts the cluster in `Error` if a member is still failed
//! then (`ClusterOps::complete`). Boot and an actor restart check the same
//! ([`ClusterActor::check_members`]).

use std::rc::Weak;

use super::*;
use crate::actors::instance::MemberFailures;

/// What an agent observed about one of our instances (a report or the
/// inventory of a reconnect, routed by its node manager in the order the
/// agent made them). `ack` is sent once the observation is applied and
/// durable.
#[derive(Message)]
#[rtype(result = "()")]
pub struct InstanceObserved {
    pub instance: InstanceId,
    pub observation: Observation,
    pub ack: Option<Ack>,
    pub slot: Reservation,
}

/// At most this many failed members are named in a cluster's `Error`
/// description; the others are counted.
const NAMED_MAX: usize = 5;
/// At most this many bytes of each member's reason in it.
const REASON_MAX: usize = 400;

/// The members that are `Failed` or `Lost`, named (at most [`NAMED_MAX`])
/// with why; `None` when there are none.
pub(super) fn failed_members(core: &Core) -> Option<String> {
    let failed: Vec<Arc<InstanceRecord>> = core
        .members()
        .into_iter()
        .filter(|m| matches!(m.status, InstanceStatus::Failed | InstanceStatus::Lost))
        .collect();
    if failed.is_empty() {
        return None;
    }
    let mut named: Vec<String> = failed
        .iter()
        .take(NAMED_MAX)
        .map(|m| member_failed(&m.id, m.last_error.as_deref().unwrap_or("no reason recorded")))
        .collect();
    if failed.len() > NAMED_MAX {
        named.push(format!("and {} more members failed", failed.len() - NAMED_MAX));
    }
    Some(named.join("; "))
}

/// A member failed since the cluster last checked (its failure landed while
/// the cluster was busy): an `Active` cluster goes `Error` if one still is.
#[derive(Message)]
#[rtype(result = "()")]
pub struct CheckMembers;

impl Handler<CheckMembers> for ClusterActor {
    type Result = ();

    fn handle(&mut self, _msg: CheckMembers, ctx: &mut Context<Self>) {
        self.check_members(ctx);
    }
}

/// "member X failed: why", the reason cut at [`REASON_MAX`] bytes.
fn member_failed(id: &InstanceId, why: &str) -> String {
    let mut why = why.trim();
    if why.len() > REASON_MAX {
        let mut end = REASON_MAX;
        while !why.is_char_boundary(end) {
            end -= 1;
        }
        why = &why[..end];
    }
    format!("member {id} failed: {why}")
}

/// The cluster's side of a member's failure: handed to its instance actors
/// (through `ClusterEnv`), asked when a member's failure is about to be
/// written. Holds the cluster weakly: the instances it serves are the
/// cluster's own.
pub(super) struct Escalation {
    pub core: Weak<RefCell<Core>>,
    pub env: Weak<ClusterEnv>,
    pub stats: Arc<ActorStats>,
    pub actor: Addr<ClusterActor>,
}

/// Whether a cluster record's `Error` names `member` already, and how many
/// members it names.
fn named(description: &str, member: &InstanceId) -> (bool, usize) {
    (description.contains(&format!("member {member} failed")), description.matches(" failed: ").count())
}

/// What `member`'s failure changes in `record` (as it is now), if anything.
fn change_for(record: &ClusterRecord, member: &InstanceId) -> Option<bool> {
    if record.operation.is_some() {
        // The running operation judges it when it ends.
        return None;
    }
    match record.status {
        ClusterStatus::Active => Some(true),
        // In Error already: it only gains the member, while the
        // description names fewer than the most it names.
        ClusterStatus::Error => {
            let (already, count) = named(&record.status_description, member);
            (!already && count < NAMED_MAX).then_some(false)
        }
        _ => None,
    }
}

impl MemberFailures for Escalation {
    fn may_escalate(&self, member: &InstanceRecord) -> bool {
        self.core.upgrade().is_some_and(|c| change_for(&c.borrow().record, &member.id).is_some())
    }

    fn landed(&self) {
        if self.core.upgrade().is_some_and(|c| c.borrow().record.operation.is_none()) {
            self.actor.do_send(CheckMembers);
        }
    }

    fn linked_failed(&self, why: String) {
        self.actor.do_send(super::Kill { reason: why });
    }

    fn escalate(&self, member: &InstanceRecord) -> Option<(Vec<WriteOp>, Box<dyn FnOnce()>)> {
        let (core, env) = (self.core.upgrade()?, self.env.upgrade()?);
        let why = member_failed(&member.id, member.last_error.as_deref().unwrap_or("no reason recorded"));
        let change = {
            let c = core.borrow();
            match change_for(&c.record, &member.id)? {
                true => {
                    let why = why.clone();
                    // Applied to the live record once durable only if it is
                    // still free and Active: a request taken meanwhile (which
                    // does not wait for this write) runs an operation whose
                    // end judges the member.
                    Box::new(move |r: &mut ClusterRecord| {
                        if r.status == ClusterStatus::Active && r.operation.is_none() {
                            r.status = ClusterStatus::Error;
                            r.status_description = why.clone();
                        }
                    }) as Box<dyn Fn(&mut ClusterRecord)>
                }
                false => {
                    let (why, id) = (why.clone(), member.id.clone());
                    Box::new(move |r: &mut ClusterRecord| {
                        if r.status == ClusterStatus::Error && !named(&r.status_description, &id).0 {
                            r.status_description = format!("{}; {why}", r.status_description);
                        }
                    })
                }
            }
        };
        let (snapshot, mut ops) = writes::cluster_writes(&core.borrow().record, &change).ok()?;
        let name = snapshot.name.clone();
        let failed = events::actor("actor.failed", "cluster", &name, Some(&name), Some(&why));
        ops.push(events::append(&failed).ok()?);
        let stats = self.stats.clone();
        let durable = move || {
            let taken = {
                let mut c = core.borrow_mut();
                let taken = c.record.operation != snapshot.operation;
                if !taken {
                    change(&mut c.record);
                    c.record.updated_at = snapshot.updated_at;
                }
                taken
            };
            if taken {
                // An operation was accepted while this was written: its own
                // write, behind this one, is what readers see once it lands
                // (an Error published now would show over its busy mark, or
                // stay shown after it), and its end judges the member.
                tracing::warn!(cluster = %name, reason = %why, "a member failed while an operation was being accepted; its end judges it");
                return;
            }
            tracing::error!(cluster = %name, reason = %why, "cluster failed: a member failed");
            stats.end(Some(why));
            stats.set_state(format!("{:?}", snapshot.status));
            env.cell.set_record(snapshot);
        };
        Some((ops, Box::new(durable)))
    }
}

impl ClusterActor {
    /// An `Active` cluster, free, with a `Failed` or `Lost` member goes
    /// `Error` naming it (at boot, at an actor restart: a crash between a
    /// member's failure and its cluster's `Error` left by an older master
    /// is put right). Tried until it lands.
    pub(super) fn check_members(&mut self, ctx: &mut Context<Self>) {
        let failed = {
            let c = self.core.borrow();
            if c.record.operation.is_some() || c.record.status != ClusterStatus::Active {
                return;
            }
            failed_members(&c)
        };
        let Some(description) = failed else { return };
        let ops = self.ops(None);
        let name = self.core.borrow().record.name.clone();
        let event = events::actor("actor.failed", "cluster", &name, Some(&name), Some(&description));
        let change = move |r: &mut ClusterRecord| {
            if r.status == ClusterStatus::Active && r.operation.is_none() {
                r.status = ClusterStatus::Error;
                r.status_description = description.clone();
            }
        };
        let save = async move {
            let extra = || Ok(vec![events::append(&event).map_err(|e| e.to_string())?]);
            ops.save_cluster_until_landed(change, extra, "a cluster's Error").await
        };
        ctx.spawn(save.into_actor(self).map(|saved, act, _| match saved {
            // An operation taken meanwhile shows its own state, and judges.
            Ok(()) if act.core.borrow().record.operation.is_some() => {}
            Ok(()) => {
                let c = act.core.borrow();
                act.stats.end(Some(c.record.status_description.clone()));
                act.stats.set_state(format!("{:?}", c.record.status));
            }
            Err(e) => tracing::error!(error = %e, "cannot record a cluster's Error"),
        }));
    }

    /// What its instance actors ask when a member's failure is written.
    pub(super) fn escalation(
        core: &Rc<RefCell<Core>>,
        env: &Rc<ClusterEnv>,
        stats: &Arc<ActorStats>,
        actor: Addr<ClusterActor>,
    ) -> Rc<Escalation> {
        Rc::new(Escalation { core: Rc::downgrade(core), env: Rc::downgrade(env), stats: stats.clone(), actor })
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
        if let Observation::Spawned { generation, pid } = observation {
            // News for the start that waits for its answer: not queued
            // behind it (it holds the instance's mailbox).
            handle.spawned(generation, pid);
            if let Some(a) = ack {
                a.send();
            }
            return Box::pin(fut::ready(()));
        }
        // Applied and durable, with the cluster's Error it causes (or
        // nothing to change): the agent may forget it. Not applied: it
        // sends it again.
        // Its turn taken now, in the order of this mailbox (actix does not
        // poll the futures of a context's handlers in their order).
        let applied = handle.observe(observation);
        Box::pin(applied.into_actor(self).map(move |applied, _, _| {
            if applied.is_some()
                && let Some(a) = ack
            {
                a.send();
            }
        }))
    }
}
