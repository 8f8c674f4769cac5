//! An operation the master asks for itself (a pool moving members off a
//! node it removes): sent to the cluster's actor as an operator's request
//! would be (a place in its mailbox, refused the same ways), then waited
//! for until it has ended.

use std::sync::Arc;
use std::time::Duration;

use super::{OpRequest, RunOperation};
use crate::actors::Shared;
use crate::error::Error;
use crate::storage::records::OperationRecord;

/// How often a running operation is looked at.
const POLL: Duration = Duration::from_millis(250);
/// The longest it is waited for (its steps have watchdogs of their own);
/// past it, the caller hears `unavailable` and may ask again.
const PATIENCE: Duration = Duration::from_secs(6 * 3600);

/// Runs `req` on cluster `name`; the operation once it has ended (whatever
/// its outcome), or why it never started.
pub async fn run_to_end(shared: &Shared, name: &str, req: OpRequest) -> Result<Arc<OperationRecord>, Error> {
    let handle = shared.registry.get(name).ok_or_else(|| Error::not_found("cluster", name))?;
    let slot = handle.reserve(shared.limits.cluster_mailbox)?;
    let op = handle
        .addr
        .send(RunOperation(req, slot, None))
        .await
        .map_err(|_| Error::unavailable(format!("cluster {name}'s actor stopped before it took the request")))??;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let mut wait = POLL;
    while tokio::time::Instant::now() < deadline {
        if !shared.read_model.running_operations().contains_key(&op.id) {
            let (rm, id) = (shared.read_model.clone(), op.id);
            // A read that fails is tried again (backing off): the operation ran.
            match tokio::task::spawn_blocking(move || rm.operation(&id)).await {
                Ok(Ok(Some(done))) if done.status.is_terminal() => return Ok(done),
                Ok(Err(e)) => {
                    tracing::warn!(operation = %id, error = %e, "reading an ended operation failed; again");
                    wait = (wait * 2).min(Duration::from_secs(10));
                }
                Err(e) => {
                    tracing::warn!(operation = %id, error = %e, "reading an ended operation failed; again");
                    wait = (wait * 2).min(Duration::from_secs(10));
                }
                _ => {}
            }
        }
        tokio::time::sleep(wait).await;
    }
    Err(Error::unavailable(format!(
        "operation {} on cluster {name} did not end within {} h",
        op.id,
        PATIENCE.as_secs() / 3600
    )))
}
