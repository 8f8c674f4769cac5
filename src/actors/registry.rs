//! The live cluster actors, by cluster name: how the API and the node
//! managers reach a cluster without going through the supervisor's mailbox.
//! Read without a lock on every request. A name is taken by the supervisor
//! only (creates, boot), so it is taken exactly once; it is given back by
//! the supervisor (deletes) or by a cluster actor whose create was refused
//! (`remove_if`: only while the name is still that actor's).

use std::sync::Arc;

use actix::Addr;
use arc_swap::ArcSwap;

use super::cluster::ClusterActor;
use super::priority::Priority;
use super::read_model::{ActorStats, Reservation};
use crate::error::Error;

/// A cluster actor's address, its counters (which bound its mailbox) and
/// the gate of its thread.
#[derive(Clone)]
pub struct ClusterHandle {
    /// The cluster it serves (a name may be deleted and taken again).
    pub cluster: crate::ids::ClusterId,
    pub addr: Addr<ClusterActor>,
    pub stats: Arc<ActorStats>,
    pub priority: Arc<Priority>,
    /// The thread the actor runs on.
    pub arbiter: actix::ArbiterHandle,
}

impl ClusterHandle {
    /// Why no request may be sent to the actor: its supervisor gave it up
    /// (or is giving it up) and only an operator brings it back.
    pub fn given_up(&self) -> Option<Error> {
        let name = &self.stats.id;
        matches!(self.stats.state().as_str(), "failed" | "giving up").then(|| {
            Error::unavailable(format!(
                "the actor of cluster {name} failed too often and was given up (GET /api/v1/actors says why); restart it: POST /api/v1/actors/cluster/{name}/restart (flotilla actor restart cluster {name})"
            ))
        })
    }

    /// Reserves a place in the actor's mailbox of `capacity` for an API
    /// request, marked urgent on the actor's thread, or answers
    /// `overloaded` (the API's 503): the message must then not be sent.
    pub fn reserve(&self, capacity: usize) -> Result<Reservation, Error> {
        if let Some(e) = self.given_up() {
            return Err(e);
        }
        let slot = Reservation::within(&self.stats, capacity).ok_or_else(|| {
            Error::overloaded(format!("cluster {} has {capacity} requests waiting; retry shortly", self.stats.id))
        })?;
        Ok(slot.with_urgent(self.priority.urgent()))
    }
}

#[derive(Clone, Default)]
pub struct Registry(Arc<ArcSwap<imbl::HashMap<Arc<str>, ClusterHandle>>>);

impl Registry {
    pub fn get(&self, name: &str) -> Option<ClusterHandle> {
        self.0.load().get(name).cloned()
    }

    pub fn contains(&self, name: &str) -> bool {
        self.0.load().contains_key(name)
    }

    pub fn len(&self) -> usize {
        self.0.load().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn insert(&self, name: &str, handle: ClusterHandle) {
        let key: Arc<str> = Arc::from(name);
        self.0.rcu(|cur| {
            let mut next = imbl::HashMap::clone(cur);
            next.insert(key.clone(), handle.clone());
            next
        });
    }

    /// Removes `name` if it is still the actor counted by `stats` (not a
    /// later actor that took the name since).
    pub fn remove_if(&self, name: &str, stats: &Arc<ActorStats>) {
        self.0.rcu(|cur| {
            let mut next = imbl::HashMap::clone(cur);
            if next.get(name).is_some_and(|h| Arc::ptr_eq(&h.stats, stats)) {
                next.remove(name);
            }
            next
        });
    }

    pub fn remove(&self, name: &str) -> Option<ClusterHandle> {
        let mut removed = None;
        self.0.rcu(|cur| {
            let mut next = imbl::HashMap::clone(cur);
            removed = next.remove(name);
            next
        });
        removed
    }
}
