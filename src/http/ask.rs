//! An API request's wait for its actor. The actor must take the request
//! within `request_take_limit` (master config, 30 s by default); past it
//! the caller is answered `503` ("not taken ... nothing was done") and the
//! actor, when it gets to the request, drops it. A [`Claim`] decides which
//! of the two came first, so a request answered "nothing was done" never
//! runs, and one the actor took is awaited to its answer (whose own waits
//! have deadlines: a store write by `store_stall_limit`, agent commands by
//! theirs).

use std::future::Future;
use std::time::Duration;

use actix::dev::ToEnvelope;
use actix::prelude::*;

use super::error::ApiError;
use crate::actors::read_model::{Claim, Reservation};
use crate::error::Error;

/// The actor is gone (stopped, or dropped the message unanswered).
pub(super) fn mailbox(e: MailboxError) -> ApiError {
    ApiError(Error::unavailable(format!("actor unavailable: {e}")))
}

/// The answer to a request its actor did not take within `limit`.
pub(super) fn not_taken(limit: Duration) -> ApiError {
    ApiError(Error::unavailable(format!(
        "the actor did not take the request within {}s (it is busy or stuck: GET /api/v1/actors shows what it \
         handles); nothing was done, retry",
        limit.as_secs_f64()
    )))
}

/// Sends the message `make` builds around `slot` to `addr`, and waits for
/// its answer, as the module says.
pub(super) async fn ask<A, M>(
    addr: &Addr<A>,
    slot: Reservation,
    limit: Duration,
    make: impl FnOnce(Reservation) -> M,
) -> Result<M::Result, ApiError>
where
    A: Handler<M>,
    A::Context: ToEnvelope<A, M>,
    M: Message + Send + 'static,
    M::Result: Send,
{
    let (slot, claim) = slot.claimable();
    taken_within(addr.send(make(slot)), &claim, limit).await
}

/// Waits for `answer`; when it has not come within `limit` and the actor
/// has not taken the request (`claim`), gives up with [`not_taken`].
pub(super) async fn taken_within<T>(
    answer: impl Future<Output = Result<T, MailboxError>>,
    claim: &Claim,
    limit: Duration,
) -> Result<T, ApiError> {
    tokio::pin!(answer);
    match tokio::time::timeout(limit, &mut answer).await {
        Ok(r) => r.map_err(mailbox),
        Err(_) if claim.abandon() => Err(not_taken(limit)),
        Err(_) => answer.await.map_err(mailbox),
    }
}
