//! The launcher: one loop that owns every pool node and node request.
//! Each turn takes one of: a command (a new request, a hold), the end of a
//! driver call it started, or the tick (enrollments, timeouts, requests to
//! assign, min-ready, the leak pass). Each decision is committed before the
//! launcher acts on it (a create, a delete) and before readers see it.
//!
//! A node's life: recorded `launching` (with an event) → the driver's
//! `create`, bounded by `launch_timeout` → `enrolling` with its external
//! id → its agent's hello within `enroll_timeout` → `ready`, counted on its
//! request. A failed try is unwound (`deleting`: the resource deleted, its
//! join token deleted, its certificate revoked, the node forgotten) and
//! tried again after a backoff, up to `launch_retries` more times; then
//! its request is declined by the pool and the pool marked unhealthy.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use time::OffsetDateTime;
use tokio::task::JoinSet;

use super::evacuate::NotMoved;
use super::{Command, Pool, PoolHealth, Pools, PoolsView};
use crate::actors::read_model::ReadModel;
use crate::actors::trust::Trust;
use crate::actors::trust::join_tokens::JoinTokenSpec;
use crate::error::Error;
use crate::ids::{InstanceId, NodeId};
use crate::providers::driver::{TAG_MASTER, TAG_NODE, TAG_POOL};
use crate::providers::{DriverError, LaunchSpec, Resource, ResourceState};
use crate::storage::pool_records::{Lifecycle, NodeRequestRecord, PoolNodeRecord};
use crate::storage::records::NodeStatus;
use crate::storage::{MetaStore, StorageError, WriteOp, events};

/// How often the launcher looks at enrollments, timeouts and requests.
const TICK: Duration = Duration::from_millis(200);
/// Every driver call but `create` must answer within this.
const CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// What the launcher needs from the master.
pub struct Ctx {
    pub store: Arc<dyn MetaStore>,
    pub read_model: Arc<ReadModel>,
    pub trust: Arc<Trust>,
    pub pools: Arc<Pools>,
    pub links: crate::actors::node_link::NodeLinks,
    /// Cordon changes' lock (`Cordons::lock`): a removal's cordon is
    /// written under it.
    pub cordon_lock: Arc<tokio::sync::Mutex<()>>,
    /// Tags every resource of this installation (`flotilla-master`).
    pub master_id: String,
    /// The agent listener, as bound.
    pub master_addr: SocketAddr,
    pub cleanup_every: Duration,
    pub leak_grace: Duration,
    pub node_unknown_after: Duration,
    pub node_down_after: Duration,
    /// The master's actors (a removal asks clusters to move members).
    pub shared: crate::actors::Shared,
}

/// The end of a driver call the launcher started.
pub(super) enum Done {
    Created {
        node: NodeId,
        took: Duration,
        result: Result<String, DriverError>,
    },
    Unwound {
        node: NodeId,
        result: Result<(), String>,
    },
    Listed {
        pool: String,
        result: Result<Vec<Resource>, DriverError>,
    },
    LeakDeleted {
        pool: String,
        external_id: String,
        result: Result<(), DriverError>,
    },
    /// A member's move off a node being removed ended (the replace's
    /// operation id, or why not).
    Moved {
        node: NodeId,
        instance: InstanceId,
        cluster: String,
        result: Result<String, NotMoved>,
    },
}

pub(super) struct Launcher {
    pub(super) ctx: Arc<Ctx>,
    pub(super) nodes: BTreeMap<NodeId, PoolNodeRecord>,
    pub(super) requests: BTreeMap<String, NodeRequestRecord>,
    pub(super) health: BTreeMap<String, PoolHealth>,
    /// Nodes with a driver call running (never two at once).
    pub(super) busy: BTreeSet<NodeId>,
    /// Nodes waiting for their next try, and when it is due.
    pub(super) due: BTreeMap<NodeId, Instant>,
    /// Leaked resources: (pool, external id) → (passes seen, first seen).
    pub(super) sightings: BTreeMap<(String, String), (u32, Instant)>,
    /// Pools being listed for the leak pass.
    pub(super) listing: BTreeSet<String>,
    pub(super) last_cleanup: Instant,
    /// Since when each spare has been empty (`idle_timeout`).
    pub(super) empty_since: BTreeMap<NodeId, Instant>,
    /// When each pool's last min-ready request failed.
    pub(super) min_ready_failed: BTreeMap<String, Instant>,
    /// Nodes with a member being moved off (`evacuate`), and when a busy
    /// cluster is to be asked again.
    pub(super) evacuating: BTreeSet<NodeId>,
    pub(super) evacuate_due: BTreeMap<NodeId, Instant>,
    /// Since when each node's members have been asked to move.
    pub(super) evacuate_since: BTreeMap<NodeId, Instant>,
    /// Since when each ready node has been seen `Down` (repair).
    pub(super) down_since: BTreeMap<NodeId, Instant>,
    /// Pools whose repair is held (too many nodes `Down`), announced once.
    pub(super) repair_held: BTreeSet<String>,
    pub(super) work: JoinSet<Done>,
}

