//! Repair (the invariant 7): a ready provider node `Down` longer
//! than its pool's `replace_after` is removed like an operator's removal
//! (drained: each member moved to another node by its cluster's normal
//! replace, whose placement asks a pool for a node if none is free; then
//! the machine deleted), unless more than a fifth of the pool (and more
//! than one node) is `Down`, removals under way included: then nothing is
//! replaced (a partition or a provider outage is not
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
        // Per pool: its working nodes (ready, or being removed), those of
        // them Down (a removal under way counts: waves of repairs never
        // take more than the rule allows), and the ready Down ones that
        // may be repaired.
        let mut working: BTreeMap<String, usize> = BTreeMap::new();
        let mut down: BTreeMap<String, usize> = BTreeMap::new();
        let mut candidates: BTreeMap<String, Vec<NodeId>> = BTreeMap::new();
        let nodes: Vec<(NodeId, String, Lifecycle)> = self
            .nodes
            .values()
            .filter(|n| {
                matches!(n.state, Lifecycle::Ready | Lifecycle::Draining)
                    || (n.state == Lifecycle::Deleting && n.removal.is_some())
            })
            .map(|n| (n.node.clone(), n.pool.clone(), n.state))
            .collect();
        for (node, pool, state) in &nodes {
            *working.entry(pool.clone()).or_default() += 1;
            let is_down = self.link_status(node) == Some(NodeStatus::Down);
            if is_down {
                *down.entry(pool.clone()).or_default() += 1;
            }
            if is_down && *state == Lifecycle::Ready {
                self.down_since.entry(node.clone()).or_insert(now);
                candidates.entry(pool.clone()).or_default().push(node.clone());
            } else {
                self.down_since.remove(node);
            }
        }
        self.down_since.retain(|n, _| nodes.iter().any(|(r, _, _)| r == n));
        for pool in self.ctx.pools.pools.iter().map(|p| p.config.clone()).collect::<Vec<_>>() {
            let Some(after) = pool.replace_after else { continue };
            let down_now = down.get(&pool.name).copied().unwrap_or(0);
            let total = working.get(&pool.name).copied().unwrap_or(0);
            // More than a fifth of the pool (and more than one node).
            if down_now > (total / 5).max(1) {
                if self.repair_held.insert(pool.name.clone()) {
                    let why = format!(
                        "{down_now} of its {total} nodes are Down (more than a fifth): nothing is replaced until fewer are"
                    );
                    tracing::warn!(pool = %pool.name, "{why}");
                    self.health_of(&pool.name).last_error = Some(format!("repair held: {why}"));
                    let ev = events::event(
                        "pool.repair_held",
                        None,
                        json!({"pool": pool.name, "down": down_now, "reason": why}),
                    );
                    self.ctx.store.commit(vec![events::append(&ev)?]).await?;
                }
                continue;
            }
            if self.repair_held.remove(&pool.name) {
                let health = self.health_of(&pool.name);
                if health.last_error.as_deref().is_some_and(|e| e.starts_with("repair held")) {
                    health.last_error = None;
                }
            }
            let Some(nodes) = candidates.get(&pool.name) else { continue };
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
