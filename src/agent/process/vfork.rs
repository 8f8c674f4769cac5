//! Spawning a command without copying the agent: `clone(CLONE_VM |
//! CLONE_VFORK)`, as `posix_spawn` does, plus what `posix_spawn` cannot do
//! (joining cgroups and switching user before `exec`).
//!
//! Why: a `fork` copies the page tables of the whole agent, the `exec` that
//! follows tears that copy down again, and the parent takes copy-on-write
//! faults meanwhile. Measured during `flotilla bench real` (1,000 starts,
//! `perf record -a -g`): `_Fork` 12.5 %, the old address space's teardown in
//! `execve` 11.5 % and page faults 6 % of the whole machine's CPU, which was
//! 98 % busy, 80 % of it in the kernel. A vfork child shares the agent's
//! memory and the calling thread waits until the child has called `exec` (or
//! failed), so nothing is copied.
//!
//! Why `unsafe`, and what keeps it sound: the child runs on a stack of its
//! own inside the agent's memory, while the calling thread is suspended. It
//! must not allocate, take a lock, or call anything that touches state of
//! the agent's other threads. So:
//! - everything it needs (paths, argv, envp as C strings, fds, ids) is
//!   prepared by the parent in [`Prepared`] before the clone;
//! - it calls only plain syscalls; the user switch uses the raw
//!   `setgroups`/`setgid`/`setuid` syscalls, because glibc's wrappers would
//!   make every *thread of the agent* switch user (the `setxid` broadcast of
//!   a multi-threaded process, whose threads the child shares);
//! - all signals are blocked in the parent around the clone, so no handler
//!   of the agent runs in the child; the child puts every handled (and
//!   `SIGPIPE`, which the Rust runtime ignores) signal back to its default
//!   and unblocks everything just before `exec`, as std's `Command` does;
//! - a failure is written as (stage, errno) to a close-on-exec pipe, then
//!   `_exit(127)`; the parent reads it after the child is gone and reaps it.
//!
//! What the child does, in order: default signal handlers, `setpgid(0, 0)`,
//! stdin/stdout/stderr, `chdir`, `prctl(PR_SET_THP_DISABLE, 0)` and the open
//! files limit the agent started with (best effort: the agent's "no
//! transparent huge pages" and raised limit are not the instance's
//! business), a write of `"0"` to the `cgroup.procs` of every cgroup it joins
//! (so it and every descendant are born inside them), then, when dropping
//! from root, `setgroups([gid])`, `setgid`, `setuid`, and `execve` of each
//! candidate path until one runs.
#![allow(unsafe_code)]

use std::ffi::{CString, c_char, c_int, c_void};
use std::io::{self, Read};
use std::os::fd::{AsRawFd, RawFd};

/// How many cgroups a child can join: the instance's v2 cgroup plus one
/// limit cgroup per hierarchy (memory, cpu), with room to spare.
pub const MAX_CGROUPS: usize = 4;

/// The child's own stack, inside the agent's memory.
const CHILD_STACK: usize = 64 * 1024;

/// What the child does to itself before `exec`.
#[derive(Debug, Clone, Copy, Default)]
pub struct ChildSetup {
    /// Open, writable fds of `<cgroup>/cgroup.procs`, joined in this order;
    /// they must stay open in the parent until the spawn returned (they are
    /// close-on-exec).
    pub cgroup_procs_fds: [Option<RawFd>; MAX_CGROUPS],
    /// `(uid, gid)` to switch to; only when the agent is root.
    pub drop_to: Option<(u32, u32)>,
    /// The open-files limit (soft, hard) to set, the agent's own before it
    /// raised it.
    pub nofile: Option<(u64, u64)>,
}

/// One command, ready to execute.
pub struct Exec {
    /// Paths to `execve`, in order, until one runs (a bare program name has
    /// one per `PATH` entry).
    pub candidates: Vec<CString>,
    pub argv: Vec<CString>,
    /// `KEY=VALUE`
    pub envp: Vec<CString>,
    pub dir: CString,
    /// The child's stdin, stdout and stderr (open in the parent; they may be
    /// close-on-exec, `dup2` clears that on the copies).
    pub stdio: [RawFd; 3],
    pub setup: ChildSetup,
}

