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
//!   of the agent runs in the child; the child puts every signal back to
//!   its default (handled ones, `SIGPIPE`, which the Rust runtime ignores,
//!   and any the agent inherited ignored, as systemd does; std's `Command`
//!   keeps those) and unblocks everything just before `exec`;
//! - a failure is written as (stage, errno) to a close-on-exec pipe, then
//!   `_exit(127)`; the parent reads it after the child is gone and reaps it.
//!
//! What the child does, in order: default signal handlers, `setsid()` (a
//! session and process group of its own),
//! stdin/stdout/stderr, `chdir`, umask 022, the open-files limit the agent started with
//! (best effort: the agent's raised limit is not the instance's business), a
//! write of `"0"` to the `cgroup.procs` of every cgroup it joins (so it and
//! every descendant are born inside them), then, when dropping from root,
//! `setgroups([gid])`, `setgid`, `setuid`, and `execve` of each candidate
//! path until one runs (a file without `#!` through `/bin/sh`, as `execvp`).
//!
//! Transparent huge pages: the agent runs with them off (its allocator asks
//! for that with `PR_SET_THP_DISABLE`), a flag of the *address space* that
//! `execve` copies into the new program. A vfork child shares the agent's
//! address space, so it cannot clear the flag for itself alone: it clears the
//! shared flag right before `execve` (the new program inherits "off" no
//! more), and the parent sets it again as soon as the child has left. Every
//! spawn holds one lock from reading the flag until its child has left, so
//! no child can inherit another's window (nor read the flag inside one);
//! during a window (the length of an `exec`) the agent's own new memory may
//! get huge pages.
#![allow(unsafe_code)]

use std::ffi::{CString, c_char, c_int, c_void};
use std::io::{self, Read};
use std::os::fd::{AsRawFd, RawFd};

/// How many cgroups a child can join: the instance's v2 cgroup plus one
/// limit cgroup per hierarchy (memory, cpu), with room to spare.
pub const MAX_CGROUPS: usize = 4;

/// The child's own stack, inside the agent's memory.
const CHILD_STACK: usize = 64 * 1024;

const BIN_SH: &std::ffi::CStr = c"/bin/sh";

/// glibc's internal signals (thread cancellation and `setxid`).
const SIGCANCEL: c_int = 32;
const SIGSETXID: c_int = 33;

/// The kernel's `struct sigaction` on x86_64 and aarch64 (what the raw
/// `rt_sigaction` syscall takes; not glibc's).
#[repr(C)]
#[derive(Default)]
struct KernelSigaction {
    handler: libc::sighandler_t,
    flags: libc::c_ulong,
    restorer: usize,
    mask: u64,
}

// The raw setuid/setgid syscalls take 32-bit ids on 64-bit Linux only.
#[cfg(not(all(target_os = "linux", target_pointer_width = "64")))]
compile_error!("vfork.rs assumes 64-bit Linux (32-bit ids in setuid/setgid, the kernel's sigaction layout)");

/// The umask every instance command starts with.
pub const INSTANCE_UMASK: libc::mode_t = 0o022;

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
            Stage::ProcessGroup => "creating the session and process group",
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
    /// For each candidate: `/bin/sh <candidate> <args>`, for `ENOEXEC`.
    through_sh: Vec<Vec<*const c_char>>,
    argv: Vec<*const c_char>,
    envp: Vec<*const c_char>,
    dir: *const c_char,
    stdio: [RawFd; 3],
    setup: ChildSetup,
    /// Clear the (shared) no-huge-pages flag right before `execve`.
    reset_thp: bool,
    report: RawFd,
}

/// Held by every spawn from reading the agent's no-huge-pages flag until
/// its child has left (the flag cleared meanwhile when it was set).
static THP_WINDOW: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Test hooks: sets the agent's no-huge-pages flag to `off` while no spawn
/// is inside its window; what it was.
#[cfg(test)]
pub(crate) fn swap_thp_disable(off: bool) -> bool {
    let _window = THP_WINDOW.lock().unwrap_or_else(|p| p.into_inner());
    let was = nix::sys::prctl::get_thp_disable().expect("PR_GET_THP_DISABLE");
    nix::sys::prctl::set_thp_disable(off).expect("PR_SET_THP_DISABLE");
    was
}

/// All signals, as the kernel's 64-bit set (glibc's `sigfillset` leaves out
/// the two it uses itself, which must be blocked too).
const ALL_SIGNALS: u64 = !0;

/// `rt_sigprocmask(SIG_SETMASK, set)`, the raw syscall; returns the old mask.
fn set_mask(set: u64) -> u64 {
    let mut old: u64 = 0;
    // SAFETY: `set` and `old` are 8-byte values on the stack, the size the
    // kernel's sigset has on Linux.
    unsafe { libc::syscall(libc::SYS_rt_sigprocmask, libc::SIG_SETMASK, &set, &mut old, 8) };
    old
}

