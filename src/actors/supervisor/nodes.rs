//! What the supervisor does for nodes: reconciling an agent's inventory
//! when it connects, and removing what a force delete left behind.

use super::*;

/// Removes a force delete's leftover from its agent, then forgets it.
async fn remove_leftover(shared: Shared, node: NodeId, instance: InstanceId, generation: u64) {
    let Some(link) = shared.links.get(&node) else { return };
    let req =
        crate::protocol::messages::AgentRequest::Delete { instance: instance.clone(), generation: generation + 1 };
    match link.call(req, "Delete").await {
        Ok(_) => forget_leftover(&shared, &instance).await,
        Err(e) => tracing::warn!(%instance, %node, error = %e, "cannot remove the leftover of a force delete yet"),
    }
}

/// Drops a leftover that is gone from its node, and frees its ports.
async fn forget_leftover(shared: &Shared, instance: &InstanceId) {
    if let Err(e) = shared.store.commit(vec![WriteOp::delete_leftover(instance)]).await {
        tracing::error!(%instance, error = %e, "cannot forget a removed leftover");
        return;
    }
    if let Some(l) = shared.read_model.remove_leftover(instance) {
        shared.ports.release(&l.node, l.ports.iter().copied());
        tracing::info!(%instance, node = %l.node, "the leftover of a force delete is gone from its node");
    }
}

/// An agent's inventory, sent when it (re)connects.
#[derive(Message)]
#[rtype(result = "()")]
pub struct NodeInventory {
    pub node: NodeId,
    /// The master's id of the connection whose `Hello` carried it.
    pub connection: u64,
    pub reports: Vec<crate::protocol::messages::InstanceReport>,
    /// Instance directories the agent holds no record of.
    pub unrecorded: Vec<InstanceId>,
    pub slot: Reservation,
}

impl Handler<NodeInventory> for Supervisor {
    type Result = ();

    /// What the agent holds that the master does not know: instances of
    /// no cluster are leaked (see `actors::leaked`): reported, and removed
    /// after `leaked_grace`; a force delete's leftovers are removed. (Its
    /// instances the master knows are reconciled by the connection's node
    /// manager, in order with its reports: `node_manager::routing`.)
    fn handle(&mut self, msg: NodeInventory, _ctx: &mut Context<Self>) {
        let NodeInventory { node, reports, unrecorded, slot, .. } = msg;
        slot.begin("inventory");
        let msg = (node, reports);
        let ours = self.shared.read_model.node(&msg.0).map(|n| n.instances()).unwrap_or_default();
        let reports: HashMap<&InstanceId, &crate::protocol::messages::InstanceReport> =
            msg.1.iter().map(|r| (&r.instance, r)).collect();
        // Leftovers the agent no longer holds (it finished the delete itself,
        // e.g. from its tombstone after a restart): nothing left to remove.
        let leftovers = self.shared.read_model.leftovers();
        let dirs: std::collections::HashSet<&InstanceId> = unrecorded.iter().collect();
        let held = |id: &InstanceId| reports.contains_key(id) || dirs.contains(id);
        for l in leftovers.values().filter(|l| l.node == msg.0 && !held(&l.instance)) {
            let shared = self.shared.clone();
            let id = l.instance.clone();
            actix::spawn(async move { forget_leftover(&shared, &id).await });
        }
        let mut leaked = Vec::new();
        // A directory without a record: generation 0 (its Delete, at 1,
        // removes the directory and whatever carries the instance's marker).
        let only_dirs =
            unrecorded.iter().filter(|id| !reports.contains_key(id)).map(|id| crate::actors::leaked::Seen {
                instance: id.clone(),
                generation: 0,
                running: false,
                pid: None,
                unrecorded: true,
            });
        let recorded = msg.1.iter().map(|r| crate::actors::leaked::Seen {
            instance: r.instance.clone(),
            generation: r.generation,
            running: r.running,
            pid: r.pid,
            unrecorded: false,
        });
        for seen in recorded.chain(only_dirs) {
            if ours.contains_key(&seen.instance) {
                continue;
            }
            if leftovers.get(&seen.instance).is_some_and(|l| l.node == msg.0) {
                // A force delete could not remove it then; finish the job now.
                actix::spawn(remove_leftover(self.shared.clone(), msg.0.clone(), seen.instance, seen.generation));
            } else if !crate::actors::leaked::known(&self.shared, &seen.instance) {
                // Not ours and not known to be garbage: leaked. Reported at
                // once, removed only after `leaked_grace` (0: never), so a
                // master restored from an old backup can be stopped before
                // it wipes newer instances.
                leaked.push(seen);
            } else {
                tracing::warn!(node = %msg.0, instance = %seen.instance, running = seen.running,
                    "agent holds an instance the master places on another node; left alone");
            }
        }
        crate::actors::leaked::found(&self.shared, &msg.0, leaked);
        self.stats.end(None);
    }
}

/// A node judged `Down` (from `announce::watch_nodes`): nothing heard from
/// its agent for `silent_for`. Every instance the master places there is
/// marked `Lost` (an `Active` cluster goes `Error` saying which member and
/// node), since what runs there is unknown now; nothing is started
/// elsewhere in its place. The agent's inventory when it connects again
/// puts each right: `Running` with its pid, or `Failed` if it stopped.
#[derive(Message)]
#[rtype(result = "()")]
pub struct NodeDown {
    pub node: NodeId,
    pub silent_for: std::time::Duration,
    pub slot: Reservation,
}

impl Handler<NodeDown> for Supervisor {
    type Result = ();

    fn handle(&mut self, msg: NodeDown, _ctx: &mut Context<Self>) {
        let NodeDown { node, silent_for, slot } = msg;
        slot.begin("node down");
        let ours = self.shared.read_model.node(&node).map(|n| n.instances()).unwrap_or_default();
        tracing::warn!(%node, silent_s = silent_for.as_secs(), instances = ours.len(), "node down: its instances are marked Lost until its agent reports again");
        for (id, cluster) in ours.iter() {
            if let Some(h) = self.shared.registry.get(cluster) {
                let slot = Reservation::counted(&h.stats);
                let observation = Observation::NodeDown { silent_for };
                h.addr.do_send(InstanceObserved { instance: id.clone(), observation, ack: None, slot });
            }
        }
        self.stats.end(None);
    }
}
