//! A launch's tries: what a failed one does (unwound and tried again, or
//! its request given back to the pools), the unwind itself, and what
//! follows it.
//!
//! A failed try is unwound: the resource deleted (by its id, or by its tag
//! when `create` never answered), its join token deleted, its certificate
//! revoked, its link closed. Then, if its request still wants it from this
//! pool, the node is launched again after a backoff (at most
//! `launch_retries` more times); else it is forgotten. A held node is not
//! unwound: it is kept `failed` (its machine left as it is, for debugging)
//! and its request gets a fresh node instead; once the hold ends it is
//! unwound like any other.

use std::time::{Duration, Instant};

use serde_json::json;
use time::OffsetDateTime;

use super::class_name;
use super::launcher::{Done, Launcher, bounded, node_event};
use crate::ids::NodeId;
use crate::providers::driver::{TAG_MASTER, TAG_NODE};
use crate::providers::{DriverError, ErrorClass};
use crate::storage::pool_records::{Lifecycle, NodeRequestRecord, PoolNodeRecord, RequestState};
use crate::storage::records::RECORD_VERSION;
use crate::storage::{StorageError, WriteOp};

/// A pool that hit its provider's quota launches nothing for this long.
const QUOTA_PAUSE: Duration = Duration::from_secs(30);
/// A pool whose provider had no capacity declines requests for this long.
const CAPACITY_MEMORY: Duration = Duration::from_secs(60);
/// The longest wait between two tries of a launch.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

impl Launcher {
    /// Whether `n`'s request still wants it from its pool (pending there).
    pub(super) fn holds(&self, n: &PoolNodeRecord) -> bool {
        n.request
            .as_ref()
            .and_then(|id| self.requests.get(id))
            .is_some_and(|r| r.state == RequestState::Pending && r.pool.as_deref() == Some(n.pool.as_str()))
    }

    fn held(n: &PoolNodeRecord) -> bool {
        n.held_until.is_some_and(|t| t > OffsetDateTime::now_utc())
    }

