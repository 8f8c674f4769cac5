//! The restart policy for instances whose process exits without being asked
//! to (DESIGN.md §12): the agent starts them again, after a delay that
//! doubles with each restart, at most `max` times within `window`; past
//! that they stay down and the master marks them Failed. What the operator
//! stopped is never restarted (the exit watcher only acts while the
//! instance's desired state is running).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::node::Node;
use crate::ids::InstanceId;
use crate::protocol::messages::{AgentEvent, AgentResponse, FailureKind};
use crate::storage::agent_records::PidIdentity;

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

impl Node {
    /// Watches a started process and reports an exit nobody asked for.
    pub(super) fn watch(self: &Arc<Self>, id: InstanceId, identity: PidIdentity) {
        let node = self.clone();
        let exit = self.processes.watch(&id, &identity);
        tokio::spawn(async move {
            let info = exit.await;
            let slot = node.slot(&id);
            let mut guard = slot.lock("restart").await;
            let Some(rec) = guard.as_mut() else { return };
            if rec.pid.as_ref() != Some(&identity) {
                return; // a newer process, or stopped already
            }
            rec.pid = None;
            let unexpected = rec.desired_running && !node.closing.load(std::sync::atomic::Ordering::SeqCst);
            let r = rec.clone();
            drop(guard);
            let _ = node.persist(&r).await;
            if !unexpected {
                return;
            }
            let policy = *node.restart_policy.lock().unwrap_or_else(|p| p.into_inner());
            let restart_in = node.restarts.next(&id, &policy, tokio::time::Instant::now());
            tracing::warn!(instance = %id, pid = info.pid, code = ?info.exit_code, signal = ?info.signal, ?restart_in, "instance process exited unexpectedly");
            node.report(AgentEvent::ProcessExited {
                instance: id.clone(),
                pid: info.pid,
                exit_code: info.exit_code,
                signal: info.signal,
                stderr_tail: info.stderr_tail,
                restart_in_ms: restart_in.map(|d| d.as_millis() as u64),
            });
            if let Some(delay) = restart_in {
                tokio::time::sleep(delay).await;
                if let Some(event) = node.restart_after_crash(&id).await {
                    node.report(event);
                }
            }
        });
    }

    /// Starts a crashed instance again, unless it is no longer wanted
    /// running (a stop, a delete) or runs already (a start got in first):
    /// then `None`. Other commands meanwhile (a hook, new files) do not
    /// cancel the restart.
    async fn restart_after_crash(self: &Arc<Self>, id: &InstanceId) -> Option<AgentEvent> {
        let generation = {
            let slot = self.slot(id);
            let guard = slot.lock("restart check").await;
            let rec = guard.as_ref()?;
            if !rec.desired_running || rec.pid.is_some() || self.closing.load(std::sync::atomic::Ordering::SeqCst) {
                return None;
            }
            rec.generation
        };
        let (pid, error) = match self.start(id, generation).await {
            AgentResponse::Started { pid, .. } => {
                tracing::info!(instance = %id, pid, "restarted after an unexpected exit");
                (Some(pid), None)
            }
            // A newer command got in between: the operator's word wins.
            AgentResponse::Failed(f) if f.kind == FailureKind::StaleGeneration => return None,
            AgentResponse::Failed(f) => {
                let mut m = f.message;
                if !f.stderr_tail.trim().is_empty() {
                    m.push_str(&format!("; stderr: {}", f.stderr_tail.trim()));
                }
                (None, Some(m))
            }
            other => (None, Some(format!("unexpected answer to the restart: {other:?}"))),
        };
        Some(AgentEvent::ProcessRestarted { instance: id.clone(), pid, error })
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