/// Where a child failed, written with its errno to the report pipe.
#[derive(Debug, Clone, Copy)]
#[repr(i32)]
enum Stage {
    ProcessGroup = 1,
    Stdio,
    Dir,
    Cgroup,
    Groups,
    Gid,
    Uid,
    Exec,
}

impl Stage {
    fn from_i32(n: i32) -> Option<Stage> {
        [
            Stage::ProcessGroup,
            Stage::Stdio,
            Stage::Dir,
            Stage::Cgroup,
            Stage::Groups,
            Stage::Gid,
            Stage::Uid,
            Stage::Exec,
        ]
        .into_iter()
        .find(|s| *s as i32 == n)
    }

    fn what(self) -> &'static str {
        match self {
            Stage::ProcessGroup => "creating the process group",
            Stage::Stdio => "setting up stdin/stdout/stderr",
            Stage::Dir => "changing to the working directory",
            Stage::Cgroup => "joining the cgroup",
            Stage::Groups => "setting the supplementary groups",
            Stage::Gid => "switching group",
            Stage::Uid => "switching user",
            Stage::Exec => "executing",
        }
    }
}

/// Everything the child reads, as raw pointers into memory the parent keeps
/// alive until the child has called `exec` or exited.
struct Prepared {
    candidates: Vec<*const c_char>,
    argv: Vec<*const c_char>,
    envp: Vec<*const c_char>,
    dir: *const c_char,
    stdio: [RawFd; 3],
    setup: ChildSetup,
    report: RawFd,
}

/// Spawns `exec` in a new process group and returns its pid once it runs
/// the new program. The child is the caller's to reap. A child that failed
/// before `exec` is reaped here and its failure returned (`NotFound` and the
/// like for the `exec` itself, as std's `Command` reports them).
pub fn spawn(exec: &Exec) -> io::Result<u32> {
    let terminated = |v: &[CString]| v.iter().map(|c| c.as_ptr()).chain(std::iter::once(std::ptr::null())).collect();
    let (read_end, write_end) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(io::Error::from)?;
    let prepared = Prepared {
        candidates: exec.candidates.iter().map(|c| c.as_ptr()).collect(),
        argv: terminated(&exec.argv),
        envp: terminated(&exec.envp),
        dir: exec.dir.as_ptr(),
        stdio: exec.stdio,
        setup: exec.setup,
        report: write_end.as_raw_fd(),
    };
    let mut stack = vec![0u8; CHILD_STACK];
    // Stacks grow down; the top must be 16-byte aligned.
    let top = (stack.as_mut_ptr() as usize + stack.len()) & !15;
    // SAFETY: sigset_t is plain data; all-zero is a valid value to fill.
    let mut all: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `all` and `old` are valid sigsets on our stack.
    unsafe {
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
    }
    // SAFETY: `child` only reads `prepared` (alive until clone returns, which
    // with CLONE_VFORK is after the child called exec or exited) and runs on
    // `stack` (alive as long too); it follows the rules of the module doc.
    let pid = unsafe {
        libc::clone(
            child,
            top as *mut c_void,
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            (&prepared as *const Prepared).cast_mut().cast(),
        )
    };
    let clone_error = io::Error::last_os_error();
    // SAFETY: `old` is the mask saved above.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
    drop(stack);
    drop(prepared);
    if pid < 0 {
        return Err(clone_error);
    }
    drop(write_end);
    let mut report = [0u8; 8];
    let mut got = 0;
    let mut pipe = std::fs::File::from(read_end);
    while got < report.len() {
        match pipe.read(&mut report[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                reap_failed(pid);
                return Err(e);
            }
        }
    }
    if got == 0 {
        // The pipe closed at exec: the program runs.
        return u32::try_from(pid).map_err(|_| io::Error::from(io::ErrorKind::InvalidData));
    }
    reap_failed(pid);
    let stage = i32::from_ne_bytes([report[0], report[1], report[2], report[3]]);
    let errno = i32::from_ne_bytes([report[4], report[5], report[6], report[7]]);
    let os = io::Error::from_raw_os_error(errno);
    match Stage::from_i32(stage) {
        _ if got != report.len() => Err(io::Error::other("the child's failure report was cut short")),
        Some(Stage::Exec) => Err(os),
        Some(s) => Err(io::Error::new(os.kind(), format!("{}: {os}", s.what()))),
        None => Err(io::Error::other(format!("the child failed at an unknown stage {stage}: {os}"))),
    }
}

