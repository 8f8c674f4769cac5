//! The commands a cluster's instance actors have queued or running. A step
//! the watchdog fails stops waiting for its commands but does not cancel
//! them (each finishes, or meets its own deadline, in its instance's turn);
//! the cluster's next operation starts its steps only once they have
//! ended, so it never acts while an earlier operation's command may still
//! change what an agent holds. The count is kept per cluster outside its
//! actor ([`InFlights`]): a restarted actor's first operation waits for
//! what its dead predecessor's commands still do.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::actors::read_model::ActorStats;
use crate::ids::ClusterId;

/// How long an operation waits for them at most. Each has its own deadline
/// (a reply's, an install's progress), so this only bounds a defect; past
/// it the operation goes on, its commands queued behind theirs on each
/// instance.
pub const DRAIN_LIMIT: Duration = Duration::from_secs(600);

/// Each cluster's count, by cluster id, for as long as the cluster exists.
#[derive(Default, Clone)]
pub struct InFlights(Arc<Mutex<HashMap<ClusterId, InFlight>>>);

impl InFlights {
    /// Cluster `id`'s count (made at its first actor's start).
    pub fn of(&self, id: ClusterId) -> InFlight {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).entry(id).or_default().clone()
    }

    /// The cluster is deleted.
    pub fn forget(&self, id: &ClusterId) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).remove(id);
    }
}

/// The count of one cluster's commands.
#[derive(Default, Clone)]
pub struct InFlight(Arc<Inner>);

#[derive(Default)]
struct Inner {
    count: AtomicUsize,
    idle: tokio::sync::Notify,
}

/// One command counted until it is dropped (answered, failed, or dropped
/// with its task).
pub struct Entered(Arc<Inner>);

impl Drop for Entered {
    fn drop(&mut self) {
        if self.0.count.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

impl InFlight {
    /// Counts a command from now until the returned guard drops.
    pub fn enter(&self) -> Entered {
        self.0.count.fetch_add(1, Ordering::SeqCst);
        Entered(self.0.clone())
    }

    pub fn count(&self) -> usize {
        self.0.count.load(Ordering::SeqCst)
    }

    /// Waits until no command is counted, at most `limit`; whether none is.
    pub async fn drained(&self, limit: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            // Made before the count is read: a last drop in between
            // (`notify_waiters`) wakes it even before it is polled.
            let idle = self.0.idle.notified();
            if self.count() == 0 {
                return true;
            }
            if tokio::time::timeout_at(deadline, idle).await.is_err() {
                return self.count() == 0;
            }
        }
    }

    /// Before operation `operation`'s first step: waits for the commands
    /// an earlier operation left running (see the module's doc), saying so
    /// in the cluster actor's state.
    pub async fn before_operation(&self, operation: &crate::ids::OperationId, stats: &ActorStats) {
        let left = self.count();
        if left == 0 {
            return;
        }
        tracing::info!(%operation, commands = left, "waiting for the commands an earlier operation left running");
        let state = stats.state();
        stats.set_state(format!("waiting for the commands an earlier operation left running ({left})"));
        if !self.drained(DRAIN_LIMIT).await {
            tracing::warn!(%operation, commands = self.count(), limit = ?DRAIN_LIMIT, "commands of an earlier operation still run; going on, behind them on each instance");
        }
        stats.set_state(state);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn drained_waits_for_the_last_command() {
        let f = InFlight::default();
        assert!(f.drained(Duration::ZERO).await, "nothing counted");
        let (a, b) = (f.enter(), f.enter());
        assert!(!f.drained(Duration::from_millis(20)).await, "two counted");
        drop(a);
        let waiter = f.clone();
        let wait = tokio::spawn(async move { waiter.drained(Duration::from_secs(5)).await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!wait.is_finished(), "one still counted");
        drop(b);
        assert!(wait.await.unwrap(), "the last one ended");
    }

    #[test]
    fn a_clusters_count_outlives_its_actor_until_the_cluster_is_deleted() {
        let all = InFlights::default();
        let id = ClusterId::random();
        let _left = all.of(id).enter();
        assert_eq!(all.of(id).count(), 1, "the next actor of the cluster sees it");
        all.forget(&id);
        assert_eq!(all.of(id).count(), 0);
    }
}
