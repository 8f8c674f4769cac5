//! Records the agent persists in its own RocksDB: one per instance it holds,
//! plus tombstones for deletes in progress (so a crash mid-delete finishes the
//! delete on restart instead of resurrecting the instance), and the restarts
//! its restart policy made recently (so an agent restart does not forget them),
//! and the dynamic users it gave to clusters (so a restarted agent gives a
//! cluster's instances the same uid and re-adopts them as that user).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::ids::InstanceId;
use crate::protocol::messages::ProcessSpec;

/// Which process the agent started, precisely enough that a recycled pid is
/// never mistaken for it: pid + start time (clock ticks since boot, field 22
/// of `/proc/<pid>/stat`) + the boot id of the kernel it ran under.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PidIdentity {
    pub pid: u32,
    pub start_time: u64,
    pub boot_id: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentInstanceRecord {
    pub version: u32,
    pub id: InstanceId,
    /// Newest generation applied; older commands are refused.
    pub generation: u64,
    /// True when the operator wants it running (never restart what the operator stopped).
    pub desired_running: bool,
    /// The user name the processes run as.
    pub run_as: String,
    pub process: ProcessSpec,
    pub package_sha256: String,
    /// sha256 (hex) of every rendered file, by relative path.
    pub file_hashes: BTreeMap<String, String>,
    /// The running process, if one was started and not yet seen to exit.
    pub pid: Option<PidIdentity>,
}

/// Marks an instance whose delete started; removed when the delete finished.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tombstone {
    pub version: u32,
    pub id: InstanceId,
    pub generation: u64,
}

/// The restarts the agent's restart policy made of one instance after
/// unexpected exits, still inside the policy's window when written: wall
/// clock (unix ms, since an `Instant` does not survive the agent), oldest
/// first. Kept under its own key (column family `restarts`), so the
/// instance records' encoding is unchanged and a store written before it
/// existed reads as "no restarts".
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestartRecord {
    pub version: u32,
    pub id: InstanceId,
    pub times_ms: Vec<u64>,
}

/// The uid (and gid, the same number) this node gave to one cluster's
/// instances, for as long as any of them is installed here (`members`);
/// released when the last one is deleted. Kept in its own column family,
/// so the instance records' encoding is unchanged.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DynamicUserRecord {
    pub version: u32,
    /// The cluster's id (`ClusterId`, as text).
    pub cluster: String,
    pub uid: u32,
    /// The instances installed, or being installed, as this user.
    pub members: std::collections::BTreeSet<InstanceId>,
}
