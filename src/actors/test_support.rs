//! What the actor tests share: a [`Shared`] over a real store in a temp
//! dir, whose writes a test can make fail ([`FlakyStore`]), records of a
//! small cluster, and a link to a node that the test answers itself (it
//! plays the agent).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use time::OffsetDateTime;
use tokio::sync::mpsc;

use super::cluster::{OpRequest, RunOperation};
use super::node_link::{CHUNK_BUDGET, NodeLink, NodeLinks, Outgoing, lock};
use super::placement::PortAllocator;
use super::read_model::Reservation;
use super::read_model::{ActorStats, PackageView, ReadModel};
use super::registry::{ClusterHandle, Registry};
use super::supervisor::{Boot, Supervisor};
use super::{Limits, Shared, Timing};
use crate::ids::{ClusterId, InstanceId, NodeId};
use crate::protocol::messages::{AgentRequest, AgentResponse, MasterFrame};
use crate::spec::ComponentSpec;
use crate::storage::keys::master_cf;
use crate::storage::meta::{Pairs, Scan, StoreStats};
use crate::storage::records::OperationRecord;
use crate::storage::records::{
    ClusterRecord, ClusterStatus, DesiredState, InstanceRecord, InstanceStatus, PackageRecord, PackageRef,
    PendingRestart, RECORD_VERSION, RoleState,
};
use crate::storage::writer::{Appended, Committed};
use crate::storage::{BlobStore, MasterStore, MetaStore, StorageError, WriteOp};
use actix::prelude::*;

/// Which commits fail.
type Rule = Box<dyn Fn(&[WriteOp]) -> bool + Send + Sync>;

/// The master's store, with writes a test makes fail: every commit the
/// rule matches fails (nothing of it is written), as a RocksDB write error
/// would.
pub struct FlakyStore {
    inner: MasterStore,
    /// Which commits fail, how many more times, and whether as a frozen
    /// store (shutdown) or as a failed write.
    rule: Mutex<Option<(Rule, usize, bool)>>,
    /// Commits refused so far.
    pub refused: AtomicU64,
    /// The next commit this rule matches is written, and its answer held
    /// until the test releases it (a write in flight).
    hold: Mutex<Option<(Rule, Arc<tokio::sync::Notify>)>>,
}

impl FlakyStore {
    /// The next `times` commits that `rule` matches fail.
    pub fn fail(&self, times: usize, rule: impl Fn(&[WriteOp]) -> bool + Send + Sync + 'static) {
        *lock(&self.rule) = Some((Box::new(rule), times, false));
    }

    /// Every commit `rule` matches is refused as by a frozen store.
    pub fn freeze_for(&self, rule: impl Fn(&[WriteOp]) -> bool + Send + Sync + 'static) {
        *lock(&self.rule) = Some((Box::new(rule), usize::MAX, true));
    }

    /// The next commit `rule` matches is written at once and answered only
    /// once the returned notify is notified.
    pub fn hold(&self, rule: impl Fn(&[WriteOp]) -> bool + Send + Sync + 'static) -> Arc<tokio::sync::Notify> {
        let release = Arc::new(tokio::sync::Notify::new());
        *lock(&self.hold) = Some((Box::new(rule), release.clone()));
        release
    }

    /// The release of a hold whose rule matches `ops` (once).
    fn take_hold(&self, ops: &[WriteOp]) -> Option<Arc<tokio::sync::Notify>> {
        let mut hold = lock(&self.hold);
        hold.as_ref().is_some_and(|(rule, _)| rule(ops)).then(|| hold.take().expect("matched").1)
    }

    fn refuse(&self, ops: &[WriteOp]) -> Option<StorageError> {
        let mut rule = lock(&self.rule);
        let (matches, left, frozen) = rule.as_mut()?;
        if *left == 0 || !matches(ops) {
            return None;
        }
        *left -= 1;
        self.refused.fetch_add(1, Ordering::SeqCst);
        Some(if *frozen { StorageError::Frozen } else { injected() })
    }
}

