//! The agent's own RocksDB store: one record per instance it holds and the
//! tombstones of deletes in progress (DESIGN.md §11, §12). Writes go through
//! [`StoreWriter`] with `WriteOp::put_agent_instance`, `put_tombstone`, ...
//! (see [`super::keys`]); this module opens the database and loads it at boot.

use std::path::Path;
use std::sync::Arc;

use rocksdb::DB;

use super::agent_records::{AgentInstanceRecord, DynamicUserRecord, RestartRecord, Tombstone};
use super::db;
use super::keys::agent_cf;
use super::{StorageError, StoreWriter};

/// Everything the agent persisted, as loaded at boot (sorted by instance id).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct AgentSnapshot {
    pub instances: Vec<AgentInstanceRecord>,
    pub tombstones: Vec<Tombstone>,
    /// The restart policy's recent restarts (none in a store written
    /// before they were kept: the column family is created empty).
    pub restarts: Vec<RestartRecord>,
    /// The dynamic users given to clusters (none in a store written
    /// before they existed), and where the search for the next uid starts.
    pub users: Vec<DynamicUserRecord>,
    pub users_next: Option<u32>,
}

/// The agent's database and its writer; cheap to clone.
#[derive(Clone)]
pub struct AgentStore {
    db: Arc<DB>,
    writer: StoreWriter,
}

impl std::fmt::Debug for AgentStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentStore").field("path", &self.db.path()).field("writer", &self.writer).finish()
    }
}

impl AgentStore {
    /// Opens (creating if needed) the agent database in `dir` and starts its writer.
    pub fn open(dir: &Path) -> Result<AgentStore, StorageError> {
        let db = db::open(dir, &agent_cf::ALL, agent_cf::META)?;
        let writer = StoreWriter::start(db.clone(), super::writer::DEFAULT_QUEUE)?;
        Ok(AgentStore { db, writer })
    }

    /// The writer every agent write goes through.
    pub fn writer(&self) -> &StoreWriter {
        &self.writer
    }

    /// Reads every record (blocking; meant for boot, via `spawn_blocking`).
    pub fn load_all(&self) -> Result<AgentSnapshot, StorageError> {
        Ok(AgentSnapshot {
            instances: db::load_cf(&self.db, agent_cf::INSTANCES)?,
            tombstones: db::load_cf(&self.db, agent_cf::TOMBSTONES)?,
            restarts: db::load_cf(&self.db, agent_cf::RESTARTS)?,
            users: db::load_cf(&self.db, agent_cf::USERS)?,
            users_next: self.users_next()?,
        })
    }

    /// One value of `meta` (blocking).
    pub fn meta(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError> {
        let meta = self.db.cf_handle(agent_cf::META).ok_or(StorageError::UnknownColumnFamily { cf: agent_cf::META })?;
        self.db.get_cf(meta, key).map_err(StorageError::Rocks)
    }

    fn users_next(&self) -> Result<Option<u32>, StorageError> {
        let meta = self.db.cf_handle(agent_cf::META).ok_or(StorageError::UnknownColumnFamily { cf: agent_cf::META })?;
        match self.db.get_cf(meta, super::keys::DYNAMIC_USERS_NEXT_KEY).map_err(StorageError::Rocks)? {
            Some(v) => Ok(Some(db::decode_value(agent_cf::META, super::keys::DYNAMIC_USERS_NEXT_KEY, &v)?)),
            None => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::InstanceId;
    use crate::storage::WriteOp;
    use crate::storage::testdata as td;

    #[tokio::test]
    async fn records_survive_a_reopen_and_deletes_remove() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (td::agent_instance("web-server-1-abcdef"), td::agent_instance("web-server-2-abcdef"));
        let tomb = td::tombstone("web-server-2-abcdef");
        {
            let store = AgentStore::open(dir.path()).unwrap();
            let writes = vec![
                WriteOp::put_agent_instance(&a).unwrap(),
                WriteOp::put_agent_instance(&b).unwrap(),
                WriteOp::put_tombstone(&tomb).unwrap(),
            ];
            store.writer().commit(writes).await.unwrap();
        }
        let store = AgentStore::open(dir.path()).unwrap();
        let snap = store.load_all().unwrap();
        assert_eq!(snap.instances, vec![a.clone(), b.clone()]);
        assert_eq!(snap.tombstones, vec![tomb.clone()]);

        // Finishing the delete: the record and its tombstone go together.
        let id = InstanceId::new("web-server-2-abcdef");
        store.writer().commit(vec![WriteOp::delete_agent_instance(&id), WriteOp::delete_tombstone(&id)]).await.unwrap();
        drop(store);
        let snap = AgentStore::open(dir.path()).unwrap().load_all().unwrap();
        assert_eq!(snap, AgentSnapshot { instances: vec![a], ..Default::default() });
    }

    /// The restarts are kept under their own key: a store opened before
    /// they existed gets the column family empty, and they survive a reopen.
    #[tokio::test]
    async fn restarts_survive_a_reopen_beside_an_older_store() {
        let dir = tempfile::tempdir().unwrap();
        let a = td::agent_instance("web-server-1-abcdef");
        {
            // A store of the three column families of before.
            let old = ["instances", "tombstones", "meta"];
            let db = db::open(dir.path(), &old, agent_cf::META).unwrap();
            let v = crate::storage::codec::encode(&a).unwrap();
            db.put_cf(db.cf_handle(agent_cf::INSTANCES).unwrap(), a.id.as_str().as_bytes(), v).unwrap();
        }
        let store = AgentStore::open(dir.path()).unwrap();
        let snap = store.load_all().unwrap();
        assert_eq!(snap, AgentSnapshot { instances: vec![a.clone()], ..Default::default() });
        let r = RestartRecord { version: 1, id: a.id.clone(), times_ms: vec![1_700_000_000_000, 1_700_000_001_000] };
        store.writer().commit(vec![WriteOp::put_restarts(&r).unwrap()]).await.unwrap();
        drop(store);
        let store = AgentStore::open(dir.path()).unwrap();
        assert_eq!(store.load_all().unwrap().restarts, vec![r]);
        store.writer().commit(vec![WriteOp::delete_restarts(&a.id)]).await.unwrap();
        assert!(store.load_all().unwrap().restarts.is_empty());
    }

    #[tokio::test]
    async fn an_updated_record_replaces_the_old_one() {
        let dir = tempfile::tempdir().unwrap();
        let store = AgentStore::open(dir.path()).unwrap();
        let mut rec = td::agent_instance("x-y-1-abcdef");
        store.writer().commit(vec![WriteOp::put_agent_instance(&rec).unwrap()]).await.unwrap();
        rec.generation += 1;
        rec.pid = None;
        store.writer().commit(vec![WriteOp::put_agent_instance(&rec).unwrap()]).await.unwrap();
        assert_eq!(store.load_all().unwrap().instances, vec![rec]);
    }
}
