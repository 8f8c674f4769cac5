//! [`MetaStore`]: the one narrow interface between the master and its
//! durable state — batched atomic writes, reads by key and by key range,
//! and a change feed — and the typed reads the master builds on it.
//!
//! Everything above storage (actors, the read model, boot) sees only this
//! trait, so a replicated engine (openraft over RocksDB, or etcd) can take
//! the place of the single-node RocksDB store ([`super::MasterStore`])
//! without touching them: it needs the same ordering (a write is
//! acknowledged once durable, and visible to reads from then on), the same
//! key order (byte-wise), and a feed of what it applied.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

use futures::future::BoxFuture;
use tokio::sync::broadcast;

use super::keys::{self, master_cf};
use super::records::{
    ClusterRecord, EventRecord, InstanceRecord, InstanceResult, LeftoverRecord, NodeRecord, OperationRecord,
    PackageRecord, Resumable,
};
use super::writer::{Appended, Committed};
use super::{StorageError, WriteOp, db};
use crate::ids::{ClusterId, OperationId};

/// Which keys a scan visits: those starting with `prefix`, from `from`
/// (inclusive; `None`: the first, or with `reverse` the last, of the
/// prefix), in byte order or backwards.
#[derive(Debug, Clone, Default)]
pub struct Scan {
    pub prefix: Vec<u8>,
    pub from: Option<Vec<u8>>,
    pub reverse: bool,
}

/// Key-value pairs as a scan returns them.
pub type Pairs = Vec<(Vec<u8>, Vec<u8>)>;

/// The master's durable state. See the module doc for what an engine owes.
pub trait MetaStore: Send + Sync + 'static {
    /// Applies `ops` atomically; resolves once they are durable. Waits for
    /// room when the engine's queue is full.
    fn commit(&self, ops: Vec<WriteOp>) -> BoxFuture<'static, Result<(), StorageError>>;
    /// Like [`commit`](Self::commit), but refuses at once with
    /// [`StorageError::Overloaded`] when the queue is full.
    fn try_commit(&self, ops: Vec<WriteOp>) -> BoxFuture<'static, Result<(), StorageError>>;
    /// One value (blocking: call from `spawn_blocking` or boot code).
    fn get(&self, cf: &'static str, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError>;
    /// The values of `keys`, in their order (blocking). An engine across
    /// a network asks for them together, not one round trip each.
    fn get_many(&self, cf: &'static str, keys: &[Vec<u8>]) -> Result<Vec<Option<Vec<u8>>>, StorageError> {
        keys.iter().map(|k| self.get(cf, k)).collect()
    }
    /// Up to `limit` pairs of a key range (blocking).
    fn scan(&self, cf: &'static str, scan: &Scan, limit: usize) -> Result<Pairs, StorageError>;
    /// Every batch made durable from now on, in order.
    fn subscribe(&self) -> broadcast::Receiver<Arc<Committed>>;
    /// What durable batches append to the log (events), from now on.
    fn subscribe_appends(&self) -> broadcast::Receiver<Arc<Appended>>;
    /// Refuses every later write (shutdown); writes already queued land.
    fn freeze(&self);
    /// After [`freeze`](Self::freeze), at exit: stops the engine's own
    /// background work (flushes, compactions) and waits for it, so the
    /// process never exits with the engine's threads mid-way (RocksDB
    /// aborts with `pthread lock: Invalid argument` when its statics go
    /// first). The store stays readable.
    fn quiesce(&self) {}
    /// Whether its writer still takes writes (a master whose writer died
    /// exits: `supervision::spec("store_writer")`).
    fn writer_alive(&self) -> bool {
        true
    }
    /// How long its writer has been in one write (`None`: not writing).
    fn writer_stuck_for(&self) -> Option<std::time::Duration> {
        None
    }
    /// What the engine has written, and what waits.
    fn stats(&self) -> StoreStats;
}

/// Write statistics of a store.
#[derive(Debug, Clone, Copy, Default, serde::Serialize, utoipa::ToSchema)]
pub struct StoreStats {
    /// Durable batches (one sync each).
    pub batches: u64,
    /// Acknowledged commits (several ride in one batch).
    pub commits: u64,
    /// Commits waiting in the queue.
    pub queued: usize,
    /// On etcd: transactions sent again because etcd evaluated them
    /// before the one they follow had landed (each costs a round trip).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sent_again: Option<u64>,
}

/// Everything the master loads at boot.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct MasterSnapshot {
    pub clusters: Vec<ClusterRecord>,
    /// Grouped by cluster (key order), not sorted further.
    pub instances: Vec<InstanceRecord>,
    pub nodes: Vec<NodeRecord>,
    /// Sorted by name, then version bytes.
    pub packages: Vec<PackageRecord>,
    /// Operations that had not ended, with their results and plans; oldest first.
    pub operations: Vec<OperationRecord>,
    /// The highest event sequence number stored, 0 when there is none.
    pub last_event_seq: u64,
    pub leftovers: Vec<LeftoverRecord>,
}

