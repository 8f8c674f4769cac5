//! The one place where errors become HTTP answers:
//! `{"error": {"code", "message", "request_id"}}` with a stable `code`.
//! The request id is also logged with the error, so an operator can find
//! the log line of any error a client saw.

use actix_web::http::StatusCode;
use actix_web::{HttpResponse, ResponseError};
use serde_json::json;

use crate::error::Error;

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
        let request_id = uuid::Uuid::new_v4().to_string();
        if status.is_server_error() {
            tracing::error!(%request_id, code, error = %self.0, "request failed");
        } else {
            tracing::info!(%request_id, code, error = %self.0, "request refused");
        }
        let mut body = json!({ "error": { "code": code, "message": self.0.to_string(), "request_id": request_id } });
        if let Error::SpecViolation { field, .. } = &self.0 {
            body["error"]["field"] = json!(field);
        }
        let mut resp = HttpResponse::build(status);
        resp.insert_header(("x-request-id", request_id));
        if self.0.retryable() {
            // Overload and shutdown pass within moments: say when to retry.
            resp.insert_header(("retry-after", "1"));
        }
        if let Error::Unauthorized { .. } = &self.0 {
            resp.insert_header(("www-authenticate", "Bearer realm=\"flotilla\""));
        }
        resp.json(body)
    }
}

/// Maps actix's JSON body errors to our codes (unknown field, bad type, too big).
pub fn json_error(err: actix_web::error::JsonPayloadError, _req: &actix_web::HttpRequest) -> actix_web::Error {
    use actix_web::error::JsonPayloadError as J;
    let e = match &err {
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
