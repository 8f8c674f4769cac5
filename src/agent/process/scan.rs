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
use std::io::{self, Read};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::watch;

use super::identity::{Stat, parse_stat};
use super::tree::MARKER_VAR;

/// One live (non-zombie) process as a pass saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Proc {
    pub stat: Stat,
    /// The values of its `FLOTILLA_INSTANCE=` environment entries (usually
    /// none or one).
    pub markers: Markers,
}

impl Proc {
    /// True when it carries exactly `FLOTILLA_INSTANCE=<instance>`.
    pub fn marked(&self, instance: &str) -> bool {
        self.markers.iter().any(|m| &**m == instance)
    }
}

/// The marker values of one process, shared between passes.
pub(crate) type Markers = Arc<[Box<str>]>;

/// Markers of marked processes by (pid, start time), kept from one pass to
/// the next: reading every process's environment was most of a pass. Only
/// marked processes are kept. An unmarked one is read again each time,
/// because a process caught between `fork` and `exec` still shows its
/// parent's environment and gets its marker only at `exec`. A marked
/// process keeps its markers for its life even if it `exec`s with another
/// environment: it descends from the instance either way.
pub(crate) type MarkerCache = HashMap<(u32, u64), Markers>;

/// Every live process but the agent itself and pid 1, by pid.
#[derive(Debug, Default)]
pub(crate) struct Snapshot {
    pub procs: HashMap<u32, Proc>,
}

impl Snapshot {
    /// Reads `/proc` now (blocking: a few ms per thousand processes).
    pub fn take() -> io::Result<Snapshot> {
        Snapshot::take_with(&mut MarkerCache::new())
    }

    /// Reads `/proc` now, reading the environment only of processes not
    /// in `cache` (which is left holding this pass's marked processes).
    /// A process that vanishes while being read is simply not in the
    /// snapshot; any other failure (out of descriptors, say) fails the
    /// pass, because a snapshot missing a live process would let a stop
    /// conclude that nothing runs.
    pub fn take_with(cache: &mut MarkerCache) -> io::Result<Snapshot> {
        let me = std::process::id();
        let mut procs = HashMap::new();
        let mut kept = MarkerCache::with_capacity(cache.len());
        for entry in std::fs::read_dir("/proc")? {
            let Some(pid) = entry?.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
            if pid == me || pid <= 1 {
                continue;
            }
            let Some(stat) = read_stat_strict(pid)? else { continue };
            if !stat.is_running() {
                continue;
            }
            let key = (pid, stat.start_time);
            let markers = match cache.remove(&key) {
                Some(m) => m,
                None => markers(pid),
            };
            if !markers.is_empty() {
                kept.insert(key, markers.clone());
            }
            procs.insert(pid, Proc { stat, markers });
        }
        *cache = kept;
        Ok(Snapshot { procs })
    }
}

/// `/proc/<pid>/stat`: `None` when the process is gone, an error when it
/// cannot be read for another reason or does not parse.
fn read_stat_strict(pid: u32) -> io::Result<Option<Stat>> {
    let gone = |e: &io::Error| e.kind() == io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ESRCH);
    let mut buf = Vec::with_capacity(512);
    let read = std::fs::File::open(format!("/proc/{pid}/stat")).and_then(|mut f| f.read_to_end(&mut buf));
    match read {
        Ok(0) => Ok(None),
        Ok(_) => match parse_stat(&String::from_utf8_lossy(&buf)) {
            Some(stat) => Ok(Some(stat)),
            None => Err(io::Error::new(io::ErrorKind::InvalidData, format!("/proc/{pid}/stat does not parse"))),
        },
        Err(e) if gone(&e) => Ok(None),
        Err(e) => Err(io::Error::new(e.kind(), format!("reading /proc/{pid}/stat: {e}"))),
    }
}

