//! Routing observations to cluster actors in order. A report whose
//! cluster's mailbox is full, or whose cluster actor is dead (restarting,
//! or given up until an operator restarts it), is held here in arrival
//! order and offered again, every few milliseconds at first (not only when
//! the agent sends it again, 3 s later: a burst of a thousand crashes
//! would take minutes to show), backing off to once a second while nothing
//! gets through. The reports of one instance are applied in the order the
//! agent made them: one held (or dropped) keeps every later report of its
//! instance behind it. Without that, a restart report could be applied (a
//! no-op: the exit it follows was not seen yet) and acknowledged before its
//! exit report, which then left the instance `Starting` for good.
//!
//! The connection's inventory goes first, the same way. The agent never
//! sends it again, so each line is delivered until its cluster actor
//! confirms it applied: one lost with a dying actor's mailbox is delivered
//! again to its successor, before any later report of its instance. (It
//! was dropped, and a process that died while its agent was away stayed
//! `Running` in the restarted actor's records.)

use std::collections::HashSet;
use std::time::Duration;

use actix::prelude::*;

use super::NodeManagerActor;
use super::ack::Ack;
use crate::actors::cluster::InstanceObserved;
use crate::actors::instance::Observation;
use crate::actors::read_model::{NodeEntry, Reservation};
use crate::ids::InstanceId;
use crate::protocol::messages::InstanceReport;

/// Reports one connection holds for clusters whose mailbox is full; past
/// it a report is dropped unacknowledged (the agent sends it again).
/// Inventory lines are always held: nothing would send them again.
const HELD_MAX: usize = 4096;

/// How soon held reports are offered to their clusters again; the wait
/// doubles while none gets through, up to [`RETRY_HELD_MAX`].
const RETRY_HELD: Duration = Duration::from_millis(20);
const RETRY_HELD_MAX: Duration = Duration::from_secs(1);
/// How soon an inventory line its cluster actor dropped is offered again.
const RETRY_AFTER_DROP: Duration = Duration::from_millis(250);

/// An observation waiting for room in its cluster's mailbox, or for its
/// cluster actor to be back.
pub(super) struct Held {
    instance: InstanceId,
    observation: Observation,
    /// A report's ack (an inventory line gets a fresh one each delivery).
    ack: Option<Ack>,
    /// A line of the connection's inventory.
    inventory: bool,
}

/// What a node's inventory (its agent's `Hello`, on connection
/// `connection`) says of each instance the master placed there: a
/// running process updates its instance; a missing or dead one marks it
/// `Lost` or `Failed` (and its `Active` cluster `Error`). (What the agent
/// holds that the master does not know is the supervisor's:
/// `NodeInventory`.)
pub fn inventory_lines(
    entry: &NodeEntry,
    connection: u64,
    inventory: &[InstanceReport],
) -> Vec<(InstanceId, Observation)> {
    let reports: std::collections::HashMap<&InstanceId, &InstanceReport> =
        inventory.iter().map(|r| (&r.instance, r)).collect();
    let ours = entry.instances();
    ours.keys()
        .map(|id| {
            let report = reports.get(id);
            let observation = Observation::Inventory {
                present: report.is_some(),
                running: report.is_some_and(|r| r.running),
                pid: report.and_then(|r| r.pid),
                generation: report.map(|r| r.generation),
                connection: Some(connection),
            };
            (id.clone(), observation)
        })
        .collect()
}

impl NodeManagerActor {
    /// Hands the connection's inventory to the clusters, before any report
    /// of the connection: a report made after the inventory was taken is
    /// never overridden by it.
    pub(super) fn reconcile(&mut self, inventory: &[InstanceReport], ctx: &mut Context<Self>) {
        let lines = inventory_lines(&self.entry, self.link.connection, inventory);
        tracing::debug!(node = %self.node, connection = self.link.connection, instances = lines.len(), held = inventory.len(), "reconciling an inventory");
        for (instance, observation) in lines {
            let line = Held { instance, observation, ack: None, inventory: true };
            if let Some(line) = self.deliver(line, ctx) {
                self.hold(line, false, Some(RETRY_HELD), ctx);
            }
        }
    }

