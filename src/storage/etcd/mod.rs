//! The master's store on etcd (`flotilla master --store etcd`): the engine
//! behind [`MetaStore`] for several masters, one of them leading.
//!
//! | module | owns |
//! |---|---|
//! | [`bridge`] | the etcd client's own runtime, and waiting on it from any thread |
//! | [`layout`] | where each column family's keys and the control keys live |
//! | [`members`] | a client per member, and moving to the next when one cannot answer |
//! | [`copy`] | `flotilla store migrate`: a single master's RocksDB state into etcd |
//! | [`conn`] | the client, layout, limits and fence; one stamped transaction; range reads at one revision |
//! | [`chain`] | transactions chained by their stamps: sent together, landing in order; settling a lost answer |
//! | [`txn`] | coalescing a group-commit round into etcd's per-transaction limits |
//! | [`sink`] | the writer's sink: rounds as transactions, oversized requests through a redo record |
//! | [`election`] | the campaign for the leader key, its lease and the renewal thread |
//! | `knock` | a waiting master's knock on the leader's API port: is its process surely gone |
//! | [`peers`] | the installation's masters as each names itself, and the secret they present to each other |
//! | [`replica`] | a follower's store: reads only, its event feed from the watch |
//! | [`watch`] | a follower's view: the prefix at one revision, then the watch's changes |
//!
//! What it keeps of [`MetaStore`]'s contract: a commit is acknowledged
//! once etcd applied it (a majority of its members have it on disk), each
//! request atomic (whole in one transaction, or through the redo record);
//! reads are linearizable and read in key order at one revision; the change
//! feed is the leader's writer's (a follower's comes from an etcd watch).
//! Every write carries the leader's fence: a deposed leader cannot write.

pub mod bridge;
pub mod chain;
pub mod conn;
pub mod copy;
pub mod election;
mod knock;
pub mod layout;
pub mod members;
pub mod peers;
pub mod replica;
pub mod sink;
pub mod txn;
pub mod watch;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;

use self::bridge::{Bridge, etcd_error};
use self::conn::{Conn, Fence};
use self::layout::{Layout, prefix_end};
use self::members::Members;
use super::append_log::AppendLog;
use super::keys::{self, master_cf};
use super::meta::{self, MetaStore, Scan};
use super::writer::{Appended, Committed, DEFAULT_QUEUE};
use super::{StorageError, StoreWriter, WriteOp};

/// How to reach etcd and how to use it (`[etcd]` in the master's config).
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EtcdSettings {
    /// Client URLs of the etcd members (`http://` or, with `ca_file`, `https://`).
    pub endpoints: Vec<String>,
    /// Every key of this installation starts with it.
    pub prefix: String,
    /// etcd user (with auth enabled); the password comes from the
    /// `FLOTILLA_ETCD_PASSWORD` environment variable, never from a file.
    pub user: Option<String>,
    /// CA that signed the members' certificates (enables TLS).
    pub ca_file: Option<std::path::PathBuf>,
    /// Client certificate and key, for members that require one.
    pub cert_file: Option<std::path::PathBuf>,
    pub key_file: Option<std::path::PathBuf>,
    /// etcd's `--max-txn-ops` (128 unless the members were started otherwise).
    pub max_txn_ops: usize,
    /// Bytes per transaction, below etcd's `--max-request-bytes` (1.5 MiB).
    pub max_txn_bytes: usize,
    /// The leader lease's TTL, in whole seconds (etcd's floor is 1.5 × its
    /// election timeout, rounded up): how long a dead leader's machine
    /// keeps its leadership at most.
    pub lease_ttl_secs: i64,
    /// A waiting master revokes the lease of a leader whose process is
    /// surely gone (its API port refuses connections, or its health
    /// names another pid): takeover in a
    /// fraction of a second instead of the TTL. Off where a firewall
    /// rejects (rather than drops) the masters' connections to each other.
    pub revoke_dead_leader: bool,
    /// One request's limit before it counts as lost.
    #[serde(with = "crate::storage::serde_time::duration_text")]
    pub request_timeout: Duration,
    /// How a follower that wins boots: from the store, or the view it kept (see [`Takeover`]).
    pub takeover: Takeover,
}

