//! Which master leads: a campaign for a lease-bound key, and the lease kept
//! alive from a thread of its own.
//!
//! A master campaigns by creating `<prefix>_leader` bound to a fresh lease,
//! only if it does not exist (a transaction comparing its create revision
//! with 0). The winner's **term** is the revision that created the key: a
//! later leader's term is always higher. Every write the leader makes
//! compares the key's create revision with its term ([`super::conn::Fence`]),
//! so once the key is gone (lease expired, revoked) or another master's,
//! its writes are refused.
//!
//! The lease is renewed by a thread with its own single-thread runtime and
//! its own etcd connection (`flotilla-lease`): actor load, a busy writer or
//! a long range read never delay a renewal. The leader may act (send
//! commands to agents) only while [`Leadership::is_valid`]: until a
//! renewal's send time plus nine tenths of the TTL, which is before etcd
//! can expire the lease (etcd starts the TTL when it receives the renewal,
//! after we sent it). Past that point it is suspended (no commands) until
//! a renewal succeeds again. When etcd says the lease is gone, or a write
//! is refused by the fence, the leadership is lost for good: the master
//! exits and comes back as a follower (as Kubernetes' controller-manager
//! does).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use etcd_client::{Compare, CompareOp, EventType, PutOptions, Txn, TxnOp, TxnOpResponse, WatchOptions};

use super::bridge::{Bridge, etcd_error};
use super::layout::Layout;
use super::members::{Members, read_retryable, unreached};
use crate::storage::StorageError;

/// What the leader key says about its holder.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LeaderInfo {
    /// The master's name (`--name`, or its API address).
    pub name: String,
    /// Where its API answers.
    pub api_url: String,
    pub pid: u32,
    /// Its lease (a follower that sees the leader gone may revoke it).
    pub lease: i64,
}

/// The current leader as a follower sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Leader {
    pub info: Option<LeaderInfo>,
    /// The leader key's create revision.
    pub term: i64,
}

/// The leader as last seen by a campaign (a follower tells clients whom
/// to write to).
#[derive(Clone, Default)]
pub struct Seen(std::sync::Arc<std::sync::Mutex<Option<Leader>>>);

impl std::fmt::Debug for Seen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Seen").field(&self.get()).finish()
    }
}

impl Seen {
    pub fn set(&self, leader: Option<&Leader>) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = leader.cloned();
    }

    pub fn get(&self) -> Option<Leader> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// A won campaign: the term, and whether it still holds.
#[derive(Debug)]
pub struct Leadership {
    pub term: i64,
    pub lease: i64,
    pub info: LeaderInfo,
    state: Arc<State>,
}

/// What the leadership and its renewal thread share.
#[derive(Debug)]
struct State {
    /// When the lease was granted: the origin of `valid_until`.
    epoch: Instant,
    /// Milliseconds after `epoch` until which this master may act; 0 once lost.
    valid_until: AtomicU64,
    /// Milliseconds after `epoch` before which it may not act yet (after
    /// revoking a leader judged dead).
    acts_from: AtomicU64,
    lost: tokio::sync::watch::Sender<Option<String>>,
    stop: std::sync::atomic::AtomicBool,
}

impl State {
    /// How long this master may still act.
    fn left(&self) -> Duration {
        let until = Duration::from_millis(self.valid_until.load(Ordering::SeqCst));
        until.saturating_sub(self.epoch.elapsed())
    }

    fn renewed(&self, sent: Instant, ttl: i64) {
        if self.lost.borrow().is_some() {
            return;
        }
        let until = sent.saturating_duration_since(self.epoch) + Duration::from_millis(ttl.max(1) as u64 * 900);
        self.valid_until.store(until.as_millis().max(1) as u64, Ordering::SeqCst);
        // Lost meanwhile (a write refused by the fence on another thread):
        // the loss stays.
        if self.lost.borrow().is_some() {
            self.valid_until.store(0, Ordering::SeqCst);
        }
    }

    fn lose(&self, why: String) {
        self.valid_until.store(0, Ordering::SeqCst);
        if self.lost.borrow().is_none() {
            tracing::error!(reason = %why, "leadership lost");
            self.lost.send_replace(Some(why));
        }
    }
}

impl Leadership {
    /// Whether this master may act as the leader now (send commands): its
    /// lease was renewed recently enough that etcd cannot have expired it.
    /// False while renewals fail (etcd unreachable, or without quorum),
    /// true again once one succeeds on the same lease; false for good once
    /// lost.
    pub fn is_valid(&self) -> bool {
        let from = Duration::from_millis(self.state.acts_from.load(Ordering::SeqCst));
        self.state.epoch.elapsed() >= from && !self.state.left().is_zero()
    }

