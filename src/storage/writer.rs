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
//! The queue is bounded (`queue` requests): [`StoreWriter::commit`] waits
//! for room, so internal writes slow down instead of growing memory, and
//! [`StoreWriter::try_commit`] refuses at once with
//! [`StorageError::Overloaded`], which the API answers `503 overloaded`
//! with a `Retry-After` (a new request is refused before anything of it is
//! acknowledged, never dropped after).
//!
//! The change feed ([`StoreWriter::subscribe`]): every durable batch is
//! announced, in order, with a sequence number, to whoever subscribed (a
//! replica, a cache, the event stream). Nothing is built while nobody
//! listens. A subscriber that falls behind the feed's buffer learns it
//! (`Lagged`) and must re-read the store.
//!
//! Lifetime: the thread ends when the last `StoreWriter` clone is dropped;
//! that drop waits for the thread (at most the batch in flight), so the
//! thread's handle on the database is released before the drop returns and
//! the same directory can be opened again at once.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread::JoinHandle;

use rocksdb::{DB, WriteBatch, WriteOptions};
use tokio::sync::{broadcast, mpsc, oneshot};

use super::StorageError;
use super::append_log::AppendLog;
use super::writer_stats::Stats;

/// One change to apply. Build them with the typed builders
/// (`WriteOp::put_cluster`, `AgentStore::put_instance`, ...), not by hand.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteOp {
    Put {
        cf: &'static str,
        key: Vec<u8>,
        value: Vec<u8>,
    },
    Delete {
        cf: &'static str,
        key: Vec<u8>,
    },
    /// Deletes every key in `from..to`.
    DeleteRange {
        cf: &'static str,
        from: Vec<u8>,
        to: Vec<u8>,
    },
    /// Adds `value` to the store's append log (`cf` must be the log's) under
    /// the next sequence number ([`AppendLog`]). The change feed announces
    /// it as the `Put` it became.
    Append {
        cf: &'static str,
        value: Vec<u8>,
    },
}

impl WriteOp {
    pub fn cf(&self) -> &'static str {
        match self {
            WriteOp::Put { cf, .. }
            | WriteOp::Delete { cf, .. }
            | WriteOp::DeleteRange { cf, .. }
            | WriteOp::Append { cf, .. } => cf,
        }
    }
}

/// The records a durable batch appended to the store's log: `(number,
/// value)` in order. Announced on their own feed, so a reader of the log
/// (the event stream) holds events, not whole batches.
#[derive(Debug, Clone)]
pub struct Appended {
    pub records: Vec<(u64, Vec<u8>)>,
}

/// The default bound of the writer's queue, in requests.
pub const DEFAULT_QUEUE: usize = 8192;

/// One durable batch, as the change feed announces it.
#[derive(Debug, Clone)]
pub struct Committed {
    /// 1, 2, 3, ... in the order the batches became durable.
    pub seq: u64,
    /// Every op of the batch, in the order it was applied.
    pub ops: Vec<WriteOp>,
}

struct Request {
    ops: Vec<WriteOp>,
    reply: oneshot::Sender<Result<(), StorageError>>,
}

struct Inner {
    /// `None` only while dropping: taking it closes the queue.
    tx: Option<mpsc::Sender<Request>>,
    feed: broadcast::Sender<Arc<Committed>>,
    appends: broadcast::Sender<Arc<Appended>>,
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
    /// Starts the writer thread for `db`, with a queue of `queue` requests.
    pub(crate) fn start(db: Arc<DB>, queue: usize) -> Result<StoreWriter, StorageError> {
        StoreWriter::start_with_log(db, queue, None)
    }

    /// Like [`start`](Self::start), with an append log (`WriteOp::Append`).
    pub(crate) fn start_with_log(
        db: Arc<DB>,
        queue: usize,
        log: Option<AppendLog>,
    ) -> Result<StoreWriter, StorageError> {
        let (tx, mut rx) = mpsc::channel(queue.max(1));
        let (feed, _) = broadcast::channel(1024);
        let (appends, _) = broadcast::channel(1024);
        let stats = Arc::new(Stats::default());
        let thread_stats = stats.clone();
        let thread_feed = feed.clone();
        let thread_appends = appends.clone();
        let handle = std::thread::Builder::new()
            .name("flotilla-storage-writer".into())
            .spawn(move || run(&db, &mut rx, &thread_stats, (&thread_feed, &thread_appends), log))
            .map_err(StorageError::WriterSpawn)?;
        Ok(StoreWriter {
            inner: Arc::new(Inner {
                tx: Some(tx),
                feed,
                appends,
                frozen: Default::default(),
                thread: Some(handle),
                stats,
            }),
        })
    }

