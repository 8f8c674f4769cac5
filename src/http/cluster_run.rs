//! A mutation's trip to its cluster's actor. It is answered `202` once its
//! operation is journaled (from the store's answer: the actor's thread may
//! be busy with other clusters long after), or with the actor's refusal.
//!
//! An actor that stops (a panic, the operator's kill) with the request
//! still in its mailbox has done nothing with it: the request is sent again
//! to the actor its supervisor starts in its place, within the request's
//! `request_take_limit`, so a restart under a request costs the caller a
//! wait, not a `503`. One that stops while handling it is not sent it again
//! (the request may be what made it fail): the caller hears what is known.

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix_web::HttpResponse;

use super::AppState;
use super::ask::{Unanswered, ask, not_taken};
use super::dto::{OperationDto, OperationEnvelope};
use super::error::ApiError;
use crate::actors::cluster::{Accepted, OpRequest, Preview, RunOperation};
use crate::actors::read_model::Reservation;
use crate::actors::registry::ClusterHandle;
use crate::error::Error;
use crate::storage::records::OperationRecord;

/// How often a request waiting for a restarted actor looks for it.
const SUCCESSOR_POLL: Duration = Duration::from_millis(20);

/// At most this many sends of one request: its actor's restart intensity
/// (3 in 60 s, then given up) bounds it too, this makes it strict.
const MAX_SENDS: usize = 4;

pub(super) fn accepted(op: &OperationRecord) -> HttpResponse {
    HttpResponse::Accepted().json(OperationEnvelope { operation: OperationDto::from(op) })
}

/// The cluster's actor, with a place reserved in its mailbox.
fn cluster_actor(state: &AppState, name: &str) -> Result<(ClusterHandle, Reservation), ApiError> {
    let handle = state.shared.registry.get(name).ok_or_else(|| ApiError(Error::not_found("cluster", name)))?;
    let slot = handle.reserve(state.shared.limits.cluster_mailbox)?;
    Ok((handle, slot))
}

/// Runs `req` on cluster `name` (or previews it), as the module says.
pub(super) async fn run(state: &AppState, name: &str, req: OpRequest, dry_run: bool) -> Result<HttpResponse, ApiError> {
    let limit = state.shared.limits.request_take_limit;
    let deadline = Instant::now() + limit;
    let upgrade = matches!(req, OpRequest::Upgrade { .. });
    let (mut cluster, mut sent) = (None, 0);
    loop {
        sent += 1;
        let (handle, slot) = cluster_actor(state, name)?;
        // Sent again only to the same cluster's new actor, never to a
        // cluster of the same name created meanwhile.
        if *cluster.get_or_insert(handle.cluster) != handle.cluster {
            return Err(ApiError(Error::not_found("cluster", name)));
        }
        // A successor found late still gets a moment to take the request.
        let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_secs(1));
        let answered = if dry_run {
            ask(&handle.addr, slot, left, |slot| Preview(req.clone(), slot))
                .await
                .map(|preview| preview.map(|p| HttpResponse::Ok().json(p)).map_err(ApiError))
        } else {
            send(&handle, slot, req.clone(), left).await
        };
        match answered {
            Ok(answer) => return answer,
            Err(Unanswered::Dropped) if sent < MAX_SENDS => successor(state, name, &handle, deadline, limit).await?,
            // Its cluster deleted meanwhile: the actor stops once the delete
            // has ended (the name freed first), dropping what it had taken.
            Err(Unanswered::Failed) if state.shared.registry.get(name).is_none_or(|h| h.cluster != handle.cluster) => {
                return Err(ApiError(Error::not_found("cluster", name)));
            }
            Err(Unanswered::Failed) => return Err(failed_handling(name, upgrade, dry_run)),
            // The caller waited the whole limit, whatever this try had left.
            Err(Unanswered::Late(_)) => return Err(not_taken(limit)),
            Err(u) => return Err(u.into()),
        }
    }
}

/// One try: the operation answered as soon as it is durable, unless the
/// actor keeps the answer until it has published (an upgrade).
async fn send(
    handle: &ClusterHandle,
    slot: Reservation,
    req: OpRequest,
    limit: Duration,
) -> Result<Result<HttpResponse, ApiError>, Unanswered> {
    let (early, mut handed) = tokio::sync::oneshot::channel();
    let (slot, claim) = slot.claimable();
    let answer = handle.addr.send(RunOperation(req, slot, Some(early)));
    tokio::pin!(answer);
    let expired = tokio::time::sleep(limit);
    tokio::pin!(expired);
    let mut taken = false;
    let handed = loop {
        tokio::select! {
            // First when both are ready: an actor that stopped after sending
            // the writes answers a mailbox error, yet the operation is durable.
            biased;
            handed = &mut handed => break handed,
            // Refused before it was built (busy, invalid, ...): the answer says why.
            answered = &mut answer => {
                let op = answered.map_err(|_| Unanswered::gone(&claim))?;
                return Ok(op.map(|op| accepted(&op)).map_err(ApiError));
            }
            // Not taken in time: nothing was done (the actor drops it);
            // taken: its answer is awaited.
            () = &mut expired, if !taken => {
                if claim.abandon() {
                    return Err(Unanswered::Late(limit));
                }
                taken = true;
            }
        }
    };
    match handed {
        Ok(Accepted { op, durable }) => Ok(durable.await.map(|()| accepted(&op)).map_err(ApiError)),
        // The actor answers itself (a refusal, an upgrade), or dropped the
        // request with its sender.
        Err(_) => {
            let op = answer.await.map_err(|_| Unanswered::gone(&claim))?;
            Ok(op.map(|op| accepted(&op)).map_err(ApiError))
        }
    }
}

/// Waits until the supervisor has started a successor of the actor in
/// `dead` (which stopped before taking a request), until `deadline`.
async fn successor(
    state: &AppState,
    name: &str,
    dead: &ClusterHandle,
    deadline: Instant,
    limit: Duration,
) -> Result<(), ApiError> {
    loop {
        let now = state.shared.registry.get(name).ok_or_else(|| ApiError(Error::not_found("cluster", name)))?;
        if let Some(e) = now.given_up() {
            return Err(ApiError(e));
        }
        if !Arc::ptr_eq(&now.stats, &dead.stats) && now.addr.connected() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(ApiError(Error::unavailable(format!(
                "the actor of cluster {name} stopped before it took the request and was not running again within \
                 {}s (GET /api/v1/actors says why); nothing was done, retry",
                limit.as_secs_f64()
            ))));
        }
        tokio::time::sleep(SUCCESSOR_POLL).await;
    }
}

/// The answer when the cluster's actor stopped while handling a request.
fn failed_handling(name: &str, upgrade: bool, dry_run: bool) -> ApiError {
    let what = if dry_run {
        "a preview changes nothing; retry once the actor runs again".to_string()
    } else if upgrade {
        // Answered once published: its write may have landed.
        format!("the upgrade may have been journaled: GET /api/v1/operations?cluster={name} shows whether it began")
    } else {
        // Every other request is handed over before its write begins, and
        // this one was not: nothing of it was journaled.
        "nothing of it was journaled; retry once the actor runs again".to_string()
    };
    ApiError(Error::unavailable(format!(
        "the actor of cluster {name} stopped (it failed or was killed) while it handled the request; its \
         supervisor restarts it (GET /api/v1/actors says why); {what}"
    )))
}
