//! Node requests: filed, assigned to a pool (or declined by it), counted
//! as their nodes become ready; and the min-ready requests each pool files
//! for itself.
//!
//! Assignment, each tick, oldest first within each priority: the pools
//! whose labels include the request's, by priority, not among those that
//! declined it. A pool declines what it can never serve (broken, no
//! capacity now, more nodes than it may ever hold); a pool at its quota
//! (or paused by its provider's) passes, without declining, to the next;
//! when none has room the request waits (a min-ready request is declined
//! instead: spares never queue). It fails once every pool offering its
//! labels has declined it, with all their reasons.

use std::collections::BTreeMap;

use serde_json::json;
use time::OffsetDateTime;

use super::launcher::{Launcher, node_event};
use super::{DONE_REQUESTS_KEPT, MAX_OPEN_REQUESTS, NewRequest, shown};
use crate::error::Error;
use crate::ids::NodeId;
use crate::storage::pool_records::{Lifecycle, NodeRequestRecord, PoolNodeRecord, RequestState};
use crate::storage::records::{NodeStatus, RECORD_VERSION};
use crate::storage::{StorageError, WriteOp, events};

/// A pool whose min-ready request failed files the next one this much later.
const MIN_READY_PAUSE: std::time::Duration = std::time::Duration::from_secs(60);
/// The priority of min-ready requests (after any other).
pub const MIN_READY_PRIORITY: u8 = 200;
/// Requestor of the min-ready requests of `pool`.
fn min_ready_of(pool: &str) -> String {
    format!("min-ready:{pool}")
}

impl Launcher {
    /// Files `r` (durable, with its event) and answers it.
    pub(super) async fn file(&mut self, r: NewRequest) -> Result<NodeRequestRecord, Error> {
        if self.requests.values().filter(|r| !r.state.is_done()).count() >= MAX_OPEN_REQUESTS {
            return Err(Error::overloaded(format!("{MAX_OPEN_REQUESTS} node requests are open; retry later")));
        }
        let now = OffsetDateTime::now_utc();
        let id = loop {
            let id = format!(
                "{:020}-{}",
                crate::storage::keys::nanos(now),
                hex::encode(crate::actors::tokens::random::<3>()?)
            );
            if !self.requests.contains_key(&id) {
                break id;
            }
        };
        let record = NodeRequestRecord {
            version: RECORD_VERSION,
            id,
            labels: r.labels,
            count: r.count,
            requestor: r.requestor,
            priority: r.priority,
            state: RequestState::Requested,
            pool: None,
            declined_by: vec![],
            reasons: vec![],
            nodes: vec![],
            created_at: now,
            updated_at: now,
        };
        let mut writes = vec![WriteOp::put_node_request(&record)?, request_event("node_request.requested", &record)?];
        let pruned = self.prunable();
        writes.extend(pruned.iter().map(|id| WriteOp::delete_node_request(id)));
        self.ctx.store.commit(writes).await?;
        for id in &pruned {
            self.requests.remove(id);
        }
        self.requests.insert(record.id.clone(), record.clone());
        self.publish();
        Ok(record)
    }

    /// The oldest done requests past [`DONE_REQUESTS_KEPT`] (dropped in
    /// the caller's commit).
    fn prunable(&self) -> Vec<String> {
        let done: Vec<String> = self.requests.values().filter(|r| r.state.is_done()).map(|r| r.id.clone()).collect();
        let over = done.len().saturating_sub(DONE_REQUESTS_KEPT);
        done.into_iter().take(over).collect()
    }

    /// The pools that may still serve `r`, by priority: they offer its
    /// labels and have not declined it (a min-ready request: its own pool
    /// only).
    fn candidates(&self, r: &NodeRequestRecord) -> Vec<(String, u32)> {
        let min_ready = r.requestor.starts_with("min-ready:");
        self.ctx
            .pools
            .pools
            .iter()
            .filter(|p| p.config.offers(&r.labels) && !r.declined_by.contains(&p.config.name))
            .filter(|p| !min_ready || r.requestor == min_ready_of(&p.config.name))
            .map(|p| (p.config.name.clone(), p.config.capacity().0))
            .collect()
    }

