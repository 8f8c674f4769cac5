//! The records the master persists, one per key, each carrying its schema
//! `version` so a later release can migrate old values.
//!
//! These are storage types: the HTTP layer maps them to its own DTOs and
//! never serializes them directly. They are encoded by `storage::codec`
//! (bincode), which has no self-describing types, so nothing here may hold a
//! `serde_json::Value` or use `#[serde(untagged/flatten)]`.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use crate::ids::{ClusterId, InstanceId, NodeId, OperationId};
use crate::scope::Scope;

/// Schema version written into every record created by this release.
pub const RECORD_VERSION: u32 = 2;

/// An instance's named ports, by name. A sorted slice, not a map: an
/// instance has one or a few ports, and a master holds 100,000 instances
/// (a `BTreeMap` costs a 300-byte node for one entry). Shared: a record's
/// clone (one per state change) copies no port. Stored and shown as a map,
/// so its encoding is a map's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ports(Arc<[(Arc<str>, u16)]>);

impl Default for Ports {
    fn default() -> Self {
        Ports(Arc::new([]))
    }
}

impl Ports {
    pub fn get(&self, name: &str) -> Option<&u16> {
        self.0.binary_search_by(|(k, _)| (**k).cmp(name)).ok().map(|i| &self.0[i].1)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &u16)> {
        self.0.iter().map(|(k, v)| (&**k, v))
    }

    pub fn values(&self) -> impl Iterator<Item = &u16> {
        self.0.iter().map(|(_, v)| v)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The same ports, each name passed through `share` (which may point
    /// it at an equal copy).
    pub fn with_names(&self, mut share: impl FnMut(&mut Arc<str>)) -> Ports {
        let ports = self.0.iter().map(|(name, port)| {
            let mut name = name.clone();
            share(&mut name);
            (name, *port)
        });
        Ports(ports.collect())
    }

    pub fn to_map(&self) -> BTreeMap<String, u16> {
        self.0.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }
}

impl<K: Into<Arc<str>>> FromIterator<(K, u16)> for Ports {
    fn from_iter<I: IntoIterator<Item = (K, u16)>>(iter: I) -> Self {
        let mut v: Vec<(Arc<str>, u16)> = iter.into_iter().map(|(k, p)| (k.into(), p)).collect();
        v.sort();
        v.dedup_by(|a, b| a.0 == b.0);
        Ports(v.into())
    }
}

impl Serialize for Ports {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in self.0.iter() {
            m.serialize_entry(&**k, v)?;
        }
        m.end()
    }
}

impl<'de> Deserialize<'de> for Ports {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(BTreeMap::<String, u16>::deserialize(d)?.into_iter().collect())
    }
}

pub use super::config_value::{ConfigValue, mask_secrets, secret_shown};

pub use super::cluster_types::{CLUSTER_STATUSES, ClusterStatus, Limits, PackageRef};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RoleState {
    // The role's instance count is not stored: it is derived from the
    // instance records, so it can never disagree with them.
    /// The next ordinal to hand out; ordinals are never reused in a cluster.
    pub next_ordinal: u32,
    /// Resource limits set by a vertical scale; `None` keeps the spec's.
    pub limits: Option<Limits>,
    /// The node labels this cluster's create gave the role, over the
    /// spec's `node_labels`; `None` keeps the spec's (schema 5).
    pub node_labels: Option<BTreeMap<String, String>>,
}

impl RoleState {
    pub fn new() -> RoleState {
        RoleState { next_ordinal: 1, limits: None, node_labels: None }
    }
}

impl Default for RoleState {
    fn default() -> Self {
        RoleState::new()
    }
}

/// What an instance was last installed with: the package version and the
/// limits. An instance whose `applied` differs from what its cluster now
/// says is replaced by an upgrade or vertical scale; one that matches is
/// left alone (so those operations are idempotent and resumable).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Applied {
    pub package_version: Arc<str>,
    pub limits: Option<Limits>,
}

