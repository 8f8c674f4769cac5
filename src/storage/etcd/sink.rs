//! The writer's sink on etcd: each group-commit round becomes as few
//! fenced transactions as etcd's limits allow, whole requests to each.
//!
//! A request too large for one transaction keeps its atomicity through a
//! redo record: its writes are first stored as chunks under
//! `<prefix>_redo/chunk/`, then its head (`_redo/head`: chunk count,
//! length, sha256) is written — the commit point — then the writes are
//! applied in as many transactions as needed, and the record deleted. A
//! leader that finds a head at takeover applies the record before it reads
//! anything ([`recover`]); chunks without a head are an attempt that never
//! committed and are deleted. A follower's feed announces the record's
//! writes as one batch once the head goes (applied), never half of it.

use sha2::{Digest, Sha256};

use super::chain::{ChainFailure, TxnFailure};
use super::conn::Conn;
use super::layout::prefix_end;
use super::txn::{Cost, EtcdWrite, Limits, TxnBuilder};
use crate::storage::writer::{BatchSink, SinkError};
use crate::storage::{StorageError, WriteOp};

/// The writer's sink on etcd.
pub struct EtcdSink {
    conn: Conn,
    cfs: &'static [&'static str],
    /// Set when a write landed although its callers were told it failed,
    /// or a committed redo record is half applied: the writer refuses
    /// everything after it (the master exits; the next leader reads the truth).
    broken: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// The stamps of writes whose outcome is not known yet (etcd stopped
    /// answering): settled before anything else is written.
    unsettled: std::cell::RefCell<Option<Vec<Vec<u8>>>>,
}

