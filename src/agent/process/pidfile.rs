//! Waiting for a daemon's pidfile: inotify on its directory (a non-blocking
//! fd driven by tokio's `AsyncFd`), with polling on a fast backoff (from 5 ms)
//! as the fallback and safety net, until a deadline.
//!
//! The pidfile lives in a directory the run-as user controls, so its
//! directory is opened beneath the instance directory without following a
//! link (`agent::beneath`), the stale one is removed relative to that fd,
//! inotify watches that very directory (through `/proc/self/fd`), and the
//! file is read non-blocking, only when it is a regular file of the
//! instance's user, at most a few bytes, its content never echoed.

use std::ffi::OsString;
use std::io::{self, Read};
use std::os::fd::AsRawFd;
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
use nix::unistd::UnlinkatFlags;

use super::ProcessError;
use super::sys::{AsyncInotify, async_inotify};
use super::users::RunAs;
use crate::agent::beneath::{BeneathError, Dir, Expect, RelPath};
use tokio::time::Instant;

const FIRST_BACKOFF: Duration = Duration::from_millis(5);
/// Polling cap without inotify, and with it (then polling is only a net).
const MAX_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF_WITH_INOTIFY: Duration = Duration::from_millis(250);
/// A pidfile is a decimal number; anything longer is not one.
const MAX_PIDFILE_BYTES: u64 = 64;

/// How waiting for the pidfile ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// A running process named in the pidfile.
    Pid(u32),
    /// No pidfile by the deadline.
    Missing,
    /// A pidfile that does not name a running process.
    Invalid(String),
}

/// Checks a pidfile path from a spec: relative, no `..`, not empty.
pub fn check_relative(path: &str) -> Result<(), String> {
    let p = Path::new(path);
    if path.is_empty() || p.is_absolute() {
        return Err("must be a non-empty path relative to the instance directory".into());
    }
    if p.components().any(|c| !matches!(c, Component::Normal(_) | Component::CurDir)) {
        return Err("must not contain '..'".into());
    }
    Ok(())
}

/// A daemon's pidfile: its directory, opened beneath the instance
/// directory (and made when missing), and its name there.
pub struct Pidfile {
    dir: Dir,
    name: RelPath,
    /// The instance directory's owner: the only user whose pidfile counts.
    owner: u32,
    /// The path, for messages.
    pub path: PathBuf,
}

impl Pidfile {
    /// Opens the directory of `rel` (relative to `instance_dir`), creating
    /// what is missing for `run_as`, never through a link.
    pub fn open(instance_dir: &Path, rel: &str, run_as: &RunAs) -> Result<Pidfile, ProcessError> {
        let shown = instance_dir.join(rel);
        let beneath = |e: BeneathError| ProcessError::PidfileInvalid {
            path: shown.clone(),
            reason: crate::error::ErrorChain(&e).to_string(),
        };
        let root = Dir::open(instance_dir).map_err(beneath)?;
        let owner = root.owner().map_err(beneath)?;
        let rel = RelPath::parse(rel).map_err(beneath)?;
        let (parents, name): (Vec<OsString>, OsString) = match rel.parts().split_last() {
            Some((name, parents)) => (parents.to_vec(), name.clone()),
            None => {
                return Err(beneath(BeneathError::BadPath { path: rel.as_str().into(), reason: "not a file path" }));
            }
        };
        let chown = run_as.needs_switch().then_some((run_as.uid, run_as.gid));
        let dir = match root.ensure_dirs(&parents, 0o750, chown).map_err(beneath)? {
            Some(dir) => dir,
            None => root,
        };
        let name = RelPath::name(&name.to_string_lossy()).map_err(beneath)?;
        Ok(Pidfile { dir, name, owner, path: shown })
    }

    /// Removes a pidfile left from an earlier run, so it is not mistaken
    /// for this one's (the name itself, whatever it is: a link is removed,
    /// not followed).
    pub fn remove_stale(&self) -> Result<(), ProcessError> {
        match nix::unistd::unlinkat(self.dir.fd(), self.name.as_str(), UnlinkatFlags::NoRemoveDir) {
            Ok(()) | Err(Errno::ENOENT) => Ok(()),
            Err(e) => Err(ProcessError::io(format!("removing the stale pidfile {}", self.path.display()), e.into())),
        }
    }

