//! Where bulk work waits while API requests are urgent.
//!
//! The master's actor threads share one [`Gate`]: a request waiting for
//! any cluster actor holds bulk work on every actor thread, not only on
//! its own. The threads share the machine's cores, and bulk work on one
//! takes the core a request on another waits for: under workload A on 2
//! cores, a request's thread spent two thirds of the request's wait in
//! its cluster's mailbox runnable without a core, a third running other
//! work (`/proc` schedstat read at queueing and at handling;
//! BENCHMARKS.md, eleventh session).

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Waker};
use std::time::Instant;

use super::{MAX_HOLD, lock};

/// Closed while a request is urgent on any of the threads sharing it.
#[derive(Debug, Default)]
pub struct Gate {
    /// Requests marked urgent and not yet answered, on every thread.
    urgent: AtomicUsize,
    waiting: Mutex<Waiting>,
}

#[derive(Debug, Default)]
struct Waiting {
    /// Bulk work parked while a request was urgent.
    wakers: Vec<Waker>,
    /// Since when the gate has been closed (None: open).
    closed_at: Option<Instant>,
}

impl Waiting {
    fn held_too_long(&self) -> bool {
        self.closed_at.is_some_and(|t| t.elapsed() >= MAX_HOLD)
    }
}

impl Gate {
    /// A request became urgent.
    pub(super) fn close(&self) {
        if self.urgent.fetch_add(1, Ordering::SeqCst) == 0 {
            // A new hold, timed from now, unless the last one's release has
            // not yet opened the gate: what parked under it keeps its clock
            // (reset, it could wait past `MAX_HOLD`).
            lock(&self.waiting).closed_at.get_or_insert_with(Instant::now);
        }
    }

    /// A request is no longer urgent: wakes what waited once no other is,
    /// or when the gate has been closed longer than [`MAX_HOLD`].
    pub(super) fn release(&self) {
        let last = self.urgent.fetch_sub(1, Ordering::SeqCst) == 1;
        let mut waiting = lock(&self.waiting);
        let woken = if last && !self.is_closed() {
            waiting.closed_at = None;
            std::mem::take(&mut waiting.wakers)
        } else if waiting.held_too_long() {
            // Requests back to back: what waited longest goes now.
            std::mem::take(&mut waiting.wakers)
        } else {
            Vec::new()
        };
        // Woken outside the lock (thousands may be parked): a request being
        // marked meanwhile does not wait for them. None is lost: work that
        // parks after the take is woken by the mark that made it park.
        drop(waiting);
        for w in woken {
            w.wake();
        }
    }

    /// Wakes what parked once the gate has been closed longer than
    /// [`MAX_HOLD`], though no request was answered since: under one slow
    /// request, what parked before the hold grew too long would otherwise
    /// wait for its answer. Called by each actor thread's lag tick.
    pub(super) fn let_through_if_held_too_long(&self) {
        let mut waiting = lock(&self.waiting);
        if waiting.wakers.is_empty() || !waiting.held_too_long() {
            return;
        }
        let woken = std::mem::take(&mut waiting.wakers);
        drop(waiting);
        for w in woken {
            w.wake();
        }
    }

    /// Whether a request is urgent on any thread sharing the gate.
    pub fn is_closed(&self) -> bool {
        self.urgent.load(Ordering::SeqCst) > 0
    }

    /// True when the caller must wait (its waker is kept to be woken).
    pub(super) fn park(&self, cx: &mut Context<'_>) -> bool {
        if !self.is_closed() {
            return false;
        }
        let mut waiting = lock(&self.waiting);
        // Checked again under the lock: the last mark may have gone (and
        // woken everyone parked) between the first check and here.
        if !self.is_closed() {
            return false;
        }
        waiting.closed_at.get_or_insert_with(Instant::now);
        if waiting.held_too_long() {
            return false;
        }
        // No search for a waker already kept: thousands may be parked, and
        // a command is polled again only when something woke it, so the
        // copies stay as few as its wakes.
        waiting.wakers.push(cx.waker().clone());
        true
    }
}
