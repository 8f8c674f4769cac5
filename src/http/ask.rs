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

/// Why an actor gave no answer to a request.
#[derive(Debug, Clone, Copy)]
pub(super) enum Unanswered {
    /// Not taken within the limit: the actor drops it; nothing was done.
    Late(Duration),
    /// The actor stopped (failed, or was killed) with the request still in
    /// its mailbox: nothing was done, and its successor may take it again.
    Dropped,
    /// The actor stopped while handling the request: its answer is lost.
    Failed,
}

impl Unanswered {
    /// How an actor that stopped left the request its caller holds `claim` of.
    pub(super) fn gone(claim: &Claim) -> Unanswered {
        if claim.abandon() { Unanswered::Dropped } else { Unanswered::Failed }
    }
}

impl From<Unanswered> for ApiError {
    fn from(u: Unanswered) -> ApiError {
        match u {
            Unanswered::Late(limit) => not_taken(limit),
            Unanswered::Dropped => ApiError(Error::unavailable(
                "the actor stopped (it failed or was killed) before it took the request; its supervisor restarts it \
                 (GET /api/v1/actors); nothing was done, retry",
            )),
            Unanswered::Failed => ApiError(Error::unavailable(
                "the actor stopped (it failed or was killed) while it handled the request, so its answer is lost \
                 (GET /api/v1/actors says why); check what the request would have changed before retrying",
            )),
        }
    }
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
) -> Result<M::Result, Unanswered>
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
/// has not taken the request (`claim`), gives up ([`Unanswered::Late`]).
pub(super) async fn taken_within<T>(
    answer: impl Future<Output = Result<T, MailboxError>>,
    claim: &Claim,
    limit: Duration,
) -> Result<T, Unanswered> {
    tokio::pin!(answer);
    match tokio::time::timeout(limit, &mut answer).await {
        Ok(r) => r.map_err(|_| Unanswered::gone(claim)),
        Err(_) if claim.abandon() => Err(Unanswered::Late(limit)),
        Err(_) => answer.await.map_err(|_| Unanswered::gone(claim)),
    }
}
