//! The master's actors (DESIGN.md §5).
//!
//! ```text
//! HTTP handler ──(registry)──> ClusterActor ──> InstanceActor ──> NodeLink ──TCP──> agent
//!      │                        ^                                   ^
//!      └─(create)─> Supervisor ─┘ (restarts it)                     NodeManagerActor (reads replies,
//!                                                                   routes reports to the cluster)
//! ```
//!
//! - [`supervision`]: the supervision tree, declared in one place (each
//!   kind's supervisor, strategy, restart intensity, what giving up does);
//!   [`supervised`] runs actors and tasks under it (a panic reported, a
//!   task restarted, the master's fatal exit).
//! - [`supervisor::Supervisor`] starts one `ClusterActor` per cluster,
//!   creates and removes them (it alone writes the [`registry`]), restarts
//!   a failed one from the store (or gives it up: its cluster `Error`), and
//!   takes the operator's kill and restart verbs.
//! - [`cluster::ClusterActor`] runs the cluster's operations one at a time
//!   and owns its instance actors; clusters are spread over several arbiters
//!   (threads), so independent clusters progress in parallel.
//! - [`instance::InstanceActor`] serializes the commands on one instance
//!   (a light actor on its cluster's thread).
//! - [`priority::Priority`]: on each cluster thread, an API request goes
//!   ahead of the instance commands until it is answered.
//! - [`node_manager::NodeManagerActor`] owns one agent connection; requests
//!   go through its [`node_link::NodeLink`].
//! - [`read_model::ReadModel`] is what every GET reads: immutable snapshots
//!   readers never lock against writers.
//! - [`packages::Packages`] stores uploaded packages; [`peer_blobs`] keeps
//!   their tarballs on a majority of the masters (on etcd).
//! - [`gone_operations::GoneOperations`]: the supervisor's bound on the
//!   operations deleted clusters leave behind.
//! - [`announce`]: events no record change carries (actors starting,
//!   stopping, failing; node status), and the node status watcher.
//! - [`tokens::ApiTokens`]: the API tokens (hashed in the store, checked on
//!   every `/api/v1` request).
//! - [`agent_listener`]: TLS, enrollment, `Hello` checks and registration
//!   of every agent connection.
//! - [`trust::Trust`]: the agent link's CA, join tokens, and the certificate
//!   issued to each node (who may be an agent of this master).
//! - [`role::Role`]: the only master, or the leader of its term on etcd
//!   (and the `leadership` child that ends the master when it is lost).
//!
//! Every mailbox is bounded (a sender reserves a place first; a full one
//! answers `503 overloaded`), as is the store's write queue. RocksDB is
//! only touched through the store (group commit, off the actor threads).

pub mod agent_listener;
pub mod announce;
pub mod cluster;
pub mod cordons;
pub mod dump;
pub mod gone_operations;
pub mod instance;
pub mod leaked;
pub mod live_tasks;
pub mod node_link;
#[cfg(test)]
mod node_link_tests;
pub mod node_manager;
pub mod packages;
pub mod peer_blobs;
pub mod placement;
pub mod pools;
pub mod priority;
#[cfg(test)]
mod race_tests;
pub mod read_model;
pub mod registry;
pub mod render;
pub mod role;
pub mod supervised;
pub mod supervision;
#[cfg(test)]
mod supervision_tests;
pub mod supervisor;
#[cfg(test)]
mod test_support;
pub mod tokens;
pub mod trust;

use std::sync::Arc;
use std::time::Duration;

use actix::ArbiterHandle;

use crate::storage::{BlobStore, MetaStore};

/// What every actor of the master shares.
#[derive(Clone)]
pub struct Shared {
    pub store: Arc<dyn MetaStore>,
    pub blobs: Arc<BlobStore>,
    pub read_model: Arc<read_model::ReadModel>,
    pub links: node_link::NodeLinks,
    pub registry: registry::Registry,
    pub ports: Arc<placement::PortAllocator>,
    pub timing: Timing,
    pub limits: Limits,
    /// The supervisor's counters: whoever sends it a message counts it.
    pub supervisor: Arc<read_model::ActorStats>,
    /// The threads cluster actors are spread over (`actor_threads`).
    pub arbiters: Arc<Vec<ArbiterHandle>>,
    /// Threads node managers and link writers run on (`link_threads`;
    /// empty, as in unit tests: the actor threads).
    pub link_arbiters: Arc<Vec<ArbiterHandle>>,
    /// One gate per arbiter (at least one): API requests go ahead of the
    /// instance commands on their cluster's thread (`priority`).
    pub priorities: Arc<Vec<Arc<priority::Priority>>>,
    /// Package chunks queued for all agents' sockets at once (`node_link`).
    pub chunk_budget: Arc<tokio::sync::Semaphore>,
    /// The supervised tasks, and the master's fatal failure (`supervised`).
    pub tasks: Arc<supervised::Tasks>,
    /// Each cluster's instance commands queued or running (outlives its
    /// actor: `instance::in_flight`).
    pub in_flight: instance::in_flight::InFlights,
    /// The node pools, once they run (set after the agent listener is
    /// bound; placement files node requests through them).
    pub pools: Arc<std::sync::OnceLock<Arc<pools::Pools>>>,
    /// The only master, or the leader of its term (`role`).
    pub role: Arc<role::Role>,
    /// The installation's masters, on etcd (package blobs between them:
    /// `peer_blobs`); `None` with the embedded store.
    pub peers: Option<Arc<crate::storage::etcd::peers::Directory>>,
}

