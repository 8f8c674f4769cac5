//! `flotilla store migrate`: a single master's RocksDB state copied into
//! etcd, so the site can run several masters (README "Several masters on
//! etcd"). Offline: the master must be stopped (RocksDB's lock says so),
//! and the etcd prefix must be empty (nothing is overwritten). Every
//! column family is copied key by key, in requests small enough for one
//! etcd transaction each, then counted back from etcd; the agent link's CA
//! goes into the store, so the agents enrolled with the old master are
//! known to every new one. Package files are not in the store: copy
//! `<data dir>/packages/` to each master's data dir.

use std::path::Path;

use super::layout::{Layout, prefix_end};
use super::{EtcdSettings, EtcdStore, connect};
use crate::storage::keys::master_cf;
use crate::storage::meta::{MetaStore, Scan};
use crate::storage::trust_records::CaRecord;
use crate::storage::{MasterStore, StorageError, WriteOp};

/// What was copied, per column family.
#[derive(Debug, Clone, Default)]
pub struct Copied {
    pub keys: Vec<(&'static str, usize)>,
    pub ca: bool,
}

/// Copies the RocksDB store of `data_dir` into etcd, with the agent link's
/// CA (`(certificate, key)` as PEM) when there is one (blocking; not on a
/// runtime).
pub fn from_rocksdb(
    data_dir: &Path,
    settings: &EtcdSettings,
    ca: Option<(String, String)>,
) -> Result<Copied, StorageError> {
    let source = MasterStore::open(&data_dir.join("db"))?;
    let (bridge, members) = connect(settings)?;
    let layout = Layout::new(&settings.prefix);
    let probe = super::conn::Conn::new(
        bridge.clone(),
        members.clone(),
        layout.clone(),
        settings.limits(),
        settings.call_limit(),
    );
    let (found, _, _) = probe.range(layout.prefix().to_vec(), prefix_end(layout.prefix()), 1, false, 0)?;
    if let Some((k, _)) = found.first() {
        return Err(StorageError::Etcd(format!(
            "etcd already holds keys under {} ({}): refusing to copy over them; choose another --etcd-prefix or empty it",
            settings.prefix,
            String::from_utf8_lossy(k)
        )));
    }
    let target = EtcdStore::open_default(bridge, members, settings, None)?;
    // A request per transaction: well under the ops and bytes limits.
    let per_request = (settings.max_txn_ops / 2).max(1);
    let mut copied = Copied::default();
    for cf in master_cf::ALL {
        let pairs = source.scan(cf, &Scan::default(), usize::MAX)?;
        let mut request = Vec::new();
        let mut bytes = 0;
        for (key, value) in &pairs {
            bytes += key.len() + value.len();
            request.push(WriteOp::Put { cf, key: key.clone(), value: value.clone() });
            if request.len() >= per_request || bytes >= settings.max_txn_bytes / 2 {
                target.writer().commit_blocking(std::mem::take(&mut request))?;
                bytes = 0;
            }
        }
        target.writer().commit_blocking(request)?;
        let there = target.scan(cf, &Scan::default(), usize::MAX)?;
        if there != pairs {
            return Err(StorageError::Etcd(format!(
                "{cf}: {} keys copied but etcd reads back {} (or other values)",
                pairs.len(),
                there.len()
            )));
        }
        copied.keys.push((cf, pairs.len()));
    }
    if let Some((cert_pem, key_pem)) = ca {
        target.writer().commit_blocking(vec![WriteOp::put_shared_ca(&CaRecord { version: 1, cert_pem, key_pem })?])?;
        copied.ca = true;
    }
    Ok(copied)
}
