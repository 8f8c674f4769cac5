//! The master's certificate authority: made once by `flotilla master
//! --init` under `<data-dir>/ca/` (`ca.crt`, and `ca.key` mode 0600 in a
//! 0700 directory), then loaded at every start. It issues the master's own
//! certificate (a fresh key at every start) and one certificate per
//! enrolled node, for the public key the node sent: a node's private key
//! never leaves the node.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, PublicKeyData, SerialNumber, SignatureAlgorithm,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use time::OffsetDateTime;

use super::{Fingerprint, MASTER_NAME, TlsError, fingerprint};
use crate::ids::NodeId;
use crate::private_file::{private_dir, write_private};

/// How long certificates are valid. Nodes have no renewal yet, so a node's
/// certificate outlives any sensible deployment; revocation is the control.
const NODE_VALIDITY: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
const CA_VALIDITY: Duration = Duration::from_secs(20 * 365 * 24 * 3600);
/// Clocks between machines differ; a certificate is valid from a little
/// before it was made.
const BACKDATE: Duration = Duration::from_secs(3600);

/// The signature algorithm of every key here (and the only one a node may
/// enroll with): ECDSA P-256 with SHA-256.
pub static ALGORITHM: &SignatureAlgorithm = &rcgen::PKCS_ECDSA_P256_SHA256;

pub struct Ca {
    issuer: Issuer<'static, KeyPair>,
    cert: CertificateDer<'static>,
}

impl std::fmt::Debug for Ca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ca").field("fingerprint", &hex::encode(self.fingerprint())).finish()
    }
}

fn files(dir: &Path) -> (PathBuf, PathBuf) {
    (dir.join("ca.crt"), dir.join("ca.key"))
}

/// Writes a CA's files into a directory beside `dir`, then renames that
/// into place: a crash leaves no CA or a whole one, never a certificate
/// without its key (or a key that blocks `--init`). `dir` must hold no CA.
fn write_pem(dir: &Path, cert_pem: &str, key_pem: &str) -> Result<(), TlsError> {
    let io = |what: &'static str, path: &Path| {
        let path = path.display().to_string();
        move |source| TlsError::Io { what, path, source }
    };
    let name = dir.file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_else(|| "ca".into());
    let tmp = dir.with_file_name(format!(".{name}.new"));
    let _ = std::fs::remove_dir_all(&tmp);
    private_dir(&tmp).map_err(io("creating the CA directory", &tmp))?;
    let (tmp_crt, tmp_key) = files(&tmp);
    write_private(&tmp_key, key_pem.as_bytes()).map_err(io("writing the CA key", &tmp_key))?;
    write_private(&tmp_crt, cert_pem.as_bytes()).map_err(io("writing the CA certificate", &tmp_crt))?;
    // An empty `dir` (made by hand, or left by an older release) is
    // replaced; one with anything in it was refused or removed before.
    let _ = std::fs::remove_dir(dir);
    std::fs::rename(&tmp, dir).map_err(io("putting the CA in place", dir))?;
    let parent = dir.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::File::open(parent).and_then(|d| d.sync_all()).map_err(io("syncing", parent))?;
    Ok(())
}

/// The CA's subject. Fixed, so the issuer is rebuilt from the key alone.
fn ca_params() -> CertificateParams {
    let mut params = CertificateParams::default();
    let mut name = DistinguishedName::new();
    name.push(DnType::OrganizationName, "flotilla");
    name.push(DnType::CommonName, "flotilla agent link CA");
    params.distinguished_name = name;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    params
}

fn validity(params: &mut CertificateParams, length: Duration) {
    let now = OffsetDateTime::now_utc();
    params.not_before = now - BACKDATE;
    params.not_after = now + length;
}

fn read(path: &Path, what: &'static str) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Io { what, path: path.display().to_string(), source })
}

impl Ca {
    /// Makes a new CA, kept in memory only (see [`create`](Self::create)).
    pub fn generate() -> Result<Ca, TlsError> {
        let signing = KeyPair::generate_for(ALGORITHM).map_err(TlsError::crypto("the CA key"))?;
        let mut params = ca_params();
        validity(&mut params, CA_VALIDITY);
        let cert = params.self_signed(&signing).map_err(TlsError::crypto("the CA certificate"))?;
        Ok(Ca { cert: cert.der().clone(), issuer: Issuer::new(ca_params(), signing) })
    }

    /// Makes a new CA in `dir` (which must not hold one).
    pub fn create(dir: &Path) -> Result<Ca, TlsError> {
        if Ca::exists(dir) {
            return Err(TlsError::Invalid {
                what: dir.display().to_string(),
                message: "already holds a CA; refusing to replace it (every enrolled agent trusts it)".into(),
            });
        }
        let ca = Ca::generate()?;
        let pem = pem::encode(&pem::Pem::new("CERTIFICATE", ca.cert.to_vec()));
        write_pem(dir, &pem, &ca.issuer.key().serialize_pem())?;
        Ok(ca)
    }