/// `answer`, given only once `release` is notified (if any).
fn held(
    answer: BoxFuture<'static, Result<(), StorageError>>,
    release: Option<Arc<tokio::sync::Notify>>,
) -> BoxFuture<'static, Result<(), StorageError>> {
    let Some(release) = release else { return answer };
    async move {
        let r = answer.await;
        release.notified().await;
        r
    }
    .boxed()
}

fn injected() -> StorageError {
    StorageError::Io { path: "test".into(), source: std::io::Error::other("injected write failure") }
}

/// Runs a test's body on an actix system of its own.
pub fn run<F: std::future::Future>(f: F) -> F::Output {
    actix::System::new().block_on(f)
}

/// A journal write of a running operation: its header without the cluster.
pub fn is_journal(ops: &[WriteOp]) -> bool {
    let put = |cf: &str| ops.iter().any(|o| matches!(o, WriteOp::Put { cf: c, .. } if *c == cf));
    put(master_cf::OPERATIONS) && !put(master_cf::CLUSTERS)
}

/// The write that creates an operation (its plan with it).
pub fn is_new_operation(ops: &[WriteOp]) -> bool {
    ops.iter().any(|o| matches!(o, WriteOp::Put { cf, .. } if *cf == master_cf::OP_PLANS))
}

/// A write of a cluster record.
pub fn is_cluster_write(ops: &[WriteOp]) -> bool {
    ops.iter().any(|o| matches!(o, WriteOp::Put { cf, .. } if *cf == master_cf::CLUSTERS))
}

impl MetaStore for FlakyStore {
    fn commit(&self, ops: Vec<WriteOp>) -> BoxFuture<'static, Result<(), StorageError>> {
        if let Some(e) = self.refuse(&ops) {
            return async { Err(e) }.boxed();
        }
        let release = self.take_hold(&ops);
        held(self.inner.commit(ops), release)
    }

    fn try_commit(&self, ops: Vec<WriteOp>) -> BoxFuture<'static, Result<(), StorageError>> {
        if let Some(e) = self.refuse(&ops) {
            return async { Err(e) }.boxed();
        }
        let release = self.take_hold(&ops);
        held(self.inner.try_commit(ops), release)
    }

    fn get(&self, cf: &'static str, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError> {
        self.inner.get(cf, key)
    }

    fn scan(&self, cf: &'static str, scan: &Scan, limit: usize) -> Result<Pairs, StorageError> {
        self.inner.scan(cf, scan, limit)
    }

    fn subscribe(&self) -> tokio::sync::broadcast::Receiver<Arc<Committed>> {
        self.inner.subscribe()
    }

    fn subscribe_appends(&self) -> tokio::sync::broadcast::Receiver<Arc<Appended>> {
        self.inner.subscribe_appends()
    }

    fn freeze(&self) {
        self.inner.freeze()
    }

    fn stats(&self) -> StoreStats {
        self.inner.stats()
    }
}

/// A master's shared state without agents, HTTP or threads of its own.
pub struct Harness {
    pub shared: Shared,
    pub store: Arc<FlakyStore>,
    _dir: tempfile::TempDir,
}

/// A package whose one role, `server`, has one port and may have no member.
pub const SPEC: &str = r#"
[component]
name = "t"
version = "1"

[[roles]]
name = "server"
count = { min = 0, max = 9 }
ports = ["client"]
start = ["bin/start"]
stop_grace = "1s"
"#;