/// Up to `limit` events numbered above `after`, in order (blocking).
pub fn events_after(store: &dyn MetaStore, after: u64, limit: usize) -> Result<Vec<EventRecord>, StorageError> {
    let Some(from) = after.checked_add(1) else {
        return Ok(Vec::new());
    };
    let scan = Scan { from: Some(keys::event_key(from)), ..Scan::default() };
    store
        .scan(master_cf::EVENTS, &scan, limit)?
        .iter()
        .map(|(k, v)| {
            let mut e: EventRecord = db::decode_value(master_cf::EVENTS, k, v)?;
            e.seq = keys::event_seq(k).ok_or_else(|| {
                StorageError::Codec(format!("events: key {} is not a sequence number", hex::encode(k)))
            })?;
            Ok(e)
        })
        .collect()
}

/// Clusters and their instances as the boot takes them, in the store's
/// key order (clusters by id, instances grouped by cluster): read from the
/// store, or taken from a follower's view of it at one revision.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ClusterState {
    pub clusters: Vec<ClusterRecord>,
    pub instances: Vec<InstanceRecord>,
}

impl ClusterState {
    /// Puts records gathered in any order into the store's key order.
    pub fn sorted(mut clusters: Vec<ClusterRecord>, mut instances: Vec<InstanceRecord>) -> ClusterState {
        clusters.sort_by_cached_key(|c| keys::cluster_key(&c.id));
        instances.sort_by_cached_key(|i| keys::instance_key(&i.cluster_id, &i.id));
        ClusterState { clusters, instances }
    }

    /// Reads them from the store (blocking).
    pub fn load(store: &dyn MetaStore) -> Result<ClusterState, StorageError> {
        Ok(ClusterState { clusters: load(store, master_cf::CLUSTERS)?, instances: load(store, master_cf::INSTANCES)? })
    }

    /// The first difference from `other` (`self` being the store's, whose
    /// instances of a cluster no longer stored do not count: the boot
    /// drops them), for an operator: a record's id and what differs.
    pub fn difference(&self, other: &ClusterState) -> Option<String> {
        fn first<T: PartialEq + std::fmt::Debug>(
            what: &str,
            a: &[T],
            b: &[T],
            id: impl Fn(&T) -> String,
        ) -> Option<String> {
            if a.len() != b.len() {
                return Some(format!("{} {what} in the store, {} in the view", a.len(), b.len()));
            }
            let (x, y) = a.iter().zip(b).find(|(x, y)| x != y)?;
            Some(format!("{what} {}: {x:?} in the store, {y:?} in the view", id(x)))
        }
        let clusters: HashSet<_> = self.clusters.iter().map(|c| c.id).collect();
        let instances: Vec<_> = self.instances.iter().filter(|i| clusters.contains(&i.cluster_id)).cloned().collect();
        first("clusters", &self.clusters, &other.clusters, |c| c.name.clone())
            .or_else(|| first("instances", &instances, &other.instances, |i| i.id.to_string()))
    }
}

/// Reads what the master starts from: the live records, and the
/// operations that had not ended (those with a plan), with their results
/// and plans. Ended operations stay in the store (blocking).
pub fn load_boot(store: &dyn MetaStore) -> Result<MasterSnapshot, StorageError> {
    load_boot_with(store, None)
}

