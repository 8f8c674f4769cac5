//! TLS on the agent link: the master's private CA ([`ca`]), the agent's
//! credentials on disk ([`credentials`]), the verifier an agent uses before
//! it has the CA ([`pin`]), and the rustls configurations both ends build
//! from them.
//!
//! Every certificate is issued by the master's CA, which lives in the
//! master's data dir and nowhere else. The master presents a certificate
//! for [`MASTER_NAME`] (whatever address it listens on: agents check the
//! CA, not an address), and asks agents for theirs without requiring one,
//! because an agent that is not enrolled yet connects without: such a
//! connection may only enroll ([`crate::protocol::messages::EnrollRequest`]).
//! The node a certificate belongs to is looked up by the certificate's
//! SHA-256 fingerprint in the master's table of issued certificates, never
//! taken from what the agent says; a certificate missing from the table
//! (revoked, or issued by another master's CA) is refused.
//!
//! An enrolled agent also names its certificate in its ClientHello, as an
//! ALPN protocol ([`certificate_claim`]): the master reads it before any
//! TLS work and keeps handshake room for such connections (see
//! `actors::agent_listener`). The claim is only a word until the handshake
//! ends: a connection that does not then present that very certificate is
//! closed. The master selects no ALPN protocol, so the claim changes
//! nothing else (rustls, on both ends, goes on without one).
//!
//! One crypto backend (aws-lc-rs) is named explicitly everywhere, so no
//! process-wide default provider is needed.

pub mod ca;
pub mod credentials;
pub mod join_token;
pub mod pin;
pub mod testkit;

use std::sync::Arc;

use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use sha2::{Digest, Sha256};

/// The name in the master's certificate, which agents verify.
pub const MASTER_NAME: &str = "master.flotilla";

/// A certificate's SHA-256 fingerprint (of its DER bytes).
pub type Fingerprint = [u8; 32];

/// Why TLS material could not be made, read or used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{what} {path}: {source}")]
    Io { what: &'static str, path: String, source: std::io::Error },
    #[error("{what}: {message}")]
    Invalid { what: String, message: String },
    #[error("making {what}: {message}")]
    Crypto { what: &'static str, message: String },
}

impl TlsError {
    pub(crate) fn crypto(what: &'static str) -> impl FnOnce(rcgen::Error) -> TlsError {
        move |e| TlsError::Crypto { what, message: e.to_string() }
    }

    pub(crate) fn rustls(what: &'static str) -> impl FnOnce(rustls::Error) -> TlsError {
        move |e| TlsError::Crypto { what, message: e.to_string() }
    }
}

/// The ALPN protocol an enrolled agent's ClientHello carries:
/// `flotilla-cert/` and the hex SHA-256 of the certificate it will present.
pub const CLAIM_PREFIX: &[u8] = b"flotilla-cert/";

/// The ALPN protocol naming the certificate with fingerprint `fp`.
pub fn certificate_claim(fp: &Fingerprint) -> Vec<u8> {
    let mut claim = CLAIM_PREFIX.to_vec();
    claim.extend_from_slice(hex::encode(fp).as_bytes());
    claim
}

/// The certificate a ClientHello's ALPN protocols claim, if one of them
/// is a well-formed claim (the first such).
pub fn claimed_certificate<'a>(mut alpn: impl Iterator<Item = &'a [u8]>) -> Option<Fingerprint> {
    alpn.find_map(|p| {
        let hex = p.strip_prefix(CLAIM_PREFIX)?;
        let mut fp = [0u8; 32];
        hex::decode_to_slice(hex, &mut fp).ok()?;
        Some(fp)
    })
}

/// The SHA-256 of `der`.
pub fn fingerprint(der: &[u8]) -> Fingerprint {
    Sha256::digest(der).into()
}

/// The crypto backend every configuration here uses.
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

fn roots(ca: &CertificateDer<'static>) -> Result<Arc<RootCertStore>, TlsError> {
    let mut roots = RootCertStore::empty();
    roots.add(ca.clone()).map_err(TlsError::rustls("the CA as a trust root"))?;
    Ok(Arc::new(roots))
}

