//! The one place where errors become HTTP answers:
//! `{"error": {"code", "message", "request_id"}}` ([`ErrorBody`]) with a
//! stable `code`. The request id is also logged with the error, so an
//! operator can find the log line of any error a client saw. The
//! responses the API description names (`openapi.rs`) are declared here,
//! beside the code that sets their headers.

use actix_web::http::StatusCode;
use actix_web::http::header::{ALLOW, RETRY_AFTER, WWW_AUTHENTICATE};
use actix_web::{HttpResponse, ResponseError};
use serde::Serialize;
use utoipa::{ToResponse, ToSchema};

use crate::error::Error;

/// Every error answer of the API.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorDetail {
    /// Stable, for programs: `not_found`, `already_exists`, `invalid_json`,
    /// `invalid_query`, `invalid_path`, `cluster_busy`, `spec_violation`,
    /// `too_large`, `unavailable`, `overloaded`, `unauthorized`,
    /// `forbidden`, `method_not_allowed`, `internal`, ...
    pub code: String,
    /// For people; its wording may change.
    pub message: String,
    /// Also in the `X-Request-Id` header and in the master's log line.
    pub request_id: String,
    /// The field at fault (`spec_violation` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
}

/// An API error: the domain error, answered as JSON.
#[derive(Debug)]
pub struct ApiError(pub Error);

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl<E: Into<Error>> From<E> for ApiError {
    fn from(e: E) -> Self {
        ApiError(e.into())
    }
}

impl ApiError {
    /// (status, stable code)
    pub fn parts(&self) -> (StatusCode, &'static str) {
        match &self.0 {
            Error::NotFound { .. } => (StatusCode::NOT_FOUND, "not_found"),
            Error::AlreadyExists { .. } => (StatusCode::CONFLICT, "already_exists"),
            Error::Invalid { code, .. } => (StatusCode::BAD_REQUEST, code),
            Error::SpecViolation { .. } => (StatusCode::UNPROCESSABLE_ENTITY, "spec_violation"),
            Error::Conflict { code, .. } => (StatusCode::CONFLICT, code),
            Error::TooLarge { .. } => (StatusCode::PAYLOAD_TOO_LARGE, "too_large"),
            Error::Unavailable { .. } => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
            Error::Overloaded { .. } => (StatusCode::SERVICE_UNAVAILABLE, "overloaded"),
            Error::Unauthorized { .. } => (StatusCode::UNAUTHORIZED, "unauthorized"),
            Error::Forbidden { .. } => (StatusCode::FORBIDDEN, "forbidden"),
            Error::Internal { .. } => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        }
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        self.parts().0
    }

    fn error_response(&self) -> HttpResponse {
        let (status, code) = self.parts();
        let field = match &self.0 {
            Error::SpecViolation { field, .. } => Some(field.clone()),
            _ => None,
        };
        let mut headers: Vec<(actix_web::http::header::HeaderName, String)> = Vec::new();
        if self.0.retryable() {
            // Overload and shutdown pass within moments: say when to retry.
            headers.push((RETRY_AFTER, "1".into()));
        }
        if let Error::Unauthorized { .. } = &self.0 {
            headers.push((WWW_AUTHENTICATE, "Bearer realm=\"flotilla\"".into()));
        }
        answer(status, code, self.0.to_string(), field, headers)
    }
}

/// The longest error message answered (a longer one is cut, saying so).
pub const MAX_MESSAGE_CHARS: usize = 2000;
/// The longest `field` answered.
const MAX_FIELD_CHARS: usize = 200;

/// An error answer; the request id is drawn here and logged with it.
fn answer(
    status: StatusCode,
    code: &str,
    message: String,
    field: Option<String>,
    headers: Vec<(actix_web::http::header::HeaderName, String)>,
) -> HttpResponse {
    let request_id = uuid::Uuid::new_v4().to_string();
    // An id or a name from the request may be 10,000 characters long and
    // echoed in the message; the answer and the log keep its beginning.
    let message = crate::ids::shorten(&message, MAX_MESSAGE_CHARS);
    let field = field.map(|f| crate::ids::shorten(&f, MAX_FIELD_CHARS));
    if status.is_server_error() {
        tracing::error!(%request_id, code, error = %message, "request failed");
    } else {
        tracing::info!(%request_id, code, error = %message, "request refused");
    }
    let mut resp = HttpResponse::build(status);
    resp.insert_header(("x-request-id", request_id.clone()));
    for h in headers {
        resp.insert_header(h);
    }
    resp.json(ErrorBody { error: ErrorDetail { code: code.to_string(), message, request_id, field } })
}

