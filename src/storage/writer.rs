//! The group-commit writer shared by the master and agent stores.
//!
//! Every write in the process goes through one dedicated OS thread
//! (`flotilla-storage-writer`). Callers hand it a list of [`WriteOp`]s and
//! wait on a oneshot; the thread blocks for the first request, then drains
//! every request already queued, applies them all in ONE `WriteBatch` written
//! with `sync = true`, and answers every caller. So N concurrent commits cost
//! one fsync instead of N, and a caller is answered only once its data is
//! durable (DESIGN.md §11: an API call is acknowledged only after its write
//! is durable).
//!
//! Why a plain thread and not a tokio task: the synced write blocks for the
//! length of an fsync, which must not stall a runtime worker, and a thread
//! that owns the queue needs no lock around the batch.
//!
//! Each request is atomic: it is validated as a whole (all its column
//! families exist) before any of its ops enter the batch, and the batch is
//! applied atomically, so a request is either entirely durable or not at all.
//! If the batch write fails, every caller in it gets the error.
//!
//! Lifetime: the thread ends when the last `StoreWriter` clone is dropped;
//! that drop waits for the thread (at most the batch in flight), so the
//! thread's handle on the database is released before the drop returns and
//! the same directory can be opened again at once.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;

use rocksdb::{DB, WriteBatch, WriteOptions};
use tokio::sync::oneshot;

use super::StorageError;

/// One change to apply. Build them with the typed builders
/// (`WriteOp::put_cluster`, `AgentStore::put_instance`, ...), not by hand.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteOp {
    Put { cf: &'static str, key: Vec<u8>, value: Vec<u8> },
    Delete { cf: &'static str, key: Vec<u8> },
}

impl WriteOp {
    fn cf(&self) -> &'static str {
        match self {
            WriteOp::Put { cf, .. } | WriteOp::Delete { cf, .. } => cf,
        }
    }
}

struct Request {
    ops: Vec<WriteOp>,
    reply: oneshot::Sender<Result<(), StorageError>>,
}

#[derive(Default)]
struct Stats {
    batches: AtomicU64,
    commits: AtomicU64,
}

struct Inner {
    /// `None` only while dropping: taking it closes the queue.
    tx: Option<mpsc::Sender<Request>>,
    /// Set by [`StoreWriter::freeze`].
    frozen: std::sync::atomic::AtomicBool,
    thread: Option<JoinHandle<()>>,
    stats: Arc<Stats>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Closing the queue ends the thread's loop once the batch in flight
        // is answered; joining makes its `Arc<DB>` go away before we return.
        self.tx = None;
        if let Some(handle) = self.thread.take()
            && handle.join().is_err()
        {
            tracing::error!("the storage writer thread panicked");
        }
    }
}

/// A handle on the writer thread; cheap to clone, `Send + Sync`.
#[derive(Clone)]
pub struct StoreWriter {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for StoreWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreWriter")
            .field("batches_written", &self.batches_written())
            .field("commits_written", &self.commits_written())
            .finish()
    }
}

impl StoreWriter {
    /// Starts the writer thread for `db`.
    pub(crate) fn start(db: Arc<DB>) -> Result<StoreWriter, StorageError> {
        let (tx, rx) = mpsc::channel();
        let stats = Arc::new(Stats::default());
        let thread_stats = stats.clone();
        let handle = std::thread::Builder::new()
            .name("flotilla-storage-writer".into())
            .spawn(move || run(&db, &rx, &thread_stats))
            .map_err(StorageError::WriterSpawn)?;
        Ok(StoreWriter {
            inner: Arc::new(Inner { tx: Some(tx), frozen: Default::default(), thread: Some(handle), stats }),
        })
    }

    /// Applies `ops` atomically and returns once they are durable (synced).
    ///
    /// Dropping the returned future after it started does not cancel the
    /// write: the request is already queued and will be applied.
    pub async fn commit(&self, ops: Vec<WriteOp>) -> Result<(), StorageError> {
        if ops.is_empty() {
            return Ok(());
        }
        let reply = self.enqueue(ops)?;
        reply.await.map_err(|_| StorageError::WriterGone)?
    }