    /// What the pidfile says right now: `Ok(None)` when it does not
    /// exist, `Err(reason)` when it holds no pid.
    pub fn read(&self) -> Result<Option<u32>, String> {
        let expect = Expect { owner: Some(self.owner), single_link: false };
        let file = match self.dir.open_read(&self.name, expect) {
            Ok(f) => f,
            Err(e) if e.is_not_found() => return Ok(None),
            Err(BeneathError::Symlink { .. }) => return Err("is a symbolic link".into()),
            Err(BeneathError::NotRegular { kind, .. }) => return Err(format!("is {kind}, not a regular file")),
            Err(BeneathError::ForeignOwner { uid, want, .. }) => {
                return Err(format!("belongs to uid {uid}, not to the instance's user (uid {want})"));
            }
            Err(e) => return Err(format!("cannot be read: {}", crate::error::ErrorChain(&e))),
        };
        let mut text = String::new();
        file.take(MAX_PIDFILE_BYTES).read_to_string(&mut text).map_err(|_| "is not text".to_string())?;
        parse_pid(&text)
    }
}

fn parse_pid(text: &str) -> Result<Option<u32>, String> {
    match text.trim().parse::<u32>() {
        Ok(pid) if pid > 1 => Ok(Some(pid)),
        Ok(pid) => Err(format!("names pid {pid}, which no instance can be (1 is init)")),
        _ if text.trim().is_empty() => Err("is empty".into()),
        _ => Err("does not hold a decimal pid".into()),
    }
}

/// Waits for the pidfile at `path`. Set up BEFORE the daemon is started, so
/// no event is missed.
pub struct Waiter {
    inotify: Option<AsyncInotify>,
}

impl Waiter {
    /// Watches the pidfile's directory (the one open, through its fd: a
    /// path could have been swapped for a link since); without inotify the
    /// waiter polls.
    pub fn new(pidfile: &Pidfile) -> Waiter {
        let inotify = (|| {
            let ino = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC).ok()?;
            let mask = AddWatchFlags::IN_CREATE
                | AddWatchFlags::IN_MOVED_TO
                | AddWatchFlags::IN_CLOSE_WRITE
                | AddWatchFlags::IN_MODIFY
                | AddWatchFlags::IN_ONLYDIR;
            ino.add_watch(Path::new(&format!("/proc/self/fd/{}", pidfile.dir.fd().as_raw_fd())), mask).ok()?;
            async_inotify(ino).ok()
        })();
        Waiter { inotify }
    }

    /// True when inotify is in use (tests check the fast path is taken).
    pub fn uses_inotify(&self) -> bool {
        self.inotify.is_some()
    }

    /// Waits until the pidfile names a running process, or `deadline`.
    /// `hopeless()` is asked when the pidfile names a process that is not
    /// running: true (nothing of the instance runs any more) ends the wait
    /// at once instead of at the deadline.
    pub async fn wait(
        &mut self,
        pidfile: &Pidfile,
        deadline: Instant,
        is_running: impl Fn(u32) -> bool,
        hopeless: impl Fn() -> bool,
    ) -> Outcome {
        let mut backoff = FIRST_BACKOFF;
        loop {
            let now_says = match pidfile.read() {
                Ok(Some(pid)) if is_running(pid) => return Outcome::Pid(pid),
                Ok(Some(pid)) => {
                    let o = Outcome::Invalid(format!("names process {pid}, which is not running"));
                    if hopeless() {
                        return o;
                    }
                    o
                }
                Ok(None) => Outcome::Missing,
                Err(reason) => Outcome::Invalid(reason),
            };
            if Instant::now() >= deadline {
                return now_says;
            }
            let cap = if self.inotify.is_some() { MAX_BACKOFF_WITH_INOTIFY } else { MAX_BACKOFF };
            let sleep = tokio::time::sleep_until(deadline.min(Instant::now() + backoff));
            match &self.inotify {
                Some(afd) => {
                    tokio::select! {
                        r = next_event(afd) => if r.is_err() { self.inotify = None },
                        _ = sleep => {}
                    }
                }
                None => sleep.await,
            }
            backoff = (backoff * 2).min(cap);
        }
    }
}

