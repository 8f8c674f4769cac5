//! The operator's verbs on the supervision tree (Erlang's observer):
//! `POST /actors/{kind}/{id}/kill` stops an actor as if it failed, and its
//! supervisor acts on it by its child spec; `POST /actors/{kind}/{id}/restart`
//! brings a given-up (`failed`) one back. The tree itself is `GET /actors`
//! (`status.rs`).

use actix_web::{HttpResponse, web};

use super::AppState;
use super::ask::ask;
use super::error::ApiError;
use crate::actors::supervisor::{ActorVerb, ActorVerbAnswer, Verb};

async fn verb(state: &AppState, kind: String, id: String, verb: Verb) -> Result<HttpResponse, ApiError> {
    let slot = state.reserve_supervisor()?;
    let limit = state.shared.limits.request_take_limit;
    let answer: ActorVerbAnswer =
        ask(&state.supervisor, slot, limit, |slot| ActorVerb { kind, id, verb, slot }).await??;
    Ok(HttpResponse::Ok().json(answer))
}

/// Kill an actor
///
/// Stops the actor (`cluster/{name}`, `instance/{id}`, `node_manager/{node}`,
/// or a task: `agent_listener/agent_listener`, `node_watcher/node_watcher`,
/// `leaked_sweep/leaked_sweep`) as if it failed, "killed by the operator":
/// its supervisor restarts it by its child spec (`strategy` in `GET
/// /actors`), or gives it up past its intensity. An instance actor is one
/// group with its cluster's actor (one_for_all): both fail, and are
/// restarted together. The root's children whose death ends the master
/// (`supervisor`, `store_writer`) are refused with `409`.
#[utoipa::path(post, path = "/api/v1/actors/{kind}/{id}/kill", operation_id = "kill_actor", tag = "status",
    params(("kind" = String, Path), ("id" = String, Path)),
    responses(
        (status = 200, description = "Killed; what happens now", body = ActorVerbAnswer),
        (status = 404, response = super::error::NotFound),
        (status = 409, response = super::error::Conflict)))]
pub async fn kill(state: web::Data<AppState>, path: web::Path<(String, String)>) -> Result<HttpResponse, ApiError> {
    let (kind, id) = path.into_inner();
    verb(&state, kind, id, Verb::Kill).await
}

/// Restart a failed actor
///
/// Starts a given-up cluster actor (state `failed`) again from its stored
/// records, with its restart intensity reset; its cluster stays `Error`
/// until an operation (`start`) makes it `Active`. `409` for an actor that
/// is not failed.
#[utoipa::path(post, path = "/api/v1/actors/{kind}/{id}/restart", operation_id = "restart_actor", tag = "status",
    params(("kind" = String, Path), ("id" = String, Path)),
    responses(
        (status = 200, description = "Started again", body = ActorVerbAnswer),
        (status = 404, response = super::error::NotFound),
        (status = 409, response = super::error::Conflict)))]
pub async fn restart(state: web::Data<AppState>, path: web::Path<(String, String)>) -> Result<HttpResponse, ApiError> {
    let (kind, id) = path.into_inner();
    verb(&state, kind, id, Verb::Restart).await
}