    /// Applies `ops` atomically and returns once they are durable (synced).
    /// Waits for room when the queue is full.
    ///
    /// Once queued, dropping the returned future does not cancel the write:
    /// it will be applied.
    pub async fn commit(&self, ops: Vec<WriteOp>) -> Result<(), StorageError> {
        if ops.is_empty() {
            return Ok(());
        }
        self.check_frozen()?;
        let (reply, rx) = oneshot::channel();
        let tx = self.inner.tx.as_ref().ok_or(StorageError::WriterGone)?;
        // Marked before it is queued: the thread clears the mark when it
        // takes the queue, so a mark never outlives its request.
        self.inner.stats.queued();
        tx.send(Request { ops, reply }).await.map_err(|_| StorageError::WriterGone)?;
        rx.await.map_err(|_| StorageError::WriterGone)?
    }

    /// Like [`commit`](Self::commit), but refuses at once with
    /// [`StorageError::Overloaded`] when the queue is full: for a new
    /// request from a client, which is better told to retry than queued
    /// without bound.
    pub async fn try_commit(&self, ops: Vec<WriteOp>) -> Result<(), StorageError> {
        if ops.is_empty() {
            return Ok(());
        }
        let reply = self.try_enqueue(ops)?;
        reply.await.map_err(|_| StorageError::WriterGone)?
    }

    /// Subscribes to the change feed: every batch made durable from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Committed>> {
        self.inner.feed.subscribe()
    }

    /// Subscribes to what durable batches append to the log, from now on.
    pub fn subscribe_appends(&self) -> broadcast::Receiver<Arc<Appended>> {
        self.inner.appends.subscribe()
    }

    /// Whether the writer thread still takes requests (false once it has
    /// died: every commit fails from then on).
    pub fn alive(&self) -> bool {
        self.inner.tx.as_ref().is_some_and(|t| !t.is_closed())
    }

    /// How long the batch being written now has been in the disk's hands,
    /// or a queued request has waited for the thread to take it (`None`
    /// while the writer waits for work). The master ends itself
    /// when this passes `store_stall_limit`: every commit waits behind it.
    pub fn stuck_for(&self) -> Option<std::time::Duration> {
        self.inner.stats.stuck_for()
    }

    /// Requests queued and not yet taken by the writer thread.
    pub fn queued(&self) -> usize {
        self.inner.tx.as_ref().map(|t| t.max_capacity() - t.capacity()).unwrap_or(0)
    }

    /// [`commit`](Self::commit) for code that is not on an async runtime
    /// (boot-time code). Panics if called from inside a runtime, like every
    /// blocking tokio call.
    pub fn commit_blocking(&self, ops: Vec<WriteOp>) -> Result<(), StorageError> {
        if ops.is_empty() {
            return Ok(());
        }
        self.check_frozen()?;
        let (reply, rx) = oneshot::channel();
        let tx = self.inner.tx.as_ref().ok_or(StorageError::WriterGone)?;
        self.inner.stats.queued();
        tx.blocking_send(Request { ops, reply }).map_err(|_| StorageError::WriterGone)?;
        rx.blocking_recv().map_err(|_| StorageError::WriterGone)?
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

    fn check_frozen(&self) -> Result<(), StorageError> {
        if self.inner.frozen.load(Ordering::SeqCst) {
            return Err(StorageError::Frozen);
        }
        Ok(())
    }

    fn try_enqueue(&self, ops: Vec<WriteOp>) -> Result<oneshot::Receiver<Result<(), StorageError>>, StorageError> {
        self.check_frozen()?;
        let (reply, rx) = oneshot::channel();
        let tx = self.inner.tx.as_ref().ok_or(StorageError::WriterGone)?;
        self.inner.stats.queued();
        tx.try_send(Request { ops, reply }).map_err(|e| match e {
            mpsc::error::TrySendError::Full(_) => StorageError::Overloaded,
            mpsc::error::TrySendError::Closed(_) => StorageError::WriterGone,
        })?;
        Ok(rx)
    }

    /// How many synced batches were written successfully (for tests and metrics).
    pub fn batches_written(&self) -> u64 {
        self.inner.stats.batches.load(Ordering::Relaxed)
    }

    /// Reads [`batches_written`](Self::batches_written) without keeping
    /// the writer (or its database) alive.
    pub fn batch_counter(&self) -> impl Fn() -> u64 + Send + 'static {
        let stats = self.inner.stats.clone();
        move || stats.batches.load(Ordering::Relaxed)
    }

    /// How many `commit` calls were made durable (for tests and metrics).
    pub fn commits_written(&self) -> u64 {
        self.inner.stats.commits.load(Ordering::Relaxed)
    }
}

