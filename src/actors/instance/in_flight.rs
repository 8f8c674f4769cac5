//! The commands a cluster's instance actors have queued or running. A step
//! the watchdog fails stops waiting for its commands but does not cancel
//! them (each finishes, or meets its own deadline, in its instance's turn);
//! the cluster's next operation starts its steps only once they have
//! ended, so it never acts while an earlier operation's command may still
//! change what an agent holds.

use std::cell::Cell;
use std::rc::Rc;
use std::time::Duration;

use crate::actors::read_model::ActorStats;

/// How long an operation waits for them at most. Each has its own deadline
/// (a reply's, an install's progress), so this only bounds a defect; past
/// it the operation goes on, its commands queued behind theirs on each
/// instance.
pub const DRAIN_LIMIT: Duration = Duration::from_secs(600);

/// The count, shared by a cluster's instance actors (one thread).
#[derive(Default, Clone)]
pub struct InFlight(Rc<Inner>);

#[derive(Default)]
struct Inner {
    count: Cell<usize>,
    idle: tokio::sync::Notify,
}

/// One command counted until it is dropped (answered, failed, or dropped
/// with its task).
pub struct Entered(Rc<Inner>);

impl Drop for Entered {
    fn drop(&mut self) {
        let n = self.0.count.get() - 1;
        self.0.count.set(n);
        if n == 0 {
            self.0.idle.notify_waiters();
        }
    }
}

impl InFlight {
    /// Counts a command from now until the returned guard drops.
    pub fn enter(&self) -> Entered {
        self.0.count.set(self.0.count.get() + 1);
        Entered(self.0.clone())
    }

    pub fn count(&self) -> usize {
        self.0.count.get()
    }

    /// Waits until no command is counted, at most `limit`; whether none is.
    pub async fn drained(&self, limit: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            // Registered before the count is read: a drop in between wakes it.
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
        tokio::task::LocalSet::new().run_until(drains()).await;
    }

    async fn drains() {
        let f = InFlight::default();
        assert!(f.drained(Duration::ZERO).await, "nothing counted");
        let (a, b) = (f.enter(), f.enter());
        assert!(!f.drained(Duration::from_millis(20)).await, "two counted");
        drop(a);
        let waiter = f.clone();
        let wait = tokio::task::spawn_local(async move { waiter.drained(Duration::from_secs(5)).await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!wait.is_finished(), "one still counted");
        drop(b);
        assert!(wait.await.unwrap(), "the last one ended");
    }
}