/// Where a master that wins the campaign takes its clusters and instances
/// from (`[etcd] takeover`). The rest of what it boots from (operations in
/// flight with their plans, nodes, packages, tokens: small) is read from
/// the store either way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Takeover {
    /// From the store, read again (as a single master's restart does).
    Store,
    /// From the read model it kept from the watch as a follower, once that
    /// holds every write made before the win, and either every etcd
    /// revision since its load brought its watch an event (nothing missed:
    /// `watch::Progress::chained_through`) or a keys-only read of the
    /// store at that revision finds every cluster and instance key in it,
    /// changed at the same revision; else from the store.
    #[default]
    View,
    /// Both, compared: a view that differs from the store ends the master
    /// with the difference (the test suites' setting).
    Checked,
}

impl Default for EtcdSettings {
    fn default() -> Self {
        let limits = txn::Limits::default();
        EtcdSettings {
            endpoints: vec!["http://127.0.0.1:2379".into()],
            prefix: "/flotilla/".into(),
            user: None,
            ca_file: None,
            cert_file: None,
            key_file: None,
            max_txn_ops: limits.max_ops,
            max_txn_bytes: limits.max_bytes,
            lease_ttl_secs: 2,
            revoke_dead_leader: true,
            request_timeout: Duration::from_secs(5),
            takeover: Takeover::View,
        }
    }
}

impl EtcdSettings {
    /// Checks what can be checked before connecting; errors name the key.
    pub fn validate(&self) -> Result<(), String> {
        if self.endpoints.is_empty() {
            return Err("etcd.endpoints: at least one endpoint is needed".into());
        }
        for e in &self.endpoints {
            if !(e.starts_with("http://") || e.starts_with("https://")) {
                return Err(format!("etcd.endpoints: {e:?} is not an http:// or https:// URL"));
            }
        }
        if self.prefix.is_empty() || !self.prefix.starts_with('/') {
            return Err(format!("etcd.prefix: {:?} must start with '/'", self.prefix));
        }
        if !(2..=1_000_000).contains(&self.max_txn_ops) {
            return Err(format!("etcd.max_txn_ops: {} is outside 2..=1000000", self.max_txn_ops));
        }
        if !(4096..=64 * 1024 * 1024).contains(&self.max_txn_bytes) {
            return Err(format!("etcd.max_txn_bytes: {} is outside 4096..=67108864", self.max_txn_bytes));
        }
        if !(1..=600).contains(&self.lease_ttl_secs) {
            return Err(format!("etcd.lease_ttl_secs: {} is outside 1..=600", self.lease_ttl_secs));
        }
        if self.request_timeout < Duration::from_millis(100) {
            return Err("etcd.request_timeout: below 100ms".into());
        }
        if self.cert_file.is_some() != self.key_file.is_some() {
            return Err("etcd.cert_file and etcd.key_file: give both or neither".into());
        }
        Ok(())
    }

    /// The client's options: auth, TLS, timeouts, and requests refused at
    /// once by a member without a leader (a definite refusal, not a timeout).
    pub fn connect_options(&self) -> Result<etcd_client::ConnectOptions, StorageError> {
        let mut o = etcd_client::ConnectOptions::new()
            .with_connect_timeout(self.connect_timeout())
            .with_timeout(self.request_timeout)
            .with_keep_alive(Duration::from_secs(2), self.request_timeout)
            .with_require_leader(true);
        if let Some(user) = &self.user {
            let password = std::env::var("FLOTILLA_ETCD_PASSWORD").map_err(|_| {
                StorageError::Etcd(format!("etcd.user is {user:?} but FLOTILLA_ETCD_PASSWORD is not set"))
            })?;
            o = o.with_user(user.clone(), password);
        }
        if let Some(ca) = &self.ca_file {
            let read = |p: &std::path::Path| std::fs::read(p).map_err(|e| StorageError::io(p, e));
            let mut tls = etcd_client::TlsOptions::new().ca_certificate(etcd_client::Certificate::from_pem(read(ca)?));
            if let (Some(cert), Some(key)) = (&self.cert_file, &self.key_file) {
                tls = tls.identity(etcd_client::Identity::from_pem(read(cert)?, read(key)?));
            }
            o = o.with_tls(tls);
        }
        Ok(o)
    }

