//! Node pools (the Nodepool seed): where nodes come from. Each pool is a
//! driver ([`crate::providers`]) with its settings; node requests ask for
//! `count` nodes carrying some labels, and the launcher
//! ([`launcher`]) serves them: the pools that offer the labels are tried
//! by priority, a pool that cannot serve a request declines it with its
//! reason, and a request fails only once every pool has declined it.
//!
//! The launcher is one supervised task (`pool_launcher` in the tree), the
//! only writer of pool nodes and requests. Everything it decides is
//! durable before it acts on it or shows it: a node is recorded
//! `launching` before the driver's `create`, so a master killed during the
//! call finds the resource by its tag at the next start and adopts it.
//! Readers (`GET /pools`, `/node-requests`) see [`PoolsView`], swapped in
//! after each commit.
//!
//! Beside the launcher's loop: `requests` (assignment, declines,
//! min-ready), `tries` (failed tries, unwinding), `retire` (removals, idle
//! and old spares), `evacuate` (members moved off a node being removed),
//! `repair` (nodes `Down` past `replace_after`), `cleanup` (leaks).

pub mod cleanup;
mod evacuate;
pub mod launcher;
mod repair;
mod requests;
mod retire;
mod tries;

pub use requests::{MIN_READY_PRIORITY, waiting_for};
pub use retire::{DO_NOT_DISRUPT, SETTLE};

use std::collections::BTreeMap;
use std::sync::Arc;

use arc_swap::ArcSwap;
use time::OffsetDateTime;
use tokio::sync::{mpsc, oneshot};

use crate::error::Error;
use crate::ids::NodeId;
use crate::providers::faulty::Faulty;
use crate::providers::pool_config::PoolConfig;
use crate::providers::{Driver, ErrorClass};
use crate::storage::pool_records::{NodeRequestRecord, PoolNodeRecord};

/// At most this many node requests not yet done.
pub const MAX_OPEN_REQUESTS: usize = 10_000;
/// At most this many nodes one request asks for.
pub const MAX_REQUEST_COUNT: u32 = 1_000;
/// Done requests kept (the oldest are dropped past it).
pub const DONE_REQUESTS_KEPT: usize = 1_000;
/// The priority of the requests placement files for an operation: ahead
/// of the API's default (100) and of min-ready spares.
pub const OPERATION_PRIORITY: u8 = 50;

/// One configured pool and its driver.
pub struct Pool {
    pub config: PoolConfig,
    pub driver: Arc<dyn Driver>,
    /// The same driver, when test hooks wrapped it with faults.
    pub faulty: Option<Arc<Faulty>>,
}

/// How a pool is doing, as the launcher last judged it.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct PoolHealth {
    /// A quota error: no launch until then (requests it could never serve
    /// are still declined).
    #[serde(with = "time::serde::rfc3339::option")]
    pub paused_until: Option<OffsetDateTime>,
    /// A capacity error: requests are declined until then.
    #[serde(with = "time::serde::rfc3339::option")]
    pub no_capacity_until: Option<OffsetDateTime>,
    /// A config error: every request is declined (until the master is
    /// started again with other settings).
    pub broken: Option<String>,
    /// A launch failed past its retries (cleared by the next success).
    pub unhealthy: Option<String>,
    pub last_error: Option<String>,
    /// Resources tagged for this pool that the store does not know.
    pub leaked: usize,
}

impl PoolHealth {
    /// `ok`, `paused`, `no_capacity`, `broken` or `unhealthy`.
    pub fn summary(&self, now: OffsetDateTime) -> &'static str {
        if self.broken.is_some() {
            "broken"
        } else if self.paused_until.is_some_and(|t| t > now) {
            "paused"
        } else if self.no_capacity_until.is_some_and(|t| t > now) {
            "no_capacity"
        } else if self.unhealthy.is_some() {
            "unhealthy"
        } else {
            "ok"
        }
    }
}

