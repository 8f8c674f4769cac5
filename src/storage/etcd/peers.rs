//! The masters of one installation, as each names itself in etcd
//! (`<prefix>_masters/<name>`: its API URL), and the secret they present
//! to each other (`<prefix>_peer_secret`). Package blobs live on the
//! masters' disks, not in etcd: an upload is accepted once a majority of
//! these masters hold it, and a master missing one fetches it from another
//! (`actors::peer_blobs`).
//!
//! These are control keys, outside the store's column families: every
//! master writes its own entry (followers included), so they are plain
//! puts, not the leader's fenced transactions. An entry stays until an
//! operator removes a master for good (`etcdctl del <prefix>_masters/<name>`):
//! the majority counts the installation's masters, not the ones up now.

use etcd_client::{Compare, CompareOp, Txn, TxnOp};

use super::bridge::etcd_error;
use super::conn::Conn;
use super::layout::prefix_end;
use super::members::read_retryable;
use crate::storage::StorageError;

/// One master as the others reach it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Peer {
    pub name: String,
    /// Its API's base URL (`http://10.0.0.5:7070`).
    pub api_url: String,
}

/// This master's entry and the installation's other masters.
#[derive(Clone)]
pub struct Directory {
    conn: Conn,
    me: Peer,
    secret: String,
    /// The last list read, and when (`GET /health` shows it).
    known: std::sync::Arc<std::sync::Mutex<(Option<std::time::Instant>, Vec<Peer>)>>,
}

impl std::fmt::Debug for Directory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Directory").field("me", &self.me).finish_non_exhaustive()
    }
}

impl Directory {
    /// Writes this master's entry and reads (or makes) the peer secret
    /// (blocking). Refuses a name another master's entry holds with another
    /// address: two masters of one name would count as one.
    pub fn join(conn: Conn, me: Peer) -> Result<Directory, StorageError> {
        let mut key = conn.layout.masters();
        key.extend_from_slice(me.name.as_bytes());
        let value = serde_json::to_vec(&me).map_err(|e| StorageError::Codec(e.to_string()))?;
        let members = conn.members.clone();
        let k = key.clone();
        let found = conn.bridge.call("naming this master", conn.timeout, async move {
            let txn = |c: etcd_client::Client| {
                let (key, value) = (k.clone(), value.clone());
                async move {
                    let txn = Txn::new()
                        .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
                        .and_then([TxnOp::put(key.clone(), value, None)])
                        .or_else([TxnOp::get(key, None)]);
                    c.kv_client().txn(txn).await
                }
            };
            // Harmless to repeat: a put only where nothing is.
            let r = members.run(txn, read_retryable).await.map_err(|e| etcd_error("naming this master", e))?;
            Ok(r.op_responses().into_iter().find_map(|op| match op {
                etcd_client::TxnOpResponse::Get(g) => g.kvs().first().map(|kv| kv.value().to_vec()),
                _ => None,
            }))
        })?;
        if let Some(raw) = found {
            let other: Option<Peer> = serde_json::from_slice(&raw).ok();
            if other.as_ref().is_none_or(|o| o.api_url.trim_end_matches('/') != me.api_url.trim_end_matches('/')) {
                let at = other.map_or_else(|| "an address that does not parse".to_string(), |o| o.api_url);
                return Err(StorageError::Etcd(format!(
                    "another master of this installation is named {:?} (at {at}); give each master its own --name \
                     (if that master is gone for good: etcdctl del {})",
                    me.name,
                    String::from_utf8_lossy(&key)
                )));
            }
        }
        let secret = secret(&conn)?;
        let dir = Directory { conn, me, secret, known: Default::default() };
        dir.forget_old_names()?;
        Ok(dir)
    }

    /// Removes entries of this master's address under another name (this
    /// master before a rename): the same master must not count twice.
    fn forget_old_names(&self) -> Result<(), StorageError> {
        let from = self.conn.layout.masters();
        let (pairs, _, _) = self.conn.range(from.clone(), prefix_end(&from), usize::MAX, false, 0)?;
        for (key, value) in pairs {
            let Ok(p) = serde_json::from_slice::<Peer>(&value) else { continue };
            if p.name != self.me.name && p.api_url.trim_end_matches('/') == self.me.api_url.trim_end_matches('/') {
                tracing::info!(old = %p.name, new = %self.me.name, "this master was named otherwise before; its old entry goes");
                let members = self.conn.members.clone();
                self.conn.bridge.call("forgetting an old name", self.conn.timeout, async move {
                    let del = |c: etcd_client::Client| {
                        let key = key.clone();
                        async move { c.kv_client().delete(key, None).await }
                    };
                    members.run(del, read_retryable).await.map_err(|e| etcd_error("forgetting an old name", e))?;
                    Ok(())
                })?;
            }
        }
        Ok(())
    }

    pub fn me(&self) -> &Peer {
        &self.me
    }

    /// What a master presents to another (`Authorization: Peer <secret>`).
    pub fn secret(&self) -> &str {
        &self.secret
    }

    /// Every master of the installation, this one included (blocking).
    pub fn all(&self) -> Result<Vec<Peer>, StorageError> {
        let from = self.conn.layout.masters();
        let (pairs, _, _) = self.conn.range(from.clone(), prefix_end(&from), usize::MAX, false, 0)?;
        let mut peers: Vec<Peer> = pairs.iter().filter_map(|(_, v)| serde_json::from_slice(v).ok()).collect();
        if !peers.iter().any(|p| p.name == self.me.name) {
            peers.push(self.me.clone());
        }
        *self.known.lock().unwrap_or_else(|p| p.into_inner()) = (Some(std::time::Instant::now()), peers.clone());
        Ok(peers)
    }

    /// The masters as last read (never waits for etcd), and whether that
    /// read is older than `fresh`: then this caller (one per `fresh`) is
    /// to read them again, off the request's thread.
    pub fn known(&self, fresh: std::time::Duration) -> (Vec<Peer>, bool) {
        let mut known = self.known.lock().unwrap_or_else(|p| p.into_inner());
        let stale = known.0.is_none_or(|t| t.elapsed() > fresh);
        if stale {
            known.0 = Some(std::time::Instant::now());
        }
        let peers = if known.1.is_empty() { vec![self.me.clone()] } else { known.1.clone() };
        (peers, stale)
    }
}

/// The installation's peer secret, made by the first master to ask.
fn secret(conn: &Conn) -> Result<String, StorageError> {
    let key = conn.layout.peer_secret();
    let mut fresh = [0u8; 32];
    getrandom::fill(&mut fresh).map_err(|e| StorageError::Etcd(format!("no randomness for the peer secret: {e}")))?;
    let fresh = hex::encode(fresh);
    let members = conn.members.clone();
    let read = key.clone();
    conn.bridge.call("making the peer secret", conn.timeout, async move {
        let txn = |c: etcd_client::Client| {
            let (key, fresh) = (key.clone(), fresh.clone());
            async move {
                let txn = Txn::new()
                    .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
                    .and_then([TxnOp::put(key, fresh, None)]);
                c.kv_client().txn(txn).await
            }
        };
        // Harmless to repeat: it puts only where nothing is.
        members.run(txn, read_retryable).await.map_err(|e| etcd_error("making the peer secret", e))?;
        Ok(())
    })?;
    // Read back whoever's won.
    let raw = conn.get_raw(read)?.ok_or_else(|| StorageError::Etcd("the peer secret is missing".into()))?;
    String::from_utf8(raw).map_err(|_| StorageError::Etcd("the peer secret is not text".into()))
}
