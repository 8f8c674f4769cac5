//! How a cluster's writes reach the store: tried again while they fail
//! (a few times for the journal, until they land for what must never be
//! only logged), and the cluster record built from the record as it is.

use std::time::Duration;

use time::OffsetDateTime;

use crate::actors::Shared;
use crate::storage::records::ClusterRecord;
use crate::storage::{WriteOp, events};

/// How long a failed journal write waits before each new try: a moment's
/// trouble passes, a store that stays broken stops the operation soon.
pub(super) const JOURNAL_RETRIES: [Duration; 3] =
    [Duration::from_millis(100), Duration::from_millis(500), Duration::from_secs(2)];

/// How long a failed write of what the boot decided waits before each new try.
pub(crate) const END_RETRIES: [Duration; 3] = [Duration::from_secs(1), Duration::from_secs(2), Duration::from_secs(4)];

/// The longest wait between two tries of a write that must land.
const LAND_BACKOFF_MAX: Duration = Duration::from_secs(5);

/// Commits the writes `build` makes, tried again with backoff (100 ms,
/// doubling, at most [`LAND_BACKOFF_MAX`]) until they land: for what must
/// never be only logged (a member's failure with its cluster's `Error`, an
/// operation's end). Built again for each try, from the state then, so a
/// try never writes a copy older than a write that landed meanwhile. Gives
/// up only when the store is frozen (the master is shutting down: the next
/// one resumes from the journal), or the writer is gone, or the store has
/// failed every try for `store_stall_limit`: then the master exits with
/// that cause, instead of piling up work it can never record.
pub(crate) async fn commit_until_landed(
    shared: &Shared,
    what: &str,
    mut build: impl FnMut() -> Result<Vec<WriteOp>, String>,
) -> Result<(), String> {
    let mut wait = Duration::from_millis(100);
    // Counted from the first refusal: a first try that waited its turn
    // behind a long backlog was not refused.
    let mut refused_since: Option<std::time::Instant> = None;
    loop {
        let ops = build()?;
        match shared.store.commit(ops).await {
            Ok(()) => return Ok(()),
            Err(e @ crate::storage::StorageError::Frozen) => return Err(crate::error::ErrorChain(&e).to_string()),
            Err(e @ crate::storage::StorageError::WriterGone) => {
                // The store's writer thread died: nothing can be recorded
                // any more. The master exits (its child spec says so).
                let cause =
                    format!("the store's writer is gone ({}) while recording {what}", crate::error::ErrorChain(&e));
                shared.tasks.fatal(cause.clone());
                return Err(cause);
            }
            Err(e) if refused_since.is_some_and(|t| t.elapsed() >= shared.limits.store_stall_limit) => {
                let cause = format!(
                    "the store has refused {what} for {}s (store_stall_limit): {}",
                    refused_since.map(|t| t.elapsed().as_secs()).unwrap_or_default(),
                    crate::error::ErrorChain(&e)
                );
                shared.tasks.fatal(cause.clone());
                return Err(cause);
            }
            Err(e) => {
                refused_since.get_or_insert_with(std::time::Instant::now);
                tracing::error!(error = %crate::error::ErrorChain(&e), "cannot record {what}; trying again in {wait:?}");
                metrics::counter!("flotilla_write_retries_total").increment(1);
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(LAND_BACKOFF_MAX);
            }
        }
    }
}

/// Commits `ops`, trying again after each of `waits` while it fails; a
/// frozen store (the master is shutting down) is not tried again.
pub(crate) async fn commit_retrying(
    shared: &Shared,
    ops: Vec<WriteOp>,
    waits: &[Duration],
    what: &str,
) -> Result<(), crate::storage::StorageError> {
    let mut written = shared.store.commit(ops.clone()).await;
    for wait in waits {
        match &written {
            Ok(()) | Err(crate::storage::StorageError::Frozen) => break,
            Err(e) => {
                tracing::error!(error = %crate::error::ErrorChain(e), "cannot record {what}; trying again in {wait:?}");
                tokio::time::sleep(*wait).await;
                written = shared.store.commit(ops.clone()).await;
            }
        }
    }
    written
}