/// [`load_boot`], with the clusters and instances given (`known`: a
/// follower's view at a revision no older than the store's) rather than
/// read (blocking).
pub fn load_boot_with(store: &dyn MetaStore, known: Option<ClusterState>) -> Result<MasterSnapshot, StorageError> {
    let mut operations = Vec::new();
    for (key, _) in store.scan(master_cf::OP_PLANS, &Scan::default(), usize::MAX)? {
        let Some(id) = uuid::Uuid::from_slice(&key).ok().map(OperationId) else { continue };
        if let Some(mut op) = operation(store, &id)? {
            op.resume = plan(store, &id)?;
            operations.push(op);
        }
    }
    operations.sort_by_key(|o: &OperationRecord| o.created_at);
    let last = store.scan(master_cf::EVENTS, &Scan { reverse: true, ..Scan::default() }, 1)?;
    let last_event_seq = match last.first() {
        None => 0,
        Some((k, _)) => keys::event_seq(k)
            .ok_or_else(|| StorageError::Codec(format!("events: key {} is not a sequence number", hex::encode(k))))?,
    };
    let ClusterState { clusters, instances } = match known {
        Some(k) => k,
        None => ClusterState::load(store)?,
    };
    Ok(MasterSnapshot {
        clusters,
        instances,
        nodes: load(store, master_cf::NODES)?,
        packages: load(store, master_cf::PACKAGES)?,
        operations,
        last_event_seq,
        leftovers: load(store, master_cf::LEFTOVERS)?,
    })
}

/// Each cluster's ended operations still stored, oldest first.
pub type Histories = HashMap<ClusterId, VecDeque<(u64, OperationId)>>;

/// Ended operations of clusters that no longer exist (created nanos, id, cluster).
pub type Orphaned = Vec<(u64, OperationId, ClusterId)>;

/// The ended operations still stored (those not in `snap.operations`):
/// each cluster's history, and those of clusters that no longer exist
/// (blocking).
pub fn ended_operations(store: &dyn MetaStore, snap: &MasterSnapshot) -> Result<(Histories, Orphaned), StorageError> {
    let running: HashSet<_> = snap.operations.iter().map(|o| o.id).collect();
    let mut history: Histories = snap.clusters.iter().map(|c| (c.id, VecDeque::new())).collect();
    let mut gone = Vec::new();
    for (cluster, created, id) in all_cluster_operations(store)? {
        if running.contains(&id) {
            continue;
        }
        match history.get_mut(&cluster) {
            Some(ended) => ended.push_back((created, id)),
            None => gone.push((created, id, cluster)),
        }
    }
    Ok((history, gone))
}

/// One cluster as the store holds it: what its actor is restarted from.
#[derive(Debug, Clone)]
pub struct StoredCluster {
    pub record: ClusterRecord,
    pub instances: Vec<InstanceRecord>,
    /// The operation it is busy with (with its results and plan), if any.
    pub operation: Option<OperationRecord>,
    /// Its other operations still stored (created nanos, id), oldest first.
    pub history: std::collections::VecDeque<(u64, OperationId)>,
}

/// Reads one cluster, `None` when it is not stored (blocking).
pub fn load_cluster(store: &dyn MetaStore, id: &ClusterId) -> Result<Option<StoredCluster>, StorageError> {
    let key = keys::cluster_key(id);
    let Some(raw) = store.get(master_cf::CLUSTERS, &key)? else {
        return Ok(None);
    };
    let record: ClusterRecord = db::decode_value(master_cf::CLUSTERS, &key, &raw)?;
    let scan = Scan { prefix: keys::cluster_instances_prefix(id), ..Scan::default() };
    let instances = store
        .scan(master_cf::INSTANCES, &scan, usize::MAX)?
        .iter()
        .map(|(k, v)| db::decode_value(master_cf::INSTANCES, k, v))
        .collect::<Result<Vec<InstanceRecord>, _>>()?;
    let operation = match record.operation {
        Some(op) => operation(store, &op)?.map(|mut o| {
            plan(store, &op).map(|p| {
                o.resume = p;
                o
            })
        }),
        None => None,
    }
    .transpose()?;
    let history = store
        .scan(master_cf::CLUSTER_OPS, &Scan { prefix: key, ..Scan::default() }, usize::MAX)?
        .iter()
        .filter_map(|(k, _)| Some((keys::nanos_of_index_key(k, true)?, keys::op_of_index_key(k)?)))
        .filter(|(_, op)| Some(*op) != record.operation)
        .collect();
    Ok(Some(StoredCluster { record, instances, operation, history }))
}

/// Decodes every value of `cf` (boot).
pub fn load<T: serde::de::DeserializeOwned>(store: &dyn MetaStore, cf: &'static str) -> Result<Vec<T>, StorageError> {
    store.scan(cf, &Scan::default(), usize::MAX)?.iter().map(|(k, v)| db::decode_value(cf, k, v)).collect()
}