/// Spawns `exec` in a new process group and returns its pid once it runs
/// the new program. The child is the caller's to reap. A child that failed
/// before `exec` is reaped here and its failure returned (`NotFound` and the
/// like for the `exec` itself, as std's `Command` reports them).
pub fn spawn(exec: &Exec) -> io::Result<u32> {
    let terminated = |v: &[*const c_char]| v.iter().copied().chain(std::iter::once(std::ptr::null())).collect();
    let argv: Vec<*const c_char> = exec.argv.iter().map(|c| c.as_ptr()).collect();
    let (read_end, write_end) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(io::Error::from)?;
    // Whether the agent runs with huge pages off (the allocator's doing; a
    // test may change it), read under the lock: read outside it, it could
    // be read inside another spawn's window (cleared for that child), and
    // this child would then exec after that spawn set it again, off.
    let window = THP_WINDOW.lock().unwrap_or_else(|p| p.into_inner());
    let thp_off = nix::sys::prctl::get_thp_disable().unwrap_or(false);
    let prepared = Prepared {
        candidates: exec.candidates.iter().map(|c| c.as_ptr()).collect(),
        through_sh: exec
            .candidates
            .iter()
            .map(|c| {
                let sh = [BIN_SH.as_ptr(), c.as_ptr()].into_iter().chain(argv.iter().skip(1).copied());
                terminated(&sh.collect::<Vec<_>>())
            })
            .collect(),
        argv: terminated(&argv),
        envp: terminated(&exec.envp.iter().map(|c| c.as_ptr()).collect::<Vec<_>>()),
        dir: exec.dir.as_ptr(),
        stdio: exec.stdio,
        setup: exec.setup,
        reset_thp: thp_off,
        report: write_end.as_raw_fd(),
    };
    let mut stack = vec![0u8; CHILD_STACK];
    // Stacks grow down; the top must be 16-byte aligned.
    let top = (stack.as_mut_ptr() as usize + stack.len()) & !15;
    let old_mask = set_mask(ALL_SIGNALS);
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
    if thp_off {
        // The child has left (exec'd or exited): huge pages off again.
        let _ = nix::sys::prctl::set_thp_disable(true);
    }
    drop(window);
    set_mask(old_mask);
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
                // Unknown whether it runs: it is ours and unreaped, so
                // killing it by pid is safe.
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
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
    let _ = wait_status(pid as u32, false);
}

/// `waitpid` of our child `pid`: its raw wait status once it has ended (and
/// is reaped), `None` while it runs (`nohang`). Raw because nix refuses a
/// status it cannot name (a real-time signal) after it has reaped.
pub fn wait_status(pid: u32, nohang: bool) -> io::Result<Option<c_int>> {
    let pid = libc::pid_t::try_from(pid).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let flags = if nohang { libc::WNOHANG } else { 0 };
    loop {
        let mut status: c_int = 0;
        // SAFETY: `status` is a valid int on the stack.
        let r = unsafe { libc::waitpid(pid, &mut status, flags) };
        match r {
            0 => return Ok(None),
            r if r == pid => return Ok(Some(status)),
            _ => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
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
            if sig == SIGCANCEL || sig == SIGSETXID {
                // glibc's own (its wrappers refuse them): ignored, as its
                // posix_spawn does; the new program's glibc installs its own.
                let ign = KernelSigaction { handler: libc::SIG_IGN, ..Default::default() };
                libc::syscall(libc::SYS_rt_sigaction, sig, &ign, std::ptr::null_mut::<KernelSigaction>(), 8);
                continue;
            }
            // Every signal, also one the agent inherited ignored (SIGHUP
            // under `nohup`, SIGINT and SIGQUIT in a background job): a
            // shell cannot trap a signal ignored when it started, so a
            // `change_signal` would never reach the instance.
            let mut dfl: libc::sigaction = std::mem::zeroed();
            dfl.sa_sigaction = libc::SIG_DFL;
            libc::sigaction(sig, &dfl, std::ptr::null_mut());
        }
        // A session of its own (and with it a process group of its own):
        // no process of another session may join its group (`setpgid`
        // answers EPERM), so another instance cannot slip a process of
        // its own into this one's group and have it signalled with it.
        if libc::setsid() < 0 {
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
        // The agent runs with umask 077 (its store and keys are its own);
        // an instance gets the usual 022. The clone has no CLONE_FS, so
        // this (like the chdir) is the child's alone.
        libc::umask(INSTANCE_UMASK);
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
        if p.reset_thp {
            let zero: libc::c_ulong = 0;
            libc::prctl(libc::PR_SET_THP_DISABLE, zero, zero, zero, zero);
        }
        set_mask(0);
        // execvp's rules: a candidate that is missing (or not searchable)
        // lets the next one try; a permission error is kept unless a later
        // one runs; a file the kernel cannot execute runs through /bin/sh.
        let mut error = libc::ENOENT;
        for (path, sh) in p.candidates.iter().zip(&p.through_sh) {
            libc::execve(*path, p.argv.as_ptr(), p.envp.as_ptr());
            let mut e = errno();
            if e == libc::ENOEXEC {
                libc::execve(BIN_SH.as_ptr(), sh.as_ptr(), p.envp.as_ptr());
                e = errno();
            }
            match e {
                libc::ENOENT | libc::ENOTDIR | libc::ESTALE | libc::ENODEV | libc::ETIMEDOUT => {}
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
