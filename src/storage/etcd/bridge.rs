//! The etcd client's own runtime: a small multi-thread tokio runtime on
//! threads of its own (`flotilla-etcd`), so etcd's gRPC calls never queue
//! behind actor work on the master's runtimes, and blocking callers (the
//! writer thread, `MetaStore::get`/`scan` from `spawn_blocking`) can wait
//! for a call from any thread, inside an async context or not.

use std::future::Future;
use std::time::Duration;

use crate::storage::StorageError;

/// A handle on the runtime; the runtime stops when the last clone goes.
#[derive(Clone)]
pub struct Bridge {
    runtime: std::sync::Arc<Owned>,
}

/// The runtime, shut down without waiting when the last handle goes
/// (dropping a runtime the usual way panics inside an async context).
struct Owned(Option<tokio::runtime::Runtime>);

impl Drop for Owned {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

impl std::ops::Deref for Owned {
    type Target = tokio::runtime::Runtime;
    fn deref(&self) -> &tokio::runtime::Runtime {
        // Taken only by `drop`.
        self.0.as_ref().expect("the etcd runtime is present until dropped")
    }
}

impl std::fmt::Debug for Bridge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Bridge")
    }
}

impl Bridge {
    /// Starts the runtime with `threads` workers named `name`.
    pub fn start(name: &str, threads: usize) -> Result<Bridge, StorageError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads.max(1))
            .thread_name(name)
            .enable_all()
            .build()
            .map_err(StorageError::WriterSpawn)?;
        Ok(Bridge { runtime: std::sync::Arc::new(Owned(Some(runtime))) })
    }

    /// Runs `fut` on the runtime and waits for it from this thread, at
    /// most `limit` (then [`StorageError::Etcd`] naming `what`). Never
    /// panics in an async context: the wait is a plain channel.
    pub fn call<T, F>(&self, what: &str, limit: Duration, fut: F) -> Result<T, StorageError>
    where
        T: Send + 'static,
        F: Future<Output = Result<T, StorageError>> + Send + 'static,
    {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        self.runtime.spawn(async move {
            let _ = tx.send(fut.await);
        });
        match rx.recv_timeout(limit) {
            Ok(r) => r,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => Err(StorageError::Etcd(format!(
                "{what}: no answer from etcd within {}",
                humantime::format_duration(limit)
            ))),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                Err(StorageError::Etcd(format!("{what}: the etcd client's runtime is gone")))
            }
        }
    }

    /// Runs `fut` on the runtime without waiting for it.
    pub fn spawn<F>(&self, fut: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.runtime.spawn(fut)
    }

    /// The runtime's handle (for `async` callers that await on it).
    pub fn handle(&self) -> &tokio::runtime::Handle {
        self.runtime.handle()
    }
}

/// An etcd client error as a [`StorageError`], naming what was asked.
pub fn etcd_error(what: &str, e: etcd_client::Error) -> StorageError {
    StorageError::Etcd(format!("{what}: {e}"))
}
