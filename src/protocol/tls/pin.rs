//! How an agent that is not enrolled yet knows it talks to its master: the
//! join token carries the SHA-256 of the master's CA certificate (as
//! kubeadm's `--discovery-token-ca-cert-hash` does). The master sends the
//! CA certificate behind its own; [`PinnedCa`] takes the one whose hash is
//! the pin as the only trust root and verifies the master's certificate
//! against it as usual (signature, validity, [`super::MASTER_NAME`]). A
//! master without that CA fails the handshake, before the join token is
//! sent.

use std::sync::Arc;

use rustls::DigitallySignedStruct;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};

use super::{Fingerprint, fingerprint, provider};

#[derive(Debug)]
pub struct PinnedCa {
    pin: Fingerprint,
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl PinnedCa {
    pub fn new(pin: Fingerprint) -> PinnedCa {
        PinnedCa { pin, provider: provider() }
    }
}

impl ServerCertVerifier for PinnedCa {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let Some(ca) = intermediates.iter().find(|c| fingerprint(c) == self.pin) else {
            return Err(rustls::Error::General(
                "the master's CA is not the one the join token names (another master, or someone posing as it)".into(),
            ));
        };
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca.clone().into_owned())?;
        let verifier =
            rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), self.provider.clone())
                .build()
                .map_err(|e| rustls::Error::General(e.to_string()))?;
        verifier.verify_server_cert(end_entity, &[], server_name, ocsp_response, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.provider.signature_verification_algorithms.supported_schemes()
    }
}
