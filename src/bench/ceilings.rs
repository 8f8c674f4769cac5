//! The machine's ceilings, measured in the same run as the figures they
//! judge (the machine is shared and noisy): how many synced writes one
//! writer gets per second in the master's data dir, and how many processes
//! can be spawned and waited for per second.

use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::ids::{ClusterId, InstanceId, NodeId};
use crate::storage::records::{Applied, DesiredState, InstanceRecord, InstanceStatus, PendingRestart, RECORD_VERSION};
use crate::storage::{MasterStore, WriteOp, events};

/// 4 KiB written at offset 0 and `fdatasync`ed, repeatedly, for `dur`:
/// syncs per second. One writer, as the master's store has one.
pub fn fdatasync_per_s(dir: &Path, dur: Duration) -> std::io::Result<f64> {
    let path = dir.join(".fdatasync-probe");
    let mut f = std::fs::OpenOptions::new().create(true).truncate(true).read(true).write(true).open(&path)?;
    f.write_all(&[0u8; 4096])?;
    f.sync_all()?;
    let buf = [7u8; 4096];
    let started = Instant::now();
    let mut n = 0u64;
    while started.elapsed() < dur {
        f.write_all_at(&buf, 0)?;
        f.sync_data()?;
        n += 1;
    }
    let rate = n as f64 / started.elapsed().as_secs_f64();
    drop(f);
    let _ = std::fs::remove_file(&path);
    Ok(rate)
}

/// Durable instance transitions the master's store alone takes per
/// second: `committers` tasks each commit, one after another, what one
/// transition writes (an instance's record and its `instance.status`
/// event, through the store's group-commit writer), for `dur`, in a fresh
/// store under `dir` (removed after). B2's numerator without the rest of
/// the master: what the store would take if actors, links and agents cost
/// nothing.
pub async fn store_transitions_per_s(dir: &Path, dur: Duration, committers: usize) -> Result<f64, String> {
    let path = dir.join("store-probe");
    // Removed on every path, after the store (dropped first) has closed;
    // a leftover of a run that was killed is the bench's own, not reused.
    let _cleanup = RemoveOnDrop(path.clone());
    let _ = std::fs::remove_dir_all(&path);
    let store = MasterStore::open(&path).map_err(|e| format!("opening {}: {e}", path.display()))?;
    let writer = store.writer().clone();
    let done = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let deadline = started + dur;
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..committers as u32 {
        let (writer, done) = (writer.clone(), done.clone());
        let mut record = probe_record(i);
        tasks.spawn(async move {
            while Instant::now() < deadline {
                record.generation += 1;
                record.status = if record.generation.is_multiple_of(2) {
                    InstanceStatus::Starting
                } else {
                    InstanceStatus::Running
                };
                let put = WriteOp::put_instance(&record).map_err(|e| e.to_string())?;
                let event = events::append(&events::instance("instance.status", &record)).map_err(|e| e.to_string())?;
                writer.commit(vec![put, event]).await.map_err(|e| e.to_string())?;
                done.fetch_add(1, Ordering::Relaxed);
            }
            Ok::<(), String>(())
        });
    }
    while let Some(res) = tasks.join_next().await {
        if let Err(e) = res.map_err(|e| e.to_string()).and_then(|r| r) {
            // The others stop committing before the store goes.
            tasks.shutdown().await;
            return Err(format!("store probe: {e}"));
        }
    }
    let (acked, durable) = (done.load(Ordering::Relaxed), writer.commits_written());
    let rate = acked as f64 / started.elapsed().as_secs_f64();
    if acked != durable {
        return Err(format!("store probe: {acked} commits acknowledged, the writer made {durable} durable"));
    }
    drop(writer);
    drop(store);
    std::fs::remove_dir_all(&path).map_err(|e| format!("removing {}: {e}", path.display()))?;
    Ok(rate)
}

/// Removes a directory when dropped (whatever path the probe returns by).
struct RemoveOnDrop(std::path::PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// An instance record of the bench's size (its role, ports and directory).
fn probe_record(i: u32) -> InstanceRecord {
    let cluster_id = ClusterId::random();
    InstanceRecord {
        version: RECORD_VERSION,
        id: InstanceId::generate("probe", &cluster_id, "d", i),
        cluster_id,
        cluster: "probe".into(),
        role: "d".into(),
        ordinal: i,
        node: NodeId::new(format!("sim-{}", i % 1000)),
        host: "127.0.0.1".into(),
        ports: [("p".to_string(), 20000 + (i % 40000) as u16)].into_iter().collect(),
        status: InstanceStatus::Running,
        desired: DesiredState::Running,
        pid: Some(1000 + i),
        generation: 0,
        dir: format!("/var/lib/flotilla/instances/probe-d-{i}").into(),
        last_error: None,
        applied: Some(Arc::new(Applied { package_version: "1.0.0".into(), limits: None })),
        pending_restart: PendingRestart::No,
    }
}

/// `/bin/true` spawned (fork + exec) and waited for, repeatedly, for
/// `dur`: processes per second.
pub fn spawn_per_s(dur: Duration) -> std::io::Result<f64> {
    let started = Instant::now();
    let mut n = 0u64;
    while started.elapsed() < dur {
        std::process::Command::new("/bin/true").status()?;
        n += 1;
    }
    Ok(n as f64 / started.elapsed().as_secs_f64())
}

/// A process's resident memory (MiB) and CPU time (seconds), from `/proc`.
pub fn proc_usage(pid: u32) -> Option<(f64, f64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let rss_kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command (which may contain spaces) start at ')'.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    let ticks = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok().flatten().unwrap_or(100) as f64;
    Some((rss_kb / 1024.0, (utime + stime) / ticks))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The probe counts commits its writer made durable, and leaves nothing.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_store_probe_counts_durable_commits_and_cleans_up() {
        let dir = tempfile::tempdir().unwrap();
        let rate = store_transitions_per_s(dir.path(), Duration::from_millis(200), 16).await.unwrap();
        assert!(rate > 0.0, "{rate}");
        assert!(!dir.path().join("store-probe").exists(), "the probe's store is removed");
    }

    #[test]
    fn ceilings_are_positive_and_usage_reads_our_own_process() {
        let dir = tempfile::tempdir().unwrap();
        assert!(fdatasync_per_s(dir.path(), Duration::from_millis(50)).unwrap() > 0.0);
        assert!(spawn_per_s(Duration::from_millis(50)).unwrap() > 0.0);
        let (rss, cpu) = proc_usage(std::process::id()).unwrap();
        assert!(rss > 1.0, "{rss} MiB");
        assert!(cpu >= 0.0);
    }
}