/// Resolves when inotify reported something in the directory (drained).
async fn next_event(afd: &AsyncInotify) -> io::Result<()> {
    loop {
        let mut guard = afd.readable().await?;
        match guard.try_io(|inner| inner.get_ref().get().read_events().map_err(io::Error::from)) {
            Ok(Ok(_events)) => return Ok(()),
            Ok(Err(e)) => return Err(e),
            Err(_would_block) => continue,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checks_pidfile_paths() {
        assert!(check_relative("run/x.pid").is_ok());
        assert!(check_relative("./x.pid").is_ok());
        assert!(check_relative("/run/x.pid").is_err());
        assert!(check_relative("run/../../x.pid").is_err());
        assert!(check_relative("").is_err());
    }

    fn me() -> RunAs {
        super::super::users::current()
    }

    #[test]
    fn reads_pids_strictly() {
        let tmp = tempfile::tempdir().unwrap();
        let pf = Pidfile::open(tmp.path(), "run/x.pid", &me()).unwrap();
        let p = tmp.path().join("run/x.pid");
        assert_eq!(pf.read(), Ok(None));
        std::fs::write(&p, " 1234\n").unwrap();
        assert_eq!(pf.read(), Ok(Some(1234)));
        std::fs::write(&p, "").unwrap();
        assert!(pf.read().is_err());
        std::fs::write(&p, "12ab").unwrap();
        assert!(pf.read().is_err());
        std::fs::write(&p, "1").unwrap();
        assert!(pf.read().is_err());
        std::fs::remove_file(&p).unwrap();
        std::os::unix::fs::symlink("/proc/self/stat", &p).unwrap();
        assert_eq!(pf.read(), Err("is a symbolic link".to_string()));
        std::fs::remove_file(&p).unwrap();
        nix::unistd::mkfifo(&p, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
        assert_eq!(pf.read(), Err("is a FIFO, not a regular file".to_string()), "and it did not block");
    }

    /// A stale pidfile is removed relative to its directory's fd: with
    /// `run` swapped for a link to another directory after the open, the
    /// file of the same name there is not removed (nor read).
    #[test]
    fn a_swapped_directory_is_not_followed() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("x.pid"), "4242\n").unwrap();
        let pf = Pidfile::open(tmp.path(), "run/x.pid", &me()).unwrap();
        std::fs::rename(tmp.path().join("run"), tmp.path().join("run.old")).unwrap();
        std::os::unix::fs::symlink(outside.path(), tmp.path().join("run")).unwrap();
        pf.remove_stale().unwrap();
        assert_eq!(pf.read(), Ok(None), "read through the swapped link");
        assert!(outside.path().join("x.pid").exists(), "removed through the swapped link");
        // And a pidfile under a planted link is refused at open.
        let err = Pidfile::open(tmp.path(), "run/x.pid", &me()).err().expect("opened through a link");
        assert!(err.to_string().contains("symbolic link"), "{err}");
    }

    #[tokio::test]
    async fn inotify_wakes_the_waiter_long_before_the_deadline() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("x.pid");
        let pf = Pidfile::open(tmp.path(), "x.pid", &me()).unwrap();
        let mut w = Waiter::new(&pf);
        assert!(w.uses_inotify());
        let writer = {
            let p = p.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(300)).await;
                std::fs::write(&p, "4242\n").unwrap();
            })
        };
        let started = Instant::now();
        let out = w.wait(&pf, Instant::now() + Duration::from_secs(10), |pid| pid == 4242, || false).await;
        assert_eq!(out, Outcome::Pid(4242));
        assert!(started.elapsed() < Duration::from_secs(5));
        writer.await.unwrap();
    }

    #[tokio::test]
    async fn times_out_with_what_the_file_says() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("x.pid");
        let pf = Pidfile::open(tmp.path(), "x.pid", &me()).unwrap();
        let mut w = Waiter::new(&pf);
        let out = w.wait(&pf, Instant::now() + Duration::from_millis(100), |_| true, || false).await;
        assert_eq!(out, Outcome::Missing);
        std::fs::write(&p, "999999\n").unwrap();
        // Names a dead process and nothing else runs: gives up at once.
        let t = Instant::now();
        let out = w.wait(&pf, Instant::now() + Duration::from_secs(10), |_| false, || true).await;
        assert!(matches!(out, Outcome::Invalid(r) if r.contains("999999")));
        assert!(t.elapsed() < Duration::from_secs(1));
    }
}
