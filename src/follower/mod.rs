//! A master that does not lead (several masters on etcd, DESIGN.md §11):
//! warm, it keeps a read model of its own from an etcd watch
//! ([`mirror`]) and answers reads from it through the very handlers the
//! leader uses; writes, and reads of what only the leader knows, go to the
//! leader ([`gate`]). `GET /api/v1/health` says `role: follower`, the
//! leader, its term, the revision the view reflects and how stale it may
//! be (`lag_ms`).
//!
//! It runs while the master campaigns (`open_store`); once the master
//! leads, the follower's server stops and the master's own takes the socket.

pub mod gate;
pub mod mirror;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use actix_web::{App, HttpServer, web};

use crate::actors::cordons::Cordons;
use crate::actors::node_link::NodeLinks;
use crate::actors::packages::{Packages, UploadLimits};
use crate::actors::placement::PortAllocator;
use crate::actors::read_model::{ActorStats, ReadModel};
use crate::actors::registry::Registry;
use crate::actors::role::{Following, Named, Role};
use crate::actors::supervisor::Supervisor;
use crate::actors::tokens::ApiTokens;
use crate::actors::trust::{Trust, shared_ca};
use crate::actors::{Limits, Shared, Timing};
use crate::config::MasterConfig;
use crate::storage::etcd::conn::Conn;
use crate::storage::etcd::election::Seen;
use crate::storage::etcd::layout::Layout;
use crate::storage::etcd::peers::{Directory, Peer};
use crate::storage::etcd::replica::ReplicaStore;
use crate::storage::etcd::watch::{self, Progress};
use crate::storage::keys::master_cf;
use crate::storage::meta::ClusterState;
use crate::storage::records::{ClusterRecord, InstanceRecord};
use crate::storage::{BlobStore, MetaStore};

