//! `ProcessError`: why starting or stopping an instance's processes failed,
//! with what an operator needs (exit code, stderr tail) kept as data.

use std::io;
use std::path::PathBuf;

/// Errors of the process layer. `Display` never repeats the source.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    /// The command could not be executed at all (missing file, not
    /// executable, cannot switch user, cannot enter the cgroup).
    #[error("cannot run {argv:?}")]
    Spawn {
        argv: Vec<String>,
        #[source]
        source: io::Error,
    },
    /// The start command (or a foreground process within its first moments)
    /// exited unsuccessfully.
    #[error("start failed: {}", describe_exit(*exit_code, *signal))]
    StartFailed { exit_code: Option<i32>, signal: Option<i32>, stderr_tail: String },
    /// A daemonizing start command did not exit within the start timeout.
    #[error("start command {argv:?} did not exit within {waited_ms} ms")]
    StartTimeout { argv: Vec<String>, waited_ms: u64, stderr_tail: String },
    /// The pidfile did not appear within the start timeout.
    #[error("pidfile {} did not appear within {waited_ms} ms", path.display())]
    PidfileTimeout { path: PathBuf, waited_ms: u64, stderr_tail: String },
    /// The pidfile is there but does not name a running process.
    #[error("pidfile {} is invalid: {reason}", path.display())]
    PidfileInvalid { path: PathBuf, reason: String },
    /// The pidfile names a process outside the instance's process tree; it
    /// is never adopted (nor signalled).
    #[error("pid {pid} from the pidfile does not belong to the instance's process tree")]
    PidNotInTree { pid: u32 },
    /// The run-as user does not exist on this node.
    #[error("user {name:?} does not exist on this node")]
    UnknownUser { name: String },
    /// Processes of the instance survived SIGKILL (e.g. stuck in the kernel).
    #[error("processes {remaining:?} of instance {instance} are still alive after SIGKILL")]
    Stop { instance: String, remaining: Vec<u32> },
    /// The spec asks for resource limits this start cannot apply (the agent
    /// cannot enforce limits, invalid values, a cgroup write failed).
    #[error("cannot apply the resource limits of {instance}")]
    Limits {
        instance: String,
        #[source]
        source: super::limits::LimitsError,
    },
    /// A file or cgroup operation failed; `what` says which.
    #[error("{what}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },
}

impl ProcessError {
    /// The exit code of the failed command, when one is known.
    pub fn exit_code(&self) -> Option<i32> {
        match self {
            ProcessError::StartFailed { exit_code, .. } => *exit_code,
            _ => None,
        }
    }

    /// The end of what the command wrote on stderr during this run ("" when
    /// unknown).
    pub fn stderr_tail(&self) -> &str {
        match self {
            ProcessError::StartFailed { stderr_tail, .. }
            | ProcessError::StartTimeout { stderr_tail, .. }
            | ProcessError::PidfileTimeout { stderr_tail, .. } => stderr_tail,
            _ => "",
        }
    }

    pub(crate) fn io(what: impl Into<String>, source: io::Error) -> Self {
        ProcessError::Io { what: what.into(), source }
    }
}

/// "exit code 3", "killed by signal 9", ...
pub(crate) fn describe_exit(exit_code: Option<i32>, signal: Option<i32>) -> String {
    match (exit_code, signal) {
        (Some(c), _) => format!("exit code {c}"),
        (None, Some(s)) => format!("killed by signal {s}"),
        (None, None) => "exited".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accessors_and_display() {
        let e = ProcessError::StartFailed { exit_code: Some(3), signal: None, stderr_tail: "boom".into() };
        assert_eq!(e.exit_code(), Some(3));
        assert_eq!(e.stderr_tail(), "boom");
        assert_eq!(e.to_string(), "start failed: exit code 3");
        let e = ProcessError::Spawn { argv: vec!["x".into()], source: io::Error::other("nope") };
        assert_eq!(e.to_string(), "cannot run [\"x\"]");
        assert_eq!(e.exit_code(), None);
        assert_eq!(e.stderr_tail(), "");
    }
}
