//! A follower's view of the store: the whole prefix read at one revision,
//! then every change after it from an etcd watch, resumed from the next
//! revision when the watch breaks and read whole again when etcd has
//! compacted the revisions it would need.
//!
//! A request the leader writes through a redo record ([`super::sink`]) is
//! applied in several transactions; its changes are held from the head's
//! put until the head's delete and handed over together, so a follower
//! shows such a request whole or not at all.
//!
//! How current the view is ([`Progress`]): every [`ASK_EVERY`] the watch
//! asks etcd for a progress report; etcd answers once every change up to
//! its revision at that moment has been sent. The view is then at most as
//! old as the ask, which is what `lag` reports: an upper bound, never an
//! underestimate.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::{Duration, Instant};

use etcd_client::{EventType, WatchOptions};

use super::conn::Conn;
use super::layout::prefix_end;
use crate::storage::StorageError;
use crate::storage::keys::master_cf;

/// How often the watch asks etcd how far it has sent.
pub const ASK_EVERY: Duration = Duration::from_millis(200);

/// An ask unanswered this long: the member is gone or stuck; the watch
/// resumes on the next one.
const SILENT_LIMIT: Duration = Duration::from_secs(10);

/// Unanswered asks kept (etcd does not answer while it catches the watch
/// up; the oldest are dropped, which can only overstate the lag).
const ASKS_KEPT: usize = 64;

/// One change under the prefix, in a column family's terms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    Put { cf: &'static str, key: Vec<u8>, value: Vec<u8> },
    Delete { cf: &'static str, key: Vec<u8> },
}

/// What a follower does with the changes (its read model).
pub trait Apply {
    /// Forgets everything: the whole prefix follows.
    fn reset(&mut self);
    fn apply(&mut self, change: Change);
    /// The end of a group of changes (one watch response, one load): publish.
    fn flush(&mut self);
}

/// How far the view has come.
#[derive(Debug)]
pub struct Progress {
    applied: AtomicI64,
    /// When etcd last held nothing the view lacks (`None`: not yet).
    current_at: Mutex<Option<Instant>>,
    started: Instant,
}

impl Default for Progress {
    fn default() -> Self {
        Progress { applied: AtomicI64::new(0), current_at: Mutex::new(None), started: Instant::now() }
    }
}

impl Progress {
    /// The etcd revision the view reflects (0: not loaded yet).
    pub fn applied_revision(&self) -> i64 {
        self.applied.load(Ordering::SeqCst)
    }

    /// At most this old: the view held every write etcd had this long ago.
    pub fn lag(&self) -> Duration {
        let at = *self.current_at.lock().unwrap_or_else(|p| p.into_inner());
        at.unwrap_or(self.started).elapsed()
    }

    fn applied(&self, revision: i64) {
        self.applied.fetch_max(revision, Ordering::SeqCst);
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
    Broken(String),
}

/// Held changes of a redo record being applied (`None`: none is).
type Held = Option<Vec<Change>>;

/// Follows the prefix into `apply` until `stop` (blocking: its own thread).
pub fn follow(conn: &Conn, apply: &mut dyn Apply, progress: &Progress, stop: &AtomicBool) {
    let mut next = None;
    let mut held: Held = None;
    let mut pause = Duration::from_millis(100);
    while !stop.load(Ordering::SeqCst) {
        let from = match next {
            Some(r) => r,
            None => match load(conn, apply, &mut held) {
                Ok(rev) => {
                    progress.applied(rev);
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
            End::Broken(why) => {
                tracing::debug!(%why, from = ?next, "a follower's watch broke; resuming");
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_secs(2));
            }
        }
        if next.is_some_and(|n| n > from) {
            pause = Duration::from_millis(100);
        }
    }
}

/// Reads the whole prefix at one revision into `apply` (after a reset).
fn load(conn: &Conn, apply: &mut dyn Apply, held: &mut Held) -> Result<i64, StorageError> {
    let prefix = conn.layout.prefix().to_vec();
    let end = prefix_end(&prefix);
    let mut from = prefix;
    let mut rev = 0;
    apply.reset();
    *held = None;
    loop {
        let (page, more, at) = conn.range(from.clone(), end.clone(), usize::MAX, false, rev)?;
        rev = at;
        let Some((last, _)) = page.last() else { break };
        from = last.clone();
        from.push(0);
        for (k, v) in page {
            if k == conn.layout.redo_head() {
                // A record committed and not yet wholly applied: the rest
                // of it comes through the watch, held until its head goes.
                *held = Some(Vec::new());
            } else if let Some(change) = change(conn, &k, Some(v)) {
                apply.apply(change);
            }
        }
        if !more {
            break;
        }
    }
    apply.flush();
    Ok(rev)
}

fn change(conn: &Conn, key: &[u8], value: Option<Vec<u8>>) -> Option<Change> {
    let (cf, key) = conn.layout.split(key, &master_cf::ALL)?;
    Some(match value {
        Some(value) => Change::Put { cf, key: key.to_vec(), value },
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
    let (member, mut client) = conn.members.pick();
    let options = WatchOptions::new().with_prefix().with_start_revision(from);
    let mut stream = match client.watch(conn.layout.prefix().to_vec(), Some(options)).await {
        Ok(s) => s,
        Err(e) => {
            conn.members.failed(member);
            return End::Broken(e.to_string());
        }
    };
    let mut asks: VecDeque<Instant> = VecDeque::new();
    let mut tick = tokio::time::interval(ASK_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let head = conn.layout.redo_head();
    loop {
        tokio::select! {
            _ = tick.tick() => {
                if stop.load(Ordering::SeqCst) {
                    return End::Stopped;
                }
                if let Err(e) = stream.request_progress().await {
                    conn.members.failed(member);
                    return End::Broken(e.to_string());
                }
                if asks.front().is_some_and(|a| a.elapsed() > SILENT_LIMIT) {
                    conn.members.failed(member);
                    return End::Broken(format!("no progress report for {SILENT_LIMIT:?}"));
                }
                asks.push_back(Instant::now());
                if asks.len() > ASKS_KEPT {
                    asks.pop_front();
                }
            }
            message = stream.message() => {
                let resp = match message {
                    Ok(Some(r)) => r,
                    Ok(None) => return End::Broken("the watch stream ended".into()),
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
                    // A progress report: everything up to `revision` was sent.
                    *next = Some(next.unwrap_or(from).max(revision + 1));
                    if held.is_none() {
                        progress.applied(revision);
                        if let Some(asked) = asks.pop_front() {
                            progress.current(asked);
                        }
                    }
                    continue;
                }
                let mut last = 0;
                for event in resp.events() {
                    let Some(kv) = event.kv() else { continue };
                    last = last.max(kv.mod_revision());
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
                    let Some(c) = change(conn, kv.key(), put.then(|| kv.value().to_vec())) else { continue };
                    match held {
                        Some(changes) => changes.push(c),
                        None => apply.apply(c),
                    }
                }
                *next = Some(next.unwrap_or(from).max(last + 1));
                if held.is_none() {
                    apply.flush();
                    progress.applied(last);
                }
            }
        }
    }
}
