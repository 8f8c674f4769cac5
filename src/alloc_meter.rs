//! The process's global allocator (mimalloc) with a per-thread byte meter.
//!
//! Owns the `#[global_allocator]` of every binary that links the library
//! (the `flotilla` binary, unit and integration tests, benches, fuzz
//! targets), so what the tests measure is what the master runs.
//!
//! Why a meter: a template can build a string of gigabytes in a few
//! instructions (`{% set x = x ~ x %}` thirty times), and minijinja's fuel
//! counts instructions, not bytes. The renderer (`spec::render::budget`)
//! runs each render inside [`measure`] and asks [`live`] between
//! instructions; the render fails once the bytes it holds pass its budget.
//!
//! The meter is thread-local and off by default: outside [`measure`] the
//! allocator costs one thread-local read more than plain mimalloc. Inside,
//! every allocation on this thread adds its size, every free on this thread
//! subtracts it (wherever the block came from), and a `realloc` adds the
//! difference. The thread-locals are `const`-initialised `Cell`s without
//! `Drop`, so touching them never allocates (which would recurse into the
//! allocator) and never fails during thread teardown.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout};
use std::cell::Cell;

/// mimalloc, not glibc's malloc: under load the master spent a quarter of
/// its CPU in glibc's allocator, and its per-thread arenas held freed
/// memory (BENCHMARKS.md). Built with `no_thp`: where transparent huge
/// pages are `always`, mimalloc's eagerly committed arenas became resident
/// 2 MiB at a time (an agent with 333 instances held 340 MiB instead of
/// 50); the agent gives its children the machine's policy back
/// (`agent/process/vfork.rs`). `main.rs` tunes its options.
#[global_allocator]
static ALLOCATOR: MeteredAlloc = MeteredAlloc;

/// mimalloc behind a byte meter (see the module doc).
pub struct MeteredAlloc;

thread_local! {
    /// Whether a [`measure`] is running on this thread.
    static ACTIVE: Cell<bool> = const { Cell::new(false) };
    /// Bytes allocated minus bytes freed on this thread since the meter
    /// started; negative when the measured code frees older memory.
    static LIVE: Cell<isize> = const { Cell::new(0) };
    /// The highest `LIVE` since the meter started.
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

#[inline(always)]
fn record(delta: isize) {
    // The one read every allocation pays when no meter runs.
    if !ACTIVE.get() {
        return;
    }
    let live = LIVE.get().wrapping_add(delta);
    LIVE.set(live);
    if live > PEAK.get() {
        PEAK.set(live);
    }
}

// SAFETY: every method forwards to mimalloc with the caller's arguments
// unchanged, so mimalloc's guarantees are this allocator's; the meter only
// reads and writes thread-local cells, which neither allocate nor unwind.
unsafe impl GlobalAlloc for MeteredAlloc {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded as is; the caller upholds `alloc`'s contract.
        let p = unsafe { mimalloc::MiMalloc.alloc(layout) };
        if !p.is_null() {
            record(layout.size() as isize);
        }
        p
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded as is; the caller upholds `alloc_zeroed`'s contract.
        let p = unsafe { mimalloc::MiMalloc.alloc_zeroed(layout) };
        if !p.is_null() {
            record(layout.size() as isize);
        }
        p
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by this allocator (so by mimalloc)
        // with `layout`, as `dealloc`'s contract requires.
        unsafe { mimalloc::MiMalloc.dealloc(ptr, layout) };
        record(-(layout.size() as isize));
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` and `layout` come from this allocator (so from
        // mimalloc), as `realloc`'s contract requires.
        let p = unsafe { mimalloc::MiMalloc.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            record(new_size as isize - layout.size() as isize);
        }
        p
    }
}

/// What one [`measure`] saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// Bytes still held at the end (allocated minus freed).
    pub live: isize,
    /// The most bytes held at any moment.
    pub peak: isize,
}

/// Restores the meter of an enclosing [`measure`] (or turns the meter off)
/// when a measured closure returns or unwinds.
struct Restore {
    active: bool,
    live: isize,
    peak: isize,
}

impl Drop for Restore {
    fn drop(&mut self) {
        let (live, peak) = (LIVE.get(), PEAK.get());
        // An enclosing meter sees what the inner one saw, on top of its own.
        LIVE.set(self.live.wrapping_add(live));
        PEAK.set(self.peak.max(self.live.wrapping_add(peak)));
        ACTIVE.set(self.active);
    }
}

/// Runs `f` with the meter on for this thread and says how many bytes it
/// held at the end and at most. Nests: an enclosing measure counts what
/// the inner one did.
pub fn measure<R>(f: impl FnOnce() -> R) -> (R, Usage) {
    let restore = Restore { active: ACTIVE.get(), live: LIVE.get(), peak: PEAK.get() };
    LIVE.set(0);
    PEAK.set(0);
    ACTIVE.set(true);
    let out = f();
    let usage = Usage { live: LIVE.get(), peak: PEAK.get() };
    drop(restore);
    (out, usage)
}

/// Bytes held so far by the innermost [`measure`] running on this thread
/// (0 when none runs).
pub fn live() -> isize {
    if ACTIVE.get() { LIVE.get() } else { 0 }
}

/// The most bytes the innermost [`measure`] on this thread has held so far.
pub fn peak() -> isize {
    if ACTIVE.get() { PEAK.get() } else { 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_what_the_closure_allocates_frees_and_holds() {
        let (v, usage) = measure(|| {
            let kept = vec![0u8; 1 << 20];
            let dropped = vec![0u8; 4 << 20];
            drop(dropped);
            kept
        });
        assert_eq!(v.len(), 1 << 20);
        assert!(usage.live >= 1 << 20 && usage.live < (1 << 20) + 4096, "{usage:?}");
        assert!(usage.peak >= 5 << 20 && usage.peak < (5 << 20) + 4096, "{usage:?}");
        // Freed outside the meter: not counted anywhere.
        drop(v);
        assert_eq!(live(), 0);
    }

    #[test]
    fn realloc_counts_the_difference_and_frees_of_older_memory_go_negative() {
        let old = vec![0u8; 1 << 20];
        let ((), usage) = measure(|| {
            let mut s: Vec<u8> = Vec::with_capacity(1 << 10);
            s.reserve_exact(2 << 20);
            assert!(live() >= 2 << 20);
            drop(s);
            drop(old);
        });
        assert!(usage.live <= -(1 << 20) + 4096, "{usage:?}");
        assert!(usage.peak >= 2 << 20, "{usage:?}");
    }

    #[test]
    fn nested_measures_add_up_and_other_threads_are_not_counted() {
        let ((), outer) = measure(|| {
            let a = vec![0u8; 1 << 20];
            let (b, inner) = measure(|| vec![0u8; 2 << 20]);
            assert!(inner.live >= 2 << 20 && inner.live < (2 << 20) + 4096, "{inner:?}");
            std::thread::spawn(|| drop(vec![0u8; 8 << 20])).join().unwrap();
            drop((a, b));
        });
        // The spawned thread's 8 MiB is not in it (a thread's own stack and
        // bookkeeping allocations on this side are small).
        assert!(outer.peak >= 3 << 20 && outer.peak < 4 << 20, "{outer:?}");
        assert!(outer.live.abs() < 64 << 10, "{outer:?}");
    }
}
