//! Dynamic users: a uid (and gid, the same number) of its own for each
//! cluster on this node whose spec names no `run_as`, from a configured
//! range (`dynamic_users`, by default systemd's `DynamicUser` range
//! 61184-65519), so one cluster's instances can neither write into another
//! cluster's directory (0750, owned by that cluster's user) nor signal its
//! processes.
//!
//! Per cluster, not per instance: a cluster's instances are one trust
//! domain (one package, one operator, one config with its secrets), and a
//! node may hold many instances of many clusters while the range is a few
//! thousand ids.
//!
//! A uid is recorded (with the instances that use it) before any instance
//! is installed as it, so a restarted agent gives the cluster the same uid
//! and re-adopts its processes as that user; it is released when the
//! cluster's last instance on this node is deleted. New uids are taken
//! going round the range from where the last one was (the cursor is
//! recorded too), so a released uid (whose files outside the instance
//! directory, in `/tmp` say, may outlive it) is given again as late as
//! possible. A uid that names a user or a group of the node, or owns a
//! running process, is never given.

use std::collections::{BTreeSet, HashMap, HashSet};

use super::super::process::users::{self, RunAs};
use crate::ids::InstanceId;
use crate::storage::agent_records::DynamicUserRecord;
use crate::storage::records::RECORD_VERSION;
use crate::storage::{AgentStore, WriteOp};

/// systemd's range for `DynamicUser=`: above the system users, below
/// `nobody` (65534); the default of the `dynamic_users` setting.
pub const DEFAULT_RANGE: (u32, u32) = (61184, 65519);

/// The dynamic users of this node.
pub struct DynamicUsers {
    range: Option<(u32, u32)>,
    state: tokio::sync::Mutex<State>,
}

#[derive(Default)]
struct State {
    by_cluster: HashMap<String, DynamicUserRecord>,
    /// Where the search for the next free uid starts.
    next: u32,
}

impl DynamicUsers {
    pub fn new(range: Option<(u32, u32)>) -> DynamicUsers {
        let next = range.map_or(0, |r| r.0);
        DynamicUsers { range, state: tokio::sync::Mutex::new(State { by_cluster: HashMap::new(), next }) }
    }

    /// Whether this node gives dynamic users at all.
    pub fn enabled(&self) -> bool {
        self.range.is_some()
    }

    /// Loads what an earlier run recorded (at boot, before any command),
    /// dropping members that have no instance record (an install cut short
    /// by the agent's end): a cluster left with none is released.
    pub async fn load(
        &self,
        store: &AgentStore,
        records: Vec<DynamicUserRecord>,
        next: Option<u32>,
        held: &HashSet<InstanceId>,
    ) -> Result<(), String> {
        let mut state = self.state.lock().await;
        if let (Some(next), Some((first, last))) = (next, self.range) {
            state.next = if (first..=last).contains(&next) { next } else { first };
        }
        let mut ops = Vec::new();
        for mut r in records {
            let before = r.members.len();
            r.members.retain(|m| held.contains(m));
            if r.members.is_empty() {
                tracing::info!(cluster = %r.cluster, uid = r.uid, "dynamic user released (no instance of its cluster is left)");
                ops.push(WriteOp::delete_dynamic_user(&r.cluster));
                continue;
            }
            if r.members.len() != before {
                ops.push(WriteOp::put_dynamic_user(&r).map_err(|e| e.to_string())?);
            }
            state.by_cluster.insert(r.cluster.clone(), r);
        }
        if !ops.is_empty() {
            store.writer().commit(ops).await.map_err(|e| format!("cannot record the dynamic users: {e}"))?;
        }
        Ok(())
    }

