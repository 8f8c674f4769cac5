//! Taking ready nodes out of a pool: an operator's `POST
//! /nodes/{id}/remove`, an empty node idle past the pool's `idle_timeout`
//! beyond its `min_ready`, a spare older than `max_ready_age`.
//!
//! A removal is journaled in the node's record: `draining` (with its
//! reason, detached from its request, and a cordon, in one commit), then,
//! once [`SETTLE`] has passed, the node is marked removed through the
//! allocation gate (`read_model::removals`: only when it holds no instance
//! and no allocation is under way on it; from then on an allocation onto
//! it fails, naming it), `deleting`, and the usual unwind (resource, join
//! token, certificate, registry). A master restarted in the middle takes
//! it up where the record says. A node that holds members has them moved
//! off first, one at a time, by their clusters' normal replace
//! (`evacuate`); one that cannot be moved puts the node back (`ready`,
//! its cordon lifted if the pool set it) with an event saying why. At
//! most `max_disrupting` nodes of
//! a pool are drained or deleted for a removal at once; the automatic ones
//! never pick a node labelled `do-not-disrupt=true`. Cordon writes take
//! the cordons' lock, so an operator's cordon at the same moment is never
//! lost or overwritten.

use std::time::{Duration, Instant};

use serde_json::json;
use time::OffsetDateTime;

use super::launcher::{Launcher, node_event};
use crate::error::Error;
use crate::ids::NodeId;
use crate::storage::pool_records::{Lifecycle, PoolNodeRecord};
use crate::storage::records::{CordonRecord, RECORD_VERSION};
use crate::storage::{StorageError, WriteOp};

/// How long a draining node waits before it is judged empty: longer than
/// a placement made just before its cordon takes to be journaled.
pub const SETTLE: Duration = Duration::from_secs(2);
/// The label that keeps a node out of every automatic removal.
pub const DO_NOT_DISRUPT: &str = "do-not-disrupt";

/// The cordon reason of a node being removed.
fn cordon_reason(why: &str) -> String {
    format!("being removed by its pool: {why}")
}

impl Launcher {
    /// Nodes of `pool` being removed (draining, or deleting for a removal).
    pub(super) fn disrupting(&self, pool: &str) -> u32 {
        self.nodes
            .values()
            .filter(|n| n.pool == pool && n.removal.is_some())
            .filter(|n| matches!(n.state, Lifecycle::Draining | Lifecycle::Deleting))
            .count() as u32
    }

    /// Never chosen for an automatic removal: labelled
    /// `do-not-disrupt=true`, or held.
    pub(super) fn protected(&self, node: &NodeId) -> bool {
        let label = self
            .ctx
            .read_model
            .node(node)
            .is_some_and(|e| e.record().labels.get(DO_NOT_DISRUPT).is_some_and(|v| v == "true"));
        label || self.nodes.get(node).is_some_and(|n| n.held_until.is_some_and(|t| t > OffsetDateTime::now_utc()))
    }

    /// Instances indexed on `node`.
    fn holding(&self, node: &NodeId) -> usize {
        self.ctx.read_model.node(node).map(|e| e.instance_count()).unwrap_or(0)
    }

    /// An operator's removal of `node`.
    /// The outer error is a write that failed (the launcher starts over);
    /// the inner one a refusal.
    pub(super) async fn remove(&mut self, node: &NodeId) -> Result<Result<PoolNodeRecord, Error>, StorageError> {
        let Some(n) = self.nodes.get(node).cloned() else {
            return Ok(Err(Error::not_found("provider node", node)));
        };
        let max = self.pool(&n.pool).map(|p| p.config.max_disrupting).unwrap_or(1);
        match n.state {
            Lifecycle::Ready => {}
            Lifecycle::Failed => {
                // A failed launch (held): unwound now.
                let mut n = n;
                n.held_until = None;
                n.removal = Some("removed by an operator".into());
                self.set_state(&mut n, Lifecycle::Deleting);
                let ev = node_event("node.deleting", &n, json!({"reason": "removed by an operator"}))?;
                self.commit_node(n.clone(), vec![ev]).await?;
                self.unwind(&n.node);
                return Ok(Ok(n));
            }
            Lifecycle::Draining => return Ok(Ok(n)),
            Lifecycle::Deleting => {
                // Unwinding a failed try: never launched again now.
                let mut n = n;
                if n.removal.is_none() {
                    n.removal = Some("removed by an operator".into());
                    n.request = None;
                    self.commit_node(n.clone(), vec![]).await?;
                }
                return Ok(Ok(n));
            }
            other => {
                return Ok(Err(Error::conflict(
                    "node_busy",
                    format!("node {node} is {}: remove it once it is ready (or failed)", other.as_str()),
                )));
            }
        }
        if self.disrupting(&n.pool) >= max {
            return Ok(Err(Error::conflict(
                "disruption_budget",
                format!(
                    "pool {} is removing {max} node(s) already (max_disrupting = {max}); retry once one is gone",
                    n.pool
                ),
            )));
        }
        Ok(Ok(self.retire(n, "removed by an operator").await?))
    }