    /// Whether its renewal is overdue (suspended: no command until one
    /// succeeds); not while it only waits out a revoked leader's TTL.
    pub fn is_suspended(&self) -> bool {
        self.state.left().is_zero()
    }

    /// Resolves with the reason once the leadership is lost.
    pub fn lost(&self) -> tokio::sync::watch::Receiver<Option<String>> {
        self.state.lost.subscribe()
    }

    /// Ends the leadership for good (a write refused by the fence: another
    /// master leads).
    pub fn depose(&self, why: String) {
        self.state.lose(why)
    }
}

impl Drop for Leadership {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::SeqCst);
    }
}

/// How a master campaigns.
#[derive(Debug, Clone)]
pub struct Campaign {
    pub endpoints: Vec<String>,
    pub options: Option<etcd_client::ConnectOptions>,
    pub layout: Layout,
    /// The lease's TTL in seconds (etcd's floor is 1.5 × its election timeout).
    pub ttl: i64,
    pub info: LeaderInfo,
    pub timeout: Duration,
    /// Revoke the lease of a leader whose process is surely gone (its API
    /// port refuses connections) instead of waiting out its TTL.
    pub revoke_dead_leader: bool,
}

/// The leader now, `None` when nobody leads (blocking).
pub fn current(
    bridge: &Bridge,
    members: &Members,
    layout: &Layout,
    timeout: Duration,
) -> Result<Option<Leader>, StorageError> {
    let members = members.clone();
    let key = layout.leader();
    bridge.call("reading the leader key", timeout, async move {
        let get = |c: etcd_client::Client| {
            let key = key.clone();
            async move { c.kv_client().get(key, None).await }
        };
        let mut r = members.run(get, read_retryable).await.map_err(|e| etcd_error("reading the leader key", e))?;
        Ok(r.take_kvs()
            .into_iter()
            .next()
            .map(|kv| Leader { info: serde_json::from_slice(kv.value()).ok(), term: kv.create_revision() }))
    })
}

/// Campaigns until this master leads; `waiting` hears of each leader seen
/// meanwhile (blocking).
pub fn campaign(
    bridge: &Bridge,
    members: &Members,
    c: &Campaign,
    mut waiting: impl FnMut(Option<&Leader>),
) -> Result<Leadership, StorageError> {
    let key = c.layout.leader();
    // When this master revoked a leader's lease it judged dead: the revoked
    // leader, were it alive after all, may act until its own validity ran
    // out (nine tenths of a TTL after its last renewal); this one does not
    // command before a TTL has passed since.
    let mut revoked_at: Option<Instant> = None;
    loop {
        let ttl = c.ttl;
        // The lease's TTL runs from when etcd grants it, after this.
        let granted = Instant::now();
        let m = members.clone();
        let lease = bridge.call("granting a lease", c.timeout, async move {
            m.run(|c| async move { c.lease_client().grant(ttl, None).await }, unreached)
                .await
                .map(|r| (r.id(), r.ttl()))
                .map_err(|e| etcd_error("granting a lease", e))
        });
        let lease = match lease {
            Ok((l, granted_ttl)) => {
                // etcd raises a TTL below its floor (1.5 × its election
                // timeout) without a word: say so, the lease lasts longer.
                if granted_ttl > ttl {
                    tracing::warn!(
                        asked = ttl,
                        granted = granted_ttl,
                        "etcd granted a longer leader lease than lease_ttl_secs asks (its floor is 1.5 x its election timeout)"
                    );
                }
                l
            }
            Err(e) => {
                tracing::warn!(error = %e, "campaign: no lease from etcd; trying again");
                waiting(None);
                std::thread::sleep(Duration::from_millis(250));
                continue;
            }
        };
        let mut info = c.info.clone();
        info.lease = lease;
        let value = serde_json::to_vec(&info).map_err(|e| StorageError::Codec(e.to_string()))?;
        let txn = Txn::new()
            .when(vec![Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
            .and_then(vec![TxnOp::put(key.clone(), value, Some(PutOptions::new().with_lease(lease)))])
            .or_else(vec![TxnOp::get(key.clone(), None)]);
        let m = members.clone();
        let answer = bridge.call("campaigning", c.timeout, async move {
            let send = |c: etcd_client::Client| {
                let txn = txn.clone();
                async move { c.kv_client().txn(txn).await }
            };
            m.run(send, unreached).await.map_err(|e| etcd_error("campaigning", e))
        });
        let r = match answer {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "campaign failed; trying again");
                waiting(None);
                std::thread::sleep(Duration::from_millis(250));
                continue;
            }
        };
        let revision = r.header().map_or(0, |h| h.revision());
        if r.succeeded() && revision <= 0 {
            // A term of 0 would pass the fence once the key is gone.
            tracing::warn!("campaign: etcd's answer carries no revision; trying again");
            std::thread::sleep(Duration::from_millis(250));
            continue;
        }
        if r.succeeded() {
            let leadership = Leadership::new(revision, lease, info, granted, c.ttl);
            if let Some(at) = revoked_at {
                let quiet = at + Duration::from_millis(c.ttl.max(1) as u64 * 1000);
                leadership
                    .state
                    .acts_from
                    .store(quiet.saturating_duration_since(granted).as_millis() as u64, Ordering::SeqCst);
            }
            return Ok(keep_alive(c, leadership));
        }
        // Somebody leads: the lease we took is of no use.
        let (_, client) = members.pick();
        bridge.spawn(async move { client.lease_client().revoke(lease).await });
        let leader = r.op_responses().into_iter().find_map(|op| match op {
            TxnOpResponse::Get(mut g) => g
                .take_kvs()
                .into_iter()
                .next()
                .map(|kv| Leader { info: serde_json::from_slice(kv.value()).ok(), term: kv.create_revision() }),
            _ => None,
        });
        waiting(leader.as_ref());
        let dead = leader.as_ref().and_then(|l| l.info.as_ref()).filter(|_| c.revoke_dead_leader);
        if wait_for_vacancy(bridge, members, &key, revision, c.timeout, dead.cloned()) {
            revoked_at = Some(Instant::now());
        }
    }
}

