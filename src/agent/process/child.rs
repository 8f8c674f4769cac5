//! A process the agent spawned (see `vfork.rs`) and must reap: its exit is
//! awaited on a pidfd, its status taken with `waitpid`. Until it is reaped
//! its pid cannot be reused, so signalling it by pid is safe; a `Child`
//! dropped before its process ended is reaped in the background, never left
//! a zombie.

use std::io;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use super::sys::{AsyncPidfd, async_pidfd};
use super::vfork::wait_status;

/// Without a pidfd (no runtime, an old kernel, no descriptor left): poll.
const POLL: Duration = Duration::from_millis(5);

#[derive(Debug)]
pub struct Child {
    pid: u32,
    pidfd: Option<AsyncPidfd>,
    status: Option<ExitStatus>,
}

impl Child {
    /// Takes charge of `pid`, an unreaped child of this process.
    pub(super) fn adopt(pid: u32) -> Child {
        // A pidfd needs a runtime to register with; without one, poll.
        let pidfd = tokio::runtime::Handle::try_current().ok().and_then(|_| async_pidfd(pid).ok());
        Child { pid, pidfd, status: None }
    }

    /// The pid while the process is not reaped (as tokio's `Child::id`).
    pub fn id(&self) -> Option<u32> {
        self.status.is_none().then_some(self.pid)
    }

    /// Waits for the process to end and reaps it.
    pub async fn wait(&mut self) -> io::Result<ExitStatus> {
        loop {
            if let Some(status) = self.try_wait()? {
                return Ok(status);
            }
            match &self.pidfd {
                Some(fd) => {
                    let mut ready = fd.readable().await?;
                    ready.clear_ready();
                }
                None => tokio::time::sleep(POLL).await,
            }
        }
    }

    /// The exit status if the process has ended (reaping it), else `None`.
    pub fn try_wait(&mut self) -> io::Result<Option<ExitStatus>> {
        if let Some(status) = self.status {
            return Ok(Some(status));
        }
        let status = reap(self.pid, true)?;
        self.status = status;
        Ok(status)
    }

    /// Sends SIGKILL unless the process is already reaped.
    pub fn start_kill(&mut self) -> io::Result<()> {
        if self.status.is_some() {
            return Ok(());
        }
        kill(pid_of(self.pid)?, Signal::SIGKILL).map_err(io::Error::from)
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        if self.status.is_some() || matches!(self.try_wait(), Ok(Some(_)) | Err(_)) {
            return;
        }
        let pid = self.pid;
        let pidfd = self.pidfd.take();
        match (tokio::runtime::Handle::try_current(), pidfd) {
            (Ok(rt), Some(fd)) => {
                rt.spawn(async move {
                    let mut child = Child { pid, pidfd: Some(fd), status: None };
                    if let Err(e) = child.wait().await {
                        tracing::warn!(pid, error = %e, "cannot reap a child process");
                    }
                });
            }
            _ => {
                // A blocking wait on a thread of its own.
                std::thread::spawn(move || {
                    if let Err(e) = reap(pid, false) {
                        tracing::warn!(pid, error = %e, "cannot reap a child process");
                    }
                });
            }
        }
    }
}