    /// Gives each waiting request to a pool, or declines it.
    pub(super) async fn assign(&mut self) -> Result<(), StorageError> {
        // A pending request that lost a node it was waiting for (a try
        // given up, a node its pool no longer launches) goes back to the
        // pools for what it misses.
        let short: Vec<NodeRequestRecord> = self
            .requests
            .values()
            .filter(|r| r.state == RequestState::Pending)
            .filter(|r| r.count > r.nodes.len() as u32 + self.launching_for(&r.id))
            .cloned()
            .collect();
        for mut r in short {
            r.state = RequestState::Requested;
            r.pool = None;
            r.updated_at = OffsetDateTime::now_utc();
            self.ctx.store.commit(vec![WriteOp::put_node_request(&r)?]).await?;
            self.requests.insert(r.id.clone(), r);
        }
        let mut waiting: Vec<NodeRequestRecord> =
            self.requests.values().filter(|r| r.state == RequestState::Requested).cloned().collect();
        waiting.sort_by(|a, b| (a.priority, &a.id).cmp(&(b.priority, &b.id)));
        for mut r in waiting {
            let mut writes = Vec::new();
            let missing = r.count.saturating_sub(r.nodes.len() as u32 + self.launching_for(&r.id));
            if missing == 0 {
                continue;
            }
            let now = OffsetDateTime::now_utc();
            let min_ready = r.requestor.starts_with("min-ready:");
            let mut taken = None;
            let mut could_later = false;
            let candidates = self.candidates(&r);
            if candidates.is_empty() {
                // Every pool that could serve it declined it.
                self.fail(&mut r, &mut writes)?;
            }
            for (name, max_nodes) in candidates {
                let health = self.health.get(&name).cloned().unwrap_or_default();
                let cap = max_nodes;
                let used = self.used(&name);
                let why = if let Some(b) = &health.broken {
                    Some(format!("the pool is broken: {b}"))
                } else if health.no_capacity_until.is_some_and(|t| t > now) {
                    Some(format!(
                        "its provider had no capacity ({})",
                        health.last_error.as_deref().unwrap_or("no machine of this kind")
                    ))
                } else if missing > cap {
                    let by = self.pool(&name).map(|p| p.config.capacity().1).unwrap_or_default();
                    let by = if by == "max_nodes" { String::new() } else { format!(" ({by})") };
                    Some(format!("needs {missing} nodes, the pool holds at most {cap}{by}"))
                } else if health.paused_until.is_some_and(|t| t > now) || used + missing > cap {
                    if min_ready {
                        Some(format!("at quota ({used} of {cap} nodes)"))
                    } else {
                        could_later = true;
                        None
                    }
                } else {
                    taken = Some(name.clone());
                    break;
                };
                if let Some(why) = why {
                    self.decline(&mut r, &name, why, &mut writes)?;
                    if r.state == RequestState::Failed {
                        break;
                    }
                }
            }
            if let Some(pool) = taken {
                r.state = RequestState::Pending;
                r.pool = Some(pool.clone());
                r.updated_at = now;
                writes.push(request_event("node_request.pending", &r)?);
                let mut launched = Vec::new();
                for _ in 0..missing {
                    let node = self.new_node_id(&pool)?;
                    let n = PoolNodeRecord {
                        version: RECORD_VERSION,
                        node: node.clone(),
                        pool: pool.clone(),
                        request: Some(r.id.clone()),
                        external_id: None,
                        state: Lifecycle::Launching,
                        attempt: 1,
                        created_at: now,
                        state_since: now,
                        last_error: None,
                        held_until: None,
                        removal: None,
                    };
                    writes.push(WriteOp::put_pool_node(&n)?);
                    writes.push(node_event("node.launching", &n, json!({}))?);
                    launched.push(n);
                }
                writes.push(WriteOp::put_node_request(&r)?);
                // Durable before any create: a master killed during one
                // finds its resource by the node's tag.
                self.ctx.store.commit(writes).await?;
                self.requests.insert(r.id.clone(), r);
                for n in launched {
                    let node = n.node.clone();
                    self.nodes.insert(node.clone(), n);
                    self.create(&node).await;
                }
                continue;
            }
            if r.state == RequestState::Requested && !could_later && !writes.is_empty() {
                // Every pool declined it.
                self.fail(&mut r, &mut writes)?;
            }
            if !writes.is_empty() {
                writes.push(WriteOp::put_node_request(&r)?);
                self.ctx.store.commit(writes).await?;
                self.requests.insert(r.id.clone(), r);
            }
        }
        Ok(())
    }