/// One incarnation of the launcher (the supervised task runs it again
/// after a panic: it starts over from the store).
pub async fn run(ctx: Arc<Ctx>) -> Result<(), String> {
    let rx = ctx.pools.rx.clone();
    let mut rx = rx.lock_owned().await;
    let mut l = Launcher::start(ctx).await.map_err(|e| format!("the pool launcher cannot start: {e}"))?;
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let step = tokio::select! {
            c = rx.recv() => match c {
                Some(c) => l.command(c).await,
                None => return Ok(()),
            },
            Some(done) = l.work.join_next() => match done {
                Ok(done) => l.done(done).await,
                Err(e) if e.is_panic() => return Err(format!("a pool driver call panicked: {e}")),
                Err(_) => Ok(()),
            },
            _ = tick.tick() => l.tick().await,
        };
        // A write the store refused: start over from what is durable.
        step.map_err(|e| format!("the pool launcher's write failed: {e}"))?;
    }
}

impl Launcher {
    /// Lists every pool (before the store is read), loads what is durable,
    /// and takes up each node where it was.
    async fn start(ctx: Arc<Ctx>) -> Result<Launcher, StorageError> {
        let mut listed: BTreeMap<String, Result<Vec<Resource>, DriverError>> = BTreeMap::new();
        for pool in &ctx.pools.pools {
            let result = bounded(pool.driver.list()).await;
            listed.insert(pool.config.name.clone(), result);
        }
        let store = ctx.store.clone();
        let (nodes, requests) = tokio::task::spawn_blocking(move || {
            use crate::storage::keys::master_cf;
            let nodes: Vec<PoolNodeRecord> = crate::storage::meta::load(&*store, master_cf::POOL_NODES)?;
            let requests: Vec<NodeRequestRecord> = crate::storage::meta::load(&*store, master_cf::NODE_REQUESTS)?;
            Ok::<_, StorageError>((nodes, requests))
        })
        .await
        .map_err(|e| StorageError::Codec(format!("load task: {e}")))??;
        let mut l = Launcher {
            health: ctx.pools.pools.iter().map(|p| (p.config.name.clone(), PoolHealth::default())).collect(),
            ctx,
            nodes: nodes.into_iter().map(|n| (n.node.clone(), n)).collect(),
            requests: requests.into_iter().map(|r| (r.id.clone(), r)).collect(),
            busy: BTreeSet::new(),
            due: BTreeMap::new(),
            sightings: BTreeMap::new(),
            listing: BTreeSet::new(),
            last_cleanup: Instant::now(),
            empty_since: BTreeMap::new(),
            min_ready_failed: BTreeMap::new(),
            evacuating: BTreeSet::new(),
            evacuate_due: BTreeMap::new(),
            evacuate_since: BTreeMap::new(),
            down_since: BTreeMap::new(),
            repair_held: BTreeSet::new(),
            work: JoinSet::new(),
        };
        l.resume(&listed).await?;
        l.publish();
        Ok(l)
    }