    /// How long connecting to one member may take before the next is tried.
    pub fn connect_timeout(&self) -> Duration {
        self.request_timeout.min(Duration::from_secs(2))
    }

    /// How long one call may take, the tries of other members included.
    pub fn call_limit(&self) -> Duration {
        self.request_timeout + self.connect_timeout() * self.endpoints.len().saturating_sub(1) as u32
    }

    pub fn limits(&self) -> txn::Limits {
        txn::Limits { max_ops: self.max_txn_ops, max_bytes: self.max_txn_bytes }
    }
}

/// Connects to etcd: the client's runtime and a client per member (blocking).
pub fn connect(settings: &EtcdSettings) -> Result<(Bridge, Members), StorageError> {
    settings.validate().map_err(StorageError::Etcd)?;
    let bridge = Bridge::start("flotilla-etcd", 2)?;
    let options = settings.connect_options()?;
    let endpoints = settings.endpoints.clone();
    let members = bridge.call("connecting", settings.call_limit(), async move {
        Members::connect(&endpoints, Some(options)).await.map_err(|e| etcd_error("connecting", e))
    })?;
    Ok((bridge, members))
}

/// The leader's fence, and who to tell when it refuses a write.
#[derive(Clone)]
pub struct Fenced {
    pub fence: Fence,
    pub on_deposed: Arc<dyn Fn(String) + Send + Sync>,
}

/// The master's store on etcd.
#[derive(Clone)]
pub struct EtcdStore {
    conn: Conn,
    writer: StoreWriter,
    broken: Arc<AtomicBool>,
}

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStore").field("conn", &self.conn).finish()
    }
}

impl EtcdStore {
    /// Opens the store for writing under `fence` (the leader's; `None` for
    /// a tool that owns the prefix alone, like `flotilla store migrate`):
    /// finishes a redo record left by the previous leader, checks or writes
    /// the schema version, and starts the writer (blocking).
    pub fn open(
        bridge: Bridge,
        members: Members,
        settings: &EtcdSettings,
        fence: Option<Fenced>,
        queue: usize,
        events_retained: u64,
    ) -> Result<EtcdStore, StorageError> {
        let mut conn =
            Conn::new(bridge, members, Layout::new(&settings.prefix), settings.limits(), settings.call_limit());
        if let Some(f) = fence {
            conn.fence = Some(f.fence);
            conn.on_deposed = Some(f.on_deposed);
        }
        conn.read_stamp()?;
        let broken = Arc::new(AtomicBool::new(false));
        let sink = sink::EtcdSink::new(conn.clone(), &master_cf::ALL, broken.clone());
        if sink::recover(&sink)? {
            tracing::warn!("finished a write the previous leader had committed but not applied (etcd redo record)");
        }
        if conn.get_raw(conn.layout.key(master_cf::META, copy::MIGRATING_KEY))?.is_some() {
            return Err(StorageError::Etcd(format!(
                "a `flotilla store migrate` into {} did not finish (or runs now): empty the prefix (etcdctl del --prefix {}) and migrate again",
                settings.prefix, settings.prefix
            )));
        }
        let schema_key = conn.layout.key(master_cf::META, keys::SCHEMA_VERSION_KEY);
        let version = super::master_store::MASTER_SCHEMA_VERSION;
        match conn.get_raw(schema_key.clone())? {
            Some(raw) => {
                let found: u32 = super::codec::decode(&raw)?;
                if found > version {
                    return Err(StorageError::SchemaTooNew { found, supported: version });
                }
                if found < version {
                    return Err(StorageError::SchemaTooOld { found, supported: version });
                }
            }
            None => {
                conn.txn(vec![txn::EtcdWrite::Put(schema_key, super::codec::encode(&version)?)])
                    .map_err(chain::TxnFailure::into_error)?;
            }
        }
        let last = last_event(&conn)?;
        let log = AppendLog::new(master_cf::EVENTS, last, events_retained);
        let writer = StoreWriter::start_on(Box::new(sink), queue.max(1), Some(log))?;
        Ok(EtcdStore { conn, writer, broken })
    }

