//! Events that describe no stored record change, so they are appended on
//! their own: actors starting, stopping and failing, and nodes changing
//! status (a node's status is computed from its heartbeats, never stored,
//! so [`watch_nodes`] compares it every heartbeat interval). Best effort:
//! a write that fails is logged, and the state it describes is still
//! readable from the API.

use std::collections::HashMap;

use actix::Addr;

use super::Shared;
use super::read_model::Reservation;
use super::supervisor::{NodeDown, Supervisor};
use crate::ids::NodeId;
use crate::storage::events::{self, append};
use crate::storage::records::{EventRecord, NodeStatus};

/// Appends `events` in one request, in the background (a temporary
/// child: `supervision::spec("announce")`).
pub fn announce(shared: &Shared, events: Vec<EventRecord>) {
    let ops: Result<Vec<_>, _> = events.iter().map(append).collect();
    let store = shared.store.clone();
    match ops {
        Ok(ops) if !ops.is_empty() => {
            super::supervised::temporary("announce", async move {
                if INJECTED_PANIC.swap(false, std::sync::atomic::Ordering::SeqCst) {
                    panic!("a panic injected by a test hook (announce)");
                }
                match store.commit(ops).await {
                    Ok(()) => {}
                    // Shutting down: actors stop after the store froze.
                    Err(crate::storage::StorageError::Frozen) => {}
                    Err(e) => tracing::warn!(error = %e, "cannot record an event"),
                }
            });
        }
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "cannot encode an event"),
    }
}

/// Test hooks: the next event write panics (`supervisor::inject`).
static INJECTED_PANIC: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Test hooks: the next [`announce`] panics where it runs: its events are
/// lost, the panic is logged and counted, nothing else is touched.
pub fn inject_panic() {
    INJECTED_PANIC.store(true, std::sync::atomic::Ordering::SeqCst);
}

/// `actor.started`, `actor.stopped` or `actor.failed` of one actor.
pub fn actor(shared: &Shared, kind: &str, actor: &str, id: &str, cluster: Option<&str>, reason: Option<&str>) {
    announce(shared, vec![events::actor(kind, actor, id, cluster, reason)]);
}

/// Every heartbeat interval: a `node.status` event for each node whose
/// status or connection changed since the last look (and for each node
/// at the first look), and for each node that became `Down`, a
/// [`NodeDown`] to the supervisor (its instances are marked `Lost`). Runs
/// until the master stops.
pub async fn watch_nodes(shared: Shared, supervisor: Addr<Supervisor>, every: std::time::Duration) {
    let mut seen: HashMap<NodeId, (NodeStatus, bool)> = HashMap::new();
    // Nodes whose instances were marked Lost for this Down (sent NodeDown).
    let mut marked: std::collections::HashSet<NodeId> = std::collections::HashSet::new();
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let now = std::time::Instant::now();
        let (unknown, down) = (shared.timing.node_unknown_after, shared.timing.node_down_after);
        let mut changed = Vec::new();
        let nodes = shared.read_model.nodes();
        seen.retain(|id, _| nodes.contains_key(id));
        marked.retain(|id| nodes.contains_key(id));
        let mut newly_down = Vec::new();
        // Not as soon as an agent would: the master's actor threads may be
        // saturated (frames waiting to be handled look like silence), so a
        // link closes when its node is judged Down (and its instances
        // Lost), and the commands waiting on it fail then.
        let idle = down;
        for (id, entry) in nodes.iter() {
            // A link that has carried nothing (not even a heartbeat) for the
            // idle limit is dead, whatever TCP thinks: close it, so the
            // agent's next connection is not refused and commands fail now.
            if entry.live.connected()
                && entry.live.silence(now).is_some_and(|s| s >= idle)
                && let Some(link) = shared.links.get(id)
            {
                tracing::warn!(node = %id, idle_s = idle.as_secs(), "no frame from the agent within the idle limit; closing its link");
                link.close();
            }
            let state = (entry.live.status_at(now, unknown, down), entry.live.connected());
            if state.0 != NodeStatus::Down {
                marked.remove(id);
            } else if !marked.contains(id) {
                newly_down.push((id.clone(), entry.live.silence(now).unwrap_or(down)));
            }
            if seen.get(id) != Some(&state) {
                seen.insert(id.clone(), state);
                changed.push(events::node(id.as_str(), state.0, state.1));
            }
        }
        announce(&shared, changed);
        if mass_outage(newly_down.len(), nodes.len()) {
            // Most of the fleet silent at once is more likely this master
            // cut off or overloaded (frames queued look like silence) than
            // that many machines gone: their instances are not marked Lost
            // (as Kubernetes stops evicting in a zone that is all down).
            tracing::error!(
                down = newly_down.len(),
                nodes = nodes.len(),
                "most nodes went Down at once; their instances are not marked Lost until fewer are"
            );
            continue;
        }
        for (id, silent_for) in newly_down {
            let slot = Reservation::counted(&shared.supervisor);
            supervisor.do_send(NodeDown { node: id.clone(), silent_for, slot });
            marked.insert(id);
        }
    }
}

/// Whether `down` nodes judged Down at once, of `total`, are too many to
/// believe: at least 3 and more than half.
fn mass_outage(down: usize, total: usize) -> bool {
    down >= 3 && down * 2 > total
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_few_nodes_down_are_believed_most_of_the_fleet_at_once_is_not() {
        assert!(!super::mass_outage(1, 3), "one of three");
        assert!(!super::mass_outage(2, 3), "two of three: under 3 at once");
        assert!(super::mass_outage(3, 4), "three of four");
        assert!(!super::mass_outage(3, 6), "half");
        assert!(super::mass_outage(501, 1000));
        assert!(!super::mass_outage(500, 1000));
    }
}
