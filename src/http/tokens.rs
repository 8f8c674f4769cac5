//! `/api/v1/tokens`: create (the secret is in this answer only), list,
//! revoke. `flotilla token create|ls|revoke` calls these. Create and revoke
//! take `?dry_run=true`: checked, not done. And `/api/v1/whoami`: the
//! token a request is made with, its scope included (the dashboard shows
//! only what that scope allows).
//!
//! A token is made with a scope (`admin` unless the body names one), at
//! most the scope of the token asking: the route needs `admin` today, and
//! `actors::tokens` refuses a higher scope whatever the route table says.

use actix_web::{HttpResponse, web};

use super::AppState;
use super::auth::AuthedToken;
use super::clusters::DryRun;
use super::dto::{
    CreateTokenBody, CreatedToken, RevokeAnswer, RevokedToken, TokenCreatePreview, TokenDto, TokenList,
    TokenRevokePreview, WhoAmI,
};
use super::error::ApiError;

/// Creates an API token
///
/// `201` with the token whole, shown this once; with `?dry_run=true`, `200`
/// and nothing created. Its `scope` is `admin` unless the body names one;
/// a token never makes one of a higher scope than its own (`403`).
#[utoipa::path(post, path = "/api/v1/tokens", operation_id = "create_token", tag = "tokens", params(DryRun), responses(
    (status = 201, description = "Created: `secret` is shown this once", body = CreatedToken),
    (status = 200, description = "`?dry_run=true`: it would be created", body = TokenCreatePreview),
    (status = 400, response = super::error::BadRequest),
    (status = 409, response = super::error::Conflict),
    (status = 413, response = super::error::TooLarge),
    (status = 500, response = super::error::Internal),
    (status = 503, response = super::error::Unavailable)))]
pub async fn create(
    state: web::Data<AppState>,
    body: web::Json<CreateTokenBody>,
    q: web::Query<DryRun>,
    caller: web::ReqData<AuthedToken>,
) -> Result<HttpResponse, ApiError> {
    let scope = body.scope.unwrap_or_default();
    let by = caller.0.scope;
    if q.dry_run {
        state.tokens.check_create(&body.name, scope, by)?;
        let would =
            TokenCreatePreview { dry_run: true, valid: true, would: "create".into(), name: body.name.clone(), scope };
        return Ok(HttpResponse::Ok().json(would));
    }
    let new = state.tokens.create(&body.name, scope, by).await?;
    tracing::info!(id = %new.record.id, name = %new.record.name, %scope, by = %caller.0.id, "API token created");
    Ok(HttpResponse::Created().json(CreatedToken { token: TokenDto::from(&new.record), secret: new.token }))
}

/// The API tokens (never their secrets)
#[utoipa::path(get, path = "/api/v1/tokens", operation_id = "list_tokens", tag = "tokens",
    responses((status = 200, description = "Every token", body = TokenList)))]
pub async fn list(state: web::Data<AppState>) -> HttpResponse {
    let tokens: Vec<TokenDto> = state.tokens.list().iter().map(|r| TokenDto::from(&**r)).collect();
    HttpResponse::Ok().json(TokenList { tokens })
}

/// Revokes an API token
///
/// Refused from this answer on, streams opened with it included. The last
/// token cannot be revoked (`409 last_token`).
#[utoipa::path(delete, path = "/api/v1/tokens/{id}", operation_id = "revoke_token", tag = "tokens",
    params(("id" = String, Path, description = "The token's id (not its secret)"), DryRun),
    responses(
        (status = 200, description = "Revoked, or (`?dry_run=true`) what would be", body = RevokeAnswer),
        (status = 400, response = super::error::BadRequest),
        (status = 404, response = super::error::NotFound),
        (status = 409, response = super::error::Conflict),
        (status = 500, response = super::error::Internal),
        (status = 503, response = super::error::Unavailable)))]
pub async fn revoke(
    state: web::Data<AppState>,
    id: web::Path<String>,
    q: web::Query<DryRun>,
) -> Result<HttpResponse, ApiError> {
    if q.dry_run {
        let record = state.tokens.check_revoke(&id)?;
        let would =
            TokenRevokePreview { dry_run: true, valid: true, would: "revoke".into(), token: TokenDto::from(&*record) };
        return Ok(HttpResponse::Ok().json(RevokeAnswer::DryRun(would)));
    }
    let record = state.tokens.revoke(&id).await?;
    tracing::info!(id = %record.id, name = %record.name, "API token revoked");
    Ok(HttpResponse::Ok().json(RevokeAnswer::Revoked(RevokedToken { revoked: TokenDto::from(&record) })))
}

/// The token this request is made with
///
/// Its id, name and scope (never its secret): what a client, the dashboard
/// among them, may do with it.
#[utoipa::path(get, path = "/api/v1/whoami", operation_id = "whoami", tag = "tokens",
    responses((status = 200, description = "The token of this request", body = WhoAmI)))]
pub async fn whoami(caller: web::ReqData<AuthedToken>) -> HttpResponse {
    HttpResponse::Ok().json(WhoAmI { token: TokenDto::from(&*caller.0) })
}
