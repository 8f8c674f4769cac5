//! Schema migrations of the master's store, run once at open, each in one
//! synced batch that also writes the new version: a crash midway leaves the
//! old schema whole, and the next start migrates again.
//!
//! The old record shapes live here, frozen, so the current ones can evolve.

use rocksdb::{DB, IteratorMode, WriteBatch, WriteOptions};
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use super::keys::master_cf;
use super::records::{
    ClusterRecord, ClusterStatus, ConfigValue, InstanceResult, Limits, NodeRecord, OperationKind, OperationRecord,
    OperationStatus, PackageRef, Resumable, RoleState, StepRecord, StepStatus, TokenRecord,
};
use super::trust_records::JoinTokenRecord;
use super::{StorageError, codec, db};
use crate::ids::{ClusterId, NodeId, OperationId};
use crate::scope::Scope;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct NodeRecordV2 {
    version: u32,
    id: NodeId,
    address: String,
    port_range: (u16, u16),
    labels: std::collections::BTreeMap<String, String>,
    cgroups: bool,
    resource_limits: bool,
    agent_version: String,
    instance_root: String,
    #[serde(with = "time::serde::rfc3339")]
    registered_at: OffsetDateTime,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct StepRecordV2 {
    name: String,
    status: StepStatus,
    error: Option<String>,
    results: Vec<InstanceResult>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct OperationRecordV2 {
    version: u32,
    id: OperationId,
    cluster_id: ClusterId,
    cluster: String,
    kind: OperationKind,
    params: String,
    status: OperationStatus,
    steps: Vec<StepRecordV2>,
    error: Option<String>,
    #[serde(with = "time::serde::rfc3339")]
    created_at: OffsetDateTime,
    #[serde(with = "crate::storage::serde_time::rfc3339_option")]
    ended_at: Option<OffsetDateTime>,
    resume: Option<Resumable>,
}

/// An API token before scopes (schemas 2 and 3).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct TokenRecordV3 {
    version: u32,
    id: String,
    name: String,
    secret_sha256: [u8; 32],
    #[serde(with = "time::serde::rfc3339")]
    created_at: OffsetDateTime,
}

/// A role's state before per-cluster node labels (schemas 2 to 4).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct RoleStateV4 {
    next_ordinal: u32,
    limits: Option<Limits>,
}

/// A cluster record before per-cluster node labels (schemas 2 to 4).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct ClusterRecordV4 {
    version: u32,
    id: ClusterId,
    name: String,
    package: PackageRef,
    status: ClusterStatus,
    status_description: String,
    config: std::collections::BTreeMap<String, ConfigValue>,
    roles: std::collections::BTreeMap<String, RoleStateV4>,
    operation: Option<OperationId>,
    #[serde(with = "time::serde::rfc3339")]
    created_at: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339")]
    updated_at: OffsetDateTime,
}

/// A join token before tokens bound to a node (schema 5).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct JoinTokenRecordV5 {
    version: u32,
    id: String,
    name: String,
    secret_sha256: [u8; 32],
    #[serde(with = "time::serde::rfc3339")]
    created_at: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339")]
    expires_at: OffsetDateTime,
    uses_left: u32,
}

/// Writes a migration's `batch` with the new schema `version`, in one
/// synced write: a crash leaves the old schema whole or the new one.
fn write_with_version(db: &DB, mut batch: WriteBatch, version: u32) -> Result<(), StorageError> {
    db::put_schema_version(db, &mut batch, master_cf::META, version)?;
    let mut sync = WriteOptions::default();
    sync.set_sync(true);
    db.write_opt(batch, &sync).map_err(StorageError::Rocks)
}

fn cf<'a>(db: &'a DB, name: &'static str) -> Result<&'a rocksdb::ColumnFamily, StorageError> {
    db.cf_handle(name).ok_or(StorageError::UnknownColumnFamily { cf: name })
}