/// A node an operator took out of placement (`POST /nodes/{id}/cordon`):
/// no new instance goes there; what runs there stays and is served.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CordonRecord {
    pub version: u32,
    pub node: NodeId,
    /// Why, in the operator's words (may be empty).
    pub reason: String,
    #[serde(with = "time::serde::rfc3339")]
    pub since: OffsetDateTime,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClusterRecord {
    pub version: u32,
    pub id: ClusterId,
    pub name: String,
    pub package: PackageRef,
    pub status: ClusterStatus,
    pub status_description: String,
    pub config: BTreeMap<String, ConfigValue>,
    pub roles: BTreeMap<String, RoleState>,
    /// The operation running on this cluster, if any.
    pub operation: Option<OperationId>,
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339")]
    pub updated_at: OffsetDateTime,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub enum InstanceStatus {
    Pending,
    Installing,
    Installed,
    Starting,
    Running,
    Stopping,
    Stopped,
    Failed,
    Lost,
    Deleting,
    /// Its process crashed and its agent's restart policy starts it again
    /// (`last_error` says which attempt, when, and how it last ended). Last
    /// in the list: records store the variant's index.
    Restarting,
}

/// What the operator wants an instance to be; the agent converges to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum DesiredState {
    Installed,
    Running,
    Stopped,
    Deleted,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InstanceRecord {
    pub version: u32,
    pub id: InstanceId,
    pub cluster_id: ClusterId,
    /// The strings below are shared (`Arc<str>`): a record is cloned on
    /// every state change, and its cluster, role, host and version are the
    /// same text for thousands of instances.
    pub cluster: Arc<str>,
    pub role: Arc<str>,
    pub ordinal: u32,
    pub node: NodeId,
    pub host: Arc<str>,
    pub ports: Ports,
    pub status: InstanceStatus,
    pub desired: DesiredState,
    pub pid: Option<u32>,
    /// Desired-state generation; bumped before every command sent to the agent.
    pub generation: u64,
    /// The instance directory on the agent.
    pub dir: Arc<str>,
    pub last_error: Option<String>,
    /// `None` until the first successful install. Shared: the instances
    /// of a role installed together hold one.
    pub applied: Option<Arc<Applied>>,
    /// Its files (or environment) changed since its process started: a
    /// reload (files) or a restart (environment) is owed. Durable, so a
    /// reconfiguration interrupted between writing the files and restarting
    /// still does the right one when it runs again.
    pub pending_restart: PendingRestart,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum PendingRestart {
    #[default]
    No,
    /// Files changed: the role's `reload` hook will do, else a restart.
    Reload,
    /// The environment (or a file whose change mode is restart) changed:
    /// only a restart applies it.
    Restart,
    /// A file whose change mode is `signal` changed: this signal to the
    /// main process applies it. (Last: older records decode unchanged.)
    Signal(i32),
}

impl PendingRestart {
    /// How much the owed action does: a heavier one also applies what a
    /// lighter one would (so owed actions combine by taking the heaviest).
    pub fn weight(self) -> u8 {
        match self {
            PendingRestart::No => 0,
            PendingRestart::Signal(_) => 1,
            PendingRestart::Reload => 2,
            PendingRestart::Restart => 3,
        }
    }

    /// The heavier of the two.
    pub fn max(self, other: PendingRestart) -> PendingRestart {
        if other.weight() > self.weight() { other } else { self }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub enum NodeStatus {
    Ready,
    Unknown,
    Down,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeRecord {
    pub version: u32,
    pub id: NodeId,
    /// Shared with every instance placed on the node (their `host`).
    pub address: Arc<str>,
    pub port_range: (u16, u16),
    pub labels: BTreeMap<String, String>,
    pub cgroups: bool,
    /// Whether the agent can enforce memory and CPU limits.
    pub resource_limits: bool,
    pub agent_version: String,
    /// The agent's instance root (`<root>/instances`), for the API's `dir`.
    pub instance_root: String,
    #[serde(with = "time::serde::rfc3339")]
    pub registered_at: OffsetDateTime,
    /// A simulated agent (`flotilla bench`), as its `Hello` said.
    pub simulated: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PackageRecord {
    pub version: u32,
    pub name: String,
    pub package_version: String,
    pub sha256: String,
    pub size: u64,
    /// The package's `component.toml`, verbatim; parsed again on load.
    pub spec_toml: String,
    #[serde(with = "time::serde::rfc3339")]
    pub uploaded_at: OffsetDateTime,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub enum OperationKind {
    Create,
    Start,
    Stop,
    Restart,
    ScaleOut,
    ScaleIn,
    Delete,
    StartInstance,
    StopInstance,
    RestartInstance,
    Reconfigure,
    Upgrade,
    /// Vertical scale: new resource limits for a role.
    Resize,
    /// One member moved to another node (a scale-out of its replacement,
    /// then a scale-in of it). Appended last: stored records name kinds by
    /// position.
    Replace,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub enum OperationStatus {
    Pending,
    Running,
    Succeeded,
    Failed,
    RolledBack,
    Cancelled,
}

impl OperationStatus {
    pub fn is_terminal(self) -> bool {
        !matches!(self, OperationStatus::Pending | OperationStatus::Running)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub enum StepStatus {
    Pending,
    Running,
    Done,
    Failed,
    Undoing,
    Undone,
    UndoFailed,
}

/// The outcome of one step on one instance.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InstanceResult {
    pub instance: InstanceId,
    pub ok: bool,
    pub message: String,
    pub exit_code: Option<i32>,
    pub stderr_tail: String,
    pub stdout_tail: String,
}

impl InstanceResult {
    pub fn ok(instance: &InstanceId, message: impl Into<String>) -> InstanceResult {
        InstanceResult {
            instance: instance.clone(),
            ok: true,
            message: message.into(),
            exit_code: None,
            stderr_tail: String::new(),
            stdout_tail: String::new(),
        }
    }

    pub fn failed(instance: &InstanceId, message: impl Into<String>) -> InstanceResult {
        InstanceResult { ok: false, ..InstanceResult::ok(instance, message) }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepRecord {
    pub name: String,
    pub status: StepStatus,
    pub error: Option<String>,
    /// Stored apart from the operation (`op_results`, one key per step), so
    /// journaling a step writes that step's results, never all of them.
    #[serde(skip)]
    pub results: Vec<InstanceResult>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OperationRecord {
    pub version: u32,
    pub id: OperationId,
    pub cluster_id: ClusterId,
    pub cluster: String,
    pub kind: OperationKind,
    /// The request parameters as JSON text (bincode cannot carry JSON values).
    pub params: String,
    pub status: OperationStatus,
    pub steps: Vec<StepRecord>,
    pub error: Option<String>,
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    #[serde(with = "crate::storage::serde_time::rfc3339_option")]
    pub ended_at: Option<OffsetDateTime>,
    /// What a master needs to go on with the operation after a restart:
    /// stored beside it (`op_plans`) while it runs, so an interrupted
    /// operation is resumed from its first unfinished step (or its
    /// unwinding finished), never left hanging; removed when it ends.
    #[serde(skip)]
    pub resume: Option<Resumable>,
}

/// The plan of an operation and what its steps need that is not yet stored
/// elsewhere (the instances it will create).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Resumable {
    pub plan: crate::storage::plan::Plan,
    pub pending: Vec<InstanceRecord>,
    pub on_success: Option<ClusterStatus>,
    pub force: bool,
}

impl OperationRecord {
    /// A copy without the steps, the params or the plan (the parts that
    /// grow with the operation), for the caller to fill.
    pub fn clone_header(&self) -> OperationRecord {
        OperationRecord {
            version: self.version,
            id: self.id,
            cluster_id: self.cluster_id,
            cluster: self.cluster.clone(),
            kind: self.kind,
            params: String::new(),
            status: self.status,
            steps: Vec::new(),
            error: self.error.clone(),
            created_at: self.created_at,
            ended_at: self.ended_at,
            resume: None,
        }
    }

    /// (done, total) steps.
    pub fn progress(&self) -> (usize, usize) {
        let done = self.steps.iter().filter(|s| s.status == StepStatus::Done).count();
        (done, self.steps.len())
    }
}

/// An API token. The secret is shown once, when the token is created; the
/// store keeps only its SHA-256 (a token is 256 random bits, so a fast
/// hash is enough: there is nothing to guess from it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenRecord {
    pub version: u32,
    /// Public: it starts the token (`flt_<id>_<secret>`) and names it in
    /// lists and revocations.
    pub id: String,
    /// What the operator called it (`ci`, `alice`, `initial`).
    pub name: String,
    pub secret_sha256: [u8; 32],
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    /// What it may do. Added in schema 4: tokens stored before then are
    /// migrated as `admin` (what every token could do).
    pub scope: Scope,
}

/// An instance a force delete could not remove from its agent (the agent
/// was down or failed). The master removes it when that agent reconnects
/// and reports it, then drops this record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LeftoverRecord {
    pub version: u32,
    pub instance: InstanceId,
    pub node: NodeId,
    pub cluster: String,
    /// Its ports stay allocated until it is removed: its process may still
    /// hold them on that node.
    pub ports: Vec<u16>,
    pub reason: String,
    #[serde(with = "time::serde::rfc3339")]
    pub at: OffsetDateTime,
}

/// One state change, as the event stream shows it. Its number is its key
/// in the `events` log (the writer assigns it: `WriteOp::Append`), so the
/// value does not carry it; reads fill `seq` in from the key.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventRecord {
    pub version: u32,
    #[serde(skip)]
    pub seq: u64,
    #[serde(with = "time::serde::rfc3339")]
    pub at: OffsetDateTime,
    /// `cluster.status`, `instance.status`, `operation.step_started`, ...
    /// (`storage::events`).
    pub kind: String,
    /// The cluster it is about, if any (for `?cluster=`).
    pub cluster: Option<String>,
    /// What changed: a JSON object.
    pub data: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::codec;

    /// `Ports` is stored and shown as a map, sorted by name, as it was when
    /// it held `String`s.
    #[test]
    fn ports_encode_as_a_sorted_map() {
        let ports: Ports = [("peer", 2888u16), ("client", 2181)].into_iter().collect();
        assert_eq!(ports.len(), 2);
        assert_eq!(ports.get("client"), Some(&2181));
        assert_eq!(serde_json::to_string(&ports).unwrap(), r#"{"client":2181,"peer":2888}"#);
        let map: BTreeMap<String, u16> = [("client".to_string(), 2181u16), ("peer".to_string(), 2888)].into();
        assert_eq!(codec::encode(&ports).unwrap(), codec::encode(&map).unwrap());
        assert_eq!(codec::decode::<Ports>(&codec::encode(&map).unwrap()).unwrap(), ports);
    }

    /// A token's scope is stored by its variant index (`scope.rs` says
    /// never to reorder them): this pins the bytes.
    #[test]
    fn a_scope_is_stored_as_its_variant_index() {
        for (i, scope) in Scope::ALL.into_iter().enumerate() {
            assert_eq!(codec::encode(&scope).unwrap(), vec![i as u8], "{scope}");
            assert_eq!(codec::decode::<Scope>(&[i as u8]).unwrap(), scope);
        }
        assert!(codec::decode::<Scope>(&[3]).is_err(), "no fourth scope");
    }
}