impl Harness {
    pub fn new() -> Harness {
        let dir = tempfile::tempdir().expect("temp dir");
        let inner = MasterStore::open(&dir.path().join("db")).expect("store");
        let store =
            Arc::new(FlakyStore { inner, rule: Mutex::default(), refused: AtomicU64::new(0), hold: Mutex::default() });
        let meta: Arc<dyn MetaStore> = store.clone();
        let read_model = ReadModel::new(meta.clone());
        let spec = ComponentSpec::parse(SPEC).expect("spec");
        let record = PackageRecord {
            version: RECORD_VERSION,
            name: "t".into(),
            package_version: "1".into(),
            sha256: "ab".repeat(32),
            size: 1,
            spec_toml: SPEC.into(),
            uploaded_at: OffsetDateTime::now_utc(),
        };
        read_model.put_package(PackageView { record: Arc::new(record), spec: Arc::new(spec) });
        let shared = Shared {
            in_flight: Default::default(),
            tasks: Arc::default(),
            pools: Arc::default(),
            role: Arc::new(crate::actors::role::Role::single("test".into(), "http://127.0.0.1:0".into())),
            peers: None,
            store: meta,
            blobs: Arc::new(BlobStore::open(&dir.path().join("packages")).expect("blobs")),
            read_model,
            links: NodeLinks::default(),
            registry: Registry::default(),
            ports: Arc::new(PortAllocator::from_instances(std::iter::empty())),
            timing: Timing {
                heartbeat_interval: Duration::from_secs(1),
                agent_reply_timeout: Duration::from_secs(5),
                agent_send_timeout: Duration::from_secs(5),
                node_unknown_after: Duration::from_secs(3),
                node_down_after: Duration::from_secs(6),
                step_idle_margin: crate::actors::STEP_IDLE_MARGIN,
                pool_quiet: Duration::ZERO,
            },
            limits: Limits::default(),
            supervisor: ActorStats::new("supervisor", "supervisor", None),
            arbiters: Arc::new(Vec::new()),
            link_arbiters: Arc::new(Vec::new()),
            priorities: Arc::new(vec![Arc::default()]),
            chunk_budget: Arc::new(tokio::sync::Semaphore::new(CHUNK_BUDGET)),
        };
        Harness { shared, store, _dir: dir }
    }

    /// Writes `cluster` and `instances` as a master would have before a restart.
    pub async fn persist(&self, cluster: &ClusterRecord, instances: &[InstanceRecord]) {
        let mut ops = vec![WriteOp::put_cluster(cluster).unwrap()];
        for i in instances {
            ops.push(WriteOp::put_instance(i).unwrap());
        }
        self.shared.store.commit(ops).await.unwrap();
    }

    /// Starts the supervisor on `clusters` as a master's boot would, once
    /// every cluster actor runs; `n1` is a registered node.
    pub async fn boot(&self, clusters: Vec<ClusterRecord>, instances: Vec<InstanceRecord>) -> Addr<Supervisor> {
        let mut node = crate::storage::testdata::node("n1");
        node.address = "127.0.0.1".into();
        self.shared.read_model.register_node(node);
        let (started, booted) = tokio::sync::oneshot::channel();
        let boot = Boot {
            clusters,
            instances,
            operations: Vec::new(),
            history: Default::default(),
            gone: Vec::new(),
            started: Some(started),
        };
        let supervisor = Supervisor::new(self.shared.clone(), boot).start();
        booted.await.expect("boot");
        supervisor
    }

    /// The cluster actor of `name` now.
    pub fn handle(&self, name: &str) -> ClusterHandle {
        self.shared.registry.get(name).expect("a cluster actor")
    }

    /// Runs `req` on cluster `name`; the operation once it is journaled.
    pub async fn run(&self, name: &str, req: OpRequest) -> Result<OperationRecord, crate::error::Error> {
        let h = self.handle(name);
        h.addr.send(RunOperation(req, Reservation::counted(&h.stats), None)).await.expect("mailbox")
    }

    /// The published record of cluster `name`.
    pub fn published(&self, name: &str) -> Arc<ClusterRecord> {
        self.shared.read_model.cluster(name).expect("a published cluster").record.clone()
    }

    /// An operation as the store holds it.
    pub fn stored_operation(&self, id: &crate::ids::OperationId) -> OperationRecord {
        crate::storage::meta::operation(&*self.shared.store, id).unwrap().expect("a stored operation")
    }

    /// A cluster as the store holds it.
    pub fn stored_cluster(&self, c: &ClusterRecord) -> Option<ClusterRecord> {
        crate::storage::meta::load_cluster(&*self.shared.store, &c.id).unwrap().map(|s| s.record)
    }

    /// Every event stored, as (kind, data).
    pub fn events(&self) -> Vec<(String, serde_json::Value)> {
        crate::storage::meta::events_after(&*self.shared.store, 0, 100_000)
            .unwrap()
            .into_iter()
            .map(|e| (e.kind.clone(), serde_json::from_str(&e.data).unwrap_or_default()))
            .collect()
    }