/// What readers see: every durable pool node and request, and each pool's
/// health.
#[derive(Debug, Clone, Default)]
pub struct PoolsView {
    pub nodes: BTreeMap<NodeId, PoolNodeRecord>,
    pub requests: BTreeMap<String, NodeRequestRecord>,
    pub health: BTreeMap<String, PoolHealth>,
    /// The launcher has loaded the store (and published at least once):
    /// until then no request is known, filed or not.
    pub loaded: bool,
}

/// A request for nodes, as the API or placement files it.
#[derive(Debug, Clone)]
pub struct NewRequest {
    pub labels: BTreeMap<String, String>,
    pub count: u32,
    pub requestor: String,
    pub priority: u8,
}

pub(crate) enum Command {
    Request(NewRequest, oneshot::Sender<Result<NodeRequestRecord, Error>>),
    Hold(NodeId, Option<OffsetDateTime>, oneshot::Sender<Result<PoolNodeRecord, Error>>),
    Remove(NodeId, oneshot::Sender<Result<PoolNodeRecord, Error>>),
    /// Fails every open request whose requestor starts with the prefix,
    /// with the reason (their operation ended).
    Cancel(String, String),
}

/// The pools of this master: their settings and drivers, what the
/// launcher last made durable, and the way to ask it for nodes.
pub struct Pools {
    /// By priority, then name.
    pub pools: Vec<Pool>,
    /// This installation's id (the `flotilla-master` tag).
    pub master_id: String,
    view: ArcSwap<PoolsView>,
    tx: mpsc::Sender<Command>,
    /// Taken by each incarnation of the launcher.
    rx: Arc<tokio::sync::Mutex<mpsc::Receiver<Command>>>,
}

impl Pools {
    pub fn new(master_id: String, mut pools: Vec<Pool>) -> Arc<Pools> {
        pools.sort_by(|a, b| (a.config.priority, &a.config.name).cmp(&(b.config.priority, &b.config.name)));
        let (tx, rx) = mpsc::channel(1024);
        Arc::new(Pools { pools, master_id, view: ArcSwap::default(), tx, rx: Arc::new(tokio::sync::Mutex::new(rx)) })
    }

    /// The tags of pool `pool`'s resources (but the node's).
    pub fn tags(&self, pool: &str) -> BTreeMap<String, String> {
        use crate::providers::driver::{TAG_MASTER, TAG_POOL};
        BTreeMap::from([(TAG_MASTER.to_string(), self.master_id.clone()), (TAG_POOL.to_string(), pool.to_string())])
    }

    pub fn view(&self) -> Arc<PoolsView> {
        self.view.load_full()
    }

    pub(crate) fn publish(&self, view: PoolsView) {
        self.view.store(Arc::new(view));
    }

    pub fn pool(&self, name: &str) -> Option<&Pool> {
        self.pools.iter().find(|p| p.config.name == name)
    }

    /// The provider node `node`, if a pool launched it.
    pub fn node(&self, node: &NodeId) -> Option<PoolNodeRecord> {
        self.view.load().nodes.get(node).cloned()
    }

    /// What [`request`](Self::request) refuses at once.
    pub fn check(&self, r: &NewRequest) -> Result<(), Error> {
        crate::ids::validate_labels(r.labels.iter()).map_err(|(k, m)| {
            Error::invalid("invalid_request", format!("labels{}: {m}", k.map(|k| format!(".{k}")).unwrap_or_default()))
        })?;
        if r.count == 0 || r.count > MAX_REQUEST_COUNT {
            return Err(Error::invalid("invalid_request", format!("count must be 1..={MAX_REQUEST_COUNT}")));
        }
        if !self.pools.iter().any(|p| p.config.offers(&r.labels)) {
            return Err(Error::conflict(
                "no_pool_offers",
                format!("no pool offers the labels {}: {}", shown(&r.labels), self.offered()),
            ));
        }
        Ok(())
    }

    /// The newest request filed by `requestor`.
    pub fn request_of(&self, requestor: &str) -> Option<NodeRequestRecord> {
        self.view.load().requests.values().filter(|r| r.requestor == requestor).max_by_key(|r| r.created_at).cloned()
    }

