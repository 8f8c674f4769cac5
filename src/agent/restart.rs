//! The restart policy for instances whose process exits without being asked
//! to (DESIGN.md §12): the agent starts them again, after a delay that
//! doubles with each restart, at most `max` times within `window`; past
//! that they stay down and the master marks them Failed. What the operator
//! stopped is never restarted (the exit watcher only acts while the
//! instance's desired state is running).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::node::Node;
use crate::ids::InstanceId;
use crate::protocol::messages::{AgentEvent, AgentResponse, FailureKind};
use crate::storage::WriteOp;
use crate::storage::agent_records::{PidIdentity, RestartRecord};
use crate::storage::records::RECORD_VERSION;

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

/// Recent restarts per instance, by wall clock (unix ms). Each restart the
/// policy allows is persisted (`RestartRecord`) before it happens and
/// loaded again by `Node::recover`, so an agent restart does not forget
/// the restarts already spent: restart counts never go down, and an
/// instance crash-looping across agent restarts still gets at most `max`
/// within `window`.
#[derive(Debug, Default)]
pub struct RestartHistory(Mutex<HashMap<InstanceId, Vec<u64>>>);

/// Now, in unix milliseconds.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

impl RestartHistory {
    /// Whether `id` may be restarted at `now_ms` under `policy`, and after
    /// which delay; a restart it allows is counted. Also answers the
    /// restarts now in the window (to persist), oldest first. A time ahead
    /// of `now_ms` (the clock was set back) stays in the window: a clock
    /// change never hands out restarts.
    pub fn next(&self, id: &InstanceId, policy: &RestartPolicy, now_ms: u64) -> (Option<Duration>, Vec<u64>) {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let recent = map.entry(id.clone()).or_default();
        let window = u64::try_from(policy.window.as_millis()).unwrap_or(u64::MAX);
        recent.retain(|t| now_ms.saturating_sub(*t) < window);
        if recent.len() as u32 >= policy.max {
            return (None, recent.clone());
        }
        let doublings = u32::try_from(recent.len()).unwrap_or(u32::MAX).min(16);
        let delay = policy.backoff.saturating_mul(1 << doublings).min(MAX_DELAY);
        recent.push(now_ms);
        (Some(delay), recent.clone())
    }

    /// The restarts of `id` persisted by an earlier run of the agent.
    pub fn load(&self, id: &InstanceId, times_ms: Vec<u64>) {
        let mut times_ms = times_ms;
        times_ms.sort_unstable();
        self.0.lock().unwrap_or_else(|p| p.into_inner()).insert(id.clone(), times_ms);
    }