/// `405 method_not_allowed` for a method a known path does not take, with
/// `Allow` listing those it does (`methods`, lowercase as in the route table).
pub fn method_not_allowed(method: &actix_web::http::Method, methods: &[&str]) -> HttpResponse {
    let allow = methods.iter().map(|m| m.to_ascii_uppercase()).collect::<Vec<_>>().join(", ");
    let message = format!("{method} is not allowed here; this path takes {allow}");
    answer(StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed", message, None, vec![(ALLOW, allow)])
}

/// Maps actix's JSON body errors to our codes (unknown field, bad type, too
/// big, too slow: `body_timeout`, see [`super::body_deadline`]).
pub fn json_error(err: actix_web::error::JsonPayloadError, req: &actix_web::HttpRequest) -> actix_web::Error {
    use actix_web::error::JsonPayloadError as J;
    let e = match &err {
        J::Payload(p) if super::body_deadline::is_body_timeout(p) => {
            let within = req.app_data::<actix_web::web::Data<super::AppState>>().map(|s| s.request_body_timeout);
            Error::invalid(
                "body_timeout",
                format!(
                    "the request body was not received within {} (request_body_timeout); the connection is closed",
                    within.map_or_else(|| "its deadline".to_string(), |d| humantime::format_duration(d).to_string())
                ),
            )
        }
        J::OverflowKnownLength { length, limit } => {
            Error::TooLarge { message: format!("JSON body of {length} bytes is over the limit of {limit}") }
        }
        J::Overflow { limit } => Error::TooLarge { message: format!("JSON body is over the limit of {limit} bytes") },
        J::ContentType => Error::invalid("invalid_content_type", "send the body as application/json"),
        J::Deserialize(d) => Error::invalid("invalid_json", format!("invalid request body: {d}")),
        other => Error::invalid("invalid_json", format!("invalid request body: {other}")),
    };
    ApiError(e).into()
}

/// Maps query-string errors the same way.
pub fn query_error(err: actix_web::error::QueryPayloadError, _req: &actix_web::HttpRequest) -> actix_web::Error {
    ApiError(Error::invalid("invalid_query", format!("invalid query string: {err}"))).into()
}

/// Maps path errors the same way.
pub fn path_error(err: actix_web::error::PathError, _req: &actix_web::HttpRequest) -> actix_web::Error {
    ApiError(Error::invalid("invalid_path", format!("invalid path: {err}"))).into()
}

// The error answers as the API description names them (`openapi.rs`).

/// The request is malformed: a body, query or path that does not parse
/// (`invalid_json`, `invalid_content_type`, `invalid_query`, `invalid_path`),
/// a JSON body not received within `request_body_timeout` (`body_timeout`)
/// or a value out of its domain (`invalid_request`, `invalid_name`, ...).
#[derive(ToResponse)]
#[response(headers(("X-Request-Id" = String)))]
pub struct BadRequest(pub ErrorBody);

/// No valid API token (`unauthorized`): send `Authorization: Bearer <token>`.
#[derive(ToResponse)]
#[response(headers(
    ("WWW-Authenticate" = String, description = "`Bearer realm=\"flotilla\"`"),
    ("X-Request-Id" = String)
))]
pub struct Unauthorized(pub ErrorBody);

/// The token is valid but its scope is too low for this route
/// (`forbidden`); the message names the scope needed and the token's.
/// Scopes: `read` < `operate` < `admin`.
#[derive(ToResponse)]
#[response(headers(("X-Request-Id" = String)))]
pub struct Forbidden(pub ErrorBody);

/// No such thing (`not_found`).
#[derive(ToResponse)]
#[response(headers(("X-Request-Id" = String)))]
pub struct NotFound(pub ErrorBody);

/// The request conflicts with the current state: `already_exists`, or a
/// stable code such as `cluster_busy` (an operation runs; retry when it
/// has ended).
#[derive(ToResponse)]
#[response(headers(("X-Request-Id" = String)))]
pub struct Conflict(pub ErrorBody);

/// The body is over its size cap (`too_large`).
#[derive(ToResponse)]
#[response(headers(("X-Request-Id" = String)))]
pub struct TooLarge(pub ErrorBody);

/// Well-formed, but against the component spec or a topology rule
/// (`spec_violation`, with `field`).
#[derive(ToResponse)]
#[response(headers(("X-Request-Id" = String)))]
pub struct SpecViolation(pub ErrorBody);

/// Refused before anything happened: a full mailbox or write queue
/// (`overloaded`), or an actor, a node or the store unavailable for a
/// moment (`unavailable`). Retry after `Retry-After` seconds.
#[derive(ToResponse)]
#[response(headers(
    ("Retry-After" = String, description = "Seconds to wait before retrying"),
    ("X-Request-Id" = String)
))]
pub struct Unavailable(pub ErrorBody);

/// A bug or a failure of the store (`internal`); the master's log has the
/// line with this request id.
#[derive(ToResponse)]
#[response(headers(("X-Request-Id" = String)))]
pub struct Internal(pub ErrorBody);
