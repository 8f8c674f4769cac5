//! One-shot commands run beside an instance, not as part of it: lifecycle
//! hooks and health-check commands.
//!
//! They run like the instance's own commands (argv relative to the instance
//! directory, that directory as cwd, the run-as user, the instance's env,
//! the clean base environment) but are deliberately *not* in the instance's
//! tree: no cgroup, no `FLOTILLA_INSTANCE` marker. Otherwise a stop of the
//! instance would kill a running hook, and the tree scan would count a hook
//! as a process of the service.
//!
//! Each command gets its own process group, which is what bounds it: past the
//! timeout the whole group is SIGKILLed, and after it exits anything it left
//! in its group is killed too (a hook that forgot a background child would
//! otherwise leave a process nobody tracks or ever stops). The group id stays
//! reserved while any member lives, so signalling it after reaping the leader
//! cannot hit a recycled pid.

use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::ExitStatus;
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

use tokio::time::Instant;

use super::spawn::{self, Launch};
use super::{ProcessError, RunAs, tree};

/// How long killed processes of a command may take to disappear.
const KILL_WAIT: Duration = Duration::from_secs(2);

/// One command to run beside an instance.
#[derive(Debug, Clone, Copy)]
pub struct OneShot<'a> {
    pub argv: &'a [String],
    /// The instance directory: cwd and base of a relative `argv[0]`.
    pub dir: &'a Path,
    pub env: &'a [(String, String)],
    pub run_as: &'a RunAs,
    /// Output goes to `logs/<log_name>.stdout.log` and `.stderr.log`; a
    /// plain name chosen by the agent (e.g. `hook-init`).
    pub log_name: &'a str,
    pub timeout: Duration,
}

/// How a one-shot command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// It exited by itself (with a code, or killed by a signal it got from
    /// elsewhere).
    Finished(ExitStatus),
    /// It was still running at the timeout; its process group was killed.
    TimedOut,
}

impl Ending {
    /// The exit code, when it exited normally.
    pub fn code(&self) -> Option<i32> {
        match self {
            Ending::Finished(s) => s.code(),
            Ending::TimedOut => None,
        }
    }

    /// The signal that killed it, when one did (not our timeout kill).
    pub fn signal(&self) -> Option<i32> {
        match self {
            Ending::Finished(s) => s.signal(),
            Ending::TimedOut => None,
        }
    }
}

/// What a one-shot command did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OneShotResult {
    pub ending: Ending,
    /// The ends of what this run (only) wrote.
    pub stdout_tail: String,
    pub stderr_tail: String,
}

/// Runs `cmd` to its end or its timeout. `Err` only when it could not be
/// started at all (missing program, unusable log files, ...).
pub async fn run_oneshot(cmd: &OneShot<'_>) -> Result<OneShotResult, ProcessError> {
    let logs = spawn::open_named_logs(
        cmd.dir,
        cmd.run_as,
        &format!("{}.stdout.log", cmd.log_name),
        &format!("{}.stderr.log", cmd.log_name),
    )?;
    let launch = Launch {
        argv: cmd.argv,
        dir: cmd.dir,
        env: cmd.env,
        marker: None,
        run_as: cmd.run_as,
        cgroup_procs: &[],
        stdout: &logs.stdout,
        stderr: &logs.stderr,
    };
    let mut child = spawn::spawn(&launch)?;
    // The child leads its own group (spawn sets process_group(0)).
    let group = child.id().and_then(|p| i32::try_from(p).ok()).map(Pid::from_raw);
    // If this future is dropped mid-run (a health wait that gave up), the
    // group is killed here and the dropped child is reaped in the background.
    let mut guard = KillGroupOnDrop(group);
    let ending = match tokio::time::timeout(cmd.timeout, child.wait()).await {
        Ok(Ok(status)) => Ending::Finished(status),
        Ok(Err(e)) => {
            kill_group(group);
            let _ = child.wait().await;
            guard.0 = None;
            return Err(ProcessError::io(format!("waiting for {:?}", cmd.argv), e));
        }
        Err(_) => {
            // Not reaped yet, so the leader's pid still names the group.
            kill_group(group);
            if let Err(e) = child.wait().await {
                tracing::warn!(argv = ?cmd.argv, error = %e, "cannot reap a timed-out command");
            }
            Ending::TimedOut
        }
    };
    // Whatever it left running in its group dies with it; SIGKILL is
    // delivered asynchronously, so wait until the group is really empty:
    // the caller's answer must mean "nothing of it runs".
    kill_group(group);
    if let Some(group) = group {
        let deadline = Instant::now() + KILL_WAIT;
        let mut backoff = Duration::from_millis(1);
        loop {
            let left = tree::group_members(group.as_raw());
            if left.is_empty() {
                break;
            }
            if Instant::now() >= deadline {
                tracing::error!(pgid = group.as_raw(), ?left, "processes of a command survive SIGKILL");
                break;
            }
            kill_group(Some(group));
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_millis(50));
        }
    }
    // Disarmed: the group is gone, and its id may be reused from now on.
    guard.0 = None;
    Ok(OneShotResult {
        ending,
        stdout_tail: spawn::tail(&logs.stdout, logs.stdout_start),
        stderr_tail: spawn::tail(&logs.stderr, logs.stderr_start),
    })
}

/// Kills the group it holds when dropped (unless disarmed).
struct KillGroupOnDrop(Option<Pid>);

impl Drop for KillGroupOnDrop {
    fn drop(&mut self) {
        kill_group(self.0);
    }
}

fn kill_group(group: Option<Pid>) {
    let Some(group) = group else { return };
    match killpg(group, Signal::SIGKILL) {
        // ESRCH: nothing left in the group.
        Ok(()) | Err(Errno::ESRCH) => {}
        Err(e) => tracing::warn!(pgid = group.as_raw(), error = %e, "cannot kill a command's process group"),
    }
}

/// "SIGTERM" for 15, or the number when it names no signal.
pub fn signal_name(signal: i32) -> String {
    Signal::try_from(signal).map(|s| s.as_str().to_string()).unwrap_or_else(|_| format!("signal {signal}"))
}
