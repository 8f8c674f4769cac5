//! Nodes as readers see them: the registration record, the link's liveness
//! (atomics the node manager writes on every frame, without any lock and
//! without touching the rest of the read model) and an index of the
//! instances placed on the node, so `GET /nodes` and placement never scan
//! every instance.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use imbl::OrdMap;

use crate::ids::InstanceId;
use crate::storage::records::{NodeRecord, NodeStatus};

/// Liveness of a node's link. Heartbeats write here only. Judged on the
/// monotonic clock, never the wall clock: a clock stepped forward (NTP, an
/// operator) would make every node look silent at once, and mark them all
/// `Down` with their instances `Lost`.
#[derive(Debug)]
pub struct NodeLive {
    /// The connection that is live (0: none). A connection that closes
    /// clears only its own number, so a newer one is never marked down.
    connection: AtomicU64,
    /// Monotonic ms ([`mono_ms`]) of the last frame; `i64::MIN`: never heard from.
    last_heard_ms: AtomicI64,
    /// Monotonic ms this master began to listen for the node (the entry was
    /// made: at the master's start for a node it had stored, else at the
    /// node's first registration). A node not heard from since is judged
    /// from here, not as silent forever: the reconnect grace after a
    /// master restart (see [`NodeLive::status_at`]).
    listening_since_ms: i64,
    /// The last connection to close was ended by the agent's side (it hung
    /// up, crashed, stalled or broke the protocol), not by this master (a
    /// killed node manager). Commands that close cut off are sent again
    /// only for a master-side end: an agent that went away is not waited for.
    agent_ended: AtomicBool,
}

impl Default for NodeLive {
    fn default() -> Self {
        NodeLive {
            connection: AtomicU64::new(0),
            last_heard_ms: AtomicI64::new(i64::MIN),
            listening_since_ms: mono_ms(Instant::now()),
            agent_ended: AtomicBool::new(false),
        }
    }
}

/// Milliseconds from the first time this process asked to `t`.
fn mono_ms(t: Instant) -> i64 {
    static EPOCH: std::sync::LazyLock<Instant> = std::sync::LazyLock::new(Instant::now);
    i64::try_from(t.saturating_duration_since(*EPOCH).as_millis()).unwrap_or(i64::MAX)
}

impl NodeLive {
    /// A frame arrived.
    pub fn heard(&self) {
        self.last_heard_ms.store(mono_ms(Instant::now()), Ordering::Relaxed);
    }

    /// Connection `connection` is live now.
    pub fn connect(&self, connection: u64) {
        self.agent_ended.store(false, Ordering::SeqCst);
        self.connection.store(connection, Ordering::SeqCst);
        self.heard();
    }

    /// Connection `connection` closed (`by_agent`: the agent's side ended
    /// it): the node is disconnected unless a newer connection took its
    /// place meanwhile.
    pub fn disconnect(&self, connection: u64, by_agent: bool) {
        if self.connection.compare_exchange(connection, 0, Ordering::SeqCst, Ordering::SeqCst).is_ok() {
            self.agent_ended.store(by_agent, Ordering::SeqCst);
        }
    }

    /// Whether the last connection to close was ended by the agent.
    pub fn agent_ended(&self) -> bool {
        self.agent_ended.load(Ordering::SeqCst)
    }

    pub fn connected(&self) -> bool {
        self.connection.load(Ordering::SeqCst) != 0
    }

    /// How long since the last frame, at `now`; `None`: never.
    pub fn silence(&self, now: Instant) -> Option<Duration> {
        let at = self.last_heard_ms.load(Ordering::Relaxed);
        (at != i64::MIN).then(|| Duration::from_millis(u64::try_from(mono_ms(now) - at).unwrap_or(0)))
    }

    /// Ready while connected and heard from recently; Unknown after
    /// `unknown_after` of silence (or right after a disconnect); Down after
    /// `down_after`. Derived at read time, so no timer has to flip it.
    ///
    /// A node this master has not heard from yet counts as silent since
    /// the master began listening for it, not forever: after a master
    /// restart (or one down longer than `down_after`) its agents get
    /// `down_after` to reconnect, and are `Unknown` meanwhile, never all
    /// `Down` at once because the master itself was away.
    pub fn status_at(&self, now: Instant, unknown_after: Duration, down_after: Duration) -> NodeStatus {
        let waited = || Duration::from_millis(u64::try_from(mono_ms(now) - self.listening_since_ms).unwrap_or(0));
        let silent = self.silence(now).unwrap_or_else(waited);
        if self.connected() && silent < unknown_after {
            NodeStatus::Ready
        } else if silent < down_after {
            NodeStatus::Unknown
        } else {
            NodeStatus::Down
        }
    }
}

/// One node.
#[derive(Debug)]
pub struct NodeEntry {
    record: ArcSwap<NodeRecord>,
    pub live: NodeLive,
    /// Instances placed on this node, with their cluster's name.
    instances: ArcSwap<OrdMap<InstanceId, Arc<str>>>,
    /// Per instance, which connections' news is stale: see [`Connections`].
    /// Kept here, not in the instance's actor, so that a cluster actor
    /// restarted meanwhile judges an inventory delivered again to it as its
    /// predecessor would have.
    seen: std::sync::Mutex<std::collections::HashMap<InstanceId, Connections>>,
    /// The node manager serving (or that last served) this node: the next
    /// one carries on its restarts and how it ended (`GET /actors`).
    manager: std::sync::Mutex<Option<Arc<super::ActorStats>>>,
}

