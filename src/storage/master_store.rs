//! The master's RocksDB store: the single-node engine behind
//! [`MetaStore`] (opening it, migrating an older schema, reads by key and
//! range, the group-commit writer and its change feed), and loading what
//! the master needs at boot.
//!
//! At boot the master loads the live records (clusters, instances, nodes,
//! packages, leftovers) and the operations that had not ended, with their
//! plans. Ended operations stay on disk only: they are read on demand
//! (`GET /operations`), so memory does not grow with history.

use std::path::Path;
use std::sync::Arc;

use futures::FutureExt;
use futures::future::BoxFuture;
use rocksdb::{DB, Direction, IteratorMode};

use super::append_log::AppendLog;
use super::db;
use super::keys::{self, master_cf};
use super::meta::{self, MetaStore, Scan};
use super::records::EventRecord;
use super::writer::{Committed, DEFAULT_QUEUE};
use super::{StorageError, StoreWriter, WriteOp};

/// The master's schema. 3: operations stored as a header, per-step results
/// and a plan kept only while they run, with time indexes; nodes say
/// whether they are simulated. 4: API tokens have a scope. 5: a cluster's
/// roles carry the node labels its create gave them. 6: a join token may
/// be bound to one node id. A version 2 to 5 store is migrated at open,
/// one version at a time (each step in one synced batch with its version:
/// a crash between two leaves a store the next start goes on migrating).
pub const MASTER_SCHEMA_VERSION: u32 = 6;

/// Events kept by default (the `events_retained` setting).
pub const DEFAULT_EVENTS_RETAINED: u64 = 100_000;

pub use super::meta::MasterSnapshot;

/// The master's database and its writer; cheap to clone.
#[derive(Clone)]
pub struct MasterStore {
    /// First, so it stops (and lets go of the database) first; shared by
    /// the clones, stopped with the last.
    _flush: Arc<super::idle_flush::IdleFlush>,
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
        MasterStore::open_with(dir, DEFAULT_QUEUE)
    }

    /// Like [`open`](Self::open) with a writer queue of `queue` requests.
    pub fn open_with(dir: &Path, queue: usize) -> Result<MasterStore, StorageError> {
        MasterStore::open_opts(dir, queue, DEFAULT_EVENTS_RETAINED)
    }

    /// Like [`open_with`](Self::open_with), keeping the last
    /// `events_retained` events.
    pub fn open_opts(dir: &Path, queue: usize, events_retained: u64) -> Result<MasterStore, StorageError> {
        let db = db::open_migrating(dir, &master_cf::ALL, master_cf::META, MASTER_SCHEMA_VERSION, |db, found| {
            use super::migrate::{master_2_to_3, master_3_to_4, master_4_to_5, master_5_to_6};
            type Step = fn(&DB) -> Result<(), StorageError>;
            // Every step from `found` on, in order.
            let steps: [(u32, Step); 4] =
                [(2, master_2_to_3), (3, master_3_to_4), (4, master_4_to_5), (5, master_5_to_6)];
            if !steps.iter().any(|(from, _)| *from == found) {
                return Err(StorageError::SchemaTooOld { found, supported: MASTER_SCHEMA_VERSION });
            }
            steps.iter().filter(|(from, _)| *from >= found).try_for_each(|(_, step)| step(db))
        })?;
        let last = match db
            .iterator_cf(
                db.cf_handle(master_cf::EVENTS).ok_or(StorageError::UnknownColumnFamily { cf: master_cf::EVENTS })?,
                IteratorMode::End,
            )
            .next()
        {
            None => 0,
            Some(item) => {
                let (k, _) = item.map_err(StorageError::Rocks)?;
                keys::event_seq(&k).ok_or_else(|| {
                    StorageError::Codec(format!("events: key {} is not a sequence number", hex::encode(&k)))
                })?
            }
        };
        let log = AppendLog::new(master_cf::EVENTS, last, events_retained);
        let writer = StoreWriter::start_with_log(db.clone(), queue, Some(log))?;
        let flush = super::idle_flush::start(&db, &master_cf::ALL, writer.batch_counter())
            .map_err(StorageError::WriterSpawn)?;
        Ok(MasterStore { _flush: Arc::new(flush), db, writer })
    }

    /// The writer every master write goes through.
    pub fn writer(&self) -> &StoreWriter {
        &self.writer
    }

    /// Reads what the master starts from (blocking; meant for boot, via
    /// `spawn_blocking`). See [`meta::load_boot`].
    pub fn load_all(&self) -> Result<MasterSnapshot, StorageError> {
        meta::load_boot(self)
    }

    fn cf(&self, cf: &'static str) -> Result<&rocksdb::ColumnFamily, StorageError> {
        self.db.cf_handle(cf).ok_or(StorageError::UnknownColumnFamily { cf })
    }

    /// Up to `limit` events with a sequence number above `seq`, in order (blocking).
    pub fn events_after(&self, seq: u64, limit: usize) -> Result<Vec<EventRecord>, StorageError> {
        meta::events_after(self, seq, limit)
    }
}

