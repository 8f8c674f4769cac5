//! The restart policy for instances whose process exits without being asked
//! to (DESIGN.md §12): the agent starts them again, after a delay that
//! doubles with each restart, at most `max` times within `window`; past
//! that they stay down and the master marks them Failed. What the operator
//! stopped is never restarted (the exit watcher only acts while the
//! instance's desired state is running).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::ids::InstanceId;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RestartPolicy {
    /// 0: never restart.
    pub max: u32,
    pub window: Duration,
    /// The first delay; doubled for each restart still in the window.
    pub backoff: Duration,
}

impl Default for RestartPolicy {
    fn default() -> Self {
        RestartPolicy { max: 3, window: Duration::from_secs(300), backoff: Duration::from_secs(1) }
    }
}

/// The longest delay before a restart, whatever the doubling says.
const MAX_DELAY: Duration = Duration::from_secs(300);

/// Recent restarts per instance (in memory: an agent restart forgets them,
/// which at worst allows a few more restarts).
#[derive(Debug, Default)]
pub struct RestartHistory(Mutex<HashMap<InstanceId, Vec<Instant>>>);

impl RestartHistory {
    /// Whether `id` may be restarted now under `policy`, and after which
    /// delay; a restart it allows is counted.
    pub fn next(&self, id: &InstanceId, policy: &RestartPolicy, now: Instant) -> Option<Duration> {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let recent = map.entry(id.clone()).or_default();
        recent.retain(|t| now.saturating_duration_since(*t) < policy.window);
        if recent.len() as u32 >= policy.max {
            return None;
        }
        let doublings = u32::try_from(recent.len()).unwrap_or(u32::MAX).min(16);
        let delay = policy.backoff.saturating_mul(1 << doublings).min(MAX_DELAY);
        recent.push(now);
        Some(delay)
    }

    /// Forgets `id` (deleted).
    pub fn forget(&self, id: &InstanceId) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).remove(id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_up_to_the_maximum_within_the_window() {
        let h = RestartHistory::default();
        let id = InstanceId::new("a");
        let p = RestartPolicy { max: 3, window: Duration::from_secs(60), backoff: Duration::from_millis(100) };
        let t0 = Instant::now();
        assert_eq!(h.next(&id, &p, t0), Some(Duration::from_millis(100)));
        assert_eq!(h.next(&id, &p, t0 + Duration::from_secs(1)), Some(Duration::from_millis(200)));
        assert_eq!(h.next(&id, &p, t0 + Duration::from_secs(2)), Some(Duration::from_millis(400)));
        assert_eq!(h.next(&id, &p, t0 + Duration::from_secs(3)), None, "three in a minute is the most");
        // At 61 s the first two restarts (0 s, 1 s) are out of the window;
        // one remains, so the delay is the second one's again.
        assert_eq!(h.next(&id, &p, t0 + Duration::from_secs(61)), Some(Duration::from_millis(200)));
        // Other instances have their own count.
        assert_eq!(h.next(&InstanceId::new("b"), &p, t0), Some(Duration::from_millis(100)));
    }

    #[test]
    fn max_zero_never_restarts_and_forget_resets() {
        let h = RestartHistory::default();
        let id = InstanceId::new("a");
        let never = RestartPolicy { max: 0, ..RestartPolicy::default() };
        assert_eq!(h.next(&id, &never, Instant::now()), None);
        let once = RestartPolicy { max: 1, ..RestartPolicy::default() };
        assert!(h.next(&id, &once, Instant::now()).is_some());
        assert!(h.next(&id, &once, Instant::now()).is_none());
        h.forget(&id);
        assert!(h.next(&id, &once, Instant::now()).is_some());
    }
}
