//! [`Trust`]: who may be an agent of this master. It holds the CA (see
//! [`crate::protocol::tls::ca`]), the TLS configuration of the agent
//! listener, the join tokens ([`join_tokens`]) and the certificate issued
//! to each node ([`enrollment`]), and answers the one question the agent
//! listener asks of every connection that presents a certificate: which
//! node is this ([`Trust::identify`])? With several masters on etcd the CA
//! is the installation's, shared through the store ([`shared_ca`]).
//!
//! The tables are read without a lock (an `ArcSwap`) and change only after
//! the store acknowledged the write, in a task of its own, so a request
//! that stops waiting cannot leave the store changed and the table not (a
//! revoked certificate still accepted). Changes are made one at a time.

pub mod enrollment;
pub mod join_tokens;
pub mod shared_ca;

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::Arc;

use arc_swap::ArcSwap;

use crate::error::Error;
use crate::ids::NodeId;
use crate::protocol::tls::ca::Ca;
use crate::protocol::tls::{Fingerprint, TlsError};
use crate::storage::keys::master_cf;
use crate::storage::meta::{self, MetaStore};
use crate::storage::trust_records::{JoinTokenRecord, NodeCertRecord};
use crate::storage::{StorageError, WriteOp};

/// The tables, swapped whole.
#[derive(Clone, Default)]
struct Tables {
    tokens: BTreeMap<String, Arc<JoinTokenRecord>>,
    certs: BTreeMap<NodeId, Arc<NodeCertRecord>>,
    /// Certificates not revoked, by fingerprint.
    by_fingerprint: HashMap<Fingerprint, NodeId>,
}

impl Tables {
    fn put_cert(&mut self, cert: NodeCertRecord) {
        if let Some(old) = self.certs.get(&cert.node) {
            self.by_fingerprint.remove(&old.fingerprint);
        }
        if cert.revoked_at.is_none() {
            self.by_fingerprint.insert(cert.fingerprint, cert.node.clone());
        }
        self.certs.insert(cert.node.clone(), Arc::new(cert));
    }
}

pub struct Trust {
    ca: Ca,
    acceptor: tokio_rustls::TlsAcceptor,
    store: Arc<dyn MetaStore>,
    tables: ArcSwap<Tables>,
    writes: Arc<tokio::sync::Mutex<()>>,
}

/// Why the trust tables could not be set up at start.
#[derive(Debug, thiserror::Error)]
pub enum TrustError {
    #[error(
        "{dir} holds no CA for the agent link; start the master once with --init to create it (agents enrolled with another CA must enroll again)"
    )]
    NoCa { dir: String },
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error(transparent)]
    Storage(#[from] StorageError),
}

impl Trust {
    /// Loads the CA from `ca_dir` (making it when `create` and there is
    /// none) and the tables from the store (blocking: boot only).
    pub fn load(store: Arc<dyn MetaStore>, ca_dir: &Path, create: bool) -> Result<Arc<Trust>, TrustError> {
        let ca = if Ca::exists(ca_dir) {
            Ca::load(ca_dir)?
        } else if create {
            let ca = Ca::create(ca_dir)?;
            tracing::info!(dir = %ca_dir.display(), fingerprint = %hex::encode(ca.fingerprint()), "created the agent link's CA");
            ca
        } else {
            return Err(TrustError::NoCa { dir: ca_dir.display().to_string() });
        };
        let (chain, key) = ca.master_identity()?;
        let server = crate::protocol::tls::server_config(ca.cert(), chain, key)?;
        let mut tables = Tables::default();
        for t in meta::load::<JoinTokenRecord>(store.as_ref(), master_cf::JOIN_TOKENS)? {
            tables.tokens.insert(t.id.clone(), Arc::new(t));
        }
        for c in meta::load::<NodeCertRecord>(store.as_ref(), master_cf::NODE_CERTS)? {
            tables.put_cert(c);
        }
        Ok(Arc::new(Trust {
            ca,
            acceptor: tokio_rustls::TlsAcceptor::from(server),
            store,
            tables: ArcSwap::from_pointee(tables),
            writes: Arc::default(),
        }))
    }

    /// The agent listener's TLS.
    pub fn acceptor(&self) -> &tokio_rustls::TlsAcceptor {
        &self.acceptor
    }

    /// What join tokens pin.
    pub fn ca_fingerprint(&self) -> Fingerprint {
        self.ca.fingerprint()
    }

