//! Registering raw fds with tokio's reactor, which is `unsafe`: tokio (since
//! 1.54) only takes a raw fd through `AsyncFd::register_with_interest` (the
//! safe `AsyncFd::new` is deprecated as unsound for types whose fd may
//! change). [`AsyncInotify`] owns its fd for its whole life, which is exactly
//! the contract that call asks for. The same goes for [`async_pidfd`]:
//! `pidfd_open` (which std does not wrap for a pid that is not our child) and
//! the pidfd's registration. The other place with `unsafe` is `vfork.rs`
//! (spawning a command).
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};

use nix::sys::inotify::Inotify;
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

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
