//! Requests go ahead of bulk work on an arbiter.
//!
//! A cluster actor shares its arbiter thread with the instance commands of
//! every cluster placed there, and that thread polls its tasks first come,
//! first served: under load an API request waited for every busy cluster's
//! turn twice (to be taken, then to be answered once its write was durable),
//! 130 ms on average while its own work took under 2 ms (BENCHMARKS.md, B5).
//!
//! Each arbiter has a [`Priority`]. A request the API sends to a cluster
//! actor holds an [`Urgent`] mark on that cluster's arbiter from the moment
//! it is queued until the actor has answered it. While any mark is held,
//! bulk work is not polled: each instance command's execution and each
//! command a step is about to make and render ([`Priority::gated`]), and
//! an operation's own work between its commands
//! ([`Priority::behind_requests`]). It parks at the [`Gate`] the master's
//! actor threads share, on every actor thread, not only the request's:
//! the threads share the cores, and bulk work on one takes the core a
//! request on another waits for. It is woken when the last mark goes;
//! what it was waiting for (an agent's answer, a durable write) is not
//! lost: it is taken at the next poll. Marks are short (one request: a
//! check, a placement, one synced write), so bulk work is held for
//! milliseconds; an agent's reports are never held, and agents' frames are
//! read on threads of their own (`link_threads`), not these. A gate
//! closed for longer than [`MAX_HOLD`] (requests arriving back to back)
//! lets bulk work through again, so a stream of requests slows operations
//! down but never stops them.
//!
//! A mark only helps once the thread gets to the request, so bulk work is
//! also cut in [`SLICE`]s: an operation's poll ([`sliced`]) that has run
//! that long lets its remaining ready commands wait for its next turn, and
//! the thread goes on to the other tasks, the request among them.
//!
//! Neither helps while the thread waits for a core, and on a busy machine
//! it waits about as long as it runs. So the thread itself runs its bulk
//! work at a lower OS priority ([`Priority::lower_thread`], nice +10 by
//! default: `bulk_nice`) and is raised back to the process's priority
//! while one of its own marks is held: the kernel then gives the request's
//! thread a core ahead of bulk work elsewhere on the machine. A thread whose
//! last mark goes on itself (an answered request) lowers itself only at
//! its next bulk work ([`Priority::settle`]), after the answer went out.

use std::cell::Cell;
use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use crate::thread_nice::ThreadNice;

mod gate;
pub use gate::Gate;

/// How long one poll of an operation may run its commands before the
/// thread goes on to other tasks.
pub const SLICE: Duration = Duration::from_millis(2);

/// The longest bulk work waits for requests at a stretch: past it, a gate
/// still closed lets everything through until it opens once.
pub const MAX_HOLD: Duration = Duration::from_millis(50);

thread_local! {
    /// The [`sliced`] poll running on this thread: when it began, and
    /// whether a command has run in it yet.
    static SLICE_STARTED: Cell<Option<(Instant, bool)>> = const { Cell::new(None) };
}

/// Runs `work` (an operation) so that the [`Priority::gated`] commands in
/// it stop taking turns once one of its polls has run for [`SLICE`] (at
/// least one command runs in each poll).
pub async fn sliced<F: Future>(work: F) -> F::Output {
    /// Puts back the enclosing slice, also when the poll panics.
    struct Restore(Option<(Instant, bool)>);
    impl Drop for Restore {
        fn drop(&mut self) {
            SLICE_STARTED.set(self.0);
        }
    }
    let mut work = pin!(work);
    std::future::poll_fn(|cx| {
        let _restore = Restore(SLICE_STARTED.replace(Some((Instant::now(), false))));
        work.as_mut().poll(cx)
    })
    .await
}

/// Whether the running [`sliced`] poll has used its slice; else counts
/// the command about to run in it.
fn slice_spent() -> bool {
    match SLICE_STARTED.get() {
        Some((started, true)) if started.elapsed() >= SLICE => true,
        Some((started, _)) => {
            SLICE_STARTED.set(Some((started, true)));
            false
        }
        None => false,
    }
}

