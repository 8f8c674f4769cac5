//! The operations of deleted clusters. A live cluster keeps its newest
//! `operations_retained` ended operations (its actor trims them). A deleted
//! cluster's operations stay readable (`GET /operations/{id}` shows how a
//! cluster ended), but all deleted clusters together keep at most
//! `operations_retained` of them: the earliest deleted cluster's go first,
//! its oldest first. Without this, each create and delete left its
//! operations on disk for good. Ordered by deletion, not creation, so a
//! delete that ran long is not trimmed by clusters deleted meanwhile (its
//! waiter would find its own operation gone).

use std::collections::{BTreeMap, BTreeSet};

use crate::ids::{ClusterId, OperationId};
use crate::storage::WriteOp;

/// `(created nanos, operation, cluster)`.
type Stored = (u64, OperationId, ClusterId);

/// `(deletion order, created nanos, operation, cluster)`, first to go first.
type Entry = (u64, u64, OperationId, ClusterId);

#[derive(Debug)]
pub struct GoneOperations {
    limit: usize,
    kept: BTreeSet<Entry>,
    /// The deletion order the next deleted cluster gets.
    next: u64,
}

impl GoneOperations {
    /// Starts from what the store holds for clusters that no longer exist;
    /// returns the deletes that bring it within `limit`.
    /// The store does not say when a cluster was deleted: its newest
    /// operation (its delete, usually) stands in for it.
    pub fn new(limit: usize, stored: impl IntoIterator<Item = Stored>) -> (GoneOperations, Vec<WriteOp>) {
        let mut by_cluster: BTreeMap<ClusterId, Vec<(u64, OperationId)>> = BTreeMap::new();
        for (created, op, cluster) in stored {
            by_cluster.entry(cluster).or_default().push((created, op));
        }
        let mut clusters: Vec<_> = by_cluster.into_iter().collect();
        clusters.sort_by_key(|(_, ops)| ops.iter().map(|(created, _)| *created).max());
        let mut gone = GoneOperations { limit: limit.max(1), kept: BTreeSet::new(), next: 0 };
        let mut writes = Vec::new();
        for (cluster, ops) in clusters {
            writes.extend(gone.add(cluster, ops));
        }
        (gone, writes)
    }

    /// Counts in the operations of a cluster just deleted; returns the
    /// deletes of those past the limit (earliest deleted cluster first).
    pub fn add(&mut self, cluster: ClusterId, ops: impl IntoIterator<Item = (u64, OperationId)>) -> Vec<WriteOp> {
        let order = self.next;
        self.next += 1;
        self.kept.extend(ops.into_iter().map(|(created, op)| (order, created, op, cluster)));
        self.trim()
    }

    fn trim(&mut self) -> Vec<WriteOp> {
        let mut writes = Vec::new();
        while self.kept.len() > self.limit {
            if let Some((_, created, op, cluster)) = self.kept.pop_first() {
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
    fn keeps_the_latest_deleted_within_the_limit() {
        // Stored: two gone clusters, `a` (ops at 100, 101) and `b` (102-104).
        let (a, b) = (ClusterId::random(), ClusterId::random());
        let mut stored: Vec<Stored> = ops(2, 100).into_iter().map(|(t, o)| (t, o, a)).collect();
        stored.extend(ops(3, 102).into_iter().map(|(t, o)| (t, o, b)));
        let (mut gone, writes) = GoneOperations::new(3, stored.clone());
        let per_op = WriteOp::delete_operation(&stored[0].1, &stored[0].2, stored[0].0).len();
        assert_eq!(writes.len(), 2 * per_op, "a's two go at boot, b was deleted later");
        assert_eq!(created(&gone), vec![102, 103, 104]);

        // A cluster whose delete ran long: its operations are older than
        // b's, but it was deleted last, so b's go and its own stay.
        let writes = gone.add(ClusterId::random(), ops(2, 50));
        assert_eq!(writes.len(), 2 * per_op);
        assert_eq!(created(&gone), vec![104, 50, 51]);
        // More than the limit in one delete: its oldest go, its delete stays.
        let writes = gone.add(ClusterId::random(), ops(4, 200));
        assert_eq!(writes.len(), 4 * per_op);
        assert_eq!(created(&gone), vec![201, 202, 203]);
        assert!(gone.add(ClusterId::random(), Vec::new()).is_empty());
    }

    fn created(gone: &GoneOperations) -> Vec<u64> {
        gone.kept.iter().map(|e| e.1).collect()
    }
}
