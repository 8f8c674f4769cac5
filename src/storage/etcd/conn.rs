//! One master's connection to etcd: the client, its runtime, the key
//! layout, the transaction limits and the fence, and the one way a write
//! reaches etcd ([`Conn::txn`]).
//!
//! Every transaction also moves a stamp (`<prefix>_stamp`: the term and a
//! counter), comparing its revision with the one this master's previous
//! write left. So a write whose answer was lost (a timeout, a connection
//! reset after sending) is settled for good by a barrier on the stamp: if
//! the barrier applies, the lost write never can; if not, the stamp says
//! which one landed. A stamp moved by anyone else means another writer:
//! this master stops.

use std::time::Duration;

use std::sync::atomic::Ordering;

use etcd_client::{Compare, CompareOp, GetOptions, SortOrder, SortTarget, Txn, TxnOp};

use super::bridge::{Bridge, etcd_error};
use super::layout::{Layout, prefix_end};
use super::members::{Members, read_retryable, unreached};
use super::txn::{EtcdWrite, Limits};
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

/// What a range read returns: pairs in etcd keys, and whether more follow.
pub type Page = (crate::storage::meta::Pairs, bool, i64);

#[derive(Clone)]
pub struct Conn {
    pub bridge: Bridge,
    pub members: Members,
    pub layout: Layout,
    pub limits: Limits,
    pub fence: Option<Fence>,
    /// How long one request may take before it counts as lost.
    pub timeout: Duration,
    stamps: std::sync::Arc<std::sync::atomic::AtomicU64>,
    /// The write stamp's mod revision as this master's last write left it.
    stamp_rev: std::sync::Arc<std::sync::atomic::AtomicI64>,
    /// The last write was unanswered and settled as not landed.
    lost_in_flight: std::sync::Arc<std::sync::atomic::AtomicBool>,
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

/// How a transaction ended when it did not succeed.
#[derive(Debug)]
pub enum TxnFailure {
    /// Nothing of it was applied (the fence refused it, etcd refused it
    /// before applying, or the stamp shows it did not land).
    Refused(StorageError),
    /// Nobody can tell yet whether it landed (etcd did not answer, nor
    /// afterwards for the stamp): [`Conn::settle`] with this stamp tells,
    /// once etcd answers again.
    Unknown(StorageError, Vec<u8>),
}

impl TxnFailure {
    pub fn into_error(self) -> StorageError {
        match self {
            TxnFailure::Refused(e) | TxnFailure::Unknown(e, _) => e,
        }
    }
}

impl Conn {
    /// `timeout` bounds one call, tries of other members included.
    pub fn new(bridge: Bridge, members: Members, layout: Layout, limits: Limits, timeout: Duration) -> Conn {
        Conn {
            bridge,
            members,
            layout,
            limits,
            fence: None,
            timeout,
            stamps: Default::default(),
            stamp_rev: Default::default(),
            lost_in_flight: Default::default(),
            on_deposed: None,
        }
    }

    fn stamp_key(&self) -> Vec<u8> {
        let mut k = self.layout.prefix().to_vec();
        k.extend_from_slice(b"_stamp");
        k
    }

    fn term(&self) -> i64 {
        self.fence.as_ref().map_or(0, |f| f.term)
    }

    /// The next stamp: the term and a counter, unique to one transaction.
    fn next_stamp(&self) -> Vec<u8> {
        let n = self.stamps.fetch_add(1, Ordering::Relaxed) + 1;
        let mut stamp = self.term().to_be_bytes().to_vec();
        stamp.extend_from_slice(&n.to_be_bytes());
        stamp
    }

    /// Learns where the stamp is now (boot, before the first write).
    pub fn read_stamp(&self) -> Result<(), StorageError> {
        let members = self.members.clone();
        let key = self.stamp_key();
        let rev = self.bridge.call("reading the write stamp", self.timeout, async move {
            let get = |c: etcd_client::Client| {
                let key = key.clone();
                async move { c.kv_client().get(key, None).await }
            };
            let r = members.run(get, read_retryable).await.map_err(|e| etcd_error("reading the write stamp", e))?;
            Ok(r.kvs().first().map_or(0, |kv| kv.mod_revision()))
        })?;
        self.stamp_rev.store(rev, Ordering::SeqCst);
        Ok(())
    }

