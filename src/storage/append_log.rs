//! A store's append-only log (the master's `events`): records added with
//! [`WriteOp::Append`](super::WriteOp::Append) get the next sequence number
//! as their key, assigned by the writer thread as it builds each batch, so
//! numbers increase in the order batches become durable and an appended
//! record is durable together with the rest of its request. The log keeps
//! its last `retained` records: every [`TRIM_EVERY`] appends the batch also
//! deletes everything older (one range tombstone, not one per record).

use super::keys::event_key;

/// Appends between two trims of the log's head.
pub const TRIM_EVERY: u64 = 1024;

/// The writer's state of the log.
#[derive(Debug, Clone)]
pub struct AppendLog {
    pub cf: &'static str,
    /// The sequence number the next append gets (1 for an empty log).
    pub next: u64,
    /// Records kept; older ones are deleted.
    pub retained: u64,
}

impl AppendLog {
    /// A log in `cf` whose highest stored number is `last` (0: empty).
    pub fn new(cf: &'static str, last: u64, retained: u64) -> AppendLog {
        AppendLog { cf, next: last.saturating_add(1), retained: retained.max(1) }
    }

    /// The key of the next append.
    pub fn take(&mut self) -> Vec<u8> {
        let key = event_key(self.next);
        self.next = self.next.saturating_add(1);
        key
    }

    /// The range to delete after appends that moved `next` from `before`:
    /// `Some` when a multiple of [`TRIM_EVERY`] was crossed and anything is
    /// older than the retained window.
    pub fn trim(&self, before: u64) -> Option<(Vec<u8>, Vec<u8>)> {
        let crossed = before / TRIM_EVERY != self.next / TRIM_EVERY;
        let keep_from = self.next.saturating_sub(self.retained);
        (crossed && keep_from > 1).then(|| (event_key(0), event_key(keep_from)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::keys::event_seq;

    #[test]
    fn numbers_follow_the_last_stored_and_trims_keep_the_window() {
        let mut log = AppendLog::new("events", 0, 3000);
        assert_eq!(event_seq(&log.take()), Some(1));
        let mut log = AppendLog::new("events", 41, 3000);
        assert_eq!(event_seq(&log.take()), Some(42));

        // Up to 3,000 records nothing is trimmed, even when crossing 1024s.
        let mut log = AppendLog::new("events", 0, 3000);
        let mut trims = Vec::new();
        for _ in 0..5000 {
            let before = log.next;
            log.take();
            if let Some((from, to)) = log.trim(before) {
                trims.push((event_seq(&from).unwrap(), event_seq(&to).unwrap(), log.next));
            }
        }
        // Crossings at 3072 and 4096: keep the last 3,000 numbers each time.
        assert_eq!(trims, vec![(0, 72, 3072), (0, 1096, 4096)]);
    }
}
