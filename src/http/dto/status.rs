//! What the master says about itself: `GET /health` and `GET /actors`.

use serde::Serialize;
use utoipa::ToSchema;

use crate::actors::read_model::ActorInfo;
use crate::storage::meta::StoreStats;

/// `GET /health`: liveness and the counters a load test reads.
#[derive(Debug, Serialize, ToSchema)]
pub struct HealthDto {
    /// Always `ok`: a master that answers is alive.
    pub status: String,
    pub clusters: usize,
    pub nodes: usize,
    pub packages: usize,
    pub running_operations: usize,
    /// Instance status changes since the master started.
    pub instance_transitions: u64,
    pub store: StoreStats,
}

/// One actor of the supervision tree.
#[derive(Debug, Serialize, ToSchema)]
pub struct ActorDto {
    /// `supervisor`, `cluster`, `node_manager` or `instance`.
    pub kind: String,
    pub id: String,
    /// `kind/id` of its supervisor; none for the root.
    pub parent: Option<String>,
    pub state: String,
    /// What it handles now.
    pub current: Option<String>,
    /// For how long it has handled `current`.
    pub current_ms: Option<u64>,
    /// Messages waiting.
    pub mailbox: u64,
    /// How long the oldest waiting message has waited.
    pub oldest_message_ms: Option<u64>,
    /// Messages handled since it started.
    pub handled: u64,
    pub last_error: Option<String>,
}

impl From<ActorInfo> for ActorDto {
    fn from(a: ActorInfo) -> Self {
        ActorDto {
            kind: a.kind.to_string(),
            id: a.id,
            parent: a.parent,
            state: a.state,
            current: a.current,
            current_ms: a.current_ms,
            mailbox: a.mailbox,
            oldest_message_ms: a.oldest_message_ms,
            handled: a.handled,
            last_error: a.last_error,
        }
    }
}

/// `GET /actors`.
#[derive(Debug, Serialize, ToSchema)]
pub struct ActorsDto {
    /// The supervisor, cluster actors and node managers, then instance
    /// actors up to the `limit`.
    pub actors: Vec<ActorDto>,
    /// How many instance actors there are (of `?cluster=`, or in all).
    pub instance_actors: usize,
}
