//! Sample records for the storage tests: every field filled, including the
//! optional ones, so a round trip exercises all of the encoding.

use std::collections::BTreeMap;

use time::OffsetDateTime;
use time::macros::datetime;

use crate::ids::{ClusterId, InstanceId, NodeId, OperationId};
use crate::protocol::messages::{HealthProbe, ProcessSpec, ResourceLimits};
use crate::storage::agent_records::{AgentInstanceRecord, PidIdentity, Tombstone};
use crate::storage::records::*;

pub const T0: OffsetDateTime = datetime!(2024-05-01 12:30:45.123456789 UTC);

pub fn cluster(name: &str) -> ClusterRecord {
    let mut config = BTreeMap::new();
    config.insert("int".into(), ConfigValue::Int(-42));
    config.insert("float".into(), ConfigValue::Float(0.25));
    config.insert("bool".into(), ConfigValue::Bool(true));
    config.insert("str".into(), ConfigValue::Str("héllo".into()));
    let mut roles = BTreeMap::new();
    roles.insert("server".into(), RoleState { next_ordinal: 4, limits: None, node_labels: None });
    ClusterRecord {
        version: RECORD_VERSION,
        id: ClusterId::random(),
        name: name.into(),
        package: PackageRef { name: "zk".into(), version: "3.8.0".into() },
        status: ClusterStatus::Active,
        status_description: "all good".into(),
        config,
        roles,
        operation: Some(OperationId::random()),
        created_at: T0,
        updated_at: T0 + time::Duration::seconds(5),
    }
}

pub fn instance(cluster: &ClusterRecord, ordinal: u32) -> InstanceRecord {
    InstanceRecord {
        version: RECORD_VERSION,
        id: InstanceId::generate(&cluster.name, &cluster.id, "server", ordinal),
        cluster_id: cluster.id,
        cluster: cluster.name.as_str().into(),
        role: "server".into(),
        ordinal,
        node: NodeId::new("node-1"),
        host: "127.0.0.1".into(),
        ports: [("client".to_string(), 2181u16)].into_iter().collect(),
        status: InstanceStatus::Running,
        desired: DesiredState::Running,
        pid: Some(4242),
        generation: 7,
        dir: "/var/lib/flotilla/instances/x".into(),
        last_error: Some("was slow".into()),
        applied: Some(std::sync::Arc::new(Applied {
            package_version: "3.8.0".into(),
            limits: Some(Limits { memory_bytes: Some(512 << 20), cpu: None }),
        })),
        pending_restart: PendingRestart::Restart,
    }
}

pub fn node(id: &str) -> NodeRecord {
    NodeRecord {
        version: RECORD_VERSION,
        id: NodeId::new(id),
        address: "10.0.0.1:7000".into(),
        port_range: (20000, 20999),
        labels: [("rack".to_string(), "a".to_string())].into_iter().collect(),
        cgroups: true,
        resource_limits: true,
        agent_version: "0.1.0".into(),
        instance_root: "/var/lib/flotilla/instances".into(),
        registered_at: T0,
        simulated: false,
    }
}

pub fn package(name: &str, version: &str) -> PackageRecord {
    PackageRecord {
        version: RECORD_VERSION,
        name: name.into(),
        package_version: version.into(),
        sha256: "ab".repeat(32),
        size: 123_456,
        spec_toml: "[component]\nname = \"zk\"\n".into(),
        uploaded_at: T0,
    }
}

pub fn operation(cluster: &ClusterRecord, created_at: OffsetDateTime) -> OperationRecord {
    let instance = InstanceId::generate(&cluster.name, &cluster.id, "server", 1);
    OperationRecord {
        version: RECORD_VERSION,
        id: OperationId::random(),
        cluster_id: cluster.id,
        cluster: cluster.name.clone(),
        kind: OperationKind::ScaleOut,
        params: r#"{"role":"server","count":2}"#.into(),
        status: OperationStatus::Failed,
        steps: vec![StepRecord {
            name: "start".into(),
            status: StepStatus::UndoFailed,
            error: Some("boom".into()),
            results: vec![InstanceResult {
                instance: instance.clone(),
                ok: false,
                message: "exit 3".into(),
                exit_code: Some(3),
                stderr_tail: "oops\n".into(),
                stdout_tail: "partial\n".into(),
            }],
        }],
        error: Some("step start failed".into()),
        created_at,
        ended_at: Some(created_at + time::Duration::minutes(1)),
        resume: Some(Resumable {
            plan: crate::operations::change::upgrade(
                PackageRef { name: "zk".into(), version: "1".into() },
                PackageRef { name: "zk".into(), version: "2".into() },
                crate::operations::Rolling::all_running(std::slice::from_ref(&instance), 1),
            ),
            pending: vec![],
            on_success: Some(ClusterStatus::Active),
            force: false,
        }),
    }
}

pub fn event(seq: u64) -> EventRecord {
    EventRecord {
        version: RECORD_VERSION,
        seq,
        at: T0,
        kind: "instance.status".into(),
        cluster: Some("web".into()),
        data: format!(r#"{{"n":{seq}}}"#),
    }
}

pub fn agent_instance(id: &str) -> AgentInstanceRecord {
    AgentInstanceRecord {
        version: RECORD_VERSION,
        id: InstanceId::new(id),
        generation: 3,
        desired_running: true,
        run_as: "flotilla".into(),
        process: ProcessSpec {
            start: vec!["bin/start.sh".into(), "--fg".into()],
            stop: Some(vec!["bin/stop.sh".into()]),
            pidfile: Some("run/pid".into()),
            stop_grace_ms: 5000,
            start_timeout_ms: 30_000,
            env: vec![("JAVA_OPTS".into(), "-Xmx1g".into())],
            health: Some(HealthProbe::Tcp { port: 2181 }),
            limits: Some(ResourceLimits { memory_bytes: Some(512 << 20), cpu: Some(1.5) }),
        },
        package_sha256: "cd".repeat(32),
        file_hashes: [("conf/zoo.cfg".to_string(), "ef".repeat(32))].into_iter().collect(),
        pid: Some(PidIdentity { pid: 999, start_time: 123_456, boot_id: "b00t".into() }),
    }
}

pub fn tombstone(id: &str) -> Tombstone {
    Tombstone { version: RECORD_VERSION, id: InstanceId::new(id), generation: 9 }
}