/// The cluster record `current` changed by `change`, and the writes that
/// store it (with its `cluster.changed` event when its status changed).
pub(super) fn cluster_writes(
    current: &ClusterRecord,
    change: &impl Fn(&mut ClusterRecord),
) -> Result<(ClusterRecord, Vec<WriteOp>), String> {
    let mut snapshot = current.clone();
    change(&mut snapshot);
    snapshot.updated_at = OffsetDateTime::now_utc();
    let mut ops = vec![WriteOp::put_cluster(&snapshot).map_err(|e| e.to_string())?];
    if let Some(e) = events::cluster_changed(current, &snapshot) {
        ops.push(events::append(&e).map_err(|e| e.to_string())?);
    }
    Ok((snapshot, ops))
}

/// The cluster record's writes by a running operation (in turn with the
/// actor's other record writes: `record_writes`).
impl super::ops::ClusterOps {
    /// Changes a copy of the cluster record, persists it, then applies the
    /// same change to the record and publishes what was written: a write
    /// that fails changes nothing. The change is applied to the record as
    /// it is then, never by putting the copy back: a request handled
    /// meanwhile (a scale-out counting its ordinals, the busy mark) keeps
    /// what it changed.
    pub async fn save_cluster(&self, change: impl Fn(&mut ClusterRecord)) -> Result<(), String> {
        let _turn = self.env.record_writes.lock().await;
        let (snapshot, ops) = cluster_writes(&self.core.borrow().record, &change)?;
        self.shared.store.commit(ops).await.map_err(|e| crate::error::ErrorChain(&e).to_string())?;
        self.saved(change, Some(snapshot));
        Ok(())
    }

    /// [`save_cluster`](Self::save_cluster) with `extra` writes in the same
    /// batch, tried until it lands ([`commit_until_landed`]).
    pub async fn save_cluster_until_landed(
        &self,
        change: impl Fn(&mut ClusterRecord),
        extra: impl Fn() -> Result<Vec<WriteOp>, String>,
        what: &str,
    ) -> Result<(), String> {
        let _turn = self.env.record_writes.lock().await;
        let mut written = None;
        commit_until_landed(&self.shared, what, || {
            let (snapshot, mut ops) = cluster_writes(&self.core.borrow().record, &change)?;
            ops.extend(extra()?);
            written = Some(snapshot);
            Ok(ops)
        })
        .await?;
        self.saved(change, written);
        Ok(())
    }

    /// A cluster write landed: `change` applied to the record as it is now,
    /// and what was written published.
    /// Neither applied nor published when an operation was accepted
    /// meanwhile: what was written is older than the busy mark readers will
    /// see from that operation's own write (which lands after it), and
    /// the operation's end judges what it said.
    fn saved(&self, change: impl Fn(&mut ClusterRecord), written: Option<ClusterRecord>) {
        let Some(written) = written else { return };
        let taken = {
            let mut core = self.core.borrow_mut();
            let taken = core.record.operation != written.operation;
            if !taken {
                change(&mut core.record);
                core.record.updated_at = written.updated_at;
            }
            taken
        };
        if !taken {
            self.env.cell.set_record(written);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::commit_until_landed;
    use crate::actors::test_support::Harness;

    /// A store that refuses every write does not hold a write that must
    /// land forever: past `store_stall_limit` the master is told to exit,
    /// with the cause.
    #[tokio::test]
    async fn a_write_the_store_keeps_refusing_ends_the_master_past_the_limit() {
        let h = Harness::new();
        let mut shared = h.shared.clone();
        shared.limits.store_stall_limit = Duration::from_millis(500);
        h.store.fail(usize::MAX, |_| true);
        let began = Instant::now();
        let ops = || Ok(vec![crate::storage::WriteOp::Delete { cf: "clusters", key: b"x".to_vec() }]);
        let err = commit_until_landed(&shared, "a member's failure", ops).await.expect_err("it never landed");
        assert!(began.elapsed() >= Duration::from_millis(500), "gave up after {:?}", began.elapsed());
        assert!(err.contains("refused a member's failure") && err.contains("store_stall_limit"), "{err}");
        assert_eq!(shared.tasks.fatal_cause().as_deref(), Some(err.as_str()), "the master was not told to exit");
        assert!(h.store.refused.load(std::sync::atomic::Ordering::SeqCst) >= 2, "it was not tried again");
    }
}
