//! A follower's view of the store: the whole prefix read at one revision,
//! then every change after it from an etcd watch, resumed from the next
//! revision when the watch breaks and read whole again when etcd has
//! compacted the revisions it would need.
//!
//! A request the leader writes through a redo record ([`super::sink`]) is
//! applied in several transactions; its changes are held from the head's
//! put until the head's delete and handed over together, and a load waits
//! for a revision without one under way, so a follower shows such a
//! request whole or not at all.
//!
//! How current the view is ([`Progress`]): every [`ASK_EVERY`] (one ask
//! at a time) the watch reads etcd's current revision linearizably, then
//! asks for a progress report; etcd answers once every change up to its
//! revision has been sent. An answer at or past the revision read means
//! the view held every write etcd had when the read began, so `lag` (the
//! time since that read) is an upper bound, never an underestimate, even
//! from a member that is behind.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::{Duration, Instant};

use etcd_client::{EventType, GetOptions, WatchOptions};

use super::conn::Conn;
use super::layout::prefix_end;
use crate::storage::StorageError;
use crate::storage::keys::master_cf;

/// How often the watch asks etcd how far it has sent.
pub const ASK_EVERY: Duration = Duration::from_millis(200);

/// Nothing at all from the watch this long while an ask waits: the member
/// is gone or stuck; the watch resumes on the next one.
const SILENT_LIMIT: Duration = Duration::from_secs(10);

/// An ask unanswered this long is asked again (etcd may drop one while it
/// catches the watch up).
const ASK_AGAIN: Duration = Duration::from_secs(2);

/// One change under the prefix, in a column family's terms (a put with
/// the etcd revision that made it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    Put { cf: &'static str, key: Vec<u8>, value: Vec<u8>, revision: i64 },
    Delete { cf: &'static str, key: Vec<u8> },
}

/// What a follower does with the changes (its read model).
pub trait Apply {
    /// A read of the whole view begins: what it does not put again is gone
    /// at [`end_load`](Self::end_load) (the view stays whole meanwhile).
    fn begin_load(&mut self);
    fn apply(&mut self, change: Change);
    fn end_load(&mut self);
    /// The end of a group of changes (one watch response): publish.
    fn flush(&mut self);
}

/// How far the view has come.
#[derive(Debug)]
pub struct Progress {
    applied: AtomicI64,
    /// The revision of the last event applied (or of a load): unlike
    /// `applied`, never moved by a progress report (an etcd before 3.5.13
    /// could send one ahead of events it still had buffered; etcd#15220).
    through_events: AtomicI64,
    /// Every revision from the last load's up to this one brought the watch
    /// an event under the prefix ([`NO_CHAIN`]: one did not).
    chained: AtomicI64,
    /// When etcd last held nothing the view lacks (`None`: not yet).
    current_at: Mutex<Option<Instant>>,
    started: Instant,
}

/// [`Progress::chained_through`] once a revision brought no event.
pub const NO_CHAIN: i64 = -1;

impl Default for Progress {
    fn default() -> Self {
        Progress {
            applied: AtomicI64::new(0),
            through_events: AtomicI64::new(0),
            chained: AtomicI64::new(NO_CHAIN),
            current_at: Mutex::new(None),
            started: Instant::now(),
        }
    }
}

impl Progress {
    /// The etcd revision the view reflects (0: not loaded yet).
    pub fn applied_revision(&self) -> i64 {
        self.applied.load(Ordering::SeqCst)
    }

    /// The revision of the last change the view applied as it arrived (or
    /// of its last load): every write at or below it is in the view.
    pub fn through_events(&self) -> i64 {
        self.through_events.load(Ordering::SeqCst)
    }

    /// Every revision after the last load up to this one brought the watch
    /// an event ([`NO_CHAIN`] once one did not, until the next load).
    ///
    /// etcd gives every transaction that changes anything a revision of its
    /// own, and the watch delivers all of a revision's events together; so
    /// when every change in etcd is under this prefix (an etcd of its own,
    /// as `flotilla dev --ha` runs), a chain unbroken up to a revision means
    /// the watch missed no revision up to it (a watch resumed past events,
    /// etcd#17529 skipping some). It cannot see a revision that lost some
    /// of its events (etcd#18089: deletes dropped at a compaction's
    /// revision): `Follower::view_at` compares counts too. A revision
    /// without an event (another installation's write, a miss) breaks it.
    pub fn chained_through(&self) -> i64 {
        self.chained.load(Ordering::SeqCst)
    }

