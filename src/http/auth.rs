//! Every `/api/v1` request presents `Authorization: Bearer <token>`
//! (`actors::tokens`); without a valid one it is answered `401
//! unauthorized` (with `WWW-Authenticate: Bearer`) before any handler
//! runs. `GET /api/v1/health` is left open while the `open_health` setting
//! is on (the default), for load balancers and process supervisors. The
//! API description, `/api/v1/openapi.json`, is always open: it is published
//! documentation (no secret, no state), and tools read it before they
//! have a token.

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::middleware::Next;
use actix_web::{HttpMessage, web};

use super::AppState;
use super::error::ApiError;
use crate::error::Error;

/// The id of the token a request was let in with (in its extensions), for
/// handlers that keep serving after the check (the event stream).
#[derive(Debug, Clone)]
pub struct AuthedToken(pub String);

/// The path left open by `open_health`.
const HEALTH: &str = "/api/v1/health";
/// The path always open.
pub const OPENAPI: &str = "/api/v1/openapi.json";

pub async fn require_token(
    req: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let Some(state) = req.app_data::<web::Data<AppState>>() else {
        return Err(ApiError(Error::Internal { message: "no app state for the token check".into() }).into());
    };
    let open = req.path() == OPENAPI || (state.open_health && req.path() == HEALTH);
    if !open {
        let id = check(state, req.headers().get(actix_web::http::header::AUTHORIZATION))?;
        req.extensions_mut().insert(AuthedToken(id));
    }
    next.call(req).await
}

/// The id of the valid token `header` presents.
pub(crate) fn check(
    state: &AppState,
    header: Option<&actix_web::http::header::HeaderValue>,
) -> Result<String, ApiError> {
    let Some(value) = header else {
        return Err(unauthorized("this API needs a token: send `Authorization: Bearer <token>`"));
    };
    let token = value
        .to_str()
        .ok()
        .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
        .map(str::trim)
        .ok_or_else(|| unauthorized("the Authorization header must read `Bearer <token>`"))?;
    match state.tokens.verify(token) {
        Some(record) => Ok(record.id.clone()),
        None => Err(unauthorized("the token is not valid (unknown, revoked or mistyped)")),
    }
}

fn unauthorized(message: &str) -> ApiError {
    ApiError(Error::Unauthorized { message: message.into() })
}
