//! `/join-tokens` (make, list, delete) and `/nodes/{id}/revoke`: who may be
//! an agent of this master. `flotilla node token create|ls|rm` and
//! `flotilla node revoke` call these.

use std::time::Duration;

use actix_web::{HttpResponse, web};

use super::AppState;
use super::dto::{
    CreateJoinTokenBody, CreatedJoinToken, DeletedJoinToken, JoinTokenDto, JoinTokenList, NodeCertDto, RevokedNode,
};
use super::error::ApiError;
use crate::actors::trust::join_tokens::JoinTokenSpec;
use crate::ids::NodeId;

/// Makes a join token
///
/// `201` with the token whole, shown this once. An agent started with it
/// (`flotilla agent --join-token`) enrolls: it gets a certificate for its
/// node id and connects with it from then on. A token made with `node`
/// enrolls that node id only.
#[utoipa::path(post, path = "/api/v1/join-tokens", operation_id = "create_join_token", tag = "nodes", responses(
    (status = 201, description = "Made: `secret` is shown this once", body = CreatedJoinToken),
    (status = 400, response = super::error::BadRequest),
    (status = 409, response = super::error::Conflict),
    (status = 413, response = super::error::TooLarge),
    (status = 500, response = super::error::Internal),
    (status = 503, response = super::error::Unavailable)))]
pub async fn create(
    state: web::Data<AppState>,
    body: web::Json<CreateJoinTokenBody>,
) -> Result<HttpResponse, ApiError> {
    let body = body.into_inner();
    let spec = JoinTokenSpec {
        name: body.name.unwrap_or_else(|| "join".into()),
        ttl: Duration::from_secs(body.ttl_seconds.unwrap_or(3600).min(u64::MAX / 2)),
        uses: body.uses.unwrap_or(1),
        node: body.node.map(NodeId::new),
    };
    let new = state.trust.create_join_token(&spec).await?;
    let node = new.record.node.as_ref().map_or("any", |n| n.as_str());
    tracing::info!(id = %new.record.id, name = %new.record.name, uses = new.record.uses_left, node, "join token made");
    Ok(HttpResponse::Created().json(CreatedJoinToken { token: JoinTokenDto::from(&new.record), secret: new.token }))
}

/// The join tokens not expired (never their secrets)
#[utoipa::path(get, path = "/api/v1/join-tokens", operation_id = "list_join_tokens", tag = "nodes",
    responses((status = 200, description = "Every join token not expired", body = JoinTokenList)))]
pub async fn list(state: web::Data<AppState>) -> HttpResponse {
    let join_tokens = state.trust.join_tokens().iter().map(|r| JoinTokenDto::from(&**r)).collect();
    HttpResponse::Ok().json(JoinTokenList { join_tokens })
}

/// Deletes a join token
///
/// No agent enrolls with it from this answer on; agents enrolled with it
/// keep their certificates.
#[utoipa::path(delete, path = "/api/v1/join-tokens/{id}", operation_id = "delete_join_token", tag = "nodes",
    params(("id" = String, Path, description = "The token's id (not its secret)")),
    responses(
        (status = 200, description = "Deleted", body = DeletedJoinToken),
        (status = 404, response = super::error::NotFound),
        (status = 500, response = super::error::Internal),
        (status = 503, response = super::error::Unavailable)))]
pub async fn delete(state: web::Data<AppState>, id: web::Path<String>) -> Result<HttpResponse, ApiError> {
    let record = state.trust.delete_join_token(&id).await?;
    tracing::info!(id = %record.id, "join token deleted");
    Ok(HttpResponse::Ok().json(DeletedJoinToken { deleted: JoinTokenDto::from(&record) }))
}

/// Revokes a node's certificate
///
/// Its link is closed at once and it cannot connect again; its instances
/// are treated like those of any node that went away. The node may
/// enroll again with a new join token (after its `tls/` directory is
/// removed).
#[utoipa::path(post, path = "/api/v1/nodes/{id}/revoke", operation_id = "revoke_node", tag = "nodes",
    params(("id" = String, Path, description = "The node's id")),
    responses(
        (status = 200, description = "Revoked", body = RevokedNode),
        (status = 404, response = super::error::NotFound),
        (status = 409, response = super::error::Conflict),
        (status = 500, response = super::error::Internal),
        (status = 503, response = super::error::Unavailable)))]
pub async fn revoke(state: web::Data<AppState>, id: web::Path<String>) -> Result<HttpResponse, ApiError> {
    let node = NodeId::new(id.into_inner());
    // One task revokes and closes: a client that hangs up in between cannot
    // leave a revoked node connected.
    let (trust, links, who) = (state.trust.clone(), state.shared.links.clone(), node.clone());
    let task = tokio::spawn(async move {
        let record = trust.revoke(&who).await?;
        let link = links.get(&who);
        if let Some(link) = &link {
            link.close_for_good();
        }
        Ok::<_, crate::error::Error>((record, link.is_some()))
    });
    let (record, disconnected) =
        task.await.map_err(|e| crate::error::Error::Internal { message: format!("revoke task: {e}") })??;
    tracing::warn!(%node, disconnected, "node certificate revoked");
    Ok(HttpResponse::Ok().json(RevokedNode { revoked: NodeCertDto::from(&record), disconnected }))
}