/// The master's side: presents `chain` (its certificate, then the CA's),
/// asks for a client certificate issued by `ca` and accepts a connection
/// without one (enrollment).
pub fn server_config(
    ca: &CertificateDer<'static>,
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> Result<Arc<ServerConfig>, TlsError> {
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(roots(ca)?, provider())
        .allow_unauthenticated()
        .build()
        .map_err(|e| TlsError::Crypto { what: "the client verifier", message: e.to_string() })?;
    let config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(TlsError::rustls("the server configuration"))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .map_err(TlsError::rustls("the server configuration"))?;
    Ok(Arc::new(config))
}

/// Checks a node certificate an enrolling agent got back: issued by `ca`
/// for a client (signature, validity, key usage), for `public_key` (the
/// raw key the agent sent) and for the node `node` (its common name).
/// The answer to a tampered or confused enrollment is refused here, not
/// kept and found unusable at the next connect.
pub fn check_node_certificate(
    ca: &CertificateDer<'static>,
    cert: &CertificateDer<'static>,
    public_key: &[u8],
    node: &str,
) -> Result<(), String> {
    let verifier =
        rustls::server::WebPkiClientVerifier::builder_with_provider(roots(ca).map_err(|e| e.to_string())?, provider())
            .build()
            .map_err(|e| e.to_string())?;
    verifier.verify_client_cert(cert, &[], rustls::pki_types::UnixTime::now()).map_err(|e| e.to_string())?;
    let der: &[u8] = cert.as_ref();
    if public_key.is_empty() || !der.windows(public_key.len()).any(|w| w == public_key) {
        return Err("it is not for the key this agent sent".into());
    }
    // The common name (OID 2.5.4.3) as a UTF8String or PrintableString.
    let named = [0x0c_u8, 0x13].iter().any(|tag| {
        let Ok(len) = u8::try_from(node.len()) else { return false };
        let mut cn = vec![0x06, 0x03, 0x55, 0x04, 0x03, *tag, len];
        cn.extend_from_slice(node.as_bytes());
        der.windows(cn.len()).any(|w| w == cn.as_slice())
    });
    if !named {
        return Err(format!("it does not name node {node}"));
    }
    Ok(())
}

/// An enrolled agent's side: trusts only `ca`, presents its certificate.
pub fn client_config(
    ca: &CertificateDer<'static>,
    cert: CertificateDer<'static>,
    key: PrivateKeyDer<'static>,
) -> Result<Arc<ClientConfig>, TlsError> {
    let claim = certificate_claim(&fingerprint(&cert));
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(TlsError::rustls("the client configuration"))?
        .with_root_certificates(roots(ca)?)
        .with_client_auth_cert(vec![cert], key)
        .map_err(TlsError::rustls("the client configuration"))?;
    // Read by the master's listener before the handshake (module doc).
    config.alpn_protocols = vec![claim];
    Ok(Arc::new(config))
}

/// An agent enrolling: trusts the CA whose fingerprint the join token
/// carries, presents nothing.
pub fn enroll_config(ca_pin: Fingerprint) -> Result<Arc<ClientConfig>, TlsError> {
    let config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(TlsError::rustls("the enrollment configuration"))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(pin::PinnedCa::new(ca_pin)))
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// The name agents verify in the master's certificate.
pub fn master_name() -> ServerName<'static> {
    ServerName::try_from(MASTER_NAME).expect("MASTER_NAME is a valid DNS name")
}

/// Agent side: TLS over `tcp` to the master, within `timeout`.
pub async fn connect(
    config: Arc<ClientConfig>,
    tcp: tokio::net::TcpStream,
    timeout: std::time::Duration,
) -> std::io::Result<crate::protocol::handshake::LinkStream> {
    let connector = tokio_rustls::TlsConnector::from(config);
    match tokio::time::timeout(timeout, connector.connect(master_name(), tcp)).await {
        Ok(Ok(stream)) => Ok(Box::new(stream)),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "TLS handshake with the master timed out")),
    }
}

#[cfg(test)]
mod tests {
    use super::ca::Ca;
    use super::credentials::NewKey;
    use super::*;
    use crate::ids::NodeId;

    #[test]
    fn an_enrolling_agent_refuses_a_certificate_not_for_its_key_node_or_ca() {
        let ca = Ca::generate().unwrap();
        let key = NewKey::generate().unwrap();
        let node = NodeId::new("node-7");
        let cert = ca.issue_node(&node, &key.public_key(), [1; 16]).unwrap();
        check_node_certificate(ca.cert(), &cert, &key.public_key(), "node-7").expect("the right certificate");

        let other_key = NewKey::generate().unwrap();
        let err = check_node_certificate(ca.cert(), &cert, &other_key.public_key(), "node-7").unwrap_err();
        assert!(err.contains("not for the key"), "{err}");
        let err = check_node_certificate(ca.cert(), &cert, &key.public_key(), "node-8").unwrap_err();
        assert!(err.contains("does not name node node-8"), "{err}");
        // A prefix of the name is not the name.
        assert!(check_node_certificate(ca.cert(), &cert, &key.public_key(), "node-").is_err());
        let other_ca = Ca::generate().unwrap();
        let forged = other_ca.issue_node(&node, &key.public_key(), [1; 16]).unwrap();
        assert!(check_node_certificate(ca.cert(), &forged, &key.public_key(), "node-7").is_err(), "another CA's");
        let (master_chain, _) = ca.master_identity().unwrap();
        let err = check_node_certificate(ca.cert(), &master_chain[0], &key.public_key(), "node-7").unwrap_err();
        assert!(!err.is_empty(), "the master's server certificate is no client certificate");
    }

    #[test]
    fn a_claim_names_a_certificate_and_nothing_else_passes_for_one() {
        let fp = fingerprint(b"some certificate");
        let claim = certificate_claim(&fp);
        let protocols: [&[u8]; 3] = [b"h2", b"flotilla-cert/zz", &claim];
        assert_eq!(claimed_certificate(protocols.into_iter()), Some(fp), "the well-formed one is found");
        assert_eq!(claimed_certificate([&b"http/1.1"[..]].into_iter()), None);
        let short = &claim[..claim.len() - 2];
        assert_eq!(claimed_certificate([short].into_iter()), None, "a truncated claim");
        let mut upper = claim.clone();
        upper.push(b'0');
        assert_eq!(claimed_certificate([&upper[..]].into_iter()), None, "one hex digit too many");
    }
}