    /// Sends an observation to the instance's cluster actor, with the ack
    /// to send once it is applied. An instance the master does not know is
    /// acknowledged at once (there is nothing to apply); a cluster actor
    /// that is dead, or whose mailbox is full, gives it back, to hold. An
    /// inventory line is not bounded by the mailbox (one per instance of a
    /// node that just connected, and each must arrive), and is awaited.
    fn deliver(&mut self, held: Held, ctx: &mut Context<Self>) -> Option<Held> {
        if self.link.is_closed() {
            // A newer connection's inventory may be delivered already: what
            // this one held is dropped unacknowledged (the agent sends its
            // reports again on that connection).
            return None;
        }
        let cluster = self.entry.instances().get(&held.instance).cloned();
        let handle = cluster.and_then(|c| self.shared.registry.get(&c));
        let Some(handle) = handle else {
            tracing::debug!(instance = %held.instance, node = %self.node, "report about an instance the master does not know");
            if let Some(a) = held.ack {
                a.send();
            }
            return None;
        };
        if !handle.addr.connected() {
            return Some(held);
        }
        let slot = if held.inventory {
            Reservation::counted(&handle.stats)
        } else {
            match Reservation::within(&handle.stats, self.shared.limits.cluster_mailbox) {
                Some(slot) => slot,
                None => return Some(held),
            }
        };
        let ack = if held.inventory {
            let (ack, confirmed) = Ack::inventory();
            self.awaiting.insert(held.instance.clone());
            let again = Held {
                instance: held.instance.clone(),
                observation: held.observation.clone(),
                ack: None,
                inventory: true,
            };
            ctx.spawn(
                confirmed.into_actor(self).map(move |confirmed, act, ctx| act.confirmed(again, confirmed.is_ok(), ctx)),
            );
            Some(ack)
        } else {
            held.ack
        };
        handle.addr.do_send(InstanceObserved { instance: held.instance, observation: held.observation, ack, slot });
        None
    }

    /// An inventory line's cluster actor applied it, or dropped it: then it
    /// is held again, ahead of every later report of its instance.
    fn confirmed(&mut self, line: Held, applied: bool, ctx: &mut Context<Self>) {
        self.awaiting.remove(&line.instance);
        if !applied {
            // Its actor died with it, or could not write it: offered again
            // once a successor may be there, not at once.
            tracing::debug!(instance = %line.instance, node = %self.node, "an inventory line was not applied; delivering it again");
            self.hold(line, true, None, ctx);
            self.schedule_retry(RETRY_AFTER_DROP, ctx);
        } else if !self.held.is_empty() {
            self.schedule_retry(RETRY_HELD, ctx);
        }
    }

    /// Routes a report in order with the other reports of its instance:
    /// delivered now when nothing of its instance waits and its cluster
    /// has room, else held (or, past [`HELD_MAX`], dropped unacknowledged).
    pub(super) fn route(
        &mut self,
        instance: InstanceId,
        observation: Observation,
        ack: Option<Ack>,
        ctx: &mut Context<Self>,
    ) {
        let seq = ack.as_ref().and_then(Ack::seq);
        if let (Some(s), Some(&first)) = (seq, self.dropped.get(&instance)) {
            if s > first {
                // An earlier report of this instance was dropped: this one
                // comes again after it.
                return;
            }
            if s == first {
                self.dropped.remove(&instance);
            }
        }
        if seq.is_some_and(|s| self.held_seqs.contains(&s)) {
            return;
        }
        // A spawn is news for the start waiting on the instance, not a
        // change of state: it is not held behind the instance's inventory
        // line (applying that waits for the start, which waits for this).
        let news = matches!(observation, Observation::Spawned { .. });
        let report = Held { instance, observation, ack, inventory: false };
        let report = if !news && self.waits(&report.instance) {
            report
        } else {
            match self.deliver(report, ctx) {
                None => return,
                Some(r) => r,
            }
        };
        self.hold(report, false, Some(RETRY_HELD), ctx);
    }

