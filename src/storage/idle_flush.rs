//! Gives the memtables' memory back once writes stop.
//!
//! RocksDB keeps recent writes in memtables (up to `db::WRITE_BUFFER_TOTAL`
//! in all) until they fill, however long the store then stays idle: after
//! a burst (a scale-out of thousands) a master at rest held ~30 MiB of
//! memtables, about a sixth of what 100,000 instances cost it (B8 in
//! BENCHMARKS.md). A thread watches the writer's batch count; once it has
//! not moved for [`IDLE`] after moving, it asks RocksDB to flush each
//! column family whose memtables hold at least [`WORTH_FLUSHING`] (in
//! RocksDB's background, not waiting), which frees them and also shortens
//! the WAL replayed after a crash. A master writing a little now and then
//! is left alone: a flush each time would only make tiny files to compact.
//! Nothing acknowledged depends on it: every write is already synced to
//! the WAL.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rocksdb::{DB, FlushOptions};

/// How long the writer must be idle before the memtables are flushed.
pub const IDLE: Duration = Duration::from_secs(3);

/// A column family whose memtables use less than this is left alone. A
/// memtable's first arena block (1 MiB here) counts from its first write,
/// touched or not, so this is one block and a half.
pub const WORTH_FLUSHING: u64 = 3 << 19;

/// How often the thread looks.
const TICK: Duration = Duration::from_millis(500);

/// The watcher thread; dropping this stops it and waits for it, so a
/// flush it started has handed the database back before the store's drop
/// returns (the directory can be opened again at once, as after the
/// writer's own drop).
pub struct IdleFlush {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for IdleFlush {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            thread.thread().unpark();
            if thread.join().is_err() {
                tracing::error!("the store's idle flush thread panicked");
            }
        }
    }
}

/// Starts the watcher of `db` for `cfs`; `batches` reads the writer's count
/// of synced batches. Keep the handle as long as the store (it holds only
/// a weak reference to the database).
pub fn start(
    db: &Arc<DB>,
    cfs: &'static [&'static str],
    batches: impl Fn() -> u64 + Send + 'static,
) -> std::io::Result<IdleFlush> {
    let db = Arc::downgrade(db);
    let stop = Arc::new(AtomicBool::new(false));
    let stopped = stop.clone();
    let thread = std::thread::Builder::new()
        .name("flotilla-store-flush".into())
        .spawn(move || watch(db, cfs, batches, &stopped))?;
    Ok(IdleFlush { stop, thread: Some(thread) })
}

fn watch(db: Weak<DB>, cfs: &'static [&'static str], batches: impl Fn() -> u64, stop: &AtomicBool) {
    let mut flushed_at = batches();
    let mut seen = flushed_at;
    // When the count was last seen to move (a wake before the tick, which
    // `park_timeout` allows, must not count as a tick of idleness).
    let mut moved = Instant::now();
    loop {
        std::thread::park_timeout(TICK);
        if stop.load(Ordering::Relaxed) || db.strong_count() == 0 {
            return;
        }
        let now = batches();
        if now != seen {
            (seen, moved) = (now, Instant::now());
            continue;
        }
        if moved.elapsed() < IDLE || now == flushed_at {
            continue;
        }
        let Some(db) = db.upgrade() else { return };
        let mut held = 0;
        let mut handles = Vec::new();
        for cf in cfs.iter().filter_map(|cf| db.cf_handle(cf)) {
            let used = db.property_int_value_cf(cf, "rocksdb.cur-size-all-mem-tables").ok().flatten().unwrap_or(0);
            if used >= WORTH_FLUSHING {
                held += used;
                handles.push(cf);
            }
        }
        if handles.is_empty() {
            flushed_at = now;
            continue;
        }
        let mut opts = FlushOptions::default();
        opts.set_wait(false);
        match db.flush_cfs_opt(&handles, &opts) {
            Ok(()) => tracing::debug!(batches = now, bytes = held, "idle store: memtables flushed"),
            Err(e) => tracing::warn!(error = %e, "idle store: flushing the memtables failed"),
        }
        drop(handles);
        drop(db);
        flushed_at = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::db;
    use crate::storage::writer::{DEFAULT_QUEUE, StoreWriter, WriteOp};

    const CFS: [&str; 2] = ["data", "meta"];

    fn memtable_entries(db: &DB) -> u64 {
        let cf = db.cf_handle("data").unwrap();
        db.property_int_value_cf(cf, "rocksdb.num-entries-active-mem-table").unwrap().unwrap()
    }

    /// A store in `dir` with its writer and its idle flush running.
    fn store(dir: &std::path::Path) -> (Arc<DB>, StoreWriter, IdleFlush) {
        let db = db::open(dir, &CFS, "meta").unwrap();
        let writer = StoreWriter::start(db.clone(), DEFAULT_QUEUE).unwrap();
        let flush = start(&db, &CFS, writer.batch_counter()).unwrap();
        (db, writer, flush)
    }

    fn put(k: u32, size: usize) -> WriteOp {
        WriteOp::Put { cf: "data", key: k.to_be_bytes().to_vec(), value: vec![7; size] }
    }

    /// Writes held in the memtable are flushed once the writer has been
    /// idle for `IDLE`, not before, and stay readable; a store dropped with
    /// the watcher running can be opened again at once.
    #[tokio::test]
    async fn memtables_are_flushed_once_writes_stop() {
        let dir = tempfile::tempdir().unwrap();
        let (db, writer, flush) = store(dir.path());
        let began = std::time::Instant::now();
        for k in 0..200 {
            writer.commit(vec![put(k, 8 * 1024)]).await.unwrap();
        }
        assert_eq!(memtable_entries(&db), 200, "the writes sit in the memtable");
        tokio::time::sleep(IDLE / 2).await;
        if began.elapsed() < IDLE {
            assert_eq!(memtable_entries(&db), 200, "flushed before the store was idle for {IDLE:?}");
        }
        let deadline = std::time::Instant::now() + IDLE + Duration::from_secs(5);
        while memtable_entries(&db) > 0 {
            assert!(std::time::Instant::now() < deadline, "the memtable was not flushed after the writes stopped");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let cf = db.cf_handle("data").unwrap();
        assert_eq!(db.get_cf(cf, 199u32.to_be_bytes()).unwrap(), Some(vec![7; 8 * 1024]));
        drop(flush);
        drop(writer);
        drop(db);
        db::open(dir.path(), &CFS, "meta").expect("reopened once the store is dropped");
    }

    /// A few small writes now and then are not worth a flush (each would
    /// only make a tiny file to compact): they stay in the memtable.
    #[tokio::test]
    async fn small_memtables_are_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let (db, writer, flush) = store(dir.path());
        for k in 0..20 {
            writer.commit(vec![put(k, 100)]).await.unwrap();
        }
        tokio::time::sleep(IDLE + Duration::from_secs(2)).await;
        assert_eq!(memtable_entries(&db), 20, "2 KB of memtable was flushed");
        drop(flush);
    }
}
