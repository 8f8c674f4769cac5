//! Building and spawning one command of an instance: program resolution, the
//! clean environment, the log files, the user switch and the cgroup move
//! (through the `sys` hook), plus reading the stderr tail of one run.
//!
//! Log files live in `<dir>/logs/`, a directory the run-as user can write to;
//! since the agent may be root, they are opened with `O_NOFOLLOW` relative to
//! a `logs/` fd that was itself opened with `O_NOFOLLOW`, so a planted symlink
//! cannot make the agent append to (or report the contents of) another file.

use std::ffi::{CString, OsStr};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};

use nix::fcntl::{OFlag, open, openat};
use nix::sys::stat::Mode;

use super::ProcessError;
use super::child::Child;
use super::tree::MARKER_VAR;
use super::users::RunAs;
use super::vfork::{self, ChildSetup};
use crate::ids::InstanceId;

/// The PATH every command starts with (the spec's env may override it).
const BASE_PATH: &str = "/usr/local/bin:/usr/bin:/bin";
/// At most this many lines ...
const TAIL_LINES: usize = 20;
/// ... and this many bytes of a log go into an error or exit report.
const TAIL_BYTES: u64 = 4096;

/// The log files of one spawned command, both opened read + append: the
/// child writes, the agent reads the tails.
#[derive(Debug)]
pub struct Logs {
    pub stdout: File,
    pub stderr: File,
    /// Size of the stdout log when the command was spawned: the tail of this
    /// run starts here.
    pub stdout_start: u64,
    /// The same for the stderr log.
    pub stderr_start: u64,
}

/// Opens (creating) `<dir>/logs/stdout.log` and `stderr.log` for appending:
/// the logs of the instance's own processes.
pub fn open_logs(dir: &Path, run_as: &RunAs) -> Result<Logs, ProcessError> {
    open_named_logs(dir, run_as, "stdout.log", "stderr.log")
}

/// Opens (creating) `<dir>/logs/<stdout_name>` and `<stderr_name>` for
/// appending. The names are plain file names chosen by the agent (e.g.
/// `hook-init.stdout.log`), never paths.
pub fn open_named_logs(dir: &Path, run_as: &RunAs, stdout_name: &str, stderr_name: &str) -> Result<Logs, ProcessError> {
    for name in [stdout_name, stderr_name] {
        if name.is_empty() || name.starts_with('.') || name.contains('/') || name.contains('\0') {
            return Err(ProcessError::io(
                format!("log file name {name:?}"),
                io::Error::new(io::ErrorKind::InvalidInput, "not a plain file name"),
            ));
        }
    }
    let logs = ensure_dir(&dir.join("logs"), run_as)?;
    let dir_fd =
        open(&logs, OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_RDONLY, Mode::empty())
            .map_err(|e| ProcessError::io(format!("opening {}", logs.display()), e.into()))?;
    // O_NONBLOCK: a planted FIFO must not hang the agent (refused below).
    let flags = OFlag::O_APPEND | OFlag::O_CREAT | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK;
    let open_log = |name: &str, access: OFlag| -> Result<File, ProcessError> {
        let fd: OwnedFd = openat(&dir_fd, name, flags | access, Mode::from_bits_truncate(0o644))
            .map_err(|e| ProcessError::io(format!("opening {}", logs.join(name).display()), e.into()))?;
        let file = File::from(fd);
        // Only a plain file of its own: a hard link to another file would
        // make the agent append to (and chown) that file.
        let meta =
            file.metadata().map_err(|e| ProcessError::io(format!("stat of {}", logs.join(name).display()), e))?;
        if !meta.is_file() || meta.nlink() != 1 {
            return Err(ProcessError::io(
                format!("{} is not a regular file with a single link", logs.join(name).display()),
                io::Error::new(io::ErrorKind::InvalidInput, "refusing to write a log through it"),
            ));
        }
        if run_as.needs_switch() {
            std::os::unix::fs::fchown(&file, Some(run_as.uid), Some(run_as.gid))
                .map_err(|e| ProcessError::io(format!("chown of {}", logs.join(name).display()), e))?;
        }
        Ok(file)
    };
    let stdout = open_log(stdout_name, OFlag::O_RDWR)?;
    let stderr = open_log(stderr_name, OFlag::O_RDWR)?;
    let size = |file: &File, name: &str| {
        file.metadata()
            .map(|m| m.len())
            .map_err(|e| ProcessError::io(format!("stat of {}", logs.join(name).display()), e))
    };
    let stdout_start = size(&stdout, stdout_name)?;
    let stderr_start = size(&stderr, stderr_name)?;
    Ok(Logs { stdout, stderr, stdout_start, stderr_start })
}