    /// [`open`](Self::open) with the default queue and retention.
    pub fn open_default(
        bridge: Bridge,
        members: Members,
        settings: &EtcdSettings,
        fence: Option<Fenced>,
    ) -> Result<EtcdStore, StorageError> {
        EtcdStore::open(bridge, members, settings, fence, DEFAULT_QUEUE, super::master_store::DEFAULT_EVENTS_RETAINED)
    }

    /// Transactions sent again because etcd evaluated them before the one
    /// chained before them had landed (see [`chain`]).
    pub fn sent_again(&self) -> u64 {
        self.conn.sent_again.load(Ordering::Relaxed)
    }

    /// The writer every write goes through.
    pub fn writer(&self) -> &StoreWriter {
        &self.writer
    }

    fn check_cf(cf: &'static str) -> Result<(), StorageError> {
        if master_cf::ALL.contains(&cf) { Ok(()) } else { Err(StorageError::UnknownColumnFamily { cf }) }
    }
}

/// The highest event number stored (0: none).
fn last_event(conn: &Conn) -> Result<u64, StorageError> {
    let p = conn.layout.cf_prefix(master_cf::EVENTS);
    let (page, _, _) = conn.range(p.clone(), prefix_end(&p), 1, true, 0)?;
    match page.first() {
        None => Ok(0),
        Some((k, _)) => keys::event_seq(&k[p.len()..])
            .ok_or_else(|| StorageError::Codec(format!("events: key {} is not a sequence number", hex::encode(k)))),
    }
}

impl MetaStore for EtcdStore {
    fn commit(&self, ops: Vec<WriteOp>) -> BoxFuture<'static, Result<(), StorageError>> {
        let w = self.writer.clone();
        async move { w.commit(ops).await }.boxed()
    }

    fn try_commit(&self, ops: Vec<WriteOp>) -> BoxFuture<'static, Result<(), StorageError>> {
        let w = self.writer.clone();
        async move { w.try_commit(ops).await }.boxed()
    }

    fn get(&self, cf: &'static str, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError> {
        EtcdStore::check_cf(cf)?;
        self.conn.get_raw(self.conn.layout.key(cf, key))
    }

    fn get_many(&self, cf: &'static str, keys: &[Vec<u8>]) -> Result<Vec<Option<Vec<u8>>>, StorageError> {
        EtcdStore::check_cf(cf)?;
        self.conn.get_many(keys.iter().map(|k| self.conn.layout.key(cf, k)).collect())
    }

    fn scan(&self, cf: &'static str, scan: &Scan, limit: usize) -> Result<meta::Pairs, StorageError> {
        EtcdStore::check_cf(cf)?;
        self.conn.scan(cf, scan, limit)
    }

    fn subscribe(&self) -> tokio::sync::broadcast::Receiver<Arc<Committed>> {
        self.writer.subscribe()
    }

    fn subscribe_appends(&self) -> tokio::sync::broadcast::Receiver<Arc<Appended>> {
        self.writer.subscribe_appends()
    }

    fn freeze(&self) {
        self.writer.freeze()
    }

    fn writer_alive(&self) -> bool {
        self.writer.alive() && !self.broken.load(Ordering::SeqCst)
    }

    fn writer_stuck_for(&self) -> Option<Duration> {
        self.writer.stuck_for()
    }

    fn stats(&self) -> meta::StoreStats {
        meta::StoreStats {
            batches: self.writer.batches_written(),
            commits: self.writer.commits_written(),
            queued: self.writer.queued(),
            sent_again: Some(self.sent_again()),
        }
    }
}
