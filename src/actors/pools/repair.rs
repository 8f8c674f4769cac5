//! Repair (the invariant 7): a ready provider node `Down` longer
//! than its pool's `replace_after` is removed like an operator's removal
//! (drained: each member moved to another node by its cluster's normal
//! replace, whose placement asks a pool for a node if none is free; then
//! the machine deleted), unless more than a fifth of the pool is `Down`:
//! then nothing is replaced (a partition or a provider outage is not
//! fixed by deleting machines) and an event says why, once per episode.
//! At most `max_disrupting` at once; never a node labelled
//! `do-not-disrupt=true` or held. How long a node has been `Down` is kept
//! in memory: a master restart starts it over (a repair is delayed by it,
//! never hastened).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::json;

use super::launcher::Launcher;
use crate::ids::NodeId;
use crate::storage::pool_records::Lifecycle;
use crate::storage::records::NodeStatus;
use crate::storage::{StorageError, events};

impl Launcher {
    pub(super) async fn repairs(&mut self) -> Result<(), StorageError> {
        let now = Instant::now();
        let mut down: BTreeMap<String, Vec<NodeId>> = BTreeMap::new();
        let mut working: BTreeMap<String, usize> = BTreeMap::new();
        let ready: Vec<(NodeId, String)> = self
            .nodes
            .values()
            .filter(|n| matches!(n.state, Lifecycle::Ready | Lifecycle::Draining))
            .map(|n| (n.node.clone(), n.pool.clone()))
            .collect();
        for (node, pool) in &ready {
            *working.entry(pool.clone()).or_default() += 1;
            let is_ready = self.nodes.get(node).is_some_and(|n| n.state == Lifecycle::Ready);
            if is_ready && self.link_status(node) == Some(NodeStatus::Down) {
                self.down_since.entry(node.clone()).or_insert(now);
                down.entry(pool.clone()).or_default().push(node.clone());
            } else {
                self.down_since.remove(node);
            }
        }
        self.down_since.retain(|n, _| ready.iter().any(|(r, _)| r == n));
        for pool in self.ctx.pools.pools.iter().map(|p| p.config.clone()).collect::<Vec<_>>() {
            let Some(after) = pool.replace_after else { continue };
            let Some(nodes) = down.get(&pool.name).filter(|d| !d.is_empty()) else {
                self.repair_held.remove(&pool.name);
                continue;
            };
            let total = working.get(&pool.name).copied().unwrap_or(0);
            if nodes.len() * 5 > total {
                if self.repair_held.insert(pool.name.clone()) {
                    let why = format!(
                        "{} of its {total} nodes are Down (more than a fifth): nothing is replaced until fewer are",
                        nodes.len()
                    );
                    tracing::warn!(pool = %pool.name, "{why}");
                    self.health_of(&pool.name).last_error = Some(format!("repair held: {why}"));
                    let ev = events::event(
                        "pool.repair_held",
                        None,
                        json!({"pool": pool.name, "down": nodes, "reason": why}),
                    );
                    self.ctx.store.commit(vec![events::append(&ev)?]).await?;
                }
                continue;
            }
            self.repair_held.remove(&pool.name);
            let mut room = pool.max_disrupting.saturating_sub(self.disrupting(&pool.name));
            for node in nodes {
                if room == 0 {
                    break;
                }
                let since = self.down_since.get(node).copied().unwrap_or(now);
                if now.duration_since(since) < after || self.protected(node) {
                    continue;
                }
                let Some(n) = self.nodes.get(node).cloned() else { continue };
                let shown = humantime::format_duration(Duration::from_secs(now.duration_since(since).as_secs()));
                let why = format!("Down for {shown} (replace_after {})", humantime::format_duration(after));
                self.retire(n, &why).await?;
                self.down_since.remove(node);
                room -= 1;
            }
        }
        Ok(())
    }
}
