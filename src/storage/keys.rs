//! Column family names, key layouts and the typed write builders.
//!
//! Keys are chosen so that the iteration order RocksDB gives for free is the
//! order callers want:
//!
//! - clusters, operations, operation plans: the 16 uuid bytes;
//! - operation results: the operation's 16 bytes then the step index as a
//!   big-endian u16, so one operation's results are one key range;
//! - the operation indexes: creation time (unix nanoseconds, big-endian
//!   u64) then the operation id, globally (`ops_by_time`) and behind the
//!   cluster id (`cluster_ops`), so both list newest first by iterating
//!   backwards, whatever the id's own order;
//! - instances (master): the cluster id's 16 bytes then the instance id, so
//!   one cluster's instances are one key prefix;
//! - nodes: the node id; packages: `name \0 version` (neither may contain
//!   `\0`, so the split is unambiguous);
//! - events: the sequence number as big-endian u64, so byte order is
//!   numeric order;
//! - agent instances and tombstones: the instance id.
//!
//! The builders are pure: they encode a record into a [`WriteOp`] and hand
//! it back, for the caller to commit with others in one atomic request.

use crate::ids::{ClusterId, InstanceId, OperationId};
use crate::storage::agent_records::{AgentInstanceRecord, DynamicUserRecord, RestartRecord, Tombstone};
use crate::storage::pool_records::{NodeRequestRecord, PoolNodeRecord};
use crate::storage::records::{
    ClusterRecord, CordonRecord, EventRecord, InstanceRecord, InstanceResult, LeftoverRecord, NodeRecord,
    OperationRecord, PackageRecord, Resumable, TokenRecord,
};
use crate::storage::trust_records::{JoinTokenRecord, NodeCertRecord};
use crate::storage::{StorageError, WriteOp, codec};

/// The master database's column families.
pub mod master_cf {
    pub const CLUSTERS: &str = "clusters";
    pub const INSTANCES: &str = "instances";
    pub const NODES: &str = "nodes";
    pub const PACKAGES: &str = "packages";
    pub const OPERATIONS: &str = "operations";
    pub const EVENTS: &str = "events";
    pub const META: &str = "meta";
    /// Instances a force delete left on an unreachable agent (key: instance id).
    pub const LEFTOVERS: &str = "leftovers";
    /// Per-step instance results of operations.
    pub const OP_RESULTS: &str = "op_results";
    /// The plans of operations that have not ended (key: operation id).
    pub const OP_PLANS: &str = "op_plans";
    /// Every operation by creation time (value: its cluster id).
    pub const OPS_BY_TIME: &str = "ops_by_time";
    /// Every operation of a cluster by creation time (empty values).
    pub const CLUSTER_OPS: &str = "cluster_ops";
    /// API tokens by id; each holds the SHA-256 of its secret, never the secret.
    pub const TOKENS: &str = "tokens";
    /// Join tokens by id; each holds the SHA-256 of its secret.
    pub const JOIN_TOKENS: &str = "join_tokens";
    /// The certificate issued to each node (key: node id).
    pub const NODE_CERTS: &str = "node_certs";
    /// Nodes out of placement (key: node id).
    pub const CORDONS: &str = "cordons";
    /// Nodes a pool launched, in their lifecycle (key: node id).
    pub const POOL_NODES: &str = "pool_nodes";
    /// Node requests (key: request id, time-ordered).
    pub const NODE_REQUESTS: &str = "node_requests";
    pub const ALL: [&str; 18] = [
        CLUSTERS,
        INSTANCES,
        NODES,
        PACKAGES,
        OPERATIONS,
        EVENTS,
        META,
        LEFTOVERS,
        OP_RESULTS,
        OP_PLANS,
        OPS_BY_TIME,
        CLUSTER_OPS,
        TOKENS,
        JOIN_TOKENS,
        NODE_CERTS,
        CORDONS,
        POOL_NODES,
        NODE_REQUESTS,
    ];
}

