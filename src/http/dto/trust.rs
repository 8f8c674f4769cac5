//! Bodies of `/join-tokens` and `/nodes/{id}/revoke`: a join token is shown
//! whole once, when made; lists show neither its secret nor its hash.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::storage::trust_records::{JoinTokenRecord, NodeCertRecord};

/// `POST /join-tokens`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateJoinTokenBody {
    /// What it is for (`rack-7`); default `join`.
    #[schema(pattern = "^[a-z0-9][a-z0-9-]{0,62}$")]
    pub name: Option<String>,
    /// Seconds until it expires: 1 to 604800 (a week); default 3600.
    #[schema(minimum = 1, maximum = 604800)]
    pub ttl_seconds: Option<u64>,
    /// How many agents may enroll with it: 1 to 100000; default 1.
    #[schema(minimum = 1, maximum = 100000)]
    pub uses: Option<u32>,
    /// The only node id it may enroll (an agent started with another
    /// `--node-id` is refused and the use is not spent); default: any.
    #[schema(pattern = "^[a-z0-9][a-z0-9-]{0,62}$")]
    pub node: Option<String>,
}

/// A join token as lists show it.
#[derive(Debug, Serialize, ToSchema)]
pub struct JoinTokenDto {
    pub id: String,
    pub name: String,
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: time::OffsetDateTime,
    #[serde(with = "time::serde::rfc3339")]
    pub expires_at: time::OffsetDateTime,
    /// Enrollments it may still make.
    pub uses_left: u32,
    /// The only node id it enrolls; `null`: any.
    pub node: Option<String>,
}

impl From<&JoinTokenRecord> for JoinTokenDto {
    fn from(r: &JoinTokenRecord) -> Self {
        JoinTokenDto {
            id: r.id.clone(),
            name: r.name.clone(),
            created_at: r.created_at,
            expires_at: r.expires_at,
            uses_left: r.uses_left,
            node: r.node.as_ref().map(ToString::to_string),
        }
    }
}

/// `201` of `POST /join-tokens`.
#[derive(Debug, Serialize, ToSchema)]
pub struct CreatedJoinToken {
    pub token: JoinTokenDto,
    /// The token to start an agent with (`flotilla agent --join-token`):
    /// shown this once. It carries the fingerprint of the master's CA.
    pub secret: String,
}

/// `GET /join-tokens`.
#[derive(Debug, Serialize, ToSchema)]
pub struct JoinTokenList {
    /// Those not expired, by id.
    pub join_tokens: Vec<JoinTokenDto>,
}

/// `DELETE /join-tokens/{id}`.
#[derive(Debug, Serialize, ToSchema)]
pub struct DeletedJoinToken {
    pub deleted: JoinTokenDto,
}

/// The certificate issued to a node.
#[derive(Debug, Serialize, ToSchema)]
pub struct NodeCertDto {
    pub node: String,
    /// SHA-256 of the certificate (hex).
    pub fingerprint: String,
    /// The join token it was enrolled with.
    pub token_id: String,
    #[serde(with = "time::serde::rfc3339")]
    pub issued_at: time::OffsetDateTime,
    #[serde(with = "crate::storage::serde_time::rfc3339_option")]
    pub revoked_at: Option<time::OffsetDateTime>,
}

impl From<&NodeCertRecord> for NodeCertDto {
    fn from(r: &NodeCertRecord) -> Self {
        NodeCertDto {
            node: r.node.to_string(),
            fingerprint: hex::encode(r.fingerprint),
            token_id: r.token_id.clone(),
            issued_at: r.issued_at,
            revoked_at: r.revoked_at,
        }
    }
}

/// `POST /nodes/{id}/revoke`: its certificate is refused from this answer
/// on, and its link was closed.
#[derive(Debug, Serialize, ToSchema)]
pub struct RevokedNode {
    pub revoked: NodeCertDto,
    /// Whether the node was connected (and is no longer).
    pub disconnected: bool,
}
