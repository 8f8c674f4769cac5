//! The leader's writes as a chain of stamped transactions.
//!
//! Every transaction puts a new stamp (`<prefix>_stamp`: the term and a
//! counter) and applies only if the stamp still holds the value the
//! transaction before it put (and the fence holds). So the transactions
//! of a group-commit round can be sent all at once ([`Conn::txns`]) and
//! still land one after another in the order given, always a prefix of
//! them: one that etcd happened to evaluate before its predecessor is
//! refused, and sent again once that predecessor landed. A follower's
//! watch sees them in that order, as if they had been sent one by one.
//!
//! The chain is also how a write whose answer was lost (a timeout, a
//! connection reset after sending) is settled for good ([`Conn::settle`]):
//! a barrier, a transaction on the stamp alone compared with the same
//! value, either applies (then the lost write, and every one chained
//! after it, never can) or finds the stamp moved to one of the lost
//! writes' stamps (they landed). A stamp moved by anyone else means
//! another writer: this master stops.

use std::time::Duration;

use etcd_client::TxnOp;

use super::conn::{Classified, Conn, Sent};
use super::txn::EtcdWrite;
use crate::storage::StorageError;

/// Transactions in flight at once.
const IN_FLIGHT: usize = 8;

/// How transactions ended when they did not all land.
#[derive(Debug)]
pub enum TxnFailure {
    /// None of them from the first not landed was applied, or ever will be
    /// (the fence refused, etcd refused before applying, or a barrier made
    /// sure).
    Refused(StorageError),
    /// Nobody can tell yet whether they landed (etcd did not answer, nor
    /// afterwards for a barrier): [`Conn::settle`] with these stamps (the
    /// first unsettled transaction's and those chained after it) tells, once
    /// etcd answers again.
    Unknown(StorageError, Vec<Vec<u8>>),
}

impl TxnFailure {
    pub fn into_error(self) -> StorageError {
        match self {
            TxnFailure::Refused(e) | TxnFailure::Unknown(e, _) => e,
        }
    }
}

/// Transactions that did not all land: the first `landed` did.
#[derive(Debug)]
pub struct ChainFailure {
    pub landed: usize,
    pub failure: TxnFailure,
}

/// Why a pipeline stopped before its end.
enum Stop {
    /// A transaction was evaluated before its predecessor landed: send it
    /// (and those after it) again.
    Early,
    /// Unanswered, and settled as never landing: may be sent again.
    Lost(StorageError),
    Failed(TxnFailure),
}

impl Conn {
    /// Applies `writes` in one transaction, fenced, and waits for it.
    pub fn txn(&self, writes: Vec<EtcdWrite>) -> Result<(), TxnFailure> {
        self.txns(vec![writes]).map_err(|f| f.failure)
    }

    /// Applies each of `batches` in a transaction of its own, all sent at
    /// once (at most [`IN_FLIGHT`]), landing in the order given; waits for
    /// them. A failure says how many landed (a prefix, always).
    pub fn txns(&self, batches: Vec<Vec<EtcdWrite>>) -> Result<(), ChainFailure> {
        let ops: Vec<Vec<TxnOp>> =
            batches.into_iter().map(|b| b.into_iter().map(EtcdWrite::into_op).collect()).collect();
        let mut landed = 0;
        // A write settled as not landed is sent again once (an etcd leader
        // election drops the proposals under way): it never lands twice,
        // the barrier made sure the first one cannot land any more. Once
        // per transaction: the one sent again last.
        let mut resent: Option<usize> = None;
        while landed < ops.len() {
            let end = (landed + IN_FLIGHT).min(ops.len());
            let (n, stop) = self.pipeline(&ops[landed..end]);
            landed += n;
            match stop {
                None | Some(Stop::Early) => {}
                Some(Stop::Lost(e)) if resent != Some(landed) => {
                    tracing::warn!(error = %crate::error::ErrorChain(&e), "an etcd write was lost in flight; sending it again");
                    resent = Some(landed);
                }
                Some(Stop::Lost(e)) => return Err(ChainFailure { landed, failure: TxnFailure::Refused(e) }),
                Some(Stop::Failed(failure)) => return Err(ChainFailure { landed, failure }),
            }
        }
        Ok(())
    }

