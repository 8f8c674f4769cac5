//! Leaked instances (Nodepool's leaked-resource cleanup): an instance an
//! agent holds (a record, or only a directory: `Hello::unrecorded`) that
//! the master does not know and is not removing as a force delete's
//! leftover. The supervisor finds them in each inventory ([`found`]); they
//! are shown in `GET /nodes/{id}` under `leaked`, announced
//! (`instance.leaked`), and [`sweep`] sends their node a `Delete` once
//! `leaked_grace` has passed since they were first seen (never when it is
//! 0), then announces `instance.leak_removed`.
//!
//! Never an instance the master knows or is creating: an operation writes
//! an instance's record and indexes it on its node (the `allocate` step)
//! before any command for it reaches an agent, and the master takes agents'
//! inventories only once every cluster actor runs with its stored records;
//! so whatever an agent can hold of an operation in flight is known when
//! its inventory is compared. An instance is judged against every node's
//! index, not only the reporting one's. Before its removal it is checked
//! again (known on any node now, or a leftover: dropped, not removed), and
//! the `Delete` carries the generation the agent reported plus one, which
//! the agent refuses as stale if a newer command took the instance since.
//!
//! In memory only: a master restart forgets them, and the agents'
//! inventories (every reconnect sends one) find them again with the grace
//! started over: a restart delays a removal, never hastens it.

use std::time::Duration;

use serde_json::json;
use time::OffsetDateTime;

use super::Shared;
use super::read_model::Leaked;
use crate::ids::{InstanceId, NodeId};
use crate::protocol::messages::AgentRequest;
use crate::storage::events;

/// How often [`sweep`] looks; a removal is at most this late.
const SWEEP_EVERY: Duration = Duration::from_secs(1);
/// A removal that failed is tried again after this long.
const RETRY_AFTER: time::Duration = time::Duration::seconds(10);

/// One instance an inventory shows that the master does not know.
#[derive(Debug, Clone)]
pub struct Seen {
    pub instance: InstanceId,
    pub generation: u64,
    pub running: bool,
    pub pid: Option<u32>,
    pub unrecorded: bool,
}

/// Whether the master knows `id` on any node.
pub fn known(shared: &Shared, id: &InstanceId) -> bool {
    shared.read_model.nodes().values().any(|n| n.instances().contains_key(id))
        || shared.read_model.leftovers().contains_key(id)
}

/// The event of a leaked instance.
fn event(kind: &str, l: &Leaked, extra: serde_json::Value) -> crate::storage::records::EventRecord {
    let mut data = json!({
        "node": l.node.as_str(),
        "instance": l.instance.as_str(),
        "first_seen": l.first_seen.unix_timestamp(),
        "remove_at": l.remove_at.map(|t| t.unix_timestamp()),
        "running": l.running,
        "pid": l.pid,
        "unrecorded": l.unrecorded,
    });
    if let (Some(d), serde_json::Value::Object(e)) = (data.as_object_mut(), extra) {
        d.extend(e);
    }
    events::event(kind, None, data)
}

