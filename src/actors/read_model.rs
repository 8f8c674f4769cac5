//! The read model: a shared snapshot of everything the API shows.
//!
//! Actors own the truth and publish a copy here after every change that is
//! durable; every GET reads from here, never through an actor's mailbox, so
//! a dashboard or a load test never queues behind a long install. Locks are
//! held only to copy a record in or out (never across an `.await`).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};

use time::OffsetDateTime;
use tokio::sync::Notify;

use crate::ids::{InstanceId, NodeId, OperationId};
use crate::spec::ComponentSpec;
use crate::storage::records::{
    ClusterRecord, InstanceRecord, LeftoverRecord, NodeRecord, NodeStatus, OperationRecord, PackageRecord,
};

/// A node as the API shows it: its registration plus liveness.
#[derive(Debug, Clone)]
pub struct NodeView {
    pub record: NodeRecord,
    pub status: NodeStatus,
    pub connected: bool,
    pub last_heartbeat: Option<OffsetDateTime>,
}

/// A package with its parsed spec.
#[derive(Debug, Clone)]
pub struct PackageView {
    pub record: PackageRecord,
    pub spec: Arc<ComponentSpec>,
}

#[derive(Default)]
pub struct State {
    pub clusters: BTreeMap<String, ClusterRecord>,
    pub instances: BTreeMap<InstanceId, InstanceRecord>,
    pub nodes: BTreeMap<NodeId, NodeView>,
    pub packages: BTreeMap<(String, String), PackageView>,
    pub operations: HashMap<OperationId, OperationRecord>,
    /// Instances a force delete left on unreachable agents.
    pub leftovers: BTreeMap<InstanceId, LeftoverRecord>,
}

impl State {
    /// A cluster's instances, by role then ordinal.
    pub fn cluster_instances(&self, cluster: &str) -> Vec<InstanceRecord> {
        let mut v: Vec<InstanceRecord> = self.instances.values().filter(|i| i.cluster == cluster).cloned().collect();
        v.sort_by(|a, b| (a.role.as_str(), a.ordinal).cmp(&(b.role.as_str(), b.ordinal)));
        v
    }
}

/// Counters one actor publishes for `GET /actors`.
#[derive(Debug, Default)]
pub struct ActorStats {
    pub kind: &'static str,
    pub id: String,
    pub parent: Option<String>,
    /// Messages sent through a handle and not yet taken by the actor.
    pub queued: AtomicI64,
    pub handled: AtomicU64,
    pub state: Mutex<String>,
    pub current: Mutex<Option<String>>,
    pub last_error: Mutex<Option<String>>,
}

impl ActorStats {
    pub fn new(kind: &'static str, id: impl Into<String>, parent: Option<String>) -> Arc<Self> {
        Arc::new(ActorStats { kind, id: id.into(), parent, state: Mutex::new("starting".into()), ..Default::default() })
    }
    /// Called by a handle just before it sends a message.
    pub fn enqueue(&self) {
        self.queued.fetch_add(1, Ordering::Relaxed);
    }
    /// Called by the actor when it takes a message; `what` becomes its current work.
    pub fn begin(&self, what: impl Into<String>) {
        self.queued.fetch_sub(1, Ordering::Relaxed);
        self.handled.fetch_add(1, Ordering::Relaxed);
        set(&self.current, Some(what.into()));
    }
    pub fn end(&self, error: Option<String>) {
        set(&self.current, None);
        if error.is_some() {
            set(&self.last_error, error);
        }
    }
    pub fn set_state(&self, s: impl Into<String>) {
        set(&self.state, s.into());
    }
    pub fn snapshot(&self) -> ActorInfo {
        ActorInfo {
            kind: self.kind,
            id: self.id.clone(),
            parent: self.parent.clone(),
            state: get(&self.state),
            current: get(&self.current),
            mailbox: self.queued.load(Ordering::Relaxed).max(0) as u64,
            handled: self.handled.load(Ordering::Relaxed),
            last_error: get(&self.last_error),
        }
    }
}

fn set<T>(m: &Mutex<T>, v: T) {
    match m.lock() {
        Ok(mut g) => *g = v,
        Err(p) => *p.into_inner() = v,
    }
}

fn get<T: Clone>(m: &Mutex<T>) -> T {
    match m.lock() {
        Ok(g) => g.clone(),
        Err(p) => p.into_inner().clone(),
    }
}

#[derive(Debug, Clone)]
pub struct ActorInfo {
    pub kind: &'static str,
    pub id: String,
    pub parent: Option<String>,
    pub state: String,
    pub current: Option<String>,
    pub mailbox: u64,
    pub handled: u64,
    pub last_error: Option<String>,
}

/// The shared snapshot plus change notification for long-polls.
#[derive(Default)]
pub struct ReadModel {
    state: RwLock<State>,
    actors: Mutex<BTreeMap<String, Arc<ActorStats>>>,
    /// Woken whenever an operation record changes (`?wait=` long-polls).
    pub operation_changed: Notify,
}

impl ReadModel {
    pub fn new() -> Arc<Self> {
        Arc::new(ReadModel::default())
    }

    pub fn read(&self) -> RwLockReadGuard<'_, State> {
        self.state.read().unwrap_or_else(|p| p.into_inner())
    }

    pub fn write(&self) -> RwLockWriteGuard<'_, State> {
        self.state.write().unwrap_or_else(|p| p.into_inner())
    }

    pub fn put_operation(&self, op: &OperationRecord) {
        self.write().operations.insert(op.id, op.clone());
        self.operation_changed.notify_waiters();
    }

    pub fn register_actor(&self, stats: &Arc<ActorStats>) {
        let key = format!("{}/{}", stats.kind, stats.id);
        self.actors.lock().unwrap_or_else(|p| p.into_inner()).insert(key, stats.clone());
    }

    pub fn unregister_actor(&self, stats: &ActorStats) {
        let key = format!("{}/{}", stats.kind, stats.id);
        self.actors.lock().unwrap_or_else(|p| p.into_inner()).remove(&key);
    }

    pub fn actors(&self) -> Vec<ActorInfo> {
        self.actors.lock().unwrap_or_else(|p| p.into_inner()).values().map(|s| s.snapshot()).collect()
    }
}

impl NodeView {
    /// Ready while connected and heard from recently; Unknown after
    /// `unknown_after` of silence (or right after a disconnect); Down after
    /// `down_after`. Derived at read time, so no timer has to flip it.
    pub fn status_at(
        &self,
        now: OffsetDateTime,
        unknown_after: std::time::Duration,
        down_after: std::time::Duration,
    ) -> NodeStatus {
        let silent = self
            .last_heartbeat
            .map(|t| (now - t).try_into().unwrap_or(std::time::Duration::ZERO))
            .unwrap_or(std::time::Duration::MAX);
        if self.connected && silent < unknown_after {
            NodeStatus::Ready
        } else if silent < down_after {
            NodeStatus::Unknown
        } else {
            NodeStatus::Down
        }
    }
}