    /// A try of `n` failed with `e`: unwound (or kept, when held) and tried
    /// again while its request wants it and tries are left; else its
    /// request is given back to the pools (declined by this one, but for a
    /// quota error, which only pauses the pool).
    pub(super) async fn failed_try(&mut self, mut n: PoolNodeRecord, e: DriverError) -> Result<(), StorageError> {
        let Some(pool) = self.ctx.pools.pool(&n.pool) else { return Ok(()) };
        let config = pool.config.clone();
        let reason = format!("node {}: {} ({} error)", n.node, e.message, class_name(e.class));
        tracing::warn!(node = %n.node, pool = %n.pool, attempt = n.attempt, %reason, "a launch failed");
        metrics::counter!("flotilla_pool_launches_total", "pool" => n.pool.clone(), "result" => class_name(e.class))
            .increment(1);
        let now = OffsetDateTime::now_utc();
        let wanted = self.holds(&n);
        let health = self.health_of(&n.pool);
        health.last_error = Some(reason.clone());
        let give_back = match e.class {
            ErrorClass::Quota => {
                health.paused_until = Some(now + QUOTA_PAUSE);
                // Not a failed attempt: the request waits for a pool.
                None
            }
            ErrorClass::Capacity => {
                health.no_capacity_until = Some(now + CAPACITY_MEMORY);
                Some(reason.clone())
            }
            ErrorClass::Config => {
                health.broken = Some(reason.clone());
                Some(reason.clone())
            }
            ErrorClass::Transient if n.attempt > config.launch_retries => {
                let why = format!("{reason}, after {} tries", n.attempt);
                health.unhealthy = Some(why.clone());
                Some(why)
            }
            ErrorClass::Transient if wanted => {
                n.last_error = Some(reason.clone());
                let mut writes = vec![];
                if Launcher::held(&n) {
                    // Kept for debugging; the request gets a fresh node.
                    let next = self.next_try(&n)?;
                    writes.push(WriteOp::put_pool_node(&next)?);
                    writes.push(node_event("node.launching", &next, json!({"replaces": n.node.as_str()}))?);
                    n.request = None;
                    self.set_state(&mut n, Lifecycle::Failed);
                    writes.push(node_event("node.failed", &n, json!({"error": reason, "held": true}))?);
                    self.commit_node(n, writes).await?;
                    let due = Instant::now() + backoff(next.attempt);
                    self.due.insert(next.node.clone(), due);
                    self.nodes.insert(next.node.clone(), next);
                    return Ok(());
                }
                self.set_state(&mut n, Lifecycle::Deleting);
                writes.push(node_event("node.launch_failed", &n, json!({"error": reason, "retry": true}))?);
                self.commit_node(n.clone(), writes).await?;
                self.unwind(&n.node);
                return Ok(());
            }
            // Its request does not want it any more: nothing to give back.
            ErrorClass::Transient => None,
        };
        let mut writes = Vec::new();
        if let Some(id) = n.request.take()
            && let Some(mut r) = self.requests.get(&id).cloned().filter(|r| !r.state.is_done())
        {
            if let Some(why) = give_back.filter(|_| wanted) {
                self.decline(&mut r, &config.name, why, &mut writes)?;
            } else if wanted {
                // Paused by a quota error: back to the pools.
                r.state = RequestState::Requested;
                r.pool = None;
                r.updated_at = now;
            }
            writes.push(WriteOp::put_node_request(&r)?);
            self.requests.insert(r.id.clone(), r);
        }
        n.last_error = Some(reason.clone());
        if Launcher::held(&n) {
            self.set_state(&mut n, Lifecycle::Failed);
            writes.push(node_event("node.failed", &n, json!({"error": reason, "held": true}))?);
            return self.commit_node(n, writes).await;
        }
        self.set_state(&mut n, Lifecycle::Deleting);
        writes.push(node_event("node.launch_failed", &n, json!({"error": reason, "retry": false}))?);
        self.commit_node(n.clone(), writes).await?;
        self.unwind(&n.node);
        Ok(())
    }

    /// The record of the next try of `n`'s request slot: a fresh node id.
    fn next_try(&self, n: &PoolNodeRecord) -> Result<PoolNodeRecord, StorageError> {
        let now = OffsetDateTime::now_utc();
        Ok(PoolNodeRecord {
            version: RECORD_VERSION,
            node: self.new_node_id(&n.pool)?,
            pool: n.pool.clone(),
            request: n.request.clone(),
            external_id: None,
            state: Lifecycle::Launching,
            attempt: n.attempt + 1,
            created_at: now,
            state_since: now,
            last_error: None,
            held_until: None,
            removal: None,
        })
    }

    /// Failed nodes whose hold has ended are unwound.
    pub(super) async fn expired_holds(&mut self) -> Result<(), StorageError> {
        let ended: Vec<PoolNodeRecord> = self
            .nodes
            .values()
            .filter(|n| n.state == Lifecycle::Failed && !Launcher::held(n) && !self.busy.contains(&n.node))
            .cloned()
            .collect();
        for mut n in ended {
            self.set_state(&mut n, Lifecycle::Deleting);
            let ev = node_event("node.deleting", &n, json!({"reason": "its hold ended"}))?;
            self.commit_node(n.clone(), vec![ev]).await?;
            self.unwind(&n.node);
        }
        Ok(())
    }

