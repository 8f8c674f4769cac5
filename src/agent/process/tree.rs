//! Finding every process of an instance by scanning `/proc`, without trusting
//! a bare pid.
//!
//! Every process the agent spawns for an instance gets its own process group
//! and the environment entry `FLOTILLA_INSTANCE=<instance id>`, which its
//! descendants inherit. A process belongs to the instance when it is in the
//! instance's cgroup, carries that exact entry (this catches a daemon that
//! called `setsid`), is a known process identity of the instance, or is in the
//! process group of one of those (catching a child that cleared its
//! environment). This is the whole tree where there is no cgroup, and a
//! belt-and-braces check where there is one.

use std::collections::HashSet;
use std::io;
use std::path::Path;

use nix::errno::Errno;
use nix::sys::signal::{Signal, kill};
use nix::unistd::{Pid, getpgrp};

use super::cgroup;
use super::identity::{matches_stat, read_stat};
use super::scan::{Proc, Snapshot};
use crate::ids::InstanceId;
use crate::storage::agent_records::PidIdentity;

/// The environment variable marking an instance's processes.
pub const MARKER_VAR: &str = "FLOTILLA_INSTANCE";

/// One live process of an instance: pid + start time, so a signal never hits
/// a pid that was recycled after the scan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Member {
    pub pid: u32,
    pub start_time: u64,
}

/// The exact `environ` entry of the instance's processes.
pub fn marker(instance: &InstanceId) -> Vec<u8> {
    format!("{MARKER_VAR}={}", instance.as_str()).into_bytes()
}

/// True when `/proc/<pid>/environ` holds exactly the entry `marker`.
pub fn has_marker(pid: u32, marker: &[u8]) -> bool {
    match std::fs::read(format!("/proc/{pid}/environ")) {
        Ok(env) => env.split(|b| *b == 0).any(|entry| entry == marker),
        Err(_) => false,
    }
}

fn all_pids() -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect()
}

/// Every live (non-zombie) process of the instance, from a pass over
/// `/proc` taken now. The agent's hot paths use
/// [`super::ProcessController::members`], which shares passes.
pub fn collect(instance: &InstanceId, known: &[PidIdentity], cgroup_path: Option<&Path>) -> io::Result<Vec<Member>> {
    Ok(collect_in(&Snapshot::take()?, instance, known, cgroup_path))
}

/// Every process of the instance in `snap`. `known` are identities the
/// agent knows belong to it (the main process); `cgroup` its cgroup.
pub(crate) fn collect_in(
    snap: &Snapshot,
    instance: &InstanceId,
    known: &[PidIdentity],
    cgroup_path: Option<&Path>,
) -> Vec<Member> {
    let my_group = getpgrp().as_raw();
    let in_cgroup: HashSet<u32> = cgroup_path.map(cgroup::procs).unwrap_or_default().into_iter().collect();
    let is_root = |pid: u32, p: &Proc| {
        in_cgroup.contains(&pid)
            || known.iter().any(|k| k.pid == pid && k.start_time == p.stat.start_time)
            || p.marked(instance.as_str())
    };
    // Groups of the roots, unless led by a process that is not ours (a
    // group id is a pid: its leader, if alive, must be one of the roots).
    let groups: HashSet<i32> = snap
        .procs
        .iter()
        .filter(|(pid, p)| is_root(**pid, p))
        .map(|(_, p)| p.stat.pgid)
        .filter(|g| *g > 1 && *g != my_group)
        .filter(|g| match u32::try_from(*g).ok().and_then(|g| snap.procs.get(&g).map(|p| (g, p))) {
            Some((leader, p)) => is_root(leader, p),
            None => true,
        })
        .collect();
    let mut out: Vec<Member> = snap
        .procs
        .iter()
        .filter(|(pid, p)| is_root(**pid, p) || groups.contains(&p.stat.pgid))
        .map(|(pid, p)| Member { pid: *pid, start_time: p.stat.start_time })
        .collect();
    out.sort();
    out
}

