//! The domain error. It knows nothing of HTTP: `http/error.rs` is the one
//! place that maps it to a status code and a stable error code.
//!
//! Each layer has its own `thiserror` enum (`StorageError`, `ProtocolError`,
//! `SpecError`, `InstallError`, `ProcessError`) and converts into this one at
//! the boundary where a user-visible answer is formed. `Display` never repeats
//! the source; use [`ErrorChain`] to log the whole chain.

use std::fmt;

use crate::scope::Scope;

/// What went wrong, in terms a client can act on.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    /// The thing asked for does not exist. `kind` is e.g. `"cluster"`.
    #[error("{kind} {id:?} not found")]
    NotFound { kind: &'static str, id: String },
    /// A thing with this name exists already.
    #[error("{kind} {id:?} already exists")]
    AlreadyExists { kind: &'static str, id: String },
    /// The request is malformed (400). `code` is stable, e.g. `invalid_name`.
    #[error("{message}")]
    Invalid { code: &'static str, message: String },
    /// The request is well-formed but violates a component spec or topology
    /// rule (422). `field` names what is wrong.
    #[error("{field}: {message}")]
    SpecViolation { field: String, message: String },
    /// The request conflicts with current state (409), e.g. `cluster_busy`.
    #[error("{message}")]
    Conflict { code: &'static str, message: String },
    /// A body or upload is over its size cap (413).
    #[error("{message}")]
    TooLarge { message: String },
    /// Temporarily unavailable; retrying may help (503).
    #[error("{message}")]
    Unavailable { message: String },
    /// A bounded queue (a mailbox, the store's write queue) is full: the
    /// request was refused before anything of it happened; retry after a
    /// moment (503 `overloaded`, with `Retry-After`).
    #[error("{message}")]
    Overloaded { message: String },
    /// No valid API token was presented (401).
    #[error("{message}")]
    Unauthorized { message: String },
    /// The token is valid but its scope is too low for this (403): `what`
    /// (`POST /api/v1/packages/...`, `a token of scope admin`) needs
    /// `needed`, the token has `has`.
    #[error("{what} needs the `{needed}` scope; this token has `{has}`")]
    Forbidden { what: String, needed: Scope, has: Scope },
    /// A bug or an unexpected failure of a dependency (500).
    #[error("internal error: {message}")]
    Internal { message: String },
}

impl Error {
    /// `id` is cut to 100 characters: it often comes from a request.
    pub fn not_found(kind: &'static str, id: impl fmt::Display) -> Self {
        Error::NotFound { kind, id: crate::ids::shorten(&id.to_string(), 100) }
    }
    pub fn invalid(code: &'static str, message: impl Into<String>) -> Self {
        Error::Invalid { code, message: message.into() }
    }
    pub fn spec(field: impl Into<String>, message: impl Into<String>) -> Self {
        Error::SpecViolation { field: field.into(), message: message.into() }
    }
    pub fn conflict(code: &'static str, message: impl Into<String>) -> Self {
        Error::Conflict { code, message: message.into() }
    }
    pub fn unavailable(message: impl Into<String>) -> Self {
        Error::Unavailable { message: message.into() }
    }
    pub fn overloaded(message: impl Into<String>) -> Self {
        Error::Overloaded { message: message.into() }
    }
    pub fn forbidden(what: impl Into<String>, needed: Scope, has: Scope) -> Self {
        Error::Forbidden { what: what.into(), needed, has }
    }
    /// Wraps any error as internal, keeping its whole chain in the message.
    pub fn internal(err: impl std::error::Error) -> Self {
        Error::Internal { message: ErrorChain(&err).to_string() }
    }

    /// True when retrying the same request later may succeed.
    pub fn retryable(&self) -> bool {
        matches!(self, Error::Unavailable { .. } | Error::Overloaded { .. })
    }
}

/// Displays an error and all its sources, `a: b: c`.
pub struct ErrorChain<'a>(pub &'a dyn std::error::Error);

impl fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(s) = source {
            write!(f, ": {s}")?;
            source = s.source();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn chain_prints_every_source_once() {
        let e = Outer(std::io::Error::other("disk gone"));
        assert_eq!(ErrorChain(&e).to_string(), "outer: disk gone");
        assert!(matches!(Error::internal(e), Error::Internal { message } if message == "outer: disk gone"));
    }
}
