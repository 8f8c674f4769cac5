//! Join tokens: made by `flotilla node token create` (`POST
//! /api/v1/join-tokens`), each good for `uses` enrollments (1 unless asked)
//! until it expires (1 hour unless asked). The token is shown once; the
//! store keeps the SHA-256 of its secret. Expired tokens are dropped when
//! the next one is made. A token may be bound to one node id (`--node`):
//! it then enrolls that node only, and the launcher that made it for a
//! node deletes it with [`Trust::delete_join_tokens_of`] when it gives
//! the launch up.

use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use time::OffsetDateTime;

use super::Trust;
use crate::actors::tokens::random;
use crate::error::Error;
use crate::ids::{NodeId, validate_name};
use crate::protocol::tls::join_token::{ID_BYTES, JoinToken, SECRET_BYTES};
use crate::storage::WriteOp;
use crate::storage::records::RECORD_VERSION;
use crate::storage::trust_records::JoinTokenRecord;

/// At most this many join tokens at once.
pub const MAX_JOIN_TOKENS: usize = 1000;
/// The longest a join token may live: a week.
pub const MAX_TTL: Duration = Duration::from_secs(7 * 24 * 3600);
/// The most enrollments one token may make (a fleet of simulated agents).
pub const MAX_USES: u32 = 100_000;

/// What `create` is asked for.
#[derive(Debug, Clone)]
pub struct JoinTokenSpec {
    pub name: String,
    pub ttl: Duration,
    pub uses: u32,
    /// The only node id it may enroll; `None`: any.
    pub node: Option<NodeId>,
}

/// A token just made: its record, and the token whole, shown this once.
pub struct NewJoinToken {
    pub record: JoinTokenRecord,
    pub token: String,
}

impl std::fmt::Debug for NewJoinToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NewJoinToken").field("id", &self.record.id).finish_non_exhaustive()
    }
}

impl JoinTokenSpec {
    /// What [`Trust::create_join_token`] would refuse.
    pub fn check(&self) -> Result<(), Error> {
        validate_name(&self.name).map_err(|m| Error::invalid("invalid_name", format!("join token name: {m}")))?;
        if self.ttl < Duration::from_secs(1) || self.ttl > MAX_TTL {
            return Err(Error::invalid(
                "invalid_ttl",
                format!("ttl must be between 1 s and {} h, got {} s", MAX_TTL.as_secs() / 3600, self.ttl.as_secs()),
            ));
        }
        if self.uses == 0 || self.uses > MAX_USES {
            return Err(Error::invalid("invalid_uses", format!("uses must be 1..={MAX_USES}, got {}", self.uses)));
        }
        if let Some(node) = &self.node {
            validate_name(node.as_str()).map_err(|m| Error::invalid("invalid_node_id", format!("node id: {m}")))?;
        }
        Ok(())
    }
}

impl Trust {
    /// Every join token not expired, by id.
    pub fn join_tokens(&self) -> Vec<Arc<JoinTokenRecord>> {
        let now = OffsetDateTime::now_utc();
        self.tables.load().tokens.values().filter(|t| t.expires_at > now).cloned().collect()
    }

    /// What [`create_join_token`](Self::create_join_token) would refuse.
    pub fn check_create_join_token(&self, spec: &JoinTokenSpec) -> Result<(), Error> {
        spec.check()?;
        let now = OffsetDateTime::now_utc();
        if self.tables.load().tokens.values().filter(|t| t.expires_at > now).count() >= MAX_JOIN_TOKENS {
            return Err(Error::conflict(
                "too_many_join_tokens",
                format!("at most {MAX_JOIN_TOKENS} join tokens; delete one first"),
            ));
        }
        Ok(())
    }

    /// Makes a join token; answers once it is durable.
    pub async fn create_join_token(self: &Arc<Self>, spec: &JoinTokenSpec) -> Result<NewJoinToken, Error> {
        let one = self.writes.clone().lock_owned().await;
        self.check_create_join_token(spec)?;
        let mut next = (**self.tables.load()).clone();
        let now = OffsetDateTime::now_utc();
        let expired: Vec<String> = next.tokens.values().filter(|t| t.expires_at <= now).map(|t| t.id.clone()).collect();
        let mut ops: Vec<WriteOp> = expired.iter().map(|id| WriteOp::delete_join_token(id)).collect();
        for id in &expired {
            next.tokens.remove(id);
        }
        let (id, secret) = loop {
            let id = hex::encode(random::<ID_BYTES>()?);
            if !next.tokens.contains_key(&id) {
                break (id, hex::encode(random::<SECRET_BYTES>()?));
            }
        };
        let record = JoinTokenRecord {
            version: RECORD_VERSION,
            id: id.clone(),
            name: spec.name.clone(),
            secret_sha256: Sha256::digest(secret.as_bytes()).into(),
            created_at: now,
            expires_at: now + spec.ttl,
            uses_left: spec.uses,
            node: spec.node.clone(),
        };
        let token = JoinToken { id: id.clone(), secret, ca: self.ca_fingerprint() }.to_string();
        ops.push(WriteOp::put_join_token(&record)?);
        next.tokens.insert(id, Arc::new(record.clone()));
        self.commit_then_swap(one, ops, next).await?;
        Ok(NewJoinToken { record, token })
    }

    /// Deletes join token `id`: no enrollment with it from this answer on.
    pub async fn delete_join_token(self: &Arc<Self>, id: &str) -> Result<JoinTokenRecord, Error> {
        let one = self.writes.clone().lock_owned().await;
        let mut next = (**self.tables.load()).clone();
        let Some(record) = next.tokens.remove(id) else {
            return Err(Error::not_found("join token", id));
        };
        self.commit_then_swap(one, vec![WriteOp::delete_join_token(id)], next).await?;
        Ok((*record).clone())
    }

    /// Deletes every join token bound to `node` (expired or not): none of
    /// them enrolls it from this answer on. How many there were; answers
    /// once their deletion is durable.
    pub async fn delete_join_tokens_of(self: &Arc<Self>, node: &NodeId) -> Result<usize, Error> {
        let one = self.writes.clone().lock_owned().await;
        let mut next = (**self.tables.load()).clone();
        let bound: Vec<String> =
            next.tokens.values().filter(|t| t.node.as_ref() == Some(node)).map(|t| t.id.clone()).collect();
        if bound.is_empty() {
            return Ok(0);
        }
        let ops = bound.iter().map(|id| WriteOp::delete_join_token(id)).collect();
        for id in &bound {
            next.tokens.remove(id);
        }
        self.commit_then_swap(one, ops, next).await?;
        Ok(bound.len())
    }

    /// The token `id` if `secret` is its secret and it can still be used;
    /// otherwise why not (the same words for an unknown id and a wrong
    /// secret, so the answer tells a guesser nothing).
    pub(super) fn usable_token(&self, id: &str, secret: &str) -> Result<Arc<JoinTokenRecord>, Error> {
        let unknown = || Error::invalid("bad_join_token", "unknown join token (or a wrong secret)");
        let record = self.tables.load().tokens.get(id).cloned().ok_or_else(unknown)?;
        let digest: [u8; 32] = Sha256::digest(secret.as_bytes()).into();
        if !bool::from(digest.ct_eq(&record.secret_sha256)) {
            return Err(unknown());
        }
        if record.expires_at <= OffsetDateTime::now_utc() {
            return Err(Error::invalid("bad_join_token", format!("join token {id} expired at {}", record.expires_at)));
        }
        if record.uses_left == 0 {
            return Err(Error::invalid("bad_join_token", format!("join token {id} is used up")));
        }
        Ok(record)
    }
}
