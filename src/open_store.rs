//! Opening the master's store: RocksDB in the data dir (the embedded
//! default, one master), or etcd once this master has won the campaign
//! for its installation's leader key (`store = "etcd"`, DESIGN.md §11).

use std::sync::Arc;

use crate::actors::role::Role;
use crate::config::{MasterConfig, StoreKind};
use crate::storage::etcd::election::{self, Campaign, LeaderInfo};
use crate::storage::etcd::{self, EtcdStore, Fenced, conn::Fence, layout::Layout};
use crate::storage::{MasterStore, MetaStore, StorageError};

/// How this master names itself to the others.
#[derive(Debug, Clone)]
pub struct Named {
    pub name: String,
    pub api_url: String,
}

/// The store the master runs on, and its role.
pub struct Opened {
    pub store: Arc<dyn MetaStore>,
    pub role: Arc<Role>,
}

/// Opens the configured store; on etcd, waits until this master leads
/// (a follower waits here, logging who leads).
pub async fn open(cfg: &MasterConfig, named: Named) -> Result<Opened, StorageError> {
    match cfg.store {
        StoreKind::Rocksdb => {
            let store = MasterStore::open_opts(&cfg.data_dir.join("db"), cfg.writer_queue, cfg.events_retained as u64)?;
            Ok(Opened { store: Arc::new(store), role: Arc::new(Role::single(named.name, named.api_url)) })
        }
        StoreKind::Etcd => {
            let cfg = cfg.clone();
            tokio::task::spawn_blocking(move || lead(&cfg, named))
                .await
                .map_err(|e| StorageError::Etcd(format!("the campaign's thread failed: {e}")))?
        }
    }
}

/// Campaigns until this master leads, then opens the store under its fence (blocking).
fn lead(cfg: &MasterConfig, named: Named) -> Result<Opened, StorageError> {
    let settings = &cfg.etcd;
    let (bridge, members) = etcd::connect(settings)?;
    let layout = Layout::new(&settings.prefix);
    let campaign = Campaign {
        endpoints: settings.endpoints.clone(),
        options: Some(settings.connect_options()?),
        layout: layout.clone(),
        ttl: settings.lease_ttl_secs,
        info: LeaderInfo {
            name: named.name.clone(),
            api_url: named.api_url.clone(),
            pid: std::process::id(),
            lease: 0,
        },
        timeout: settings.request_timeout,
    };
    let mut last_seen = None;
    let leadership = election::campaign(&bridge, &members, &campaign, |leader| {
        let seen = leader.map(|l| (l.term, l.info.as_ref().map(|i| i.name.clone())));
        if seen != last_seen {
            match leader {
                Some(l) => tracing::info!(
                    term = l.term,
                    leader = l.info.as_ref().map_or("?", |i| i.name.as_str()),
                    "another master leads; waiting to take over"
                ),
                None => tracing::warn!("no answer from etcd; campaigning again"),
            }
            last_seen = seen;
        }
    })?;
    tracing::info!(term = leadership.term, lease = leadership.lease, "this master leads");
    let leadership = Arc::new(leadership);
    let deposed = Arc::downgrade(&leadership);
    let fence = Fenced {
        fence: Fence { key: layout.leader(), term: leadership.term },
        on_deposed: Arc::new(move |why| {
            if let Some(l) = deposed.upgrade() {
                l.depose(why)
            }
        }),
    };
    let store = EtcdStore::open(bridge, members, settings, Some(fence), cfg.writer_queue, cfg.events_retained as u64)?;
    let role = Role { leadership: Some(leadership), name: named.name, api_url: named.api_url };
    Ok(Opened { store: Arc::new(store), role: Arc::new(role) })
}