/// One operation with its step results (blocking).
pub fn operation(store: &dyn MetaStore, id: &OperationId) -> Result<Option<OperationRecord>, StorageError> {
    let key = keys::operation_key(id);
    let Some(raw) = store.get(master_cf::OPERATIONS, &key)? else {
        return Ok(None);
    };
    let mut op: OperationRecord = db::decode_value(master_cf::OPERATIONS, &key, &raw)?;
    for (k, v) in store.scan(master_cf::OP_RESULTS, &Scan { prefix: key, ..Scan::default() }, usize::MAX)? {
        let Some(step) = k.get(16..18).map(|b| u16::from_be_bytes([b[0], b[1]]) as usize) else { continue };
        let results: Vec<InstanceResult> = db::decode_value(master_cf::OP_RESULTS, &k, &v)?;
        if let Some(s) = op.steps.get_mut(step) {
            s.results = results;
        }
    }
    Ok(Some(op))
}

/// The plan of an operation that has not ended (boot).
pub fn plan(store: &dyn MetaStore, id: &OperationId) -> Result<Option<Resumable>, StorageError> {
    let key = keys::operation_key(id);
    store.get(master_cf::OP_PLANS, &key)?.map(|raw| db::decode_value(master_cf::OP_PLANS, &key, &raw)).transpose()
}

/// A page of operations, newest first, without step results: those of
/// `cluster` (or all), older than the operation `after` (a cursor from the
/// previous page), at most `limit`. A cursor naming an operation that is
/// gone (deleted by retention since) is [`StorageError::CursorGone`].
pub fn operations_page(
    store: &dyn MetaStore,
    cluster: Option<&ClusterId>,
    after: Option<&OperationId>,
    limit: usize,
) -> Result<Vec<OperationRecord>, StorageError> {
    let (cf, prefix) = match cluster {
        Some(c) => (master_cf::CLUSTER_OPS, keys::cluster_key(c)),
        None => (master_cf::OPS_BY_TIME, Vec::new()),
    };
    let mut from = None;
    let mut skip = None;
    if let Some(after) = after {
        let Some(op) = header(store, after)? else {
            // Its creation time, where the page starts, went with it.
            return Err(StorageError::CursorGone(after.to_string()));
        };
        let created = keys::nanos(op.created_at);
        from = Some(match cluster {
            Some(c) => keys::cluster_op_key(c, created, after),
            None => keys::op_time_key(created, after),
        });
        skip = Some(*after);
    }
    let scan = Scan { prefix, from, reverse: true };
    // One more than asked: the cursor itself comes first.
    let ids: Vec<OperationId> = store
        .scan(cf, &scan, limit.saturating_add(1))?
        .iter()
        .filter_map(|(k, _)| keys::op_of_index_key(k))
        .filter(|id| Some(*id) != skip)
        .take(limit)
        .collect();
    // Read together (on etcd, one round trip for the page, not one each).
    let op_keys: Vec<Vec<u8>> = ids.iter().map(keys::operation_key).collect();
    let mut out = Vec::with_capacity(ids.len());
    for (key, raw) in op_keys.iter().zip(store.get_many(master_cf::OPERATIONS, &op_keys)?) {
        if let Some(raw) = raw {
            out.push(db::decode_value(master_cf::OPERATIONS, key, &raw)?);
        }
    }
    Ok(out)
}

/// Every entry of the `cluster_ops` index: (cluster, created nanos,
/// operation), by cluster, oldest first within each (boot).
pub fn all_cluster_operations(store: &dyn MetaStore) -> Result<Vec<(ClusterId, u64, OperationId)>, StorageError> {
    Ok(store
        .scan(master_cf::CLUSTER_OPS, &Scan::default(), usize::MAX)?
        .iter()
        .filter_map(|(k, _)| {
            Some((keys::cluster_of_index_key(k)?, keys::nanos_of_index_key(k, true)?, keys::op_of_index_key(k)?))
        })
        .collect())
}

fn header(store: &dyn MetaStore, id: &OperationId) -> Result<Option<OperationRecord>, StorageError> {
    let key = keys::operation_key(id);
    store.get(master_cf::OPERATIONS, &key)?.map(|raw| db::decode_value(master_cf::OPERATIONS, &key, &raw)).transpose()
}
