//! One master's connection to etcd: the client, its runtime, the key
//! layout, the transaction limits and the fence; range reads at one
//! revision; a stamped, fenced transaction ([`Conn::stamped`]) and sending
//! several at once ([`Conn::send_all`]).
//! How transactions are chained by their stamps, sent together and settled
//! when an answer is lost is [`chain`](super::chain).

use std::sync::atomic::Ordering;
use std::time::Duration;

use etcd_client::{Compare, CompareOp, GetOptions, SortOrder, SortTarget, Txn, TxnOp};

use super::bridge::{Bridge, etcd_error};
use super::layout::{Layout, prefix_end};
use super::members::{Members, read_retryable, unreached};
use super::txn::Limits;
use crate::storage::StorageError;
use crate::storage::meta::Scan;

/// The leadership every write is checked against: the leader key's create
/// revision must still be `term`.
#[derive(Debug, Clone)]
pub struct Fence {
    pub key: Vec<u8>,
    pub term: i64,
}

/// Keys per range request (values are records of up to a few KiB).
pub const PAGE: i64 = 500;

/// Keys per keys-only range request (a key is under 100 bytes).
pub const KEYS_PAGE: i64 = 10_000;

/// What a range read returns: pairs in etcd keys, and whether more follow.
pub type Page = (crate::storage::meta::Pairs, bool, i64);

/// A [`Page`] whose pairs carry the revision that last changed each.
pub type RevisionPage = (Vec<(Vec<u8>, Vec<u8>, i64)>, bool, i64);

#[derive(Clone)]
pub struct Conn {
    pub bridge: Bridge,
    pub members: Members,
    pub layout: Layout,
    pub limits: Limits,
    pub fence: Option<Fence>,
    /// How long one request may take before it counts as lost.
    pub timeout: Duration,
    /// The largest answer taken ([`MESSAGE_LIMIT`], or twice the largest
    /// transaction when that is more: one transaction's events always pass
    /// a watch; a test sets less).
    pub message_limit: usize,
    /// Records per range page: [`PAGE`], halved for good each time a page
    /// was larger than `message_limit`.
    page: std::sync::Arc<std::sync::atomic::AtomicI64>,
    stamps: std::sync::Arc<std::sync::atomic::AtomicU64>,
    /// The write stamp's value as this master's last landed write left it
    /// (`None`: no stamp yet under the prefix).
    pub(super) last_stamp: std::sync::Arc<std::sync::Mutex<Option<Vec<u8>>>>,
    /// Transactions sent again: etcd evaluated them before their
    /// predecessor in the chain landed.
    pub sent_again: std::sync::Arc<std::sync::atomic::AtomicU64>,
    /// The barriers sent for a write not settled yet ([`Conn::settle`]).
    barriers: std::sync::Arc<std::sync::Mutex<Vec<Vec<u8>>>>,
    /// Told when the fence refuses a write (the leadership is over).
    pub on_deposed: Option<std::sync::Arc<dyn Fn(String) + Send + Sync>>,
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn")
            .field("prefix", &String::from_utf8_lossy(self.layout.prefix()))
            .field("fence", &self.fence)
            .finish()
    }
}

impl Conn {
    /// `timeout` bounds one call, tries of other members included.
    pub fn new(bridge: Bridge, members: Members, layout: Layout, limits: Limits, timeout: Duration) -> Conn {
        let message_limit = MESSAGE_LIMIT.max(limits.max_bytes.saturating_mul(2));
        Conn {
            bridge,
            members,
            layout,
            limits,
            fence: None,
            timeout,
            message_limit,
            page: std::sync::Arc::new(std::sync::atomic::AtomicI64::new(PAGE)),
            stamps: Default::default(),
            last_stamp: Default::default(),
            sent_again: Default::default(),
            barriers: Default::default(),
            on_deposed: None,
        }
    }

    pub(super) fn stamp_key(&self) -> Vec<u8> {
        let mut k = self.layout.prefix().to_vec();
        k.extend_from_slice(b"_stamp");
        k
    }

    pub(super) fn term(&self) -> i64 {
        self.fence.as_ref().map_or(0, |f| f.term)
    }

    /// The next stamp: the term and a counter, unique to one transaction.
    pub(super) fn next_stamp(&self) -> Vec<u8> {
        let n = self.stamps.fetch_add(1, Ordering::Relaxed) + 1;
        let mut stamp = self.term().to_be_bytes().to_vec();
        stamp.extend_from_slice(&n.to_be_bytes());
        stamp
    }

