//! [`Ack`]: what confirms an observation once its cluster actor applied it,
//! durably: an agent's report is acknowledged to the agent, a line of an
//! inventory to its node manager.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

use crate::actors::node_link::{NodeLink, lock};
use crate::protocol::messages::MasterFrame;

/// Sent (`Ack::send`) once the observation is applied and durable; dropped
/// unsent when it is not (the cluster actor died with it queued, or could
/// not write it): the agent sends a report again, the node manager an
/// inventory line.
pub struct Ack(Confirm);

enum Confirm {
    /// An agent's report, acknowledged by its sequence number.
    Report {
        link: NodeLink,
        seq: u64,
        /// The connection's reports routed and not yet acknowledged: one
        /// the agent sends again meanwhile is not routed twice. Left on drop.
        inflight: Arc<Mutex<HashSet<u64>>>,
    },
    /// A line of the connection's inventory: the agent never sends it
    /// again, so its node manager waits for this and delivers it again if
    /// it is dropped.
    Inventory(Option<oneshot::Sender<()>>),
}

impl Ack {
    pub(super) fn report(link: NodeLink, seq: u64, inflight: Arc<Mutex<HashSet<u64>>>) -> Ack {
        lock(&inflight).insert(seq);
        Ack(Confirm::Report { link, seq, inflight })
    }

    /// An inventory line's confirmation, and what its node manager awaits:
    /// `Ok` once applied, `Err` if it was dropped unapplied.
    pub(super) fn inventory() -> (Ack, oneshot::Receiver<()>) {
        let (tx, rx) = oneshot::channel();
        (Ack(Confirm::Inventory(Some(tx))), rx)
    }

    /// The report's sequence number (an inventory line has none).
    pub(super) fn seq(&self) -> Option<u64> {
        match &self.0 {
            Confirm::Report { seq, .. } => Some(*seq),
            Confirm::Inventory(_) => None,
        }
    }

    /// Confirms the observation applied and durable. A report's ack that
    /// finds the link's queue full waits for room in a task of its own (at
    /// most the link's send deadline): a lost ack would make the agent send
    /// the report again after later ones of the same instance were applied.
    pub fn send(mut self) {
        match &mut self.0 {
            Confirm::Report { link, seq, .. } => {
                let frame = MasterFrame::Ack { seq: *seq };
                if !link.try_send(frame.clone()) {
                    let link = link.clone();
                    actix::spawn(async move {
                        let _ = link.send(frame).await;
                    });
                }
            }
            Confirm::Inventory(tx) => {
                if let Some(tx) = tx.take() {
                    let _ = tx.send(());
                }
            }
        }
    }
}

impl Drop for Ack {
    fn drop(&mut self) {
        if let Confirm::Report { seq, inflight, .. } = &self.0 {
            lock(inflight).remove(seq);
        }
    }
}
