//! The read model: what every GET reads, published by the actors after
//! every durable change, never through an actor's mailbox.
//!
//! Each part is an immutable snapshot behind an `ArcSwap` (clusters and
//! their instances, nodes and the instances on each, packages, leftovers,
//! running operations): a reader loads one pointer and holds it as long as
//! it likes; writers build the next snapshot beside it and swap it in.
//! Readers never lock against writers, so a long `GET` of a 10,000-instance
//! cluster cannot stall an actor, and a dashboard cannot slow the master.
//!
//! | part | what | written by |
//! |---|---|---|
//! | clusters | per cluster: record + instances ([`cluster_view`]) | the cluster's actor |
//! | nodes | record, link liveness, instances placed there ([`nodes`]) | node managers, cluster actors |
//! | packages, leftovers | small maps | the package store, the supervisor, cluster actors |
//! | leaked instances | a small map, in memory only | the supervisor ([`crate::actors::leaked`]) |
//! | running operations | full records while they run | cluster actors |
//! | ended operations | read from the store on demand, paged | — |
//!
//! Nothing is published before it is durable: actors publish after their
//! write is acknowledged.

pub mod actor_stats;
pub mod cluster_view;
pub mod nodes;
pub mod removals;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use imbl::OrdMap;
use tokio::sync::Notify;

pub use actor_stats::{ActorInfo, ActorStats, Claim, Reservation};
pub use cluster_view::{ClusterCell, ClusterSnapshot, InstanceEntry, InstanceStats};
pub use nodes::{NodeEntry, NodeLive};

use crate::ids::{ClusterId, InstanceId, NodeId, OperationId};
use crate::spec::ComponentSpec;
use crate::storage::records::{CordonRecord, LeftoverRecord, OperationRecord, PackageRecord};
use crate::storage::{MetaStore, StorageError, meta};

/// A package with its parsed spec.
#[derive(Debug, Clone)]
pub struct PackageView {
    pub record: Arc<PackageRecord>,
    pub spec: Arc<ComponentSpec>,
}

/// An instance an agent holds that the master does not know (nor is
/// removing as a force delete's leftover): see [`crate::actors::leaked`].
/// Kept in memory only: after a master restart the agents' inventories
/// find it again and its grace starts over (later, never sooner).
#[derive(Debug, Clone, PartialEq)]
pub struct Leaked {
    pub node: NodeId,
    pub instance: InstanceId,
    /// When this master first saw it in the node's inventory.
    pub first_seen: time::OffsetDateTime,
    /// When it is removed; `None`: never (`leaked_grace` 0, report only).
    pub remove_at: Option<time::OffsetDateTime>,
    /// The generation the agent holds (0 for an unrecorded directory).
    pub generation: u64,
    pub running: bool,
    pub pid: Option<u32>,
    /// Only a directory: the agent holds no record of it.
    pub unrecorded: bool,
    /// A removal was sent and is not answered yet.
    pub removing: bool,
    /// Why the last removal failed (it is tried again).
    pub last_error: Option<String>,
}

/// Counters of the master's work, for `GET /health` and `flotilla bench`.
#[derive(Debug, Default)]
pub struct Counters {
    /// Durable, acknowledged changes of instance records (each commit of a
    /// record counts once, whatever batch carried it).
    pub instance_transitions: AtomicU64,
}

type Map<K, V> = ArcSwap<OrdMap<K, V>>;

/// Everything GETs read.
pub struct ReadModel {
    clusters: Map<String, Arc<ClusterCell>>,
    nodes: Map<NodeId, Arc<NodeEntry>>,
    packages: Map<(String, String), PackageView>,
    leftovers: Map<InstanceId, Arc<LeftoverRecord>>,
    leaked: Map<(NodeId, InstanceId), Arc<Leaked>>,
    cordons: Map<NodeId, Arc<CordonRecord>>,
    running: Map<OperationId, Arc<OperationRecord>>,
    /// Nodes a pool is removing, against allocations under way.
    pub removals: removals::Removals,
    actors: Mutex<BTreeMap<String, Arc<ActorStats>>>,
    store: Arc<dyn MetaStore>,
    pub counters: Counters,
    /// Woken whenever an operation record changes (`?wait=` long-polls).
    pub operation_changed: Notify,
    /// Operations on their way to the store and not yet published
    /// ([`Accepting`]). Never shown: a `?wait=` long-poll for one waits to
    /// be woken rather than reading the store, since the API may answer a
    /// request as soon as its operation is durable, before its actor has
    /// published it.
    accepting: Mutex<std::collections::HashSet<OperationId>>,
}

