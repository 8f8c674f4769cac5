//! The one place of the crate with `unsafe`: the `pre_exec` hook that runs in
//! the forked child between `fork` and `exec`.
//!
//! Why unsafe is needed here: std/tokio only offer `pre_exec` as an `unsafe`
//! fn, because the closure runs in a child that may have been forked from a
//! multi-threaded parent, where only async-signal-safe calls are allowed.
//! The hook below therefore does nothing but plain `libc` syscalls on values
//! copied in before the fork (no allocation, no locks, no formatting).
//!
//! Why not std's `CommandExt::uid/gid`: std runs `pre_exec` closures *after*
//! it switched uid, and both things we must do in the child need root:
//! moving into the instance cgroup (a write to a root-owned `cgroup.procs`)
//! and `setgroups`. So the hook does, in this order:
//! 1. `prctl(PR_SET_THP_DISABLE, 0)` and the open-files limit the agent
//!    started with (best effort): the agent's own "no transparent huge
//!    pages" and raised limit are inherited across `exec`, and are not the
//!    instance's business;
//! 2. `write(fd, "0")` to `cgroup.procs` of every cgroup the child joins (the
//!    instance's v2 cgroup and its limit cgroups, v2 or v1; the fds were
//!    opened in the parent), so the process is in them before `exec` and
//!    every descendant is born inside them;
//! 3. when dropping from root to the run-as user: `setgroups(1, [gid])` (a
//!    process must not keep root's supplementary groups), `setgid`, `setuid`.
//!
//! The second, smaller reason for this file: tokio (since 1.54) only
//! registers a raw fd with its reactor through the `unsafe`
//! `AsyncFd::register_with_interest` (the safe `AsyncFd::new` is deprecated
//! as unsound for types whose fd may change). [`AsyncInotify`] owns its fd
//! for its whole life, which is exactly the contract that call asks for.
//! The same goes for [`async_pidfd`]: `pidfd_open` (which std does not
//! wrap for a pid that is not our child) and the pidfd's registration.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};

use nix::sys::inotify::Inotify;
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

/// How many cgroups a child can join: the instance's v2 cgroup plus one
/// limit cgroup per hierarchy (memory, cpu), with room to spare.
pub const MAX_CGROUPS: usize = 4;

/// What the child does to itself before `exec`. Plain `Copy` data (a fixed
/// array, not a `Vec`), so the closure captures no heap memory.
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

/// Installs the hook on `cmd`.
pub fn install(cmd: &mut tokio::process::Command, setup: ChildSetup) {
    // SAFETY: the closure only calls async-signal-safe syscalls (prctl,
    // write, setgroups, setgid, setuid) on integers captured by copy; it
    // allocates nothing (`io::Error::last_os_error` stores the errno inline).
    unsafe {
        cmd.pre_exec(move || in_child(setup));
    }
}

fn in_child(setup: ChildSetup) -> io::Result<()> {
    // The agent runs with transparent huge pages off (its allocator asks
    // for that, see `main.rs`), which `fork` and `exec` pass on: give the
    // instance the machine's own policy back. Best effort: a kernel or
    // sandbox without this prctl has nothing to give back.
    let zero: libc::c_ulong = 0;
    // SAFETY: plain syscall with integer arguments (the kernel wants the
    // unused ones zero, as unsigned longs).
    unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, zero, zero, zero, zero) };
    // The agent raised its open-files limit (`fd_limit`); the instance gets
    // the one the agent started with. Best effort too.
    if let Some((soft, hard)) = setup.nofile {
        let lim = libc::rlimit { rlim_cur: soft, rlim_max: hard };
        // SAFETY: `lim` is a valid rlimit on the stack.
        unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) };
    }
    for fd in setup.cgroup_procs_fds.into_iter().flatten() {
        // "0" means "the writing process" in cgroup.procs (v1 and v2).
        let buf = b"0";
        // SAFETY: `buf` is a valid 1-byte buffer; `fd` is open (parent keeps it).
        let n = unsafe { libc::write(fd, buf.as_ptr().cast(), 1) };
        if n != 1 {
            return Err(io::Error::last_os_error());
        }
    }
    if let Some((uid, gid)) = setup.drop_to {
        let groups: [libc::gid_t; 1] = [gid];
        // SAFETY: `groups` is a valid array of length 1.
        if unsafe { libc::setgroups(1, groups.as_ptr()) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: plain syscalls with integer arguments.
        if unsafe { libc::setgid(gid) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: as above.
        if unsafe { libc::setuid(uid) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// An inotify instance owned for its whole life (its fd never changes).
#[derive(Debug)]
pub struct OwnedInotify(Inotify);

impl OwnedInotify {
    pub fn get(&self) -> &Inotify {
        &self.0
    }
}

impl AsRawFd for OwnedInotify {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

/// A non-blocking inotify fd driven by tokio's reactor.
pub type AsyncInotify = AsyncFd<OwnedInotify>;

/// Registers `ino` (created with `IN_NONBLOCK`) for readability with the
/// current tokio runtime.
pub fn async_inotify(ino: Inotify) -> io::Result<AsyncInotify> {
    // SAFETY: `OwnedInotify` owns the fd (an `OwnedFd` inside `Inotify`) and
    // cannot give it away, so it stays open and the same for the whole life
    // of the `AsyncFd`, and `as_raw_fd` always returns it.
    unsafe { AsyncFd::register_with_interest(OwnedInotify(ino), Interest::READABLE) }.map_err(io::Error::from)
}

/// A pidfd driven by tokio's reactor: readable once the process has ended.
pub type AsyncPidfd = AsyncFd<OwnedFd>;

/// Opens a pidfd of process `pid` (any process, not only our children) and
/// registers it with the current tokio runtime. Fails without pidfds
/// (kernels before 5.3) or descriptors.
pub fn async_pidfd(pid: u32) -> io::Result<AsyncPidfd> {
    let pid = libc::pid_t::try_from(pid).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor
    // or -1; it touches no memory of ours.
    let raw = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    let raw = RawFd::try_from(raw).map_err(|_| io::Error::from(io::ErrorKind::InvalidData))?;
    // SAFETY: `raw` was just returned by the kernel and nothing else owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: the `AsyncFd` owns the `OwnedFd`, so the fd stays open and the
    // same until the `AsyncFd` is dropped.
    unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }.map_err(io::Error::from)
}
