//! The processes of a network namespace, found through `/proc` (what `ip
//! netns pids` does): a process is in namespace `ns` when the inode of its
//! `/proc/PID/ns/net` is that of `/run/netns/{ns}`. The local driver only
//! ever signals such processes: the namespace is its own.

use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use super::driver::DriverError;

/// Where `ip netns add` puts its namespaces.
pub(super) const NETNS_DIR: &str = "/run/netns";
/// How long after SIGKILL the processes get to vanish before delete fails.
const KILL_WAIT: Duration = Duration::from_secs(5);

/// A namespace's nsfs inode, as `stat` shows it for `/run/netns/{ns}` and
/// for `/proc/PID/ns/net` of every process in it.
pub(super) type NsInode = (u64, u64);

/// The nsfs inode of the namespace `ns`, `None` when it does not exist.
pub(super) fn ns_inode(ns: &str) -> Result<Option<NsInode>, DriverError> {
    let path = Path::new(NETNS_DIR).join(ns);
    match fs::metadata(&path) {
        Ok(m) => Ok(Some((m.dev(), m.ino()))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(fs_error("stat", &path, e)),
    }
}

/// Every process with its network namespace, from `/proc` (as `ip netns
/// pids` finds them). Processes gone meanwhile, and zombies (which have no
/// namespace left), are skipped.
pub(super) fn processes() -> Result<Vec<(i32, NsInode)>, DriverError> {
    let entries = fs::read_dir("/proc").map_err(|e| DriverError::transient(format!("cannot read /proc: {e}")))?;
    let mut found = Vec::new();
    for entry in entries.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else { continue };
        if let Some(inode) = net_of(pid) {
            found.push((pid, inode));
        }
    }
    Ok(found)
}

pub(super) fn net_of(pid: i32) -> Option<NsInode> {
    fs::metadata(format!("/proc/{pid}/ns/net")).ok().map(|m| (m.dev(), m.ino()))
}

pub(super) fn pids_in(ns: NsInode) -> Result<Vec<i32>, DriverError> {
    Ok(processes()?.into_iter().filter(|(_, i)| *i == ns).map(|(p, _)| p).collect())
}

/// Signals `pid` if it is (still) in the namespace `ns`: never a process
/// of anyone else. The check and the signal are two steps, as with `ip
/// netns pids` and `kill`; a pid is only reused after the pid space wraps.
pub(super) fn signal_in(ns: NsInode, pid: i32, sig: Signal) {
    if net_of(pid) == Some(ns) {
        let _ = kill(Pid::from_raw(pid), sig);
    }
}

/// SIGTERM to every process in `ns`, up to `grace` for them to exit, then
/// SIGKILL to what is left; an error when some outlive that too.
pub(super) fn stop_processes(ns: NsInode, grace: Duration) -> Result<(), DriverError> {
    let wait_empty = |limit: Duration| -> Result<Vec<i32>, DriverError> {
        let deadline = Instant::now() + limit;
        loop {
            let left = pids_in(ns)?;
            if left.is_empty() || Instant::now() >= deadline {
                return Ok(left);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let mut left = pids_in(ns)?;
    if !grace.is_zero() && !left.is_empty() {
        left.iter().for_each(|p| signal_in(ns, *p, Signal::SIGTERM));
        left = wait_empty(grace)?;
    }
    if left.is_empty() {
        return Ok(());
    }
    left.iter().for_each(|p| signal_in(ns, *p, Signal::SIGKILL));
    let left = wait_empty(KILL_WAIT)?;
    if left.is_empty() {
        Ok(())
    } else {
        Err(DriverError::transient(format!("processes {left:?} outlived SIGKILL in the namespace")))
    }
}

pub(super) fn fs_error(what: &str, path: &Path, e: io::Error) -> DriverError {
    DriverError::transient(format!("cannot {what} {}: {e}", path.display()))
}
