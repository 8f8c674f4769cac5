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
#[derive(Default)]
pub struct Cordons {
    lock: tokio::sync::Mutex<()>,
}

impl Cordons {
    /// Loads the stored cordons into the read model (at the master's start).
    pub fn load(store: &dyn MetaStore, read_model: &ReadModel) -> Result<(), crate::storage::StorageError> {
        for r in crate::storage::meta::load::<CordonRecord>(store, crate::storage::keys::master_cf::CORDONS)? {
            read_model.put_cordon(r);
        }
        Ok(())
    }

    /// Cordons `node` (a node this master knows) with `reason`. Cordoning
    /// a cordoned node keeps its first time and takes the new reason.
    pub async fn cordon(
        &self,
        store: &Arc<dyn MetaStore>,
        read_model: &ReadModel,
        node: &NodeId,
        reason: &str,
    ) -> Result<CordonRecord, Error> {
        if reason.chars().count() > MAX_REASON || reason.chars().any(char::is_control) {
            return Err(Error::invalid(
                "invalid_request",
                format!("reason: at most {MAX_REASON} characters, without control characters"),
            ));
        }
        let _turn = self.lock.lock().await;
        known(read_model, node)?;
        let since = read_model.cordon_of(node).map(|c| c.since).unwrap_or_else(OffsetDateTime::now_utc);
        let record = CordonRecord { version: RECORD_VERSION, node: node.clone(), reason: reason.into(), since };
        let event = events::event("node.cordoned", None, json!({"node": node.as_str(), "reason": reason}));
        commit(store, vec![WriteOp::put_cordon(&record)?, events::append(&event)?]).await?;
        read_model.put_cordon(record.clone());
        Ok(record)
    }

    /// Takes `node` back into placement; `false` when it was not cordoned
    /// (nothing written).
    pub async fn uncordon(
        &self,
        store: &Arc<dyn MetaStore>,
        read_model: &ReadModel,
        node: &NodeId,
    ) -> Result<bool, Error> {
        let _turn = self.lock.lock().await;
        known(read_model, node)?;
        if read_model.cordon_of(node).is_none() {
            return Ok(false);
        }
        let event = events::event("node.uncordoned", None, json!({"node": node.as_str()}));
        commit(store, vec![WriteOp::delete_cordon(node), events::append(&event)?]).await?;
        read_model.remove_cordon(node);
        Ok(true)
    }
}

fn known(read_model: &ReadModel, node: &NodeId) -> Result<(), Error> {
    match read_model.node(node) {
        Some(_) => Ok(()),
        None => Err(Error::not_found("node", node)),
    }
}

async fn commit(store: &Arc<dyn MetaStore>, writes: Vec<WriteOp>) -> Result<(), Error> {
    store.commit(writes).await.map_err(Error::from)
}
