//! Leak cleanup (the seed's `listNodes()` comparison): each pool's
//! resources against the store, every `pool_cleanup_interval`.
//!
//! Only resources tagged with this installation's id and the pool's name
//! are judged (an untagged one, or another master's, is never touched).
//! The provider is listed first and the launcher's records read after the
//! listing has answered: a node is recorded before its `create`, so a
//! resource listed belongs to a record that was durable by then, unless
//! it was forgotten since. A resource is deleted only once seen leaked in
//! two consecutive passes and `pool_leak_grace` after the first; a pass
//! whose listing failed counts for nothing and breaks the run (a partial
//! listing never deletes). Leaked resources count against the pool's
//! `max_nodes` until they are gone. Each is announced when found
//! (`node.leak_found`) and when removed (`node.leak_removed`), and counted
//! (`flotilla_pool_leaks_found_total`, `..._removed_total`).

use std::time::Instant;

use serde_json::json;

use super::launcher::{Done, Launcher, bounded};
use crate::providers::driver::{TAG_MASTER, TAG_NODE, TAG_POOL};
use crate::providers::{DriverError, Resource};
use crate::storage::{StorageError, events};

impl Launcher {
    /// Starts listing every pool not being listed already.
    pub(super) fn list_for_leaks(&mut self) {
        for pool in &self.ctx.pools.pools {
            let name = pool.config.name.clone();
            if !self.listing.insert(name.clone()) {
                continue;
            }
            let driver = pool.driver.clone();
            self.work.spawn(async move { Done::Listed { pool: name, result: bounded(driver.list()).await } });
        }
    }

    /// Compares `pool`'s listing with the records as they are now.
    pub(super) async fn leak_pass(
        &mut self,
        pool: &str,
        listed: Result<Vec<Resource>, DriverError>,
    ) -> Result<(), StorageError> {
        let resources = match listed {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(pool, error = %e, "listing for leaks failed: this pass deletes nothing");
                self.sightings.retain(|(p, _), _| p != pool);
                self.health_of(pool).last_error = Some(format!("listing its resources: {e}"));
                return Ok(());
            }
        };
        let now = Instant::now();
        let mine: Vec<&Resource> = resources
            .iter()
            .filter(|r| r.tag(TAG_MASTER) == Some(self.ctx.master_id.as_str()) && r.tag(TAG_POOL) == Some(pool))
            .collect();
        let leaked: Vec<&Resource> = mine
            .into_iter()
            .filter(|r| {
                let known = r.tag(TAG_NODE).and_then(|n| self.nodes.get(&crate::ids::NodeId::new(n)));
                match known {
                    None => true,
                    // Its record names another resource (a try unwound
                    // and launched again): this one is a leftover.
                    Some(n) => n.external_id.as_deref().is_some_and(|id| id != r.external_id),
                }
            })
            .collect();
        let seen: Vec<String> = leaked.iter().map(|r| r.external_id.clone()).collect();
        self.sightings.retain(|(p, id), _| p != pool || seen.contains(id));
        let mut found = Vec::new();
        let mut remove = Vec::new();
        for r in &leaked {
            let key = (pool.to_string(), r.external_id.clone());
            let entry = self.sightings.entry(key).or_insert((0, now));
            entry.0 += 1;
            if entry.0 == 1 {
                found.push(*r);
            }
            let held = r
                .tag(TAG_NODE)
                .and_then(|n| self.nodes.get(&crate::ids::NodeId::new(n)))
                .is_some_and(|n| n.held_until.is_some_and(|t| t > time::OffsetDateTime::now_utc()));
            if entry.0 >= 2 && now.duration_since(entry.1) >= self.ctx.leak_grace && !held {
                remove.push(r.external_id.clone());
            }
        }
        self.health_of(pool).leaked = leaked.len();
        let mut writes = Vec::new();
        for r in found {
            metrics::counter!("flotilla_pool_leaks_found_total", "pool" => pool.to_string()).increment(1);
            tracing::warn!(pool, external_id = %r.external_id, node = ?r.tag(TAG_NODE), "a leaked resource");
            writes.push(events::append(&events::event(
                "node.leak_found",
                None,
                json!({"pool": pool, "external_id": r.external_id, "node": r.tag(TAG_NODE)}),
            ))?);
        }
        if !writes.is_empty() {
            self.ctx.store.commit(writes).await?;
        }
        let Some(driver) = self.pool(pool).map(|p| p.driver.clone()) else { return Ok(()) };
        for external_id in remove {
            // Once: the next pass sees it again only if the delete failed.
            self.sightings.remove(&(pool.to_string(), external_id.clone()));
            let (driver, pool) = (driver.clone(), pool.to_string());
            self.work.spawn(async move {
                let result = bounded(driver.delete(&external_id)).await;
                Done::LeakDeleted { pool, external_id, result }
            });
        }
        Ok(())
    }
}