/// Reaps a child that exited before `exec` (it has, or is about to).
fn reap_failed(pid: c_int) {
    let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None);
}

fn errno() -> c_int {
    // SAFETY: the calling thread's errno; in the child that is the parent
    // thread's, which is suspended until the child is gone.
    unsafe { *libc::__errno_location() }
}

/// Reports (stage, errno) to the parent and exits.
fn fail(report: RawFd, stage: Stage, errno: c_int) -> ! {
    let mut msg = [0u8; 8];
    msg[..4].copy_from_slice(&(stage as i32).to_ne_bytes());
    msg[4..].copy_from_slice(&errno.to_ne_bytes());
    // SAFETY: `msg` is an 8-byte buffer on the child's stack; `_exit` ends the
    // child without running any of the agent's exit handlers.
    unsafe {
        libc::write(report, msg.as_ptr().cast(), msg.len());
        libc::_exit(127)
    }
}

/// The child, between clone and exec. Plain syscalls only (see the module doc).
extern "C" fn child(arg: *mut c_void) -> c_int {
    // SAFETY: `arg` is the parent's `Prepared`, alive and unchanged until this
    // child has exec'd or exited.
    let p = unsafe { &*(arg as *const Prepared) };
    // SAFETY (whole block): plain syscalls on integers, on pointers into
    // `p` (valid C strings, null-terminated arrays) or on values on this stack.
    unsafe {
        for sig in 1..65 {
            if sig == libc::SIGKILL || sig == libc::SIGSTOP {
                continue;
            }
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(sig, std::ptr::null(), &mut old) != 0 {
                continue;
            }
            let handled = old.sa_sigaction != libc::SIG_DFL && old.sa_sigaction != libc::SIG_IGN;
            if handled || sig == libc::SIGPIPE {
                let mut dfl: libc::sigaction = std::mem::zeroed();
                dfl.sa_sigaction = libc::SIG_DFL;
                libc::sigaction(sig, &dfl, std::ptr::null_mut());
            }
        }
        if libc::setpgid(0, 0) != 0 {
            fail(p.report, Stage::ProcessGroup, errno());
        }
        for (target, fd) in p.stdio.iter().enumerate() {
            if libc::dup2(*fd, target as c_int) < 0 {
                fail(p.report, Stage::Stdio, errno());
            }
        }
        if libc::chdir(p.dir) != 0 {
            fail(p.report, Stage::Dir, errno());
        }
        let zero: libc::c_ulong = 0;
        libc::prctl(libc::PR_SET_THP_DISABLE, zero, zero, zero, zero);
        if let Some((soft, hard)) = p.setup.nofile {
            let lim = libc::rlimit { rlim_cur: soft, rlim_max: hard };
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
        for fd in p.setup.cgroup_procs_fds.into_iter().flatten() {
            // "0" means "the writing process" in cgroup.procs (v1 and v2).
            if libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                fail(p.report, Stage::Cgroup, errno());
            }
        }
        if let Some((uid, gid)) = p.setup.drop_to {
            let groups: [libc::gid_t; 1] = [gid];
            if libc::syscall(libc::SYS_setgroups, 1, groups.as_ptr()) != 0 {
                fail(p.report, Stage::Groups, errno());
            }
            if libc::syscall(libc::SYS_setgid, gid) != 0 {
                fail(p.report, Stage::Gid, errno());
            }
            if libc::syscall(libc::SYS_setuid, uid) != 0 {
                fail(p.report, Stage::Uid, errno());
            }
        }
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
        // execvp's rule: a candidate that is missing (or not searchable) lets
        // the next one try; a permission error is kept unless a later one runs.
        let mut error = libc::ENOENT;
        for path in &p.candidates {
            libc::execve(*path, p.argv.as_ptr(), p.envp.as_ptr());
            match errno() {
                libc::ENOENT | libc::ENOTDIR => {}
                libc::EACCES => error = libc::EACCES,
                other => {
                    error = other;
                    break;
                }
            }
        }
        fail(p.report, Stage::Exec, error)
    }
}