/// Makes sure `path` is a real directory (not a symlink), creating it owned
/// by the run-as user when missing.
pub fn ensure_dir(path: &Path, run_as: &RunAs) -> Result<PathBuf, ProcessError> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => Ok(path.to_path_buf()),
        Ok(_) => Err(ProcessError::io(
            format!("{} is not a directory", path.display()),
            io::Error::new(io::ErrorKind::InvalidInput, "not a directory"),
        )),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            std::fs::create_dir_all(path).map_err(|e| ProcessError::io(format!("creating {}", path.display()), e))?;
            if run_as.needs_switch() {
                std::os::unix::fs::lchown(path, Some(run_as.uid), Some(run_as.gid))
                    .map_err(|e| ProcessError::io(format!("chown of {}", path.display()), e))?;
            }
            Ok(path.to_path_buf())
        }
        Err(e) => Err(ProcessError::io(format!("stat of {}", path.display()), e)),
    }
}

/// The last lines (at most 20, at most 4 KiB) written to `file` after byte
/// offset `from`.
pub fn tail(file: &File, from: u64) -> String {
    let Ok(meta) = file.metadata() else { return String::new() };
    let len = meta.len();
    // A log truncated (rotated) since the spawn: read its end.
    let from = if len < from { 0 } else { from };
    let start = from.max(len.saturating_sub(TAIL_BYTES));
    let mut buf = vec![0u8; usize::try_from(len - start).unwrap_or(0)];
    let mut got = 0;
    while got < buf.len() {
        match file.read_at(&mut buf[got..], start + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    buf.truncate(got);
    let mut text: &[u8] = &buf;
    if start > from {
        // Cut mid-line: drop the partial first line.
        if let Some(nl) = text.iter().position(|b| *b == b'\n') {
            text = &text[nl + 1..];
        }
    }
    let text = String::from_utf8_lossy(text);
    let lines: Vec<&str> = text.trim_end_matches('\n').lines().collect();
    lines[lines.len().saturating_sub(TAIL_LINES)..].join("\n")
}

/// One command to spawn for an instance.
pub struct Launch<'a> {
    pub argv: &'a [String],
    pub dir: &'a Path,
    pub env: &'a [(String, String)],
    /// Present: the process gets the instance marker in its environment.
    pub marker: Option<&'a InstanceId>,
    pub run_as: &'a RunAs,
    /// Open `cgroup.procs` files of the cgroups to move the child into (at
    /// most [`vfork::MAX_CGROUPS`]).
    pub cgroup_procs: &'a [File],
    pub stdout: &'a File,
    pub stderr: &'a File,
}

/// The program to execute: absolute kept, relative with a `/` resolved
/// against the instance dir, a bare name looked up in `PATH`.
pub fn program(argv0: &str, dir: &Path) -> PathBuf {
    if argv0.starts_with('/') || !argv0.contains('/') { PathBuf::from(argv0) } else { dir.join(argv0) }
}

/// Spawns the command in its own process group, with a clean environment,
/// stdin from /dev/null and the log files as stdout/stderr, without copying
/// the agent (see `vfork.rs`).
pub fn spawn(l: &Launch<'_>) -> Result<Child, ProcessError> {
    let spawn_err = |source: io::Error| ProcessError::Spawn { argv: l.argv.to_vec(), source };
    let Some(argv0) = l.argv.first() else {
        return Err(spawn_err(io::Error::new(io::ErrorKind::InvalidInput, "empty command")));
    };
    if l.cgroup_procs.len() > vfork::MAX_CGROUPS {
        return Err(spawn_err(io::Error::new(io::ErrorKind::InvalidInput, "too many cgroups to join")));
    }
    let mut env: Vec<(&[u8], &[u8])> = Vec::with_capacity(l.env.len() + 4);
    let home = l.dir.as_os_str().as_bytes();
    let defaults = [(&b"PATH"[..], BASE_PATH.as_bytes()), (b"HOME", home), (b"LANG", b"C.UTF-8")];
    let spec_env = l.env.iter().map(|(k, v)| (k.as_bytes(), v.as_bytes()));
    let marker = l.marker.map(|id| (MARKER_VAR.as_bytes(), id.as_str().as_bytes()));
    for (k, v) in defaults.into_iter().chain(spec_env).chain(marker) {
        // A later value of the same variable wins, as with `Command::env`.
        match env.iter_mut().find(|(key, _)| *key == k) {
            Some(slot) => slot.1 = v,
            None => env.push((k, v)),
        }
    }
    let path = env.iter().find(|(k, _)| *k == b"PATH").map_or(BASE_PATH.as_bytes(), |(_, v)| v);
    let program = program(argv0, l.dir);
    let c = |s: &[u8]| CString::new(s).map_err(|_| spawn_err(io::Error::new(io::ErrorKind::InvalidInput, "nul byte")));
    let candidates = if program.as_os_str().as_bytes().contains(&b'/') {
        vec![c(program.as_os_str().as_bytes())?]
    } else {
        // execvp's search; an empty entry is the working directory.
        path.split(|b| *b == b':')
            .map(|d| if d.is_empty() { l.dir.join(&program) } else { Path::new(OsStr::from_bytes(d)).join(&program) })
            .map(|p| c(p.as_os_str().as_bytes()))
            .collect::<Result<_, _>>()?
    };
    let mut argv = vec![c(program.as_os_str().as_bytes())?];
    for a in &l.argv[1..] {
        argv.push(c(a.as_bytes())?);
    }
    let envp = env.iter().map(|(k, v)| c(&[*k, b"=", *v].concat())).collect::<Result<_, _>>()?;
    let mut setup = ChildSetup {
        drop_to: l.run_as.needs_switch().then_some((l.run_as.uid, l.run_as.gid)),
        nofile: crate::fd_limit::original(),
        ..Default::default()
    };
    for (slot, file) in setup.cgroup_procs_fds.iter_mut().zip(l.cgroup_procs) {
        *slot = Some(file.as_raw_fd());
    }
    let exec = vfork::Exec {
        candidates,
        argv,
        envp,
        dir: c(l.dir.as_os_str().as_bytes())?,
        stdio: [dev_null().map_err(spawn_err)?.as_raw_fd(), l.stdout.as_raw_fd(), l.stderr.as_raw_fd()],
        setup,
    };
    let pid = vfork::spawn(&exec).map_err(spawn_err)?;
    Ok(Child::adopt(pid))
}

/// `/dev/null` for every child's stdin, opened once.
fn dev_null() -> io::Result<&'static File> {
    static NULL: std::sync::OnceLock<File> = std::sync::OnceLock::new();
    if let Some(f) = NULL.get() {
        return Ok(f);
    }
    let f = File::open("/dev/null")?;
    Ok(NULL.get_or_init(|| f))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn resolves_programs() {
        let dir = Path::new("/srv/i");
        assert_eq!(program("bin/run.sh", dir), PathBuf::from("/srv/i/bin/run.sh"));
        assert_eq!(program("./run.sh", dir), PathBuf::from("/srv/i/./run.sh"));
        assert_eq!(program("/bin/sh", dir), PathBuf::from("/bin/sh"));
        assert_eq!(program("sleep", dir), PathBuf::from("sleep"));
    }

    #[test]
    fn tail_covers_only_this_run_and_is_bounded() {
        let tmp = tempfile::tempdir().unwrap();
        let logs = open_logs(tmp.path(), &super::super::users::current()).unwrap();
        let mut w = logs.stderr.try_clone().unwrap();
        w.write_all(b"old run\n").unwrap();
        let from = logs.stderr.metadata().unwrap().len();
        for i in 0..30 {
            writeln!(w, "line {i}").unwrap();
        }
        let t = tail(&logs.stderr, from);
        assert!(!t.contains("old run"));
        assert_eq!(t.lines().count(), 20);
        assert!(t.starts_with("line 10") && t.ends_with("line 29"));
        w.write_all(&vec![b'x'; 10_000]).unwrap();
        w.write_all(b"\nlast\n").unwrap();
        let t = tail(&logs.stderr, from);
        assert!(t.len() <= 4096 && t.ends_with("last"));
    }

    #[test]
    fn refuses_log_files_that_are_links_or_fifos() {
        let tmp = tempfile::tempdir().unwrap();
        let victim = tmp.path().join("victim");
        std::fs::write(&victim, "precious\n").unwrap();
        std::fs::create_dir(tmp.path().join("logs")).unwrap();
        std::fs::hard_link(&victim, tmp.path().join("logs/stderr.log")).unwrap();
        assert!(open_logs(tmp.path(), &super::super::users::current()).is_err());
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious\n");
        std::fs::remove_file(tmp.path().join("logs/stderr.log")).unwrap();
        std::fs::remove_file(tmp.path().join("logs/stdout.log")).unwrap();
        nix::unistd::mkfifo(&tmp.path().join("logs/stdout.log"), Mode::from_bits_truncate(0o644)).unwrap();
        assert!(open_logs(tmp.path(), &super::super::users::current()).is_err());
    }

    #[test]
    fn refuses_a_symlinked_logs_dir() {
        let tmp = tempfile::tempdir().unwrap();
        let target = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(target.path(), tmp.path().join("logs")).unwrap();
        assert!(open_logs(tmp.path(), &super::super::users::current()).is_err());
        assert!(!target.path().join("stderr.log").exists());
    }
}