    /// A load at `revision`: the chain starts there.
    fn loaded(&self, revision: i64) {
        self.chained.store(revision, Ordering::SeqCst);
        self.arrived(revision);
    }

    /// An event at `revision` arrived (events come in revision order).
    fn chain(&self, revision: i64) {
        let at = self.chained.load(Ordering::SeqCst);
        if at == NO_CHAIN || revision <= at {
            return;
        }
        self.chained.store(if revision == at + 1 { revision } else { NO_CHAIN }, Ordering::SeqCst);
    }

    /// At most this old: the view held every write etcd had this long ago.
    pub fn lag(&self) -> Duration {
        let at = *self.current_at.lock().unwrap_or_else(|p| p.into_inner());
        at.unwrap_or(self.started).elapsed()
    }

    fn applied(&self, revision: i64) {
        self.applied.fetch_max(revision, Ordering::SeqCst);
    }

    /// Changes up to `revision` applied as they arrived (or loaded).
    fn arrived(&self, revision: i64) {
        self.through_events.fetch_max(revision, Ordering::SeqCst);
        self.applied(revision);
    }

    fn current(&self, asked: Instant) {
        let mut at = self.current_at.lock().unwrap_or_else(|p| p.into_inner());
        if at.is_none_or(|a| a < asked) {
            *at = Some(asked);
        }
    }
}

/// Why one watch ended.
enum End {
    Stopped,
    /// etcd compacted the revisions it would resume from: load again.
    Compacted,
    /// A response larger than the connection takes: resumed from the same
    /// revision, the watch would get at least as much again (load again).
    TooLarge(String),
    Broken(String),
}

/// Held changes of a redo record being applied (`None`: none is).
type Held = Option<Vec<Change>>;

/// Follows the prefix into `apply` until `stop` (blocking: its own
/// thread). A load reads the column families `cfs` only; the watch
/// delivers changes to every column family.
///
/// A watch in step gets one response per transaction (at most the
/// writer's `max_txn_bytes`), but one catching up gets up to 1,000
/// revisions' events in one: hence the connection's large message limit
/// (with gRPC's default of 4 MiB, the failover bench's watch broke on one
/// of 4.3 MB again at every resume, its view stuck), and a watch that
/// still cannot get through reads the store again ([`End::TooLarge`]).
pub fn follow(conn: &Conn, cfs: &[&'static str], apply: &mut dyn Apply, progress: &Progress, stop: &AtomicBool) {
    let mut next = None;
    let mut held: Held = None;
    let mut pause = Duration::from_millis(100);
    while !stop.load(Ordering::SeqCst) {
        let from = match next {
            Some(r) => r,
            None => match load(conn, cfs, apply, stop) {
                Ok(None) => return,
                Ok(Some(rev)) => {
                    held = None;
                    progress.loaded(rev);
                    rev + 1
                }
                Err(e) => {
                    tracing::warn!(error = %e, "a follower cannot read the store; trying again");
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_secs(2));
                    continue;
                }
            },
        };
        next = Some(from);
        let end = conn.bridge.handle().block_on(watch(conn, from, apply, progress, &mut held, &mut next, stop));
        match end {
            End::Stopped => return,
            End::Compacted => {
                tracing::warn!(from, "etcd compacted the revisions a follower needs; it reads the store again");
                next = None;
            }
            End::TooLarge(why) => {
                tracing::warn!(%why, from = ?next, "a follower's watch got more than it takes at once; it reads the store again");
                next = None;
            }
            End::Broken(why) => {
                tracing::info!(%why, from = ?next, "a follower's watch broke; resuming");
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_secs(2));
            }
        }
        if next.is_some_and(|n| n > from) {
            pause = Duration::from_millis(100);
        }
    }
}

