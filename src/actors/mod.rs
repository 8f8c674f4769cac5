//! The master's actors (DESIGN.md §5).
//!
//! ```text
//! HTTP handler ──> Supervisor ──(lookup)──> ClusterActor ──> InstanceActor ──> NodeLink ──TCP──> agent
//!                      ^                          |                                 ^
//!                      └──── Escalate ────────────┘          NodeManagerActor ──────┘ (reads replies)
//! ```
//!
//! - [`supervisor::Supervisor`] starts one `ClusterActor` per cluster, creates
//!   and removes them, and turns escalated failures into a cluster `Error`.
//! - [`cluster::ClusterActor`] runs the cluster's operations one at a time
//!   (`cluster_prepare`: validation into a plan; `cluster_ops`: the
//!   operation context, definition changes, the end of an operation;
//!   `cluster_steps`: how actions reach instances, rolling and by order),
//!   and resumes one a master restart interrupted.
//! - [`instance::InstanceActor`] serializes the commands on one instance.
//! - [`node_manager::NodeManagerActor`] owns one agent connection.
//! - [`read_model::ReadModel`] is what every GET reads.
//! - [`packages::Packages`] stores uploaded packages.
//!
//! RocksDB is only touched through the storage writer (group commit, off the
//! actor threads). Nothing here waits on a timer to decide a state.

pub mod cluster;
mod cluster_ops;
mod cluster_prepare;
mod cluster_steps;
pub mod instance;
pub mod node_manager;
pub mod packages;
pub mod placement;
pub mod read_model;
pub mod render;
pub mod supervisor;

use std::sync::Arc;
use std::time::Duration;

use crate::storage::{BlobStore, StoreWriter};

/// What every actor of the master shares.
#[derive(Clone)]
pub struct Shared {
    pub store: StoreWriter,
    pub blobs: Arc<BlobStore>,
    pub read_model: Arc<read_model::ReadModel>,
    pub links: node_manager::NodeLinks,
    pub ports: Arc<placement::PortAllocator>,
    pub timing: Timing,
}

/// Deadlines and liveness thresholds, from the master's config.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    pub agent_reply_timeout: Duration,
    pub node_unknown_after: Duration,
    pub node_down_after: Duration,
}

impl Timing {
    /// The watchdog deadline of one step: every command of a step runs in
    /// parallel and each has the reply deadline, so a step gets that plus
    /// slack for the master's own writes.
    pub fn step_deadline(&self) -> Duration {
        self.agent_reply_timeout + Duration::from_secs(30)
    }
}