    /// `pool` declines `r` for `why`; `r` fails when no pool offering its
    /// labels is left.
    pub(super) fn decline(
        &mut self,
        r: &mut NodeRequestRecord,
        pool: &str,
        why: String,
        writes: &mut Vec<WriteOp>,
    ) -> Result<(), StorageError> {
        if r.state.is_done() || r.declined_by.iter().any(|p| p == pool) {
            return Ok(());
        }
        r.declined_by.push(pool.to_string());
        r.reasons.push(format!("{pool}: {why}"));
        r.state = RequestState::Requested;
        r.pool = None;
        r.updated_at = OffsetDateTime::now_utc();
        writes.push(events::append(&events::event(
            "node_request.declined",
            None,
            json!({"request": r.id, "pool": pool, "reason": why, "requestor": r.requestor}),
        ))?);
        if self.candidates(r).is_empty() {
            self.fail(r, writes)?;
        }
        Ok(())
    }

    /// Fails every open request filed by `prefix` with `why`.
    pub(super) async fn cancel(&mut self, prefix: &str, why: &str) -> Result<(), StorageError> {
        let open: Vec<NodeRequestRecord> =
            self.requests.values().filter(|r| !r.state.is_done() && r.requestor.starts_with(prefix)).cloned().collect();
        for mut r in open {
            r.reasons.push(format!("cancelled: {why}"));
            let mut writes = vec![];
            self.fail(&mut r, &mut writes)?;
            writes.push(WriteOp::put_node_request(&r)?);
            self.ctx.store.commit(writes).await?;
            self.requests.insert(r.id.clone(), r);
        }
        self.publish();
        Ok(())
    }

    fn fail(&mut self, r: &mut NodeRequestRecord, writes: &mut Vec<WriteOp>) -> Result<(), StorageError> {
        if let Some(pool) = r.requestor.strip_prefix("min-ready:") {
            // Its pool files no spare for a while (not one failing launch
            // after another).
            self.min_ready_failed.insert(pool.to_string(), std::time::Instant::now());
        }
        r.state = RequestState::Failed;
        r.updated_at = OffsetDateTime::now_utc();
        writes.push(request_event("node_request.failed", r)?);
        Ok(())
    }

    /// Files one request per spare each pool is short of `min_ready`
    /// (empty, ready, uncordoned nodes), unless it cannot launch now.
    pub(super) async fn min_ready(&mut self) -> Result<(), StorageError> {
        let now = OffsetDateTime::now_utc();
        let mut filed = Vec::new();
        for pool in &self.ctx.pools.pools {
            let c = &pool.config;
            if c.min_ready == 0 {
                continue;
            }
            let health = self.health.get(&c.name).cloned().unwrap_or_default();
            if health.summary(now) != "ok" && health.summary(now) != "unhealthy" {
                continue;
            }
            if self.min_ready_failed.get(&c.name).is_some_and(|t| t.elapsed() < MIN_READY_PAUSE) {
                continue;
            }
            let spares = self.spares(&c.name).len() as u32;
            let requestor = min_ready_of(&c.name);
            let coming: u32 = self
                .requests
                .values()
                .filter(|r| r.requestor == requestor && !r.state.is_done())
                .map(|r| r.count - r.nodes.len() as u32)
                .sum();
            let room = c.capacity().0.saturating_sub(self.used(&c.name) + coming);
            let short = c.min_ready.saturating_sub(spares + coming).min(room);
            for _ in 0..short {
                filed.push(NewRequest {
                    labels: c.labels.clone(),
                    count: 1,
                    requestor: requestor.clone(),
                    priority: MIN_READY_PRIORITY,
                });
            }
        }
        for r in filed {
            if let Err(e) = self.file(r).await {
                tracing::warn!(error = %e, "a min-ready request could not be filed");
            }
        }
        Ok(())
    }

