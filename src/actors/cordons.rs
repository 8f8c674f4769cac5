//! Cordoning a node (`POST /nodes/{id}/cordon|uncordon`): no new instance
//! is placed on a cordoned node (a create, a scale-out; pinned to it, they
//! are refused); what runs there stays and is served as before. A cordon
//! is stored (its own column family) and an event written in the same
//! commit, shown only once durable, and kept across master restarts.
//! Changes are serialized, so the store and what readers see never
//! disagree about a node.

use std::sync::Arc;

use serde_json::json;
use time::OffsetDateTime;

use super::read_model::ReadModel;
use crate::error::Error;
use crate::ids::NodeId;
use crate::storage::records::{CordonRecord, RECORD_VERSION};
use crate::storage::{MetaStore, WriteOp, events};

/// The longest reason kept.
pub const MAX_REASON: usize = 500;

/// Serializes cordon changes (one per master).
pub struct Cordons {
    store: Arc<dyn MetaStore>,
    read_model: Arc<ReadModel>,
    lock: Arc<tokio::sync::Mutex<()>>,
}

impl Cordons {
    /// The lock every cordon change takes (the pools' launcher writes its
    /// own cordons under it too).
    pub fn lock(&self) -> Arc<tokio::sync::Mutex<()>> {
        self.lock.clone()
    }

    /// Loads the stored cordons into the read model (at the master's start).
    pub fn load(
        store: Arc<dyn MetaStore>,
        read_model: Arc<ReadModel>,
    ) -> Result<Cordons, crate::storage::StorageError> {
        for r in crate::storage::meta::load::<CordonRecord>(&*store, crate::storage::keys::master_cf::CORDONS)? {
            read_model.put_cordon(r);
        }
        Ok(Cordons { store, read_model, lock: Arc::default() })
    }

    /// Cordons `node` (a node this master knows) with `reason`. Cordoning
    /// a cordoned node keeps its first time and takes the new reason.
    pub async fn cordon(&self, node: &NodeId, reason: &str) -> Result<CordonRecord, Error> {
        if reason.chars().count() > MAX_REASON || reason.chars().any(char::is_control) {
            return Err(Error::invalid(
                "invalid_request",
                format!("reason: at most {MAX_REASON} characters, without control characters"),
            ));
        }
        let (node, reason) = (node.clone(), reason.to_string());
        self.change(move |read_model| {
            known(read_model, &node)?;
            let since = read_model.cordon_of(&node).map(|c| c.since).unwrap_or_else(OffsetDateTime::now_utc);
            let record = CordonRecord { version: RECORD_VERSION, node: node.clone(), reason: reason.clone(), since };
            let event = events::event("node.cordoned", None, json!({"node": node.as_str(), "reason": reason}));
            let writes = vec![WriteOp::put_cordon(&record)?, events::append(&event)?];
            let shown = record.clone();
            Ok(Some((writes, Box::new(move |m: &ReadModel| m.put_cordon(shown)) as Apply, record)))
        })
        .await?
        .ok_or_else(|| Error::Internal { message: "a cordon wrote nothing".into() })
    }

    /// Takes `node` back into placement; `false` when it was not cordoned
    /// (nothing written).
    pub async fn uncordon(&self, node: &NodeId) -> Result<bool, Error> {
        let node = node.clone();
        let changed = self
            .change(move |read_model| {
                known(read_model, &node)?;
                if read_model.cordon_of(&node).is_none() {
                    return Ok(None);
                }
                let event = events::event("node.uncordoned", None, json!({"node": node.as_str()}));
                let writes = vec![WriteOp::delete_cordon(&node), events::append(&event)?];
                Ok(Some((writes, Box::new(move |m: &ReadModel| m.remove_cordon(&node)) as Apply, ())))
            })
            .await?;
        Ok(changed.is_some())
    }

    /// Decides a change under the lock (`plan`: what to write, how to show
    /// it, what to answer; `None`: nothing to do), then writes it and
    /// shows it once durable, in a task of its own: a caller that stops
    /// waiting (a client that hung up) cannot leave the store changed and
    /// the read model not. A full write queue answers `503` at once.
    async fn change<T: Send + 'static>(
        &self,
        plan: impl FnOnce(&ReadModel) -> Result<Option<(Vec<WriteOp>, Apply, T)>, Error> + Send + 'static,
    ) -> Result<Option<T>, Error> {
        let (store, read_model, lock) = (self.store.clone(), self.read_model.clone(), self.lock.clone());
        let task = tokio::spawn(async move {
            let _turn = lock.lock_owned().await;
            let Some((writes, apply, answer)) = plan(&read_model)? else { return Ok(None) };
            store.try_commit(writes).await.map_err(Error::from)?;
            apply(&read_model);
            Ok(Some(answer))
        });
        task.await.map_err(|e| Error::Internal { message: format!("cordon task: {e}") })?
    }
}

/// How a durable change is shown.
type Apply = Box<dyn FnOnce(&ReadModel) + Send>;

fn known(read_model: &ReadModel, node: &NodeId) -> Result<(), Error> {
    match read_model.node(node) {
        Some(_) => Ok(()),
        None => Err(Error::not_found("node", node)),
    }
}