/// The agent database's column families.
pub mod agent_cf {
    pub const INSTANCES: &str = "instances";
    pub const TOMBSTONES: &str = "tombstones";
    pub const META: &str = "meta";
    /// The restart policy's recent restarts per instance (`RestartRecord`).
    pub const RESTARTS: &str = "restarts";
    /// The dynamic users given to clusters on this node, by cluster id
    /// (`DynamicUserRecord`); a store written before them has none.
    pub const USERS: &str = "users";
    pub const ALL: [&str; 5] = [INSTANCES, TOMBSTONES, META, RESTARTS, USERS];
}

/// The key in `meta` holding the installation's shared CA (`CaRecord`).
pub const SHARED_CA_KEY: &[u8] = b"agent_link_ca";

/// The key in `meta` holding the schema version (a codec-encoded `u32`).
pub const SCHEMA_VERSION_KEY: &[u8] = b"schema_version";

/// The key in the agent's `meta` holding where the search for the next
/// dynamic uid starts (a codec-encoded `u32`): allocation goes round the
/// range, so a released uid is given again as late as possible.
pub const DYNAMIC_USERS_NEXT_KEY: &[u8] = b"dynamic_users_next";

/// The key in the agent's `meta` holding the highest master term it has
/// seen (a codec-encoded `i64`; `agent::master_term`).
pub const MASTER_TERM_KEY: &[u8] = b"master_term";

pub fn cluster_key(id: &ClusterId) -> Vec<u8> {
    id.0.as_bytes().to_vec()
}

/// The prefix shared by all instance keys of one cluster.
pub fn cluster_instances_prefix(cluster: &ClusterId) -> Vec<u8> {
    cluster_key(cluster)
}

pub fn instance_key(cluster: &ClusterId, id: &InstanceId) -> Vec<u8> {
    let mut key = cluster_instances_prefix(cluster);
    key.extend_from_slice(id.as_str().as_bytes());
    key
}

pub fn package_key(name: &str, version: &str) -> Vec<u8> {
    let mut key = Vec::with_capacity(name.len() + 1 + version.len());
    key.extend_from_slice(name.as_bytes());
    key.push(0);
    key.extend_from_slice(version.as_bytes());
    key
}

pub fn operation_key(id: &OperationId) -> Vec<u8> {
    id.0.as_bytes().to_vec()
}

/// The key of one step's results.
pub fn step_results_key(op: &OperationId, step: usize) -> Vec<u8> {
    let mut key = operation_key(op);
    key.extend_from_slice(&u16::try_from(step).unwrap_or(u16::MAX).to_be_bytes());
    key
}

/// Unix nanoseconds, clamped to u64 (good until 2554), for time-ordered keys.
pub fn nanos(t: time::OffsetDateTime) -> u64 {
    u64::try_from(t.unix_timestamp_nanos().max(0)).unwrap_or(u64::MAX)
}

/// `ops_by_time` key of an operation: nanos then id.
pub fn op_time_key(created: u64, op: &OperationId) -> Vec<u8> {
    let mut key = created.to_be_bytes().to_vec();
    key.extend_from_slice(op.0.as_bytes());
    key
}

/// `cluster_ops` key: the cluster, then nanos and id.
pub fn cluster_op_key(cluster: &ClusterId, created: u64, op: &OperationId) -> Vec<u8> {
    let mut key = cluster_key(cluster);
    key.extend_from_slice(&op_time_key(created, op));
    key
}

/// The cluster id at the start of a `cluster_ops` key.
pub fn cluster_of_index_key(key: &[u8]) -> Option<ClusterId> {
    uuid::Uuid::from_slice(key.get(..16)?).ok().map(ClusterId)
}

/// The operation id at the end of an `ops_by_time` or `cluster_ops` key.
pub fn op_of_index_key(key: &[u8]) -> Option<OperationId> {
    let tail = key.get(key.len().checked_sub(16)?..)?;
    uuid::Uuid::from_slice(tail).ok().map(OperationId)
}