impl MetaStore for MasterStore {
    fn commit(&self, ops: Vec<WriteOp>) -> BoxFuture<'static, Result<(), StorageError>> {
        let w = self.writer.clone();
        async move { w.commit(ops).await }.boxed()
    }

    fn try_commit(&self, ops: Vec<WriteOp>) -> BoxFuture<'static, Result<(), StorageError>> {
        let w = self.writer.clone();
        async move { w.try_commit(ops).await }.boxed()
    }

    fn get(&self, cf: &'static str, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError> {
        self.db.get_cf(self.cf(cf)?, key).map_err(StorageError::Rocks)
    }

    fn scan(&self, cf: &'static str, scan: &Scan, limit: usize) -> Result<meta::Pairs, StorageError> {
        let handle = self.cf(cf)?;
        // Backwards from the end of the prefix: the first key past it is
        // the prefix with its last byte incremented (carrying); with no
        // such key (all 0xff, or no prefix) the very end.
        let end = successor(&scan.prefix);
        let mode = match (&scan.from, scan.reverse) {
            (Some(from), false) => IteratorMode::From(from, Direction::Forward),
            (Some(from), true) => IteratorMode::From(from, Direction::Reverse),
            (None, false) => IteratorMode::From(&scan.prefix, Direction::Forward),
            (None, true) => match &end {
                Some(e) => IteratorMode::From(e, Direction::Reverse),
                None => IteratorMode::End,
            },
        };
        let mut out = Vec::new();
        for item in self.db.iterator_cf(handle, mode) {
            if out.len() >= limit {
                break;
            }
            let (k, v) = item.map_err(StorageError::Rocks)?;
            if !k.starts_with(&scan.prefix) {
                // Seeking backwards from the successor may land on it.
                if scan.reverse && end.as_deref() == Some(&k[..]) {
                    continue;
                }
                break;
            }
            out.push((k.into_vec(), v.into_vec()));
        }
        Ok(out)
    }

    fn writer_alive(&self) -> bool {
        self.writer.alive()
    }

    fn writer_stuck_for(&self) -> Option<std::time::Duration> {
        self.writer.stuck_for()
    }

    fn subscribe(&self) -> tokio::sync::broadcast::Receiver<Arc<Committed>> {
        self.writer.subscribe()
    }

    fn subscribe_appends(&self) -> tokio::sync::broadcast::Receiver<Arc<super::writer::Appended>> {
        self.writer.subscribe_appends()
    }

    fn freeze(&self) {
        self.writer.freeze()
    }

    fn quiesce(&self) {
        self.db.cancel_all_background_work(true);
    }

    fn stats(&self) -> meta::StoreStats {
        meta::StoreStats {
            batches: self.writer.batches_written(),
            commits: self.writer.commits_written(),
            queued: self.writer.queued(),
            sent_again: None,
        }
    }
}

