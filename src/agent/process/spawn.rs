//! Building and spawning one command of an instance: program resolution, the
//! clean environment, the log files, the user switch and the cgroup move
//! (through the `sys` hook), plus reading the stderr tail of one run.
//!
//! Log files live in `<dir>/logs/`, a directory the run-as user can write to;
//! since the agent may be root, they are opened through `agent::beneath`
//! (relative to a `logs/` fd opened without following a link, non-blocking,
//! a regular file with one link only), so a planted symlink, hard link or
//! FIFO cannot make the agent append to (or report the contents of) another
//! file, nor hang it.

use std::ffi::{CString, OsStr};
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::ProcessError;
use super::child::Child;
use super::tree::MARKER_VAR;
use super::users::RunAs;
use super::vfork::{self, ChildSetup};
use crate::agent::beneath::{BeneathError, Dir, Expect, RelPath};
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
    let shown = dir.join("logs");
    let refused = |e: BeneathError| {
        ProcessError::io(
            format!("opening the logs in {}", shown.display()),
            io::Error::other(crate::error::ErrorChain(&e).to_string()),
        )
    };
    let owner = run_as.needs_switch().then_some((run_as.uid, run_as.gid));
    let logs = Dir::open(dir).and_then(|d| d.ensure_dir(OsStr::new("logs"), 0o750, owner)).map_err(refused)?;
    // Only a plain file of the instance's own, with one link: a hard link
    // to another file would make the agent append to (and chown) that
    // file; a FIFO (opened non-blocking) is refused, not waited on.
    let expect = Expect { owner: None, single_link: true };
    let open_log = |name: &str| -> Result<File, ProcessError> {
        let rel = RelPath::name(name).map_err(refused)?;
        let file = logs.open_append(&rel, 0o640, expect).map_err(refused)?;
        if let Some((uid, gid)) = owner {
            std::os::unix::fs::fchown(&file, Some(uid), Some(gid))
                .map_err(|e| ProcessError::io(format!("chown of {}", shown.join(name).display()), e))?;
        }
        Ok(file)
    };
    let stdout = open_log(stdout_name)?;
    let stderr = open_log(stderr_name)?;
    let size = |file: &File, name: &str| {
        file.metadata()
            .map(|m| m.len())
            .map_err(|e| ProcessError::io(format!("stat of {}", shown.join(name).display()), e))
    };
    let stdout_start = size(&stdout, stdout_name)?;
    let stderr_start = size(&stderr, stderr_name)?;
    Ok(Logs { stdout, stderr, stdout_start, stderr_start })
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
        nix::unistd::mkfifo(&tmp.path().join("logs/stdout.log"), nix::sys::stat::Mode::from_bits_truncate(0o644))
            .unwrap();
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