impl EtcdSink {
    pub fn new(
        conn: Conn,
        cfs: &'static [&'static str],
        broken: std::sync::Arc<std::sync::atomic::AtomicBool>,
    ) -> EtcdSink {
        EtcdSink { conn, cfs, broken, unsettled: Default::default() }
    }

    /// The limits a batch is cut by: one op of each transaction is the stamp.
    fn limits(&self) -> Limits {
        Limits { max_ops: self.conn.limits.max_ops.saturating_sub(1).max(1), max_bytes: self.conn.limits.max_bytes }
    }

    fn overhead(&self) -> usize {
        self.conn.layout.prefix().len() + 24
    }

    /// Sends the round's transactions built so far, all at once (they
    /// land in order); each comes with the index of its first request. A
    /// failure names the first request not durable.
    fn flush(&self, txns: &mut Vec<(Vec<EtcdWrite>, usize)>) -> Result<(), (usize, StorageError)> {
        let built = std::mem::take(txns);
        let firsts: Vec<usize> = built.iter().map(|(_, first)| *first).collect();
        self.conn
            .txns(built.into_iter().map(|(w, _)| w).collect())
            .map_err(|ChainFailure { landed, failure }| (firsts[landed], self.failed(failure)))
    }

    fn send(&self, writes: Vec<EtcdWrite>) -> Result<(), StorageError> {
        self.conn.txn(writes).map_err(|f| self.failed(f))
    }

    /// The error of a failed write, keeping its stamps if its outcome is
    /// not known yet.
    fn failed(&self, f: TxnFailure) -> StorageError {
        match f {
            TxnFailure::Refused(e) => e,
            TxnFailure::Unknown(e, stamps) => {
                *self.unsettled.borrow_mut() = Some(stamps);
                e
            }
        }
    }

    /// Settles a write whose outcome was unknown: not landed, writing goes
    /// on; landed (its callers were told it failed), this master's memory
    /// is behind the store and it writes nothing more; etcd still silent,
    /// nothing is written yet (a clear refusal, `503`).
    fn settle(&self) -> Result<(), StorageError> {
        let Some(stamps) = self.unsettled.borrow().clone() else { return Ok(()) };
        match self.conn.settle(&stamps) {
            Ok(None) => {
                tracing::warn!("a write whose outcome was unknown did not land: writing goes on");
                *self.unsettled.borrow_mut() = None;
                Ok(())
            }
            Ok(Some(_)) => {
                self.broken.store(true, std::sync::atomic::Ordering::SeqCst);
                Err(StorageError::Etcd(
                    "a write reported failed did land in etcd: this master's memory is behind its store, it writes nothing more (the next leader reads the truth)".into(),
                ))
            }
            Err(e @ StorageError::Deposed { .. }) => Err(e),
            Err(e) => Err(StorageError::Etcd(format!(
                "etcd does not answer, and whether an earlier write landed is still unknown; nothing is written until it answers: {}",
                crate::error::ErrorChain(&e)
            ))),
        }
    }

    /// One request too large for a transaction, kept whole by a redo
    /// record. A failure says whether the request was committed anyway
    /// (past its head: the next leader finishes it, and this master, its
    /// store now half applied, writes nothing more).
    fn redo(&self, req: &[WriteOp]) -> Result<(), (bool, StorageError)> {
        self.redo_record(req).map_err(|e| (false, e))?.map_err(|e| {
            self.broken.store(true, std::sync::atomic::Ordering::SeqCst);
            (true, e)
        })
    }

    /// Writes the record and its head (outer `Err`: not committed), then
    /// applies it (inner `Err`: committed, not applied).
    fn redo_record(&self, req: &[WriteOp]) -> Result<Result<(), StorageError>, StorageError> {
        let mut b = TxnBuilder::default();
        b.add(&self.conn.layout, req, Cost::default());
        let writes = b.into_writes();
        // A single write etcd would refuse is refused before anything is
        // committed: a redo record that can never be applied would stop
        // every later leader at its takeover.
        let limit = self.conn.limits.max_bytes;
        if let Some(big) = writes.iter().find(|w| w.bytes() > limit) {
            return Err(StorageError::Etcd(format!(
                "a single record of {} bytes is larger than one etcd transaction takes (etcd.max_txn_bytes = {limit})",
                big.bytes()
            )));
        }
        let record = encode(&writes);
        let layout = &self.conn.layout;
        let chunk = (self.conn.limits.max_bytes / 2).max(1024);
        let chunks: Vec<&[u8]> = record.chunks(chunk).collect();
        let head =
            Head { chunks: chunks.len() as u32, len: record.len() as u64, sha256: Sha256::digest(&record).into() };
        // Chained: the head lands only after every chunk did.
        let mut txns: Vec<Vec<EtcdWrite>> = chunks
            .iter()
            .enumerate()
            .map(|(i, c)| vec![EtcdWrite::Put(layout.redo_chunk(i as u32), c.to_vec())])
            .collect();
        txns.push(vec![EtcdWrite::Put(layout.redo_head(), head.encode())]);
        self.conn.txns(txns).map_err(|f| self.failed(f.failure))?;
        // Committed: from here on the next leader finishes it if we do not.
        Ok(apply(self, writes))
    }
}

impl BatchSink for EtcdSink {
    fn has_cf(&self, cf: &'static str) -> bool {
        self.cfs.contains(&cf)
    }