/// 2 -> 3: operations split into header, per-step results, plan (only while
/// running) and time indexes; nodes gain `simulated`.
pub fn master_2_to_3(db: &DB) -> Result<(), StorageError> {
    let mut batch = WriteBatch::default();
    let nodes = cf(db, master_cf::NODES)?;
    for item in db.iterator_cf(nodes, IteratorMode::Start) {
        let (k, v) = item.map_err(StorageError::Rocks)?;
        let old: NodeRecordV2 = db::decode_value(master_cf::NODES, &k, &v)?;
        let new = NodeRecord {
            version: 3,
            id: old.id,
            address: old.address.into(),
            port_range: old.port_range,
            labels: old.labels,
            cgroups: old.cgroups,
            resource_limits: old.resource_limits,
            agent_version: old.agent_version,
            instance_root: old.instance_root,
            registered_at: old.registered_at,
            simulated: false,
        };
        batch.put_cf(nodes, &k, codec::encode(&new)?);
    }
    let ops = cf(db, master_cf::OPERATIONS)?;
    let mut converted = Vec::new();
    for item in db.iterator_cf(ops, IteratorMode::Start) {
        let (k, v) = item.map_err(StorageError::Rocks)?;
        let old: OperationRecordV2 = db::decode_value(master_cf::OPERATIONS, &k, &v)?;
        converted.push(old);
    }
    for old in converted {
        let results: Vec<Vec<InstanceResult>> = old.steps.iter().map(|s| s.results.clone()).collect();
        let new = OperationRecord {
            version: 3,
            id: old.id,
            cluster_id: old.cluster_id,
            cluster: old.cluster,
            kind: old.kind,
            params: old.params,
            status: old.status,
            steps: old
                .steps
                .into_iter()
                .map(|s| StepRecord { name: s.name, status: s.status, error: s.error, results: Vec::new() })
                .collect(),
            error: old.error,
            created_at: old.created_at,
            ended_at: old.ended_at,
            // An ended operation's plan is not kept (schema 3 drops it).
            resume: old.resume.filter(|_| !old.status.is_terminal()),
        };
        let mut writes = super::WriteOp::new_operation(&new)?;
        for (i, r) in results.iter().enumerate().filter(|(_, r)| !r.is_empty()) {
            writes.push(super::WriteOp::put_step_results(&new.id, i, r)?);
        }
        for w in writes {
            match w {
                super::WriteOp::Put { cf: name, key, value } => batch.put_cf(cf(db, name)?, key, value),
                other => {
                    return Err(StorageError::Codec(format!("migration produced an unexpected write {other:?}")));
                }
            }
        }
    }
    write_with_version(db, batch, 3)
}

/// 3 -> 4: API tokens gain a scope. Every token stored before keeps what
/// it could do, everything: `admin`.
pub fn master_3_to_4(db: &DB) -> Result<(), StorageError> {
    let batch = rewrite(db, master_cf::TOKENS, |old: TokenRecordV3| TokenRecord {
        version: 4,
        id: old.id,
        name: old.name,
        secret_sha256: old.secret_sha256,
        created_at: old.created_at,
        scope: Scope::Admin,
    })?;
    write_with_version(db, batch, 4)
}

/// A batch that rewrites every value of column family `name` from its old
/// shape to its new one (`step`), under the same key.
fn rewrite<Old: serde::de::DeserializeOwned, New: serde::Serialize>(
    db: &DB,
    name: &'static str,
    step: impl Fn(Old) -> New,
) -> Result<WriteBatch, StorageError> {
    let mut batch = WriteBatch::default();
    let family = cf(db, name)?;
    for item in db.iterator_cf(family, IteratorMode::Start) {
        let (k, v) = item.map_err(StorageError::Rocks)?;
        let old: Old = db::decode_value(name, &k, &v)?;
        batch.put_cf(family, &k, codec::encode(&step(old))?);
    }
    Ok(batch)
}

/// 4 -> 5: a cluster's roles gain the node labels its create gave them.
/// Every cluster stored before keeps its spec's (`None`).
pub fn master_4_to_5(db: &DB) -> Result<(), StorageError> {
    let batch = rewrite(db, master_cf::CLUSTERS, |old: ClusterRecordV4| {
        let roles = old
            .roles
            .into_iter()
            .map(|(name, r)| (name, RoleState { next_ordinal: r.next_ordinal, limits: r.limits, node_labels: None }))
            .collect();
        ClusterRecord {
            version: old.version,
            id: old.id,
            name: old.name,
            package: old.package,
            status: old.status,
            status_description: old.status_description,
            config: old.config,
            roles,
            operation: old.operation,
            created_at: old.created_at,
            updated_at: old.updated_at,
        }
    })?;
    write_with_version(db, batch, 5)
}

