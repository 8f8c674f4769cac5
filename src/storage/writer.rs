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
        StoreWriter::start_on(Box::new(RocksSink::new(db)), queue, log)
    }

    /// Starts the writer thread writing into `sink` (RocksDB, or etcd in
    /// [`super::etcd`]), with a queue of `queue` requests and an optional
    /// append log.
    pub(crate) fn start_on(
        sink: Box<dyn BatchSink>,
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
            .spawn(move || run(sink, &mut rx, &thread_stats, (&thread_feed, &thread_appends), log))
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

/// Where the writer thread makes a batch durable: RocksDB ([`RocksSink`]),
/// or etcd transactions (`super::etcd`).
pub(crate) trait BatchSink: Send + 'static {
    /// Whether `cf` is one of the store's column families.
    fn has_cf(&self, cf: &'static str) -> bool;
    /// Makes `ops` durable. They are the ops of several requests, request
    /// `i` ending before `ends[i]`; each request must land whole or not at
    /// all. `Err` says how many requests (from the first) are durable
    /// anyway.
    fn write(&mut self, ops: &[WriteOp], ends: &[usize]) -> Result<(), SinkError>;
}

/// A batch that did not land whole: its first `durable` requests did.
#[derive(Debug)]
pub(crate) struct SinkError {
    pub durable: usize,
    pub error: StorageError,
}

/// The single-node sink: one synced RocksDB `WriteBatch` per batch.
pub(crate) struct RocksSink {
    db: Arc<DB>,
    sync: WriteOptions,
}

impl RocksSink {
    pub(crate) fn new(db: Arc<DB>) -> RocksSink {
        let mut sync = WriteOptions::default();
        sync.set_sync(true);
        RocksSink { db, sync }
    }
}

impl BatchSink for RocksSink {
    fn has_cf(&self, cf: &'static str) -> bool {
        self.db.cf_handle(cf).is_some()
    }

    fn write(&mut self, ops: &[WriteOp], _ends: &[usize]) -> Result<(), SinkError> {
        let mut batch = WriteBatch::default();
        for op in ops {
            let cf = op.cf();
            let Some(handle) = self.db.cf_handle(cf) else {
                return Err(SinkError { durable: 0, error: StorageError::UnknownColumnFamily { cf } });
            };
            match op {
                WriteOp::Put { key, value, .. } => batch.put_cf(handle, key, value),
                WriteOp::Delete { key, .. } => batch.delete_cf(handle, key),
                WriteOp::DeleteRange { from, to, .. } => batch.delete_range_cf(handle, from, to),
                // Resolved into puts before a batch is written.
                WriteOp::Append { .. } => {}
            }
        }
        // One batch: all of it lands, or none.
        self.db.write_opt(batch, &self.sync).map_err(|e| SinkError { durable: 0, error: StorageError::Rocks(e) })
    }
}

/// The writer thread's loop; returns when every sender is gone.
fn run(
    mut sink: Box<dyn BatchSink>,
    rx: &mut mpsc::Receiver<Request>,
    stats: &Stats,
    (feed, appends): (&broadcast::Sender<Arc<Committed>>, &broadcast::Sender<Arc<Appended>>),
    mut log: Option<AppendLog>,
) {
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
        let mut ops = Vec::new();
        let mut ends = Vec::with_capacity(pending.len() + 1);
        let mut waiting = Vec::with_capacity(pending.len());
        let log_before = log.as_ref().map(|l| l.next);
        for req in pending {
            match resolve(sink.as_ref(), req.ops, log.as_mut()) {
                Ok(resolved) => {
                    ops.extend(resolved);
                    ends.push(ops.len());
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
        // The log's trim rides last, as a request of its own that nobody
        // waits for.
        if let (Some(l), Some(before)) = (&log, log_before)
            && let Some((from, to)) = l.trim(before)
        {
            ops.push(WriteOp::DeleteRange { cf: l.cf, from, to });
            ends.push(ops.len());
        }
        let started = std::time::Instant::now();
        stats.writing(true);
        let written = sink.write(&ops, &ends);
        stats.writing(false);
        // No-ops unless a process installed a recorder (the master does).
        metrics::histogram!("flotilla_store_commit_seconds").record(started.elapsed().as_secs_f64());
        metrics::histogram!("flotilla_store_batch_requests").record(waiting.len() as f64);
        let (durable, error) = match written {
            Ok(()) => (ends.len(), None),
            Err(SinkError { durable, error }) => {
                tracing::error!(error = %crate::error::ErrorChain(&error), commits = waiting.len(), durable, "storage batch write failed");
                (durable.min(ends.len()), Some(error))
            }
        };
        if durable > 0 {
            ops.truncate(ends[durable - 1]);
            stats.batches.fetch_add(1, Ordering::Relaxed);
            stats.commits.fetch_add(durable.min(waiting.len()) as u64, Ordering::Relaxed);
            seq += 1;
            announce(ops, log.as_ref().map(|l| l.cf), seq, (feed, appends));
        }
        for (i, reply) in waiting.into_iter().enumerate() {
            let _ = reply.send(match &error {
                Some(e) if i >= durable => Err(e.duplicate()),
                _ => Ok(()),
            });
        }
    }
}

/// Tells the feeds about a durable batch: its ops, and the log records it
/// appended. Built only for whoever listens.
fn announce(
    ops: Vec<WriteOp>,
    log_cf: Option<&'static str>,
    seq: u64,
    (feed, appends): (&broadcast::Sender<Arc<Committed>>, &broadcast::Sender<Arc<Appended>>),
) {
    if appends.receiver_count() > 0 && log_cf.is_some() {
        let records: Vec<(u64, Vec<u8>)> = ops
            .iter()
            .filter_map(|op| match op {
                WriteOp::Put { cf, key, value } if Some(*cf) == log_cf => {
                    super::keys::event_seq(key).map(|seq| (seq, value.clone()))
                }
                _ => None,
            })
            .collect();
        if !records.is_empty() {
            let _ = appends.send(Arc::new(Appended { records }));
        }
    }
    if feed.receiver_count() > 0 {
        let _ = feed.send(Arc::new(Committed { seq, ops }));
    }
}

/// Checks one request whole (every column family known, every append
/// against the log) before any of it enters the batch, and turns its
/// appends into the puts they become.
fn resolve(
    sink: &dyn BatchSink,
    ops: Vec<WriteOp>,
    mut log: Option<&mut AppendLog>,
) -> Result<Vec<WriteOp>, StorageError> {
    for op in &ops {
        let cf = op.cf();
        if !sink.has_cf(cf) || (matches!(op, WriteOp::Append { .. }) && log.as_ref().is_none_or(|l| l.cf != cf)) {
            return Err(StorageError::UnknownColumnFamily { cf });
        }
    }
    Ok(ops
        .into_iter()
        .map(|op| match op {
            WriteOp::Append { cf, value } => {
                let key = log.as_mut().map(|l| l.take()).unwrap_or_default();
                WriteOp::Put { cf, key, value }
            }
            other => other,
        })
        .collect())
}

#[cfg(test)]
#[path = "writer_tests.rs"]
mod tests;
