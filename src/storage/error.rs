//! `StorageError`: every way the storage layer (RocksDB stores, the codec, the
//! group-commit writer, the blob directory) can fail.
//!
//! Callers above storage convert it into the domain [`crate::error::Error`]
//! as `Internal`: a storage failure is never the client's fault.

use std::path::PathBuf;

/// A storage failure. `Display` never repeats the source; log with
/// [`crate::error::ErrorChain`] to see the whole chain.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// The database at `path` could not be opened.
    #[error("cannot open the store at {}", path.display())]
    Open {
        path: PathBuf,
        #[source]
        source: rocksdb::Error,
    },
    /// RocksDB refused a read or write.
    #[error("rocksdb failed")]
    Rocks(#[source] rocksdb::Error),
    /// A value could not be encoded or decoded.
    #[error("codec: {0}")]
    Codec(String),
    /// The database was written by a newer release.
    #[error("the store has schema version {found}, this release supports up to {supported}")]
    SchemaTooNew { found: u32, supported: u32 },
    /// The database was written by an older release this one cannot read.
    #[error(
        "the store has schema version {found}, written by an older pre-release; this release reads version {supported} only: move the data dir away and start afresh"
    )]
    SchemaTooOld { found: u32, supported: u32 },
    /// The writer thread is gone (it panicked or the store was closed).
    #[error("the storage writer is gone")]
    WriterGone,
    /// The process is shutting down: nothing more is written, so the
    /// journal keeps the last state before the shutdown began.
    #[error("the master is shutting down; nothing more is written")]
    Frozen,
    /// The writer's queue is full: the request is refused before anything
    /// of it is written (the API answers `503 overloaded` with `Retry-After`).
    #[error("the store is overloaded (its write queue is full); retry shortly")]
    Overloaded,
    /// The writer thread could not be started.
    #[error("cannot start the storage writer thread")]
    WriterSpawn(#[source] std::io::Error),
    /// A write named a column family the database does not have (a bug).
    #[error("unknown column family {cf:?}")]
    UnknownColumnFamily { cf: &'static str },
    /// A file operation on `path` failed.
    #[error("i/o on {}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A blob name was not 64 lowercase hex characters; `value` is cut to a
    /// short prefix so a hostile name is never echoed whole.
    #[error("invalid sha256 {value:?}: expected 64 lowercase hex characters")]
    InvalidSha256 { value: String },
    /// A page of operations was asked for after an operation that is gone
    /// (retention deleted it since the previous page), so the cursor marks
    /// no place: the client starts paging again from the first page. An
    /// empty page instead would read as "no more operations".
    #[error("paging cursor {0} names an operation that no longer exists; start again without after")]
    CursorGone(String),
    /// etcd refused or could not take a read or write (no quorum, no
    /// member reachable, a request over its limits).
    #[error("the store (etcd) failed: {0}")]
    Etcd(String),
    /// This master's leadership ended (its term's key is gone or another
    /// master's): the write was refused by the fence, and this master
    /// writes nothing more.
    #[error("this master no longer leads (its term {term} ended): the write was refused; the new leader answers")]
    Deposed { term: i64 },
}

impl StorageError {
    /// The same failure again, for the next caller of a batch that failed
    /// (most sources cannot be cloned: their chain is kept as text).
    pub(crate) fn duplicate(&self) -> StorageError {
        match self {
            StorageError::Rocks(e) => StorageError::Rocks(e.clone()),
            StorageError::Etcd(m) => StorageError::Etcd(m.clone()),
            StorageError::Deposed { term } => StorageError::Deposed { term: *term },
            StorageError::Overloaded => StorageError::Overloaded,
            StorageError::Frozen => StorageError::Frozen,
            StorageError::WriterGone => StorageError::WriterGone,
            StorageError::UnknownColumnFamily { cf } => StorageError::UnknownColumnFamily { cf },
            other => StorageError::Codec(crate::error::ErrorChain(other).to_string()),
        }
    }

    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        StorageError::Io { path: path.into(), source }
    }

    /// Whether it is the disk that is full (RocksDB says so in its
    /// message; a file operation by its error kind).
    pub fn is_disk_full(&self) -> bool {
        match self {
            StorageError::Rocks(e) | StorageError::Open { source: e, .. } => {
                e.to_string().contains("No space left on device")
            }
            StorageError::Io { source, .. } | StorageError::WriterSpawn(source) => {
                source.kind() == std::io::ErrorKind::StorageFull
            }
            _ => false,
        }
    }
}

impl From<StorageError> for crate::error::Error {
    fn from(e: StorageError) -> Self {
        match e {
            StorageError::Overloaded => crate::error::Error::overloaded(e.to_string()),
            // Shutting down: the next master answers (503 with Retry-After).
            StorageError::Frozen => crate::error::Error::unavailable(e.to_string()),
            // etcd lost its quorum, or this master its leadership: another
            // moment (or another master) answers; reads go on.
            StorageError::Etcd(_) | StorageError::Deposed { .. } => crate::error::Error::unavailable(e.to_string()),
            // 404 not_found naming the cursor (see the variant).
            StorageError::CursorGone(id) => crate::error::Error::not_found("paging cursor", id),
            // Not the client's fault, nor a bug: the operator's to fix.
            e if e.is_disk_full() => crate::error::Error::unavailable(format!(
                "the master's disk is full: nothing more can be written until space is freed in its data dir (then restart the master): {}",
                crate::error::ErrorChain(&e)
            )),
            e => crate::error::Error::internal(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;

    #[test]
    fn a_full_disk_is_unavailable_and_says_so() {
        let full = std::io::Error::from(std::io::ErrorKind::StorageFull);
        match Error::from(StorageError::io("/data/db", full)) {
            Error::Unavailable { message } => assert!(message.starts_with("the master's disk is full"), "{message}"),
            other => panic!("unexpected {other:?}"),
        }
        assert!(!StorageError::io("/x", std::io::Error::other("disk gone")).is_disk_full());
    }

    #[test]
    fn converts_to_internal_with_the_chain() {
        let e = StorageError::io("/x", std::io::Error::other("disk gone"));
        match Error::from(e) {
            Error::Internal { message } => assert_eq!(message, "i/o on /x: disk gone"),
            other => panic!("unexpected {other:?}"),
        }
    }
}