/// The values of `pid`'s `FLOTILLA_INSTANCE=` entries (none when its
/// environment cannot be read).
fn markers(pid: u32) -> Markers {
    let mut env = Vec::with_capacity(4096);
    let read = std::fs::File::open(format!("/proc/{pid}/environ")).and_then(|mut f| f.read_to_end(&mut env));
    if read.is_err() {
        return Arc::new([]);
    }
    let prefix = format!("{MARKER_VAR}=");
    env.split(|b| *b == 0)
        .filter_map(|entry| entry.strip_prefix(prefix.as_bytes()))
        .filter_map(|value| std::str::from_utf8(value).ok())
        .map(Box::from)
        .collect()
}

/// A published pass: the snapshot, or why it could not be taken.
type Pass = Result<Arc<Snapshot>, Arc<io::Error>>;

/// Hands out fresh snapshots, one pass for all callers asking at once.
///
/// Each question takes a ticket; a pass covers every ticket taken before it
/// started and is published to all waiters at once (a `watch` channel, not
/// a lock handed from waiter to waiter: with a hundred starts waiting on a
/// busy runtime, such a hand-off chain cost more than the passes). The pass
/// runs on a blocking thread that publishes it itself, so a caller that
/// gives up never strands the others.
///
/// A pass can block: reading a process's environment takes its memory-map
/// lock, which a process stuck in the kernel (a hung network filesystem)
/// may hold for good. So a caller waits at most [`PASS_TIMEOUT`] and gets
/// an error saying so, instead of a start or stop hanging without a word.
#[derive(Debug, Clone)]
pub(crate) struct Scanner {
    inner: Arc<Inner>,
    timeout: Duration,
}

/// How long a caller waits for its pass.
const PASS_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug)]
struct Inner {
    /// Tickets handed out so far.
    asked: AtomicU64,
    /// True while a pass runs.
    running: AtomicBool,
    /// Passes run so far (the tests count them).
    passes: AtomicU64,
    /// Used by the one pass running.
    cache: std::sync::Mutex<MarkerCache>,
    /// The latest pass (or why it failed) and the last ticket it covers.
    latest: watch::Sender<Option<(u64, Pass)>>,
}

impl Default for Scanner {
    fn default() -> Self {
        let inner = Inner {
            asked: AtomicU64::new(0),
            running: AtomicBool::new(false),
            passes: AtomicU64::new(0),
            cache: Default::default(),
            latest: watch::Sender::new(None),
        };
        Scanner { inner: Arc::new(inner), timeout: PASS_TIMEOUT }
    }
}

impl Scanner {
    /// How many passes have started so far.
    pub fn passes(&self) -> u64 {
        self.inner.passes.load(Ordering::SeqCst)
    }

    /// A snapshot whose pass started after this call: what it says about
    /// any process is at least as new as the caller's question. An error
    /// when that pass could not read `/proc`.
    pub async fn fresh(&self) -> io::Result<Arc<Snapshot>> {
        match tokio::time::timeout(self.timeout, self.wait_for_pass()).await {
            Ok(pass) => pass,
            Err(_) => {
                let waited = self.timeout.as_secs_f64();
                tracing::error!(
                    waited_s = waited,
                    "no pass over /proc finished in time; a process may be stuck in the kernel"
                );
                Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "no pass over /proc finished within {waited} s (a process stuck in the kernel can block reading its environment)"
                    ),
                ))
            }
        }
    }

    async fn wait_for_pass(&self) -> io::Result<Arc<Snapshot>> {
        let inner = &self.inner;
        let mut rx = inner.latest.subscribe();
        let ticket = inner.asked.fetch_add(1, Ordering::SeqCst) + 1;
        loop {
            if let Some((covers, pass)) = &*rx.borrow_and_update()
                && *covers >= ticket
            {
                return pass.clone().map_err(|e| io::Error::new(e.kind(), e.to_string()));
            }
            // Nobody scanning: start a pass. Whoever runs one clears
            // `running` before publishing, so a waiter that saw it set is
            // woken by that publication, and one that saw it clear starts
            // the next pass itself.
            if !inner.running.swap(true, Ordering::SeqCst) {
                let covers = inner.asked.load(Ordering::SeqCst);
                // Made before the pass is handed over: if the closure never
                // runs (no thread for it, the runtime shutting down) or
                // panics, dropping it clears `running` and wakes everyone.
                let done = Done { inner: inner.clone(), armed: true };
                // Off the runtime's threads: the pass blocks on many small reads.
                drop(tokio::task::spawn_blocking(move || {
                    let pass = {
                        // Uncontended: one pass at a time.
                        let mut cache = done.inner.cache.lock().unwrap_or_else(|p| p.into_inner());
                        let began = std::time::Instant::now();
                        done.inner.passes.fetch_add(1, Ordering::SeqCst);
                        let pass = Snapshot::take_with(&mut cache);
                        let procs = pass.as_ref().map_or(0, |s| s.procs.len());
                        tracing::debug!(procs, took_us = began.elapsed().as_micros() as u64, covers, "/proc pass");
                        pass.map(Arc::new).map_err(Arc::new)
                    };
                    done.publish(covers, pass);
                }));
            }
            if rx.changed().await.is_err() {
                // Unreachable while `self` lives (it holds the sender).
                return Snapshot::take().map(Arc::new);
            }
        }
    }
}