/// The live (non-zombie) processes of process group `pgid`.
pub fn group_members(pgid: i32) -> Vec<u32> {
    all_pids().into_iter().filter(|pid| read_stat(*pid).is_some_and(|s| s.is_running() && s.pgid == pgid)).collect()
}

/// Sends `sig` to each member that is still the same process. Returns how
/// many were signalled. A process gone meanwhile (`ESRCH`) is fine.
pub fn signal(members: &[Member], sig: Signal) -> usize {
    let mut n = 0;
    for m in members {
        if !matches_stat(m.pid, m.start_time) {
            continue;
        }
        let Ok(raw) = i32::try_from(m.pid) else { continue };
        match kill(Pid::from_raw(raw), sig) {
            Ok(()) => n += 1,
            Err(Errno::ESRCH) => {}
            Err(e) => tracing::warn!(pid = m.pid, signal = %sig, error = %e, "cannot signal process"),
        }
    }
    n
}

/// True when `pid` belongs to the instance's tree: in its cgroup, in the
/// process group `pgid` the agent created, or carrying the marker.
pub fn belongs(instance: &InstanceId, pid: u32, cgroup_path: Option<&Path>, pgid: Option<u32>) -> bool {
    let Some(stat) = read_stat(pid) else { return false };
    if !stat.is_running() {
        return false;
    }
    if cgroup_path.is_some_and(|p| cgroup::procs(p).contains(&pid)) {
        return true;
    }
    if pgid.is_some_and(|g| i32::try_from(g).is_ok_and(|g| g == stat.pgid)) {
        return true;
    }
    has_marker(pid, &marker(instance))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn finds_marked_processes_and_their_groups_only() {
        // Unique per test process: several test binaries may run at once.
        let id = InstanceId::new(format!("tree-unit-{}", std::process::id()));
        let other = InstanceId::new(format!("tree-unit-{}-2", std::process::id()));
        let sleeper = |program: &str| {
            let mut c = tokio::process::Command::new(program);
            c.arg("1000").stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null()).kill_on_drop(true);
            c
        };
        let mut ours = sleeper("sleep").env(MARKER_VAR, id.as_str()).process_group(0).spawn().unwrap();
        // Same group as `ours`, environment cleared: found through the group.
        let mut bare = sleeper("/bin/sleep")
            .env_clear()
            .process_group(i32::try_from(ours.id().unwrap()).unwrap())
            .spawn()
            .unwrap();
        let mut theirs = sleeper("sleep").env(MARKER_VAR, other.as_str()).process_group(0).spawn().unwrap();
        let (a, b, c) = (ours.id().unwrap(), bare.id().unwrap(), theirs.id().unwrap());
        let found: Vec<u32> = collect(&id, &[], None).unwrap().iter().map(|m| m.pid).collect();
        assert_eq!(found, {
            let mut v = vec![a, b];
            v.sort();
            v
        });
        assert!(belongs(&id, b, None, Some(a)));
        assert!(!belongs(&id, c, None, Some(a)));
        assert!(!belongs(&id, std::process::id(), None, None));
        let members = collect(&id, &[], None).unwrap();
        assert_eq!(signal(&members, Signal::SIGKILL), 2);
        ours.wait().await.unwrap();
        bare.wait().await.unwrap();
        assert!(collect(&id, &[], None).unwrap().is_empty());
        assert_eq!(collect(&other, &[], None).unwrap().iter().map(|m| m.pid).collect::<Vec<_>>(), vec![c]);
        theirs.kill().await.unwrap();
    }

    #[test]
    fn a_stale_member_is_not_signalled() {
        let me = read_stat(std::process::id()).unwrap();
        let stale = Member { pid: std::process::id(), start_time: me.start_time + 7 };
        assert_eq!(signal(&[stale], Signal::SIGTERM), 0);
    }
}
