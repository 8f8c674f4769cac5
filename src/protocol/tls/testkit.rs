//! **For tests** that play the master's side of the agent link without a
//! master (`tests/common/fake_master.rs`, the simulated agent's unit
//! tests): a CA in memory that accepts TLS connections like the master's
//! listener and issues a certificate to whoever enrolls, with a join
//! token that pins it. It checks no token secret: the real checks are the
//! master's ([`crate::actors::trust`]).

use rustls::pki_types::CertificateDer;

use super::ca::Ca;
use super::join_token::JoinToken;
use super::{Fingerprint, TlsError, fingerprint};
use crate::protocol::handshake::LinkStream;
use crate::protocol::messages::{EnrollRequest, Enrolled};

pub struct TestAuthority {
    ca: Ca,
    acceptor: tokio_rustls::TlsAcceptor,
}

impl TestAuthority {
    pub fn new() -> Result<TestAuthority, TlsError> {
        let ca = Ca::generate()?;
        let (chain, key) = ca.master_identity()?;
        let acceptor = tokio_rustls::TlsAcceptor::from(super::server_config(ca.cert(), chain, key)?);
        Ok(TestAuthority { ca, acceptor })
    }

    /// A join token that pins this CA.
    pub fn join_token(&self) -> String {
        JoinToken { id: "000000000000".into(), secret: "0".repeat(32), ca: self.ca.fingerprint() }.to_string()
    }

    /// TLS over an accepted connection: the stream, and the fingerprint
    /// of the client's certificate if it sent one.
    pub async fn accept(&self, tcp: tokio::net::TcpStream) -> std::io::Result<(LinkStream, Option<Fingerprint>)> {
        let stream = self.acceptor.accept(tcp).await?;
        let peer = stream.get_ref().1.peer_certificates().and_then(|c| c.first()).map(|c| fingerprint(c));
        Ok((Box::new(stream), peer))
    }

    /// The certificate for an enrollment.
    pub fn enroll(&self, request: &EnrollRequest) -> Result<Enrolled, TlsError> {
        let cert: CertificateDer<'static> = self.ca.issue_node(&request.node_id, &request.public_key, [1; 16])?;
        Ok(Enrolled { certificate_der: cert.as_ref().to_vec(), ca_der: self.ca.cert().as_ref().to_vec() })
    }
}
