//! The master's RocksDB store: opening it, loading everything at boot, and
//! reading the event log. Writes go through [`StoreWriter`] with the typed
//! builders in [`super::keys`] (`WriteOp::put_cluster`, ...).
//!
//! At boot the master loads every record into its actors and read model
//! (`load_all`); after that the actors own the state and the store is only
//! written, except for `events_after`, which pages through the event log.

use std::path::Path;
use std::sync::Arc;

use rocksdb::{DB, Direction, IteratorMode};

use super::db;
use super::keys::{event_key, event_seq, master_cf};
use super::records::{
    ClusterRecord, EventRecord, InstanceRecord, LeftoverRecord, NodeRecord, OperationRecord, PackageRecord,
};
use super::{StorageError, StoreWriter};

/// Everything the master persisted, as loaded at boot.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct MasterSnapshot {
    pub clusters: Vec<ClusterRecord>,
    /// Grouped by cluster (key order), not sorted further.
    pub instances: Vec<InstanceRecord>,
    pub nodes: Vec<NodeRecord>,
    /// Sorted by name, then version bytes.
    pub packages: Vec<PackageRecord>,
    /// Sorted by `created_at`, oldest first.
    pub operations: Vec<OperationRecord>,
    /// The highest event sequence number stored, 0 when there is none.
    pub last_event_seq: u64,
    pub leftovers: Vec<LeftoverRecord>,
}

/// The master's database and its writer; cheap to clone.
#[derive(Clone)]
pub struct MasterStore {
    db: Arc<DB>,
    writer: StoreWriter,
}

impl std::fmt::Debug for MasterStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MasterStore").field("path", &self.db.path()).field("writer", &self.writer).finish()
    }
}

impl MasterStore {
    /// Opens (creating if needed) the master database in `dir` and starts its writer.
    pub fn open(dir: &Path) -> Result<MasterStore, StorageError> {
        let db = db::open(dir, &master_cf::ALL, master_cf::META)?;
        let writer = StoreWriter::start(db.clone())?;
        Ok(MasterStore { db, writer })
    }

    /// The writer every master write goes through.
    pub fn writer(&self) -> &StoreWriter {
        &self.writer
    }

    /// Reads every record (blocking; meant for boot, via `spawn_blocking`).
    pub fn load_all(&self) -> Result<MasterSnapshot, StorageError> {
        let mut operations: Vec<OperationRecord> = db::load_cf(&self.db, master_cf::OPERATIONS)?;
        operations.sort_by_key(|o| o.created_at);
        Ok(MasterSnapshot {
            clusters: db::load_cf(&self.db, master_cf::CLUSTERS)?,
            instances: db::load_cf(&self.db, master_cf::INSTANCES)?,
            nodes: db::load_cf(&self.db, master_cf::NODES)?,
            packages: db::load_cf(&self.db, master_cf::PACKAGES)?,
            operations,
            last_event_seq: self.last_event_seq()?,
            leftovers: db::load_cf(&self.db, master_cf::LEFTOVERS)?,
        })
    }

    fn events_cf(&self) -> Result<&rocksdb::ColumnFamily, StorageError> {
        self.db.cf_handle(master_cf::EVENTS).ok_or(StorageError::UnknownColumnFamily { cf: master_cf::EVENTS })
    }

    fn last_event_seq(&self) -> Result<u64, StorageError> {
        let mut iter = self.db.iterator_cf(self.events_cf()?, IteratorMode::End);
        match iter.next() {
            None => Ok(0),
            Some(item) => {
                let (key, _) = item.map_err(StorageError::Rocks)?;
                event_seq(&key).ok_or_else(|| {
                    StorageError::Codec(format!("events: key {} is not a sequence number", hex::encode(&key)))
                })
            }
        }
    }