/// Sets the flag when dropped: the follower's watch thread ends.
struct StopOnDrop(Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// A loaded follower, not serving yet.
pub struct Prepared {
    state: crate::http::AppState,
    following: Following,
    max_json: usize,
    workers: usize,
    check: ViewCheck,
    _stop: StopOnDrop,
}

/// A follower serving the API socket.
pub struct Follower {
    handle: actix_web::dev::ServerHandle,
    phase: gate::Phase,
    stop: StopOnDrop,
    /// Fetches package tarballs this master lacks (`actors::peer_blobs`).
    fetcher: Option<tokio::task::JoinHandle<()>>,
    /// Its view, and how far it has come: what this master boots from
    /// when it wins ([`Follower::view_at`]).
    view: Arc<ReadModel>,
    progress: Arc<Progress>,
    check: ViewCheck,
}

/// What a master checks its view against before it boots from it.
#[derive(Clone)]
struct ViewCheck {
    /// Cluster and instance records the view could not read.
    unreadable: mirror::Unreadable,
    /// The revision of each cluster and instance key it holds.
    revisions: mirror::Revisions,
    /// For a keys-only read of the store at the win's revision.
    conn: Conn,
}

/// How long a master that won waits for its view to hold every write made
/// before the win; past it, it reads the store instead. The view is
/// normally there within a watch round trip (tens of milliseconds); a view
/// this far behind is no faster than reading again.
pub const VIEW_WAIT: Duration = Duration::from_secs(3);

/// Starts fetching the tarballs of the packages this follower sees and
/// lacks, from the leader first.
fn fetch_blobs(state: &crate::http::AppState, following: &Following) -> Option<tokio::task::JoinHandle<()>> {
    let peers = state.shared.peers.clone()?;
    let (blobs, read_model, leader) =
        (state.shared.blobs.clone(), state.shared.read_model.clone(), following.leader.clone());
    let leader_url = move || leader.get().and_then(|l| l.info).map(|i| i.api_url);
    Some(actix_web::rt::spawn(crate::actors::peer_blobs::keep_complete(peers, blobs, read_model, leader_url)))
}

/// How long the follower's server answers its open connections once the
/// master's own has the socket (each answer closing its connection; see
/// [`gate::Phase`]).
const DRAIN: Duration = Duration::from_secs(5);

/// [`prepare`] again every second until it works or `stop` is set (then
/// `None`; blocking).
pub fn prepare_until(cfg: &MasterConfig, named: &Named, leader: Seen, stop: &Arc<AtomicBool>) -> Option<Prepared> {
    let mut last = String::new();
    while !stop.load(Ordering::SeqCst) {
        match prepare(cfg, named, leader.clone(), stop) {
            Ok(p) => return Some(p),
            Err(_) if stop.load(Ordering::SeqCst) => return None,
            Err(why) => {
                if why != last {
                    tracing::warn!(%why, "this follower redirects every request to the leader for now");
                    last = why;
                }
                std::thread::sleep(Duration::from_secs(1));
            }
        }
    }
    None
}

/// Connects to etcd, loads the read model and starts following (blocking).
pub fn prepare(cfg: &MasterConfig, named: &Named, leader: Seen, stop: &Arc<AtomicBool>) -> Result<Prepared, String> {
    let settings = &cfg.etcd;
    let (bridge, members) = crate::storage::etcd::connect(settings).map_err(|e| e.to_string())?;
    let conn = Conn::new(bridge, members, Layout::new(&settings.prefix), settings.limits(), settings.call_limit());
    let replica = ReplicaStore::new(conn.clone());
    let conn_for_peers = conn.clone();
    let store: Arc<dyn MetaStore> = Arc::new(replica.clone());
    // Its own copy: the `ca/` directory is the leader's to write when this
    // master wins, possibly while this one still loads.
    let ca_dir = cfg.data_dir.join("follower-ca");
    if !shared_ca::copy_from_store(&*store, &ca_dir).map_err(|e| e.to_string())? {
        return Err("no master has led this installation yet (the store holds no CA)".into());
    }
    let trust = Trust::load(store.clone(), &ca_dir, false).map_err(|e| e.to_string())?;
    let read_model = ReadModel::new(store.clone());
    let tokens = ApiTokens::load(store.clone()).map_err(|e| e.to_string())?;
    // Before the watch starts: what the load then does not find again goes.
    let cordons = Cordons::load(store.clone(), read_model.clone()).map_err(|e| e.to_string())?;
    let progress = Arc::new(Progress::default());
    let check = ViewCheck { unreadable: Default::default(), revisions: Default::default(), conn: conn.clone() };
    let own_stop = Arc::new(AtomicBool::new(false));
    let guard = StopOnDrop(own_stop.clone());
    {
        let mut mirror = mirror::Mirror::new(
            read_model.clone(),
            tokens.clone(),
            Box::new(move |e| replica.announce(e)),
            check.unreadable.clone(),
            check.revisions.clone(),
        );
        let (progress, stop) = (progress.clone(), own_stop.clone());
        std::thread::Builder::new()
            .name("flotilla-follower".into())
            .spawn(move || watch::follow(&conn, &mirror::LOADED, &mut mirror, &progress, &stop))
            .map_err(|e| format!("cannot start the follower's thread: {e}"))?;
    }
    // Reads are served once the whole view is loaded, never from half of it.
    while progress.applied_revision() == 0 {
        if stop.load(Ordering::SeqCst) {
            return Err("stopped".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let peers = Directory::join(conn_for_peers, Peer { name: named.name.clone(), api_url: named.api_url.clone() })
        .map_err(|e| e.to_string())?;
    let blobs = BlobStore::open(&cfg.data_dir.join("packages")).map_err(|e| e.to_string())?;
    let following = Following { leader, progress };
    let role = Role {
        leadership: None,
        name: named.name.clone(),
        api_url: named.api_url.clone(),
        following: Some(following.clone()),
        took_over: Default::default(),
    };
    let shared = Shared {
        in_flight: Default::default(),
        store,
        blobs: Arc::new(blobs),
        read_model,
        links: NodeLinks::default(),
        registry: Registry::default(),
        ports: Arc::new(PortAllocator::from_instances(std::iter::empty())),
        timing: Timing::of(cfg),
        limits: Limits::of(cfg),
        supervisor: ActorStats::new("supervisor", "supervisor", None),
        priorities: Arc::new(vec![Arc::default()]),
        arbiters: Arc::default(),
        link_arbiters: Arc::default(),
        chunk_budget: Arc::new(tokio::sync::Semaphore::new(crate::actors::node_link::CHUNK_BUDGET)),
        tasks: Arc::default(),
        pools: Arc::default(),
        role: Arc::new(role),
        peers: Some(Arc::new(peers)),
    };
    let state = crate::http::AppState {
        // No supervisor runs on a follower: every request that would reach
        // one is sent to the leader by the gate first. Its address is a
        // closed mailbox: a send answers at once that it is gone.
        supervisor: actix::AsyncContext::address(&actix::Context::<Supervisor>::new()),
        packages: Packages::new(shared.clone(), UploadLimits::of(cfg)),
        shared,
        max_upload_bytes: cfg.max_upload_bytes,
        tokens,
        trust,
        open_health: cfg.open_health,
        open_metrics: cfg.open_metrics,
        request_body_timeout: cfg.request_body_timeout,
        metrics: None,
        log_readers: Default::default(),
        test_hooks: false,
        cordons: Arc::new(cordons),
        pools: crate::actors::pools::Pools::new(String::new(), Vec::new()),
    };
    Ok(Prepared {
        state,
        following,
        max_json: cfg.max_json_bytes,
        workers: cfg.http_workers.max(1),
        check,
        _stop: guard,
    })
}

impl Prepared {
    /// Serves `listener` (a clone of the master's API socket) until stopped.
    pub fn serve(self, listener: std::net::TcpListener) -> std::io::Result<Follower> {
        let Prepared { state, following, max_json, workers, check, _stop: stop } = self;
        let (state_for_blobs, following_for_blobs) = (state.clone(), following.clone());
        let (view, progress) = (state.shared.read_model.clone(), following.progress.clone());
        let phase = gate::Phase::default();
        let in_app = phase.clone();
        let server = HttpServer::new(move || {
            App::new()
                .app_data(web::Data::new(following.clone()))
                .app_data(web::Data::new(in_app.clone()))
                .wrap(actix_web::middleware::from_fn(gate::route))
                .wrap(actix_web::middleware::from_fn(crate::http::metrics::track))
                .configure(|c| crate::http::configure(c, state.clone(), max_json))
        })
        .workers(workers)
        .disable_signals()
        .shutdown_timeout(1)
        .client_request_timeout(crate::http::HEAD_TIMEOUT)
        .listen(listener)?
        .run();
        let handle = server.handle();
        actix_web::rt::spawn(server);
        let fetcher = fetch_blobs(&state_for_blobs, &following_for_blobs);
        tracing::info!("this follower serves reads from its own view of the store");
        Ok(Follower { handle, phase, stop, fetcher, view, progress, check })
    }
}

impl Follower {
    /// This master won: reads go on from the view while it boots, the
    /// rest is answered `503 taking_over`.
    pub fn take_over(&mut self) {
        self.phase.taking_over();
        // The master's own fetcher takes over (and its blob store's open
        // clears unfinished transfers).
        if let Some(f) = self.fetcher.take() {
            f.abort();
        }
    }

    /// The clusters and instances of this follower's view once the change
    /// at etcd revision `revision` has arrived through its watch (every
    /// earlier one has, then); why not when it has not within `within`, or
    /// the view left out a record it could not read (the store's read
    /// then says what is wrong). Called once this master leads and has put
    /// its marker: no other master can write any more, so the view it
    /// waits for is the store's state, and it stays so while the master
    /// boots (nothing else writes clusters or instances before its actors
    /// start).
    pub async fn view_at(&self, revision: i64, within: Duration) -> Result<(ClusterState, Verified), String> {
        let deadline = tokio::time::Instant::now() + within;
        while self.progress.through_events() < revision {
            if tokio::time::Instant::now() >= deadline {
                return Err(format!("its view did not reach revision {revision} within {within:?}"));
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let unreadable = self.check.unreadable.load(Ordering::SeqCst);
        if unreadable > 0 {
            return Err(format!("its view left out {unreadable} cluster or instance records it could not read"));
        }
        // Every revision up to the marker brought its event: no revision
        // was missed, and the count of cluster and instance keys (etcd's
        // index, no record read) must agree (a revision can lose some of
        // its events: etcd#18089 dropped deletes at a compaction's
        // revision). Else (an etcd shared with another installation, or a
        // difference) every key's revision is read and compared.
        let chained = self.progress.chained_through() >= revision;
        let (view, check) = (self.view.clone(), self.check.clone());
        tokio::task::spawn_blocking(move || {
            let verified = if chained && check.counts_match(revision)? {
                Verified::Revisions
            } else {
                check.against_store(revision)?;
                Verified::Keys
            };
            Ok((cluster_state(&view), verified))
        })
        .await
        .map_err(|e| format!("taking the view failed: {e}"))?
    }

    /// Stops taking connections at once (the master's server takes the
    /// socket); the open ones are answered for [`DRAIN`] more, each answer
    /// closing its connection, then the server and the watch stop.
    pub async fn stop(self) {
        self.phase.draining();
        self.handle.pause().await;
        let Follower { handle, stop, fetcher, .. } = self;
        if let Some(f) = fetcher {
            f.abort();
        }
        actix_web::rt::spawn(async move {
            tokio::time::sleep(DRAIN).await;
            handle.stop(true).await;
            drop(stop);
        });
    }
}

/// How a view a winning master boots from was found to be the store's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verified {
    /// Every etcd revision since the view's load brought the watch an
    /// event (`Progress::chained_through`: no revision was missed), and
    /// the store's counts of cluster and instance keys are the view's.
    Revisions,
    /// A keys-only read of the store found every cluster and instance key
    /// in the view, changed at the same revision.
    Keys,
}

impl Verified {
    pub fn as_str(self) -> &'static str {
        match self {
            Verified::Revisions => "revisions",
            Verified::Keys => "keys",
        }
    }
}

impl ViewCheck {
    /// Whether the store holds as many cluster and instance keys at
    /// `revision` as the view (counts only: etcd's index, no record read;
    /// blocking). A difference is logged: the watch missed an event of a
    /// revision it saw.
    fn counts_match(&self, revision: i64) -> Result<bool, String> {
        for cf in [master_cf::CLUSTERS, master_cf::INSTANCES] {
            let stored = watch::count_at(&self.conn, cf, revision).map_err(|e| format!("checking its view: {e}"))?;
            let mine =
                self.revisions.lock().unwrap_or_else(|p| p.into_inner()).keys().filter(|(c, _)| *c == cf).count();
            if stored != mine {
                tracing::warn!(
                    cf,
                    stored,
                    view = mine,
                    revision,
                    "a follower's view holds another count of records than the store though its watch missed no revision; every key is checked"
                );
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Whether every cluster and instance key of the store at `revision`
    /// is in the view, last changed at the same revision, and no other
    /// (a keys-only read; etcd 3.4 reads the values for it all the same,
    /// so at 100,000 instances it cost about what reading the records
    /// does). A view that missed a write (seen under load on etcd 3.4: a
    /// record left at its previous value) fails it, and the master reads
    /// the store instead (blocking).
    fn against_store(&self, revision: i64) -> Result<(), String> {
        let mut stored = Vec::new();
        for cf in [master_cf::CLUSTERS, master_cf::INSTANCES] {
            let keys = watch::revisions_at(&self.conn, cf, revision).map_err(|e| format!("checking its view: {e}"))?;
            stored.push((cf, keys));
        }
        // Compared under the lock, not copied: the mirror waits meanwhile
        // (it has nothing to apply to clusters or instances now).
        let held = self.revisions.lock().unwrap_or_else(|p| p.into_inner());
        let mut key = (master_cf::CLUSTERS, Vec::new());
        for (cf, keys) in stored {
            let mine = held.keys().filter(|(c, _)| *c == cf).count();
            if keys.len() != mine {
                return Err(format!(
                    "its view holds {mine} {cf} records, the store {} at revision {revision}",
                    keys.len()
                ));
            }
            key.0 = cf;
            for (k, at) in keys {
                key.1 = k;
                if held.get(&key) != Some(&at) {
                    return Err(format!(
                        "its view's {cf} record {} is not the store's (changed at revision {at}) at revision {revision}",
                        hex::encode(&key.1)
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Every cluster and instance `view` holds, in the store's key order.
fn cluster_state(view: &ReadModel) -> ClusterState {
    let cells = view.clusters();
    let mut clusters = Vec::with_capacity(cells.len());
    let mut instances = Vec::new();
    for cell in cells.values() {
        let snap = cell.load();
        clusters.push(ClusterRecord::clone(&snap.record));
        instances.extend(snap.instances.values().map(|e| InstanceRecord::clone(&e.record)));
    }
    ClusterState::sorted(clusters, instances)
}