/// Every key of column family `cf` at `revision`, with the revision that
/// last changed it (keys only: what a view is checked against; blocking).
pub fn revisions_at(conn: &Conn, cf: &'static str, revision: i64) -> Result<Vec<(Vec<u8>, i64)>, StorageError> {
    let prefix = conn.layout.cf_prefix(cf);
    let end = prefix_end(&prefix);
    let mut from = prefix.clone();
    let mut out = Vec::new();
    loop {
        let (page, more, _) = conn.range_revisions(from.clone(), end.clone(), revision, true)?;
        let Some((last, _, _)) = page.last() else { break };
        from = last.clone();
        from.push(0);
        out.extend(page.into_iter().map(|(k, _, changed)| (k[prefix.len()..].to_vec(), changed)));
        if !more {
            break;
        }
    }
    Ok(out)
}

/// How many keys column family `cf` holds at `revision` (blocking).
pub fn count_at(conn: &Conn, cf: &'static str, revision: i64) -> Result<usize, StorageError> {
    let prefix = conn.layout.cf_prefix(cf);
    let end = prefix_end(&prefix);
    Ok(usize::try_from(conn.count(prefix, end, revision)?).unwrap_or(0))
}

/// How long a load waits before looking again for a redo record under way.
const REDO_RECHECK: Duration = Duration::from_millis(50);

/// A load waiting this long for a redo record says so.
const REDO_WARN_AFTER: Duration = Duration::from_secs(5);