    /// Starts taking `node` down: the resource (by its id, or by its tag
    /// when the create never answered), its join token, its certificate,
    /// its link.
    pub(super) fn unwind(&mut self, node: &NodeId) {
        let Some(n) = self.nodes.get(node).cloned() else { return };
        let Some(pool) = self.ctx.pools.pool(&n.pool) else { return };
        if !self.busy.insert(node.clone()) {
            return;
        }
        let (driver, ctx) = (pool.driver.clone(), self.ctx.clone());
        let node = node.clone();
        self.work.spawn(async move {
            let result = async {
                let ids: Vec<String> = match &n.external_id {
                    Some(id) => vec![id.clone()],
                    None => bounded(driver.list())
                        .await
                        .map_err(|e| format!("listing to find it: {e}"))?
                        .into_iter()
                        .filter(|r| {
                            r.tag(TAG_NODE) == Some(n.node.as_str()) && r.tag(TAG_MASTER) == Some(&ctx.master_id)
                        })
                        .map(|r| r.external_id)
                        .collect(),
                };
                for id in &ids {
                    bounded(driver.delete(id)).await.map_err(|e| format!("deleting {id}: {e}"))?;
                }
                ctx.trust.delete_join_tokens_of(&n.node).await.map_err(|e| format!("its join token: {e}"))?;
                if ctx.trust.cert_of(&n.node).is_some_and(|c| c.revoked_at.is_none()) {
                    ctx.trust.revoke(&n.node).await.map_err(|e| format!("revoking its certificate: {e}"))?;
                }
                if let Some(link) = ctx.links.get(&n.node) {
                    link.close_for_good();
                }
                Ok(())
            }
            .await;
            Done::Unwound { node, result }
        });
    }

    /// `n` is unwound: launched again if its request still wants it from
    /// this pool, else forgotten (with its registry entry, if it holds no
    /// instance).
    pub(super) async fn unwound(&mut self, mut n: PoolNodeRecord) -> Result<(), StorageError> {
        if n.removal.is_none() && self.holds(&n) {
            n.attempt += 1;
            n.external_id = None;
            self.set_state(&mut n, Lifecycle::Launching);
            let ev = node_event("node.launching", &n, json!({"attempt": n.attempt}))?;
            self.commit_node(n.clone(), vec![ev]).await?;
            self.due.insert(n.node.clone(), Instant::now() + backoff(n.attempt - 1));
            return Ok(());
        }
        let registered = self.ctx.read_model.node(&n.node).filter(|e| e.instance_count() == 0);
        let mut writes = vec![WriteOp::delete_pool_node(&n.node), node_event("node.gone", &n, json!({}))?];
        if registered.is_some() {
            writes.push(WriteOp::delete_node(&n.node));
            writes.push(WriteOp::delete_cordon(&n.node));
        }
        self.ctx.store.commit(writes).await?;
        self.nodes.remove(&n.node);
        if registered.is_some() {
            self.ctx.read_model.forget_node(&n.node);
            self.ctx.read_model.remove_cordon(&n.node);
        }
        self.ctx.read_model.removals.unmark(&n.node);
        Ok(())
    }

    /// Node `node` of request `id` is ready: the request as it is once it
    /// counts it (fulfilled with its last node), and the writes; `None`
    /// when it does not count it (done, or counted already).
    pub(super) fn counted(
        &self,
        id: &str,
        node: &NodeId,
    ) -> Result<Option<(NodeRequestRecord, Vec<WriteOp>)>, StorageError> {
        let Some(mut r) = self.requests.get(id).cloned() else { return Ok(None) };
        if r.nodes.contains(node) || r.state.is_done() {
            return Ok(None);
        }
        r.nodes.push(node.clone());
        r.updated_at = OffsetDateTime::now_utc();
        let mut writes = Vec::new();
        if r.nodes.len() as u32 >= r.count {
            r.state = RequestState::Fulfilled;
            if r.pool.is_none() {
                r.pool = self.nodes.get(node).map(|n| n.pool.clone());
            }
            writes.push(super::requests::request_event("node_request.fulfilled", &r)?);
        }
        writes.push(WriteOp::put_node_request(&r)?);
        Ok(Some((r, writes)))
    }
}

/// The wait before try `attempt + 1`: 2^attempt s, at most [`MAX_BACKOFF`].
pub(super) fn backoff(attempt: u32) -> Duration {
    Duration::from_secs(1u64 << attempt.min(5)).min(MAX_BACKOFF)
}
