//! `/api/v1/tokens`: create (the secret is in this answer only), list,
//! revoke. `flotilla token create|ls|revoke` calls these. Create and revoke
//! take `?dry_run=true`: checked, not done.

use actix_web::{HttpResponse, web};
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::AppState;
use super::error::ApiError;
use crate::storage::records::TokenRecord;

/// A token as lists show it: never its secret, never its hash.
#[derive(Serialize)]
pub struct TokenDto {
    pub id: String,
    pub name: String,
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: time::OffsetDateTime,
}

impl From<&TokenRecord> for TokenDto {
    fn from(r: &TokenRecord) -> Self {
        TokenDto { id: r.id.clone(), name: r.name.clone(), created_at: r.created_at }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateToken {
    name: String,
}

/// `POST /tokens`: `201` with the token whole, shown this once.
pub async fn create(
    state: web::Data<AppState>,
    body: web::Json<CreateToken>,
    q: web::Query<super::clusters::DryRun>,
) -> Result<HttpResponse, ApiError> {
    if q.dry_run {
        state.tokens.check_create(&body.name)?;
        return Ok(
            HttpResponse::Ok().json(json!({ "dry_run": true, "valid": true, "would": "create", "name": body.name }))
        );
    }
    let new = state.tokens.create(&body.name).await?;
    tracing::info!(id = %new.record.id, name = %new.record.name, "API token created");
    Ok(HttpResponse::Created().json(json!({ "token": TokenDto::from(&new.record), "secret": new.token })))
}

pub async fn list(state: web::Data<AppState>) -> HttpResponse {
    let tokens: Vec<TokenDto> = state.tokens.list().iter().map(|r| TokenDto::from(&**r)).collect();
    HttpResponse::Ok().json(json!({ "tokens": tokens }))
}

/// `DELETE /tokens/{id}`: refused from this answer on.
pub async fn revoke(
    state: web::Data<AppState>,
    id: web::Path<String>,
    q: web::Query<super::clusters::DryRun>,
) -> Result<HttpResponse, ApiError> {
    if q.dry_run {
        let record = state.tokens.check_revoke(&id)?;
        return Ok(HttpResponse::Ok()
            .json(json!({ "dry_run": true, "valid": true, "would": "revoke", "token": TokenDto::from(&*record) })));
    }
    let record = state.tokens.revoke(&id).await?;
    tracing::info!(id = %record.id, name = %record.name, "API token revoked");
    Ok(HttpResponse::Ok().json(json!({ "revoked": TokenDto::from(&record) })))
}
