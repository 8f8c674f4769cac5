//! Turning a batch of [`WriteOp`]s into etcd transactions.
//!
//! etcd refuses a transaction that puts one key twice, or puts a key a
//! range delete of the same transaction covers, and one that has more ops
//! than its `--max-txn-ops` (128 by default) or is larger than its
//! request limit (1.5 MiB). A [`TxnBuilder`] therefore coalesces: the last
//! write of a key wins (a later put after a range delete splits the range
//! around it), which is also what makes a group-commit round cheap when
//! the same records are rewritten within it. Whole requests are added to
//! a transaction only while its bound on ops and bytes allows.

use std::collections::BTreeMap;

use etcd_client::{DeleteOptions, TxnOp};

use super::layout::Layout;
use crate::storage::WriteOp;

/// Per-op overhead counted against the request size limit (tags, lengths).
const OP_OVERHEAD: usize = 16;

/// How large a transaction may be.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Ops per transaction (etcd's `--max-txn-ops`).
    pub max_ops: usize,
    /// Bytes of keys and values per transaction (below etcd's
    /// `--max-request-bytes`).
    pub max_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        // etcd's defaults: 128 ops, 1.5 MiB per request. One op is kept
        // for nothing (the fence is a compare, not an op), the bytes leave
        // room for the gRPC framing.
        Limits { max_ops: 128, max_bytes: 1024 * 1024 }
    }
}

/// What one request (or several) costs at most once coalesced: its ops
/// (a put counted once more for each range delete about, since it may
/// split each), and its bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Cost {
    puts: usize,
    others: usize,
    /// Range deletes: a later put may split each of them.
    ranges: usize,
    pub bytes: usize,
}

impl Cost {
    pub fn of(ops: &[WriteOp], layout_overhead: usize) -> Cost {
        let mut c = Cost::default();
        for op in ops {
            match op {
                WriteOp::Put { key, value, .. } => {
                    c.puts += 1;
                    c.bytes += key.len() + value.len() + layout_overhead + OP_OVERHEAD;
                }
                WriteOp::Delete { key, .. } => {
                    c.others += 1;
                    c.bytes += key.len() + layout_overhead + OP_OVERHEAD;
                }
                WriteOp::DeleteRange { from, to, .. } => {
                    c.others += 1;
                    c.ranges += 1;
                    c.bytes += from.len() + to.len() + 2 * layout_overhead + OP_OVERHEAD;
                }
                WriteOp::Append { value, .. } => {
                    c.puts += 1;
                    c.bytes += value.len() + 8 + layout_overhead + OP_OVERHEAD;
                }
            }
        }
        c
    }

    pub fn plus(self, o: Cost) -> Cost {
        Cost {
            puts: self.puts + o.puts,
            others: self.others + o.others,
            ranges: self.ranges + o.ranges,
            bytes: self.bytes + o.bytes,
        }
    }

    /// The most ops this can become: each put may split every range
    /// delete it falls in (one more op per range).
    pub fn ops(&self) -> usize {
        self.others + self.puts.saturating_mul(1 + self.ranges)
    }

    pub fn fits(&self, limits: &Limits) -> bool {
        self.ops() <= limits.max_ops && self.bytes <= limits.max_bytes
    }
}

/// The coalesced writes of one transaction, in etcd keys.
#[derive(Debug, Default)]
pub struct TxnBuilder {
    /// The last write of each key: a value, or `None` for a delete.
    keys: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
    /// Range deletes `[from, to)`, in the order given.
    ranges: Vec<(Vec<u8>, Vec<u8>)>,
    /// What was added, before coalescing (for the bounds).
    pub cost: Cost,
}

