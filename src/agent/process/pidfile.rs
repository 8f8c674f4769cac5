//! Waiting for a daemon's pidfile: inotify on its directory (a non-blocking
//! fd driven by tokio's `AsyncFd`), with polling on a fast backoff (from 5 ms)
//! as the fallback and safety net, until a deadline.
//!
//! The pidfile lives in a directory the run-as user controls, so it is read
//! with `O_NOFOLLOW`, at most a few bytes, and its content is never echoed.

use std::io::{self, Read};
use std::path::{Component, Path};
use std::time::Duration;

use nix::fcntl::{OFlag, open};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
use nix::sys::stat::Mode;

use super::sys::{AsyncInotify, async_inotify};
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

/// What the pidfile says right now: `Ok(None)` when it does not exist,
/// `Err(reason)` when it holds no pid.
pub fn read_pid(path: &Path) -> Result<Option<u32>, String> {
    let fd = match open(path, OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK, Mode::empty())
    {
        Ok(fd) => fd,
        Err(nix::errno::Errno::ENOENT) => return Ok(None),
        Err(nix::errno::Errno::ELOOP) => return Err("is a symbolic link".into()),
        Err(e) => return Err(format!("cannot be read: {e}")),
    };
    let mut text = String::new();
    std::fs::File::from(fd).take(MAX_PIDFILE_BYTES).read_to_string(&mut text).map_err(|_| "is not text".to_string())?;
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
    /// Watches the pidfile's directory; without inotify (or without the
    /// directory) the waiter polls.
    pub fn new(path: &Path) -> Waiter {
        let inotify = path.parent().and_then(|dir| {
            let ino = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC).ok()?;
            let mask = AddWatchFlags::IN_CREATE
                | AddWatchFlags::IN_MOVED_TO
                | AddWatchFlags::IN_CLOSE_WRITE
                | AddWatchFlags::IN_MODIFY;
            ino.add_watch(dir, mask).ok()?;
            async_inotify(ino).ok()
        });
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
        path: &Path,
        deadline: Instant,
        is_running: impl Fn(u32) -> bool,
        hopeless: impl Fn() -> bool,
    ) -> Outcome {
        let mut backoff = FIRST_BACKOFF;
        loop {
            let now_says = match read_pid(path) {
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

    #[test]
    fn reads_pids_strictly() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("x.pid");
        assert_eq!(read_pid(&p), Ok(None));
        std::fs::write(&p, " 1234\n").unwrap();
        assert_eq!(read_pid(&p), Ok(Some(1234)));
        std::fs::write(&p, "").unwrap();
        assert!(read_pid(&p).is_err());
        std::fs::write(&p, "12ab").unwrap();
        assert!(read_pid(&p).is_err());
        std::fs::write(&p, "1").unwrap();
        assert!(read_pid(&p).is_err());
        let link = tmp.path().join("link.pid");
        std::os::unix::fs::symlink(&p, &link).unwrap();
        assert!(read_pid(&link).is_err());
    }

    #[tokio::test]
    async fn inotify_wakes_the_waiter_long_before_the_deadline() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("x.pid");
        let mut w = Waiter::new(&p);
        assert!(w.uses_inotify());
        let writer = {
            let p = p.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(300)).await;
                std::fs::write(&p, "4242\n").unwrap();
            })
        };
        let started = Instant::now();
        let out = w.wait(&p, Instant::now() + Duration::from_secs(10), |pid| pid == 4242, || false).await;
        assert_eq!(out, Outcome::Pid(4242));
        assert!(started.elapsed() < Duration::from_secs(5));
        writer.await.unwrap();
    }

    #[tokio::test]
    async fn times_out_with_what_the_file_says() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("x.pid");
        let mut w = Waiter::new(&p);
        let out = w.wait(&p, Instant::now() + Duration::from_millis(100), |_| true, || false).await;
        assert_eq!(out, Outcome::Missing);
        std::fs::write(&p, "999999\n").unwrap();
        // Names a dead process and nothing else runs: gives up at once.
        let t = Instant::now();
        let out = w.wait(&p, Instant::now() + Duration::from_secs(10), |_| false, || true).await;
        assert!(matches!(out, Outcome::Invalid(r) if r.contains("999999")));
        assert!(t.elapsed() < Duration::from_secs(1));
    }
}
