//! The mutating requests a cluster actor runs as operations.

use std::collections::BTreeMap;

use futures::future::{BoxFuture, Shared};
use tokio::sync::oneshot;

use crate::actors::read_model::Reservation;
use crate::error::Error;
use crate::ids::{InstanceId, NodeId};
use crate::operations::lifecycle::InstanceVerb;
use crate::storage::records::{Limits, OperationRecord};

/// A role of a new cluster to place: how many instances, and on which
/// nodes when the request pins them.
#[derive(Debug, Clone)]
pub struct RoleToPlace {
    pub role: String,
    pub count: u32,
    pub nodes: Option<Vec<NodeId>>,
}

/// A mutating request on a cluster.
#[derive(Debug, Clone)]
pub enum OpRequest {
    /// Sent by the supervisor for a new cluster, validated: the actor
    /// places its roles' instances.
    Create {
        roles: Vec<RoleToPlace>,
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
    /// Moves member `id` to another node (`POST
    /// /clusters/{name}/instances/{id}/replace`, a node's removal, a repair).
    Replace {
        id: InstanceId,
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
            OpRequest::Replace { .. } => "Replace",
        }
    }
}

/// A request to run an operation, with its place in the mailbox and, from
/// the API, where to hand the operation over as soon as it is built
/// ([`Accepted`]).
#[derive(actix::Message)]
#[rtype(result = "Result<OperationRecord, Error>")]
pub struct RunOperation(pub OpRequest, pub Reservation, pub Option<oneshot::Sender<Accepted>>);

/// An operation the actor has built and sent to the store: its caller
/// answers once `durable` resolves, without waiting for the actor's thread
/// to come back to the request. Under load that wait was most of a
/// write's latency: the thread runs other clusters' work before it
/// (BENCHMARKS.md, B5). Readers may see the operation's cluster without
/// it for that long; `GET /operations/{id}` finds it at once (the store).
pub struct Accepted {
    pub op: OperationRecord,
    /// Resolves once the operation is durable, or with why it is not.
    pub durable: Shared<BoxFuture<'static, Result<(), Error>>>,
}