/// Waits (at most a few seconds: the caller tries again anyway) until the
/// leader key is deleted after `revision`.
///
/// With `dead` (the leader's record), it also knocks on the leader's API
/// port; when its process is surely gone ([`super::knock::leader_process_gone`]) it
/// revokes the leader's lease, so the key goes at once instead of after
/// the lease's TTL (the dead leader can no longer write nor command: its
/// fence is that key).
fn wait_for_vacancy(
    bridge: &Bridge,
    members: &Members,
    key: &[u8],
    revision: i64,
    timeout: Duration,
    dead: Option<LeaderInfo>,
) -> bool {
    let revoked = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let told = revoked.clone();
    let (i, client) = members.pick();
    let members = members.clone();
    let key = key.to_vec();
    let limit = timeout.max(Duration::from_secs(2));
    let _ = bridge.call("watching the leader key", limit, async move {
        let opts = WatchOptions::new().with_start_revision(revision + 1);
        let Ok(mut stream) = client.watch_client().watch(key, Some(opts)).await else {
            members.failed(i);
            return Ok(());
        };
        let wait = async {
            while let Ok(Some(r)) = stream.message().await {
                if r.events().iter().any(|e| e.event_type() == EventType::Delete) || r.canceled() {
                    return;
                }
            }
        };
        let knock = async {
            let Some(leader) = dead else { return futures::future::pending().await };
            super::knock::leader_process_gone(&leader.api_url, &leader).await;
            tracing::warn!(leader = %leader.name, api = %leader.api_url, pid = leader.pid,
                "the leader's process is gone (its API port refuses connections, or it was restarted in place): revoking its lease");
            let lease = leader.lease;
            match members.run(|c| async move { c.lease_client().revoke(lease).await }, unreached).await {
                Ok(_) => told.store(true, Ordering::SeqCst),
                Err(e) => {
                    tracing::warn!(error = %e, "could not revoke the dead leader's lease; waiting for it to expire")
                }
            }
            futures::future::pending::<()>().await
        };
        let _ = tokio::time::timeout(limit - Duration::from_millis(100), async {
            tokio::select! {
                () = wait => {}
                () = knock => {}
            }
        })
        .await;
        Ok(())
    });
    revoked.load(Ordering::SeqCst)
}

impl Leadership {
    /// A leadership won with a lease granted at `granted`: valid for nine
    /// tenths of the TTL from then.
    fn new(term: i64, lease: i64, info: LeaderInfo, granted: Instant, ttl: i64) -> Leadership {
        let (lost, _) = tokio::sync::watch::channel(None);
        let until = Duration::from_millis(ttl.max(1) as u64 * 900).as_millis() as u64;
        let state = State {
            epoch: granted,
            valid_until: AtomicU64::new(until),
            acts_from: AtomicU64::new(0),
            lost,
            stop: Default::default(),
        };
        Leadership { term, lease, info, state: Arc::new(state) }
    }
}

/// Starts the renewal thread for a won lease.
fn keep_alive(c: &Campaign, leadership: Leadership) -> Leadership {
    let renewal = Renewal {
        state: leadership.state.clone(),
        key: c.layout.leader(),
        term: leadership.term,
        lease: leadership.lease,
        ttl: c.ttl,
        endpoints: c.endpoints.clone(),
        options: c.options.clone(),
    };
    let spawned = std::thread::Builder::new().name("flotilla-lease".into()).spawn(move || {
        match tokio::runtime::Builder::new_current_thread().enable_all().build() {
            Ok(rt) => rt.block_on(renewal.run()),
            Err(e) => renewal.state.lose(format!("the lease thread could not start its runtime: {e}")),
        }
    });
    if let Err(e) = spawned {
        leadership.state.lose(format!("the lease thread could not start: {e}"));
    }
    leadership
}

