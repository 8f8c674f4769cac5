//! An enrolled agent's credentials, kept in `<data-dir>/tls/`: `node.key`
//! (its private key, mode 0600, made on the node and never sent),
//! `node.crt` (the certificate the master issued for it), `ca.crt` (the
//! master's CA, the only one it trusts from then on), and `node-id`. A
//! restart with the same data dir connects with them: no new join token.
//!
//! The key is made, and kept as `pending.key`, before the enrollment is
//! sent; `node-id` is written last. An enrollment cut short leaves no
//! `node-id`: the agent enrolls again with the same key, and the master
//! answers a retry with the same key and token with the same certificate.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::KeyPair;
use rustls::ClientConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

use super::{Fingerprint, TlsError, ca::ALGORITHM, client_config, fingerprint};
use crate::ids::NodeId;
use crate::private_file::{private_dir, write_private};

pub struct Credentials {
    pub node_id: NodeId,
    pub cert: CertificateDer<'static>,
    pub ca: CertificateDer<'static>,
    /// PKCS#8 DER.
    key: Vec<u8>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("node_id", &self.node_id)
            .field("cert", &hex::encode(self.fingerprint()))
            .finish_non_exhaustive()
    }
}

/// A key made for an enrollment, kept until the certificate comes back.
pub struct NewKey(KeyPair);

impl NewKey {
    pub fn generate() -> Result<NewKey, TlsError> {
        KeyPair::generate_for(ALGORITHM).map(NewKey).map_err(TlsError::crypto("the node's key"))
    }

    /// The key of an enrollment not finished in `data_dir`
    /// (`tls/pending.key`), or a new one kept there (0600) before it is
    /// used: an enrollment retried after a crash or a lost answer sends the
    /// same key, and the master answers it with the same certificate.
    pub fn pending(data_dir: &Path) -> Result<NewKey, TlsError> {
        let dir = dir(data_dir);
        let path = dir.join("pending.key");
        match std::fs::read_to_string(&path) {
            Ok(pem) => {
                return KeyPair::from_pem(&pem)
                    .map(NewKey)
                    .map_err(|e| TlsError::Invalid { what: path.display().to_string(), message: e.to_string() });
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io("reading", &path)(e)),
        }
        let key = NewKey::generate()?;
        private_dir(&dir).map_err(io("creating", &dir))?;
        write_private(&path, key.0.serialize_pem().as_bytes()).map_err(io("writing", &path))?;
        Ok(key)
    }

    /// What the master signs: the uncompressed P-256 point.
    pub fn public_key(&self) -> Vec<u8> {
        self.0.public_key_raw().to_vec()
    }

    pub fn into_credentials(
        self,
        node_id: NodeId,
        cert: CertificateDer<'static>,
        ca: CertificateDer<'static>,
    ) -> Credentials {
        Credentials { node_id, cert, ca, key: self.0.serialize_der() }
    }
}

/// `<data-dir>/tls`.
pub fn dir(data_dir: &Path) -> PathBuf {
    data_dir.join("tls")
}

fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> TlsError {
    let path = path.display().to_string();
    move |source| TlsError::Io { what, path, source }
}

impl Credentials {
    /// The credentials kept in `data_dir`; `None` when the agent has not
    /// finished an enrollment there.
    pub fn load(data_dir: &Path) -> Result<Option<Credentials>, TlsError> {
        let dir = dir(data_dir);
        let id_file = dir.join("node-id");
        let node_id = match std::fs::read_to_string(&id_file) {
            Ok(s) => s.trim().to_string(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io("reading", &id_file)(e)),
        };
        let bad = |path: &Path, message: String| TlsError::Invalid { what: path.display().to_string(), message };
        crate::ids::validate_name(&node_id).map_err(|m| bad(&id_file, m))?;
        let read = |name: &str| {
            let path = dir.join(name);
            std::fs::read(&path).map_err(io("reading", &path)).map(|b| (b, path))
        };
        let (bytes, path) = read("node.crt")?;
        let cert = CertificateDer::from_pem_slice(&bytes).map_err(|e| bad(&path, e.to_string()))?;
        let (bytes, path) = read("ca.crt")?;
        let ca = CertificateDer::from_pem_slice(&bytes).map_err(|e| bad(&path, e.to_string()))?;
        let (bytes, path) = read("node.key")?;
        let key = PrivatePkcs8KeyDer::from_pem_slice(&bytes).map_err(|e| bad(&path, e.to_string()))?;
        Ok(Some(Credentials { node_id: NodeId::new(&node_id), cert, ca, key: key.secret_pkcs8_der().to_vec() }))
    }

    /// Keeps these credentials in `data_dir`.
    pub fn save(&self, data_dir: &Path) -> Result<(), TlsError> {
        let dir = dir(data_dir);
        private_dir(&dir).map_err(io("creating", &dir))?;
        let pem = |label: &str, der: &[u8]| pem_encode(label, der);
        let files = [
            ("node.key", pem("PRIVATE KEY", &self.key)),
            ("node.crt", pem("CERTIFICATE", &self.cert)),
            ("ca.crt", pem("CERTIFICATE", &self.ca)),
            ("node-id", format!("{}\n", self.node_id)),
        ];
        for (name, body) in files {
            let path = dir.join(name);
            write_private(&path, body.as_bytes()).map_err(io("writing", &path))?;
        }
        // Enrolled: the pending key is node.key now.
        let _ = std::fs::remove_file(dir.join("pending.key"));
        Ok(())
    }

    /// The fingerprint of this node's certificate.
    pub fn fingerprint(&self) -> Fingerprint {
        fingerprint(&self.cert)
    }

    /// The TLS configuration to connect to the master with.
    pub fn client_config(&self) -> Result<Arc<ClientConfig>, TlsError> {
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.key.clone()));
        client_config(&self.ca, self.cert.clone(), key)
    }
}

fn pem_encode(label: &str, der: &[u8]) -> String {
    pem::encode(&pem::Pem::new(label, der.to_vec()))
}
