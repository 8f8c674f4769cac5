//! Opening a RocksDB database with a fixed set of column families and
//! checking its schema version: the part the master and agent stores share.
//!
//! A new database gets the current schema version written (synced) before
//! anything else; an existing one written by a newer release is refused
//! rather than misread.

use std::path::Path;
use std::sync::Arc;

use rocksdb::{ColumnFamilyDescriptor, DB, DBCompressionType, IteratorMode, Options, WriteOptions};
use serde::de::DeserializeOwned;

use super::keys::SCHEMA_VERSION_KEY;
use super::{StorageError, codec};

/// The agent's schema version (the master has its own,
/// `master_store::MASTER_SCHEMA_VERSION`). 2: instance records carry process
/// specs with health and limits. Version 1 was never released; it is
/// refused, not migrated.
pub const SCHEMA_VERSION: u32 = 2;

/// Memtables of all column families together stay under this, so the
/// store's memory is bounded whatever the write rate (flushes happen
/// earlier instead).
const WRITE_BUFFER_TOTAL: usize = 32 * 1024 * 1024;

fn cf_options() -> Options {
    let mut opts = Options::default();
    opts.set_compression_type(DBCompressionType::Lz4);
    opts.set_bottommost_compression_type(DBCompressionType::Zstd);
    opts
}

/// Opens (creating if needed) the database at `dir` with exactly `cfs`, and
/// checks or initializes `meta/schema_version` (`meta` must be in `cfs`).
pub fn open(dir: &Path, cfs: &[&str], meta_cf: &'static str) -> Result<Arc<DB>, StorageError> {
    open_migrating(dir, cfs, meta_cf, SCHEMA_VERSION, |_, found| {
        Err(StorageError::SchemaTooOld { found, supported: SCHEMA_VERSION })
    })
}

/// Like [`open`] for schema `version`; a store of an older version is
/// handed to `migrate` (which rewrites it, in one synced batch that also
/// sets the new version) before anything else reads it.
pub fn open_migrating(
    dir: &Path,
    cfs: &[&str],
    meta_cf: &'static str,
    version: u32,
    migrate: impl FnOnce(&DB, u32) -> Result<(), StorageError>,
) -> Result<Arc<DB>, StorageError> {
    let mut opts = cf_options();
    opts.create_if_missing(true);
    opts.create_missing_column_families(true);
    opts.set_db_write_buffer_size(WRITE_BUFFER_TOTAL);
    let descriptors = cfs.iter().map(|name| ColumnFamilyDescriptor::new(*name, cf_options()));
    let db = DB::open_cf_descriptors(&opts, dir, descriptors)
        .map_err(|source| StorageError::Open { path: dir.to_path_buf(), source })?;
    match check_schema(&db, meta_cf, version) {
        Err(StorageError::SchemaTooOld { found, .. }) => {
            tracing::info!(from = found, to = version, path = %dir.display(), "migrating the store's schema");
            migrate(&db, found)?;
        }
        other => other?,
    }
    Ok(Arc::new(db))
}

/// Writes `version` as the schema version into `batch`.
pub fn put_schema_version(
    db: &DB,
    batch: &mut rocksdb::WriteBatch,
    meta_cf: &'static str,
    version: u32,
) -> Result<(), StorageError> {
    let meta = db.cf_handle(meta_cf).ok_or(StorageError::UnknownColumnFamily { cf: meta_cf })?;
    batch.put_cf(meta, SCHEMA_VERSION_KEY, codec::encode(&version)?);
    Ok(())
}

/// Refuses a database whose schema is not `supported` (a newer release's,
/// or an older one this release cannot read); writes `supported` into a
/// database that has no version yet.
pub fn check_schema(db: &DB, meta_cf: &'static str, supported: u32) -> Result<(), StorageError> {
    let meta = db.cf_handle(meta_cf).ok_or(StorageError::UnknownColumnFamily { cf: meta_cf })?;
    match db.get_cf(meta, SCHEMA_VERSION_KEY).map_err(StorageError::Rocks)? {
        Some(bytes) => {
            let found: u32 = codec::decode(&bytes)?;
            if found > supported {
                return Err(StorageError::SchemaTooNew { found, supported });
            }
            if found < supported {
                return Err(StorageError::SchemaTooOld { found, supported });
            }
            Ok(())
        }
        None => {
            // Runs before the writer thread exists, so writing directly
            // cannot race it; synced like every other write.
            let mut sync = WriteOptions::default();
            sync.set_sync(true);
            db.put_cf_opt(meta, SCHEMA_VERSION_KEY, codec::encode(&supported)?, &sync).map_err(StorageError::Rocks)
        }
    }
}

/// Decodes every value of column family `cf`, in key order.
pub fn load_cf<T: DeserializeOwned>(db: &DB, cf: &'static str) -> Result<Vec<T>, StorageError> {
    let handle = db.cf_handle(cf).ok_or(StorageError::UnknownColumnFamily { cf })?;
    let mut out = Vec::new();
    for item in db.iterator_cf(handle, IteratorMode::Start) {
        let (key, value) = item.map_err(StorageError::Rocks)?;
        out.push(decode_value(cf, &key, &value)?);
    }
    Ok(out)
}

/// Decodes one stored value, naming the column family and key on failure.
pub fn decode_value<T: DeserializeOwned>(cf: &str, key: &[u8], value: &[u8]) -> Result<T, StorageError> {
    codec::decode(value).map_err(|e| match e {
        StorageError::Codec(msg) => StorageError::Codec(format!("{cf}/{}: {msg}", hex::encode(key))),
        other => other,
    })
}
