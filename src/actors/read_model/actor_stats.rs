//! What the master's long-lived actors (supervisor, clusters, node
//! managers) publish for `GET /actors`, and the bound on their mailboxes.
//! Instance actors publish lighter counters (`cluster_view::InstanceStats`).
//!
//! A mailbox is bounded by counting: a sender reserves a place (a
//! [`Reservation`], carried inside the message) before it sends, and the
//! place is given back when the actor takes the message
//! ([`Reservation::begin`]) or when the message is dropped unhandled (actix
//! drops a message whose requester went away: a client that hung up). A
//! sender that finds the mailbox full does not send: the API answers `503
//! overloaded`, an agent's report waits in its node manager (past that
//! one's bound, it stays unacknowledged and the agent sends it again).

use std::sync::atomic::{AtomicI64, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::actors::priority::Urgent;

/// Counters one actor publishes for `GET /actors`.
#[derive(Debug, Default)]
pub struct ActorStats {
    pub kind: &'static str,
    pub id: String,
    pub parent: Option<String>,
    /// Messages sent through a handle and not yet taken by the actor.
    pub queued: AtomicI64,
    /// Work queued inside it and not yet begun (a cluster actor: its
    /// instance actors' waiting commands and observations): part of its
    /// mailbox depth, not of its bound.
    pub inner: AtomicI64,
    pub handled: AtomicU64,
    /// Unix ms when the oldest waiting message was queued (0: none).
    oldest_ms: AtomicU64,
    /// Unix ms when the current message was taken (0: idle).
    since_ms: AtomicU64,
    pub state: Mutex<String>,
    pub current: Mutex<Option<String>>,
    /// The last failure and when (unix ms), until the next success.
    pub last_error: Mutex<Option<(String, u64)>>,
    /// Requests it refused (a 404, a 409): counted, not a failure.
    pub refused: AtomicU64,
    /// Times its supervisor started it again after it failed.
    pub restarts: AtomicU64,
    /// How its last incarnation ended, and when (unix ms).
    pub last_exit: Mutex<Option<(String, u64)>>,
}

fn now_ms() -> u64 {
    u64::try_from(time::OffsetDateTime::now_utc().unix_timestamp_nanos() / 1_000_000).unwrap_or(0)
}

impl ActorStats {
    pub fn new(kind: &'static str, id: impl Into<String>, parent: Option<String>) -> Arc<Self> {
        Arc::new(ActorStats { kind, id: id.into(), parent, state: Mutex::new("starting".into()), ..Default::default() })
    }

    /// Called by a handle just before it sends a message.
    pub fn enqueue(&self) {
        if self.queued.fetch_add(1, Ordering::Relaxed) <= 0 {
            self.oldest_ms.store(now_ms(), Ordering::Relaxed);
        }
    }

    /// Reserves a place in a mailbox of `capacity`; false when it is full
    /// (then nothing may be sent).
    pub fn try_enqueue(&self, capacity: usize) -> bool {
        let cap = i64::try_from(capacity).unwrap_or(i64::MAX);
        let mut cur = self.queued.load(Ordering::Relaxed);
        loop {
            if cur >= cap {
                return false;
            }
            match self.queued.compare_exchange_weak(cur, cur + 1, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => {
                    if cur <= 0 {
                        self.oldest_ms.store(now_ms(), Ordering::Relaxed);
                    }
                    return true;
                }
                Err(seen) => cur = seen,
            }
        }
    }

    /// Gives back a reserved place whose message was never handled.
    fn release(&self) {
        if self.queued.fetch_sub(1, Ordering::Relaxed) <= 1 {
            self.oldest_ms.store(0, Ordering::Relaxed);
        }
    }

    /// Called by the actor when it takes a message; `what` becomes its current work.
    fn begin(&self, what: impl Into<String>) {
        self.release();
        self.handled.fetch_add(1, Ordering::Relaxed);
        self.since_ms.store(now_ms(), Ordering::Relaxed);
        set(&self.current, Some(what.into()));
    }

    /// Shows `what` as the actor's current work from now on, for a message
    /// that took no place in its mailbox (a test hook's).
    pub fn busy_with(&self, what: impl Into<String>) {
        self.since_ms.store(now_ms(), Ordering::Relaxed);
        set(&self.current, Some(what.into()));
    }

    /// The current message is done; `error`: it failed (shown as the
    /// actor's last failure until [`succeeded`](Self::succeeded)).
    pub fn end(&self, error: Option<String>) {
        set(&self.current, None);
        self.since_ms.store(0, Ordering::Relaxed);
        if let Some(e) = error {
            set(&self.last_error, Some((e, now_ms())));
        }
    }

    /// The current message was a request it refused (bad input, busy, not
    /// found): counted, not painted as a failure.
    pub fn refused(&self) {
        self.refused.fetch_add(1, Ordering::Relaxed);
        self.end(None);
    }

    /// [`refused`](Self::refused) when `refused`, else the message ended well.
    pub fn refused_if(&self, refused: bool) {
        if refused {
            self.refused();
        } else {
            self.end(None);
        }
    }

    /// Its work succeeded: the last failure is no longer current.
    pub fn succeeded(&self) {
        set(&self.last_error, None);
    }

    /// A new incarnation takes over the restarts and last exit of `dead`.
    pub fn inherit(&self, dead: &ActorStats) {
        self.restarts.store(dead.restarts.load(Ordering::Relaxed), Ordering::Relaxed);
        set(&self.last_exit, get(&dead.last_exit));
    }

    pub fn state(&self) -> String {
        get(&self.state)
    }

    /// Its incarnation ended (`reason`); `restarted`: its supervisor
    /// started it again.
    pub fn exited(&self, reason: impl Into<String>, restarted: bool) {
        set(&self.last_exit, Some((reason.into(), now_ms())));
        if restarted {
            self.restarts.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn set_state(&self, s: impl Into<String>) {
        set(&self.state, s.into());
    }

    pub fn snapshot(&self) -> ActorInfo {
        let now = now_ms();
        let age = |at: u64| (at > 0).then(|| now.saturating_sub(at));
        let (last_error, last_error_age_ms) = match get(&self.last_error) {
            Some((e, at)) => (Some(e), Some(now.saturating_sub(at))),
            None => (None, None),
        };
        ActorInfo {
            kind: self.kind,
            id: self.id.clone(),
            parent: self.parent.clone(),
            state: get(&self.state),
            current: get(&self.current),
            current_ms: age(self.since_ms.load(Ordering::Relaxed)),
            mailbox: (self.queued.load(Ordering::Relaxed).max(0) + self.inner.load(Ordering::Relaxed).max(0)) as u64,
            oldest_message_ms: age(self.oldest_ms.load(Ordering::Relaxed)),
            handled: self.handled.load(Ordering::Relaxed),
            last_error,
            last_error_age_ms,
            refused: self.refused.load(Ordering::Relaxed),
            restarts: self.restarts.load(Ordering::Relaxed),
            last_exit: get(&self.last_exit).map(|(reason, at)| (reason, now.saturating_sub(at))),
        }
    }
}

fn set<T>(m: &Mutex<T>, v: T) {
    match m.lock() {
        Ok(mut g) => *g = v,
        Err(p) => *p.into_inner() = v,
    }
}

fn get<T: Clone>(m: &Mutex<T>) -> T {
    match m.lock() {
        Ok(g) => g.clone(),
        Err(p) => p.into_inner().clone(),
    }
}

/// A place in an actor's mailbox, carried inside the message that holds
/// it. Given back exactly once: when the actor takes the message, or when
/// the message is dropped without being handled. It may also carry the
/// message's [`Urgent`] mark on the actor's thread (`priority`).
#[derive(Debug)]
pub struct Reservation {
    /// `None` once given back.
    stats: Option<Arc<ActorStats>>,
    queued_at: Instant,
    urgent: Option<Urgent>,
    /// An API request's: taken by the actor or abandoned by the caller at
    /// its deadline, never both.
    claim: Option<Claim>,
}

/// Who has an API request: the actor that takes it, or the caller that
/// gives up waiting for that (`request_take_limit`). Exactly one wins, so
/// a request answered "not taken" never runs, and one taken is awaited.
#[derive(Debug, Clone, Default)]
pub struct Claim(Arc<AtomicU8>);

const WAITING: u8 = 0;
const TAKEN: u8 = 1;
const ABANDONED: u8 = 2;

impl Claim {
    fn take(&self) -> bool {
        self.0.compare_exchange(WAITING, TAKEN, Ordering::SeqCst, Ordering::SeqCst).is_ok()
    }

    /// The caller stops waiting; `false` when the actor took the request
    /// first (then its answer must be awaited).
    pub fn abandon(&self) -> bool {
        self.0.compare_exchange(WAITING, ABANDONED, Ordering::SeqCst, Ordering::SeqCst).is_ok()
    }
}

impl Reservation {
    /// Reserves a place in a mailbox of `capacity`; `None` when it is full
    /// (then the message must not be sent).
    pub fn within(stats: &Arc<ActorStats>, capacity: usize) -> Option<Reservation> {
        stats.try_enqueue(capacity).then(|| Reservation::taken(stats))
    }

    /// Counts a message that must be sent whatever the mailbox holds (one
    /// per instance of an agent that just connected; an escalation).
    pub fn counted(stats: &Arc<ActorStats>) -> Reservation {
        stats.enqueue();
        Reservation::taken(stats)
    }

    /// A place already counted in `stats`.
    fn taken(stats: &Arc<ActorStats>) -> Reservation {
        Reservation { stats: Some(stats.clone()), queued_at: Instant::now(), urgent: None, claim: None }
    }

    /// The message goes ahead of bulk work on the actor's thread while it
    /// waits, and until the handler drops what [`urgent`](Self::urgent)
    /// gives it (else until it is taken).
    pub fn with_urgent(mut self, mark: Urgent) -> Reservation {
        self.urgent = Some(mark);
        self
    }

    /// The message's urgent mark, for the handler to hold until it has answered.
    pub fn urgent(&mut self) -> Option<Urgent> {
        self.urgent.take()
    }

    /// An API request's place: its caller may give up waiting for the
    /// actor to take it, through the [`Claim`] (see [`take`](Self::take)).
    pub fn claimable(mut self) -> (Reservation, Claim) {
        let claim = Claim::default();
        self.claim = Some(claim.clone());
        (self, claim)
    }

    /// [`begin`](Self::begin) for an API request: `Err` when its caller
    /// gave up waiting (it was answered that nothing was done, so nothing
    /// may be). The place is given back either way.
    pub fn take(mut self, what: impl Into<String>) -> Result<(), crate::error::Error> {
        if let Some(claim) = self.claim.take()
            && !claim.take()
        {
            return Err(crate::error::Error::unavailable("the request's caller stopped waiting before it was taken"));
        }
        self.begin(what);
        Ok(())
    }

    /// The actor took the message: the place is free, the message counted
    /// as handled, `what` shown as its current work, and the time it
    /// waited recorded (`flotilla_actor_mailbox_wait_seconds`). An API
    /// request is taken with [`take`](Self::take) instead.
    pub fn begin(mut self, what: impl Into<String>) {
        debug_assert!(self.claim.is_none(), "an API request is taken with Reservation::take");
        if let Some(s) = self.stats.take() {
            metrics::histogram!("flotilla_actor_mailbox_wait_seconds", "kind" => s.kind)
                .record(self.queued_at.elapsed().as_secs_f64());
            s.begin(what);
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if let Some(s) = self.stats.take() {
            s.release();
        }
    }
}

/// One actor as `GET /actors` shows it.
#[derive(Debug, Clone)]
pub struct ActorInfo {
    pub kind: &'static str,
    pub id: String,
    pub parent: Option<String>,
    pub state: String,
    pub current: Option<String>,
    /// How long it has been handling `current`.
    pub current_ms: Option<u64>,
    pub mailbox: u64,
    /// How long its oldest waiting message has waited.
    pub oldest_message_ms: Option<u64>,
    pub handled: u64,
    pub last_error: Option<String>,
    pub last_error_age_ms: Option<u64>,
    pub refused: u64,
    pub restarts: u64,
    /// How its last incarnation ended, and how long ago.
    pub last_exit: Option<(String, u64)>,
}

/// A message waiting longer than this, or a handler busy longer than
/// [`BUSY_AMBER`], shows the actor amber.
pub const WAIT_AMBER_MS: u64 = 5_000;
pub const BUSY_AMBER_MS: u64 = 30_000;

impl ActorInfo {
    /// `red` (failed: given up, or dead), `amber` (restarting, a message
    /// waiting over 5 s, or a handler busy over 30 s) or `green`. A refused
    /// request or a past failure paints nothing.
    pub fn health(&self) -> &'static str {
        if matches!(self.state.as_str(), "failed" | "giving up" | "dead") {
            "red"
        } else if self.state == "restarting"
            || self.oldest_message_ms.is_some_and(|ms| ms > WAIT_AMBER_MS)
            || self.current_ms.is_some_and(|ms| ms > BUSY_AMBER_MS)
        {
            "amber"
        } else {
            "green"
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_mailbox_refuses_and_frees_a_place_per_taken_message() {
        let s = ActorStats::new("cluster", "c", None);
        let a = Reservation::within(&s, 2).unwrap();
        let _b = Reservation::within(&s, 2).unwrap();
        assert!(Reservation::within(&s, 2).is_none(), "a third message in a mailbox of two");
        assert_eq!(s.snapshot().mailbox, 2);
        assert!(s.snapshot().oldest_message_ms.is_some());
        a.begin("op");
        let c = Reservation::within(&s, 2).unwrap();
        s.end(None);
        assert_eq!(s.snapshot().handled, 1);
        // A message dropped unhandled (its requester went away) gives its
        // place back too, without counting as handled.
        drop(c);
        assert_eq!(s.snapshot().mailbox, 1);
        assert_eq!(s.snapshot().handled, 1);
    }

    /// An urgent message holds its thread's gate while it waits; the gate
    /// opens when it is dropped unhandled, when it is taken (unless the
    /// handler keeps the mark), or when the handler drops the mark: never
    /// left closed, which would stop every operation on that thread.
    #[test]
    fn an_urgent_mark_ends_with_its_message_or_its_answer() {
        let s = ActorStats::new("cluster", "c", None);
        let gate = Arc::new(crate::actors::priority::Priority::default());
        let dropped = Reservation::within(&s, 4).unwrap().with_urgent(gate.urgent());
        assert!(gate.is_held(), "a queued urgent message holds the gate");
        drop(dropped);
        assert!(!gate.is_held(), "a message dropped unhandled released the gate");

        let taken = Reservation::within(&s, 4).unwrap().with_urgent(gate.urgent());
        taken.begin("preview");
        assert!(!gate.is_held(), "a message taken by a handler that does not keep the mark released it");

        let mut kept = Reservation::within(&s, 4).unwrap().with_urgent(gate.urgent());
        let mark = kept.urgent();
        kept.begin("ScaleOut");
        assert!(gate.is_held(), "the handler holds the mark until it has answered");
        drop(mark);
        assert!(!gate.is_held());
        assert_eq!(s.snapshot().mailbox, 0);
    }

    /// Red only for an actor given up or dead, amber for one restarting,
    /// waiting or busy too long; a refusal paints nothing, a failure shows
    /// as `last_error` until the next success clears it.
    #[test]
    fn health_tells_failed_from_slow_from_refused() {
        let s = ActorStats::new("cluster", "c", None);
        s.set_state("Active");
        Reservation::within(&s, 4).unwrap().begin("stop");
        s.refused();
        let info = s.snapshot();
        assert_eq!((info.health(), info.refused, info.last_error.as_deref()), ("green", 1, None));

        Reservation::within(&s, 4).unwrap().begin("start");
        s.end(Some("start failed: exit code 3".into()));
        let info = s.snapshot();
        assert_eq!(info.health(), "green", "a past failure is shown, not painted");
        assert_eq!(info.last_error.as_deref(), Some("start failed: exit code 3"));
        s.succeeded();
        assert_eq!(s.snapshot().last_error, None, "the next success clears it");

        for (state, health) in [("restarting", "amber"), ("failed", "red"), ("giving up", "red"), ("dead", "red")] {
            s.set_state(state);
            assert_eq!(s.snapshot().health(), health, "{state}");
        }
        s.set_state("Active");
        let slow = |oldest: Option<u64>, busy: Option<u64>| {
            ActorInfo { oldest_message_ms: oldest, current_ms: busy, ..s.snapshot() }.health()
        };
        assert_eq!(slow(Some(WAIT_AMBER_MS + 1), None), "amber", "a message waiting over 5 s");
        assert_eq!(slow(Some(WAIT_AMBER_MS), None), "green");
        assert_eq!(slow(None, Some(BUSY_AMBER_MS + 1)), "amber", "a handler busy over 30 s");
        assert_eq!(slow(None, Some(BUSY_AMBER_MS)), "green");
    }

    /// An API request is either taken by its actor or abandoned by its
    /// caller at the deadline, never both, and its place comes back once.
    #[test]
    fn a_request_is_taken_or_abandoned_never_both() {
        let s = ActorStats::new("cluster", "c", None);
        let (abandoned, claim) = Reservation::within(&s, 4).unwrap().claimable();
        assert!(claim.abandon(), "a request nobody took can be abandoned");
        assert!(abandoned.take("stop").is_err(), "an abandoned request was taken");
        assert_eq!((s.snapshot().mailbox, s.snapshot().handled), (0, 0), "its place came back, nothing handled");

        let (taken, claim) = Reservation::within(&s, 4).unwrap().claimable();
        taken.take("stop").expect("a request nobody abandoned is taken");
        assert!(!claim.abandon(), "a taken request was abandoned: its answer must be awaited");
        assert_eq!((s.snapshot().mailbox, s.snapshot().handled), (0, 1));

        // Abandoning twice (a retry of the deadline) changes nothing.
        let (late, claim) = Reservation::within(&s, 4).unwrap().claimable();
        assert!(claim.abandon());
        assert!(!claim.abandon());
        assert!(late.take("stop").is_err());
        assert_eq!(s.snapshot().mailbox, 0);
    }
}
