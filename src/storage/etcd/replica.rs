//! A follower's store: reads from etcd, never a write. Its change feed of
//! appended events is fed by the follower's watch ([`super::watch`]), so
//! the event stream a follower serves carries the leader's event numbers.

use std::sync::Arc;

use futures::FutureExt;
use futures::future::BoxFuture;
use tokio::sync::broadcast;

use super::conn::Conn;
use crate::storage::keys::master_cf;
use crate::storage::meta::{self, MetaStore, Scan};
use crate::storage::writer::{Appended, Committed};
use crate::storage::{StorageError, WriteOp};

/// Announced events a slow reader may fall behind by before it catches up
/// from the store (as the writer's own feed).
const FEED: usize = 1024;

/// Reads through `conn` (linearizable: never older than the follower's
/// read model); writes are refused.
#[derive(Clone)]
pub struct ReplicaStore {
    conn: Conn,
    changes: broadcast::Sender<Arc<Committed>>,
    appends: broadcast::Sender<Arc<Appended>>,
}

impl std::fmt::Debug for ReplicaStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplicaStore").field("conn", &self.conn).finish()
    }
}

impl ReplicaStore {
    pub fn new(conn: Conn) -> ReplicaStore {
        ReplicaStore { conn, changes: broadcast::channel(1).0, appends: broadcast::channel(FEED).0 }
    }

    /// Announces events the watch applied (in order).
    pub fn announce(&self, records: Vec<(u64, Vec<u8>)>) {
        if !records.is_empty() {
            let _ = self.appends.send(Arc::new(Appended { records }));
        }
    }

    fn check_cf(cf: &'static str) -> Result<(), StorageError> {
        if master_cf::ALL.contains(&cf) { Ok(()) } else { Err(StorageError::UnknownColumnFamily { cf }) }
    }
}

fn refused() -> StorageError {
    StorageError::Etcd("this master follows another: only the leader writes".into())
}

impl MetaStore for ReplicaStore {
    fn commit(&self, _: Vec<WriteOp>) -> BoxFuture<'static, Result<(), StorageError>> {
        async { Err(refused()) }.boxed()
    }

    fn try_commit(&self, _: Vec<WriteOp>) -> BoxFuture<'static, Result<(), StorageError>> {
        async { Err(refused()) }.boxed()
    }

    fn get(&self, cf: &'static str, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError> {
        ReplicaStore::check_cf(cf)?;
        self.conn.get_raw(self.conn.layout.key(cf, key))
    }

    fn get_many(&self, cf: &'static str, keys: &[Vec<u8>]) -> Result<Vec<Option<Vec<u8>>>, StorageError> {
        ReplicaStore::check_cf(cf)?;
        self.conn.get_many(keys.iter().map(|k| self.conn.layout.key(cf, k)).collect())
    }

    fn scan(&self, cf: &'static str, scan: &Scan, limit: usize) -> Result<meta::Pairs, StorageError> {
        ReplicaStore::check_cf(cf)?;
        self.conn.scan(cf, scan, limit)
    }

    fn subscribe(&self) -> broadcast::Receiver<Arc<Committed>> {
        self.changes.subscribe()
    }

    fn subscribe_appends(&self) -> broadcast::Receiver<Arc<Appended>> {
        self.appends.subscribe()
    }

    fn freeze(&self) {}

    fn stats(&self) -> meta::StoreStats {
        meta::StoreStats::default()
    }
}
