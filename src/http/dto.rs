//! Request and response bodies of the admin API. These are not the storage
//! records: the API's shapes can stay stable while records evolve. Request
//! bodies refuse unknown fields. Every body derives `ToSchema`: the API
//! description (`openapi.rs`) is generated from these very types, so it
//! cannot drift from what is answered. The resources are here; the
//! answers wrapping them, the master's own status, tokens and previews are
//! in `dto/`.

mod envelopes;
mod previews;
mod status;
mod tokens;
mod trust;
mod unique;

pub use envelopes::{
    ClusterPage, NodePage, OperationEnvelope, OperationPage, PackageDetail, PackageEnvelope, PackageList,
};
pub use previews::{PackageCheckDto, PackagePreview, PackageUploadAnswer};
pub use status::{ActorDto, ActorsDto, HealthDto, MasterDto, MasterStateDto, TookOverDto};
pub use tokens::{
    CreateTokenBody, CreatedToken, RevokeAnswer, RevokedToken, TokenCreatePreview, TokenDto, TokenList,
    TokenRevokePreview, WhoAmI,
};
pub use trust::{
    CreateJoinTokenBody, CreatedJoinToken, DeletedJoinToken, JoinTokenDto, JoinTokenList, NodeCertDto, RevokedNode,
};

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use utoipa::ToSchema;

use crate::actors::read_model::{ClusterSnapshot, NodeEntry, PackageView};
use crate::storage::records::{
    ClusterStatus, InstanceRecord, InstanceResult, InstanceStatus, NodeStatus, OperationKind, OperationRecord,
    OperationStatus, StepStatus,
};

/// An uploaded package, by name and version.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PackageBody {
    pub name: String,
    pub version: String,
}

/// One role of a new cluster.
#[derive(Debug, Deserialize, Default, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RoleBody {
    /// How many instances (the role's minimum when left out).
    pub count: Option<u32>,
    /// Place them on these nodes only.
    #[schema(min_items = 1)]
    pub nodes: Option<Vec<String>>,
    /// Node labels this cluster's instances of the role require, instead
    /// of the spec's `node_labels` (`{}`: any node); kept for its
    /// scale-outs.
    #[serde(default, deserialize_with = "unique::keys_option")]
    pub node_labels: Option<BTreeMap<String, String>>,
}

/// `POST /clusters`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({
    "name": "demo",
    "package": { "name": "web", "version": "1.0.0" },
    "roles": { "server": { "count": 2 } },
    "config": { "greeting": "hello" }
}))]
pub struct CreateClusterBody {
    #[schema(pattern = "^[a-z0-9][a-z0-9-]{0,62}$")]
    pub name: String,
    pub package: PackageBody,
    /// Role name to its size and placement; a role left out gets its minimum.
    #[serde(default, deserialize_with = "unique::keys")]
    pub roles: BTreeMap<String, RoleBody>,
    /// Config values, typed by the package's `component.toml`.
    #[serde(default, deserialize_with = "unique::keys")]
    pub config: BTreeMap<String, serde_json::Value>,
}

/// `POST /clusters/{name}/scale`: exactly one of `add` and `remove`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({ "role": "server", "add": 1 }))]
pub struct ScaleBody {
    pub role: String,
    /// Add this many instances.
    pub add: Option<u32>,
    /// Remove these instances (by id).
    #[schema(min_items = 1)]
    pub remove: Option<Vec<String>>,
    /// Place the added ones on these nodes only (with `add`).
    #[schema(min_items = 1)]
    pub nodes: Option<Vec<String>>,
}

/// `PATCH /clusters/{name}/config`: new values; instances whose files change
/// reload, are signalled or restart `batch` at a time (default: a quarter of
/// each role; one at a time in a quorum role).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({ "config": { "greeting": "bonjour" } }))]
pub struct ConfigBody {
    /// The values to change; the others stay.
    #[serde(deserialize_with = "unique::keys")]
    pub config: BTreeMap<String, serde_json::Value>,
    /// Instances changed at a time.
    #[serde(default)]
    pub batch: Option<usize>,
}

/// `POST /clusters/{name}/upgrade`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({ "version": "1.0.0" }))]
pub struct UpgradeBody {
    /// A version of the cluster's package.
    #[schema(pattern = "^[A-Za-z0-9_+-][A-Za-z0-9._+-]{0,63}$")]
    pub version: String,
    /// Instances replaced at a time.
    #[serde(default)]
    pub batch: Option<usize>,
}

