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
    /// `leader` (it takes writes) or `follower` (it sends writes to the leader).
    pub role: String,
    /// The leader's API URL (this master's own when it leads).
    pub leader: Option<String>,
    /// The leader's term: the revision of etcd that made it leader (0 with
    /// the embedded store, whose one master always leads). Commands to
    /// agents carry it; an agent refuses a term below one it has seen.
    pub term: i64,
    /// This master's name among several.
    pub name: String,
    /// The master's process id.
    pub pid: u32,
    /// Which engine holds the state: `rocksdb` or `etcd`.
    pub store_engine: String,
    /// On a follower: the etcd revision its read model reflects.
    pub applied_revision: Option<i64>,
    /// On a follower: how stale its reads may be, in milliseconds (its
    /// read model held every write etcd had this long ago; an upper bound).
    pub lag_ms: Option<u64>,
    /// On a leader: its lease could not be renewed in time (etcd is
    /// unreachable from it, or without quorum), so it sends agents no
    /// command until a renewal succeeds; if another master took over
    /// meanwhile, it exits once etcd answers.
    pub suspended: bool,
    /// Every master of the installation (on etcd; as last read from it):
    /// where a client goes when this one stops answering.
    pub masters: Vec<MasterDto>,
    /// On a master that won a campaign: how it took over.
    pub took_over: Option<TookOverDto>,
}

/// How a master that won the campaign became the leader.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TookOverDto {
    /// `view`: its clusters and instances came from the read model it kept
    /// as a follower; `store`: it read them from etcd again.
    pub from: String,
    /// With `from: view`, how the view was found the store's: `revisions`
    /// (every etcd revision since its load brought the follower's watch an
    /// event, and the store's counts of cluster and instance keys are the
    /// view's) or `keys` (a keys-only read of the store
    /// matched every cluster and instance key's revision).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verified: Option<String>,
    /// Milliseconds from winning the campaign to serving as the leader.
    pub ms: u64,
}

/// One master of the installation.
#[derive(Debug, Serialize, ToSchema)]
pub struct MasterDto {
    pub name: String,
    /// Its API's base URL.
    pub api_url: String,
}

/// One actor (or supervised task) of the supervision tree.
#[derive(Debug, Serialize, ToSchema)]
pub struct ActorDto {
    /// `master`, `store_writer`, `supervisor`, `cluster`, `instance`,
    /// `node_manager`, `agent_listener`, `node_watcher` or `leaked_sweep`
    /// (`actors::supervision::TREE`).
    pub kind: String,
    pub id: String,
    /// `kind/id` of its supervisor; none for the root (`master`).
    pub parent: Option<String>,
    /// How its supervisor restarts it, e.g. `one_for_one, 3 in 60s, then
    /// the master exits`.
    pub strategy: String,
    /// `running`, `idle`, a cluster's status, `restarting`, or `failed`
    /// (given up: restart it with `POST /actors/{kind}/{id}/restart`).
    pub state: String,
    /// `red` (failed), `amber` (restarting, a message waiting over 5 s, or
    /// a handler busy over 30 s) or `green`.
    pub health: String,
    /// Times its supervisor restarted it.
    pub restarts: u64,
    /// How its last incarnation ended, and how long ago.
    pub last_exit: Option<LastExit>,
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
    /// Its last failure, until its next success.
    pub last_error: Option<String>,
    /// How long ago `last_error` happened.
    pub last_error_age_ms: Option<u64>,
    /// Requests it refused (not found, busy, invalid): counted, not failures.
    pub refused: u64,
}

/// How an actor's incarnation ended.
#[derive(Debug, Serialize, ToSchema)]
pub struct LastExit {
    pub reason: String,
    pub age_ms: u64,
}

impl From<ActorInfo> for ActorDto {
    fn from(a: ActorInfo) -> Self {
        let health = a.health().to_string();
        ActorDto {
            kind: a.kind.to_string(),
            strategy: crate::actors::supervision::describe(a.kind),
            id: a.id,
            parent: a.parent,
            state: a.state,
            health,
            restarts: a.restarts,
            last_exit: a.last_exit.map(|(reason, age_ms)| LastExit { reason, age_ms }),
            current: a.current,
            current_ms: a.current_ms,
            mailbox: a.mailbox,
            oldest_message_ms: a.oldest_message_ms,
            handled: a.handled,
            last_error: a.last_error,
            last_error_age_ms: a.last_error_age_ms,
            refused: a.refused,
        }
    }
}

/// One master of the installation as `GET /actors` sees it now.
#[derive(Debug, Serialize, ToSchema)]
pub struct MasterStateDto {
    pub name: String,
    /// Its API's base URL.
    pub api_url: String,
    /// The master that answered this request (the root of `actors`).
    pub this: bool,
    /// `leader`, `leader (suspended)`, `follower`, `answering (its health
    /// needs a token)` (`open_health = false` there), or `unreachable` (its
    /// health did not answer within 500 ms: `error` says why).
    pub role: String,
    pub term: Option<i64>,
    pub pid: Option<u32>,
    pub error: Option<String>,
}

/// `GET /actors`.
#[derive(Debug, Serialize, ToSchema)]
pub struct ActorsDto {
    /// The supervisor, cluster actors and node managers, then instance
    /// actors up to the `limit`.
    pub actors: Vec<ActorDto>,
    /// How many instance actors there are (of `?cluster=`, or in all).
    pub instance_actors: usize,
    /// On etcd: every master of the installation, this one first (each
    /// is the root of its own tree; another's tree is its own `GET
    /// /actors`). Empty with the embedded store.
    pub masters: Vec<MasterStateDto>,
}