    /// [`commit`](Self::commit) for code that is not on an async runtime
    /// (boot-time code). Panics if called from inside a runtime, like every
    /// blocking tokio call.
    pub fn commit_blocking(&self, ops: Vec<WriteOp>) -> Result<(), StorageError> {
        if ops.is_empty() {
            return Ok(());
        }
        let reply = self.enqueue(ops)?;
        reply.blocking_recv().map_err(|_| StorageError::WriterGone)?
    }

    /// Refuses every later write (`StorageError::Frozen`); writes already
    /// queued still land. A master freezes its store when it starts shutting
    /// down, before connections close: an operation whose agents then seem
    /// to vanish cannot journal a failure (or send the undo commands, whose
    /// intent it cannot persist), so the next master resumes it from the
    /// last state that was true.
    pub fn freeze(&self) {
        self.inner.frozen.store(true, Ordering::SeqCst);
    }

    fn enqueue(&self, ops: Vec<WriteOp>) -> Result<oneshot::Receiver<Result<(), StorageError>>, StorageError> {
        if self.inner.frozen.load(Ordering::SeqCst) {
            return Err(StorageError::Frozen);
        }
        let (reply, rx) = oneshot::channel();
        let tx = self.inner.tx.as_ref().ok_or(StorageError::WriterGone)?;
        tx.send(Request { ops, reply }).map_err(|_| StorageError::WriterGone)?;
        Ok(rx)
    }

    /// How many synced batches were written successfully (for tests and metrics).
    pub fn batches_written(&self) -> u64 {
        self.inner.stats.batches.load(Ordering::Relaxed)
    }

    /// How many `commit` calls were made durable (for tests and metrics).
    pub fn commits_written(&self) -> u64 {
        self.inner.stats.commits.load(Ordering::Relaxed)
    }
}

/// The writer thread's loop; returns when every sender is gone.
fn run(db: &DB, rx: &mpsc::Receiver<Request>, stats: &Stats) {
    let mut sync = WriteOptions::default();
    sync.set_sync(true);
    while let Ok(first) = rx.recv() {
        // Everything queued while the previous batch was being synced rides
        // in this one: that is the whole point of group commit.
        let mut pending = vec![first];
        pending.extend(rx.try_iter());

        let mut batch = WriteBatch::default();
        let mut waiting = Vec::with_capacity(pending.len());
        for req in pending {
            match add_request(db, &mut batch, req.ops) {
                Ok(()) => waiting.push(req.reply),
                // A receiver that is gone means the caller stopped waiting;
                // nothing to tell it.
                Err(e) => drop(req.reply.send(Err(e))),
            }
        }
        if waiting.is_empty() {
            continue;
        }
        match db.write_opt(batch, &sync) {
            Ok(()) => {
                stats.batches.fetch_add(1, Ordering::Relaxed);
                stats.commits.fetch_add(waiting.len() as u64, Ordering::Relaxed);
                for reply in waiting {
                    let _ = reply.send(Ok(()));
                }
            }
            Err(e) => {
                tracing::error!(error = %e, commits = waiting.len(), "storage batch write failed");
                for reply in waiting {
                    let _ = reply.send(Err(StorageError::Rocks(e.clone())));
                }
            }
        }
    }
}