    /// Takes up each node where the last incarnation left it.
    async fn resume(
        &mut self,
        listed: &BTreeMap<String, Result<Vec<Resource>, DriverError>>,
    ) -> Result<(), StorageError> {
        let nodes: Vec<PoolNodeRecord> = self.nodes.values().cloned().collect();
        for n in nodes {
            if self.ctx.pools.pool(&n.pool).is_none() {
                tracing::warn!(node = %n.node, pool = %n.pool, "a node of a pool no longer configured: left as it is");
                continue;
            }
            match n.state {
                Lifecycle::Launching if n.external_id.is_none() => {
                    // Adopted only with its agent running (or being made):
                    // one whose agent died is unwound and tried again.
                    let found = listed.get(&n.pool).and_then(|l| l.as_ref().ok()).and_then(|resources| {
                        resources.iter().find(|r| {
                            r.tag(TAG_NODE) == Some(n.node.as_str())
                                && r.tag(TAG_MASTER) == Some(&self.ctx.master_id)
                                && matches!(r.state, ResourceState::Running | ResourceState::Pending)
                        })
                    });
                    let mut n = n.clone();
                    if let Some(r) = found {
                        // The create made it; its answer was lost with the
                        // last master: adopted, its enrollment awaited.
                        n.external_id = Some(r.external_id.clone());
                        self.set_state(&mut n, Lifecycle::Enrolling);
                        let ev = node_event("node.adopted", &n, json!({}))?;
                        self.commit_node(n, vec![ev]).await?;
                    } else {
                        // Nothing found (or the listing failed): whatever
                        // the cut create made is deleted by its tag, then
                        // the launch is tried again.
                        n.last_error = Some("its create was cut by a master restart".into());
                        self.set_state(&mut n, Lifecycle::Deleting);
                        self.commit_node(n.clone(), vec![]).await?;
                        self.unwind(&n.node);
                    }
                }
                Lifecycle::Launching => {
                    let mut n = n.clone();
                    self.set_state(&mut n, Lifecycle::Enrolling);
                    self.commit_node(n, vec![]).await?;
                }
                Lifecycle::Deleting => {
                    if n.removal.is_some() {
                        // Past its check before the restart.
                        self.ctx.read_model.removals.mark(&n.node);
                    }
                    self.unwind(&n.node)
                }
                // Counted on its request if the last incarnation could not.
                Lifecycle::Ready => {
                    if let Some(id) = &n.request
                        && let Some((r, writes)) = self.counted(id, &n.node)?
                    {
                        self.ctx.store.commit(writes).await?;
                        self.requests.insert(r.id.clone(), r);
                    }
                }
                Lifecycle::Enrolling | Lifecycle::Failed | Lifecycle::Draining => {}
            }
        }
        Ok(())
    }

    // ---------------------------------------------------------------- turns

    async fn command(&mut self, c: Command) -> Result<(), StorageError> {
        match c {
            Command::Request(r, answer) => {
                let result = self.file(r).await;
                let _ = answer.send(result);
            }
            Command::Remove(node, answer) => match self.remove(&node).await {
                Ok(result) => {
                    let _ = answer.send(result);
                }
                // A write that failed: answered, then the incarnation ends
                // (the next starts from what is durable).
                Err(e) => {
                    let _ = answer.send(Err(Error::unavailable(format!("the removal could not be written: {e}"))));
                    return Err(e);
                }
            },
            Command::Cancel(prefix, why) => self.cancel(&prefix, &why).await?,
            Command::Hold(node, until, answer) => {
                let Some(mut n) = self.nodes.get(&node).cloned() else {
                    let _ = answer.send(Err(Error::not_found("provider node", &node)));
                    return Ok(());
                };
                n.held_until = until;
                let kind = if until.is_some() { "node.held" } else { "node.released" };
                let ev = node_event(kind, &n, json!({"until": until.map(rfc3339)}))?;
                if let Err(e) = self.commit_node(n.clone(), vec![ev]).await {
                    let _ = answer.send(Err(Error::unavailable(format!("the hold could not be written: {e}"))));
                    return Err(e);
                }
                let _ = answer.send(Ok(n));
            }
        }
        self.publish();
        Ok(())
    }

    async fn done(&mut self, d: Done) -> Result<(), StorageError> {
        match d {
            Done::Created { node, took, result } => {
                self.busy.remove(&node);
                let Some(mut n) = self.nodes.get(&node).cloned() else { return Ok(()) };
                let labels = [("pool", n.pool.clone())];
                match result {
                    Ok(external_id) => {
                        metrics::histogram!("flotilla_pool_launch_seconds", &labels).record(took.as_secs_f64());
                        n.external_id = Some(external_id);
                        self.set_state(&mut n, Lifecycle::Enrolling);
                        let ev = node_event("node.enrolling", &n, json!({}))?;
                        self.commit_node(n, vec![ev]).await?;
                    }
                    Err(e) => self.failed_try(n, e).await?,
                }
            }
            Done::Unwound { node, result } => {
                self.busy.remove(&node);
                let Some(n) = self.nodes.get(&node).cloned() else { return Ok(()) };
                match result {
                    Err(e) => {
                        tracing::warn!(%node, error = %e, "unwinding a node failed; trying again");
                        self.health_of(&n.pool).last_error = Some(e);
                        self.due.insert(node, Instant::now() + Duration::from_secs(5));
                    }
                    Ok(()) => self.unwound(n).await?,
                }
            }
            Done::Moved { node, instance, cluster, result } => self.moved(node, instance, cluster, result).await?,
            Done::Listed { pool, result } => {
                self.listing.remove(&pool);
                self.leak_pass(&pool, result).await?;
            }
            Done::LeakDeleted { pool, external_id, result } => {
                let labels = [("pool", pool.clone())];
                match result {
                    Ok(()) => {
                        metrics::counter!("flotilla_pool_leaks_removed_total", &labels).increment(1);
                        self.sightings.remove(&(pool.clone(), external_id.clone()));
                        let ev =
                            events::event("node.leak_removed", None, json!({"pool": pool, "external_id": external_id}));
                        self.ctx.store.commit(vec![events::append(&ev)?]).await?;
                    }
                    Err(e) => self.health_of(&pool).last_error = Some(format!("deleting leaked {external_id}: {e}")),
                }
            }
        }
        self.publish();
        Ok(())
    }