/// How late this thread runs a task that became ready, 10 times a second
/// for as long as the thread runs: `flotilla_actor_thread_lag_seconds`,
/// labelled `thread`: an actor arbiter's number from 0, or `link-N` for
/// the threads of agents' connections. A thread whose tasks wait for their
/// turn (busy clusters, or no core free for the thread) shows it here
/// before requests time out. On an actor thread (`priority`) each tick
/// also lowers the thread if its last mark went and no bulk work has run
/// since, and lets parked bulk work through if the shared gate has been
/// closed longer than [`MAX_HOLD`].
pub async fn measure_lag(thread: String, priority: Option<Arc<Priority>>) {
    const EVERY: Duration = Duration::from_millis(100);
    loop {
        let due = Instant::now() + EVERY;
        tokio::time::sleep_until(due.into()).await;
        // Looked up at each tick, not once: the arbiters start before the
        // master installs its recorder, and a handle taken then records
        // nowhere for good.
        metrics::histogram!("flotilla_actor_thread_lag_seconds", "thread" => thread.clone())
            .record(due.elapsed().as_secs_f64());
        if let Some(p) = &priority {
            p.settle();
            p.gate.let_through_if_held_too_long();
        }
    }
}

/// Lowers the calling thread `by` nice steps for good: a thread of agents'
/// connections, whose frames no request waits on as a whole (a request
/// waits for its own answers, and those are read on whatever thread).
/// Lowering needs no privilege; a failure is logged and changes nothing.
pub fn lower_for_good(by: u8) {
    if by == 0 {
        return;
    }
    let lowered = crate::thread_nice::current_lowered(by).and_then(crate::thread_nice::set_current_for_good);
    if let Err(e) = lowered {
        tracing::info!(error = %e, "agents' connections run at the same OS priority as requests");
    }
}

/// One arbiter's priority: the [`Gate`] its bulk work waits at (shared
/// with the master's other actor threads), and its OS priority, raised
/// while a request to one of its own actors waits.
#[derive(Debug, Default)]
pub struct Priority {
    /// Requests to this arbiter's actors marked urgent and not yet answered.
    urgent: AtomicUsize,
    gate: Arc<Gate>,
    thread: Mutex<ThreadState>,
    /// The last mark went on the arbiter's own thread, which stays raised
    /// until its next bulk work ([`Priority::gated`]): lowered at once, it
    /// could lose its core before the answer went out.
    lower_pending: AtomicBool,
}

#[derive(Debug, Default)]
struct ThreadState {
    /// The arbiter thread's OS priority while it is lowered for bulk
    /// work; taken away when the thread ends, so that its id, which the
    /// kernel may give to another thread, is never touched again.
    nice: Option<ThreadNice>,
    /// Whether the thread runs at the process's priority now (a mark held).
    raised: bool,
}

/// Held while a request is urgent; dropping it (the request answered, or
/// dropped unhandled) opens the gate once no other request is urgent.
#[derive(Debug)]
#[must_use = "the request is urgent only while this is held"]
pub struct Urgent(Arc<Priority>);

impl Priority {
    /// An arbiter's priority whose bulk work waits at `gate`, which other
    /// arbiters share (`Priority::default()` has a gate of its own).
    pub fn sharing(gate: Arc<Gate>) -> Priority {
        Priority { gate, ..Priority::default() }
    }

    /// Marks a request urgent until the returned guard is dropped.
    pub fn urgent(self: &Arc<Self>) -> Urgent {
        self.gate.close();
        if self.urgent.fetch_add(1, Ordering::SeqCst) == 0 {
            self.follow_marks(&mut lock(&self.thread));
        }
        Urgent(self.clone())
    }

    /// Lowers the calling thread (the arbiter's own) by `by` nice steps
    /// for its bulk work; it is raised back while a mark is held, until
    /// the thread ends. Does nothing when `by` is 0, the thread was
    /// lowered already, or the process could not raise it back.
    pub fn lower_thread(self: &Arc<Self>, by: u8) {
        if by == 0 || LOWERED.with_borrow(|l| l.is_some()) {
            return;
        }
        match ThreadNice::lower_current(by) {
            Ok(nice) => {
                let mut thread = lock(&self.thread);
                thread.nice = Some(nice);
                thread.raised = false;
                self.follow_marks(&mut thread);
                drop(thread);
                LOWERED.set(Some(Forget(self.clone())));
            }
            Err(e) => tracing::info!(error = %e, "bulk work runs at the same OS priority as requests"),
        }
    }

