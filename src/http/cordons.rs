//! `POST /nodes/{id}/cordon` and `/uncordon`: a node out of placement and
//! back (`actors::cordons`). `flotilla node cordon|uncordon` call these.

use actix_web::{HttpResponse, web};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::AppState;
use super::dto::CordonDto;
use super::error::ApiError;
use crate::ids::NodeId;

/// `POST /nodes/{id}/cordon` (`{}`: no reason).
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
    request_body = CordonBody,
    responses(
        (status = 200, description = "Cordoned", body = CordonAnswer),
        (status = 400, response = super::error::BadRequest),
        (status = 404, response = super::error::NotFound),
        (status = 413, response = super::error::TooLarge),
        (status = 503, response = super::error::Unavailable)))]
pub async fn cordon(
    state: web::Data<AppState>,
    id: web::Path<String>,
    body: web::Json<CordonBody>,
) -> Result<HttpResponse, ApiError> {
    let node = NodeId::new(id.into_inner());
    let record = state.cordons.cordon(&node, &body.reason).await?;
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
        (status = 409, response = super::error::Conflict),
        (status = 503, response = super::error::Unavailable)))]
pub async fn uncordon(state: web::Data<AppState>, id: web::Path<String>) -> Result<HttpResponse, ApiError> {
    let node = NodeId::new(id.into_inner());
    // A node its pool is removing stays out of placement until it is gone.
    if let Some(n) = state.pools.node(&node).filter(|n| n.removal.is_some()) {
        return Err(crate::error::Error::conflict(
            "node_being_removed",
            format!(
                "node {node} is {} for its removal ({}): it is not uncordoned",
                n.state.as_str(),
                n.removal.unwrap_or_default()
            ),
        )
        .into());
    }
    let changed = state.cordons.uncordon(&node).await?;
    if changed {
        tracing::warn!(%node, "node uncordoned");
    }
    Ok(HttpResponse::Ok().json(CordonAnswer { node: node.to_string(), cordon: None, changed }))
}
