//! Persistent state: the master's and the agent's RocksDB stores, the records
//! they hold, the codec that turns records into bytes, the group-commit
//! writer every write goes through, and the blob directory for package
//! tarballs (DESIGN.md §11).
//!
//! | module | owns |
//! |---|---|
//! | [`records`], [`agent_records`], [`trust_records`] | the persisted record types |
//! | [`config_value`] | typed config values, and a secret's public face (`{"secret": "set"}`) |
//! | [`plan`] | an operation's plan (steps, actions, undo), journaled with it |
//! | [`codec`] | bincode encoding, the only place it is used for storage |
//! | [`keys`] | column family names, key layouts, the typed `WriteOp` builders |
//! | [`writer`] | the group-commit writer thread |
//! | [`idle_flush`] | flushing the master's memtables once its writer is idle (memory back at rest) |
//! | [`events`] | what each state change looks like in the event log (kinds and data) |
//! | [`append_log`] | sequence numbers and retention of the append-only `events` log |
//! | [`db`] | opening a database and checking its schema version |
//! | [`meta`] | `MetaStore`, the narrow interface the master uses (writes, key and range reads, change feed), and typed reads over it |
//! | [`master_store`], [`agent_store`] | the two stores: open (and migrate), load at boot |
//! | [`etcd`] | the master's store on etcd (`--store etcd`): fenced transactions, the leader's election |
//! | [`serde_time`] | serde helpers for time fields bincode can decode |
//! | [`shared_strings`] | re-sharing the common strings of instance records loaded at boot |
//! | [`blobs`] | package tarballs as files named by sha256 |
//! | [`error`] | `StorageError` |
pub mod agent_records;
pub mod agent_store;
pub mod append_log;
pub mod blobs;
mod cluster_types;
pub mod codec;
pub mod config_value;
pub mod db;
pub mod error;
pub mod etcd;
pub mod events;
pub mod idle_flush;
pub mod keys;
pub mod master_store;
pub mod meta;
mod migrate;
pub mod plan;
pub mod pool_records;
pub mod records;
pub mod serde_time;
pub mod shared_strings;
pub mod trust_records;
pub mod writer;
mod writer_stats;

#[cfg(test)]
pub(crate) mod testdata;

pub use agent_store::{AgentSnapshot, AgentStore};
pub use blobs::BlobStore;
pub use error::StorageError;
pub use master_store::{MasterSnapshot, MasterStore};
pub use meta::MetaStore;
pub use writer::{StoreWriter, WriteOp};