    /// Sends `ops` with the stamp, if the fence and the stamp's revision
    /// are as this master left them; otherwise answers the leader key's
    /// create revision and the stamp (value, mod revision) as they are.
    /// `retry` says which failures send it to the next member.
    fn send(
        &self,
        what: &'static str,
        mut ops: Vec<TxnOp>,
        stamp: &[u8],
        retry: fn(&etcd_client::Error) -> bool,
        limit: Duration,
    ) -> Result<Sent, Classified> {
        ops.push(TxnOp::put(self.stamp_key(), stamp.to_vec(), None));
        let mut when =
            vec![Compare::mod_revision(self.stamp_key(), CompareOp::Equal, self.stamp_rev.load(Ordering::SeqCst))];
        let mut otherwise = vec![TxnOp::get(self.stamp_key(), None)];
        if let Some(f) = &self.fence {
            when.push(Compare::create_revision(f.key.clone(), CompareOp::Equal, f.term));
            otherwise.push(TxnOp::get(f.key.clone(), None));
        }
        let txn = Txn::new().when(when).and_then(ops).or_else(otherwise);
        let members = self.members.clone();
        // Sent again to another member only when it surely reached none.
        let sent = self.bridge.call(what, limit, async move {
            let send = |c: etcd_client::Client| {
                let txn = txn.clone();
                async move { c.kv_client().txn(txn).await }
            };
            Ok(members.run(send, retry).await.map_err(Classified::of))
        });
        let r = match sent {
            Ok(r) => r?,
            Err(e) => return Err(Classified::Unknown(e)),
        };
        let revision = r.header().map_or(0, |h| h.revision());
        if r.succeeded() {
            self.stamp_rev.store(revision, Ordering::SeqCst);
            return Ok(Sent::Applied);
        }
        let (mut stamp, mut leader) = (None, 0);
        for op in r.op_responses() {
            if let etcd_client::TxnOpResponse::Get(g) = op
                && let Some(kv) = g.kvs().first()
            {
                if kv.key() == self.stamp_key() {
                    stamp = Some((kv.value().to_vec(), kv.mod_revision()));
                } else {
                    leader = kv.create_revision();
                }
            }
        }
        Ok(Sent::Refused { stamp, leader })
    }

    fn deposed(&self, why: String) -> StorageError {
        if let Some(hook) = &self.on_deposed {
            hook(why);
        }
        StorageError::Deposed { term: self.term() }
    }

    /// Applies `writes` in one transaction, fenced, and waits for it.
    ///
    /// Each transaction also compares the stamp's revision with the one
    /// this master's last write left, and moves it: so after a write whose
    /// answer was lost, a barrier (a transaction on the stamp alone, on the
    /// same compare) settles it for good ([`Conn::settle`]).
    pub fn txn(&self, writes: Vec<EtcdWrite>) -> Result<(), TxnFailure> {
        let ops: Vec<TxnOp> = writes.into_iter().map(EtcdWrite::into_op).collect();
        // A write settled as not landed is sent again once (an etcd leader
        // election drops the proposals under way): it never lands twice,
        // the barrier made sure the first one cannot land any more.
        match self.txn_once(ops.clone()) {
            Err(TxnFailure::Refused(e)) if matches!(e, StorageError::Etcd(_)) && self.settled_not_landed() => {
                tracing::warn!(error = %crate::error::ErrorChain(&e), "an etcd write was lost in flight; sending it again");
                self.txn_once(ops)
            }
            other => other,
        }
    }

    /// Whether the last write failed unanswered and was settled as not
    /// landed (so it may be sent again).
    fn settled_not_landed(&self) -> bool {
        self.lost_in_flight.swap(false, Ordering::SeqCst)
    }

    fn txn_once(&self, ops: Vec<TxnOp>) -> Result<(), TxnFailure> {
        self.lost_in_flight.store(false, Ordering::SeqCst);
        let stamp = self.next_stamp();
        match self.send("a write transaction", ops, &stamp, unreached, self.timeout) {
            Ok(Sent::Applied) => Ok(()),
            // Refused because an earlier try of this very write landed.
            Ok(Sent::Refused { stamp: Some((found, rev)), .. }) if found == stamp => {
                self.stamp_rev.store(rev, Ordering::SeqCst);
                Ok(())
            }
            Ok(Sent::Refused { leader, .. }) if self.fence.is_some() && leader != self.term() => {
                Err(TxnFailure::Refused(self.deposed(format!(
                    "a write was refused by the fence: the leader key is no longer term {}'s",
                    self.term()
                ))))
            }
            Ok(Sent::Refused { .. }) => Err(TxnFailure::Refused(
                self.deposed(
                    "a write was refused: the store's write stamp moved, another writer is at work under this prefix"
                        .into(),
                ),
            )),
            Err(Classified::Definite(e)) => Err(TxnFailure::Refused(e)),
            Err(Classified::Unknown(e)) => match self.settle(&stamp) {
                Ok(true) => Ok(()),
                Ok(false) => {
                    self.lost_in_flight.store(true, Ordering::SeqCst);
                    Err(TxnFailure::Refused(e))
                }
                Err(later) => Err(TxnFailure::Unknown(
                    StorageError::Etcd(format!(
                        "{}; whether it landed is not known yet: {}",
                        crate::error::ErrorChain(&e),
                        crate::error::ErrorChain(&later)
                    )),
                    stamp,
                )),
            },
        }
    }