    /// What each pool offers, for a message.
    pub fn offered(&self) -> String {
        if self.pools.is_empty() {
            return "this master has no node pools ([[node_pools]] in its config)".into();
        }
        let each: Vec<String> =
            self.pools.iter().map(|p| format!("{} offers {{{}}}", p.config.name, shown(&p.config.labels))).collect();
        each.join("; ")
    }

    /// Files a node request; answers it once durable.
    pub async fn request(&self, r: NewRequest) -> Result<NodeRequestRecord, Error> {
        self.check(&r)?;
        let (answer, answered) = oneshot::channel();
        self.send(Command::Request(r, answer))?;
        wait(answered).await
    }

    /// Keeps provider node `node` out of every cleanup until `until`
    /// (`None`: releases a hold).
    pub async fn hold(&self, node: &NodeId, until: Option<OffsetDateTime>) -> Result<PoolNodeRecord, Error> {
        if self.node(node).is_none() {
            return Err(Error::not_found("provider node (one a pool launched)", node));
        }
        let (answer, answered) = oneshot::channel();
        self.send(Command::Hold(node.clone(), until, answer))?;
        wait(answered).await
    }

    /// Logs every pool, its open requests and its launches in flight
    /// (`SIGUSR2`, with the actors).
    pub fn dump(&self) {
        let view = self.view();
        let now = OffsetDateTime::now_utc();
        for p in &self.pools {
            let c = &p.config;
            let health = view.health.get(&c.name).cloned().unwrap_or_default();
            let nodes = view.nodes.values().filter(|n| n.pool == c.name).count();
            tracing::info!(
                target: "flotilla::dump",
                "pool {} ({}): {}, {nodes} of at most {} nodes{}",
                c.name,
                c.driver,
                health.summary(now),
                c.capacity().0,
                health.last_error.map(|e| format!(", last error: {e}")).unwrap_or_default()
            );
        }
        for r in view.requests.values().filter(|r| !r.state.is_done()) {
            tracing::info!(
                target: "flotilla::dump",
                "node request {} for {} x {{{}}} by {}: {}, pool {:?}, {} ready, declined by {:?}",
                r.id, r.count, shown(&r.labels), r.requestor, r.state.as_str(), r.pool, r.nodes.len(), r.declined_by
            );
        }
        for n in view.nodes.values().filter(|n| n.state != crate::storage::pool_records::Lifecycle::Ready) {
            tracing::info!(
                target: "flotilla::dump",
                "node {} of pool {}: {} since {}, try {}, external id {:?}{}",
                n.node, n.pool, n.state.as_str(), n.state_since, n.attempt, n.external_id,
                n.last_error.as_deref().map(|e| format!(", last error: {e}")).unwrap_or_default()
            );
        }
    }

    /// Removes provider node `node` (`retire`): answered once its
    /// removal is journaled (`draining`).
    pub async fn remove(&self, node: &NodeId) -> Result<PoolNodeRecord, Error> {
        if self.node(node).is_none() {
            return Err(Error::not_found("provider node (one a pool launched)", node));
        }
        let (answer, answered) = oneshot::channel();
        self.send(Command::Remove(node.clone(), answer))?;
        wait(answered).await
    }

    /// Cancels the open requests filed by `requestor_prefix` (an operation
    /// that ended without them): they fail with `why`; nodes already
    /// launching for them become spares. Best effort, not awaited: a
    /// master restarted first leaves them to be served.
    pub fn cancel(&self, requestor_prefix: String, why: String) {
        let open =
            self.view().requests.values().any(|r| !r.state.is_done() && r.requestor.starts_with(&requestor_prefix));
        if open && let Err(e) = self.send(Command::Cancel(requestor_prefix, why)) {
            tracing::warn!(error = %e, "a node request of an ended operation could not be cancelled");
        }
    }