/// The most requests one batch takes, so a huge backlog is written (and
/// answered) in steps rather than as one giant batch.
const MAX_BATCH_REQUESTS: usize = 4096;

/// The writer thread's loop; returns when every sender is gone.
fn run(
    db: &DB,
    rx: &mut mpsc::Receiver<Request>,
    stats: &Stats,
    (feed, appends): (&broadcast::Sender<Arc<Committed>>, &broadcast::Sender<Arc<Appended>>),
    mut log: Option<AppendLog>,
) {
    let mut sync = WriteOptions::default();
    sync.set_sync(true);
    let mut seq = 0u64;
    while let Some(first) = rx.blocking_recv() {
        // Everything queued while the previous batch was being synced rides
        // in this one: that is the whole point of group commit.
        let mut pending = vec![first];
        while pending.len() < MAX_BATCH_REQUESTS {
            match rx.try_recv() {
                Ok(r) => pending.push(r),
                Err(_) => break,
            }
        }
        // Taken: what waits now is this batch (`busy_since`), and whatever
        // is queued from here on, which sets its own start (a request the
        // cap left queued starts its wait now).
        stats.taken(!rx.is_empty());
        let listening = feed.receiver_count() > 0;
        let mut announced = Vec::new();
        // Kept whether or not anyone listens now: a reader that subscribes
        // while this batch is written must still get it.
        let mut appended = Vec::new();
        let log_cf = log.as_ref().map(|l| l.cf);
        let mut batch = WriteBatch::default();
        let mut waiting = Vec::with_capacity(pending.len());
        let log_before = log.as_ref().map(|l| l.next);
        for req in pending {
            match add_request(db, &mut batch, req.ops, log.as_mut()) {
                Ok(applied) => {
                    for op in applied {
                        if let WriteOp::Put { cf, key, value } = &op
                            && Some(*cf) == log_cf
                            && let Some(seq) = super::keys::event_seq(key)
                        {
                            appended.push((seq, value.clone()));
                        }
                        if listening {
                            announced.push(op);
                        }
                    }
                    waiting.push(req.reply);
                }
                // A receiver that is gone means the caller stopped waiting;
                // nothing to tell it.
                Err(e) => drop(req.reply.send(Err(e))),
            }
        }
        if waiting.is_empty() {
            continue;
        }
        if let (Some(l), Some(before)) = (&log, log_before)
            && let Some((from, to)) = l.trim(before)
            && let Some(handle) = db.cf_handle(l.cf)
        {
            batch.delete_range_cf(handle, from, to);
        }
        let started = std::time::Instant::now();
        stats.writing(true);
        let written = db.write_opt(batch, &sync);
        stats.writing(false);
        // No-ops unless a process installed a recorder (the master does).
        metrics::histogram!("flotilla_store_commit_seconds").record(started.elapsed().as_secs_f64());
        metrics::histogram!("flotilla_store_batch_requests").record(waiting.len() as f64);
        match written {
            Ok(()) => {
                stats.batches.fetch_add(1, Ordering::Relaxed);
                stats.commits.fetch_add(waiting.len() as u64, Ordering::Relaxed);
                seq += 1;
                if listening {
                    let _ = feed.send(Arc::new(Committed { seq, ops: announced }));
                }
                if !appended.is_empty() && appends.receiver_count() > 0 {
                    let _ = appends.send(Arc::new(Appended { records: appended }));
                }
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
/// resolved (and every append checked against the log) before the first op
/// is added. Answers the ops as applied (appends as the puts they became).
fn add_request(
    db: &DB,
    batch: &mut WriteBatch,
    ops: Vec<WriteOp>,
    mut log: Option<&mut AppendLog>,
) -> Result<Vec<WriteOp>, StorageError> {
    let mut resolved = Vec::with_capacity(ops.len());
    for op in ops {
        let cf = op.cf();
        let handle = db.cf_handle(cf).ok_or(StorageError::UnknownColumnFamily { cf })?;
        if matches!(op, WriteOp::Append { .. }) && log.as_ref().is_none_or(|l| l.cf != cf) {
            return Err(StorageError::UnknownColumnFamily { cf });
        }
        resolved.push((handle, op));
    }
    let mut applied = Vec::with_capacity(resolved.len());
    for (handle, op) in resolved {
        let op = match op {
            WriteOp::Append { cf, value } => {
                let key = log.as_mut().map(|l| l.take()).unwrap_or_default();
                WriteOp::Put { cf, key, value }
            }
            other => other,
        };
        match &op {
            WriteOp::Put { key, value, .. } => batch.put_cf(handle, key, value),
            WriteOp::Delete { key, .. } => batch.delete_cf(handle, key),
            WriteOp::DeleteRange { from, to, .. } => batch.delete_range_cf(handle, from, to),
            WriteOp::Append { .. } => {}
        }
        applied.push(op);
    }
    Ok(applied)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::db;

    const CFS: [&str; 2] = ["data", "meta"];

    fn open(dir: &std::path::Path) -> (Arc<DB>, StoreWriter) {
        let db = db::open(dir, &CFS, "meta").unwrap();
        let writer = StoreWriter::start(db.clone(), DEFAULT_QUEUE).unwrap();
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
        let writer = StoreWriter::start(Arc::new(ro), DEFAULT_QUEUE).unwrap();
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

    #[tokio::test]
    async fn a_full_queue_refuses_try_commit_and_loses_nothing_acknowledged() {
        let dir = tempfile::tempdir().unwrap();
        let db = db::open(dir.path(), &CFS, "meta").unwrap();
        let writer = StoreWriter::start(db.clone(), 1).unwrap();
        // Many at once against a queue of one: some are refused, none of
        // the accepted ones is lost.
        let results = futures::future::join_all((0..200).map(|i| {
            let w = writer.clone();
            async move { (i, w.try_commit(vec![put(&format!("k{i}"))]).await) }
        }))
        .await;
        let refused = results.iter().filter(|(_, r)| matches!(r, Err(StorageError::Overloaded))).count();
        assert!(refused > 0, "a queue of one took 200 concurrent requests");
        for (i, r) in &results {
            match r {
                Ok(()) => assert!(get(&db, &format!("k{i}")).is_some(), "acknowledged k{i} is missing"),
                Err(StorageError::Overloaded) => {
                    assert!(get(&db, &format!("k{i}")).is_none(), "refused k{i} was written")
                }
                Err(e) => panic!("{e}"),
            }
        }
        // `commit` waits for room instead.
        let all = futures::future::join_all((0..50).map(|i| writer.commit(vec![put(&format!("w{i}"))]))).await;
        assert!(all.iter().all(|r| r.is_ok()));
    }

    #[tokio::test]
    async fn the_change_feed_announces_durable_batches_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let (_db, writer) = open(dir.path());
        writer.commit(vec![put("before")]).await.unwrap();
        let mut feed = writer.subscribe();
        writer.commit(vec![put("a")]).await.unwrap();
        writer.commit(vec![WriteOp::DeleteRange { cf: "data", from: b"a".to_vec(), to: b"b".to_vec() }]).await.unwrap();
        let first = feed.recv().await.unwrap();
        let second = feed.recv().await.unwrap();
        assert_eq!(first.ops, vec![put("a")]);
        assert!(second.seq > first.seq);
        assert!(matches!(second.ops[0], WriteOp::DeleteRange { .. }));
    }

    #[tokio::test]
    async fn delete_range_removes_exactly_the_range() {
        let dir = tempfile::tempdir().unwrap();
        let (db, writer) = open(dir.path());
        writer.commit(vec![put("a1"), put("a2"), put("b1")]).await.unwrap();
        writer.commit(vec![WriteOp::DeleteRange { cf: "data", from: b"a".to_vec(), to: b"b".to_vec() }]).await.unwrap();
        assert_eq!(get(&db, "a1"), None);
        assert_eq!(get(&db, "a2"), None);
        assert!(get(&db, "b1").is_some());
    }
}
