//! `GET /api/v1/events`: the event log as server-sent events.
//!
//! Each event is `id:` (its number), `event:` (its kind) and `data:` (a
//! JSON object: `id`, `at`, `kind`, `cluster`, `data`). A client that
//! reconnects with `Last-Event-ID` (or `?after=N`) first gets every
//! retained event after that one from the store, then the live ones, with
//! no gap and no repeat: the live feed is subscribed before the store is
//! read, and live events at or below the last one sent are skipped.
//! `?cluster=NAME` and `?kind=K1,K2` filter (a kind ending in `.` or `*`
//! matches by prefix: `operation.`).
//!
//! Memory per client is bounded: events reach the socket through a channel
//! of [`CHANNEL`] entries, and nothing is read ahead of what the socket
//! takes. A client the live feed outran catches up from the store at its
//! own pace. One asking for (or falling behind to) events the store no
//! longer keeps gets a final `dropped` event saying so (without an id)
//! and the stream ends: it must reload its state and reconnect without
//! `Last-Event-ID`.

use std::sync::Arc;
use std::time::Duration;

use actix_web::{HttpRequest, HttpResponse, web};
use bytes::Bytes;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::{broadcast, mpsc};

use super::AppState;
use super::error::ApiError;
use crate::error::Error;
use crate::storage::keys::{event_seq, master_cf};
use crate::storage::meta::{self, MetaStore};
use crate::storage::records::EventRecord;
use crate::storage::{StorageError, WriteOp, db};

/// Events queued between the reader task and one client's socket.
const CHANNEL: usize = 64;
/// Events read from the store at a time while catching up.
const PAGE: usize = 500;
/// A comment line this often keeps proxies from closing an idle stream
/// (and finds clients that left).
const KEEPALIVE: Duration = Duration::from_secs(15);

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventsQuery {
    after: Option<u64>,
    cluster: Option<String>,
    kind: Option<String>,
}

/// Which events a client asked for.
struct Filter {
    cluster: Option<String>,
    kinds: Vec<String>,
}

impl Filter {
    fn matches(&self, e: &EventRecord) -> bool {
        self.cluster.as_ref().is_none_or(|c| e.cluster.as_ref() == Some(c))
            && (self.kinds.is_empty()
                || self.kinds.iter().any(|k| match k.strip_suffix('*') {
                    Some(prefix) => e.kind.starts_with(prefix),
                    None if k.ends_with('.') => e.kind.starts_with(k.as_str()),
                    None => e.kind == *k,
                }))
    }
}

pub async fn stream(
    state: web::Data<AppState>,
    req: HttpRequest,
    q: web::Query<EventsQuery>,
) -> Result<HttpResponse, ApiError> {
    let header = req.headers().get("last-event-id").map(|v| {
        v.to_str()
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .ok_or_else(|| ApiError(Error::invalid("invalid_request", "Last-Event-ID must be an event number")))
    });
    let after = match header {
        Some(h) => Some(h?),
        None => q.after,
    };
    let filter = Filter {
        cluster: q.cluster.clone(),
        kinds: q
            .kind
            .iter()
            .flat_map(|k| k.split(','))
            .map(|k| k.trim().to_string())
            .filter(|k| !k.is_empty())
            .collect(),
    };
    let store = state.shared.read_model.store().clone();
    // Before anything is read, so nothing committed meanwhile is missed.
    let live = store.subscribe();
    let last = match after {
        Some(n) => n,
        // From now on: the newest stored event is the starting point.
        None => newest(&store).await?,
    };
    let (tx, rx) = mpsc::channel::<Bytes>(CHANNEL);
    actix_web::rt::spawn(feed(store, live, last, after.is_some(), filter, tx));
    let body = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<_, std::convert::Infallible>(b), rx))
    });
    Ok(HttpResponse::Ok()
        .content_type("text/event-stream")
        .insert_header(("cache-control", "no-cache"))
        .insert_header(("x-accel-buffering", "no"))
        .streaming(body))
}

async fn newest(store: &Arc<dyn MetaStore>) -> Result<u64, ApiError> {
    let s = store.clone();
    let scan = meta::Scan { reverse: true, ..meta::Scan::default() };
    let last = web::block(move || s.scan(master_cf::EVENTS, &scan, 1))
        .await
        .map_err(|e| Error::unavailable(format!("reading events: {e}")))?
        .map_err(Error::from)?;
    Ok(last.first().and_then(|(k, _)| event_seq(k)).unwrap_or(0))
}