    /// The node the certificate with this fingerprint was issued to, or
    /// why it is refused.
    pub fn identify(&self, fingerprint: &Fingerprint) -> Result<NodeId, String> {
        if let Some(node) = self.tables.load().by_fingerprint.get(fingerprint) {
            return Ok(node.clone());
        }
        let tables = self.tables.load();
        match tables.certs.values().find(|c| &c.fingerprint == fingerprint) {
            Some(c) => {
                Err(format!("the certificate of node {} was revoked; enroll it again with a new join token", c.node))
            }
            None => Err("this certificate is not one this master issued (or it was replaced); enroll again".into()),
        }
    }

    /// The certificate issued to `node`, if any.
    pub fn cert_of(&self, node: &NodeId) -> Option<Arc<NodeCertRecord>> {
        self.tables.load().certs.get(node).cloned()
    }

    /// Writes `ops`, then applies `change` to the tables, in a task of its
    /// own (see the module doc); the caller holds `one` (the write lock).
    async fn commit_then_swap(
        self: &Arc<Self>,
        one: tokio::sync::OwnedMutexGuard<()>,
        ops: Vec<WriteOp>,
        next: Tables,
    ) -> Result<(), Error> {
        let me = self.clone();
        let task = tokio::spawn(async move {
            let written = me.store.try_commit(ops).await;
            if written.is_ok() {
                me.tables.store(Arc::new(next));
            }
            drop(one);
            written
        });
        task.await.map_err(|e| Error::Internal { message: format!("trust write task: {e}") })?.map_err(Error::from)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::join_tokens::JoinTokenSpec;
    use super::*;
    use crate::protocol::messages::{EnrollRequest, PROTOCOL_VERSION};
    use crate::protocol::tls::credentials::NewKey;
    use crate::protocol::tls::join_token::JoinToken;
    use crate::storage::MasterStore;

    fn request(node: &str, token: &JoinToken, key: &NewKey) -> EnrollRequest {
        EnrollRequest {
            protocol_version: PROTOCOL_VERSION,
            node_id: NodeId::new(node),
            token_id: token.id.clone(),
            token_secret: token.secret.clone(),
            public_key: key.public_key(),
        }
    }

    /// One use each; a retry with the same key and token (its answer was
    /// lost) gets the same certificate without a second use; nothing else
    /// gets a second certificate for a node; all of it survives a reopen,
    /// and a revocation too.
    #[tokio::test]
    async fn enrollments_spend_uses_once_retries_are_idempotent_and_revocations_last() {
        let dir = tempfile::tempdir().unwrap();
        let open = || {
            let store: Arc<dyn MetaStore> = Arc::new(MasterStore::open(&dir.path().join("db")).unwrap());
            Trust::load(store, &dir.path().join("ca"), true).unwrap()
        };
        let trust = open();
        let spec = JoinTokenSpec { name: "t".into(), ttl: Duration::from_secs(60), uses: 2, node: None };
        let made = trust.create_join_token(&spec).await.unwrap();
        let token: JoinToken = made.token.parse().unwrap();
        assert_eq!(token.ca, trust.ca_fingerprint());

        let key = NewKey::generate().unwrap();
        let (first, record) = trust.enroll(&request("n1", &token, &key)).await.unwrap();
        let (again, _) = trust.enroll(&request("n1", &token, &key)).await.unwrap();
        assert_eq!(first.certificate_der, again.certificate_der, "a retry got another certificate");
        assert_eq!(trust.join_tokens()[0].uses_left, 1, "the retry spent a use");
        assert_eq!(trust.identify(&record.fingerprint), Ok(NodeId::new("n1")));

        let other_key = NewKey::generate().unwrap();
        let taken = trust.enroll(&request("n1", &token, &other_key)).await.unwrap_err();
        assert!(taken.to_string().contains("enrolled already"), "{taken}");
        trust.enroll(&request("n2", &token, &other_key)).await.unwrap();
        assert!(trust.join_tokens().is_empty(), "a token used up is gone");
        let spent = trust.enroll(&request("n3", &token, &NewKey::generate().unwrap())).await.unwrap_err();
        assert!(spent.to_string().contains("unknown join token"), "{spent}");

        trust.revoke(&NodeId::new("n1")).await.unwrap();
        assert!(trust.identify(&record.fingerprint).unwrap_err().contains("revoked"));
        drop(trust);
        let reopened = open();
        assert!(reopened.identify(&record.fingerprint).unwrap_err().contains("revoked"), "the revocation was lost");
        assert_eq!(reopened.ca_fingerprint(), token.ca, "the CA changed across a reopen");
        // Revoked: the node may enroll again (a new token, a new key).
        let spec = JoinTokenSpec { uses: 1, ..spec };
        let fresh: JoinToken = reopened.create_join_token(&spec).await.unwrap().token.parse().unwrap();
        let (_, renewed) = reopened.enroll(&request("n1", &fresh, &NewKey::generate().unwrap())).await.unwrap();
        assert_eq!(reopened.identify(&renewed.fingerprint), Ok(NodeId::new("n1")));
    }

    /// A token bound to a node enrolls that node only: another node id is
    /// refused, saying so, without spending the use; the bound node still
    /// enrolls with it afterwards.
    #[tokio::test]
    async fn a_bound_token_enrolls_its_node_only() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn MetaStore> = Arc::new(MasterStore::open(&dir.path().join("db")).unwrap());
        let trust = Trust::load(store, &dir.path().join("ca"), true).unwrap();
        let bad = JoinTokenSpec {
            name: "t".into(),
            ttl: Duration::from_secs(60),
            uses: 1,
            node: Some(NodeId::new("Node_1")),
        };
        let err = trust.create_join_token(&bad).await.unwrap_err();
        assert!(matches!(&err, Error::Invalid { code, .. } if *code == "invalid_node_id"), "{err:?}");

        let spec = JoinTokenSpec { node: Some(NodeId::new("n1")), ..bad };
        let made = trust.create_join_token(&spec).await.unwrap();
        assert_eq!(made.record.node, Some(NodeId::new("n1")));
        let token: JoinToken = made.token.parse().unwrap();

        let err = trust.enroll(&request("n2", &token, &NewKey::generate().unwrap())).await.unwrap_err();
        let said = format!("join token {} is bound to node n1, not n2", token.id);
        assert!(
            matches!(&err, Error::Invalid { code, message } if *code == "bad_join_token" && *message == said),
            "{err:?}"
        );
        assert_eq!(trust.join_tokens().len(), 1, "a refused enrollment spent the token");
        assert_eq!(trust.join_tokens()[0].uses_left, 1, "a refused enrollment spent a use");
        assert!(trust.cert_of(&NodeId::new("n2")).is_none());

        let (_, record) = trust.enroll(&request("n1", &token, &NewKey::generate().unwrap())).await.unwrap();
        assert_eq!(trust.identify(&record.fingerprint), Ok(NodeId::new("n1")));
        assert!(trust.join_tokens().is_empty(), "a token used up is gone");
    }

