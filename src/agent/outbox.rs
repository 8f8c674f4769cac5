//! The agent's reports (process exits and restarts) that the master has not
//! acknowledged yet.
//!
//! A report is never dropped because a queue is full: it waits here, on its
//! own queue beside the replies, until the master answers `Ack { seq }`.
//! The connection's writer sends every report not yet sent on the current
//! connection, and sends again those unacknowledged for longer than
//! `RESEND_AFTER` (the master may have been too busy to take it: it does not
//! acknowledge what it could not apply). After a reconnect everything still
//! pending is sent again, in order. Applying a report twice is harmless on
//! the master (it matches the pid it knows).
//!
//! Bounded: the restart policy caps how many reports one instance makes in a
//! window, and past `MAX_PENDING` the oldest are dropped and the outbox asks
//! for a full resync (a reconnect, whose `Hello` carries the inventory: the
//! truth the lost reports were about).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::protocol::messages::AgentEvent;

/// A report unacknowledged this long is sent again.
pub const RESEND_AFTER: Duration = Duration::from_secs(3);

/// The most reports kept; past it the oldest go and a resync is asked for.
pub const MAX_PENDING: usize = 65_536;

struct Pending {
    event: AgentEvent,
    /// The connection it was last sent on, and when.
    sent: Option<(u64, Instant)>,
}

#[derive(Default)]
struct Inner {
    next_seq: u64,
    pending: BTreeMap<u64, Pending>,
    overflowed: bool,
}

#[derive(Default)]
pub struct Outbox {
    inner: Mutex<Inner>,
    /// Woken when a report is added.
    pub added: Notify,
}

impl Outbox {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues a report; returns its sequence number.
    pub fn push(&self, event: AgentEvent) -> u64 {
        let seq = {
            let mut g = self.lock();
            g.next_seq += 1;
            let seq = g.next_seq;
            g.pending.insert(seq, Pending { event, sent: None });
            while g.pending.len() > MAX_PENDING {
                g.pending.pop_first();
                g.overflowed = true;
            }
            seq
        };
        self.added.notify_one();
        seq
    }

    /// The master applied report `seq`.
    pub fn ack(&self, seq: u64) {
        self.lock().pending.remove(&seq);
    }

    /// Reports to send now on `connection`: never sent on it, or sent more
    /// than [`RESEND_AFTER`] ago. They are marked sent.
    pub fn due(&self, connection: u64, now: Instant) -> Vec<(u64, AgentEvent)> {
        let mut g = self.lock();
        let mut out = Vec::new();
        for (seq, p) in g.pending.iter_mut() {
            let due = match p.sent {
                Some((c, at)) => c != connection || now.saturating_duration_since(at) >= RESEND_AFTER,
                None => true,
            };
            if due {
                p.sent = Some((connection, now));
                out.push((*seq, p.event.clone()));
            }
        }
        out
    }

    /// True once if reports were dropped for room: the caller should
    /// reconnect so the master gets the full inventory.
    pub fn take_overflow(&self) -> bool {
        std::mem::take(&mut self.lock().overflowed)
    }

    pub fn len(&self) -> usize {
        self.lock().pending.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn beat() -> AgentEvent {
        AgentEvent::Heartbeat
    }

    #[test]
    fn reports_stay_until_acked_and_are_resent_on_a_new_connection() {
        let o = Outbox::default();
        let a = o.push(beat());
        let b = o.push(beat());
        let t = Instant::now();
        assert_eq!(o.due(1, t).iter().map(|(s, _)| *s).collect::<Vec<_>>(), vec![a, b]);
        assert!(o.due(1, t).is_empty(), "not again on the same connection at once");
        o.ack(a);
        assert_eq!(o.due(2, t).iter().map(|(s, _)| *s).collect::<Vec<_>>(), vec![b], "a new connection gets the rest");
        assert_eq!(o.due(2, t + RESEND_AFTER).len(), 1, "resent once it is overdue");
        o.ack(b);
        assert!(o.is_empty());
    }

    #[test]
    fn overflow_drops_the_oldest_and_asks_for_a_resync() {
        let o = Outbox::default();
        for _ in 0..MAX_PENDING + 3 {
            o.push(beat());
        }
        assert_eq!(o.len(), MAX_PENDING);
        assert!(o.take_overflow());
        assert!(!o.take_overflow());
        let first = o.due(1, Instant::now())[0].0;
        assert_eq!(first, 4, "the three oldest were dropped");
    }
}
