//! The records of the agent link's trust: join tokens and the certificates
//! issued to nodes. Like the API tokens, a join token is kept as the
//! SHA-256 of its secret, never the secret.

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use crate::ids::NodeId;

/// A join token (`flj_<id>_<secret>_<ca>`): an agent enrolls with it once
/// per use, until it expires; a token bound to a node enrolls only that
/// node id.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JoinTokenRecord {
    pub version: u32,
    pub id: String,
    /// What the operator called it.
    pub name: String,
    pub secret_sha256: [u8; 32],
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339")]
    pub expires_at: OffsetDateTime,
    /// Enrollments it may still make; the token is deleted at 0.
    pub uses_left: u32,
    /// The only node id it enrolls, if bound to one (schema 6; `None`:
    /// any node id).
    pub node: Option<NodeId>,
}

/// The certificate a node was issued: the master knows a node by this
/// certificate's fingerprint, never by what the agent says.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeCertRecord {
    pub version: u32,
    pub node: NodeId,
    /// SHA-256 of the certificate's DER bytes.
    pub fingerprint: [u8; 32],
    pub serial: [u8; 16],
    /// The join token it was enrolled with, and that token's secret's
    /// SHA-256: an enrollment retried with the same token and key (its
    /// answer was lost) gets this certificate again, without a use.
    pub token_id: String,
    pub token_secret_sha256: [u8; 32],
    /// The node's public key, and the certificate itself (DER).
    pub public_key: Vec<u8>,
    pub certificate_der: Vec<u8>,
    #[serde(with = "time::serde::rfc3339")]
    pub issued_at: OffsetDateTime,
    /// Set by `flotilla node revoke`: the certificate is refused from then
    /// on. The node may enroll again with a new token.
    #[serde(with = "crate::storage::serde_time::rfc3339_option")]
    pub revoked_at: Option<OffsetDateTime>,
}

/// The agent link's CA shared by every master of an installation on etcd
/// (in `meta`, key `agent_link_ca`): its certificate and key as PEM. With
/// the embedded store the CA stays in the master's `ca/` directory only.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CaRecord {
    pub version: u32,
    pub cert_pem: String,
    pub key_pem: String,
}
