//! The gate between a node pool deleting a node and an operation putting
//! an instance on it (`actors::pools::retire`).
//!
//! An instance is placed on a node when its operation is built, and
//! indexed on the node only once its `allocate` step has written its
//! record: seconds later under load, or after a master restart. A pool
//! removing the node must never delete it in between. So both sides go
//! through one lock: `allocate` first checks the node is not being removed
//! and counts itself in ([`Removals::begin_allocate`], counted out when
//! its guard drops, after the instances are indexed); the pool marks a
//! node removed only when it holds no instance and no allocation is under
//! way ([`Removals::try_mark`]). Whichever comes first wins: the
//! allocation makes the pool put the node back, or the mark makes the
//! allocation fail, naming the node. Placement skips marked nodes too.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use crate::ids::NodeId;

#[derive(Default)]
struct Inner {
    removing: HashSet<NodeId>,
    allocating: HashMap<NodeId, usize>,
}

#[derive(Default)]
pub struct Removals {
    inner: Arc<Mutex<Inner>>,
}

/// An allocation under way on some nodes; counted out when dropped.
#[must_use]
pub struct Allocating {
    inner: Arc<Mutex<Inner>>,
    nodes: Vec<NodeId>,
}

impl Drop for Allocating {
    fn drop(&mut self) {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        for n in &self.nodes {
            if let Some(c) = g.allocating.get_mut(n) {
                *c -= 1;
                if *c == 0 {
                    g.allocating.remove(n);
                }
            }
        }
    }
}

impl Removals {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts an allocation in on `nodes`, unless one of them is being
    /// removed (that node is the error).
    pub fn begin_allocate(&self, nodes: &[NodeId]) -> Result<Allocating, NodeId> {
        let mut g = self.lock();
        if let Some(n) = nodes.iter().find(|n| g.removing.contains(*n)) {
            return Err(n.clone());
        }
        let mut counted = Vec::with_capacity(nodes.len());
        for n in nodes {
            if !counted.contains(n) {
                *g.allocating.entry(n.clone()).or_default() += 1;
                counted.push(n.clone());
            }
        }
        Ok(Allocating { inner: self.inner.clone(), nodes: counted })
    }

    /// Marks `node` removed if `empty()` (asked under the lock) and no
    /// allocation is under way on it; whether it did.
    pub fn try_mark(&self, node: &NodeId, empty: impl FnOnce() -> bool) -> bool {
        let mut g = self.lock();
        if g.allocating.get(node).copied().unwrap_or(0) > 0 || !empty() {
            return false;
        }
        g.removing.insert(node.clone());
        true
    }

    /// Marks `node` removed whatever it holds (a removal past its check,
    /// taken up again after a master restart).
    pub fn mark(&self, node: &NodeId) {
        self.lock().removing.insert(node.clone());
    }

    pub fn unmark(&self, node: &NodeId) {
        self.lock().removing.remove(node);
    }

    pub fn is_marked(&self, node: &NodeId) -> bool {
        self.lock().removing.contains(node)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_allocation_and_a_removal_never_both_win() {
        let r = Removals::default();
        let (a, b) = (NodeId::new("a"), NodeId::new("b"));
        let guard = r.begin_allocate(&[a.clone(), a.clone()]).unwrap();
        assert!(!r.try_mark(&a, || true), "an allocation under way keeps the node");
        drop(guard);
        assert!(!r.try_mark(&a, || false), "a node holding an instance is kept");
        assert!(r.try_mark(&a, || true));
        assert_eq!(r.begin_allocate(&[b.clone(), a.clone()]).err(), Some(a.clone()), "a marked node refuses");
        assert!(r.try_mark(&b, || true), "the refused allocation counted nothing in");
        r.unmark(&a);
        assert!(r.begin_allocate(&[a]).is_ok());
    }
}