/// The renewal thread.
struct Renewal {
    state: Arc<State>,
    /// The leader key, and this leadership's term (its create revision).
    key: Vec<u8>,
    term: i64,
    lease: i64,
    ttl: i64,
    endpoints: Vec<String>,
    options: Option<etcd_client::ConnectOptions>,
}

impl Renewal {
    /// While suspended: whether etcd answers that the leader key is no
    /// longer this term's (gone, or another master's), so the leadership is
    /// over whatever the lease says; `None` when etcd does not answer, or
    /// the key is still ours.
    async fn deposed(&self, members: &Members, wait: Duration) -> Option<String> {
        let (i, client) = members.pick();
        let read = tokio::time::timeout(wait, async move { client.kv_client().get(self.key.clone(), None).await });
        match read.await {
            Ok(Ok(r)) => match r.kvs().first().map(|kv| kv.create_revision()) {
                Some(rev) if rev == self.term => None,
                Some(rev) => Some(format!("another master leads (term {rev})")),
                None => Some("the leader key is gone".into()),
            },
            _ => {
                members.failed(i);
                None
            }
        }
    }

    /// Renews every third of the TTL until stopped or lost. A renewal not
    /// answered within a period drops the stream (a late answer would be
    /// taken for a newer request's) and tries again on a fresh connection.
    /// Past the validity the master may not act (it is suspended, and says
    /// so once) but goes on trying: etcd without quorum expires no lease,
    /// and extends them all when it elects a new leader, so a renewal that
    /// succeeds again finds the same lease, and nobody else can have led
    /// meanwhile. Only etcd saying the lease is gone loses the leadership.
    async fn run(self) {
        let period = Duration::from_millis((self.ttl.max(1) as u64 * 1000) / 3).max(Duration::from_millis(100));
        let members = match Members::connect(&self.endpoints, self.options.clone()).await {
            Ok(m) => m,
            Err(e) => return self.state.lose(format!("the lease thread cannot make its etcd clients: {e}")),
        };
        let mut stream = None;
        let mut member = 0;
        let mut suspended = false;
        loop {
            if self.state.stop.load(Ordering::SeqCst) || self.state.lost.borrow().is_some() {
                return;
            }
            if !suspended && self.state.left().is_zero() {
                suspended = true;
                tracing::error!(
                    ttl = self.ttl,
                    "the leader's lease could not be renewed in time (etcd unreachable, or without quorum): \
                     no command is sent until it is"
                );
            }
            // Never longer than what is left; once suspended, a period
            // (etcd may answer slowly, and nothing is at stake any more).
            let wait = if suspended { period } else { self.state.left().clamp(Duration::from_millis(50), period) };
            if suspended && let Some(why) = self.deposed(&members, wait).await {
                return self.state.lose(why);
            }
            if stream.is_none() {
                let (i, mut client) = members.pick();
                member = i;
                match tokio::time::timeout(wait, client.lease_keep_alive(self.lease)).await {
                    Ok(Ok(ks)) => stream = Some(ks),
                    // etcd-client reports a lease etcd says is gone (TTL 0)
                    // as this error when the stream opens.
                    Ok(Err(e)) if e.to_string().contains("lease not found") => {
                        return self.state.lose("etcd says the lease is gone (it expired or was revoked)".into());
                    }
                    _ => {
                        members.failed(i);
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                }
            }
            let Some((keeper, answers)) = stream.as_mut() else { continue };
            let sent = Instant::now();
            let answered = tokio::time::timeout(wait, async {
                keeper.keep_alive().await?;
                answers.message().await
            })
            .await;
            match answered {
                Ok(Ok(Some(r))) if r.ttl() > 0 => {
                    self.state.renewed(sent, self.ttl);
                    if std::mem::take(&mut suspended) {
                        tracing::warn!("the leader's lease is renewed again: commands resume");
                    }
                }
                Ok(Ok(Some(_))) => {
                    return self.state.lose("etcd says the lease is gone (it expired or was revoked)".into());
                }
                Ok(Err(e)) if e.to_string().contains("lease not found") => {
                    return self.state.lose("etcd says the lease is gone (it expired or was revoked)".into());
                }
                _ => {
                    members.failed(member);
                    stream = None;
                    continue;
                }
            }
            tokio::time::sleep_until((sent + period).into()).await;
        }
    }
}