    async fn tick(&mut self) -> Result<(), StorageError> {
        let now = Instant::now();
        // Tries that are due.
        let due: Vec<NodeId> = self.due.iter().filter(|(_, t)| **t <= now).map(|(n, _)| n.clone()).collect();
        for node in due {
            self.due.remove(&node);
            let Some(n) = self.nodes.get(&node).cloned() else { continue };
            match n.state {
                Lifecycle::Deleting => self.unwind(&node),
                Lifecycle::Launching if self.holds(&n) => self.create(&node).await,
                // Its request is done, or declined by this pool since:
                // nothing was made for this try, nothing is.
                Lifecycle::Launching => {
                    let ev = node_event("node.gone", &n, json!({"reason": "its request no longer needs it"}))?;
                    self.ctx.store.commit(vec![WriteOp::delete_pool_node(&node), ev]).await?;
                    self.nodes.remove(&node);
                }
                _ => {}
            }
        }
        self.expired_holds().await?;
        self.enrollments().await?;
        self.repairs().await?;
        self.drains().await?;
        self.idle_and_old().await?;
        self.assign().await?;
        self.min_ready().await?;
        if now.duration_since(self.last_cleanup) >= self.ctx.cleanup_every {
            self.last_cleanup = now;
            self.list_for_leaks();
        }
        self.publish();
        Ok(())
    }

    // ---------------------------------------------------------------- nodes

    /// Enrolling nodes whose agent said hello are ready; those past
    /// `enroll_timeout` failed their try.
    async fn enrollments(&mut self) -> Result<(), StorageError> {
        let now = OffsetDateTime::now_utc();
        let waiting: Vec<PoolNodeRecord> = self
            .nodes
            .values()
            .filter(|n| n.state == Lifecycle::Enrolling && !self.busy.contains(&n.node))
            .cloned()
            .collect();
        for mut n in waiting {
            let Some(pool) = self.ctx.pools.pool(&n.pool) else { continue };
            if self.link_status(&n.node) == Some(NodeStatus::Ready) {
                let took = (now - n.state_since).as_seconds_f64().max(0.0);
                metrics::histogram!("flotilla_pool_enroll_seconds", "pool" => n.pool.clone()).record(took);
                metrics::counter!("flotilla_pool_launches_total", "pool" => n.pool.clone(), "result" => "ready")
                    .increment(1);
                self.set_state(&mut n, Lifecycle::Ready);
                self.health_of(&n.pool).unhealthy = None;
                // The node ready and counted on its request: one commit.
                let mut writes = vec![node_event("node.ready", &n, json!({}))?];
                let counted = match &n.request {
                    Some(id) => self.counted(id, &n.node)?,
                    None => None,
                };
                if let Some((_, w)) = &counted {
                    writes.extend(w.iter().cloned());
                }
                self.commit_node(n.clone(), writes).await?;
                if let Some((r, _)) = counted {
                    self.requests.insert(r.id.clone(), r);
                }
            } else if now - n.state_since > pool.config.enroll_timeout {
                let message = format!(
                    "its agent did not say hello within enroll_timeout ({})",
                    humantime::format_duration(pool.config.enroll_timeout)
                );
                self.failed_try(n, DriverError::transient(message)).await?;
            }
        }
        Ok(())
    }

