//! Opening the master's store: RocksDB in the data dir (the embedded
//! default, one master), or etcd once this master has won the campaign
//! for its installation's leader key (`store = "etcd"`, DESIGN.md §11).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::actors::role::{Named, Role};
use crate::config::{MasterConfig, StoreKind};
use crate::storage::etcd::conn::{Conn, Fence};
use crate::storage::etcd::election::{self, Campaign, LeaderInfo};
use crate::storage::etcd::peers::{Directory, Peer};
use crate::storage::etcd::{self, EtcdStore, Fenced, Takeover, layout::Layout};
use crate::storage::meta::ClusterState;
use crate::storage::{MasterStore, MetaStore, StorageError};

/// The store the master runs on, and its role.
pub struct Opened {
    pub store: Arc<dyn MetaStore>,
    pub role: Arc<Role>,
    /// The installation's masters (on etcd).
    pub peers: Option<Arc<Directory>>,
    /// What answered the API socket while this master campaigned (on
    /// etcd): it goes on answering reads while the master boots; stop it
    /// right before the master's own server takes the socket.
    pub handover: Option<Handover>,
    /// When this master won (on etcd), and the revision of the marker it
    /// put once its store was open (or why it could not): every write of
    /// an earlier leader is below it.
    pub won: Option<(std::time::Instant, Result<i64, String>)>,
    /// Its clusters and instances from the view it kept as a follower, when
    /// that held every write up to the win's revision in time (`[etcd]
    /// takeover`), with how it was found whole; else they are read from
    /// the store.
    pub view: Option<(ClusterState, crate::follower::Verified)>,
}

/// Why the store could not be opened.
#[derive(Debug)]
pub enum OpenError {
    Storage(StorageError),
    /// The standby server could not serve the API socket.
    Listen(std::io::Error),
}

/// Each leader seen while this master waits to lead.
pub type OnLeader = Box<dyn FnMut(Option<&election::Leader>) + Send>;

/// Opens the configured store; on etcd, waits until this master leads,
/// its API socket (`api`, bound already) answering meanwhile: as a
/// follower serving reads from its own view ([`crate::follower`]) once it
/// has loaded, as a standby redirecting everything before
/// ([`crate::http::standby`]); and until [`Handover::finish`].
pub async fn open(cfg: &MasterConfig, named: Named, api: &std::net::TcpListener) -> Result<Opened, OpenError> {
    match cfg.store {
        StoreKind::Rocksdb => {
            let store = MasterStore::open_opts(&cfg.data_dir.join("db"), cfg.writer_queue, cfg.events_retained as u64)
                .map_err(OpenError::Storage)?;
            Ok(Opened {
                store: Arc::new(store),
                role: Arc::new(Role::single(named.name, named.api_url)),
                peers: None,
                handover: None,
                won: None,
                view: None,
            })
        }
        StoreKind::Etcd => {
            // The others reach this master (and tell clients to) by it.
            if ["//0.0.0.0:", "//[::]:"].iter().any(|u| named.api_url.contains(u)) {
                return Err(OpenError::Storage(StorageError::Etcd(format!(
                    "with several masters each needs an address the others can reach: {} is not one; set \
                     advertise_url (and --name)",
                    named.api_url
                ))));
            }
            let seen = election::Seen::default();
            let socket = || api.try_clone().map_err(OpenError::Listen);
            // Redirects until the follower's own view is loaded.
            let mut serving = Serving::Standby(
                crate::http::standby::Standby::serve(socket()?, named.name.clone(), seen.clone())
                    .map_err(OpenError::Listen)?,
            );
            let stop = Arc::new(AtomicBool::new(false));
            let follow = {
                let (cfg, named, seen, stop) = (cfg.clone(), named.clone(), seen.clone(), stop.clone());
                tokio::task::spawn_blocking(move || crate::follower::prepare_until(&cfg, &named, seen, &stop))
            };
            let on_leader: OnLeader = {
                let seen = seen.clone();
                Box::new(move |leader| seen.set(leader))
            };
            let campaign = {
                let cfg = cfg.clone();
                tokio::task::spawn_blocking(move || lead(&cfg, named, on_leader))
            };
            tokio::pin!(follow, campaign);
            let mut preparing = true;
            let opened = loop {
                tokio::select! {
                    won = &mut campaign => break won,
                    prepared = &mut follow, if preparing => {
                        preparing = false;
                        if let (Ok(Some(prepared)), Serving::Standby(standby)) = (prepared, &serving) {
                            // Paused first: a client the follower's health
                            // already answered is never redirected after.
                            standby.pause().await;
                            match socket().and_then(|s| prepared.serve(s).map_err(OpenError::Listen)) {
                                Ok(follower) => {
                                    std::mem::replace(&mut serving, Serving::Follower(Box::new(follower))).stop().await;
                                }
                                Err(e) => {
                                    standby.resume().await;
                                    tracing::warn!(error = ?e, "the follower cannot serve; redirecting every request");
                                }
                            }
                        }
                    }
                }
            };
            stop.store(true, Ordering::SeqCst);
            let opened = opened
                .map_err(|e| OpenError::Storage(StorageError::Etcd(format!("the campaign's thread failed: {e}"))))
                .and_then(|o| o.map_err(OpenError::Storage));
            match opened {
                Ok(mut opened) => {
                    // Whoever asks now learns this master leads; until its
                    // own server listens, writes are answered `503
                    // taking_over` (a redirect would point here).
                    if let Some(l) = &opened.role.leadership {
                        seen.set(Some(&election::Leader { info: Some(l.info.clone()), term: l.term }));
                    }
                    serving.take_over();
                    opened.view = view_at_win(&serving, &opened, cfg.etcd.takeover).await;
                    opened.handover = Some(Handover(serving));
                    Ok(opened)
                }
                Err(e) => {
                    serving.stop().await;
                    Err(e)
                }
            }
        }
    }
}