    /// How many restarts of `id` are remembered (in the window when last counted).
    pub fn count(&self, id: &InstanceId) -> usize {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).get(id).map_or(0, Vec::len)
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
            let (restart_in, recent) = node.restarts.next(&id, &policy, now_ms());
            // Durable before it happens: an agent killed from here on still
            // counts this restart when it comes back.
            let restart_in = match restart_in {
                Some(d) => match node.persist_restarts(&id, recent.clone()).await {
                    Ok(()) => Some(d),
                    Err(e) => {
                        tracing::error!(instance = %id, error = %e, "cannot record the restart; not restarting (a restart not recorded could be one too many)");
                        None
                    }
                },
                None => None,
            };
            tracing::warn!(instance = %id, pid = info.pid, code = ?info.exit_code, signal = ?info.signal, ?restart_in, restarts_in_window = recent.len(), max = policy.max, "instance process exited unexpectedly");
            node.report(AgentEvent::ProcessExited {
                instance: id.clone(),
                pid: info.pid,
                exit_code: info.exit_code,
                signal: info.signal,
                stderr_tail: info.stderr_tail,
                restart_in_ms: restart_in.map(|d| d.as_millis() as u64),
                attempt: u32::try_from(recent.len()).unwrap_or(u32::MAX),
                max_attempts: policy.max,
            });
            if let Some(delay) = restart_in {
                tokio::time::sleep(delay).await;
                if let Some(event) = node.restart_after_crash(&id).await {
                    node.report(event);
                }
            }
        });
    }

    /// Persists the restarts of `id` in the policy's window.
    async fn persist_restarts(&self, id: &InstanceId, times_ms: Vec<u64>) -> Result<(), String> {
        let r = RestartRecord { version: RECORD_VERSION, id: id.clone(), times_ms };
        let op = WriteOp::put_restarts(&r).map_err(|e| e.to_string())?;
        self.store.writer().commit(vec![op]).await.map_err(|e| e.to_string())
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
        let (pid, error) = match self.start_for_restart(id, generation).await {
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

    const T0: u64 = 1_700_000_000_000;

    #[test]
    fn delays_double_up_to_the_maximum_within_the_window() {
        let h = RestartHistory::default();
        let id = InstanceId::new("a");
        let p = RestartPolicy { max: 3, window: Duration::from_secs(60), backoff: Duration::from_millis(100) };
        assert_eq!(h.next(&id, &p, T0), (Some(Duration::from_millis(100)), vec![T0]));
        assert_eq!(h.next(&id, &p, T0 + 1000).0, Some(Duration::from_millis(200)));
        assert_eq!(h.next(&id, &p, T0 + 2000).0, Some(Duration::from_millis(400)));
        assert_eq!(h.next(&id, &p, T0 + 3000), (None, vec![T0, T0 + 1000, T0 + 2000]), "three in a minute is the most");
        // At 61 s the first two restarts (0 s, 1 s) are out of the window;
        // one remains, so the delay is the second one's again.
        assert_eq!(h.next(&id, &p, T0 + 61_000), (Some(Duration::from_millis(200)), vec![T0 + 2000, T0 + 61_000]));
        // Other instances have their own count.
        assert_eq!(h.next(&InstanceId::new("b"), &p, T0).0, Some(Duration::from_millis(100)));
    }

    #[test]
    fn max_zero_never_restarts_and_forget_resets() {
        let h = RestartHistory::default();
        let id = InstanceId::new("a");
        let never = RestartPolicy { max: 0, ..RestartPolicy::default() };
        assert_eq!(h.next(&id, &never, T0).0, None);
        let once = RestartPolicy { max: 1, ..RestartPolicy::default() };
        assert!(h.next(&id, &once, T0).0.is_some());
        assert!(h.next(&id, &once, T0).0.is_none());
        h.forget(&id);
        assert!(h.next(&id, &once, T0).0.is_some());
    }

    /// What an earlier run of the agent spent counts: loaded restarts in
    /// the window leave only the rest, and the delay goes on doubling.
    #[test]
    fn loaded_restarts_count_and_a_clock_set_back_hands_out_none() {
        let p = RestartPolicy { max: 3, window: Duration::from_secs(60), backoff: Duration::from_millis(100) };
        let id = InstanceId::new("a");
        let h = RestartHistory::default();
        h.load(&id, vec![T0 + 1000, T0]);
        assert_eq!(h.count(&id), 2);
        assert_eq!(h.next(&id, &p, T0 + 2000), (Some(Duration::from_millis(400)), vec![T0, T0 + 1000, T0 + 2000]));
        assert_eq!(h.next(&id, &p, T0 + 3000).0, None);
        // The clock set back an hour: the restarts "in the future" still count.
        let h = RestartHistory::default();
        h.load(&id, vec![T0, T0 + 1000, T0 + 2000]);
        assert_eq!(h.next(&id, &p, T0 - 3_600_000).0, None);
        // Old ones (out of the window) do not.
        h.load(&id, vec![T0 - 120_000, T0 - 90_000, T0 - 61_000]);
        assert_eq!(h.next(&id, &p, T0), (Some(Duration::from_millis(100)), vec![T0]));
    }
}
