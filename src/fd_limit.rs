//! The open-files limit of the master and the agent. One socket per agent
//! (master) and a log file and a pidfd per instance (agent): the usual soft
//! limit of 1,024 would cap both below a thousand, so they raise it to the
//! hard limit at start, as servers do. Children must not inherit the raised
//! limit (some programs size tables by it or close every possible fd), so
//! the soft limit found at start is kept for the agent to give back to the
//! instances it spawns.

use std::sync::OnceLock;

use nix::sys::resource::{Resource, getrlimit, setrlimit};

static ORIGINAL: OnceLock<(u64, u64)> = OnceLock::new();

/// Raises the soft limit on open files to the hard one (once; without
/// permission it stays as it was, with a warning).
pub fn raise() {
    let (soft, hard) = match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok(limits) => limits,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the limit on open files");
            return;
        }
    };
    let _ = ORIGINAL.set((soft, hard));
    if soft >= hard {
        return;
    }
    match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
        Ok(()) => tracing::debug!(from = soft, to = hard, "raised the limit on open files"),
        Err(e) => tracing::warn!(soft, hard, error = %e, "cannot raise the limit on open files"),
    }
}

/// The (soft, hard) limit this process had before [`raise`], if it ran.
pub fn original() -> Option<(u64, u64)> {
    ORIGINAL.get().copied()
}

#[cfg(test)]
mod tests {
    #[test]
    fn raises_to_the_hard_limit_and_remembers_the_original() {
        use nix::sys::resource::{Resource, getrlimit};
        let before = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
        super::raise();
        let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
        assert_eq!(soft, hard, "the soft limit is the hard one");
        // Another test may have raised it first: then that is the original.
        let original = super::original().unwrap();
        assert!(original == before || original.0 <= before.0, "{original:?} vs {before:?}");
    }
}
