//! `POST /nodes/{id}/cordon` and `/uncordon`: a node out of placement and
//! back (`actors::cordons`). `flotilla node cordon|uncordon` call these.

use actix_web::{HttpResponse, web};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::AppState;
use super::dto::CordonDto;
use super::error::ApiError;
use crate::ids::NodeId;

/// `POST /nodes/{id}/cordon` (the body may be left out).
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({ "reason": "disk errors; draining by hand" }))]
pub struct CordonBody {
    /// Why (at most 500 characters), shown with the node.
    #[serde(default)]
    pub reason: String,
}

/// A node's cordon after the request.
#[derive(Debug, Serialize, ToSchema)]
pub struct CordonAnswer {
    pub node: String,
    /// `null` after an uncordon.
    pub cordon: Option<CordonDto>,
    /// Whether this request changed it (an uncordon of a node not cordoned does not).
    pub changed: bool,
}

/// Cordons a node
///
/// No new instance is placed on it (a create or scale-out goes to the
/// other nodes; one pinned to it is refused); what runs there stays.
/// Cordoning it again keeps its time and takes the new reason.
#[utoipa::path(post, path = "/api/v1/nodes/{id}/cordon", operation_id = "cordon_node", tag = "nodes",
    params(("id" = String, Path, description = "The node's id")),
    request_body(content = Option<CordonBody>),
    responses(
        (status = 200, description = "Cordoned", body = CordonAnswer),
        (status = 400, response = super::error::BadRequest),
        (status = 404, response = super::error::NotFound),
        (status = 503, response = super::error::Unavailable)))]
pub async fn cordon(
    state: web::Data<AppState>,
    id: web::Path<String>,
    body: web::Bytes,
) -> Result<HttpResponse, ApiError> {
    let node = NodeId::new(id.into_inner());
    // No body is no reason; a body must be a `CordonBody` (an optional
    // `web::Json` would take a malformed one for none).
    let reason = if body.iter().all(u8::is_ascii_whitespace) {
        String::new()
    } else {
        let b: CordonBody = serde_json::from_slice(&body)
            .map_err(|e| crate::error::Error::invalid("invalid_request", format!("body: {e}")))?;
        b.reason
    };
    let shared = &state.shared;
    let record = state.cordons.cordon(&shared.store, &shared.read_model, &node, &reason).await?;
    tracing::warn!(%node, reason = %record.reason, "node cordoned");
    let answer = CordonAnswer { node: node.to_string(), cordon: Some((&record).into()), changed: true };
    Ok(HttpResponse::Ok().json(answer))
}

/// Uncordons a node
///
/// It takes new instances again.
#[utoipa::path(post, path = "/api/v1/nodes/{id}/uncordon", operation_id = "uncordon_node", tag = "nodes",
    params(("id" = String, Path, description = "The node's id")),
    responses(
        (status = 200, description = "Uncordoned (or was not cordoned)", body = CordonAnswer),
        (status = 404, response = super::error::NotFound),
        (status = 503, response = super::error::Unavailable)))]
pub async fn uncordon(state: web::Data<AppState>, id: web::Path<String>) -> Result<HttpResponse, ApiError> {
    let node = NodeId::new(id.into_inner());
    let shared = &state.shared;
    let changed = state.cordons.uncordon(&shared.store, &shared.read_model, &node).await?;
    if changed {
        tracing::warn!(%node, "node uncordoned");
    }
    Ok(HttpResponse::Ok().json(CordonAnswer { node: node.to_string(), cordon: None, changed }))
}