impl TxnBuilder {
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty() && self.ranges.is_empty()
    }

    /// Adds one request's ops (appends must already be puts).
    pub fn add(&mut self, layout: &Layout, ops: &[WriteOp], cost: Cost) {
        self.cost = self.cost.plus(cost);
        for op in ops {
            match op {
                WriteOp::Put { cf, key, value } => {
                    self.keys.insert(layout.key(cf, key), Some(value.clone()));
                }
                WriteOp::Delete { cf, key } => {
                    self.keys.insert(layout.key(cf, key), None);
                }
                WriteOp::DeleteRange { cf, from, to } => {
                    if from >= to {
                        continue;
                    }
                    let (from, to) = (layout.key(cf, from), layout.key(cf, to));
                    // Earlier writes inside the range are undone by it.
                    let inside: Vec<Vec<u8>> =
                        self.keys.range(from.clone()..to.clone()).map(|(k, _)| k.clone()).collect();
                    for k in inside {
                        self.keys.remove(&k);
                    }
                    self.ranges.push((from, to));
                }
                // Resolved by the writer before a batch reaches a sink.
                WriteOp::Append { .. } => {}
            }
        }
    }

    /// The transaction's writes: no key twice, no put inside a range delete.
    pub fn into_writes(self) -> Vec<EtcdWrite> {
        let mut out = Vec::with_capacity(self.keys.len() + self.ranges.len());
        for (from, to) in &self.ranges {
            // Split around the puts that came after it.
            let mut start = from.clone();
            for (k, v) in self.keys.range(from.clone()..to.clone()) {
                if v.is_none() {
                    continue;
                }
                if start < *k {
                    out.push(EtcdWrite::DeleteRange(start.clone(), k.clone()));
                }
                start = k.clone();
                start.push(0);
            }
            if start < *to {
                out.push(EtcdWrite::DeleteRange(start, to.clone()));
            }
        }
        let covered = |k: &Vec<u8>| self.ranges.iter().any(|(f, t)| f <= k && k < t);
        for (k, v) in self.keys {
            match v {
                Some(v) => out.push(EtcdWrite::Put(k, v)),
                // A single delete inside a range delete is that range's.
                None if covered(&k) => {}
                None => out.push(EtcdWrite::Delete(k)),
            }
        }
        out
    }
}

/// One write of a transaction, in etcd keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EtcdWrite {
    Put(Vec<u8>, Vec<u8>),
    Delete(Vec<u8>),
    /// `[from, to)`.
    DeleteRange(Vec<u8>, Vec<u8>),
}

impl EtcdWrite {
    /// Its bytes, for the request size bound.
    pub fn bytes(&self) -> usize {
        OP_OVERHEAD
            + match self {
                EtcdWrite::Put(k, v) => k.len() + v.len(),
                EtcdWrite::Delete(k) => k.len(),
                EtcdWrite::DeleteRange(f, t) => f.len() + t.len(),
            }
    }

    pub fn into_op(self) -> TxnOp {
        match self {
            EtcdWrite::Put(k, v) => TxnOp::put(k, v, None),
            EtcdWrite::Delete(k) => TxnOp::delete(k, None),
            EtcdWrite::DeleteRange(f, t) => TxnOp::delete(f, Some(DeleteOptions::new().with_range(t))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(k: &str) -> WriteOp {
        WriteOp::Put { cf: "d", key: k.as_bytes().to_vec(), value: k.as_bytes().to_vec() }
    }

    fn built(ops: &[WriteOp]) -> Vec<EtcdWrite> {
        let l = Layout::new("p");
        let mut b = TxnBuilder::default();
        b.add(&l, ops, Cost::of(ops, 4));
        b.into_writes()
    }

    fn k(s: &str) -> Vec<u8> {
        format!("p/d/{s}").into_bytes()
    }

    #[test]
    fn the_last_write_of_a_key_wins_and_ranges_split_around_later_puts() {
        let ops = [
            put("a"),
            put("a"),
            WriteOp::Delete { cf: "d", key: b"b".to_vec() },
            put("b"),
            put("c1"),
            WriteOp::DeleteRange { cf: "d", from: b"c".to_vec(), to: b"d".to_vec() },
            put("c5"),
            WriteOp::Delete { cf: "d", key: b"c7".to_vec() },
        ];
        let out = built(&ops);
        // a once, b put, c1 gone (the range came after), the range split
        // around c5, the single delete of c7 left to the range.
        let mut after_c5 = k("c5");
        after_c5.push(0);
        assert_eq!(
            out,
            vec![
                EtcdWrite::DeleteRange(k("c"), k("c5")),
                EtcdWrite::DeleteRange(after_c5, k("d")),
                EtcdWrite::Put(k("a"), b"a".to_vec()),
                EtcdWrite::Put(k("b"), b"b".to_vec()),
                EtcdWrite::Put(k("c5"), b"c5".to_vec()),
            ]
        );
    }

    #[test]
    fn the_cost_bounds_what_coalescing_can_produce() {
        let ops = [put("a"), WriteOp::DeleteRange { cf: "d", from: b"a".to_vec(), to: b"z".to_vec() }, put("b")];
        let c = Cost::of(&ops, 4);
        assert_eq!(c.ops(), 5);
        assert!(built(&ops).len() <= c.ops());
        let limits = Limits { max_ops: 4, max_bytes: 1 << 20 };
        assert!(!c.fits(&limits));
    }
}
