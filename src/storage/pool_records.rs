//! What the launcher (`actors::pools`) keeps durable: each node a pool
//! launched, in its lifecycle, and each node request. Both have column
//! families of their own (`pool_nodes`, `node_requests`), added without a
//! schema step: a store that never had them opens with them empty.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use crate::ids::NodeId;

/// Where a provider node is in its life (beside its link health, which the
/// node registry keeps once its agent has said hello).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Lifecycle {
    /// Recorded; the driver's `create` is called (or about to be). Recorded
    /// before the call, so a master killed during it finds the resource by
    /// its tag and adopts or removes it.
    Launching,
    /// The driver made it; its agent has not said hello yet.
    Enrolling,
    /// Its agent said hello: placement may use it.
    Ready,
    /// Being taken down (a retry's unwind, a removal, an idle spare).
    Deleting,
    /// Its launch failed for good; kept only while held (for debugging).
    Failed,
    /// Being removed (an operator's `remove`, an idle or old spare):
    /// cordoned, and deleted once it is seen to hold nothing. (Last: the
    /// codec numbers variants by their place.)
    Draining,
}

impl Lifecycle {
    pub fn as_str(self) -> &'static str {
        match self {
            Lifecycle::Launching => "launching",
            Lifecycle::Enrolling => "enrolling",
            Lifecycle::Ready => "ready",
            Lifecycle::Draining => "draining",
            Lifecycle::Deleting => "deleting",
            Lifecycle::Failed => "failed",
        }
    }
}

/// One node a pool launched (key: node id).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PoolNodeRecord {
    pub version: u32,
    pub node: NodeId,
    pub pool: String,
    /// The request it was launched for (`None`: adopted, or the request is
    /// gone).
    pub request: Option<String>,
    /// The provider's id for it, once `create` answered.
    pub external_id: Option<String>,
    pub state: Lifecycle,
    /// Launches tried for this request slot, this one included.
    pub attempt: u32,
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339")]
    pub state_since: OffsetDateTime,
    pub last_error: Option<String>,
    /// Out of every cleanup until then (`flotilla node hold`).
    #[serde(with = "time::serde::rfc3339::option")]
    pub held_until: Option<OffsetDateTime>,
    /// Why it is being removed (`draining`, then `deleting`).
    pub removal: Option<String>,
}

/// Where a node request is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RequestState {
    /// Waiting for a pool to take it.
    Requested,
    /// A pool took it and is launching its nodes.
    Pending,
    /// Every node it asked for is ready.
    Fulfilled,
    /// Every pool that offers its labels declined it.
    Failed,
}

impl RequestState {
    pub fn as_str(self) -> &'static str {
        match self {
            RequestState::Requested => "requested",
            RequestState::Pending => "pending",
            RequestState::Fulfilled => "fulfilled",
            RequestState::Failed => "failed",
        }
    }

    /// Fulfilled or failed: nothing more happens to it.
    pub fn is_done(self) -> bool {
        matches!(self, RequestState::Fulfilled | RequestState::Failed)
    }
}

/// A request for `count` nodes carrying `labels` (key: its id, which sorts
/// by creation time).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeRequestRecord {
    pub version: u32,
    pub id: String,
    pub labels: BTreeMap<String, String>,
    pub count: u32,
    /// Who asked: an operation id, `min-ready`, `api`, or `replace:<node>`.
    pub requestor: String,
    /// Lower is served first.
    pub priority: u8,
    pub state: RequestState,
    /// The pool serving it (while `pending`, and once `fulfilled`).
    pub pool: Option<String>,
    /// The pools that declined it, in order, each with its reason in
    /// `reasons` at the same index.
    pub declined_by: Vec<String>,
    pub reasons: Vec<String>,
    /// Its nodes that are ready.
    pub nodes: Vec<NodeId>,
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339")]
    pub updated_at: OffsetDateTime,
}