fn pid_of(pid: u32) -> io::Result<Pid> {
    i32::try_from(pid).map(Pid::from_raw).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

/// `waitpid` with its result as std's `ExitStatus`; `None` while it runs.
fn reap(pid: u32, nohang: bool) -> io::Result<Option<ExitStatus>> {
    Ok(wait_status(pid, nohang)?.map(ExitStatus::from_raw))
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::ExitStatusExt;

    use super::super::spawn::{self, Launch};
    use super::super::users;

    fn launch_sh<'a>(
        script: &'a [String],
        dir: &'a std::path::Path,
        logs: &'a super::super::spawn::Logs,
        run_as: &'a users::RunAs,
    ) -> Launch<'a> {
        Launch {
            argv: script,
            dir,
            env: &[],
            marker: None,
            run_as,
            cgroup_procs: &[],
            stdout: &logs.stdout,
            stderr: &logs.stderr,
        }
    }

    #[tokio::test]
    async fn exit_codes_signals_and_kill_are_reported_and_reaped() {
        let tmp = tempfile::tempdir().unwrap();
        let me = users::current();
        let logs = spawn::open_logs(tmp.path(), &me).unwrap();
        let argv = |s: &str| vec!["/bin/sh".to_string(), "-c".to_string(), s.to_string()];

        let code = argv("exit 7");
        let mut c = spawn::spawn(&launch_sh(&code, tmp.path(), &logs, &me)).unwrap();
        let pid = c.id().unwrap();
        assert_eq!(c.wait().await.unwrap().code(), Some(7));
        assert_eq!(c.id(), None, "a reaped child has no pid");
        assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists(), "{pid} left a zombie");

        let sig = argv("kill -TERM $$");
        let mut c = spawn::spawn(&launch_sh(&sig, tmp.path(), &logs, &me)).unwrap();
        let status = c.wait().await.unwrap();
        assert_eq!((status.code(), status.signal()), (None, Some(libc::SIGTERM)));

        // A real-time signal has no name in nix; it is still an exit.
        let rt = argv("kill -35 $$");
        let mut c = spawn::spawn(&launch_sh(&rt, tmp.path(), &logs, &me)).unwrap();
        assert_eq!(c.wait().await.unwrap().signal(), Some(35));
        assert_eq!(c.id(), None);

        let long = argv("exec sleep 30");
        let mut c = spawn::spawn(&launch_sh(&long, tmp.path(), &logs, &me)).unwrap();
        assert!(c.try_wait().unwrap().is_none());
        c.start_kill().unwrap();
        assert_eq!(c.wait().await.unwrap().signal(), Some(libc::SIGKILL));

        // Dropped while running: reaped in the background once it ends.
        let short = argv("sleep 0.2");
        let c = spawn::spawn(&launch_sh(&short, tmp.path(), &logs, &me)).unwrap();
        let pid = c.id().unwrap();
        drop(c);
        let gone = async {
            while std::path::Path::new(&format!("/proc/{pid}")).exists() {
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
        };
        tokio::time::timeout(std::time::Duration::from_secs(5), gone)
            .await
            .unwrap_or_else(|_| panic!("a dropped child {pid} was never reaped"));
    }

    /// The `Uid:` line of `/proc/<pid>/status` (or of a task of ours).
    fn uids(status_path: &str) -> String {
        let text = std::fs::read_to_string(status_path).unwrap();
        text.lines().find(|l| l.starts_with("Uid:")).unwrap().to_string()
    }

    fn status_field(pid: u32, field: &str) -> u64 {
        let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let line = text.lines().find(|l| l.starts_with(field)).unwrap();
        u64::from_str_radix(line[field.len()..].trim(), 16).unwrap()
    }

    #[tokio::test]
    #[allow(unsafe_code)]
    async fn the_child_switches_user_and_the_agent_stays_who_it_was() {
        assert!(nix::unistd::geteuid().is_root(), "this test needs root (run it as root, as .ci/run does)");
        let tmp = tempfile::tempdir().unwrap();
        let nobody = users::resolve("nobody").unwrap();
        let logs = spawn::open_logs(tmp.path(), &nobody).unwrap();
        std::os::unix::fs::chown(tmp.path(), Some(nobody.uid), Some(nobody.gid)).unwrap();
        // A handled signal in the agent (tokio's) must not be handled in the
        // child, and the child must not inherit a blocked mask or an ignored SIGPIPE.
        let _usr1 = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::user_defined1()).unwrap();
        // Nor a signal the agent inherited ignored (SIGQUIT in a background
        // job, SIGHUP under nohup): a shell cannot trap one of those.
        // SAFETY: sets one signal's disposition to "ignore"; no handler runs.
        unsafe { libc::signal(libc::SIGQUIT, libc::SIG_IGN) };
        let argv = vec!["/bin/sh".to_string(), "-c".to_string(), "exec sleep 30".to_string()];
        let mut c = spawn::spawn(&launch_sh(&argv, tmp.path(), &logs, &nobody)).unwrap();
        let pid = c.id().unwrap();
        let want = format!("{0}\t{0}\t{0}\t{0}", nobody.uid);
        assert_eq!(uids(&format!("/proc/{pid}/status")).trim_start_matches("Uid:").trim(), want);
        let groups = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let groups = groups.lines().find(|l| l.starts_with("Groups:")).unwrap().to_string();
        assert_eq!(groups.trim_start_matches("Groups:").trim(), nobody.gid.to_string());
        assert_eq!(status_field(pid, "SigBlk:"), 0, "the child's signal mask is empty");
        assert_eq!(status_field(pid, "SigIgn:") & (1 << (libc::SIGPIPE - 1)), 0, "SIGPIPE is not ignored");
        assert_eq!(status_field(pid, "SigIgn:") & (1 << (libc::SIGQUIT - 1)), 0, "SIGQUIT is not ignored");
        // SAFETY: as above, back to the default.
        unsafe { libc::signal(libc::SIGQUIT, libc::SIG_DFL) };
        // Every thread of this process is still root: the user switch was
        // the child's alone (glibc's setuid would have switched them all).
        for task in std::fs::read_dir("/proc/self/task").unwrap() {
            let path = task.unwrap().path().join("status");
            let Ok(text) = std::fs::read_to_string(&path) else { continue };
            let uid = text.lines().find(|l| l.starts_with("Uid:")).unwrap();
            assert_eq!(uid.trim_start_matches("Uid:").trim(), "0\t0\t0\t0", "{}", path.display());
        }
        c.start_kill().unwrap();
        c.wait().await.unwrap();
    }

    #[tokio::test]
    async fn failures_before_exec_say_where() {
        let tmp = tempfile::tempdir().unwrap();
        let me = users::current();
        let logs = spawn::open_logs(tmp.path(), &me).unwrap();
        let missing = vec!["no-such-program-here".to_string()];
        let err = spawn::spawn(&launch_sh(&missing, tmp.path(), &logs, &me)).unwrap_err();
        let super::super::ProcessError::Spawn { source, .. } = &err else { panic!("{err:?}") };
        assert_eq!(source.kind(), std::io::ErrorKind::NotFound, "{err}");

        let gone = tmp.path().join("gone");
        let argv = vec!["/bin/true".to_string()];
        let err = spawn::spawn(&launch_sh(&argv, &gone, &logs, &me)).unwrap_err();
        let chain = crate::error::ErrorChain(&err).to_string();
        assert!(chain.contains("changing to the working directory"), "{chain}");

        // A script without `#!` runs through /bin/sh, as execvp would.
        let plain = tmp.path().join("plain");
        std::fs::write(&plain, "echo ran > ran.txt\nexit 3\n").unwrap();
        std::fs::set_permissions(&plain, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let argv = vec![plain.display().to_string()];
        let status = spawn::spawn(&launch_sh(&argv, tmp.path(), &logs, &me)).unwrap().wait().await.unwrap();
        assert_eq!(status.code(), Some(3));
        assert_eq!(std::fs::read_to_string(tmp.path().join("ran.txt")).unwrap(), "ran\n");

        // Found in the spec's own PATH, as execvp would.
        let bin = tmp.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        std::os::unix::fs::symlink("/bin/true", bin.join("my-tool")).unwrap();
        let env = vec![("PATH".to_string(), format!("/nonexistent:{}", bin.display()))];
        let tool = vec!["my-tool".to_string()];
        let mut l = launch_sh(&tool, tmp.path(), &logs, &me);
        l.env = &env;
        assert!(spawn::spawn(&l).unwrap().wait().await.unwrap().success());
    }
}