    /// Up to `limit` events with a sequence number above `seq`, in order (blocking).
    pub fn events_after(&self, seq: u64, limit: usize) -> Result<Vec<EventRecord>, StorageError> {
        let Some(from) = seq.checked_add(1) else {
            return Ok(Vec::new());
        };
        let start = event_key(from);
        let iter = self.db.iterator_cf(self.events_cf()?, IteratorMode::From(&start, Direction::Forward));
        let mut out = Vec::with_capacity(limit.min(1024));
        for item in iter.take(limit) {
            let (key, value) = item.map_err(StorageError::Rocks)?;
            out.push(db::decode_value(master_cf::EVENTS, &key, &value)?);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::WriteOp;
    use crate::storage::db::SCHEMA_VERSION;
    use crate::storage::keys::SCHEMA_VERSION_KEY;
    use crate::storage::testdata as td;

    #[tokio::test]
    async fn records_survive_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let c1 = td::cluster("web");
        let c2 = td::cluster("db");
        let instances = vec![td::instance(&c1, 1), td::instance(&c1, 2), td::instance(&c2, 1)];
        // Stored newest first: load_all must give them oldest first.
        let ops = [td::operation(&c1, td::T0 + time::Duration::hours(1)), td::operation(&c2, td::T0)];
        let nodes = vec![td::node("node-1"), td::node("node-2")];
        let packages = vec![td::package("zk", "3.8.0"), td::package("zk", "3.9.0")];
        {
            let store = MasterStore::open(dir.path()).unwrap();
            let mut writes = vec![WriteOp::put_cluster(&c1).unwrap(), WriteOp::put_cluster(&c2).unwrap()];
            writes.extend(instances.iter().map(|r| WriteOp::put_instance(r).unwrap()));
            writes.extend(ops.iter().map(|r| WriteOp::put_operation(r).unwrap()));
            writes.extend(nodes.iter().map(|r| WriteOp::put_node(r).unwrap()));
            writes.extend(packages.iter().map(|r| WriteOp::put_package(r).unwrap()));
            writes.push(WriteOp::put_event(&td::event(1)).unwrap());
            writes.push(WriteOp::put_event(&td::event(256)).unwrap());
            writes.push(WriteOp::put_event(&td::event(255)).unwrap());
            store.writer().commit(writes).await.unwrap();
        }
        let store = MasterStore::open(dir.path()).unwrap();
        let snap = store.load_all().unwrap();

        let mut clusters = snap.clusters.clone();
        clusters.sort_by(|a, b| a.name.cmp(&b.name));
        assert_eq!(clusters, vec![c2.clone(), c1.clone()]);
        assert_eq!(snap.instances.len(), 3);
        for i in &instances {
            assert!(snap.instances.contains(i), "{i:?} missing");
        }
        // A cluster's instances are adjacent (one key prefix).
        let owners: Vec<_> = snap.instances.iter().map(|i| i.cluster_id).collect();
        assert!(owners[0] == owners[1] || owners[1] == owners[2]);
        assert_eq!(snap.operations, vec![ops[1].clone(), ops[0].clone()]);
        assert_eq!(snap.nodes, nodes);
        assert_eq!(snap.packages, packages);
        assert_eq!(snap.last_event_seq, 256);
    }

    #[tokio::test]
    async fn deletes_remove_records() {
        let dir = tempfile::tempdir().unwrap();
        let c = td::cluster("web");
        let (i1, i2) = (td::instance(&c, 1), td::instance(&c, 2));
        {
            let store = MasterStore::open(dir.path()).unwrap();
            let w = store.writer();
            w.commit(vec![
                WriteOp::put_cluster(&c).unwrap(),
                WriteOp::put_instance(&i1).unwrap(),
                WriteOp::put_instance(&i2).unwrap(),
                WriteOp::put_package(&td::package("zk", "1")).unwrap(),
                WriteOp::put_package(&td::package("zk", "2")).unwrap(),
            ])
            .await
            .unwrap();
            w.commit(vec![WriteOp::delete_instance(&c.id, &i1.id), WriteOp::delete_package("zk", "1")]).await.unwrap();
            let snap = store.load_all().unwrap();
            assert_eq!(snap.instances, vec![i2.clone()]);
            assert_eq!(snap.packages, vec![td::package("zk", "2")]);
            w.commit(vec![WriteOp::delete_cluster(&c.id), WriteOp::delete_instance(&c.id, &i2.id)]).await.unwrap();
        }
        let snap = MasterStore::open(dir.path()).unwrap().load_all().unwrap();
        assert!(snap.clusters.is_empty());
        assert!(snap.instances.is_empty());
        assert_eq!(snap.packages.len(), 1);
    }

    #[tokio::test]
    async fn events_after_pages_in_sequence_order() {
        let dir = tempfile::tempdir().unwrap();
        let store = MasterStore::open(dir.path()).unwrap();
        assert!(store.events_after(0, 10).unwrap().is_empty());
        assert_eq!(store.load_all().unwrap().last_event_seq, 0);
        // Written out of order, over several commits.
        let mut seqs: Vec<u64> = (1..=300).collect();
        seqs.reverse();
        for chunk in seqs.chunks(70) {
            let writes = chunk.iter().map(|s| WriteOp::put_event(&td::event(*s)).unwrap()).collect();
            store.writer().commit(writes).await.unwrap();
        }
        let seq_of = |v: Vec<EventRecord>| v.into_iter().map(|e| e.seq).collect::<Vec<_>>();
        assert_eq!(seq_of(store.events_after(0, 5).unwrap()), vec![1, 2, 3, 4, 5]);
        assert_eq!(seq_of(store.events_after(254, 3).unwrap()), vec![255, 256, 257]);
        assert_eq!(seq_of(store.events_after(297, 100).unwrap()), vec![298, 299, 300]);
        assert!(store.events_after(300, 10).unwrap().is_empty());
        assert!(store.events_after(u64::MAX, 10).unwrap().is_empty());
        assert!(store.events_after(0, 0).unwrap().is_empty());
        assert_eq!(store.events_after(10, 1).unwrap(), vec![td::event(11)]);
        assert_eq!(store.load_all().unwrap().last_event_seq, 300);
    }

    fn set_schema_version(dir: &Path, version: u32) {
        let db = DB::open_cf(&rocksdb::Options::default(), dir, master_cf::ALL).unwrap();
        let meta = db.cf_handle(master_cf::META).unwrap();
        db.put_cf(meta, SCHEMA_VERSION_KEY, crate::storage::codec::encode(&version).unwrap()).unwrap();
    }

    #[test]
    fn a_new_store_records_its_schema_version_and_a_newer_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        drop(MasterStore::open(dir.path()).unwrap());
        {
            let db =
                DB::open_cf_for_read_only(&rocksdb::Options::default(), dir.path(), master_cf::ALL, false).unwrap();
            let raw = db.get_cf(db.cf_handle(master_cf::META).unwrap(), SCHEMA_VERSION_KEY).unwrap().unwrap();
            assert_eq!(crate::storage::codec::decode::<u32>(&raw).unwrap(), SCHEMA_VERSION);
        }
        set_schema_version(dir.path(), SCHEMA_VERSION + 1);
        match MasterStore::open(dir.path()) {
            Err(StorageError::SchemaTooNew { found, supported }) => {
                assert_eq!((found, supported), (SCHEMA_VERSION + 1, SCHEMA_VERSION));
            }
            other => panic!("expected SchemaTooNew, got {other:?}"),
        }
        set_schema_version(dir.path(), SCHEMA_VERSION - 1);
        match MasterStore::open(dir.path()) {
            Err(e @ StorageError::SchemaTooOld { .. }) => assert!(e.to_string().contains("start afresh"), "{e}"),
            other => panic!("expected SchemaTooOld, got {other:?}"),
        }
        set_schema_version(dir.path(), SCHEMA_VERSION);
        MasterStore::open(dir.path()).unwrap();
    }

    #[tokio::test]
    async fn a_corrupt_record_is_a_codec_error_naming_where() {
        let dir = tempfile::tempdir().unwrap();
        let store = MasterStore::open(dir.path()).unwrap();
        let garbage = WriteOp::Put { cf: master_cf::NODES, key: b"node-x".to_vec(), value: vec![0xff; 3] };
        store.writer().commit(vec![garbage]).await.unwrap();
        match store.load_all() {
            Err(StorageError::Codec(msg)) => assert!(msg.starts_with("nodes/"), "{msg}"),
            other => panic!("expected a codec error, got {other:?}"),
        }
    }

    #[test]
    fn a_second_open_of_the_same_dir_fails_cleanly() {
        let dir = tempfile::tempdir().unwrap();
        let _store = MasterStore::open(dir.path()).unwrap();
        assert!(matches!(MasterStore::open(dir.path()), Err(StorageError::Open { .. })));
    }
}
