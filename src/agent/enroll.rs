//! The agent's certificate: loaded from `<data-dir>/tls/`, or, on a first
//! start, got from the master with a join token (see
//! [`crate::protocol::tls`]).
//!
//! An enrollment the master refuses (a token unknown, used up or expired,
//! a node id enrolled already) or a master whose CA is not the token's
//! (another master, or someone posing as it) ends the agent with the
//! reason: retrying would not change the answer. A master that cannot be
//! reached yet is dialled again with backoff.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use rustls::pki_types::CertificateDer;
use tokio_util::codec::Framed;

use super::connection::dial;
use crate::ids::NodeId;
use crate::protocol::codec::{AgentCodec, ProtocolError};
use crate::protocol::handshake::agent_enroll;
use crate::protocol::messages::{EnrollRequest, PROTOCOL_VERSION};
use crate::protocol::tls::credentials::{Credentials, NewKey};
use crate::protocol::tls::join_token::JoinToken;
use crate::protocol::tls::{self, TlsError};

#[derive(Debug, thiserror::Error)]
pub enum EnrollError {
    #[error(
        "this agent is not enrolled: start it once with --join-token (or FLOTILLA_AGENT_JOIN_TOKEN), made on the master by `flotilla node token create`"
    )]
    NoToken,
    #[error("join token: {0}")]
    BadToken(String),
    #[error(
        "{dir} holds the certificate of node {enrolled}, not {wanted}; use the node id it was enrolled as, or another data dir"
    )]
    OtherNode { dir: String, enrolled: NodeId, wanted: NodeId },
    #[error(
        "{dir} holds a certificate from another master than the join token's; remove {dir} to enroll with this token"
    )]
    OtherMaster { dir: String },
    #[error("the master refused the enrollment: {0}")]
    Refused(String),
    #[error("the certificate the master sent back is refused: {0}")]
    BadCertificate(String),
    #[error("the master at {master} is not the one the join token was made by (TLS: {reason})")]
    WrongMaster { master: SocketAddr, reason: String },
    #[error(transparent)]
    Tls(#[from] TlsError),
}

/// This node's credentials for `node_id`: the ones kept in `data_dir`, or
/// new ones from one of `masters` (the one that takes it) for `token`.
pub async fn credentials(
    data_dir: &Path,
    node_id: &NodeId,
    token: Option<&str>,
    masters: super::masters::Masters,
    address: &str,
    timeout: Duration,
    max_backoff: Duration,
) -> Result<Credentials, EnrollError> {
    if let Some(kept) = Credentials::load(data_dir)? {
        // A token made by another master than the kept certificate's: the
        // operator means to move this node; say how instead of dialling a
        // master that will never accept the old certificate.
        if let Some(token) = token.and_then(|t| t.parse::<JoinToken>().ok())
            && token.ca != tls::fingerprint(&kept.ca)
        {
            return Err(EnrollError::OtherMaster { dir: tls::credentials::dir(data_dir).display().to_string() });
        }
        if &kept.node_id != node_id {
            return Err(EnrollError::OtherNode {
                dir: tls::credentials::dir(data_dir).display().to_string(),
                enrolled: kept.node_id,
                wanted: node_id.clone(),
            });
        }
        return Ok(kept);
    }
    let token = token.ok_or(EnrollError::NoToken)?;
    let key = NewKey::pending(data_dir)?;
    let credentials = request(node_id, token, key, masters, address, timeout, max_backoff).await?;
    credentials.save(data_dir)?;
    tracing::info!(node = %node_id, certificate = %hex::encode(credentials.fingerprint()), "enrolled with the master");
    Ok(credentials)
}

/// Enrolls `node_id` with the master at `master` using `token`: sends
/// `key`'s public half over TLS pinned to the token's CA, and checks what
/// comes back: the CA is that one, and the certificate is issued by it
/// for this key and this node ([`tls::check_node_certificate`]). Dials
/// again with backoff while the master cannot be reached; a refusal is
/// final. Shared with the simulated
/// agents, which keep their credentials in memory.
pub async fn request(
    node_id: &NodeId,
    token: &str,
    key: NewKey,
    mut masters: super::masters::Masters,
    address: &str,
    timeout: Duration,
    max_backoff: Duration,
) -> Result<Credentials, EnrollError> {
    let token: JoinToken = token.parse().map_err(EnrollError::BadToken)?;
    let config = tls::enroll_config(token.ca)?;
    let request = EnrollRequest {
        protocol_version: PROTOCOL_VERSION,
        node_id: node_id.clone(),
        token_id: token.id.clone(),
        token_secret: token.secret.clone(),
        public_key: key.public_key(),
    };
    let mut backoff = Duration::from_millis(100);
    let enrolled = loop {
        let master = masters.current();
        let attempt = async {
            let tcp = dial(master, address).await?;
            let stream = tls::connect(config.clone(), tcp, timeout).await?;
            let mut framed = Framed::new(stream, AgentCodec::default());
            agent_enroll(&mut framed, request.clone(), timeout).await
        };
        match attempt.await {
            Ok(enrolled) => break enrolled,
            Err(ProtocolError::Refused { reason }) => return Err(EnrollError::Refused(reason)),
            // A certificate check that failed is not going to pass later.
            Err(ProtocolError::Io(e)) if e.kind() == std::io::ErrorKind::InvalidData => {
                return Err(EnrollError::WrongMaster { master, reason: crate::error::ErrorChain(&e).to_string() });
            }
            Err(e) => {
                tracing::warn!(error = %crate::error::ErrorChain(&e), %master, "cannot enroll yet; trying again");
            }
        }
        // The next master at once, a pause after a whole round.
        if masters.advance() {
            tokio::time::sleep(super::connection::jittered(backoff)).await;
            backoff = (backoff * 2).min(max_backoff);
        }
    };
    let master = masters.current();
    let cert = CertificateDer::from(enrolled.certificate_der);
    let ca = CertificateDer::from(enrolled.ca_der);
    if tls::fingerprint(&ca) != token.ca {
        return Err(EnrollError::WrongMaster { master, reason: "it sent another CA with the certificate".into() });
    }
    if let Err(why) = tls::check_node_certificate(&ca, &cert, &key.public_key(), node_id.as_str()) {
        return Err(EnrollError::BadCertificate(why));
    }
    Ok(key.into_credentials(node_id.clone(), cert, ca))
}
