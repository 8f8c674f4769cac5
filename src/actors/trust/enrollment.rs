//! Enrollment (a join token in, a certificate out) and revocation.
//!
//! A node id has at most one certificate that is not revoked: enrolling an
//! id that has one is refused (so nobody takes over a node's name with a
//! token of their own), until `flotilla node revoke` revokes it. A token
//! bound to a node enrolls that node id only. Revoking
//! closes the node's link at once; its instances are then treated like
//! those of any node that went away.

use std::sync::Arc;

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use time::OffsetDateTime;

use super::Trust;
use crate::actors::tokens::random;
use crate::error::Error;
use crate::ids::{NodeId, validate_name};
use crate::protocol::messages::{EnrollRequest, Enrolled};
use crate::protocol::tls::fingerprint;
use crate::storage::WriteOp;
use crate::storage::records::RECORD_VERSION;
use crate::storage::trust_records::{JoinTokenRecord, NodeCertRecord};

impl Trust {
    /// Issues `request.node_id` a certificate for its public key, using one
    /// use of its join token; answers once both are durable.
    pub async fn enroll(self: &Arc<Self>, request: &EnrollRequest) -> Result<(Enrolled, NodeCertRecord), Error> {
        validate_name(request.node_id.as_str())
            .map_err(|m| Error::invalid("invalid_node_id", format!("node id: {m}")))?;
        let one = self.writes.clone().lock_owned().await;
        let secret_sha256: [u8; 32] = Sha256::digest(request.token_secret.as_bytes()).into();
        // The same node, key and token again: the answer to its first try
        // was lost (a timeout, a crash before it saved it). The same
        // certificate, no second use of the token.
        if let Some(held) = self.tables.load().certs.get(&request.node_id).filter(|c| {
            c.revoked_at.is_none()
                && c.public_key == request.public_key
                && c.token_id == request.token_id
                && bool::from(c.token_secret_sha256.ct_eq(&secret_sha256))
        }) {
            let enrolled =
                Enrolled { certificate_der: held.certificate_der.clone(), ca_der: self.ca.cert().as_ref().to_vec() };
            return Ok((enrolled, (**held).clone()));
        }
        let token = self.usable_token(&request.token_id, &request.token_secret)?;
        // Checked after the secret, so only its holder learns the binding;
        // refused before anything is written, so the use is not spent.
        if let Some(bound) = token.node.as_ref().filter(|n| **n != request.node_id) {
            return Err(Error::invalid(
                "bad_join_token",
                format!("join token {} is bound to node {bound}, not {}", token.id, request.node_id),
            ));
        }
        let mut next = (**self.tables.load()).clone();
        if let Some(held) = next.certs.get(&request.node_id).filter(|c| c.revoked_at.is_none()) {
            return Err(Error::conflict(
                "node_enrolled",
                format!(
                    "node {} is enrolled already (certificate {}, issued {}); revoke it first with `flotilla node revoke {}`",
                    held.node,
                    &hex::encode(held.fingerprint)[..16],
                    held.issued_at,
                    held.node
                ),
            ));
        }
        let mut serial = random::<16>()?;
        serial[0] &= 0x7f; // a positive integer
        let cert = self
            .ca
            .issue_node(&request.node_id, &request.public_key, serial)
            .map_err(|e| Error::invalid("bad_public_key", e.to_string()))?;
        let record = NodeCertRecord {
            version: RECORD_VERSION,
            node: request.node_id.clone(),
            fingerprint: fingerprint(&cert),
            serial,
            token_id: token.id.clone(),
            token_secret_sha256: secret_sha256,
            public_key: request.public_key.clone(),
            certificate_der: cert.as_ref().to_vec(),
            issued_at: OffsetDateTime::now_utc(),
            revoked_at: None,
        };
        let left = JoinTokenRecord { uses_left: token.uses_left - 1, ..(*token).clone() };
        let mut ops = vec![WriteOp::put_node_cert(&record)?];
        if left.uses_left == 0 {
            ops.push(WriteOp::delete_join_token(&left.id));
            next.tokens.remove(&left.id);
        } else {
            ops.push(WriteOp::put_join_token(&left)?);
            next.tokens.insert(left.id.clone(), Arc::new(left));
        }
        next.put_cert(record.clone());
        self.commit_then_swap(one, ops, next).await?;
        let enrolled = Enrolled { certificate_der: cert.as_ref().to_vec(), ca_der: self.ca.cert().as_ref().to_vec() };
        Ok((enrolled, record))
    }

    /// What [`revoke`](Self::revoke) would refuse.
    pub fn check_revoke(&self, node: &NodeId) -> Result<Arc<NodeCertRecord>, Error> {
        let cert = self.cert_of(node).ok_or_else(|| Error::not_found("node certificate", node))?;
        if cert.revoked_at.is_some() {
            return Err(Error::conflict(
                "already_revoked",
                format!("the certificate of node {node} is revoked already"),
            ));
        }
        Ok(cert)
    }

    /// Revokes `node`'s certificate: refused from this answer on. The
    /// caller closes the node's link.
    pub async fn revoke(self: &Arc<Self>, node: &NodeId) -> Result<NodeCertRecord, Error> {
        let one = self.writes.clone().lock_owned().await;
        let cert = self.check_revoke(node)?;
        let revoked = NodeCertRecord { revoked_at: Some(OffsetDateTime::now_utc()), ..(*cert).clone() };
        let mut next = (**self.tables.load()).clone();
        next.put_cert(revoked.clone());
        self.commit_then_swap(one, vec![WriteOp::put_node_cert(&revoked)?], next).await?;
        Ok(revoked)
    }
}