    /// Starts removing `n` (ready): draining, detached from its request,
    /// cordoned, in one commit.
    pub(super) async fn retire(&mut self, mut n: PoolNodeRecord, why: &str) -> Result<PoolNodeRecord, StorageError> {
        let lock = self.ctx.cordon_lock.clone();
        let _cordons = lock.lock_owned().await;
        let mut writes = Vec::new();
        let cordon = match self.ctx.read_model.cordon_of(&n.node) {
            Some(_) => None,
            None => Some(CordonRecord {
                version: RECORD_VERSION,
                node: n.node.clone(),
                reason: cordon_reason(why),
                since: OffsetDateTime::now_utc(),
            }),
        };
        if let Some(c) = &cordon {
            writes.push(WriteOp::put_cordon(c)?);
        }
        n.removal = Some(why.to_string());
        n.request = None;
        self.set_state(&mut n, Lifecycle::Draining);
        writes.push(node_event("node.draining", &n, json!({"reason": why}))?);
        self.commit_node(n.clone(), writes).await?;
        if let Some(c) = cordon {
            self.ctx.read_model.put_cordon(c);
        }
        Ok(n)
    }

    /// Draining nodes past [`SETTLE`]: their members moved off one at a
    /// time (`evacuate`), then, once empty with no allocation under way,
    /// deleted.
    pub(super) async fn drains(&mut self) -> Result<(), StorageError> {
        let now = OffsetDateTime::now_utc();
        let settled: Vec<PoolNodeRecord> = self
            .nodes
            .values()
            .filter(|n| n.state == Lifecycle::Draining && now - n.state_since >= SETTLE)
            .cloned()
            .collect();
        for mut n in settled {
            if self.evacuating.contains(&n.node) {
                continue;
            }
            if self.holding(&n.node) > 0 {
                self.evacuate(&n);
                continue;
            }
            let read_model = self.ctx.read_model.clone();
            let node = n.node.clone();
            // Not yet when an operation is allocating onto it (placed
            // before its cordon): that member is moved off next.
            if read_model.removals.try_mark(&node, || read_model.node(&node).is_none_or(|e| e.instance_count() == 0)) {
                self.set_state(&mut n, Lifecycle::Deleting);
                let ev = node_event("node.deleting", &n, json!({"reason": n.removal}))?;
                self.commit_node(n.clone(), vec![ev]).await?;
                self.unwind(&n.node);
            }
        }
        Ok(())
    }

    /// Gives up removing `n`: ready again, its cordon lifted if the
    /// removal set it, an event saying why.
    pub(super) async fn put_back(&mut self, mut n: PoolNodeRecord, reason: &str) -> Result<(), StorageError> {
        let lock = self.ctx.cordon_lock.clone();
        let _cordons = lock.lock_owned().await;
        let why = n.removal.take().unwrap_or_default();
        let ours = self.ctx.read_model.cordon_of(&n.node).is_some_and(|c| c.reason == cordon_reason(&why));
        self.set_state(&mut n, Lifecycle::Ready);
        n.last_error = Some(reason.to_string());
        let mut writes = vec![node_event("node.remove_refused", &n, json!({"reason": reason}))?];
        if ours {
            writes.push(WriteOp::delete_cordon(&n.node));
        }
        self.commit_node(n.clone(), writes).await?;
        if ours {
            self.ctx.read_model.remove_cordon(&n.node);
        }
        Ok(())
    }

    /// Gives back empty nodes idle past `idle_timeout` beyond `min_ready`,
    /// and replaces spares older than `max_ready_age` (min-ready then
    /// files a request for a fresh one). Never a node labelled
    /// `do-not-disrupt=true`, never past `max_disrupting`. How long a node
    /// has been empty is kept in memory: a master restart starts it over
    /// (a give-back is delayed by it, never hastened).
    pub(super) async fn idle_and_old(&mut self) -> Result<(), StorageError> {
        let now = Instant::now();
        let spares_by_pool: Vec<(String, Vec<NodeId>)> =
            self.ctx.pools.pools.iter().map(|p| (p.config.name.clone(), self.spares(&p.config.name))).collect();
        let all: Vec<NodeId> = spares_by_pool.iter().flat_map(|(_, s)| s.iter().cloned()).collect();
        self.empty_since.retain(|n, _| all.contains(n));
        for n in &all {
            self.empty_since.entry(n.clone()).or_insert(now);
        }
        for (pool, spares) in spares_by_pool {
            let Some(config) = self.pool(&pool).map(|p| p.config.clone()) else { continue };
            let mut room = config.max_disrupting.saturating_sub(self.disrupting(&pool));
            let mut left = spares.len() as u32;
            for node in spares {
                if room == 0 {
                    break;
                }
                let Some(n) = self.nodes.get(&node).cloned() else { continue };
                if self.protected(&node) {
                    continue;
                }
                // How long it has sat empty (in memory: a restart starts it over).
                let idle = self.empty_since.get(&node).map(|t| now.duration_since(*t)).unwrap_or_default();
                let shown = humantime::format_duration(Duration::from_secs(idle.as_secs()));
                let why = if config.idle_timeout.is_some_and(|t| idle >= t) && left > config.min_ready {
                    format!("empty for {shown} (idle_timeout)")
                } else if config.max_ready_age.is_some_and(|t| idle >= t) {
                    format!("a spare unused for {shown} (max_ready_age)")
                } else {
                    continue;
                };
                self.retire(n, &why).await?;
                room -= 1;
                left -= 1;
            }
        }
        Ok(())
    }
}