/// Adds one request to the batch, all or nothing: every column family is
/// resolved before the first op is added.
fn add_request(db: &DB, batch: &mut WriteBatch, ops: Vec<WriteOp>) -> Result<(), StorageError> {
    let mut resolved = Vec::with_capacity(ops.len());
    for op in ops {
        let cf = op.cf();
        let handle = db.cf_handle(cf).ok_or(StorageError::UnknownColumnFamily { cf })?;
        resolved.push((handle, op));
    }
    for (handle, op) in resolved {
        match op {
            WriteOp::Put { key, value, .. } => batch.put_cf(handle, key, value),
            WriteOp::Delete { key, .. } => batch.delete_cf(handle, key),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::db;

    const CFS: [&str; 2] = ["data", "meta"];

    fn open(dir: &std::path::Path) -> (Arc<DB>, StoreWriter) {
        let db = db::open(dir, &CFS, "meta").unwrap();
        let writer = StoreWriter::start(db.clone()).unwrap();
        (db, writer)
    }

    fn put(key: &str) -> WriteOp {
        WriteOp::Put { cf: "data", key: key.as_bytes().to_vec(), value: key.as_bytes().to_vec() }
    }

    fn get(db: &DB, key: &str) -> Option<Vec<u8>> {
        db.get_cf(db.cf_handle("data").unwrap(), key).unwrap()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_commits_are_grouped_into_fewer_batches() {
        let dir = tempfile::tempdir().unwrap();
        let (db, writer) = open(dir.path());
        let n = 200;
        let tasks: Vec<_> = (0..n)
            .map(|i| {
                let w = writer.clone();
                tokio::spawn(async move { w.commit(vec![put(&format!("k{i}")), put(&format!("j{i}"))]).await })
            })
            .collect();
        for t in tasks {
            t.await.unwrap().unwrap();
        }
        for i in 0..n {
            assert_eq!(get(&db, &format!("k{i}")).as_deref(), Some(format!("k{i}").as_bytes()));
            assert!(get(&db, &format!("j{i}")).is_some());
        }
        assert_eq!(writer.commits_written(), n);
        let batches = writer.batches_written();
        assert!(batches >= 1 && batches < n, "{batches} batches for {n} commits");
    }

    #[tokio::test]
    async fn deletes_apply_and_empty_commits_succeed() {
        let dir = tempfile::tempdir().unwrap();
        let (db, writer) = open(dir.path());
        writer.commit(vec![put("a"), put("b")]).await.unwrap();
        writer.commit(vec![WriteOp::Delete { cf: "data", key: b"a".to_vec() }]).await.unwrap();
        writer.commit(Vec::new()).await.unwrap();
        assert_eq!(get(&db, "a"), None);
        assert!(get(&db, "b").is_some());
        assert_eq!(writer.commits_written(), 2);
    }

    #[tokio::test]
    async fn a_failed_batch_reports_the_error_to_every_caller() {
        let dir = tempfile::tempdir().unwrap();
        drop(open(dir.path()));
        // A read-only database refuses every write: a real RocksDB failure.
        let ro = DB::open_cf_for_read_only(&rocksdb::Options::default(), dir.path(), CFS, false).unwrap();
        let writer = StoreWriter::start(Arc::new(ro)).unwrap();
        let results = futures::future::join_all((0..20).map(|i| writer.commit(vec![put(&format!("k{i}"))]))).await;
        for r in results {
            assert!(matches!(r, Err(StorageError::Rocks(_))), "{r:?}");
        }
        assert_eq!(writer.batches_written(), 0);
        assert_eq!(writer.commits_written(), 0);
    }

    #[tokio::test]
    async fn a_request_with_an_unknown_column_family_fails_alone_and_whole() {
        let dir = tempfile::tempdir().unwrap();
        let (db, writer) = open(dir.path());
        let bad = vec![put("half"), WriteOp::Put { cf: "nope", key: b"k".to_vec(), value: b"v".to_vec() }];
        let (bad, good) = tokio::join!(writer.commit(bad), writer.commit(vec![put("good")]));
        assert!(matches!(bad, Err(StorageError::UnknownColumnFamily { cf: "nope" })), "{bad:?}");
        good.unwrap();
        assert_eq!(get(&db, "half"), None, "a failed request must not be partly applied");
        assert!(get(&db, "good").is_some());
    }

    #[test]
    fn commit_blocking_works_off_the_runtime_and_drop_releases_the_db() {
        let dir = tempfile::tempdir().unwrap();
        let (db, writer) = open(dir.path());
        writer.commit_blocking(vec![put("x")]).unwrap();
        drop(db);
        drop(writer);
        // The writer thread held the last handle; the lock must be free now.
        let (db, _writer) = open(dir.path());
        assert!(get(&db, "x").is_some());
    }
}