/// The follower's view at the win's revision, when `takeover` wants it,
/// the view gets there within [`crate::follower::VIEW_WAIT`] and passes
/// its check against the store (`Follower::view_at`).
async fn view_at_win(
    serving: &Serving,
    opened: &Opened,
    takeover: Takeover,
) -> Option<(ClusterState, crate::follower::Verified)> {
    let marked = opened.won.as_ref()?.1.clone();
    let why = match (serving, takeover, marked) {
        (_, Takeover::Store, _) => return None,
        (_, _, Err(why)) => format!("it could not mark its win in etcd: {why}"),
        (Serving::Follower(f), _, Ok(revision)) => match f.view_at(revision, crate::follower::VIEW_WAIT).await {
            Ok(view) => return Some(view),
            Err(why) => why,
        },
        (Serving::Standby(_), _, _) => "it had not loaded a view as a follower yet".to_string(),
    };
    tracing::warn!(%why, "this master reads its clusters and instances from the store");
    None
}

/// See [`Opened::handover`].
pub struct Handover(Serving);

impl Handover {
    /// Stops taking connections (the master's server takes the socket next).
    pub async fn finish(self) {
        self.0.stop().await
    }
}

/// What answers the API socket while this master does not lead.
enum Serving {
    Standby(crate::http::standby::Standby),
    Follower(Box<crate::follower::Follower>),
}

impl Serving {
    fn take_over(&mut self) {
        if let Serving::Follower(f) = self {
            f.take_over();
        }
    }

    async fn stop(self) {
        match self {
            Serving::Standby(s) => s.stop().await,
            Serving::Follower(f) => f.stop().await,
        }
    }
}

/// Campaigns until this master leads, then opens the store under its fence (blocking).
fn lead(cfg: &MasterConfig, named: Named, mut on_leader: OnLeader) -> Result<Opened, StorageError> {
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
        revoke_dead_leader: settings.revoke_dead_leader,
    };
    let mut last_seen = None;
    let leadership = election::campaign(&bridge, &members, &campaign, |leader| {
        on_leader(leader);
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
    let won = std::time::Instant::now();
    let conn = Conn::new(bridge.clone(), members.clone(), layout, settings.limits(), settings.call_limit());
    let peers = Directory::join(conn.clone(), Peer { name: named.name.clone(), api_url: named.api_url.clone() })?;
    let store = EtcdStore::open(bridge, members, settings, Some(fence), cfg.writer_queue, cfg.events_retained as u64)?;
    // After the open (which finished a redo record an earlier leader left):
    // every write before the win is below this put, and a follower's watch
    // that has delivered it has delivered them all (events arrive in
    // order; a progress report may not, on an etcd before 3.5.13).
    // (Only for a takeover from the view: a store read needs no marker.)
    let marked = match settings.takeover {
        Takeover::Store => Err("not needed".to_string()),
        _ => conn
            .put_control(conn.layout.took_over(), format!("{} term {}", named.name, leadership.term).into_bytes())
            .map_err(|e| e.to_string()),
    };
    let role = Role {
        leadership: Some(leadership),
        name: named.name,
        api_url: named.api_url,
        following: None,
        took_over: Default::default(),
    };
    Ok(Opened {
        store: Arc::new(store),
        role: Arc::new(role),
        peers: Some(Arc::new(peers)),
        handover: None,
        won: Some((won, marked)),
        view: None,
    })
}