/// The leaked instances in `node`'s inventory (what it holds that the
/// master does not know): new ones are recorded and announced, ones seen
/// before keep their first sighting, and ones no longer on the node are
/// dropped (announced as gone).
pub fn found(shared: &Shared, node: &NodeId, seen: Vec<Seen>) {
    let now = OffsetDateTime::now_utc();
    let grace = shared.limits.leaked_grace;
    let before = shared.read_model.leaked();
    let mut announce = Vec::new();
    for l in before.values().filter(|l| &l.node == node && !seen.iter().any(|s| s.instance == l.instance)) {
        if shared.read_model.remove_leaked(node, &l.instance).is_some() {
            tracing::info!(%node, instance = %l.instance, "a leaked instance is no longer on its node");
            announce.push(event(
                "instance.leak_removed",
                l,
                json!({"deleted": false, "reason": "no longer on its node"}),
            ));
        }
    }
    for s in seen {
        let key = (node.clone(), s.instance.clone());
        let next = match before.get(&key) {
            Some(l) => Leaked {
                generation: s.generation,
                running: s.running,
                pid: s.pid,
                unrecorded: s.unrecorded,
                ..Leaked::clone(l)
            },
            None => {
                let l = Leaked {
                    node: node.clone(),
                    instance: s.instance,
                    first_seen: now,
                    remove_at: (!grace.is_zero()).then(|| now + grace),
                    generation: s.generation,
                    running: s.running,
                    pid: s.pid,
                    unrecorded: s.unrecorded,
                    removing: false,
                    last_error: None,
                };
                tracing::warn!(%node, instance = %l.instance, running = l.running, unrecorded = l.unrecorded,
                    remove_in = ?(!grace.is_zero()).then_some(grace),
                    "agent holds an instance the master does not know: leaked");
                announce.push(event("instance.leaked", &l, json!({})));
                l
            }
        };
        shared.read_model.put_leaked(next);
    }
    super::announce::announce(shared, announce);
}

/// Every second: removes the leaked instances whose grace has passed
/// from their (connected) nodes. Runs until the master stops.
pub async fn sweep(shared: Shared) {
    let mut tick = tokio::time::interval(SWEEP_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let now = OffsetDateTime::now_utc();
        for l in shared.read_model.leaked().values() {
            if known(&shared, &l.instance) {
                drop_known(&shared, l);
                continue;
            }
            if l.removing || l.remove_at.is_none_or(|at| at > now) || shared.links.get(&l.node).is_none() {
                continue;
            }
            shared.read_model.put_leaked(Leaked { removing: true, ..Leaked::clone(l) });
            actix::spawn(remove(shared.clone(), l.clone()));
        }
    }
}

/// The master knows `l` now (an operation placed it, or a force delete
/// left it over): not leaked, never removed as such.
fn drop_known(shared: &Shared, l: &Leaked) {
    if shared.read_model.remove_leaked(&l.node, &l.instance).is_some() {
        tracing::info!(node = %l.node, instance = %l.instance, "a leaked instance is known to the master now; left to it");
        super::announce::announce(
            shared,
            vec![event("instance.leak_removed", l, json!({"deleted": false, "reason": "known to the master now"}))],
        );
    }
}

/// Sends `l`'s node a `Delete` (the agent stops its processes, by record
/// or by the instance's marker, and removes its directory).
async fn remove(shared: Shared, l: std::sync::Arc<Leaked>) {
    if known(&shared, &l.instance) {
        drop_known(&shared, &l);
        return;
    }
    let result = match shared.links.get(&l.node) {
        Some(link) => {
            let req = AgentRequest::Delete { instance: l.instance.clone(), generation: l.generation + 1 };
            link.call(req, "Delete").await.map(|_| ()).map_err(|e| crate::error::ErrorChain(&e).to_string())
        }
        None => Err("the node is not connected".to_string()),
    };
    // Still the entry this removal was for (not dropped meanwhile)?
    let current = shared.read_model.leaked().get(&(l.node.clone(), l.instance.clone())).cloned();
    let Some(current) = current else { return };
    match result {
        Ok(()) => {
            shared.read_model.remove_leaked(&l.node, &l.instance);
            tracing::warn!(node = %l.node, instance = %l.instance, "removed a leaked instance from its node");
            let data = json!({"deleted": true, "reason": "removed after the leaked grace"});
            super::announce::announce(&shared, vec![event("instance.leak_removed", &current, data)]);
        }
        Err(e) => {
            tracing::warn!(node = %l.node, instance = %l.instance, error = %e, "cannot remove a leaked instance yet");
            let retry = OffsetDateTime::now_utc() + RETRY_AFTER;
            shared.read_model.put_leaked(Leaked {
                removing: false,
                last_error: Some(e),
                remove_at: Some(current.remove_at.map_or(retry, |at| at.max(retry))),
                ..Leaked::clone(&current)
            });
        }
    }
}