    fn write(&mut self, ops: &[WriteOp], ends: &[usize]) -> Result<(), SinkError> {
        if self.broken.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(SinkError {
                durable: 0,
                error: StorageError::Etcd("this master's store is behind etcd: it writes nothing more".into()),
            });
        }
        self.settle().map_err(|error| SinkError { durable: 0, error })?;
        let limits = self.limits();
        let overhead = self.overhead();
        let failed = |(durable, error)| SinkError { durable, error };
        // The round's transactions, each with its first request, sent
        // together at the end or before a redo record.
        let mut txns: Vec<(Vec<EtcdWrite>, usize)> = Vec::new();
        let mut txn = TxnBuilder::default();
        // The first request of the transaction being built.
        let mut first = 0;
        let mut start = 0;
        for (i, &end) in ends.iter().enumerate() {
            let req = &ops[start..end];
            start = end;
            let cost = Cost::of(req, overhead);
            if !cost.fits(&limits) {
                close(&mut txn, first, &mut txns);
                self.flush(&mut txns).map_err(failed)?;
                self.redo(req)
                    .map_err(|(committed, error)| SinkError { durable: i + usize::from(committed), error })?;
                first = i + 1;
                continue;
            }
            if !txn.cost.plus(cost).fits(&limits) {
                close(&mut txn, first, &mut txns);
                first = i;
            }
            txn.add(&self.conn.layout, req, cost);
        }
        close(&mut txn, first, &mut txns);
        self.flush(&mut txns).map_err(failed)
    }
}

/// Ends the transaction being built (starting at request `first`), if it
/// has anything.
fn close(txn: &mut TxnBuilder, first: usize, txns: &mut Vec<(Vec<EtcdWrite>, usize)>) {
    let built = std::mem::take(txn);
    if !built.is_empty() {
        txns.push((built.into_writes(), first));
    }
}

/// Applies a committed redo record's writes, then deletes the record.
fn apply(sink: &EtcdSink, writes: Vec<EtcdWrite>) -> Result<(), StorageError> {
    let limits = sink.limits();
    let mut parts = Vec::new();
    let mut part = Vec::new();
    let mut bytes = 0;
    for w in writes {
        if !part.is_empty() && (part.len() + 1 > limits.max_ops || bytes + w.bytes() > limits.max_bytes) {
            parts.push(std::mem::take(&mut part));
            bytes = 0;
        }
        bytes += w.bytes();
        part.push(w);
    }
    if !part.is_empty() {
        parts.push(part);
    }
    // Chained: the record goes only after every part landed.
    let p = sink.conn.layout.redo_prefix();
    parts.push(vec![EtcdWrite::DeleteRange(p.clone(), prefix_end(&p))]);
    sink.conn.txns(parts).map_err(|f| sink.failed(f.failure))
}

/// At takeover, before anything is read: finishes a committed redo record
/// left by the previous leader, or deletes an uncommitted one.
pub fn recover(sink: &EtcdSink) -> Result<bool, StorageError> {
    let layout = &sink.conn.layout;
    let found = sink.conn.all_under(&layout.redo_prefix())?;
    if found.is_empty() {
        return Ok(false);
    }
    let head_key = layout.redo_head();
    let Some((_, head)) = found.iter().find(|(k, _)| *k == head_key) else {
        let p = layout.redo_prefix();
        sink.send(vec![EtcdWrite::DeleteRange(p.clone(), prefix_end(&p))])?;
        return Ok(false);
    };
    let head = Head::decode(head)?;
    // Not sized from the head, which could say anything.
    let mut record = Vec::new();
    for i in 0..head.chunks {
        let key = layout.redo_chunk(i);
        let (_, c) = found
            .iter()
            .find(|(k, _)| *k == key)
            .ok_or_else(|| StorageError::Codec(format!("etcd redo record: chunk {i} of {} is missing", head.chunks)))?;
        record.extend_from_slice(c);
    }
    if record.len() as u64 != head.len || <[u8; 32]>::from(Sha256::digest(&record)) != head.sha256 {
        return Err(StorageError::Codec(
            "etcd redo record: its chunks do not match its head (length or sha256)".into(),
        ));
    }
    apply(sink, decode(&record)?)?;
    Ok(true)
}

/// A redo record's head.
#[derive(Debug, Clone, PartialEq)]
pub struct Head {
    pub chunks: u32,
    pub len: u64,
    pub sha256: [u8; 32],
}