    /// The pool's empty, ready, uncordoned nodes.
    pub(super) fn spares(&self, pool: &str) -> Vec<NodeId> {
        self.nodes
            .values()
            .filter(|n| n.pool == pool && n.state == Lifecycle::Ready)
            // A node of a request not done yet is its requestor's.
            .filter(|n| n.request.as_ref().and_then(|id| self.requests.get(id)).is_none_or(|r| r.state.is_done()))
            .filter(|n| self.link_status(&n.node) == Some(NodeStatus::Ready))
            .filter(|n| self.ctx.read_model.cordon_of(&n.node).is_none())
            .filter(|n| self.ctx.read_model.node(&n.node).is_some_and(|e| e.instance_count() == 0))
            .map(|n| n.node.clone())
            .collect()
    }

    /// Nodes the pool holds or is making, and the leaked resources it
    /// found: what counts against `max_nodes`.
    /// What counts against the pool's capacity: its nodes and leaked
    /// resources, but not a node being removed whose agent is `Down` (a
    /// repair): its members' replacements may need its room, so a pool
    /// may go over by at most `max_disrupting` while it is deleted.
    pub(super) fn used(&self, pool: &str) -> u32 {
        let held = self
            .nodes
            .values()
            .filter(|n| n.pool == pool)
            .filter(|n| !(n.state == Lifecycle::Draining && self.link_status(&n.node) == Some(NodeStatus::Down)))
            .count() as u32;
        held + self.health.get(pool).map(|h| h.leaked as u32).unwrap_or(0)
    }

    /// Nodes being launched (not yet ready) for request `id`.
    fn launching_for(&self, id: &str) -> u32 {
        self.nodes.values().filter(|n| n.request.as_deref() == Some(id) && n.state != Lifecycle::Ready).count() as u32
    }

    pub(super) fn new_node_id(&self, pool: &str) -> Result<NodeId, StorageError> {
        // Pool names are at most 63 characters; the id keeps within the
        // node id rule.
        let head: String = pool.chars().take(50).collect();
        loop {
            let random = crate::actors::tokens::random::<4>().map_err(|e| StorageError::Codec(e.to_string()))?;
            let id = NodeId::new(format!("{head}-{}", hex::encode(random)));
            if !self.nodes.contains_key(&id) && self.ctx.read_model.node(&id).is_none() {
                return Ok(id);
            }
        }
    }
}

pub(super) fn request_event(kind: &str, r: &NodeRequestRecord) -> Result<WriteOp, StorageError> {
    events::append(&events::event(
        kind,
        None,
        json!({
            "request": r.id,
            "labels": shown(&r.labels),
            "count": r.count,
            "requestor": r.requestor,
            "pool": r.pool,
            "nodes": r.nodes.iter().map(|n| n.as_str()).collect::<Vec<_>>(),
            "reasons": r.reasons,
        }),
    ))
}

/// Requests by state, for a pool's summary.
pub fn waiting_for(requests: &BTreeMap<String, NodeRequestRecord>, pool: &str) -> usize {
    requests.values().filter(|r| !r.state.is_done() && r.pool.as_deref() == Some(pool)).count()
}
