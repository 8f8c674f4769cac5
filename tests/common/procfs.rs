//! What the kernel says about processes, read from `/proc`: the tests check
//! the real processes, not only what the API claims about them.

use std::path::Path;

pub fn all_pids() -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect()
}

/// The state letter of `/proc/<pid>/stat` (after the parenthesized name).
fn state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// True when `pid` exists and is not a zombie.
pub fn pid_alive(pid: u32) -> bool {
    matches!(state(pid), Some(s) if s != 'Z' && s != 'X')
}

/// The real uid of `pid`.
pub fn proc_uid(pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// The uids a root agent gives its clusters' dynamic users (the default
/// `dynamic_users` setting): an instance whose spec names no user runs as
/// one of these, one per cluster.
pub const DYNAMIC_UIDS: std::ops::RangeInclusive<u32> = 61184..=65519;

/// The uid `pid` runs as, checked to be a dynamic user's.
pub fn dynamic_uid(pid: u32) -> u32 {
    let uid = proc_uid(pid).unwrap_or_else(|| panic!("no uid for pid {pid}"));
    assert!(DYNAMIC_UIDS.contains(&uid), "pid {pid} runs as uid {uid}, not a dynamic user's");
    uid
}

/// Every live process whose environment holds exactly
/// `FLOTILLA_INSTANCE=<instance>`, sorted.
pub fn instance_pids(instance: &str) -> Vec<u32> {
    let marker = format!("FLOTILLA_INSTANCE={instance}").into_bytes();
    let mut pids: Vec<u32> = all_pids()
        .into_iter()
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .map(|env| env.split(|b| *b == 0).any(|e| e == marker.as_slice()))
                .unwrap_or(false)
        })
        .filter(|pid| pid_alive(*pid))
        .collect();
    pids.sort_unstable();
    pids
}

/// The argv of `pid` (empty when it is gone).
pub fn cmdline(pid: u32) -> Vec<String> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    raw.split(|b| *b == 0).filter(|a| !a.is_empty()).map(|a| String::from_utf8_lossy(a).into_owned()).collect()
}

/// Live processes whose working directory is inside `root`.
pub fn pids_with_cwd_under(root: &Path) -> Vec<u32> {
    all_pids()
        .into_iter()
        .filter(|pid| std::fs::read_link(format!("/proc/{pid}/cwd")).map(|cwd| cwd.starts_with(root)).unwrap_or(false))
        .filter(|pid| pid_alive(*pid))
        .collect()
}

/// Polls `cond` every 50 ms for up to `secs` seconds; true once it holds.
pub async fn eventually(secs: u64, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    loop {
        if cond() {
            return true;
        }
        if std::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// Every live process started for an instance, by the instance id in its
/// `FLOTILLA_INSTANCE` environment variable: one pass over `/proc`.
pub fn pids_by_instance() -> std::collections::BTreeMap<String, Vec<u32>> {
    let mut out: std::collections::BTreeMap<String, Vec<u32>> = Default::default();
    for pid in all_pids().into_iter().filter(|p| pid_alive(*p)) {
        let Ok(env) = std::fs::read(format!("/proc/{pid}/environ")) else { continue };
        if let Some(id) = env.split(|b| *b == 0).find_map(|e| e.strip_prefix(b"FLOTILLA_INSTANCE=")) {
            out.entry(String::from_utf8_lossy(id).into_owned()).or_default().push(pid);
        }
    }
    out
}