    /// Whether something of `instance` goes first: a held observation, or
    /// an inventory line not yet confirmed.
    fn waits(&self, instance: &InstanceId) -> bool {
        self.held_of.contains_key(instance) || self.awaiting.contains(instance)
    }

    /// Holds `report` (`first`: ahead of everything held), offered again
    /// after `retry` (`None`: the caller schedules it).
    fn hold(&mut self, report: Held, first: bool, retry: Option<Duration>, ctx: &mut Context<Self>) {
        let seq = report.ack.as_ref().and_then(Ack::seq);
        if self.held.len() >= HELD_MAX && !report.inventory {
            tracing::debug!(instance = %report.instance, "cluster mailbox full and too many reports held; the agent will send it again");
            if let Some(s) = seq {
                self.dropped.entry(report.instance).or_insert(s);
            }
            return;
        }
        if let Some(s) = seq {
            self.held_seqs.insert(s);
        }
        *self.held_of.entry(report.instance.clone()).or_default() += 1;
        if first {
            self.held.push_front(report);
        } else {
            self.held.push_back(report);
        }
        self.publish_held();
        if let Some(after) = retry {
            self.schedule_retry(after, ctx);
        }
    }

    /// Offers the held observations again in `after`, unless an offer is
    /// due sooner (a later one is replaced: its timer finds it stale).
    fn schedule_retry(&mut self, after: Duration, ctx: &mut Context<Self>) {
        let due = tokio::time::Instant::now() + after;
        if self.retry_due.is_some_and(|d| d <= due) {
            return;
        }
        self.retry_due = Some(due);
        ctx.run_later(after, move |act, ctx| {
            if act.retry_due == Some(due) {
                act.retry_due = None;
                act.retry_held(after, ctx);
            }
        });
    }

    /// Offers every held observation to its cluster again, in order; one
    /// that still finds no room (or no live actor) keeps its instance's
    /// later ones held. `waited`: how long since the last offer.
    fn retry_held(&mut self, waited: Duration, ctx: &mut Context<Self>) {
        let mut stuck: HashSet<InstanceId> = HashSet::new();
        let mut delivered = false;
        // Held for want of room or of a live actor; the others wait for
        // their instance's inventory line, whose confirmation offers them.
        let mut blocked = false;
        for _ in 0..self.held.len() {
            let Some(report) = self.held.pop_front() else { break };
            if self.awaiting.contains(&report.instance) {
                self.held.push_back(report);
                continue;
            }
            if stuck.contains(&report.instance) {
                blocked = true;
                self.held.push_back(report);
                continue;
            }
            let instance = report.instance.clone();
            let seq = report.ack.as_ref().and_then(Ack::seq);
            match self.deliver(report, ctx) {
                None => {
                    delivered = true;
                    if let Some(s) = seq {
                        self.held_seqs.remove(&s);
                    }
                    if let Some(n) = self.held_of.get_mut(&instance) {
                        *n -= 1;
                        if *n == 0 {
                            self.held_of.remove(&instance);
                        }
                    }
                }
                Some(report) => {
                    blocked = true;
                    stuck.insert(instance);
                    self.held.push_back(report);
                }
            }
        }
        self.publish_held();
        if blocked {
            let next = if delivered { RETRY_HELD } else { (waited * 2).min(RETRY_HELD_MAX) };
            self.schedule_retry(next, ctx);
        }
    }

    /// The reports it holds are work queued in it: part of its mailbox
    /// depth in `GET /actors` (`ActorStats::inner`).
    fn publish_held(&self) {
        self.stats
            .inner
            .store(i64::try_from(self.held.len()).unwrap_or(i64::MAX), std::sync::atomic::Ordering::Relaxed);
    }
}