    /// A link to `node` (connection `connection`) whose frames the test reads.
    pub fn link(&self, node: &str, connection: u64) -> FakeAgent {
        self.link_within(node, connection, Duration::from_secs(5))
    }

    /// The same, whose requests wait `reply` for their answers.
    pub fn link_within(&self, node: &str, connection: u64, reply: Duration) -> FakeAgent {
        let (tx, rx) = mpsc::channel(64);
        let link = NodeLink::new(
            NodeId::new(node),
            connection,
            tx,
            self.shared.chunk_budget.clone(),
            reply,
            Duration::from_secs(5),
        );
        self.shared.links.replace(link.clone());
        FakeAgent { link, frames: rx }
    }
}

/// The test's end of a [`NodeLink`]: requests arrive here, answers go back.
pub struct FakeAgent {
    pub link: NodeLink,
    frames: mpsc::Receiver<Outgoing>,
}

impl FakeAgent {
    /// The next request the master sends (heartbeats and acks skipped).
    pub async fn request(&mut self) -> (u64, AgentRequest) {
        loop {
            let (frame, _) = tokio::time::timeout(Duration::from_secs(10), self.frames.recv())
                .await
                .expect("a request within 10 s")
                .expect("the link is open");
            if let MasterFrame::Request { request_id, body, .. } = frame {
                return (request_id, body);
            }
        }
    }

    /// Answers every later stop and start as an agent would, until the
    /// link goes.
    pub fn serve(mut self) {
        actix::spawn(async move {
            let mut pid = 7000;
            while let Some((frame, _)) = self.frames.recv().await {
                let MasterFrame::Request { request_id, body, .. } = frame else { continue };
                let answer = match body {
                    AgentRequest::Stop { .. } => AgentResponse::Stopped { was_running: true },
                    AgentRequest::Start { .. } => {
                        pid += 1;
                        AgentResponse::Started { pid, already_running: false }
                    }
                    _ => continue,
                };
                self.answer(request_id, answer);
            }
        });
    }

    pub fn answer(&self, request_id: u64, body: AgentResponse) {
        if let Some(tx) = lock(&self.link.pending).get(&request_id).cloned() {
            let _ = tx.unbounded_send(body);
        }
    }
}

/// A cluster `name` (Active, idle) of package `t` 1 with `members` members
/// of role `server` on node `n1`, all Running as pids 1000, 1001, ...
pub fn cluster(name: &str, members: u32) -> (ClusterRecord, Vec<InstanceRecord>) {
    let now = OffsetDateTime::now_utc();
    let cluster = ClusterRecord {
        version: RECORD_VERSION,
        id: ClusterId::random(),
        name: name.into(),
        package: PackageRef { name: "t".into(), version: "1".into() },
        status: ClusterStatus::Active,
        status_description: "create succeeded".into(),
        config: Default::default(),
        roles: [("server".to_string(), RoleState { next_ordinal: members + 1, limits: None, node_labels: None })]
            .into_iter()
            .collect(),
        operation: None,
        created_at: now,
        updated_at: now,
    };
    let instances = (1..=members)
        .map(|ordinal| InstanceRecord {
            version: RECORD_VERSION,
            id: InstanceId::generate(name, &cluster.id, "server", ordinal),
            cluster_id: cluster.id,
            cluster: name.into(),
            role: "server".into(),
            ordinal,
            node: NodeId::new("n1"),
            host: "127.0.0.1".into(),
            ports: [("client".to_string(), 20000 + ordinal as u16)].into_iter().collect(),
            status: InstanceStatus::Running,
            desired: DesiredState::Running,
            pid: Some(999 + ordinal),
            generation: 1,
            dir: format!("/tmp/instances/{ordinal}").into(),
            last_error: None,
            // As a create leaves them: installed at the cluster's version.
            applied: Some(Arc::new(crate::storage::records::Applied { package_version: "1".into(), limits: None })),
            pending_restart: PendingRestart::No,
        })
        .collect();
    (cluster, instances)
}

/// Polls `check` every 10 ms until it holds; panics after 10 s.
pub async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !check() {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
