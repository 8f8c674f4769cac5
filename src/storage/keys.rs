//! Column family names, key layouts and the typed write builders.
//!
//! Keys are chosen so that the iteration order RocksDB gives for free is the
//! order callers want:
//!
//! - clusters, operations: the 16 uuid bytes;
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

use crate::ids::{ClusterId, InstanceId};
use crate::storage::agent_records::{AgentInstanceRecord, Tombstone};
use crate::storage::records::{
    ClusterRecord, EventRecord, InstanceRecord, LeftoverRecord, NodeRecord, OperationRecord, PackageRecord,
};
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
    pub const ALL: [&str; 8] = [CLUSTERS, INSTANCES, NODES, PACKAGES, OPERATIONS, EVENTS, META, LEFTOVERS];
}

/// The agent database's column families.
pub mod agent_cf {
    pub const INSTANCES: &str = "instances";
    pub const TOMBSTONES: &str = "tombstones";
    pub const META: &str = "meta";
    pub const ALL: [&str; 3] = [INSTANCES, TOMBSTONES, META];
}

/// The key in `meta` holding the schema version (a codec-encoded `u32`).
pub const SCHEMA_VERSION_KEY: &[u8] = b"schema_version";

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

    pub fn put_package(r: &PackageRecord) -> Result<WriteOp, StorageError> {
        put(master_cf::PACKAGES, package_key(&r.name, &r.package_version), r)
    }

    pub fn delete_package(name: &str, version: &str) -> WriteOp {
        WriteOp::Delete { cf: master_cf::PACKAGES, key: package_key(name, version) }
    }

    pub fn put_operation(r: &OperationRecord) -> Result<WriteOp, StorageError> {
        put(master_cf::OPERATIONS, r.id.0.as_bytes().to_vec(), r)
    }

    pub fn put_event(r: &EventRecord) -> Result<WriteOp, StorageError> {
        put(master_cf::EVENTS, event_key(r.seq), r)
    }

    pub fn put_leftover(r: &LeftoverRecord) -> Result<WriteOp, StorageError> {
        put(master_cf::LEFTOVERS, r.instance.as_str().as_bytes().to_vec(), r)
    }

    pub fn delete_leftover(id: &InstanceId) -> WriteOp {
        WriteOp::Delete { cf: master_cf::LEFTOVERS, key: id.as_str().as_bytes().to_vec() }
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
    fn package_keys_do_not_collide() {
        assert_ne!(package_key("a-b", "1"), package_key("a", "b1"));
        assert_ne!(package_key("ab", "1"), package_key("a", "b1"));
    }
}