    /// The user `instance` of `cluster` runs as: the cluster's uid,
    /// recorded (with `instance` as a member) before this returns, and
    /// taken from the range first when the cluster has none.
    pub async fn join(&self, store: &AgentStore, cluster: &str, instance: &InstanceId) -> Result<RunAs, String> {
        let Some((first, last)) = self.range else {
            return Err("this agent gives no dynamic users (dynamic_users is empty)".into());
        };
        // Held across the write: two installs of one cluster get one uid,
        // and no two clusters get the same.
        let mut state = self.state.lock().await;
        if let Some(r) = state.by_cluster.get(cluster) {
            let uid = r.uid;
            if !r.members.contains(instance) {
                let mut r = r.clone();
                r.members.insert(instance.clone());
                let op = WriteOp::put_dynamic_user(&r).map_err(|e| e.to_string())?;
                store.writer().commit(vec![op]).await.map_err(|e| format!("cannot record the dynamic user: {e}"))?;
                state.by_cluster.insert(cluster.to_string(), r);
            }
            return Ok(users::dynamic(uid));
        }
        let taken: HashSet<u32> = state.by_cluster.values().map(|r| r.uid).collect();
        let size = last - first + 1;
        let start = state.next.clamp(first, last);
        let running = uids_running();
        let uid = (0..size)
            .map(|i| first + (start - first + i) % size)
            .find(|uid| !taken.contains(uid) && !running.contains(uid) && !known_to_the_node(*uid))
            .ok_or_else(|| {
                format!(
                    "no dynamic user is free in {first}-{last}: {} are given to clusters, the rest are users, groups or running processes of this node",
                    taken.len()
                )
            })?;
        let next = if uid == last { first } else { uid + 1 };
        let record = DynamicUserRecord {
            version: RECORD_VERSION,
            cluster: cluster.to_string(),
            uid,
            members: BTreeSet::from([instance.clone()]),
        };
        let ops = vec![
            WriteOp::put_dynamic_user(&record).map_err(|e| e.to_string())?,
            WriteOp::put_dynamic_users_next(next).map_err(|e| e.to_string())?,
        ];
        store.writer().commit(ops).await.map_err(|e| format!("cannot record the dynamic user: {e}"))?;
        tracing::info!(cluster, uid, "dynamic user given to the cluster");
        state.by_cluster.insert(cluster.to_string(), record);
        state.next = next;
        Ok(users::dynamic(uid))
    }

    /// `instance` is gone from this node: it leaves its cluster's members,
    /// and the uid is released when it was the last.
    pub async fn leave(&self, store: &AgentStore, instance: &InstanceId) -> Result<(), String> {
        let mut state = self.state.lock().await;
        let Some(cluster) = state.by_cluster.values().find(|r| r.members.contains(instance)).map(|r| r.cluster.clone())
        else {
            return Ok(());
        };
        let Some(mut r) = state.by_cluster.get(&cluster).cloned() else { return Ok(()) };
        r.members.remove(instance);
        let op = if r.members.is_empty() {
            WriteOp::delete_dynamic_user(&cluster)
        } else {
            WriteOp::put_dynamic_user(&r).map_err(|e| e.to_string())?
        };
        store.writer().commit(vec![op]).await.map_err(|e| format!("cannot record the dynamic user: {e}"))?;
        if r.members.is_empty() {
            tracing::info!(
                cluster,
                uid = r.uid,
                "dynamic user released (the cluster's last instance here was deleted)"
            );
            state.by_cluster.remove(&cluster);
        } else {
            state.by_cluster.insert(cluster, r);
        }
        Ok(())
    }

    /// The cluster holding `uid`, if any.
    pub async fn holder(&self, uid: u32) -> Option<String> {
        self.state.lock().await.by_cluster.values().find(|r| r.uid == uid).map(|r| r.cluster.clone())
    }
}

/// True when `uid` is a user or a group of the node's databases.
fn known_to_the_node(uid: u32) -> bool {
    // systemd's DynamicUser takes its uids (same default range) with a
    // lock file per uid, and they are in no database while its service is
    // stopped.
    if std::path::Path::new(SYSTEMD_DYNAMIC_UIDS).join(uid.to_string()).exists() {
        return true;
    }
    let user = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid));
    let group = nix::unistd::Group::from_gid(nix::unistd::Gid::from_raw(uid));
    // A lookup that fails is taken as "known": never risk a shared id.
    !matches!(user, Ok(None)) || !matches!(group, Ok(None))
}