    /// Sends `ops` chained from the stamp as the last landed write left
    /// it; how many landed, and why it stopped before the end.
    fn pipeline(&self, ops: &[Vec<TxnOp>]) -> (usize, Option<Stop>) {
        let base = self.last_stamp();
        let stamps: Vec<Vec<u8>> = ops.iter().map(|_| self.next_stamp()).collect();
        let txns = ops
            .iter()
            .enumerate()
            .map(|(i, o)| {
                self.stamped(o.clone(), if i == 0 { base.as_deref() } else { Some(&stamps[i - 1]) }, &stamps[i])
            })
            .collect();
        let answers = self.send_all("a write transaction", txns, self.timeout);
        // How many are known landed (a later answer or a barrier can show
        // several at once).
        let mut known = 0;
        for (i, answer) in answers.into_iter().enumerate() {
            if i < known {
                continue;
            }
            // The stamp transaction `i` compared.
            self.set_last_stamp(if i == 0 { base.clone() } else { Some(stamps[i - 1].clone()) });
            let through = match answer {
                Ok(Sent::Applied) => Ok(i),
                Ok(Sent::Refused { stamp, leader }) => self.judge(stamp, leader, i, &base, &stamps),
                Err(Classified::Definite(e)) => Err(Stop::Failed(TxnFailure::Refused(e))),
                Err(Classified::Unknown(e)) => match self.settle(&stamps[i..]) {
                    Ok(Some(j)) => Ok(i + j),
                    Ok(None) => Err(Stop::Lost(e)),
                    Err(later) => Err(Stop::Failed(TxnFailure::Unknown(
                        StorageError::Etcd(format!(
                            "{}; whether it landed is not known yet: {}",
                            crate::error::ErrorChain(&e),
                            crate::error::ErrorChain(&later)
                        )),
                        stamps[i..].to_vec(),
                    ))),
                },
            };
            match through {
                Ok(j) => {
                    known = j + 1;
                    self.set_last_stamp(Some(stamps[j].clone()));
                }
                Err(stop) => {
                    if matches!(stop, Stop::Early) {
                        self.sent_again.fetch_add((ops.len() - i) as u64, std::sync::atomic::Ordering::Relaxed);
                    }
                    return (i, Some(stop));
                }
            }
        }
        (known, None)
    }

    /// A refused transaction `i` of a pipeline: landed through some later
    /// one after all (an earlier try of it), evaluated before its
    /// predecessor landed, or refused by the fence or another writer.
    fn judge(
        &self,
        found: Option<Vec<u8>>,
        leader: i64,
        i: usize,
        base: &Option<Vec<u8>>,
        stamps: &[Vec<u8>],
    ) -> Result<usize, Stop> {
        if self.fence.is_some() && leader != self.term() {
            return Err(Stop::Failed(TxnFailure::Refused(self.deposed(format!(
                "a write was refused by the fence: the leader key is no longer term {}'s",
                self.term()
            )))));
        }
        if let Some(found) = &found {
            if let Some(j) = stamps[i..].iter().position(|s| s == found) {
                return Ok(i + j);
            }
            if i > 0 && stamps[..i - 1].contains(found) {
                return Err(Stop::Early);
            }
        }
        if i > 0 && found == *base {
            return Err(Stop::Early);
        }
        Err(Stop::Failed(TxnFailure::Refused(self.deposed(
            "a write was refused: the store's write stamp moved, another writer is at work under this prefix".into(),
        ))))
    }

    /// Whether the writes that carried `stamps` (chained, the first
    /// compared with the stamp as the last landed write left it) landed,
    /// for good: `Some(j)` through `stamps[j]`, `None` none of them (nor
    /// ever will). A barrier moves the stamp if the first has not landed
    /// (then none can: each compares the value the one before it puts),
    /// else the stamp shows how far they got. Tried until etcd answers (an
    /// etcd leader election takes a second or two), at most 3 s.
    pub fn settle(&self, stamps: &[Vec<u8>]) -> Result<Option<usize>, StorageError> {
        // Long enough for an etcd leader election; past it the write is
        // left unknown (503) and settled before the next one.
        let deadline = std::time::Instant::now() + self.timeout.min(Duration::from_secs(3));
        let mut pause = Duration::from_millis(20);
        let base = self.last_stamp();
        // Every barrier tried since the write went unanswered, kept across
        // calls until it is settled: one may land although its answer was
        // lost, even after a call that gave up (a request the bridge timed
        // out on still runs).
        loop {
            let barrier = self.next_stamp();
            self.barriers().push(barrier.clone());
            // Short tries, each on the next member after a failure of any
            // kind: a barrier is tiny, and whichever lands, the stamp
            // settles it.
            let (member, _) = self.members.pick();
            let attempt = self.timeout.min(Duration::from_secs(2));
            let txn = self.stamped(Vec::new(), base.as_deref(), &barrier);
            let answer = self.send_all("settling a write", vec![txn], attempt).pop();
            let last = match answer {
                Some(Ok(Sent::Applied)) => {
                    self.barriers().clear();
                    self.set_last_stamp(Some(barrier));
                    return Ok(None);
                }
                Some(Ok(Sent::Refused { leader, .. })) if self.fence.is_some() && leader != self.term() => {
                    return Err(
                        self.deposed(format!("settling a write: the leader key is no longer term {}'s", self.term()))
                    );
                }
                Some(Ok(Sent::Refused { stamp: Some(found), .. })) if stamps.contains(&found) => {
                    self.barriers().clear();
                    self.set_last_stamp(Some(found.clone()));
                    return Ok(stamps.iter().position(|s| *s == found));
                }
                Some(Ok(Sent::Refused { stamp: Some(found), .. })) if self.barriers().contains(&found) => {
                    self.barriers().clear();
                    self.set_last_stamp(Some(found));
                    return Ok(None);
                }
                Some(Ok(Sent::Refused { .. })) => {
                    return Err(self.deposed(
                        "settling a write: the store's write stamp moved, another writer is at work under this prefix"
                            .into(),
                    ));
                }
                Some(Err(Classified::Definite(e) | Classified::Unknown(e))) => {
                    self.members.failed(member);
                    e
                }
                None => StorageError::Etcd("settling a write: no answer".into()),
            };
            if std::time::Instant::now() + pause >= deadline {
                return Err(last);
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(500));
        }
    }
}