/// `PATCH /clusters/{name}/roles/{role}`: vertical scale.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({ "resources": { "memory": "256M", "cpu": 0.5 } }))]
pub struct ResizeBody {
    pub resources: ResourcesBody,
    /// Instances replaced at a time.
    #[serde(default)]
    pub batch: Option<usize>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ResourcesBody {
    /// `"512M"`, `"2G"`, or a number of bytes.
    #[schema(schema_with = memory_schema)]
    pub memory: Option<serde_json::Value>,
    /// CPUs (`0.5`: half of one).
    pub cpu: Option<f64>,
}

/// `resources.memory`: a string with a unit, or bytes.
fn memory_schema() -> utoipa::openapi::schema::Schema {
    use utoipa::openapi::schema::{ObjectBuilder, OneOfBuilder, Type};
    OneOfBuilder::new()
        .item(ObjectBuilder::new().schema_type(Type::String).description(Some("With a unit: `512M`, `2G`")))
        .item(ObjectBuilder::new().schema_type(Type::Integer).minimum(Some(0)).description(Some("Bytes")))
        .item(ObjectBuilder::new().schema_type(Type::Null))
        .description(Some("The memory limit: `\"512M\"`, `\"2G\"`, or a number of bytes"))
        .build()
        .into()
}

#[derive(Debug, Serialize, ToSchema)]
pub struct PackageRefDto {
    pub name: String,
    pub version: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct RoleDto {
    pub count: u32,
    /// The node labels this cluster's create gave the role, over its
    /// spec's `node_labels`; absent: the spec's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_labels: Option<BTreeMap<String, String>>,
}

impl RoleDto {
    /// Every role of the cluster with its instance count.
    fn of(snap: &ClusterSnapshot) -> BTreeMap<String, RoleDto> {
        let c = &snap.record;
        let mut roles: BTreeMap<String, RoleDto> = c
            .roles
            .iter()
            .map(|(r, s)| (r.clone(), RoleDto { count: 0, node_labels: s.node_labels.clone() }))
            .collect();
        for (role, n) in &snap.counts.roles {
            roles.entry(role.to_string()).or_insert(RoleDto { count: 0, node_labels: None }).count = *n;
        }
        roles
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct InstanceDto {
    pub id: String,
    pub cluster: String,
    pub role: String,
    pub ordinal: u32,
    pub node: String,
    pub host: String,
    pub ports: BTreeMap<String, u16>,
    pub status: InstanceStatus,
    pub pid: Option<u32>,
    pub dir: String,
    pub generation: u64,
    pub last_error: Option<String>,
}

impl From<&InstanceRecord> for InstanceDto {
    fn from(r: &InstanceRecord) -> Self {
        InstanceDto {
            id: r.id.to_string(),
            cluster: r.cluster.to_string(),
            role: r.role.to_string(),
            ordinal: r.ordinal,
            node: r.node.to_string(),
            host: r.host.to_string(),
            ports: r.ports.to_map(),
            status: r.status,
            pid: r.pid,
            dir: r.dir.to_string(),
            generation: r.generation,
            last_error: r.last_error.clone(),
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ClusterDto {
    pub name: String,
    pub id: String,
    pub package: PackageRefDto,
    pub status: ClusterStatus,
    pub status_description: String,
    pub config: BTreeMap<String, serde_json::Value>,
    pub roles: BTreeMap<String, RoleDto>,
    pub instances: Vec<InstanceDto>,
    /// Instances by status.
    pub instance_counts: BTreeMap<String, u32>,
    pub operation: Option<String>,
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339")]
    pub updated_at: OffsetDateTime,
}

impl ClusterDto {
    /// With every instance, or (`with_instances` false) only their counts.
    pub fn build(snap: &ClusterSnapshot, with_instances: bool) -> Self {
        let c = &snap.record;
        let instances = if with_instances { snap.sorted_instances() } else { Vec::new() };
        let roles = RoleDto::of(snap);
        ClusterDto {
            name: c.name.clone(),
            id: c.id.to_string(),
            package: PackageRefDto { name: c.package.name.clone(), version: c.package.version.clone() },
            status: c.status,
            status_description: c.status_description.clone(),
            config: c.config.iter().map(|(k, v)| (k.clone(), v.to_public_json())).collect(),
            roles,
            instances: instances.iter().map(|i| InstanceDto::from(&*i.record)).collect(),
            instance_counts: instance_counts(snap).into_iter().collect(),
            operation: c.operation.map(|o| o.to_string()),
            created_at: c.created_at,
            updated_at: c.updated_at,
        }
    }
}

/// Every instance status, in `InstanceStatus as usize` order.
pub const INSTANCE_STATUSES: [InstanceStatus; 11] = [
    InstanceStatus::Pending,
    InstanceStatus::Installing,
    InstanceStatus::Installed,
    InstanceStatus::Starting,
    InstanceStatus::Running,
    InstanceStatus::Stopping,
    InstanceStatus::Stopped,
    InstanceStatus::Failed,
    InstanceStatus::Lost,
    InstanceStatus::Deleting,
    InstanceStatus::Restarting,
];

/// A cluster's instances by status (the statuses it has any of).
pub fn instance_counts(snap: &ClusterSnapshot) -> Vec<(String, u32)> {
    INSTANCE_STATUSES
        .iter()
        .filter(|s| snap.counts.statuses[**s as usize] > 0)
        .map(|s| (format!("{s:?}"), snap.counts.statuses[*s as usize]))
        .collect()
}

/// A cluster in `GET /clusters`: no instance list, counts instead.
#[derive(Debug, Serialize, ToSchema)]
pub struct ClusterSummaryDto {
    pub name: String,
    pub id: String,
    pub package: PackageRefDto,
    pub status: ClusterStatus,
    pub status_description: String,
    pub roles: BTreeMap<String, RoleDto>,
    /// Instances by status.
    pub instances: BTreeMap<String, u32>,
    pub operation: Option<String>,
    #[serde(with = "time::serde::rfc3339")]
    pub updated_at: OffsetDateTime,
}

impl ClusterSummaryDto {
    pub fn build(snap: &ClusterSnapshot) -> Self {
        let c = &snap.record;
        let roles = RoleDto::of(snap);
        let by_status: BTreeMap<String, u32> = instance_counts(snap).into_iter().collect();
        ClusterSummaryDto {
            name: c.name.clone(),
            id: c.id.to_string(),
            package: PackageRefDto { name: c.package.name.clone(), version: c.package.version.clone() },
            status: c.status,
            status_description: c.status_description.clone(),
            roles,
            instances: by_status,
            operation: c.operation.map(|o| o.to_string()),
            updated_at: c.updated_at,
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct StepDto {
    pub name: String,
    pub status: StepStatus,
    pub error: Option<String>,
    pub results: Vec<ResultDto>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ResultDto {
    pub instance: String,
    pub ok: bool,
    pub message: String,
    pub exit_code: Option<i32>,
    pub stdout_tail: String,
    pub stderr_tail: String,
}

impl From<&InstanceResult> for ResultDto {
    fn from(r: &InstanceResult) -> Self {
        ResultDto {
            instance: r.instance.to_string(),
            ok: r.ok,
            message: r.message.clone(),
            exit_code: r.exit_code,
            stdout_tail: r.stdout_tail.clone(),
            stderr_tail: r.stderr_tail.clone(),
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ProgressDto {
    pub done: usize,
    pub total: usize,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct OperationDto {
    pub id: String,
    pub kind: OperationKind,
    pub cluster: String,
    pub status: OperationStatus,
    pub params: serde_json::Value,
    pub steps: Vec<StepDto>,
    pub progress: ProgressDto,
    pub error: Option<String>,
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339::option")]
    pub ended_at: Option<OffsetDateTime>,
    /// The node requests it filed (a placement waiting for nodes: its
    /// `await-nodes-<role>` step), as the pools see them now.
    pub node_requests: Vec<super::pools::NodeRequestDto>,
}

impl OperationDto {
    /// Fills each operation's node requests (requestor
    /// `operation:<id>/<role>`): one pass over the requests.
    pub fn attach_requests(ops: &mut [OperationDto], pools: &crate::actors::pools::Pools) {
        let view = pools.view();
        let at: std::collections::HashMap<String, usize> =
            ops.iter().enumerate().map(|(i, o)| (o.id.clone(), i)).collect();
        for r in view.requests.values() {
            let op = r.requestor.strip_prefix("operation:").and_then(|rest| rest.split_once('/')).map(|(op, _)| op);
            if let Some(&i) = op.and_then(|op| at.get(op)) {
                ops[i].node_requests.push(super::pools::NodeRequestDto::from(r));
            }
        }
    }
}

impl From<&OperationRecord> for OperationDto {
    fn from(o: &OperationRecord) -> Self {
        let (done, total) = o.progress();
        OperationDto {
            id: o.id.to_string(),
            kind: o.kind,
            cluster: o.cluster.clone(),
            status: o.status,
            params: serde_json::from_str(&o.params).unwrap_or(serde_json::Value::Null),
            steps: o
                .steps
                .iter()
                .map(|s| StepDto {
                    name: s.name.clone(),
                    status: s.status,
                    error: s.error.clone(),
                    results: s.results.iter().map(ResultDto::from).collect(),
                })
                .collect(),
            progress: ProgressDto { done, total },
            error: o.error.clone(),
            created_at: o.created_at,
            ended_at: o.ended_at,
            node_requests: Vec::new(),
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct NodeDto {
    pub id: String,
    pub address: String,
    pub status: NodeStatus,
    pub connected: bool,
    /// A simulated agent (`flotilla bench`): the real protocol, no real processes.
    pub simulated: bool,
    pub heartbeat_age_ms: Option<u64>,
    pub port_range: (u16, u16),
    pub labels: BTreeMap<String, String>,
    pub cgroups: bool,
    pub resource_limits: bool,
    pub agent_version: String,
    /// How many instances are placed on it.
    pub instance_count: usize,
    /// Their ids (`GET /nodes/{id}` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instances: Option<Vec<String>>,
    /// The certificate it connects with (`GET /nodes/{id}` only; none for
    /// a node never enrolled with this master).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub certificate: Option<NodeCertDto>,
    /// Instances the node holds that the master does not know (`GET
    /// /nodes/{id}` only): removed from the node after `leaked_grace`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub leaked: Option<Vec<LeakedDto>>,
    /// Set when an operator took it out of placement (`POST
    /// /nodes/{id}/cordon`): no new instance goes there.
    pub cordon: Option<CordonDto>,
    /// `manual`, or the pool that launched it (`GET /pools`).
    pub origin: Option<super::pools::OriginDto>,
    /// `ready` or `cordoned`; a provider node's `launching` ...
    /// `deleting`, `failed` (beside `status`, its link's health).
    pub lifecycle: String,
}

/// A node's cordon.
#[derive(Debug, Serialize, ToSchema)]
pub struct CordonDto {
    /// Why, as the operator said (may be empty).
    pub reason: String,
    #[serde(with = "time::serde::rfc3339")]
    pub since: OffsetDateTime,
}

impl From<&crate::storage::records::CordonRecord> for CordonDto {
    fn from(r: &crate::storage::records::CordonRecord) -> Self {
        CordonDto { reason: r.reason.clone(), since: r.since }
    }
}

/// An instance a node holds that the master does not know.
#[derive(Debug, Serialize, ToSchema)]
pub struct LeakedDto {
    pub instance: String,
    /// When this master first saw it in the node's inventory.
    #[serde(with = "time::serde::rfc3339")]
    pub first_seen: OffsetDateTime,
    /// When it will be removed from the node; absent: never
    /// (`leaked_grace` is 0, report only).
    #[serde(with = "time::serde::rfc3339::option")]
    pub remove_at: Option<OffsetDateTime>,
    /// Whether a process of it ran when the node reported it.
    pub running: bool,
    pub pid: Option<u32>,
    /// Only a directory: the agent holds no record of it.
    pub unrecorded: bool,
    /// A removal is under way.
    pub removing: bool,
    /// Why the last removal failed (it is tried again).
    pub last_error: Option<String>,
}

impl From<&crate::actors::read_model::Leaked> for LeakedDto {
    fn from(l: &crate::actors::read_model::Leaked) -> Self {
        LeakedDto {
            instance: l.instance.to_string(),
            first_seen: l.first_seen,
            remove_at: l.remove_at,
            running: l.running,
            pid: l.pid,
            unrecorded: l.unrecorded,
            removing: l.removing,
            last_error: l.last_error.clone(),
        }
    }
}

impl NodeDto {
    pub fn build(n: &NodeEntry, status: NodeStatus, now: std::time::Instant, with_instances: bool) -> Self {
        let r = n.record();
        let instances = n.instances();
        NodeDto {
            id: r.id.to_string(),
            address: r.address.to_string(),
            status,
            connected: n.live.connected(),
            simulated: r.simulated,
            heartbeat_age_ms: n.live.silence(now).map(|d| d.as_millis() as u64),
            port_range: r.port_range,
            labels: r.labels.clone(),
            cgroups: r.cgroups,
            resource_limits: r.resource_limits,
            agent_version: r.agent_version.clone(),
            instance_count: instances.len(),
            instances: with_instances.then(|| instances.keys().map(|i| i.to_string()).collect()),
            certificate: None,
            leaked: None,
            cordon: None,
            origin: None,
            lifecycle: String::new(),
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct PackageDto {
    pub name: String,
    pub version: String,
    pub sha256: String,
    pub size: u64,
    pub roles: Vec<String>,
    #[serde(with = "time::serde::rfc3339")]
    pub uploaded_at: OffsetDateTime,
}

impl From<&PackageView> for PackageDto {
    fn from(p: &PackageView) -> Self {
        PackageDto {
            name: p.record.name.clone(),
            version: p.record.package_version.clone(),
            sha256: p.record.sha256.clone(),
            size: p.record.size,
            roles: p.spec.roles.iter().map(|r| r.name.clone()).collect(),
            uploaded_at: p.record.uploaded_at,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_status_is_counted_at_its_own_index() {
        for (i, s) in INSTANCE_STATUSES.iter().enumerate() {
            assert_eq!(*s as usize, i, "{s:?}");
        }
    }
}
