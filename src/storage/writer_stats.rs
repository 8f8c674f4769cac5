//! What the store's writer thread is doing, for whoever must know whether
//! it is stuck (`StoreWriter::stuck_for`, the master's `store_stall_limit`)
//! and for the counters (`batches`, `commits`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

pub(super) struct Stats {
    pub batches: AtomicU64,
    pub commits: AtomicU64,
    /// Since when the batch in flight has been written, in milliseconds
    /// after `epoch` plus one; 0 while no batch is being written.
    busy_since: AtomicU64,
    /// Since when a queued request has waited for the thread to take it
    /// (same unit; 0: none known to wait). Set by the first caller to
    /// queue one, cleared when the thread takes the queue.
    waiting_since: AtomicU64,
    epoch: Instant,
}

impl Default for Stats {
    fn default() -> Self {
        Stats {
            batches: AtomicU64::new(0),
            commits: AtomicU64::new(0),
            busy_since: AtomicU64::new(0),
            waiting_since: AtomicU64::new(0),
            epoch: Instant::now(),
        }
    }
}

impl Stats {
    fn millis(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX - 1) + 1
    }

    /// A request was queued: the wait starts now unless one already waits.
    pub fn queued(&self) {
        let _ = self.waiting_since.compare_exchange(0, self.millis(), Ordering::SeqCst, Ordering::SeqCst);
    }

    /// The thread took the queue: what waits now is this batch, and
    /// whatever is queued from here on, which sets its own start (with
    /// `more`, requests the batch's cap left queued start their wait now).
    pub fn taken(&self, more: bool) {
        self.waiting_since.store(if more { self.millis() } else { 0 }, Ordering::SeqCst);
    }

    /// A batch went to the disk (`true`), or came back (`false`).
    pub fn writing(&self, now: bool) {
        self.busy_since.store(if now { self.millis() } else { 0 }, Ordering::SeqCst);
    }

    /// How long the batch in the disk's hands, or the oldest queued
    /// request, has waited; `None` while the writer waits for work.
    pub fn stuck_for(&self) -> Option<Duration> {
        let now = self.millis();
        let since = [self.busy_since.load(Ordering::SeqCst), self.waiting_since.load(Ordering::SeqCst)]
            .into_iter()
            .filter(|s| *s != 0)
            .min()?;
        Some(Duration::from_millis(now.saturating_sub(since)))
    }
}