/// Where systemd keeps a lock file for each uid its `DynamicUser`
/// services hold.
const SYSTEMD_DYNAMIC_UIDS: &str = "/run/systemd/dynamic-uid";

/// The uids that own a running process (`/proc/<pid>` belongs to its
/// process's uid).
fn uids_running() -> HashSet<u32> {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir("/proc") else { return HashSet::new() };
    entries
        .flatten()
        .filter(|e| e.file_name().to_str().is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit())))
        .filter_map(|e| e.metadata().ok().map(|m| m.uid()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges() {
        let cfg = |r: &str| crate::config::AgentConfig { dynamic_users: r.into(), ..Default::default() };
        assert_eq!(cfg("61184-65519").dynamic_uids().unwrap(), Some(DEFAULT_RANGE));
        assert_eq!(crate::config::AgentConfig::default().dynamic_uids().unwrap(), Some(DEFAULT_RANGE));
        assert_eq!(cfg("").dynamic_uids().unwrap(), None);
        for bad in ["1-2", "65000-64000", "60000-65534", "x-y", "61184"] {
            assert!(cfg(bad).dynamic_uids().is_err(), "{bad}");
        }
    }

    #[tokio::test]
    async fn one_uid_per_cluster_kept_across_a_restart_and_released_with_the_last_member() {
        let dir = tempfile::tempdir().unwrap();
        let id = |s: &str| InstanceId::new(s);
        let range = Some((61184, 61187));
        let (a1, a2) = {
            let store = AgentStore::open(dir.path()).unwrap();
            let users = DynamicUsers::new(range);
            users.load(&store, vec![], None, &HashSet::new()).await.unwrap();
            let a1 = users.join(&store, "cluster-a", &id("a-1")).await.unwrap();
            let a2 = users.join(&store, "cluster-a", &id("a-2")).await.unwrap();
            let b = users.join(&store, "cluster-b", &id("b-1")).await.unwrap();
            assert_eq!(a1, a2, "one cluster, one user");
            assert_ne!(a1.uid, b.uid, "two clusters share a user");
            assert_eq!((a1.gid, a1.name.as_str()), (a1.uid, format!("dynamic:{}", a1.uid).as_str()));
            (a1, a2)
        };
        // A restart: the same uid for the cluster; a member without an
        // instance record (an install cut short) is dropped, and cluster b,
        // left with none, is released.
        let store = AgentStore::open(dir.path()).unwrap();
        let snap = store.load_all().unwrap();
        let users = DynamicUsers::new(range);
        let held = HashSet::from([id("a-1"), id("a-2")]);
        users.load(&store, snap.users, snap.users_next, &held).await.unwrap();
        assert_eq!(users.join(&store, "cluster-a", &id("a-3")).await.unwrap(), a2);
        assert_eq!(users.holder(a1.uid).await.as_deref(), Some("cluster-a"));
        // The next new cluster gets the uid after the last one given, not
        // b's released one.
        let c = users.join(&store, "cluster-c", &id("c-1")).await.unwrap();
        assert!(c.uid > a1.uid + 1, "a released uid was given again at once: {}", c.uid);
        for m in ["a-1", "a-2"] {
            users.leave(&store, &id(m)).await.unwrap();
            assert_eq!(users.holder(a1.uid).await.as_deref(), Some("cluster-a"), "released with a member left");
        }
        users.leave(&store, &id("a-3")).await.unwrap();
        assert_eq!(users.holder(a1.uid).await, None, "not released with its last member");
        let snap = store.load_all().unwrap();
        assert_eq!(snap.users.iter().map(|r| r.cluster.as_str()).collect::<Vec<_>>(), vec!["cluster-c"]);
        // The range runs out: a clear refusal.
        let _ = users.join(&store, "cluster-d", &id("d-1")).await;
        let _ = users.join(&store, "cluster-e", &id("e-1")).await;
        let _ = users.join(&store, "cluster-f", &id("f-1")).await;
        let err = users.join(&store, "cluster-g", &id("g-1")).await.unwrap_err();
        assert!(err.contains("no dynamic user is free in 61184-61187"), "{err}");
    }
}