impl Shared {
    /// The arbiter for the `n`-th actor (round robin).
    pub fn arbiter_for(&self, n: u64) -> ArbiterHandle {
        match self.arbiters.len() {
            0 => actix::Arbiter::current(),
            len => self.arbiters[(n % len as u64) as usize].clone(),
        }
    }

    /// The thread a connection's node manager and link writer run on.
    pub fn link_arbiter_for(&self, n: u64) -> ArbiterHandle {
        match self.link_arbiters.len() {
            0 => self.arbiter_for(n),
            len => self.link_arbiters[(n % len as u64) as usize].clone(),
        }
    }

    /// The gate of [`arbiter_for(n)`](Self::arbiter_for)'s thread.
    pub fn priority_for(&self, n: u64) -> Arc<priority::Priority> {
        match self.priorities.len() {
            0 => Arc::default(),
            len => self.priorities[(n % len as u64) as usize].clone(),
        }
    }
}

/// Deadlines and liveness thresholds, from the master's config.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// How often agents send heartbeats, and the master sends one to an
    /// agent it has sent nothing else for that long.
    pub heartbeat_interval: Duration,
    pub agent_reply_timeout: Duration,
    /// A frame that cannot be handed to an agent's connection within this
    /// closes the link (the agent stopped reading).
    pub agent_send_timeout: Duration,
    pub node_unknown_after: Duration,
    pub node_down_after: Duration,
    /// What a step's watchdog allows beyond the reply deadline
    /// ([`STEP_IDLE_MARGIN`]; tests shorten it).
    pub step_idle_margin: Duration,
    /// The longest a node request may go unchanged while a pool launches
    /// for it (every try of the slowest pool: `pools::longest_quiet`): what
    /// a step waiting for nodes allows beyond [`Timing::step_idle`].
    pub pool_quiet: Duration,
}

/// See [`Timing::step_idle`].
pub const STEP_IDLE_MARGIN: Duration = Duration::from_secs(30);

impl Timing {
    /// From the master's settings.
    pub fn of(cfg: &crate::config::MasterConfig) -> Timing {
        Timing {
            heartbeat_interval: cfg.heartbeat_interval,
            agent_reply_timeout: cfg.agent_reply_timeout,
            agent_send_timeout: cfg.agent_send_timeout,
            node_unknown_after: cfg.node_unknown_after,
            node_down_after: cfg.node_down_after,
            step_idle_margin: STEP_IDLE_MARGIN,
            pool_quiet: pools::longest_quiet(&cfg.node_pools),
        }
    }

    /// How long a step may go without any sign of progress (a command
    /// answered, a package chunk sent) before its watchdog fails it. Every
    /// command has its own reply deadline too; this catches what they
    /// cannot (a step waiting on nothing).
    pub fn step_idle(&self) -> Duration {
        self.agent_reply_timeout + self.step_idle_margin
    }
}

/// Bounds on queues and history, from the master's config.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Messages waiting for one cluster actor (or the supervisor) before
    /// new requests are answered `503 overloaded`.
    pub cluster_mailbox: usize,
    /// Ended operations kept per cluster; older ones are deleted.
    pub operations_retained: usize,
    /// A leaked instance is removed this long after it was first seen
    /// (zero: never; see [`leaked`]).
    pub leaked_grace: Duration,
    /// An API request its actor has not taken within this is answered
    /// `503` and never runs (`http::ask`).
    pub request_take_limit: Duration,
    /// A write that must land and has not, after this long of tries (the
    /// store fails each one), ends the master (`cluster::commit_until_landed`).
    pub store_stall_limit: Duration,
}

impl Limits {
    /// From the master's settings.
    pub fn of(cfg: &crate::config::MasterConfig) -> Limits {
        Limits {
            cluster_mailbox: cfg.mailbox_capacity,
            operations_retained: cfg.operations_retained,
            leaked_grace: cfg.leaked_grace,
            request_take_limit: cfg.request_take_limit,
            store_stall_limit: cfg.store_stall_limit,
        }
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            cluster_mailbox: 256,
            operations_retained: 1000,
            leaked_grace: Duration::from_secs(600),
            request_take_limit: Duration::from_secs(30),
            store_stall_limit: Duration::from_secs(60),
        }
    }
}