/// Held by a cluster actor from building an operation until it has
/// published it ([`Accepting::published`]), or learned it never will (its
/// write failed; dropped): then the operation's long-polls are woken to
/// look again.
#[must_use]
pub struct Accepting {
    read_model: Arc<ReadModel>,
    id: OperationId,
    /// Whether dropping it wakes the long-polls (not after `published`).
    wake: bool,
}

impl Accepting {
    /// After [`ReadModel::put_operation`], which woke the long-polls.
    pub fn published(mut self) {
        self.wake = false;
    }
}

impl Drop for Accepting {
    fn drop(&mut self) {
        self.read_model.accepting.lock().unwrap_or_else(|p| p.into_inner()).remove(&self.id);
        if self.wake {
            self.read_model.operation_changed.notify_waiters();
        }
    }
}

fn empty<K: Ord + Clone, V: Clone>() -> Map<K, V> {
    ArcSwap::from_pointee(OrdMap::new())
}

/// Replaces `map` with `f(map)`; retried if another writer swapped first.
fn rcu<K: Ord + Clone, V: Clone>(map: &Map<K, V>, f: impl Fn(&mut OrdMap<K, V>)) {
    map.rcu(|cur| {
        let mut next = OrdMap::clone(cur);
        f(&mut next);
        next
    });
}

impl ReadModel {
    pub fn new(store: Arc<dyn MetaStore>) -> Arc<Self> {
        Arc::new(ReadModel {
            clusters: empty(),
            nodes: empty(),
            packages: empty(),
            leftovers: empty(),
            leaked: empty(),
            cordons: empty(),
            running: empty(),
            removals: Default::default(),
            actors: Mutex::default(),
            store,
            counters: Counters::default(),
            operation_changed: Notify::new(),
            accepting: Mutex::default(),
        })
    }

    /// Marks `id` as on its way to the store until the guard is dropped.
    pub fn accepting(self: &Arc<Self>, id: OperationId) -> Accepting {
        self.accepting.lock().unwrap_or_else(|p| p.into_inner()).insert(id);
        Accepting { read_model: self.clone(), id, wake: true }
    }

    /// Whether `id` is on its way to the store (built, not yet published).
    pub fn is_accepting(&self, id: &OperationId) -> bool {
        self.accepting.lock().unwrap_or_else(|p| p.into_inner()).contains(id)
    }

    // ------------------------------------------------------------ clusters

    pub fn clusters(&self) -> Arc<OrdMap<String, Arc<ClusterCell>>> {
        self.clusters.load_full()
    }

    pub fn cluster(&self, name: &str) -> Option<Arc<ClusterSnapshot>> {
        self.clusters.load().get(name).map(|c| c.load())
    }

    /// The cell a cluster's snapshot is published in.
    pub fn cluster_cell(&self, name: &str) -> Option<Arc<ClusterCell>> {
        self.clusters.load().get(name).cloned()
    }

    /// Makes a cluster visible (its record is durable).
    pub fn add_cluster(&self, name: &str, cell: Arc<ClusterCell>) {
        rcu(&self.clusters, |m| {
            m.insert(name.to_string(), cell.clone());
        });
    }

    pub fn remove_cluster(&self, name: &str) {
        rcu(&self.clusters, |m| {
            m.remove(name);
        });
    }

    // ------------------------------------------------------------ nodes

    pub fn nodes(&self) -> Arc<OrdMap<NodeId, Arc<NodeEntry>>> {
        self.nodes.load_full()
    }

    pub fn node(&self, id: &NodeId) -> Option<Arc<NodeEntry>> {
        self.nodes.load().get(id).cloned()
    }

    /// The node's entry, created from `record` if it is new (a first
    /// registration), else updated with it.
    pub fn register_node(&self, record: crate::storage::records::NodeRecord) -> Arc<NodeEntry> {
        if let Some(n) = self.node(&record.id) {
            n.set_record(record);
            return n;
        }
        let id = record.id.clone();
        let entry = NodeEntry::new(record);
        rcu(&self.nodes, |m| {
            m.entry(id.clone()).or_insert_with(|| entry.clone());
        });
        self.node(&id).unwrap_or(entry)
    }