/// The pass in flight: publishes it, or, dropped without publishing (the
/// pass never ran or panicked), clears `running` and wakes every waiter
/// (one of them starts the next pass).
struct Done {
    inner: Arc<Inner>,
    /// Cleared once published.
    armed: bool,
}

impl Done {
    fn publish(mut self, covers: u64, pass: Pass) {
        self.armed = false;
        self.inner.running.store(false, Ordering::SeqCst);
        self.inner.latest.send_if_modified(|latest| match latest {
            Some((newer, _)) if *newer >= covers => false,
            _ => {
                *latest = Some((covers, pass));
                true
            }
        });
    }
}

impl Drop for Done {
    fn drop(&mut self) {
        if self.armed {
            self.inner.running.store(false, Ordering::SeqCst);
            self.inner.latest.send_modify(|_| {});
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::time::Instant;

    #[tokio::test]
    async fn a_snapshot_is_never_older_than_the_question() {
        let scanner = Scanner::default();
        let first = scanner.fresh().await.unwrap();
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
            let snap = scanner.fresh().await.unwrap();
            if snap.procs.get(&pid).is_some_and(|p| p.marked("scan-unit")) {
                break;
            }
            assert!(Instant::now() < deadline, "the child never showed with its marker");
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        child.kill().await.unwrap();
        child.wait().await.unwrap();
        let after = scanner.fresh().await.unwrap();
        assert!(!after.procs.contains_key(&pid), "a reaped process is gone from a pass asked for afterwards");
        assert!(!after.procs.contains_key(&std::process::id()), "the agent itself is never listed");
    }

    #[tokio::test]
    // Holding the lock across the await is the point: the pass (on a
    // blocking thread) waits for it, as one stuck in the kernel would.
    #[allow(clippy::await_holding_lock)]
    async fn a_stuck_pass_is_an_error_in_time_and_the_next_one_runs() {
        let scanner = Scanner { timeout: Duration::from_millis(200), ..Scanner::default() };
        // The pass takes this lock first: held here, the pass is stuck.
        let held = scanner.inner.cache.lock().unwrap();
        let asked = Instant::now();
        let err = scanner.fresh().await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut, "{err}");
        assert!(asked.elapsed() < Duration::from_secs(5), "gave up after {:?}", asked.elapsed());
        assert!(err.to_string().contains("/proc"), "{err}");
        drop(held);
        // Unstuck: the pass finishes and later callers are answered.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match scanner.fresh().await {
                Ok(snap) => {
                    assert!(!snap.procs.is_empty());
                    break;
                }
                Err(e) => assert!(Instant::now() < deadline, "no pass after the lock was released: {e}"),
            }
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn callers_asking_together_share_passes() {
        let scanner = Arc::new(Scanner::default());
        let tasks: Vec<_> = (0..32)
            .map(|_| {
                let s = scanner.clone();
                tokio::spawn(async move { s.fresh().await.unwrap() })
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