    /// Whether the write that carried `stamp` landed, for good: a barrier
    /// moves the stamp if the write has not (then it never can: it compares
    /// the revision the barrier changed), else the stamp shows which of
    /// them did. Tried until etcd answers (an etcd leader election takes a
    /// second or two), at most 3 s.
    pub fn settle(&self, stamp: &[u8]) -> Result<bool, StorageError> {
        // Long enough for an etcd leader election; past it the write is
        // left unknown (503) and settled before the next one.
        let deadline = std::time::Instant::now() + self.timeout.min(Duration::from_secs(3));
        let mut pause = Duration::from_millis(20);
        loop {
            let barrier = self.next_stamp();
            // Short tries, each on the next member after a failure of any
            // kind: a barrier is tiny, and whichever lands, the stamp
            // settles it.
            let (member, _) = self.members.pick();
            let attempt = self.timeout.min(Duration::from_secs(2));
            let last = match self.send("settling a write", Vec::new(), &barrier, unreached, attempt) {
                Ok(Sent::Applied) => return Ok(false),
                Ok(Sent::Refused { leader, .. }) if self.fence.is_some() && leader != self.term() => {
                    return Err(
                        self.deposed(format!("settling a write: the leader key is no longer term {}'s", self.term()))
                    );
                }
                Ok(Sent::Refused { stamp: Some((found, rev)), .. }) if ours(&found, self.term(), stamp) => {
                    self.stamp_rev.store(rev, Ordering::SeqCst);
                    return Ok(found == stamp);
                }
                Ok(Sent::Refused { .. }) => {
                    return Err(self.deposed(
                        "settling a write: the store's write stamp moved, another writer is at work under this prefix"
                            .into(),
                    ));
                }
                Err(Classified::Definite(e) | Classified::Unknown(e)) => {
                    self.members.failed(member);
                    e
                }
            };
            if std::time::Instant::now() + pause >= deadline {
                return Err(last);
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(500));
        }
    }

    /// One value by etcd key (blocking).
    pub fn get_raw(&self, key: Vec<u8>) -> Result<Option<Vec<u8>>, StorageError> {
        let members = self.members.clone();
        self.bridge.call("a read", self.timeout, async move {
            let get = |c: etcd_client::Client| {
                let key = key.clone();
                async move { c.kv_client().get(key, None).await }
            };
            let mut r = members.run(get, read_retryable).await.map_err(|e| etcd_error("a read", e))?;
            Ok(r.take_kvs().into_iter().next().map(|kv| kv.into_key_value().1))
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
        let members = self.members.clone();
        // `usize::MAX` (a full scan) must not wrap to a negative limit.
        let limit = limit.clamp(1, PAGE as usize) as i64;
        self.bridge.call("a range read", self.timeout, async move {
            let mut opts = GetOptions::new().with_range(to).with_limit(limit).with_revision(revision);
            if descending {
                opts = opts.with_sort(SortTarget::Key, SortOrder::Descend);
            }
            let get = |c: etcd_client::Client| {
                let (from, opts) = (from.clone(), opts.clone());
                async move { c.kv_client().get(from, Some(opts)).await }
            };
            let mut r = members.run(get, read_retryable).await.map_err(|e| etcd_error("a range read", e))?;
            let rev = r.header().map_or(0, |h| h.revision());
            let more = r.more();
            Ok((r.take_kvs().into_iter().map(|kv| kv.into_key_value()).collect(), more, rev))
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
            let full = page.len() as i64 == PAGE;
            out.extend(page);
            if !more || !full {
                break;
            }
        }
        Ok(out)
    }
}

/// How a transaction ended when etcd answered.
enum Sent {
    Applied,
    /// A compare failed: the stamp and the leader key's create revision found.
    Refused {
        stamp: Option<(Vec<u8>, i64)>,
        leader: i64,
    },
}

/// Whether `found` is the stamp of `sent` or of a later barrier of this
/// term (a counter at least `sent`'s).
fn ours(found: &[u8], term: i64, sent: &[u8]) -> bool {
    found.len() == 16 && sent.len() == 16 && found[..8] == term.to_be_bytes() && found[8..] >= sent[8..]
}

/// An etcd client error, sorted by whether the write can have landed.
enum Classified {
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