    /// The stamp's value as this master's last landed write left it.
    pub(super) fn last_stamp(&self) -> Option<Vec<u8>> {
        self.last_stamp.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub(super) fn barriers(&self) -> std::sync::MutexGuard<'_, Vec<Vec<u8>>> {
        self.barriers.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn set_last_stamp(&self, stamp: Option<Vec<u8>>) {
        *self.last_stamp.lock().unwrap_or_else(|p| p.into_inner()) = stamp;
    }

    /// Learns the stamp's value now (boot, before the first write).
    pub fn read_stamp(&self) -> Result<(), StorageError> {
        let members = self.members.clone();
        let key = self.stamp_key();
        let value = self.bridge.call("reading the write stamp", self.timeout, async move {
            let get = |c: etcd_client::Client| {
                let key = key.clone();
                async move { c.kv_client().get(key, None).await }
            };
            let r = members.run(get, read_retryable).await.map_err(|e| etcd_error("reading the write stamp", e))?;
            Ok(r.kvs().first().map(|kv| kv.value().to_vec()))
        })?;
        self.set_last_stamp(value);
        Ok(())
    }

    /// `ops` as a transaction that applies only if the stamp holds `base`
    /// (`None`: no stamp yet) and the fence holds, and then puts `stamp`;
    /// otherwise it reads the stamp and the leader key as they are.
    pub(super) fn stamped(&self, mut ops: Vec<TxnOp>, base: Option<&[u8]>, stamp: &[u8]) -> Txn {
        ops.push(TxnOp::put(self.stamp_key(), stamp.to_vec(), None));
        let mut when = vec![match base {
            Some(v) => Compare::value(self.stamp_key(), CompareOp::Equal, v.to_vec()),
            None => Compare::version(self.stamp_key(), CompareOp::Equal, 0),
        }];
        let mut otherwise = vec![TxnOp::get(self.stamp_key(), None)];
        if let Some(f) = &self.fence {
            when.push(Compare::create_revision(f.key.clone(), CompareOp::Equal, f.term));
            otherwise.push(TxnOp::get(f.key.clone(), None));
        }
        Txn::new().when(when).and_then(ops).or_else(otherwise)
    }

    /// Sends `txns` all at once and waits for every answer (at most
    /// `limit`: past it, each unanswered one is unknown). Each is sent
    /// again to another member only when it surely reached none.
    pub(super) fn send_all(
        &self,
        what: &'static str,
        txns: Vec<Txn>,
        limit: Duration,
    ) -> Vec<Result<Sent, Classified>> {
        let n = txns.len();
        let members = self.members.clone();
        let stamp_key = self.stamp_key();
        let answers = self.bridge.call(what, limit, async move {
            let each = txns.into_iter().map(|txn| {
                let members = members.clone();
                async move {
                    let send = |c: etcd_client::Client| {
                        let txn = txn.clone();
                        async move { c.kv_client().txn(txn).await }
                    };
                    members.run(send, unreached).await.map_err(Classified::of)
                }
            });
            Ok(futures::future::join_all(each).await)
        });
        match answers {
            Ok(answers) => answers.into_iter().map(|a| a.map(|r| Sent::of(&r, &stamp_key))).collect(),
            Err(e) => (0..n).map(|_| Err(Classified::Unknown(e.duplicate()))).collect(),
        }
    }

    pub(super) fn deposed(&self, why: String) -> StorageError {
        if let Some(hook) = &self.on_deposed {
            hook(why);
        }
        StorageError::Deposed { term: self.term() }
    }

    /// Puts `value` at control key `key`, a plain put (outside the fence;
    /// harmless to repeat); the revision it landed at (blocking).
    pub fn put_control(&self, key: Vec<u8>, value: Vec<u8>) -> Result<i64, StorageError> {
        let members = self.members.clone();
        self.bridge.call("a control put", self.timeout, async move {
            let put = |c: etcd_client::Client| {
                let (key, value) = (key.clone(), value.clone());
                async move { c.kv_client().put(key, value, None).await }
            };
            let r = members.run(put, read_retryable).await.map_err(|e| etcd_error("a control put", e))?;
            Ok(r.header().map_or(0, |h| h.revision()))
        })
    }

    /// One value by etcd key (blocking).
    pub fn get_raw(&self, key: Vec<u8>) -> Result<Option<Vec<u8>>, StorageError> {
        let members = self.members.clone();
        self.bridge.call("a read", self.timeout, async move { read_one(&members, key).await })
    }

    /// The values of `keys`, in their order, asked for together (at most
    /// [`GETS_AT_ONCE`] in flight; blocking).
    pub fn get_many(&self, keys: Vec<Vec<u8>>) -> Result<Vec<Option<Vec<u8>>>, StorageError> {
        use futures::StreamExt;
        let members = self.members.clone();
        self.bridge.call("reads", self.timeout, async move {
            let gets = keys.into_iter().map(|key| read_one(&members, key));
            futures::stream::iter(gets).buffered(GETS_AT_ONCE).collect::<Vec<_>>().await.into_iter().collect()
        })
    }

    /// Up to `limit` (at most [`PAGE`]) pairs of `[from, to)`, ascending or
    /// descending, at `revision` (0: the newest); with whether more follow
    /// and the revision read (blocking).
    pub fn range(
        &self,
        from: Vec<u8>,
        to: Vec<u8>,
        limit: usize,
        descending: bool,
        revision: i64,
    ) -> Result<Page, StorageError> {
        let (kvs, more, rev) = self.range_opts(from, to, limit, descending, revision, false)?;
        Ok((kvs.into_iter().map(|(k, v, _)| (k, v)).collect(), more, rev))
    }

    /// [`range`](Self::range) in ascending order, each pair with the
    /// revision that last changed it; with `keys_only`, values are empty
    /// (blocking).
    pub fn range_revisions(
        &self,
        from: Vec<u8>,
        to: Vec<u8>,
        revision: i64,
        keys_only: bool,
    ) -> Result<RevisionPage, StorageError> {
        self.range_opts(from, to, usize::MAX, false, revision, keys_only)
    }

    fn range_opts(
        &self,
        from: Vec<u8>,
        to: Vec<u8>,
        limit: usize,
        descending: bool,
        revision: i64,
        keys_only: bool,
    ) -> Result<RevisionPage, StorageError> {
        let message_limit = self.message_limit;
        // `usize::MAX` (a full scan) must not wrap to a negative limit.
        let most = if keys_only { KEYS_PAGE } else { self.page.load(Ordering::Relaxed) };
        let mut limit = limit.clamp(1, most as usize) as i64;
        let mut r = loop {
            let members = self.members.clone();
            let mut opts = GetOptions::new().with_range(to.clone()).with_limit(limit).with_revision(revision);
            if descending {
                opts = opts.with_sort(SortTarget::Key, SortOrder::Descend);
            }
            if keys_only {
                opts = opts.with_keys_only();
            }
            let from = from.clone();
            // Each try its own call (and timeout): an answer too large is
            // asked again for half the records.
            let answer = self.bridge.call("a range read", self.timeout, async move {
                let get = |c: etcd_client::Client| {
                    let (from, opts) = (from.clone(), opts.clone());
                    async move { c.kv_client().max_decoding_message_size(message_limit).get(from, Some(opts)).await }
                };
                match members.run(get, read_retryable).await {
                    Ok(r) => Ok(Some(r)),
                    Err(e) if too_large(&e) && limit > 1 => Ok(None),
                    Err(e) => Err(etcd_error("a range read", e)),
                }
            })?;
            match answer {
                Some(r) => break r,
                // Records this large: fewer per page from now on (the
                // caller pages on; one record always fits: etcd takes none
                // larger than its request limit).
                None => {
                    limit /= 2;
                    if !keys_only {
                        self.page.fetch_min(limit, Ordering::Relaxed);
                    }
                }
            }
        };
        let rev = r.header().map_or(0, |h| h.revision());
        let more = r.more();
        let kvs = r.take_kvs().into_iter().map(|kv| {
            let changed = kv.mod_revision();
            let (k, v) = kv.into_key_value();
            (k, v, changed)
        });
        Ok((kvs.collect(), more, rev))
    }

    /// How many keys lie in `[from, to)` at `revision` (etcd counts them
    /// in its index without reading a record; blocking).
    pub fn count(&self, from: Vec<u8>, to: Vec<u8>, revision: i64) -> Result<i64, StorageError> {
        let (members, message_limit) = (self.members.clone(), self.message_limit);
        self.bridge.call("a count", self.timeout, async move {
            let opts = GetOptions::new().with_range(to).with_revision(revision).with_count_only();
            let get = |c: etcd_client::Client| {
                let (from, opts) = (from.clone(), opts.clone());
                async move { c.kv_client().max_decoding_message_size(message_limit).get(from, Some(opts)).await }
            };
            let r = members.run(get, read_retryable).await.map_err(|e| etcd_error("a count", e))?;
            Ok(r.count())
        })
    }

    /// A store scan of column family `cf` (keys without the prefix), every
    /// page read at the first page's revision (blocking).
    pub fn scan(&self, cf: &str, scan: &Scan, limit: usize) -> Result<crate::storage::meta::Pairs, StorageError> {
        let base = self.layout.cf_prefix(cf);
        let lo = self.layout.key(cf, &scan.prefix);
        let hi = prefix_end(&lo);
        let mut out = Vec::new();
        // The first page's revision: every page reads the same state.
        let mut rev = 0;
        let (mut from, mut to) = match (&scan.from, scan.reverse) {
            (None, _) => (lo.clone(), hi.clone()),
            (Some(f), false) => (self.layout.key(cf, f).max(lo.clone()), hi.clone()),
            (Some(f), true) => {
                let mut end = self.layout.key(cf, f);
                end.push(0);
                (lo.clone(), end.min(hi.clone()))
            }
        };
        while out.len() < limit && from < to {
            let (page, more, at) = self.range(from.clone(), to.clone(), limit - out.len(), scan.reverse, rev)?;
            rev = at;
            let Some((last, _)) = page.last() else { break };
            if scan.reverse {
                to = last.clone();
            } else {
                from = last.clone();
                from.push(0);
            }
            out.extend(page.into_iter().map(|(k, v)| (k[base.len()..].to_vec(), v)));
            if !more {
                break;
            }
        }
        Ok(out)
    }

    /// Every pair under `prefix`, in order, read at one revision (blocking).
    pub fn all_under(&self, prefix: &[u8]) -> Result<crate::storage::meta::Pairs, StorageError> {
        let end = prefix_end(prefix);
        let mut from = prefix.to_vec();
        let mut out = Vec::new();
        let mut rev = 0;
        loop {
            let (page, more, at) = self.range(from.clone(), end.clone(), PAGE as usize, false, rev)?;
            rev = at;
            let Some((last, _)) = page.last() else { break };
            from = last.clone();
            from.push(0);
            out.extend(page);
            if !more {
                break;
            }
        }
        Ok(out)
    }
}

/// The value of etcd key `key`, from whichever member answers.
async fn read_one(members: &Members, key: Vec<u8>) -> Result<Option<Vec<u8>>, StorageError> {
    let get = |c: etcd_client::Client| {
        let key = key.clone();
        async move { c.kv_client().get(key, None).await }
    };
    let mut r = members.run(get, read_retryable).await.map_err(|e| etcd_error("a read", e))?;
    Ok(r.take_kvs().into_iter().next().map(|kv| kv.into_key_value().1))
}

/// Point reads [`Conn::get_many`] keeps in flight at once.
pub const GETS_AT_ONCE: usize = 64;

/// The largest answer taken from etcd (gRPC's default is 4 MiB): a watch
/// catching up gets up to 1,000 revisions' events in one (4.3 MB came
/// under the failover bench's load), a page of 500 large records more.
pub const MESSAGE_LIMIT: usize = 64 * 1024 * 1024;

/// Whether etcd's answer was larger than the limit taken.
pub fn too_large(e: &etcd_client::Error) -> bool {
    matches!(e, etcd_client::Error::GRpcStatus(s)
        if s.code() == tonic::Code::OutOfRange && s.message().contains("message length too large"))
}

/// How a transaction ended when etcd answered.
pub(super) enum Sent {
    Applied,
    /// A compare failed: the stamp's value (`None`: no stamp) and the
    /// leader key's create revision (0: no leader key) found.
    Refused {
        stamp: Option<Vec<u8>>,
        leader: i64,
    },
}

impl Sent {
    fn of(r: &etcd_client::TxnResponse, stamp_key: &[u8]) -> Sent {
        if r.succeeded() {
            return Sent::Applied;
        }
        let (mut stamp, mut leader) = (None, 0);
        for op in r.op_responses() {
            if let etcd_client::TxnOpResponse::Get(g) = op
                && let Some(kv) = g.kvs().first()
            {
                if kv.key() == stamp_key {
                    stamp = Some(kv.value().to_vec());
                } else {
                    leader = kv.create_revision();
                }
            }
        }
        Sent::Refused { stamp, leader }
    }
}

/// An etcd client error, sorted by whether the write can have landed.
pub(super) enum Classified {
    Definite(StorageError),
    Unknown(StorageError),
}

impl Classified {
    fn of(e: etcd_client::Error) -> Classified {
        use tonic::Code;
        let definite = unreached(&e)
            || match &e {
                etcd_client::Error::GRpcStatus(s) => match s.code() {
                    Code::InvalidArgument
                    | Code::FailedPrecondition
                    | Code::OutOfRange
                    | Code::PermissionDenied
                    | Code::Unauthenticated
                    | Code::ResourceExhausted => true,
                    // Refused by a member that has no leader, before proposing.
                    Code::Unavailable => s.message().contains("no leader"),
                    _ => false,
                },
                etcd_client::Error::InvalidArgs(_) | etcd_client::Error::InvalidUri(_) => true,
                _ => false,
            };
        let e = etcd_error("a write transaction", e);
        if definite { Classified::Definite(e) } else { Classified::Unknown(e) }
    }
}