/// The creation nanos inside an `ops_by_time` key (its first 8 bytes) or a
/// `cluster_ops` key (bytes 16..24).
pub fn nanos_of_index_key(key: &[u8], cluster_scoped: bool) -> Option<u64> {
    let at = if cluster_scoped { 16 } else { 0 };
    key.get(at..at + 8).and_then(|b| <[u8; 8]>::try_from(b).ok()).map(u64::from_be_bytes)
}

pub fn event_key(seq: u64) -> Vec<u8> {
    seq.to_be_bytes().to_vec()
}

/// The sequence number an event key holds, if it is one.
pub fn event_seq(key: &[u8]) -> Option<u64> {
    <[u8; 8]>::try_from(key).ok().map(u64::from_be_bytes)
}

fn put(cf: &'static str, key: Vec<u8>, value: &impl serde::Serialize) -> Result<WriteOp, StorageError> {
    Ok(WriteOp::Put { cf, key, value: codec::encode(value)? })
}

/// Master-side builders.
impl WriteOp {
    pub fn put_cluster(r: &ClusterRecord) -> Result<WriteOp, StorageError> {
        put(master_cf::CLUSTERS, cluster_key(&r.id), r)
    }

    pub fn delete_cluster(id: &ClusterId) -> WriteOp {
        WriteOp::Delete { cf: master_cf::CLUSTERS, key: cluster_key(id) }
    }

    pub fn put_instance(r: &InstanceRecord) -> Result<WriteOp, StorageError> {
        put(master_cf::INSTANCES, instance_key(&r.cluster_id, &r.id), r)
    }

    pub fn delete_instance(cluster: &ClusterId, id: &InstanceId) -> WriteOp {
        WriteOp::Delete { cf: master_cf::INSTANCES, key: instance_key(cluster, id) }
    }

    pub fn put_node(r: &NodeRecord) -> Result<WriteOp, StorageError> {
        put(master_cf::NODES, r.id.as_str().as_bytes().to_vec(), r)
    }

    /// Forgets a node (a provider node deleted with nothing on it).
    pub fn delete_node(id: &crate::ids::NodeId) -> WriteOp {
        WriteOp::Delete { cf: master_cf::NODES, key: id.as_str().as_bytes().to_vec() }
    }

    pub fn put_package(r: &PackageRecord) -> Result<WriteOp, StorageError> {
        put(master_cf::PACKAGES, package_key(&r.name, &r.package_version), r)
    }

    pub fn delete_package(name: &str, version: &str) -> WriteOp {
        WriteOp::Delete { cf: master_cf::PACKAGES, key: package_key(name, version) }
    }

    /// The operation's header: status, steps (without their results).
    pub fn put_operation(r: &OperationRecord) -> Result<WriteOp, StorageError> {
        put(master_cf::OPERATIONS, operation_key(&r.id), r)
    }

    /// A new operation: its header, its plan, and both index entries.
    pub fn new_operation(r: &OperationRecord) -> Result<Vec<WriteOp>, StorageError> {
        let created = nanos(r.created_at);
        let mut ops = vec![
            WriteOp::put_operation(r)?,
            WriteOp::Put {
                cf: master_cf::OPS_BY_TIME,
                key: op_time_key(created, &r.id),
                value: r.cluster_id.0.as_bytes().to_vec(),
            },
            WriteOp::Put {
                cf: master_cf::CLUSTER_OPS,
                key: cluster_op_key(&r.cluster_id, created, &r.id),
                value: vec![],
            },
        ];
        if let Some(plan) = &r.resume {
            ops.push(WriteOp::put_op_plan(&r.id, plan)?);
        }
        Ok(ops)
    }

    pub fn put_step_results(
        op: &OperationId,
        step: usize,
        results: &[InstanceResult],
    ) -> Result<WriteOp, StorageError> {
        put(master_cf::OP_RESULTS, step_results_key(op, step), &results)
    }

    pub fn put_op_plan(op: &OperationId, plan: &Resumable) -> Result<WriteOp, StorageError> {
        put(master_cf::OP_PLANS, operation_key(op), plan)
    }

    pub fn delete_op_plan(op: &OperationId) -> WriteOp {
        WriteOp::Delete { cf: master_cf::OP_PLANS, key: operation_key(op) }
    }

