//! Bodies of `/tokens`: a token is shown whole once, when created; lists
//! show neither its secret nor its hash.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::scope::Scope;
use crate::storage::records::TokenRecord;

/// `POST /tokens`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateTokenBody {
    /// Who or what it is for (`ci`, `alice`).
    #[schema(pattern = "^[a-z0-9][a-z0-9-]{0,62}$")]
    pub name: String,
    /// What it may do: `read` (every GET, the event stream, metrics),
    /// `operate` (read, the verbs on clusters and instances, logs) or
    /// `admin` (everything), the default.
    pub scope: Option<Scope>,
}

/// A token as lists show it: never its secret, never its hash.
#[derive(Debug, Serialize, ToSchema)]
pub struct TokenDto {
    pub id: String,
    pub name: String,
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: time::OffsetDateTime,
    /// What it may do (`read` < `operate` < `admin`).
    pub scope: Scope,
}

impl From<&TokenRecord> for TokenDto {
    fn from(r: &TokenRecord) -> Self {
        TokenDto { id: r.id.clone(), name: r.name.clone(), created_at: r.created_at, scope: r.scope }
    }
}

/// `GET /whoami`: the token this request was made with.
#[derive(Debug, Serialize, ToSchema)]
pub struct WhoAmI {
    pub token: TokenDto,
}

/// `GET /tokens`.
#[derive(Debug, Serialize, ToSchema)]
pub struct TokenList {
    pub tokens: Vec<TokenDto>,
}

/// `201` of `POST /tokens`.
#[derive(Debug, Serialize, ToSchema)]
pub struct CreatedToken {
    pub token: TokenDto,
    /// The token to send as `Authorization: Bearer <secret>`: shown this once.
    pub secret: String,
}

/// `DELETE /tokens/{id}`: refused from this answer on.
#[derive(Debug, Serialize, ToSchema)]
pub struct RevokedToken {
    pub revoked: TokenDto,
}

/// `POST /tokens?dry_run=true`.
#[derive(Debug, Serialize, ToSchema)]
pub struct TokenCreatePreview {
    /// Always true: nothing was done.
    pub dry_run: bool,
    pub valid: bool,
    /// `create`.
    pub would: String,
    pub name: String,
    pub scope: Scope,
}

/// `DELETE /tokens/{id}?dry_run=true`.
#[derive(Debug, Serialize, ToSchema)]
pub struct TokenRevokePreview {
    /// Always true: nothing was done.
    pub dry_run: bool,
    pub valid: bool,
    /// `revoke`.
    pub would: String,
    pub token: TokenDto,
}

/// The `200` of `DELETE /tokens/{id}`: revoked, or (`?dry_run=true`) what
/// would be.
#[derive(Debug, Serialize, ToSchema)]
#[serde(untagged)]
pub enum RevokeAnswer {
    Revoked(RevokedToken),
    DryRun(TokenRevokePreview),
}
