//! Where new instances go and which ports they get.
//!
//! Placement spreads a role across nodes: each new instance goes to the
//! `Ready` node with the fewest instances of its cluster, then the fewest
//! instances overall, then the lowest node id; a request may pin the nodes.
//! Ports come from each node's range; the allocator is shared by all
//! cluster actors, so two clusters scaling at once never get the same port.
//! An instance keeps its ports until it is forgotten.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex;

use crate::error::Error;
use crate::ids::NodeId;
use crate::storage::records::{InstanceRecord, NodeStatus};

use super::read_model::State;

/// Ports in use per node, for every instance the master knows.
#[derive(Default)]
pub struct PortAllocator {
    used: Mutex<HashMap<NodeId, BTreeSet<u16>>>,
}

impl PortAllocator {
    pub fn from_instances<'a>(instances: impl IntoIterator<Item = &'a InstanceRecord>) -> Self {
        let a = PortAllocator::default();
        {
            let mut used = a.lock();
            for i in instances {
                used.entry(i.node.clone()).or_default().extend(i.ports.values().copied());
            }
        }
        a
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<NodeId, BTreeSet<u16>>> {
        self.used.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Reserves `n` free ports of `range` on `node`, lowest first.
    pub fn allocate(&self, node: &NodeId, range: (u16, u16), n: usize) -> Result<Vec<u16>, Error> {
        let mut used = self.lock();
        let set = used.entry(node.clone()).or_default();
        let free: Vec<u16> = (range.0..=range.1).filter(|p| !set.contains(p)).take(n).collect();
        if free.len() < n {
            return Err(Error::conflict(
                "no_ports",
                format!("node {node} has only {} free ports in {}-{}, {n} needed", free.len(), range.0, range.1),
            ));
        }
        set.extend(free.iter().copied());
        Ok(free)
    }

    /// Marks `ports` of `node` as taken (boot: ports of force-delete leftovers).
    pub fn reserve(&self, node: &NodeId, ports: impl IntoIterator<Item = u16>) {
        self.lock().entry(node.clone()).or_default().extend(ports);
    }

    pub fn release(&self, node: &NodeId, ports: impl IntoIterator<Item = u16>) {
        if let Some(set) = self.lock().get_mut(node) {
            for p in ports {
                set.remove(&p);
            }
        }
    }
}

/// Chooses nodes for `n` new instances of `cluster`.
///
/// `pinned`: when given, only these nodes are used (each must exist and be
/// Ready); instances are still spread over them by the same rule.
pub fn place(
    state: &State,
    cluster: &str,
    n: usize,
    pinned: Option<&[NodeId]>,
    now: time::OffsetDateTime,
    ready: impl Fn(&super::read_model::NodeView, time::OffsetDateTime) -> NodeStatus,
) -> Result<Vec<NodeId>, Error> {
    let candidates: Vec<NodeId> = match pinned {
        Some(list) => {
            if list.is_empty() {
                return Err(Error::invalid("invalid_request", "nodes: must not be empty when given"));
            }
            for id in list {
                let node = state.nodes.get(id).ok_or_else(|| Error::spec("nodes", format!("unknown node {id:?}")))?;
                if ready(node, now) != NodeStatus::Ready {
                    return Err(Error::unavailable(format!("node {id} is not Ready")));
                }
            }
            list.to_vec()
        }
        None => {
            state.nodes.values().filter(|v| ready(v, now) == NodeStatus::Ready).map(|v| v.record.id.clone()).collect()
        }
    };
    if candidates.is_empty() {
        return Err(Error::unavailable("no Ready node to place instances on"));
    }
    let mut in_cluster: BTreeMap<NodeId, usize> = candidates.iter().map(|n| (n.clone(), 0)).collect();
    let mut total: BTreeMap<NodeId, usize> = in_cluster.clone();
    for i in state.instances.values() {
        if let Some(c) = total.get_mut(&i.node) {
            *c += 1;
        }
        if i.cluster == cluster
            && let Some(c) = in_cluster.get_mut(&i.node)
        {
            *c += 1;
        }
    }
    let mut chosen = Vec::with_capacity(n);
    for _ in 0..n {
        let best = candidates
            .iter()
            .min_by_key(|id| (in_cluster[*id], total[*id], (*id).clone()))
            .cloned()
            .ok_or_else(|| Error::unavailable("no node to place on"))?;
        *in_cluster.entry(best.clone()).or_default() += 1;
        *total.entry(best.clone()).or_default() += 1;
        chosen.push(best);
    }
    Ok(chosen)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_never_handed_out_twice_and_come_back_on_release() {
        let a = PortAllocator::default();
        let n = NodeId::new("n1");
        let p1 = a.allocate(&n, (20000, 20003), 3).unwrap();
        assert_eq!(p1, vec![20000, 20001, 20002]);
        assert!(a.allocate(&n, (20000, 20003), 2).is_err());
        a.release(&n, [20001]);
        assert_eq!(a.allocate(&n, (20000, 20003), 2).unwrap(), vec![20001, 20003]);
        // Another node has its own range.
        assert_eq!(a.allocate(&NodeId::new("n2"), (20000, 20003), 1).unwrap(), vec![20000]);
    }
}