/// Reads the column families `cfs` at one revision into `apply`; the
/// revision read (`None`: `stop` was set first).
///
/// Never at a revision where a redo record is under way: its request is
/// then half applied, and a view loaded there would show half of it
/// (served, during a reload after a compaction). Its writer finishes it
/// within a few transactions, or the next leader does as its store opens;
/// the load waits for that, the view it had staying as it was.
fn load(
    conn: &Conn,
    cfs: &[&'static str],
    apply: &mut dyn Apply,
    stop: &AtomicBool,
) -> Result<Option<i64>, StorageError> {
    // The revision every page reads at, one without a redo record.
    let head = conn.layout.redo_head();
    let waiting = Instant::now();
    let mut warned = false;
    let rev = loop {
        let (found, _, rev) = conn.range(head.clone(), prefix_end(&head), 1, false, 0)?;
        if !found.iter().any(|(k, _)| *k == head) {
            break rev;
        }
        if stop.load(Ordering::SeqCst) {
            return Ok(None);
        }
        if !warned && waiting.elapsed() > REDO_WARN_AFTER {
            tracing::warn!("a follower's load waits for a large write under way (an etcd redo record) to be finished");
            warned = true;
        }
        std::thread::sleep(REDO_RECHECK);
    };
    apply.begin_load();
    for cf in cfs {
        let prefix = conn.layout.cf_prefix(cf);
        let end = prefix_end(&prefix);
        let mut from = prefix;
        loop {
            let (page, more, _) = conn.range_revisions(from.clone(), end.clone(), rev, false)?;
            let Some((last, _, _)) = page.last() else { break };
            from = last.clone();
            from.push(0);
            for (k, v, changed) in page {
                if let Some(change) = change(conn, &k, Some(v), changed) {
                    apply.apply(change);
                }
            }
            if !more {
                break;
            }
        }
    }
    apply.end_load();
    Ok(Some(rev))
}

fn change(conn: &Conn, key: &[u8], value: Option<Vec<u8>>, revision: i64) -> Option<Change> {
    let (cf, key) = conn.layout.split(key, &master_cf::ALL)?;
    Some(match value {
        Some(value) => Change::Put { cf, key: key.to_vec(), value, revision },
        None => Change::Delete { cf, key: key.to_vec() },
    })
}

/// One watch from revision `from`; `next` follows what it applied.
async fn watch(
    conn: &Conn,
    from: i64,
    apply: &mut dyn Apply,
    progress: &Progress,
    held: &mut Held,
    next: &mut Option<i64>,
    stop: &AtomicBool,
) -> End {
    let (member, client) = conn.members.pick();
    let kv = client.kv_client();
    let options = WatchOptions::new().with_prefix().with_start_revision(from);
    let mut watcher = client.watch_client().max_decoding_message_size(conn.message_limit);
    let mut stream = match watcher.watch(conn.layout.prefix().to_vec(), Some(options)).await {
        Ok(s) => s,
        Err(e) => {
            conn.members.failed(member);
            return End::Broken(e.to_string());
        }
    };
    // The one ask waiting: when it was made, and etcd's revision then.
    let mut ask: Option<(Instant, i64)> = None;
    let mut heard = Instant::now();
    let mut tick = tokio::time::interval(ASK_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let head = conn.layout.redo_head();
    let leader_key = conn.layout.leader();
    loop {
        tokio::select! {
            _ = tick.tick() => {
                if stop.load(Ordering::SeqCst) {
                    return End::Stopped;
                }
                if ask.is_some() && heard.elapsed() > SILENT_LIMIT {
                    conn.members.failed(member);
                    return End::Broken(format!("nothing from the watch for {SILENT_LIMIT:?}"));
                }
                if ask.is_some_and(|(at, _)| at.elapsed() < ASK_AGAIN) {
                    continue;
                }
                // etcd's revision now (a linearizable read: a member behind
                // cannot answer it with an older one), then the ask: an
                // answer at or past it means the view holds every write
                // etcd had when the read began.
                let asked = Instant::now();
                let mut kv = kv.clone();
                let now = match kv.get(leader_key.clone(), Some(GetOptions::new().with_count_only())).await {
                    Ok(r) => r.header().map_or(0, |h| h.revision()),
                    Err(e) => {
                        conn.members.failed(member);
                        return End::Broken(e.to_string());
                    }
                };
                if let Err(e) = stream.request_progress().await {
                    conn.members.failed(member);
                    return End::Broken(e.to_string());
                }
                ask = Some((asked, now));
            }
            message = stream.message() => {
                heard = Instant::now();
                let resp = match message {
                    Ok(Some(r)) => r,
                    Ok(None) => return End::Broken("the watch stream ended".into()),
                    Err(e) if super::conn::too_large(&e) => return End::TooLarge(e.to_string()),
                    Err(e) => {
                        conn.members.failed(member);
                        return End::Broken(e.to_string());
                    }
                };
                if resp.canceled() {
                    if resp.compact_revision() > 0 {
                        return End::Compacted;
                    }
                    return End::Broken(format!("etcd canceled the watch: {}", resp.cancel_reason()));
                }
                if resp.created() {
                    continue;
                }
                let revision = resp.header().map_or(0, |h| h.revision());
                if resp.events().is_empty() {
                    // A progress report: everything up to `revision` was
                    // sent. Not where a broken watch resumes (`next`): an
                    // etcd before 3.5.13 may send one ahead of events it
                    // still holds (etcd#15220), and resuming past those
                    // would lose them for good.
                    let answered = ask.take();
                    if held.is_none() {
                        progress.applied(revision);
                        if let Some((asked, needed)) = answered
                            && revision >= needed
                        {
                            progress.current(asked);
                        }
                    }
                    continue;
                }
                let mut last = 0;
                for event in resp.events() {
                    let Some(kv) = event.kv() else { continue };
                    last = last.max(kv.mod_revision());
                    progress.chain(kv.mod_revision());
                    let put = event.event_type() == EventType::Put;
                    if kv.key() == head.as_slice() {
                        if put {
                            held.get_or_insert_with(Vec::new);
                        } else if let Some(changes) = held.take() {
                            for c in changes {
                                apply.apply(c);
                            }
                        }
                        continue;
                    }
                    let value = put.then(|| kv.value().to_vec());
                    let Some(c) = change(conn, kv.key(), value, kv.mod_revision()) else { continue };
                    match held {
                        Some(changes) => changes.push(c),
                        None => apply.apply(c),
                    }
                }
                *next = Some(next.unwrap_or(from).max(last + 1));
                if held.is_none() {
                    apply.flush();
                    progress.arrived(last);
                }
            }
        }
    }
}
