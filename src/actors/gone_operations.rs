//! The operations of deleted clusters. A live cluster keeps its newest
//! `operations_retained` ended operations (its actor trims them). A deleted
//! cluster's operations stay readable (`GET /operations/{id}` shows how a
//! cluster ended), but all deleted clusters together keep at most
//! `operations_retained` of them, oldest deleted first. Without this, each
//! create and delete left its operations on disk for good.

use std::collections::BTreeSet;

use crate::ids::{ClusterId, OperationId};
use crate::storage::WriteOp;

/// `(created nanos, operation, cluster)`, oldest first.
type Entry = (u64, OperationId, ClusterId);

#[derive(Debug)]
pub struct GoneOperations {
    limit: usize,
    kept: BTreeSet<Entry>,
}

impl GoneOperations {
    /// Starts from what the store holds for clusters that no longer exist;
    /// returns the deletes that bring it within `limit`.
    pub fn new(limit: usize, stored: impl IntoIterator<Item = Entry>) -> (GoneOperations, Vec<WriteOp>) {
        let mut gone = GoneOperations { limit: limit.max(1), kept: stored.into_iter().collect() };
        let writes = gone.trim();
        (gone, writes)
    }

    /// Counts in the operations of a cluster just deleted; returns the
    /// deletes of the oldest ones past the limit.
    pub fn add(&mut self, cluster: ClusterId, ops: impl IntoIterator<Item = (u64, OperationId)>) -> Vec<WriteOp> {
        self.kept.extend(ops.into_iter().map(|(created, op)| (created, op, cluster)));
        self.trim()
    }

    pub fn len(&self) -> usize {
        self.kept.len()
    }

    pub fn is_empty(&self) -> bool {
        self.kept.is_empty()
    }

    fn trim(&mut self) -> Vec<WriteOp> {
        let mut writes = Vec::new();
        while self.kept.len() > self.limit {
            if let Some((created, op, cluster)) = self.kept.pop_first() {
                writes.extend(WriteOp::delete_operation(&op, &cluster, created));
            }
        }
        writes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ops(n: u64, from: u64) -> Vec<(u64, OperationId)> {
        (0..n).map(|i| (from + i, OperationId::random())).collect()
    }

    #[test]
    fn keeps_the_newest_within_the_limit_across_clusters() {
        let stored: Vec<Entry> = ops(5, 100).into_iter().map(|(t, o)| (t, o, ClusterId::random())).collect();
        let (mut gone, writes) = GoneOperations::new(3, stored.clone());
        assert_eq!(gone.len(), 3);
        // Each trimmed operation is deleted with its index entries.
        let per_op = WriteOp::delete_operation(&stored[0].1, &stored[0].2, stored[0].0).len();
        assert_eq!(writes.len(), 2 * per_op, "the two oldest stored ones go at boot");

        let later = ops(2, 200);
        let writes = gone.add(ClusterId::random(), later.clone());
        assert_eq!(writes.len(), 2 * per_op);
        let kept: Vec<u64> = gone.kept.iter().map(|e| e.0).collect();
        assert_eq!(kept, vec![104, 200, 201], "the newest three remain");
        assert!(gone.add(ClusterId::random(), Vec::new()).is_empty());
    }
}