    /// The certificate and key of `dir`'s CA, as PEM text (to share it).
    pub fn read_pem(dir: &Path) -> Result<(String, String), TlsError> {
        let (crt, key) = files(dir);
        let text = |path: &Path, what| {
            String::from_utf8(read(path, what)?)
                .map_err(|_| TlsError::Invalid { what: path.display().to_string(), message: "not a PEM file".into() })
        };
        Ok((text(&crt, "reading the CA certificate")?, text(&key, "reading the CA key")?))
    }

    /// Puts the CA `(certificate, key)` (PEM) in `dir`, in place of
    /// whatever it holds: the installation's CA shared through the store.
    pub fn replace_with_pem(dir: &Path, cert_pem: &str, key_pem: &str) -> Result<(), TlsError> {
        // Checked before anything is replaced.
        KeyPair::from_pem(key_pem)
            .map_err(|e| TlsError::Invalid { what: "the shared CA key".into(), message: e.to_string() })?;
        CertificateDer::from_pem_slice(cert_pem.as_bytes())
            .map_err(|e| TlsError::Invalid { what: "the shared CA certificate".into(), message: e.to_string() })?;
        let _ = std::fs::remove_dir_all(dir);
        write_pem(dir, cert_pem, key_pem)
    }

    /// Loads the CA of `dir`.
    pub fn load(dir: &Path) -> Result<Ca, TlsError> {
        let (crt, key) = files(dir);
        let bad = |path: &Path, message: String| TlsError::Invalid { what: path.display().to_string(), message };
        let key_pem =
            String::from_utf8(read(&key, "reading the CA key")?).map_err(|_| bad(&key, "not a PEM file".into()))?;
        let signing = KeyPair::from_pem(&key_pem).map_err(|e| bad(&key, e.to_string()))?;
        let cert = CertificateDer::from_pem_slice(&read(&crt, "reading the CA certificate")?)
            .map_err(|e| bad(&crt, e.to_string()))?;
        Ok(Ca { cert, issuer: Issuer::new(ca_params(), signing) })
    }

    /// Whether `dir` holds a CA (or anything at all: a CA is never made
    /// over files it did not write).
    pub fn exists(dir: &Path) -> bool {
        let (crt, key) = files(dir);
        crt.exists() || key.exists()
    }

    pub fn cert(&self) -> &CertificateDer<'static> {
        &self.cert
    }

    /// What a join token pins: the SHA-256 of the CA's certificate.
    pub fn fingerprint(&self) -> Fingerprint {
        fingerprint(&self.cert)
    }

    /// A certificate for the master (a new key each call): its chain (the
    /// certificate, then the CA's) and its key.
    pub fn master_identity(&self) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), TlsError> {
        let key = KeyPair::generate_for(ALGORITHM).map_err(TlsError::crypto("the master's key"))?;
        let mut params =
            CertificateParams::new(vec![MASTER_NAME.to_string()]).map_err(TlsError::crypto("the master's name"))?;
        params.distinguished_name.push(DnType::CommonName, MASTER_NAME);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        validity(&mut params, NODE_VALIDITY);
        let cert = params.signed_by(&key, &self.issuer).map_err(TlsError::crypto("the master's certificate"))?;
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        Ok((vec![cert.der().clone(), self.cert.clone()], key))
    }

    /// A client certificate for `node`, for the public key the node sent
    /// (an uncompressed P-256 point, as [`KeyPair::public_key_raw`] gives).
    pub fn issue_node(
        &self,
        node: &NodeId,
        public_key: &[u8],
        serial: [u8; 16],
    ) -> Result<CertificateDer<'static>, TlsError> {
        let key = NodePublicKey::parse(public_key)?;
        let mut params = CertificateParams::default();
        params.distinguished_name.push(DnType::OrganizationName, "flotilla node");
        params.distinguished_name.push(DnType::CommonName, node.as_str());
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.use_authority_key_identifier_extension = true;
        params.serial_number = Some(SerialNumber::from_slice(&serial));
        validity(&mut params, NODE_VALIDITY);
        let cert = params.signed_by(&key, &self.issuer).map_err(TlsError::crypto("the node's certificate"))?;
        Ok(cert.der().clone())
    }
}

/// A node's public key as it enrolls: 65 bytes, `0x04 || X || Y`.
struct NodePublicKey<'a>(&'a [u8]);

impl<'a> NodePublicKey<'a> {
    fn parse(raw: &'a [u8]) -> Result<Self, TlsError> {
        if raw.len() != 65 || raw[0] != 0x04 {
            return Err(TlsError::Invalid {
                what: "the node's public key".into(),
                message: format!("expected an uncompressed P-256 point (65 bytes from 0x04), got {} bytes", raw.len()),
            });
        }
        Ok(NodePublicKey(raw))
    }
}

impl PublicKeyData for NodePublicKey<'_> {
    fn der_bytes(&self) -> &[u8] {
        self.0
    }

    fn algorithm(&self) -> &'static SignatureAlgorithm {
        ALGORITHM
    }
}