    /// Everything of an operation: header, plan, results, index entries.
    pub fn delete_operation(op: &OperationId, cluster: &ClusterId, created: u64) -> Vec<WriteOp> {
        vec![
            WriteOp::Delete { cf: master_cf::OPERATIONS, key: operation_key(op) },
            WriteOp::delete_op_plan(op),
            WriteOp::DeleteRange {
                cf: master_cf::OP_RESULTS,
                from: step_results_key(op, 0),
                to: {
                    let mut k = operation_key(op);
                    k.extend_from_slice(&[0xff, 0xff, 0xff]);
                    k
                },
            },
            WriteOp::Delete { cf: master_cf::OPS_BY_TIME, key: op_time_key(created, op) },
            WriteOp::Delete { cf: master_cf::CLUSTER_OPS, key: cluster_op_key(cluster, created, op) },
        ]
    }

    /// An event under its own `seq` (tests and tools; the master appends).
    pub fn put_event(r: &EventRecord) -> Result<WriteOp, StorageError> {
        put(master_cf::EVENTS, event_key(r.seq), r)
    }

    /// An event under the next number of the log, in the same batch as the
    /// rest of its request.
    pub fn append_event(r: &EventRecord) -> Result<WriteOp, StorageError> {
        Ok(WriteOp::Append { cf: master_cf::EVENTS, value: codec::encode(r)? })
    }

    pub fn put_leftover(r: &LeftoverRecord) -> Result<WriteOp, StorageError> {
        put(master_cf::LEFTOVERS, r.instance.as_str().as_bytes().to_vec(), r)
    }

    pub fn delete_leftover(id: &InstanceId) -> WriteOp {
        WriteOp::Delete { cf: master_cf::LEFTOVERS, key: id.as_str().as_bytes().to_vec() }
    }

    pub fn put_cordon(r: &CordonRecord) -> Result<WriteOp, StorageError> {
        put(master_cf::CORDONS, r.node.as_str().as_bytes().to_vec(), r)
    }

    pub fn delete_cordon(node: &crate::ids::NodeId) -> WriteOp {
        WriteOp::Delete { cf: master_cf::CORDONS, key: node.as_str().as_bytes().to_vec() }
    }

    pub fn put_pool_node(r: &PoolNodeRecord) -> Result<WriteOp, StorageError> {
        put(master_cf::POOL_NODES, r.node.as_str().as_bytes().to_vec(), r)
    }

    pub fn delete_pool_node(node: &crate::ids::NodeId) -> WriteOp {
        WriteOp::Delete { cf: master_cf::POOL_NODES, key: node.as_str().as_bytes().to_vec() }
    }

    pub fn put_node_request(r: &NodeRequestRecord) -> Result<WriteOp, StorageError> {
        put(master_cf::NODE_REQUESTS, r.id.as_bytes().to_vec(), r)
    }

    pub fn delete_node_request(id: &str) -> WriteOp {
        WriteOp::Delete { cf: master_cf::NODE_REQUESTS, key: id.as_bytes().to_vec() }
    }

    pub fn put_token(r: &TokenRecord) -> Result<WriteOp, StorageError> {
        put(master_cf::TOKENS, r.id.as_bytes().to_vec(), r)
    }

    pub fn delete_token(id: &str) -> WriteOp {
        WriteOp::Delete { cf: master_cf::TOKENS, key: id.as_bytes().to_vec() }
    }

    pub fn put_join_token(r: &JoinTokenRecord) -> Result<WriteOp, StorageError> {
        put(master_cf::JOIN_TOKENS, r.id.as_bytes().to_vec(), r)
    }

    pub fn delete_join_token(id: &str) -> WriteOp {
        WriteOp::Delete { cf: master_cf::JOIN_TOKENS, key: id.as_bytes().to_vec() }
    }

    pub fn put_node_cert(r: &NodeCertRecord) -> Result<WriteOp, StorageError> {
        put(master_cf::NODE_CERTS, r.node.as_str().as_bytes().to_vec(), r)
    }

