//! Knowing when an instance's main process is gone.
//!
//! A foreground process is the agent's child: a reaper task waits for it at
//! once (so it never lingers as a zombie) and publishes its exit status on a
//! `watch` channel every watcher can await, however late it subscribes. A
//! daemon (or a process re-adopted after an agent restart) is not our child:
//! its exit is woken by a pidfd (`pidfd_open`, which becomes readable when
//! the process ends) so a `kill -9` is known at once, without polling;
//! where the kernel has no pidfds (or the agent is out of descriptors) its
//! identity is polled.

use std::fs::File;
use std::future::{Future, IntoFuture};
use std::os::unix::process::ExitStatusExt;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::identity::is_alive;
use super::spawn::tail;
use super::sys::async_pidfd;
use crate::storage::agent_records::PidIdentity;

/// How often a non-child is checked where no pidfd can watch it.
const POLL_EVERY: Duration = Duration::from_millis(100);

/// How the main process of an instance ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExitInfo {
    pub pid: u32,
    /// Known only for a child of the agent that exited normally.
    pub exit_code: Option<i32>,
    /// The signal that killed it (children only).
    pub signal: Option<i32>,
    /// The end of stderr.log written during this run ("" when unknown).
    pub stderr_tail: String,
}

/// The stderr log of a run and where the run started writing to it.
#[derive(Debug, Clone)]
pub(crate) struct StderrLog {
    pub file: Arc<File>,
    pub from: u64,
}

impl StderrLog {
    fn tail(&self) -> String {
        tail(&self.file, self.from)
    }
}

/// Something to await for the exit of one process; cheap to clone, each
/// clone resolves to the same [`ExitInfo`]. `exit_watch.await` works.
#[derive(Debug, Clone)]
pub struct ExitWatch {
    inner: Inner,
}

#[derive(Debug, Clone)]
enum Inner {
    Child { pid: u32, rx: watch::Receiver<Option<ExitInfo>> },
    Poll { identity: PidIdentity, stderr: Option<StderrLog> },
}

impl ExitWatch {
    /// Takes ownership of the child: a task reaps it as soon as it exits.
    pub(crate) fn reap(mut child: super::child::Child, pid: u32, stderr: StderrLog) -> ExitWatch {
        let (tx, rx) = watch::channel(None);
        tokio::spawn(async move {
            let info = match child.wait().await {
                Ok(status) => {
                    ExitInfo { pid, exit_code: status.code(), signal: status.signal(), stderr_tail: stderr.tail() }
                }
                Err(e) => {
                    tracing::warn!(pid, error = %e, "cannot wait for child process");
                    ExitInfo { pid, exit_code: None, signal: None, stderr_tail: stderr.tail() }
                }
            };
            // Nobody listening is fine: the process is reaped either way.
            let _ = tx.send(Some(info));
        });
        ExitWatch { inner: Inner::Child { pid, rx } }
    }

    /// Watches a process that is not the agent's child.
    pub(crate) fn poll(identity: PidIdentity, stderr: Option<StderrLog>) -> ExitWatch {
        ExitWatch { inner: Inner::Poll { identity, stderr } }
    }

    /// The exit, if it happened already.
    pub fn try_exited(&self) -> Option<ExitInfo> {
        match &self.inner {
            Inner::Child { rx, .. } => rx.borrow().clone(),
            Inner::Poll { identity, stderr } => (!is_alive(identity)).then(|| ExitInfo {
                pid: identity.pid,
                exit_code: None,
                signal: None,
                stderr_tail: stderr.as_ref().map(StderrLog::tail).unwrap_or_default(),
            }),
        }
    }

    /// Resolves when the process is gone.
    pub async fn wait(self) -> ExitInfo {
        match self.inner {
            Inner::Child { pid, mut rx } => match rx.wait_for(Option::is_some).await {
                Ok(v) => {
                    v.clone().unwrap_or(ExitInfo { pid, exit_code: None, signal: None, stderr_tail: String::new() })
                }
                // The reaper is gone without a result (runtime shutting down).
                Err(_) => ExitInfo { pid, exit_code: None, signal: None, stderr_tail: String::new() },
            },
            Inner::Poll { identity, stderr } => {
                gone(&identity).await;
                ExitInfo {
                    pid: identity.pid,
                    exit_code: None,
                    signal: None,
                    stderr_tail: stderr.as_ref().map(StderrLog::tail).unwrap_or_default(),
                }
            }
        }
    }
}

/// Resolves when the process `identity` names is no longer alive.
async fn gone(identity: &PidIdentity) {
    match async_pidfd(identity.pid) {
        // Checked after opening: if the identity is alive now, its pid was
        // not reused in between, so the pidfd names this very process.
        Ok(fd) if is_alive(identity) => {
            if fd.readable().await.is_ok() {
                return;
            }
        }
        Ok(_) => return,
        Err(_) => {}
    }
    while is_alive(identity) {
        tokio::time::sleep(POLL_EVERY).await;
    }
}

impl IntoFuture for ExitWatch {
    type Output = ExitInfo;
    type IntoFuture = Pin<Box<dyn Future<Output = ExitInfo> + Send + 'static>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(self.wait())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::process::identity::read_identity;

    /// A process that is not the test's child (the shell that forked it has
    /// exited), like a daemon started with a pidfile.
    async fn daemon() -> u32 {
        let out = tokio::process::Command::new("sh")
            .args(["-c", "sleep 1000 >/dev/null 2>&1 & echo $!"])
            .output()
            .await
            .unwrap();
        String::from_utf8(out.stdout).unwrap().trim().parse().unwrap()
    }

    #[tokio::test]
    async fn a_daemons_exit_wakes_its_watch() {
        let pid = daemon().await;
        let identity = read_identity(pid).expect("the daemon runs");
        let watch = ExitWatch::poll(identity.clone(), None);
        let pending = tokio::time::timeout(Duration::from_millis(300), watch.clone().wait()).await;
        assert!(pending.is_err(), "the watch resolved while {pid} runs");
        let fd = async_pidfd(pid).expect("pidfds work on this kernel (5.3+)");
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGKILL).unwrap();
        let info = tokio::time::timeout(Duration::from_secs(10), watch.wait()).await.expect("the watch saw the kill");
        assert_eq!(info.pid, pid);
        // The pidfd itself says so (no polling involved).
        let ready = tokio::time::timeout(Duration::from_secs(10), fd.readable()).await;
        assert!(ready.is_ok_and(|r| r.is_ok()), "the pidfd of the killed {pid} is not readable");
        assert!(!is_alive(&identity));
    }

    #[tokio::test]
    async fn a_watch_of_a_reused_pid_resolves_at_once() {
        let pid = daemon().await;
        let mut identity = read_identity(pid).expect("the daemon runs");
        // Same pid, another start time: some other process now, not ours.
        identity.start_time += 1;
        let info = tokio::time::timeout(Duration::from_secs(5), ExitWatch::poll(identity, None).wait()).await;
        assert!(info.is_ok(), "a watch of a process that is gone must not wait on the pid's new owner");
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGKILL).unwrap();
    }
}