    /// `delete_join_tokens_of` deletes the tokens bound to that node, and
    /// only those, durably.
    #[tokio::test]
    async fn the_tokens_of_a_node_are_deleted_together_and_stay_deleted() {
        let dir = tempfile::tempdir().unwrap();
        let open = || {
            let store: Arc<dyn MetaStore> = Arc::new(MasterStore::open(&dir.path().join("db")).unwrap());
            Trust::load(store, &dir.path().join("ca"), true).unwrap()
        };
        let trust = open();
        let spec = |node: Option<&str>| JoinTokenSpec {
            name: "t".into(),
            ttl: Duration::from_secs(60),
            uses: 1,
            node: node.map(NodeId::new),
        };
        for node in [Some("n1"), Some("n1"), Some("n2"), None] {
            trust.create_join_token(&spec(node)).await.unwrap();
        }
        assert_eq!(trust.delete_join_tokens_of(&NodeId::new("n1")).await.unwrap(), 2);
        assert_eq!(trust.delete_join_tokens_of(&NodeId::new("n1")).await.unwrap(), 0);
        assert_eq!(trust.delete_join_tokens_of(&NodeId::new("n9")).await.unwrap(), 0);
        let left = |t: &Trust| {
            let mut nodes: Vec<Option<NodeId>> = t.join_tokens().iter().map(|r| r.node.clone()).collect();
            nodes.sort();
            nodes
        };
        let want = vec![None, Some(NodeId::new("n2"))];
        assert_eq!(left(&trust), want);
        drop(trust);
        assert_eq!(left(&open()), want, "the deletion did not last");
    }
}
