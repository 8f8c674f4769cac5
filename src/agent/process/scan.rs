//! One pass over `/proc`, shared by every caller that needs one at the same
//! time.
//!
//! Finding an instance's processes means reading the stat and environment
//! of every process on the machine ([`super::tree`]). With a thousand
//! instances on a node that is thousands of files per pass, and a scale-in
//! stops hundreds of instances at once, each asking several times: one pass
//! per question made a 1,000-instance scale-in take 18 s (quadratic in the
//! node's size). [`Scanner::fresh`] hands every caller a snapshot taken
//! after it asked (so "gone" is never stale), and callers asking while a
//! pass runs share the next one: a burst of N stops costs two passes, not N.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::Mutex;
use tokio::time::Instant;

use super::identity::{Stat, read_stat};
use super::tree::MARKER_VAR;

/// One live (non-zombie) process as a pass saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Proc {
    pub stat: Stat,
    /// The values of its `FLOTILLA_INSTANCE=` environment entries (usually
    /// none or one).
    pub markers: Vec<Box<str>>,
}

impl Proc {
    /// True when it carries exactly `FLOTILLA_INSTANCE=<instance>`.
    pub fn marked(&self, instance: &str) -> bool {
        self.markers.iter().any(|m| &**m == instance)
    }
}

/// Every live process but the agent itself and pid 1, by pid.
#[derive(Debug, Default)]
pub(crate) struct Snapshot {
    pub procs: HashMap<u32, Proc>,
}

impl Snapshot {
    /// Reads `/proc` now (blocking: a few ms per thousand processes).
    pub fn take() -> Snapshot {
        let me = std::process::id();
        let Ok(dir) = std::fs::read_dir("/proc") else { return Snapshot::default() };
        let mut procs = HashMap::new();
        for pid in dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok()) {
            if pid == me || pid <= 1 {
                continue;
            }
            let Some(stat) = read_stat(pid) else { continue };
            if !stat.is_running() {
                continue;
            }
            procs.insert(pid, Proc { stat, markers: markers(pid) });
        }
        Snapshot { procs }
    }
}

/// The values of `pid`'s `FLOTILLA_INSTANCE=` entries (none when its
/// environment cannot be read).
fn markers(pid: u32) -> Vec<Box<str>> {
    use std::io::Read;
    let mut env = Vec::with_capacity(4096);
    let read = std::fs::File::open(format!("/proc/{pid}/environ")).and_then(|mut f| f.read_to_end(&mut env));
    if read.is_err() {
        return Vec::new();
    }
    let prefix = format!("{MARKER_VAR}=");
    env.split(|b| *b == 0)
        .filter_map(|entry| entry.strip_prefix(prefix.as_bytes()))
        .filter_map(|value| std::str::from_utf8(value).ok())
        .map(Box::from)
        .collect()
}

/// Hands out fresh snapshots, one pass for all callers asking at once.
#[derive(Debug, Default)]
pub(crate) struct Scanner {
    /// The latest pass and when it started; held while a pass runs, so
    /// callers queue (fairly) behind it.
    latest: Mutex<Option<(Instant, Arc<Snapshot>)>>,
}

impl Scanner {
    /// A snapshot whose pass started after this call: what it says about
    /// any process is at least as new as the caller's question.
    pub async fn fresh(&self) -> Arc<Snapshot> {
        let asked = Instant::now();
        let mut latest = self.latest.lock().await;
        if let Some((started, snap)) = &*latest
            && *started >= asked
        {
            return snap.clone();
        }
        let started = Instant::now();
        // Off the runtime's threads: the pass blocks on many small reads.
        let snap = match tokio::task::spawn_blocking(Snapshot::take).await {
            Ok(s) => Arc::new(s),
            // Only when the runtime is shutting down: read inline.
            Err(_) => Arc::new(Snapshot::take()),
        };
        *latest = Some((started, snap.clone()));
        snap
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_snapshot_is_never_older_than_the_question() {
        let scanner = Scanner::default();
        let first = scanner.fresh().await;
        let mut child = tokio::process::Command::new("sleep")
            .arg("1000")
            .env(MARKER_VAR, "scan-unit")
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let pid = child.id().unwrap();
        assert!(!first.procs.contains_key(&pid), "a process started after the pass is not in it");
        // Asked after the spawn: the answer must see it (exec may still be
        // under way, so wait for the marker to show in its environment).
        let deadline = Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let snap = scanner.fresh().await;
            if snap.procs.get(&pid).is_some_and(|p| p.marked("scan-unit")) {
                break;
            }
            assert!(Instant::now() < deadline, "the child never showed with its marker");
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        child.kill().await.unwrap();
        child.wait().await.unwrap();
        let after = scanner.fresh().await;
        assert!(!after.procs.contains_key(&pid), "a reaped process is gone from a pass asked for afterwards");
        assert!(!after.procs.contains_key(&std::process::id()), "the agent itself is never listed");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn callers_asking_together_share_passes() {
        let scanner = Arc::new(Scanner::default());
        let tasks: Vec<_> = (0..32)
            .map(|_| {
                let s = scanner.clone();
                tokio::spawn(async move { s.fresh().await })
            })
            .collect();
        let mut snaps = Vec::new();
        for t in tasks {
            snaps.push(t.await.unwrap());
        }
        // All kept alive, so distinct passes have distinct addresses.
        let passes: std::collections::HashSet<*const Snapshot> = snaps.iter().map(Arc::as_ptr).collect();
        // 32 concurrent callers: far fewer passes than callers (one per
        // caller without sharing). Timing decides the exact count.
        assert!(passes.len() < 32, "32 callers took {} passes", passes.len());
    }
}