/// One SSE message.
fn message(e: &EventRecord) -> Bytes {
    let data: Value = serde_json::from_str(&e.data).unwrap_or(Value::Null);
    let at = e.at.format(&time::format_description::well_known::Rfc3339).unwrap_or_default();
    let body = json!({ "id": e.seq, "at": at, "kind": e.kind, "cluster": e.cluster, "data": data });
    Bytes::from(format!("id: {}\nevent: {}\ndata: {body}\n\n", e.seq, e.kind))
}

fn dropped(reason: &str) -> Bytes {
    Bytes::from(format!("event: dropped\ndata: {}\n\n", json!({ "reason": reason })))
}

/// Feeds one client until it leaves (its channel closes) or is dropped.
async fn feed(
    store: Arc<dyn MetaStore>,
    mut live: broadcast::Receiver<Arc<crate::storage::writer::Committed>>,
    mut last: u64,
    resumed: bool,
    filter: Filter,
    tx: mpsc::Sender<Bytes>,
) {
    // A comment first, so the client sees the stream open at once.
    if tx.send(Bytes::from_static(b": flotilla events\n\n")).await.is_err() {
        return;
    }
    let mut catch_up = resumed;
    loop {
        if catch_up {
            match replay(&store, &mut last, &filter, &tx).await {
                Ok(true) => catch_up = false,
                Ok(false) => return,
                Err(reason) => {
                    let _ = tx.send(dropped(&reason)).await;
                    return;
                }
            }
        }
        let next = tokio::time::timeout(KEEPALIVE, live.recv()).await;
        let batch = match next {
            Err(_) => {
                if tx.send(Bytes::from_static(b": keepalive\n\n")).await.is_err() {
                    return;
                }
                continue;
            }
            Ok(Ok(b)) => b,
            // The live feed outran this client: the store has what it missed.
            Ok(Err(broadcast::error::RecvError::Lagged(_))) => {
                catch_up = true;
                continue;
            }
            Ok(Err(broadcast::error::RecvError::Closed)) => return,
        };
        for op in &batch.ops {
            let WriteOp::Put { cf, key, value } = op else { continue };
            if *cf != master_cf::EVENTS {
                continue;
            }
            let Some(seq) = event_seq(key) else { continue };
            if seq <= last {
                continue;
            }
            let Ok(mut e) = db::decode_value::<EventRecord>(cf, key, value) else { continue };
            e.seq = seq;
            last = seq;
            if filter.matches(&e) && tx.send(message(&e)).await.is_err() {
                return;
            }
        }
    }
}

/// Sends every stored event after `last` (updating it); `Ok(false)` when
/// the client left, `Err` when events after `last` are no longer kept.
async fn replay(
    store: &Arc<dyn MetaStore>,
    last: &mut u64,
    filter: &Filter,
    tx: &mpsc::Sender<Bytes>,
) -> Result<bool, String> {
    let mut first = true;
    loop {
        let (s, after) = (store.clone(), *last);
        let page = tokio::task::spawn_blocking(move || meta::events_after(s.as_ref(), after, PAGE))
            .await
            .map_err(|e| e.to_string())
            .and_then(|r| r.map_err(|e: StorageError| e.to_string()));
        let page = match page {
            Ok(p) => p,
            Err(e) => return Err(format!("cannot read the stored events: {e}")),
        };
        if first && let Some(e) = page.first() {
            // Sequence numbers have no gaps unless a batch write failed;
            // a first event past `last + 1` when the log was trimmed means
            // the events in between are gone.
            if e.seq > *last + 1 && *last > 0 && trimmed_past(store, *last).await {
                return Err(format!(
                    "events after {} are no longer kept (the oldest is {}); reload and reconnect without Last-Event-ID",
                    *last, e.seq
                ));
            }
        }
        first = false;
        let full = page.len() == PAGE;
        for e in page {
            *last = e.seq;
            if filter.matches(&e) && tx.send(message(&e)).await.is_err() {
                return Ok(false);
            }
        }
        if !full {
            return Ok(true);
        }
    }
}

/// Whether retention deleted events after `last`: the oldest kept is past it.
async fn trimmed_past(store: &Arc<dyn MetaStore>, last: u64) -> bool {
    let s = store.clone();
    let oldest = tokio::task::spawn_blocking(move || meta::events_after(s.as_ref(), 0, 1)).await;
    matches!(oldest, Ok(Ok(v)) if v.first().is_some_and(|e| e.seq > last + 1))
}