    /// Forgets a node (a provider node deleted, its certificate revoked,
    /// nothing placed on it): once its removal from the store is durable.
    pub fn forget_node(&self, id: &NodeId) {
        rcu(&self.nodes, |m| {
            m.remove(id);
        });
    }

    // ------------------------------------------------------------ packages

    pub fn packages(&self) -> Arc<OrdMap<(String, String), PackageView>> {
        self.packages.load_full()
    }

    pub fn package(&self, name: &str, version: &str) -> Option<PackageView> {
        self.packages.load().get(&(name.to_string(), version.to_string())).cloned()
    }

    pub fn put_package(&self, view: PackageView) {
        let key = (view.record.name.clone(), view.record.package_version.clone());
        rcu(&self.packages, |m| {
            m.insert(key.clone(), view.clone());
        });
    }

    pub fn remove_package(&self, name: &str, version: &str) -> Option<PackageView> {
        let key = (name.to_string(), version.to_string());
        let removed = self.packages.load().get(&key).cloned();
        rcu(&self.packages, |m| {
            m.remove(&key);
        });
        removed
    }

    // ------------------------------------------------------------ leftovers

    pub fn leftovers(&self) -> Arc<OrdMap<InstanceId, Arc<LeftoverRecord>>> {
        self.leftovers.load_full()
    }

    pub fn put_leftovers(&self, records: &[LeftoverRecord]) {
        rcu(&self.leftovers, |m| {
            for r in records {
                m.insert(r.instance.clone(), Arc::new(r.clone()));
            }
        });
    }

    pub fn remove_leftover(&self, id: &InstanceId) -> Option<Arc<LeftoverRecord>> {
        let removed = self.leftovers.load().get(id).cloned();
        rcu(&self.leftovers, |m| {
            m.remove(id);
        });
        removed
    }

    // ------------------------------------------------------------ leaked

    /// Instances agents hold that the master does not know, by node.
    /// Every cordon, by node.
    pub fn cordons(&self) -> Arc<OrdMap<NodeId, Arc<CordonRecord>>> {
        self.cordons.load_full()
    }

    /// The node's cordon, if an operator took it out of placement.
    pub fn cordon_of(&self, node: &NodeId) -> Option<Arc<CordonRecord>> {
        self.cordons.load().get(node).cloned()
    }

    /// Shown once durable (`actors::cordons`).
    pub fn put_cordon(&self, r: CordonRecord) {
        let r = Arc::new(r);
        rcu(&self.cordons, |m| {
            m.insert(r.node.clone(), r.clone());
        });
    }

    pub fn remove_cordon(&self, node: &NodeId) {
        rcu(&self.cordons, |m| {
            m.remove(node);
        });
    }

    pub fn leaked(&self) -> Arc<OrdMap<(NodeId, InstanceId), Arc<Leaked>>> {
        self.leaked.load_full()
    }

    pub fn put_leaked(&self, l: Leaked) {
        let l = Arc::new(l);
        rcu(&self.leaked, |m| {
            m.insert((l.node.clone(), l.instance.clone()), l.clone());
        });
    }

    pub fn remove_leaked(&self, node: &NodeId, id: &InstanceId) -> Option<Arc<Leaked>> {
        let key = (node.clone(), id.clone());
        let removed = self.leaked.load().get(&key).cloned();
        rcu(&self.leaked, |m| {
            m.remove(&key);
        });
        removed
    }

    // ------------------------------------------------------------ operations

    /// Publishes an operation (durable already). Only its header (status,
    /// steps without their results, no plan): results are read from the
    /// store, so a journal write of a 10,000-instance step does not copy
    /// every result into memory again. One that ended leaves the in-memory
    /// set: from then on it is read from the store.
    pub fn put_operation(&self, op: &OperationRecord) {
        let terminal = op.status.is_terminal();
        let arc = Arc::new(OperationRecord {
            steps: op
                .steps
                .iter()
                .map(|s| crate::storage::records::StepRecord {
                    name: s.name.clone(),
                    status: s.status,
                    error: s.error.clone(),
                    results: Vec::new(),
                })
                .collect(),
            resume: None,
            params: op.params.clone(),
            ..OperationRecord::clone_header(op)
        });
        rcu(&self.running, |m| {
            if terminal {
                m.remove(&op.id);
            } else {
                m.insert(op.id, arc.clone());
            }
        });
        self.operation_changed.notify_waiters();
    }