/// The smallest key greater than every key starting with `prefix`.
fn successor(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut v = prefix.to_vec();
    while let Some(last) = v.pop() {
        if last < 0xff {
            v.push(last + 1);
            return Some(v);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::WriteOp;
    use crate::storage::keys::SCHEMA_VERSION_KEY;
    use crate::storage::records::OperationRecord;
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
            for op in &ops {
                writes.extend(WriteOp::new_operation(op).unwrap());
                for (i, step) in op.steps.iter().enumerate() {
                    writes.push(WriteOp::put_step_results(&op.id, i, &step.results).unwrap());
                }
            }
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
    async fn operations_are_paged_newest_first_per_cluster_and_deleted_whole() {
        let dir = tempfile::tempdir().unwrap();
        let store = MasterStore::open(dir.path()).unwrap();
        let (c1, c2) = (td::cluster("web"), td::cluster("db"));
        let at = |m: i64| td::T0 + time::Duration::minutes(m);
        // Created out of id order: the time index decides.
        let ones: Vec<_> = (0..5).rev().map(|i| td::operation(&c1, at(i * 2))).collect();
        let twos: Vec<_> = (0..2).map(|i| td::operation(&c2, at(i * 2 + 1))).collect();
        let mut writes = Vec::new();
        for op in ones.iter().chain(&twos) {
            writes.extend(WriteOp::new_operation(op).unwrap());
            writes.push(WriteOp::put_step_results(&op.id, 0, &op.steps[0].results).unwrap());
        }
        store.writer().commit(writes).await.unwrap();
        let ids = |v: Vec<OperationRecord>| v.into_iter().map(|o| o.id).collect::<Vec<_>>();
        // ones[0] is the newest (8 min), ones[4] the oldest (0 min).
        let all = ids(meta::operations_page(&store, None, None, 3).unwrap());
        assert_eq!(all, vec![ones[0].id, ones[1].id, ones[2].id]);
        let rest = ids(meta::operations_page(&store, None, Some(&ones[2].id), 10).unwrap());
        assert_eq!(rest, vec![twos[1].id, ones[3].id, twos[0].id, ones[4].id]);
        let p1 = ids(meta::operations_page(&store, Some(&c1.id), None, 2).unwrap());
        assert_eq!(p1, vec![ones[0].id, ones[1].id]);
        let p2 = ids(meta::operations_page(&store, Some(&c1.id), Some(&ones[1].id), 2).unwrap());
        assert_eq!(p2, vec![ones[2].id, ones[3].id]);
        let p3 = ids(meta::operations_page(&store, Some(&c1.id), Some(&ones[3].id), 2).unwrap());
        assert_eq!(p3, vec![ones[4].id]);
        assert!(meta::operations_page(&store, Some(&c2.id), Some(&twos[0].id), 5).unwrap().is_empty());
        // A page has no step results; one operation read by id has them.
        let page = meta::operations_page(&store, None, None, 1).unwrap();
        assert!(page[0].steps[0].results.is_empty());
        assert_eq!(meta::operation(&store, &ones[0].id).unwrap().unwrap().steps[0].results, ones[0].steps[0].results);

        let oldest = &ones[4];
        let of_c1 = |store: &MasterStore| -> Vec<(u64, crate::ids::OperationId)> {
            let all = meta::all_cluster_operations(store).unwrap();
            all.into_iter().filter(|(c, _, _)| *c == c1.id).map(|(_, t, id)| (t, id)).collect()
        };
        let listed = of_c1(&store);
        assert_eq!(listed.first().map(|(_, id)| *id), Some(oldest.id), "oldest first");
        store
            .writer()
            .commit(WriteOp::delete_operation(&oldest.id, &c1.id, crate::storage::keys::nanos(oldest.created_at)))
            .await
            .unwrap();
        assert!(meta::operation(&store, &oldest.id).unwrap().is_none());
        assert!(meta::plan(&store, &oldest.id).unwrap().is_none());
        assert_eq!(of_c1(&store).len(), 4);
        // The whole index: each entry names its cluster, time and operation.
        let every = meta::all_cluster_operations(&store).unwrap();
        assert_eq!(every.len(), 6, "four of c1, two of c2");
        for (cluster, created, id) in &every {
            let op = ones.iter().chain(&twos).find(|o| o.id == *id).expect("a stored operation");
            let want = if ones.iter().any(|o| o.id == *id) { c1.id } else { c2.id };
            assert_eq!((*cluster, *created), (want, crate::storage::keys::nanos(op.created_at)));
        }
        assert!(meta::operations_page(&store, Some(&c1.id), Some(&ones[3].id), 2).unwrap().is_empty());
        for cluster in [None, Some(&c1.id)] {
            let gone = meta::operations_page(&store, cluster, Some(&oldest.id), 2);
            assert!(matches!(&gone, Err(StorageError::CursorGone(id)) if *id == oldest.id.to_string()), "{gone:?}");
        }
        let raw = store.scan(master_cf::OP_RESULTS, &Scan::default(), 100).unwrap();
        assert_eq!(raw.len(), 6, "the deleted operation's results are gone, the others' kept");
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

    #[tokio::test]
    async fn appended_events_are_numbered_in_commit_order_across_reopens_and_trimmed() {
        let dir = tempfile::tempdir().unwrap();
        let append = |n: u64| WriteOp::append_event(&td::event(n)).unwrap();
        {
            let store = MasterStore::open_opts(dir.path(), 64, 2000).unwrap();
            // Concurrent requests of two appends each: every number once.
            let commits = (0..50).map(|_| store.writer().commit(vec![append(0), append(0)]));
            futures::future::join_all(commits).await.into_iter().for_each(|r| r.unwrap());
            let seqs: Vec<u64> = store.events_after(0, 1000).unwrap().iter().map(|e| e.seq).collect();
            assert_eq!(seqs, (1..=100).collect::<Vec<_>>());
        }
        let store = MasterStore::open_opts(dir.path(), 64, 2000).unwrap();
        let mut feed = store.subscribe_appends();
        store.writer().commit(vec![WriteOp::put_cluster(&td::cluster("web")).unwrap(), append(0)]).await.unwrap();
        assert_eq!(store.events_after(100, 10).unwrap()[0].seq, 101, "numbers go on after a reopen");
        let announced = feed.recv().await.unwrap();
        let seqs: Vec<u64> = announced.records.iter().map(|(n, _)| *n).collect();
        assert_eq!(seqs, vec![101], "the appends feed carries the appended event, not the cluster record");
        // Past 2,000 kept and a multiple of 1,024: the head is trimmed.
        for _ in 0..30 {
            store.writer().commit((0..100).map(|_| append(0)).collect()).await.unwrap();
        }
        let kept = store.events_after(0, 10_000).unwrap();
        let (first, last) = (kept[0].seq, kept.last().unwrap().seq);
        assert_eq!(last, 3101);
        // The batch that crossed 3,072 kept the last 2,000 numbers then.
        assert_eq!(first, 3102 - 2000, "trimmed to the last 2,000 when 3,072 was crossed");
        assert!(kept.windows(2).all(|w| w[1].seq == w[0].seq + 1));
    }

    #[tokio::test]
    async fn an_append_needs_the_stores_log() {
        let dir = tempfile::tempdir().unwrap();
        let store = MasterStore::open(dir.path()).unwrap();
        let wrong = WriteOp::Append { cf: master_cf::CLUSTERS, value: vec![1] };
        let err = store.writer().commit(vec![WriteOp::put_event(&td::event(7)).unwrap(), wrong]).await.unwrap_err();
        assert!(matches!(err, StorageError::UnknownColumnFamily { cf: "clusters" }), "{err}");
        assert!(store.events_after(0, 10).unwrap().is_empty(), "the request failed whole");
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
            assert_eq!(crate::storage::codec::decode::<u32>(&raw).unwrap(), MASTER_SCHEMA_VERSION);
        }
        set_schema_version(dir.path(), MASTER_SCHEMA_VERSION + 1);
        match MasterStore::open(dir.path()) {
            Err(StorageError::SchemaTooNew { found, supported }) => {
                assert_eq!((found, supported), (MASTER_SCHEMA_VERSION + 1, MASTER_SCHEMA_VERSION));
            }
            other => panic!("expected SchemaTooNew, got {other:?}"),
        }
        // 1 was never released: refused, not migrated.
        set_schema_version(dir.path(), 1);
        match MasterStore::open(dir.path()) {
            Err(e @ StorageError::SchemaTooOld { .. }) => assert!(e.to_string().contains("start afresh"), "{e}"),
            other => panic!("expected SchemaTooOld, got {other:?}"),
        }
        set_schema_version(dir.path(), MASTER_SCHEMA_VERSION);
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
