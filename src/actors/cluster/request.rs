//! The mutating requests a cluster actor runs as operations.

use std::collections::BTreeMap;

use crate::ids::{InstanceId, NodeId};
use crate::operations::lifecycle::InstanceVerb;
use crate::storage::records::{InstanceRecord, Limits};

/// A mutating request on a cluster.
#[derive(Debug, Clone)]
pub enum OpRequest {
    /// Sent by the supervisor for a new cluster; `pending` are the placed instances.
    Create {
        pending: Vec<InstanceRecord>,
        params: String,
    },
    Start,
    Stop,
    Restart,
    ScaleOut {
        role: String,
        add: u32,
        nodes: Option<Vec<NodeId>>,
    },
    ScaleIn {
        role: String,
        remove: Vec<InstanceId>,
    },
    Delete {
        force: bool,
    },
    /// New config values (`PATCH /clusters/{name}/config`). `batch`:
    /// instances changed at once (default: a quarter of each role).
    Reconfigure {
        values: BTreeMap<String, serde_json::Value>,
        batch: Option<usize>,
    },
    Upgrade {
        version: String,
        batch: Option<usize>,
    },
    /// Vertical scale (`PATCH /clusters/{name}/roles/{role}`).
    Resize {
        role: String,
        limits: Limits,
        batch: Option<usize>,
    },
    Instance {
        id: InstanceId,
        verb: InstanceVerb,
    },
}

impl OpRequest {
    /// The request's kind, as `GET /actors` shows it as the actor's current work.
    pub fn name(&self) -> &'static str {
        match self {
            OpRequest::Create { .. } => "Create",
            OpRequest::Start => "Start",
            OpRequest::Stop => "Stop",
            OpRequest::Restart => "Restart",
            OpRequest::ScaleOut { .. } => "ScaleOut",
            OpRequest::ScaleIn { .. } => "ScaleIn",
            OpRequest::Delete { .. } => "Delete",
            OpRequest::Reconfigure { .. } => "Reconfigure",
            OpRequest::Upgrade { .. } => "Upgrade",
            OpRequest::Resize { .. } => "Resize",
            OpRequest::Instance { .. } => "Instance",
        }
    }
}