    /// Forgets an operation deleted from the store (a follower's view).
    pub fn forget_operation(&self, id: &OperationId) {
        rcu(&self.running, |m| {
            m.remove(id);
        });
        self.operation_changed.notify_waiters();
    }

    /// Forgets everything read from the store (a follower about to read
    /// it whole again); actors stay.
    pub fn clear(&self) {
        self.clusters.store(Arc::default());
        self.nodes.store(Arc::default());
        self.packages.store(Arc::default());
        self.leftovers.store(Arc::default());
        self.cordons.store(Arc::default());
        self.running.store(Arc::default());
        self.operation_changed.notify_waiters();
    }

    /// Operations that have not ended: their headers (no step results, no plan).
    pub fn running_operations(&self) -> Arc<OrdMap<OperationId, Arc<OperationRecord>>> {
        self.running.load_full()
    }

    /// One operation with its step results, as durable (blocking: call from
    /// a blocking context).
    pub fn operation(&self, id: &OperationId) -> Result<Option<Arc<OperationRecord>>, StorageError> {
        Ok(meta::operation(&*self.store, id)?.map(Arc::new))
    }

    /// A page of operations, newest first, without step results (blocking).
    pub fn operations_page(
        &self,
        cluster: Option<&ClusterId>,
        after: Option<&OperationId>,
        limit: usize,
    ) -> Result<Vec<OperationRecord>, StorageError> {
        meta::operations_page(&*self.store, cluster, after, limit)
    }

    // ------------------------------------------------------------ actors

    pub fn register_actor(&self, stats: &Arc<ActorStats>) {
        let key = format!("{}/{}", stats.kind, stats.id);
        self.actors.lock().unwrap_or_else(|p| p.into_inner()).insert(key, stats.clone());
    }

    pub fn unregister_actor(&self, stats: &ActorStats) {
        let key = format!("{}/{}", stats.kind, stats.id);
        let mut actors = self.actors.lock().unwrap_or_else(|p| p.into_inner());
        // A newer actor of the same id (a reconnected node) keeps its entry.
        if actors.get(&key).is_some_and(|a| std::ptr::eq(&**a, stats)) {
            actors.remove(&key);
        }
    }

    /// The supervisor, cluster actors and node managers.
    pub fn actors(&self) -> Vec<ActorInfo> {
        self.actors.lock().unwrap_or_else(|p| p.into_inner()).values().map(|s| s.snapshot()).collect()
    }

    /// The store's write statistics, for `GET /health`.
    pub fn store(&self) -> &Arc<dyn MetaStore> {
        &self.store
    }

    pub fn count_transitions(&self, n: u64) {
        self.counters.instance_transitions.fetch_add(n, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::storage::MasterStore;
    use crate::storage::records::OperationStatus;
    use crate::storage::testdata as td;

    /// An operation on its way to the store is not shown, its long-polls
    /// wait for it, and they are woken when it is published or when it
    /// never will be (its write refused).
    #[tokio::test]
    async fn an_accepted_operation_is_waited_for_until_published_or_refused() {
        let dir = tempfile::tempdir().expect("temp dir");
        let rm = ReadModel::new(Arc::new(MasterStore::open(&dir.path().join("db")).expect("store")));
        let c = td::cluster("c");
        let now = time::OffsetDateTime::now_utc();
        let pending = || OperationRecord { status: OperationStatus::Pending, ..td::operation(&c, now) };
        let (published, refused) = (pending(), pending());
        assert_ne!(published.id, refused.id);

        let guard = rm.accepting(published.id);
        assert!(rm.is_accepting(&published.id));
        assert!(rm.running_operations().get(&published.id).is_none(), "shown before it is durable");
        let woken = rm.operation_changed.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        rm.put_operation(&published);
        guard.published();
        assert!(!rm.is_accepting(&published.id));
        assert!(rm.running_operations().get(&published.id).is_some());
        tokio::time::timeout(Duration::from_secs(1), woken).await.expect("woken by the publication");

        let guard = rm.accepting(refused.id);
        let woken = rm.operation_changed.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        drop(guard);
        assert!(!rm.is_accepting(&refused.id));
        assert!(rm.running_operations().get(&refused.id).is_none());
        tokio::time::timeout(Duration::from_secs(1), woken).await.expect("woken: it will never be published");
    }
}