    /// Raises the thread while a mark is held; once none is, lowers it,
    /// or, on the thread itself, leaves that to its next bulk work
    /// ([`Priority::settle`]). Called under the lock after every change of
    /// `urgent` that may begin or end a hold, so the last call sees the
    /// last count.
    fn follow_marks(&self, thread: &mut ThreadState) {
        let Some(nice) = thread.nice else { return };
        if self.is_held() {
            self.lower_pending.store(false, Ordering::SeqCst);
            if !thread.raised {
                set_nice(&nice, true);
                thread.raised = true;
            }
        } else if thread.raised {
            if self.is_own_thread() {
                self.lower_pending.store(true, Ordering::SeqCst);
            } else {
                // Under the lock: the thread cannot end (and its id go to
                // another) meanwhile.
                set_nice(&nice, false);
                thread.raised = false;
            }
        }
    }

    /// On the arbiter's thread, before bulk work: lowers the thread if the
    /// last mark went since. The lowering itself is done outside the lock
    /// (a thread that lowers itself may lose its core at once, and must
    /// not hold up a request being marked meanwhile), then checked again.
    fn settle(&self) {
        if !self.lower_pending.load(Ordering::Relaxed)
            || !self.is_own_thread()
            || !self.lower_pending.swap(false, Ordering::SeqCst)
        {
            return;
        }
        let mut thread = lock(&self.thread);
        let Some(nice) = thread.nice else { return };
        if self.is_held() || !thread.raised {
            return;
        }
        thread.raised = false;
        drop(thread);
        set_nice(&nice, false);
        let mut thread = lock(&self.thread);
        if self.is_held() {
            // Marked between the two locks: raised again, whatever the
            // marker did before the lowering landed.
            set_nice(&nice, true);
            thread.raised = true;
        }
    }

    /// Whether the caller is the thread this gate lowered.
    fn is_own_thread(&self) -> bool {
        LOWERED.try_with(|l| l.borrow().as_ref().is_some_and(|f| std::ptr::eq(&*f.0, self))).unwrap_or(false)
    }

    /// Whether a request is waiting for this arbiter now.
    pub fn is_held(&self) -> bool {
        self.urgent.load(Ordering::SeqCst) > 0
    }

    /// Runs `work` as bulk work: each time it would be polled while a
    /// request is urgent, it parks instead until none is (at most about
    /// [`MAX_HOLD`]); once the enclosing [`sliced`] poll has used its
    /// slice, it waits for the next one.
    pub async fn gated<F: Future>(&self, work: F) -> F::Output {
        self.held_back(work, true).await
    }

    /// Runs `work` (an operation's own bookkeeping: its steps' plans,
    /// results, journal and publication, between its commands) only while
    /// no request is urgent, as [`gated`](Self::gated) does, but without
    /// taking a turn of the enclosing [`sliced`] poll: the commands inside
    /// it take those.
    pub async fn behind_requests<F: Future>(&self, work: F) -> F::Output {
        self.held_back(work, false).await
    }

    async fn held_back<F: Future>(&self, work: F, takes_a_slice: bool) -> F::Output {
        let mut work = pin!(work);
        std::future::poll_fn(|cx| {
            self.settle();
            if self.park(cx) {
                return Poll::Pending;
            }
            if takes_a_slice && slice_spent() {
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            work.as_mut().poll(cx)
        })
        .await
    }

    /// True when the caller must wait (its waker is kept to be woken).
    fn park(&self, cx: &mut Context<'_>) -> bool {
        self.gate.park(cx)
    }
}

impl Drop for Urgent {
    fn drop(&mut self) {
        self.0.urgent.fetch_sub(1, Ordering::SeqCst);
        self.0.follow_marks(&mut lock(&self.0.thread));
        self.0.gate.release();
    }
}

thread_local! {
    /// On an arbiter thread [`Priority::lower_thread`] lowered: its gate.
    static LOWERED: std::cell::RefCell<Option<Forget>> = const { std::cell::RefCell::new(None) };
}

/// Forgets the thread's id when the thread ends (its thread-local dies).
struct Forget(Arc<Priority>);

impl Drop for Forget {
    fn drop(&mut self) {
        lock(&self.0.thread).nice = None;
    }
}

/// Sets a thread's priority; a failure (the right to raise taken away
/// since start) is logged once per process, not at every request.
fn set_nice(nice: &ThreadNice, raised: bool) {
    static WARNED: AtomicBool = AtomicBool::new(false);
    if let Err(e) = nice.set(raised)
        && !WARNED.swap(true, Ordering::Relaxed)
    {
        tracing::warn!(error = %e, raised, "cannot change an actor thread's OS priority (logged once)");
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests;