    fn send(&self, c: Command) -> Result<(), Error> {
        self.tx.try_send(c).map_err(|_| Error::overloaded("the pool launcher has too many requests waiting"))
    }
}

/// The launcher's answer, within [`ANSWER_WITHIN`] (it may be restarting,
/// or listing a slow provider at its start).
async fn wait<T>(answered: oneshot::Receiver<Result<T, Error>>) -> Result<T, Error> {
    match tokio::time::timeout(ANSWER_WITHIN, answered).await {
        Ok(Ok(answer)) => answer,
        Ok(Err(_)) => Err(Error::unavailable("the pool launcher restarted; retry")),
        Err(_) => Err(Error::unavailable(format!(
            "the pool launcher did not answer within {} s (starting, or a provider is slow); retry",
            ANSWER_WITHIN.as_secs()
        ))),
    }
}

/// How long a request or a hold waits for the launcher.
const ANSWER_WITHIN: std::time::Duration = std::time::Duration::from_secs(30);

/// `k=v,k=v` (or `any` for none).
pub fn shown(labels: &BTreeMap<String, String>) -> String {
    if labels.is_empty() {
        return "any".into();
    }
    labels.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",")
}

/// A class for messages.
pub(crate) fn class_name(c: ErrorClass) -> &'static str {
    match c {
        ErrorClass::Quota => "quota",
        ErrorClass::Capacity => "capacity",
        ErrorClass::Config => "config",
        ErrorClass::Transient => "transient",
    }
}

/// The longest a node request may go unchanged while one of `pools`
/// launches for it: every try (past `launch_timeout`, then
/// `enroll_timeout`) and the backoffs between them, in the slowest pool.
/// A pool paused at its quota is not counted: an operation does not wait
/// on a provider's quota for ever.
pub fn longest_quiet(pools: &[PoolConfig]) -> std::time::Duration {
    pools
        .iter()
        .map(|c| {
            let tries = c.launch_retries + 1;
            let waits: std::time::Duration = (1..tries).map(tries::backoff).sum();
            (c.launch_timeout + c.enroll_timeout) * tries + waits
        })
        .max()
        .unwrap_or_default()
}

/// Makes every configured pool's driver (wrapped with faults when test
/// hooks are on) and starts the launcher under supervision
/// (`pool_launcher`).
pub fn start(
    shared: &crate::actors::Shared,
    trust: Arc<crate::actors::trust::Trust>,
    cordon_lock: Arc<tokio::sync::Mutex<()>>,
    cfg: &crate::config::MasterConfig,
    agent_addr: std::net::SocketAddr,
) -> Result<Arc<Pools>, crate::providers::pool_config::PoolConfigError> {
    let master_id = hex::encode(&trust.ca_fingerprint()[..8]);
    crate::providers::check_local_pools(&cfg.node_pools, &cfg.data_dir, &master_id)?;
    let mut pools = Vec::new();
    for config in &cfg.node_pools {
        let real = crate::providers::build(config, &cfg.data_dir, &master_id)?;
        let (driver, faulty) = if cfg.test_hooks {
            let f = Arc::new(Faulty::new(real));
            (f.clone() as Arc<dyn Driver>, Some(f))
        } else {
            (real, None)
        };
        pools.push(Pool { config: config.clone(), driver, faulty });
    }
    let pools = Pools::new(master_id.clone(), pools);
    if pools.pools.is_empty() {
        return Ok(pools);
    }
    let ctx = Arc::new(launcher::Ctx {
        store: shared.store.clone(),
        read_model: shared.read_model.clone(),
        trust,
        pools: pools.clone(),
        links: shared.links.clone(),
        cordon_lock,
        master_id,
        master_addr: agent_addr,
        cleanup_every: cfg.pool_cleanup_interval,
        leak_grace: cfg.pool_leak_grace,
        node_unknown_after: cfg.node_unknown_after,
        node_down_after: cfg.node_down_after,
        shared: shared.clone(),
    });
    crate::actors::supervised::task(shared, "pool_launcher", move || launcher::run(ctx.clone()));
    Ok(pools)
}
