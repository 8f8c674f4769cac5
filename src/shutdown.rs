//! The signal a long-running process (master, agent, `flotilla dev`)
//! stops on: Ctrl-C or SIGTERM. Its own module, below `master` and `dev`,
//! so neither imports the other for it.

/// Resolves on Ctrl-C or SIGTERM.
pub async fn signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => return futures::future::pending().await,
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
