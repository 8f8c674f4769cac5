//! A thread's OS priority (its nice value), lowered while it runs bulk work
//! and raised back while a request waits for it.
//!
//! On Linux the nice value belongs to a thread: `setpriority(PRIO_PROCESS,
//! tid)` changes that thread alone. Lowering it is always allowed; raising
//! it back needs `CAP_SYS_NICE` or an `RLIMIT_NICE` that reaches the
//! starting value. [`ThreadNice::lower_current`] therefore lowers a thread
//! only once the process has shown, on a scratch thread, that it can raise
//! one back: a thread left low for good would slow every request on it.

use std::io;

use rustix::process::{Pid, getpriority_process, setpriority_process};

/// One thread's two priorities: where it started, and where bulk work runs.
#[derive(Debug, Clone, Copy)]
pub struct ThreadNice {
    tid: Pid,
    base: i32,
    low: i32,
}

/// Why a thread was not lowered.
#[derive(Debug, thiserror::Error)]
pub enum NotLowered {
    #[error("the nice value is already at its lowest priority ({0})")]
    AtLowest(i32),
    #[error("this process may not raise a thread's priority back (needs CAP_SYS_NICE or RLIMIT_NICE): {0}")]
    CannotRaise(io::Error),
    #[error("{0}")]
    Io(#[from] io::Error),
}

/// The lowest priority a nice value gives.
const LOWEST: i32 = 19;

impl ThreadNice {
    /// Lowers the calling thread's priority by `by` steps (at most to nice
    /// 19), if this process may raise it back; else leaves it as it is.
    pub fn lower_current(by: u8) -> Result<ThreadNice, NotLowered> {
        let tid = rustix::thread::gettid();
        let base = getpriority_process(Some(tid)).map_err(io::Error::from)?;
        let low = lowered(base, by);
        if low == base {
            return Err(NotLowered::AtLowest(base));
        }
        probe_raise(base, low)?;
        let nice = ThreadNice { tid, base, low };
        nice.set(false)?;
        Ok(nice)
    }

    /// `raised`: back to the thread's starting priority; else lowered.
    pub fn set(&self, raised: bool) -> io::Result<()> {
        setpriority_process(Some(self.tid), if raised { self.base } else { self.low }).map_err(io::Error::from)
    }

    /// The thread's nice value now, as the kernel has it.
    #[cfg(test)]
    fn current(&self) -> io::Result<i32> {
        getpriority_process(Some(self.tid)).map_err(io::Error::from)
    }
}

/// `nice` lowered by `by` steps, at most to the lowest priority.
fn lowered(nice: i32, by: u8) -> i32 {
    (nice + i32::from(by)).min(LOWEST)
}

/// The calling thread's nice value lowered by `by` steps: what
/// [`set_current_for_good`] gives threads started later, whatever the
/// thread that starts them runs at.
pub fn current_lowered(by: u8) -> io::Result<i32> {
    Ok(lowered(getpriority_process(None)?, by))
}

/// Sets the calling thread's nice value for good (a thread that is never
/// raised back: lowering needs no privilege).
pub fn set_current_for_good(nice: i32) -> io::Result<()> {
    setpriority_process(None, nice).map_err(io::Error::from)
}

/// Lowers a scratch thread from `base` to `low` and raises it back: an
/// error when the raise is refused.
fn probe_raise(base: i32, low: i32) -> Result<(), NotLowered> {
    let probe = std::thread::Builder::new().name("nice-probe".into()).spawn(move || -> Result<(), NotLowered> {
        let tid = rustix::thread::gettid();
        setpriority_process(Some(tid), base).map_err(|e| NotLowered::CannotRaise(e.into()))?;
        setpriority_process(Some(tid), low).map_err(io::Error::from)?;
        setpriority_process(Some(tid), base).map_err(|e| NotLowered::CannotRaise(e.into()))
    })?;
    probe.join().unwrap_or_else(|_| Err(io::Error::other("the probe thread panicked").into()))
}

/// A thread's nice value as `/proc` shows it (field 19 of its `stat`), to
/// check the kernel's view independently of `getpriority`.
#[cfg(test)]
pub(crate) fn nice_in_proc(tid: i32) -> i32 {
    let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).expect("the thread's stat");
    // The fields after the command's ')' start at field 3.
    let fields: Vec<&str> = stat.rsplit_once(')').expect("comm").1.split_whitespace().collect();
    fields[19 - 3].parse().expect("nice is a number")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The thread is lowered, raised to where it started and lowered again,
    /// as `/proc` shows; no other thread moves.
    #[test]
    fn a_lowered_thread_goes_back_to_its_starting_priority() {
        let main_tid = rustix::thread::gettid().as_raw_nonzero().get();
        let main_before = nice_in_proc(main_tid);
        std::thread::spawn(move || {
            let nice = match ThreadNice::lower_current(10) {
                Ok(n) => n,
                Err(e) => panic!("cannot test: {e} (run as root, as CI does)"),
            };
            let (base, low) = (nice.base, lowered(nice.base, 10));
            let tid = nice.tid.as_raw_nonzero().get();
            assert_eq!((nice.current().unwrap(), nice_in_proc(tid)), (low, low));
            nice.set(true).expect("raised");
            assert_eq!((nice.current().unwrap(), nice_in_proc(tid)), (base, base));
            nice.set(false).expect("lowered");
            assert_eq!(nice_in_proc(tid), low);
        })
        .join()
        .expect("the thread's checks");
        assert_eq!(main_before, nice_in_proc(main_tid), "only the lowered thread moved");
    }
}