impl Head {
    fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(44);
        v.extend_from_slice(&self.chunks.to_be_bytes());
        v.extend_from_slice(&self.len.to_be_bytes());
        v.extend_from_slice(&self.sha256);
        v
    }

    pub fn decode(v: &[u8]) -> Result<Head, StorageError> {
        if v.len() != 44 {
            return Err(StorageError::Codec(format!("etcd redo head: {} bytes, expected 44", v.len())));
        }
        let mut sha256 = [0u8; 32];
        sha256.copy_from_slice(&v[12..]);
        Ok(Head {
            chunks: u32::from_be_bytes([v[0], v[1], v[2], v[3]]),
            len: u64::from_be_bytes(v[4..12].try_into().unwrap_or_default()),
            sha256,
        })
    }
}

/// A head for `record` cut into `chunks` chunks (tests leave records as a
/// dying leader would).
pub fn head_bytes(record: &[u8], chunks: u32) -> Vec<u8> {
    Head { chunks, len: record.len() as u64, sha256: Sha256::digest(record).into() }.encode()
}

/// Writes as bytes: per write a tag (0 put, 1 delete, 2 range) and its
/// length-prefixed (u32) fields.
pub fn encode(writes: &[EtcdWrite]) -> Vec<u8> {
    let mut v = Vec::new();
    let field = |v: &mut Vec<u8>, b: &[u8]| {
        v.extend_from_slice(&(b.len() as u32).to_be_bytes());
        v.extend_from_slice(b);
    };
    for w in writes {
        match w {
            EtcdWrite::Put(k, val) => {
                v.push(0);
                field(&mut v, k);
                field(&mut v, val);
            }
            EtcdWrite::Delete(k) => {
                v.push(1);
                field(&mut v, k);
            }
            EtcdWrite::DeleteRange(f, t) => {
                v.push(2);
                field(&mut v, f);
                field(&mut v, t);
            }
        }
    }
    v
}

/// The writes of [`encode`]; a precise error for anything else.
pub fn decode(mut b: &[u8]) -> Result<Vec<EtcdWrite>, StorageError> {
    fn field<'a>(b: &mut &'a [u8]) -> Result<&'a [u8], StorageError> {
        let bad = || StorageError::Codec("etcd redo record: truncated".into());
        let len = b.get(..4).ok_or_else(bad)?;
        let len = u32::from_be_bytes([len[0], len[1], len[2], len[3]]) as usize;
        let out = b.get(4..4usize.checked_add(len).ok_or_else(bad)?).ok_or_else(bad)?;
        *b = &b[4 + len..];
        Ok(out)
    }
    let mut out = Vec::new();
    while let Some((&tag, rest)) = b.split_first() {
        b = rest;
        out.push(match tag {
            0 => EtcdWrite::Put(field(&mut b)?.to_vec(), field(&mut b)?.to_vec()),
            1 => EtcdWrite::Delete(field(&mut b)?.to_vec()),
            2 => EtcdWrite::DeleteRange(field(&mut b)?.to_vec(), field(&mut b)?.to_vec()),
            t => return Err(StorageError::Codec(format!("etcd redo record: unknown write tag {t}"))),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_redo_record_decodes_to_what_was_encoded_and_refuses_garbage() {
        let writes = vec![
            EtcdWrite::Put(b"k".to_vec(), vec![0, 1, 2]),
            EtcdWrite::Delete(b"d".to_vec()),
            EtcdWrite::DeleteRange(b"a".to_vec(), b"b".to_vec()),
        ];
        let bytes = encode(&writes);
        assert_eq!(decode(&bytes).unwrap(), writes);
        assert!(decode(&bytes[..bytes.len() - 1]).is_err());
        assert!(decode(&[9]).is_err());
        assert!(decode(&[0, 0xff, 0xff, 0xff, 0xff]).is_err());
        let head = Head { chunks: 3, len: 77, sha256: [7; 32] };
        assert_eq!(Head::decode(&head.encode()).unwrap(), head);
        assert!(Head::decode(&[1, 2]).is_err());
    }
}
