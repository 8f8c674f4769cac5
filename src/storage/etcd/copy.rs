//! `flotilla store migrate`: a single master's RocksDB state copied into
//! etcd, so the site can run several masters (README "Several masters on
//! etcd"). Offline: the master must be stopped (RocksDB's lock says so),
//! and the etcd prefix must hold no record (nothing is overwritten). The
//! copy leads the prefix and marks it (`meta/migrating`) until its last
//! write: masters wait meanwhile, and refuse a prefix a copy cut short. Every
//! column family is copied key by key, in requests small enough for one
//! etcd transaction each, then counted back from etcd; the agent link's CA
//! goes into the store, so the agents enrolled with the old master are
//! known to every new one. Package files are not in the store: copy
//! `<data dir>/packages/` to each master's data dir.

use std::path::Path;

use super::election::{self, Campaign, LeaderInfo};
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

/// The key in `meta` a migration holds while it copies: a master refuses
/// to start on a prefix that has it (a copy cut short, or under way).
pub const MIGRATING_KEY: &[u8] = b"migrating";

/// Copies the RocksDB store of `data_dir` into etcd, with the agent link's
/// CA (`(certificate, key)` as PEM) when there is one (blocking; not on a
/// runtime). It leads the prefix while it copies (a master started
/// meanwhile waits), and marks it as being migrated until the last write,
/// which also puts the CA.
pub fn from_rocksdb(
    data_dir: &Path,
    settings: &EtcdSettings,
    ca: Option<(String, String)>,
) -> Result<Copied, StorageError> {
    let source = MasterStore::open(&data_dir.join("db"))?;
    // Everything read, and checked against etcd's limits, before anything is written.
    let mut all = Vec::new();
    let limit = settings.max_txn_bytes.saturating_sub(settings.prefix.len() + 64);
    for cf in master_cf::ALL {
        let pairs = source.scan(cf, &Scan::default(), usize::MAX)?;
        if let Some((k, v)) = pairs.iter().find(|(k, v)| k.len() + v.len() > limit) {
            return Err(StorageError::Etcd(format!(
                "{cf}: the record {} is {} bytes, more than one etcd transaction takes (etcd.max_txn_bytes = {})",
                hex::encode(&k[..k.len().min(16)]),
                k.len() + v.len(),
                settings.max_txn_bytes
            )));
        }
        all.push((cf, pairs));
    }
    let (bridge, members) = connect(settings)?;
    let layout = Layout::new(&settings.prefix);
    let campaign = Campaign {
        endpoints: settings.endpoints.clone(),
        options: Some(settings.connect_options()?),
        layout: layout.clone(),
        ttl: settings.lease_ttl_secs.max(5),
        info: LeaderInfo {
            name: "flotilla store migrate".into(),
            api_url: String::new(),
            pid: std::process::id(),
            lease: 0,
        },
        timeout: settings.request_timeout,
        revoke_dead_leader: false,
    };
    // A master that leads the prefix now: it is not empty (or not stopped).
    if let Some(l) = election::current(&bridge, &members, &layout, settings.call_limit())? {
        return Err(StorageError::Etcd(format!(
            "{} leads {} (term {}): migrate copies into an empty prefix only",
            l.info.map_or_else(|| "a master".to_string(), |i| format!("master {:?}", i.name)),
            settings.prefix,
            l.term
        )));
    }
    let leadership = election::campaign(&bridge, &members, &campaign, |leader| {
        if let Some(l) = leader {
            tracing::warn!(term = l.term, "a master leads this prefix; waiting (it should be empty)");
        }
    })?;
    let probe = super::conn::Conn::new(
        bridge.clone(),
        members.clone(),
        layout.clone(),
        settings.limits(),
        settings.call_limit(),
    );
    // Every column family's keys, not the control keys (`<prefix>_...`,
    // this migration's leader key among them): cf names start with a-z.
    let mut records = layout.prefix().to_vec();
    records.push(b'a');
    let (found, _, _) = probe.range(records, prefix_end(layout.prefix()), 1, false, 0)?;
    let result = match found.first() {
        Some((k, _)) => Err(StorageError::Etcd(format!(
            "etcd already holds keys under {} ({}): refusing to copy over them; choose another --etcd-prefix or empty it",
            settings.prefix,
            String::from_utf8_lossy(k)
        ))),
        None => copy(&bridge, &members, settings, &leadership, all, ca),
    };
    // Released at once: a master waiting for the prefix leads now.
    let lease = leadership.lease;
    drop(leadership);
    let _ = bridge.call("releasing the prefix", settings.request_timeout, async move {
        members.pick().1.lease_client().revoke(lease).await.map_err(|e| StorageError::Etcd(e.to_string()))
    });
    result
}

/// The copy itself, under the migration's leadership.
fn copy(
    bridge: &super::bridge::Bridge,
    members: &super::members::Members,
    settings: &EtcdSettings,
    leadership: &election::Leadership,
    all: Vec<(&'static str, crate::storage::meta::Pairs)>,
    ca: Option<(String, String)>,
) -> Result<Copied, StorageError> {
    let fence = super::Fenced {
        fence: super::conn::Fence { key: Layout::new(&settings.prefix).leader(), term: leadership.term },
        on_deposed: std::sync::Arc::new(|why| tracing::error!(%why, "the migration lost the prefix")),
    };
    let target = EtcdStore::open_default(bridge.clone(), members.clone(), settings, Some(fence))?;
    let marker = || WriteOp::Put { cf: master_cf::META, key: MIGRATING_KEY.to_vec(), value: b"1".to_vec() };
    target.writer().commit_blocking(vec![marker()])?;
    // A request per transaction: well under the ops and bytes limits.
    let per_request = (settings.max_txn_ops / 2).max(1);
    let mut copied = Copied::default();
    for (cf, pairs) in all {
        let mut request = Vec::new();
        let mut bytes = 0;
        for (key, value) in &pairs {
            if cf == master_cf::META && key == MIGRATING_KEY {
                continue;
            }
            bytes += key.len() + value.len();
            request.push(WriteOp::Put { cf, key: key.clone(), value: value.clone() });
            if request.len() >= per_request || bytes >= settings.max_txn_bytes / 2 {
                target.writer().commit_blocking(std::mem::take(&mut request))?;
                bytes = 0;
            }
        }
        target.writer().commit_blocking(request)?;
        let mut there = target.scan(cf, &Scan::default(), usize::MAX)?;
        if cf == master_cf::META {
            there.retain(|(k, _)| k != MIGRATING_KEY);
        }
        if there != pairs {
            return Err(StorageError::Etcd(format!(
                "{cf}: {} keys copied but etcd reads back {} (or other values)",
                pairs.len(),
                there.len()
            )));
        }
        copied.keys.push((cf, pairs.len()));
    }
    // The CA and the end of the migration in one write.
    let mut last = vec![WriteOp::Delete { cf: master_cf::META, key: MIGRATING_KEY.to_vec() }];
    if let Some((cert_pem, key_pem)) = ca {
        last.push(WriteOp::put_shared_ca(&CaRecord { version: 1, cert_pem, key_pem })?);
        copied.ca = true;
    }
    target.writer().commit_blocking(last)?;
    if copied.ca && target.get(master_cf::META, crate::storage::keys::SHARED_CA_KEY)?.is_none() {
        return Err(StorageError::Etcd("the CA written does not read back".into()));
    }
    Ok(copied)
}
