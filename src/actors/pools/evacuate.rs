//! Moving the members off a node its pool removes (an operator's removal,
//! a repair): one at a time per node, each by its cluster's normal replace
//! (`OpRequest::Replace`: a replacement on another node, then the member
//! removed; a quorum role refused while another member is not running).
//! A cluster busy with another operation is asked again a moment later
//! (for at most half an hour of refusals); a replace refused or failed
//! puts the node back (`ready`, its cordon lifted) with the reason:
//! nothing is deleted with a member on it. A member whose cluster or
//! record is gone meanwhile is looked at again (the node's index says
//! whether anything is left on it).
//!
//! Which member is being moved is kept in memory: a master restarted
//! meanwhile resumes the replace from its journal (the cluster is busy
//! with it until it ends) and this asks for the node's next member then.

use std::time::{Duration, Instant};

use serde_json::json;

use super::launcher::{Done, Launcher, node_event};
use crate::actors::cluster::OpRequest;
use crate::actors::cluster::submit::run_to_end;
use crate::error::Error;
use crate::ids::{InstanceId, NodeId};
use crate::storage::StorageError;
use crate::storage::pool_records::{Lifecycle, PoolNodeRecord};
use crate::storage::records::OperationStatus;

/// How long before a busy cluster is asked again.
const BUSY_RETRY: Duration = Duration::from_secs(3);
/// How long a node's members may keep being refused for a moment (a busy
/// cluster, an actor restarting) before the removal gives up and puts
/// the node back.
const PATIENCE: Duration = Duration::from_secs(30 * 60);

/// Why a member was not moved.
pub(super) struct NotMoved {
    /// Worth asking again (the cluster busy, its mailbox full, its actor
    /// restarting).
    pub retry: bool,
    pub message: String,
}

impl Launcher {
    /// A draining node that still holds instances: its next member is
    /// moved, unless one is being moved (or the last try waits).
    pub(super) fn evacuate(&mut self, n: &PoolNodeRecord) {
        let now = Instant::now();
        if self.evacuating.contains(&n.node) || self.evacuate_due.get(&n.node).is_some_and(|t| *t > now) {
            return;
        }
        let Some(entry) = self.ctx.read_model.node(&n.node) else { return };
        let Some((instance, cluster)) = entry.instances().iter().next().map(|(i, c)| (i.clone(), c.to_string())) else {
            return;
        };
        self.evacuating.insert(n.node.clone());
        let shared = self.ctx.shared.clone();
        let node = n.node.clone();
        tracing::info!(%node, %instance, %cluster, "moving a member off a node being removed");
        self.work.spawn(async move {
            let result = match run_to_end(&shared, &cluster, OpRequest::Replace { id: instance.clone() }).await {
                Ok(op) if op.status == OperationStatus::Succeeded => Ok(op.id.to_string()),
                Ok(op) => Err(NotMoved {
                    retry: false,
                    message: format!(
                        "operation {} ended {:?}: {}",
                        op.id,
                        op.status,
                        op.error.as_deref().unwrap_or("no error recorded")
                    ),
                }),
                // Its cluster or the instance gone meanwhile: asked again
                // (the node's index then shows whether anything is left).
                Err(e @ Error::NotFound { .. }) => Err(NotMoved { retry: true, message: e.to_string() }),
                Err(e) => {
                    let retry = matches!(
                        &e,
                        Error::Conflict { code: "cluster_busy", .. }
                            | Error::Overloaded { .. }
                            | Error::Unavailable { .. }
                    );
                    Err(NotMoved { retry, message: e.to_string() })
                }
            };
            Done::Moved { node, instance, cluster, result }
        });
    }

    /// The end of a member's move off `node`.
    pub(super) async fn moved(
        &mut self,
        node: NodeId,
        instance: InstanceId,
        cluster: String,
        result: Result<String, NotMoved>,
    ) -> Result<(), StorageError> {
        self.evacuating.remove(&node);
        let Some(n) = self.nodes.get(&node).cloned() else { return Ok(()) };
        if n.state != Lifecycle::Draining {
            self.evacuate_since.remove(&node);
            return Ok(());
        }
        let since = *self.evacuate_since.entry(node.clone()).or_insert_with(Instant::now);
        match result {
            Ok(op) => {
                self.evacuate_due.remove(&node);
                self.evacuate_since.remove(&node);
                let ev = node_event(
                    "node.member_moved",
                    &n,
                    json!({"instance": instance.as_str(), "cluster": cluster, "operation": op}),
                )?;
                self.ctx.store.commit(vec![ev]).await?;
            }
            Err(e) if e.retry && since.elapsed() < PATIENCE => {
                tracing::info!(%node, %instance, reason = %e.message, "a member's move waits");
                self.evacuate_due.insert(node, Instant::now() + BUSY_RETRY);
            }
            Err(e) => {
                self.evacuate_due.remove(&node);
                self.evacuate_since.remove(&node);
                let why = format!("moving {instance} of cluster {cluster} off it failed: {}", e.message);
                self.health_of(&n.pool).last_error = Some(format!("node {node}: {why}"));
                self.put_back(n, &why).await?;
            }
        }
        Ok(())
    }
}