    /// Starts the driver's `create` for `node` (recorded `launching`).
    pub(super) async fn create(&mut self, node: &NodeId) {
        let Some(n) = self.nodes.get(node).cloned() else { return };
        let Some(pool) = self.ctx.pools.pool(&n.pool) else { return };
        if !self.busy.insert(node.clone()) {
            return;
        }
        let (driver, config, ctx) = (pool.driver.clone(), pool.config.clone(), self.ctx.clone());
        let node = node.clone();
        self.work.spawn(async move {
            let started = Instant::now();
            let result = async {
                let token = ctx
                    .trust
                    .create_join_token(&JoinTokenSpec {
                        name: format!("launch-{node}"),
                        ttl: config.launch_timeout + config.enroll_timeout,
                        uses: 1,
                        node: Some(node.clone()),
                    })
                    .await
                    .map_err(|e| DriverError::transient(format!("cannot make its join token: {e}")))?;
                let spec = LaunchSpec {
                    node: node.clone(),
                    pool: config.name.clone(),
                    labels: config.labels.clone(),
                    tags: BTreeMap::from([
                        (TAG_MASTER.to_string(), ctx.master_id.clone()),
                        (TAG_POOL.to_string(), config.name.clone()),
                        (TAG_NODE.to_string(), node.to_string()),
                    ]),
                    join_token: token.token,
                    master_addr: ctx.master_addr,
                };
                match tokio::time::timeout(config.launch_timeout, driver.create(&spec)).await {
                    Ok(r) => r,
                    Err(_) => Err(DriverError::transient(format!(
                        "the driver's create did not answer within launch_timeout ({})",
                        humantime::format_duration(config.launch_timeout)
                    ))),
                }
            }
            .await;
            Done::Created { node, took: started.elapsed(), result }
        });
    }

    // ---------------------------------------------------------------- shared

    pub(super) fn link_status(&self, node: &NodeId) -> Option<NodeStatus> {
        let e = self.ctx.read_model.node(node)?;
        Some(e.live.status_at(Instant::now(), self.ctx.node_unknown_after, self.ctx.node_down_after))
    }

    pub(super) fn set_state(&self, n: &mut PoolNodeRecord, state: Lifecycle) {
        n.state = state;
        n.state_since = OffsetDateTime::now_utc();
    }

    pub(super) fn health_of(&mut self, pool: &str) -> &mut PoolHealth {
        self.health.entry(pool.to_string()).or_default()
    }

    /// Writes `n` with `writes` in one commit, then keeps it.
    pub(super) async fn commit_node(
        &mut self,
        n: PoolNodeRecord,
        mut writes: Vec<WriteOp>,
    ) -> Result<(), StorageError> {
        writes.push(WriteOp::put_pool_node(&n)?);
        self.ctx.store.commit(writes).await?;
        self.nodes.insert(n.node.clone(), n);
        Ok(())
    }

    pub(super) fn publish(&self) {
        for pool in &self.ctx.pools.pools {
            let name = &pool.config.name;
            for state in
                [Lifecycle::Launching, Lifecycle::Enrolling, Lifecycle::Ready, Lifecycle::Deleting, Lifecycle::Failed]
            {
                let n = self.nodes.values().filter(|n| &n.pool == name && n.state == state).count();
                metrics::gauge!("flotilla_pool_nodes", "pool" => name.clone(), "state" => state.as_str()).set(n as f64);
            }
        }
        self.ctx.pools.publish(PoolsView {
            nodes: self.nodes.clone(),
            requests: self.requests.clone(),
            health: self.health.clone(),
            loaded: true,
        });
    }

    pub(super) fn pool(&self, name: &str) -> Option<&Pool> {
        self.ctx.pools.pool(name)
    }
}

/// A driver call bounded by [`CALL_TIMEOUT`].
pub(super) async fn bounded<T>(call: futures::future::BoxFuture<'_, Result<T, DriverError>>) -> Result<T, DriverError> {
    tokio::time::timeout(CALL_TIMEOUT, call)
        .await
        .unwrap_or_else(|_| Err(DriverError::transient(format!("no answer within {} s", CALL_TIMEOUT.as_secs()))))
}

/// An event about provider node `n` (its append as a write).
pub(super) fn node_event(kind: &str, n: &PoolNodeRecord, extra: serde_json::Value) -> Result<WriteOp, StorageError> {
    let mut data = json!({
        "node": n.node.as_str(),
        "pool": n.pool,
        "state": n.state.as_str(),
        "external_id": n.external_id,
        "request": n.request,
        "attempt": n.attempt,
    });
    if let (Some(d), serde_json::Value::Object(extra)) = (data.as_object_mut(), extra) {
        d.extend(extra);
    }
    events::append(&events::event(kind, None, data))
}

pub(super) fn rfc3339(t: OffsetDateTime) -> String {
    t.format(&time::format_description::well_known::Rfc3339).unwrap_or_default()
}