/// The connections that make an inventory of an instance stale.
#[derive(Debug, Default, Clone, Copy)]
struct Connections {
    /// The last a state-changing command (install, start, stop, delete)
    /// was sent on: an inventory of it or an older one was taken before.
    commanded: u64,
    /// The newest whose inventory was applied: an older one's is stale (a
    /// late line of a connection that was replaced).
    inventoried: u64,
}

impl NodeEntry {
    pub fn new(record: NodeRecord) -> Arc<NodeEntry> {
        Arc::new(NodeEntry {
            record: ArcSwap::from_pointee(record),
            live: NodeLive::default(),
            instances: ArcSwap::from_pointee(OrdMap::new()),
            seen: Default::default(),
            manager: Default::default(),
        })
    }

    /// The node manager of this node's newest connection; it takes over the
    /// restarts and last exit of the one before.
    pub fn manager_started(&self, stats: &Arc<super::ActorStats>) {
        let mut m = self.manager.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(before) = m.as_ref() {
            stats.inherit(before);
        }
        *m = Some(stats.clone());
    }

    /// The node manager serving (or that last served) this node.
    pub fn manager(&self) -> Option<Arc<super::ActorStats>> {
        self.manager.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn seen(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<InstanceId, Connections>> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A state-changing command for `instance` goes out on `connection`.
    pub fn commanded(&self, instance: &InstanceId, connection: u64) {
        let mut seen = self.seen();
        let c = seen.entry(instance.clone()).or_default();
        c.commanded = c.commanded.max(connection);
    }

    /// Whether connection `connection`'s inventory still tells the truth
    /// about `instance`: no command went out since it was taken (on it or
    /// a later connection) and no later connection's inventory was applied.
    /// Noted as applied when it does.
    pub fn inventory_applies(&self, instance: &InstanceId, connection: u64) -> bool {
        let mut seen = self.seen();
        let c = seen.entry(instance.clone()).or_default();
        if c.commanded >= connection || c.inventoried > connection {
            return false;
        }
        c.inventoried = connection;
        true
    }

    pub fn record(&self) -> Arc<NodeRecord> {
        self.record.load_full()
    }

    /// A re-registration (new address, labels, capabilities).
    pub fn set_record(&self, record: NodeRecord) {
        self.record.store(Arc::new(record));
    }

    /// The instances on this node, with their cluster's name.
    pub fn instances(&self) -> Arc<OrdMap<InstanceId, Arc<str>>> {
        self.instances.load_full()
    }

    pub fn instance_count(&self) -> usize {
        self.instances.load().len()
    }

    /// Several cluster actors may place on one node at once: read-copy-update.
    pub fn add_instances(&self, ids: &[(InstanceId, Arc<str>)]) {
        self.instances.rcu(|cur| {
            let mut next = OrdMap::clone(cur);
            for (id, cluster) in ids {
                next.insert(id.clone(), cluster.clone());
            }
            next
        });
    }

    pub fn remove_instances(&self, ids: &[InstanceId]) {
        self.instances.rcu(|cur| {
            let mut next = OrdMap::clone(cur);
            for id in ids {
                next.remove(id);
            }
            next
        });
        let mut seen = self.seen();
        for id in ids {
            seen.remove(id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::testdata as td;

    #[test]
    fn status_follows_silence_and_connection() {
        let live = NodeLive::default();
        let now = Instant::now();
        let (u, d) = (Duration::from_secs(6), Duration::from_secs(30));
        assert_eq!(live.status_at(now, u, d), NodeStatus::Unknown, "not heard from yet: the reconnect grace");
        let later = now + Duration::from_secs(31);
        assert_eq!(live.status_at(later, u, d), NodeStatus::Down, "never heard from within down_after");
        live.connect(1);
        assert_eq!(live.status_at(now, u, d), NodeStatus::Ready);
        assert_eq!(live.status_at(now + Duration::from_secs(10), u, d), NodeStatus::Unknown);
        assert_eq!(live.status_at(now + Duration::from_secs(40), u, d), NodeStatus::Down);
        // A newer connection is not marked down by the old one closing.
        // Nor does an old connection's end say how the live one ended.
        live.connect(2);
        live.disconnect(1, true);
        assert!(live.connected());
        assert!(!live.agent_ended());
        live.disconnect(2, false);
        assert_eq!(live.status_at(now, u, d), NodeStatus::Unknown, "just disconnected");
        assert!(!live.agent_ended(), "ended by the master");
        live.connect(3);
        live.disconnect(3, true);
        assert!(live.agent_ended(), "ended by the agent");
        live.connect(4);
        assert!(!live.agent_ended(), "a new connection forgets how the last one ended");
    }

    #[test]
    fn the_instance_index_follows_adds_and_removes() {
        let n = NodeEntry::new(td::node("node-1"));
        let c: Arc<str> = Arc::from("web");
        n.add_instances(&[(InstanceId::new("a"), c.clone()), (InstanceId::new("b"), c.clone())]);
        let held = n.instances();
        n.remove_instances(&[InstanceId::new("a")]);
        assert_eq!(held.len(), 2);
        assert_eq!(n.instance_count(), 1);
        assert_eq!(n.instances().get(&InstanceId::new("b")).map(|s| &**s), Some("web"));
    }
}