/// 5 -> 6: a join token may be bound to one node id. Every token stored
/// before enrolls any node id, as it did (`None`).
pub fn master_5_to_6(db: &DB) -> Result<(), StorageError> {
    let batch = rewrite(db, master_cf::JOIN_TOKENS, |old: JoinTokenRecordV5| JoinTokenRecord {
        version: old.version,
        id: old.id,
        name: old.name,
        secret_sha256: old.secret_sha256,
        created_at: old.created_at,
        expires_at: old.expires_at,
        uses_left: old.uses_left,
        node: None,
    })?;
    write_with_version(db, batch, 6)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::MasterStore;
    use crate::storage::keys;
    use crate::storage::meta;

    fn v2_op(status: OperationStatus, with_plan: bool) -> OperationRecordV2 {
        let now = OffsetDateTime::now_utc();
        OperationRecordV2 {
            version: 2,
            id: OperationId::random(),
            cluster_id: ClusterId::random(),
            cluster: "web".into(),
            kind: OperationKind::ScaleOut,
            params: "{}".into(),
            status,
            steps: vec![StepRecordV2 {
                name: "install".into(),
                status: StepStatus::Done,
                error: None,
                results: vec![InstanceResult::ok(&crate::ids::InstanceId::new("web-a-1-abcdef"), "installed")],
            }],
            error: None,
            created_at: now,
            ended_at: None,
            resume: with_plan.then(|| Resumable {
                plan: Default::default(),
                pending: vec![],
                on_success: None,
                force: false,
            }),
        }
    }

    #[test]
    fn a_version_2_store_is_migrated_and_keeps_its_operations() {
        let dir = tempfile::tempdir().unwrap();
        let (ended, running) = (v2_op(OperationStatus::Succeeded, true), v2_op(OperationStatus::Running, true));
        {
            // A schema-2 store, written the way the previous release did.
            let mut opts = rocksdb::Options::default();
            opts.create_if_missing(true);
            opts.create_missing_column_families(true);
            let db = DB::open_cf(&opts, dir.path(), master_cf::ALL).unwrap();
            for op in [&ended, &running] {
                db.put_cf(cf(&db, master_cf::OPERATIONS).unwrap(), op.id.0.as_bytes(), codec::encode(op).unwrap())
                    .unwrap();
            }
            let node = NodeRecordV2 {
                version: 2,
                id: NodeId::new("node-1"),
                address: "127.0.0.1".into(),
                port_range: (20000, 20100),
                labels: Default::default(),
                cgroups: false,
                resource_limits: false,
                agent_version: "0".into(),
                instance_root: "/x".into(),
                registered_at: OffsetDateTime::now_utc(),
            };
            db.put_cf(cf(&db, master_cf::NODES).unwrap(), b"node-1", codec::encode(&node).unwrap()).unwrap();
            db.put_cf(cf(&db, master_cf::TOKENS).unwrap(), b"0123456789ab", codec::encode(&v3_token()).unwrap())
                .unwrap();
            db.put_cf(cf(&db, master_cf::META).unwrap(), keys::SCHEMA_VERSION_KEY, codec::encode(&2u32).unwrap())
                .unwrap();
        }
        let store = MasterStore::open(dir.path()).unwrap();
        // Through 3 on to 4: its token is there, with everything it could do.
        let tokens: Vec<TokenRecord> = meta::load(&store, master_cf::TOKENS).unwrap();
        assert_eq!(tokens.iter().map(|t| (t.name.as_str(), t.scope)).collect::<Vec<_>>(), [("ci", Scope::Admin)]);
        let snap = store.load_all().unwrap();
        assert_eq!(snap.nodes.len(), 1);
        assert!(!snap.nodes[0].simulated);
        // Only the running one is loaded (with its plan); both can be read.
        assert_eq!(snap.operations.len(), 1);
        assert_eq!(snap.operations[0].id, running.id);
        assert!(snap.operations[0].resume.is_some());
        let got = meta::operation(&store, &ended.id).unwrap().unwrap();
        assert_eq!(got.steps[0].results[0].message, "installed");
        assert!(meta::plan(&store, &ended.id).unwrap().is_none(), "an ended operation keeps no plan");
        let page = meta::operations_page(&store, None, None, 10).unwrap();
        assert_eq!(page.len(), 2);
        drop(store);
        // Opening again does not migrate twice.
        MasterStore::open(dir.path()).unwrap();
    }

    /// A token as schemas 2 and 3 stored it: no scope.
    fn v3_token() -> TokenRecordV3 {
        TokenRecordV3 {
            version: 2,
            id: "0123456789ab".into(),
            name: "ci".into(),
            secret_sha256: [7; 32],
            created_at: OffsetDateTime::from_unix_timestamp(1_700_000_000).unwrap(),
        }
    }

    /// A schema-3 store holding `tokens` (as that release wrote them).
    fn v3_store(dir: &std::path::Path, tokens: &[TokenRecordV3]) {
        let mut opts = rocksdb::Options::default();
        opts.create_if_missing(true);
        opts.create_missing_column_families(true);
        let db = DB::open_cf(&opts, dir, master_cf::ALL).unwrap();
        for t in tokens {
            db.put_cf(cf(&db, master_cf::TOKENS).unwrap(), t.id.as_bytes(), codec::encode(t).unwrap()).unwrap();
        }
        db.put_cf(cf(&db, master_cf::META).unwrap(), keys::SCHEMA_VERSION_KEY, codec::encode(&3u32).unwrap()).unwrap();
    }

    /// A token stored before scopes is read as `admin` (it could do
    /// everything then, and keeps doing so), with all else as it was.
    #[test]
    fn a_token_stored_before_scopes_is_admin() {
        let dir = tempfile::tempdir().unwrap();
        let old = v3_token();
        let other = TokenRecordV3 { id: "ba9876543210".into(), name: "initial".into(), ..v3_token() };
        v3_store(dir.path(), &[old.clone(), other]);
        // The new shape cannot read the old bytes: hence the migration.
        assert!(codec::decode::<TokenRecord>(&codec::encode(&old).unwrap()).is_err());

        let store = MasterStore::open(dir.path()).unwrap();
        let tokens: Vec<TokenRecord> = meta::load(&store, master_cf::TOKENS).unwrap();
        assert_eq!(tokens.len(), 2);
        let ci = tokens.iter().find(|t| t.id == old.id).unwrap();
        assert_eq!(
            (ci.name.as_str(), ci.secret_sha256, ci.created_at, ci.scope),
            ("ci", old.secret_sha256, old.created_at, Scope::Admin)
        );
        assert!(tokens.iter().all(|t| t.scope == Scope::Admin), "{tokens:?}");
        drop(store);
        // Migrated once: the store says 4 and opens as it is.
        let store = MasterStore::open(dir.path()).unwrap();
        let again: Vec<TokenRecord> = meta::load(&store, master_cf::TOKENS).unwrap();
        assert_eq!(again, tokens);
    }

    /// A token of each scope, stored now, comes back with its scope.
    #[tokio::test]
    async fn a_tokens_scope_is_stored() {
        let dir = tempfile::tempdir().unwrap();
        let store = MasterStore::open(dir.path()).unwrap();
        let writes = Scope::ALL
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let t = TokenRecord {
                    version: 4,
                    id: format!("00000000000{i}"),
                    name: s.to_string(),
                    secret_sha256: [0; 32],
                    created_at: OffsetDateTime::UNIX_EPOCH,
                    scope: *s,
                };
                super::super::WriteOp::put_token(&t).unwrap()
            })
            .collect();
        store.writer().commit(writes).await.unwrap();
        let tokens: Vec<TokenRecord> = meta::load(&store, master_cf::TOKENS).unwrap();
        assert_eq!(tokens.iter().map(|t| t.scope).collect::<Vec<_>>(), Scope::ALL);
        assert!(tokens.iter().all(|t| t.name == t.scope.as_str()));
    }

    /// A cluster stored before per-cluster node labels keeps everything,
    /// its roles' next ordinals and limits included, and its roles take
    /// their spec's labels (`None`).
    #[test]
    fn a_cluster_stored_before_node_labels_keeps_its_roles() {
        let dir = tempfile::tempdir().unwrap();
        let now = crate::storage::testdata::cluster("zk");
        let limits = Limits { memory_bytes: Some(64 << 20), cpu: Some(0.5) };
        let roles = [
            ("server".to_string(), RoleStateV4 { next_ordinal: 6, limits: Some(limits) }),
            ("ui".to_string(), RoleStateV4 { next_ordinal: 2, limits: None }),
        ];
        let old = ClusterRecordV4 {
            version: now.version,
            id: now.id,
            name: now.name.clone(),
            package: now.package.clone(),
            status: now.status,
            status_description: now.status_description.clone(),
            config: now.config.clone(),
            roles: roles.into_iter().collect(),
            operation: now.operation,
            created_at: now.created_at,
            updated_at: now.updated_at,
        };
        {
            let mut opts = rocksdb::Options::default();
            opts.create_if_missing(true);
            opts.create_missing_column_families(true);
            let db = DB::open_cf(&opts, dir.path(), master_cf::ALL).unwrap();
            let key = keys::cluster_key(&old.id);
            db.put_cf(cf(&db, master_cf::CLUSTERS).unwrap(), key, codec::encode(&old).unwrap()).unwrap();
            let meta = cf(&db, master_cf::META).unwrap();
            db.put_cf(meta, keys::SCHEMA_VERSION_KEY, codec::encode(&4u32).unwrap()).unwrap();
        }
        // The new shape cannot read the old bytes: hence the migration.
        assert!(codec::decode::<ClusterRecord>(&codec::encode(&old).unwrap()).is_err());

        let store = MasterStore::open(dir.path()).unwrap();
        let clusters: Vec<ClusterRecord> = meta::load(&store, master_cf::CLUSTERS).unwrap();
        let want = ClusterRecord {
            roles: [
                ("server".to_string(), RoleState { next_ordinal: 6, limits: Some(limits), node_labels: None }),
                ("ui".to_string(), RoleState { next_ordinal: 2, limits: None, node_labels: None }),
            ]
            .into_iter()
            .collect(),
            ..now
        };
        assert_eq!(clusters, vec![want]);
        drop(store);
        let again: Vec<ClusterRecord> =
            meta::load(&MasterStore::open(dir.path()).unwrap(), master_cf::CLUSTERS).unwrap();
        assert_eq!(again, clusters);
    }

    /// A join token stored before tokens bound to a node keeps its id,
    /// name, secret, uses and expiry, and enrolls any node id (`None`).
    #[test]
    fn a_join_token_stored_before_node_binding_is_unbound() {
        let dir = tempfile::tempdir().unwrap();
        let created_at = OffsetDateTime::from_unix_timestamp(1_700_000_000).unwrap();
        let old = JoinTokenRecordV5 {
            version: 1,
            id: "00112233445566778899aabbccddeeff".into(),
            name: "rack-7".into(),
            secret_sha256: [9; 32],
            created_at,
            expires_at: created_at + time::Duration::hours(1),
            uses_left: 3,
        };
        {
            let mut opts = rocksdb::Options::default();
            opts.create_if_missing(true);
            opts.create_missing_column_families(true);
            let db = DB::open_cf(&opts, dir.path(), master_cf::ALL).unwrap();
            let tokens = cf(&db, master_cf::JOIN_TOKENS).unwrap();
            db.put_cf(tokens, old.id.as_bytes(), codec::encode(&old).unwrap()).unwrap();
            let meta = cf(&db, master_cf::META).unwrap();
            db.put_cf(meta, keys::SCHEMA_VERSION_KEY, codec::encode(&5u32).unwrap()).unwrap();
        }
        // The new shape cannot read the old bytes: hence the migration.
        assert!(codec::decode::<JoinTokenRecord>(&codec::encode(&old).unwrap()).is_err());

        let store = MasterStore::open(dir.path()).unwrap();
        let tokens: Vec<JoinTokenRecord> = meta::load(&store, master_cf::JOIN_TOKENS).unwrap();
        let want = JoinTokenRecord {
            version: old.version,
            id: old.id.clone(),
            name: old.name.clone(),
            secret_sha256: old.secret_sha256,
            created_at: old.created_at,
            expires_at: old.expires_at,
            uses_left: old.uses_left,
            node: None,
        };
        assert_eq!(tokens, vec![want]);
        drop(store);
        // Migrated once: the store says 6 and opens as it is.
        let again: Vec<JoinTokenRecord> =
            meta::load(&MasterStore::open(dir.path()).unwrap(), master_cf::JOIN_TOKENS).unwrap();
        assert_eq!(again, tokens);
    }
}