    /// The installation's shared CA (several masters on etcd).
    pub fn put_shared_ca(r: &crate::storage::trust_records::CaRecord) -> Result<WriteOp, StorageError> {
        put(master_cf::META, SHARED_CA_KEY.to_vec(), r)
    }
}

/// Agent-side builders (the agent database has its own `instances`).
impl WriteOp {
    pub fn put_agent_instance(r: &AgentInstanceRecord) -> Result<WriteOp, StorageError> {
        put(agent_cf::INSTANCES, r.id.as_str().as_bytes().to_vec(), r)
    }

    pub fn delete_agent_instance(id: &InstanceId) -> WriteOp {
        WriteOp::Delete { cf: agent_cf::INSTANCES, key: id.as_str().as_bytes().to_vec() }
    }

    pub fn put_tombstone(r: &Tombstone) -> Result<WriteOp, StorageError> {
        put(agent_cf::TOMBSTONES, r.id.as_str().as_bytes().to_vec(), r)
    }

    pub fn delete_tombstone(id: &InstanceId) -> WriteOp {
        WriteOp::Delete { cf: agent_cf::TOMBSTONES, key: id.as_str().as_bytes().to_vec() }
    }

    pub fn put_restarts(r: &RestartRecord) -> Result<WriteOp, StorageError> {
        put(agent_cf::RESTARTS, r.id.as_str().as_bytes().to_vec(), r)
    }

    pub fn delete_restarts(id: &InstanceId) -> WriteOp {
        WriteOp::Delete { cf: agent_cf::RESTARTS, key: id.as_str().as_bytes().to_vec() }
    }

    pub fn put_dynamic_user(r: &DynamicUserRecord) -> Result<WriteOp, StorageError> {
        put(agent_cf::USERS, r.cluster.as_bytes().to_vec(), r)
    }

    pub fn put_dynamic_users_next(next: u32) -> Result<WriteOp, StorageError> {
        put(agent_cf::META, DYNAMIC_USERS_NEXT_KEY.to_vec(), &next)
    }

    pub fn delete_dynamic_user(cluster: &str) -> WriteOp {
        WriteOp::Delete { cf: agent_cf::USERS, key: cluster.as_bytes().to_vec() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_keys_sort_numerically() {
        let mut keys: Vec<Vec<u8>> = [300u64, 2, 256, 1, u64::MAX].iter().map(|s| event_key(*s)).collect();
        keys.sort();
        let seqs: Vec<u64> = keys.iter().filter_map(|k| event_seq(k)).collect();
        assert_eq!(seqs, vec![1, 2, 256, 300, u64::MAX]);
        assert_eq!(event_seq(b"short"), None);
    }

    #[test]
    fn instance_keys_share_their_cluster_prefix() {
        let a = ClusterId::random();
        let b = ClusterId::random();
        let ka = instance_key(&a, &InstanceId::new("web-server-1-abcdef"));
        let kb = instance_key(&b, &InstanceId::new("web-server-1-abcdef"));
        assert!(ka.starts_with(&cluster_instances_prefix(&a)));
        assert!(!kb.starts_with(&cluster_instances_prefix(&a)));
    }

    #[test]
    fn operation_index_keys_sort_by_time_and_give_back_the_id() {
        let c = ClusterId::random();
        let (a, b) = (OperationId::random(), OperationId::random());
        // b was made later but its id may sort anywhere: time decides.
        let ka = cluster_op_key(&c, 200, &a);
        let kb = cluster_op_key(&c, 100, &b);
        assert!(kb < ka);
        assert_eq!(op_of_index_key(&ka), Some(a));
        assert_eq!(nanos_of_index_key(&ka, true), Some(200));
        assert_eq!(nanos_of_index_key(&op_time_key(7, &b), false), Some(7));
        assert!(step_results_key(&a, 2) < step_results_key(&a, 10));
    }

    #[test]
    fn package_keys_do_not_collide() {
        assert_ne!(package_key("a-b", "1"), package_key("a", "b1"));
        assert_ne!(package_key("ab", "1"), package_key("a", "b1"));
    }
}
