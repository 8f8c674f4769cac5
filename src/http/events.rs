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
//! takes. The live feed carries appended events only (not whole batches),
//! and a client it outran, or that sees a number missing, catches up from
//! the store at its own pace. A client asking for (or falling behind to)
//! events the store no longer keeps, or for an id past the newest, gets a
//! final `dropped` event saying so and the stream ends; the event clears
//! the browser's last id (`id:` empty), so it must reload its state and
//! reconnect without `Last-Event-ID`. A stream ends too when its token is
//! revoked. A comment every [`KEEPALIVE`] of silence keeps proxies from
//! closing the stream and finds clients that left.

use std::sync::Arc;
use std::time::Duration;

use actix_web::{HttpMessage, HttpRequest, HttpResponse, web};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::{broadcast, mpsc};
use utoipa::{IntoParams, ToSchema};

use super::AppState;
use super::auth::AuthedToken;
use super::error::ApiError;
use crate::actors::tokens::ApiTokens;
use crate::error::Error;
use crate::storage::keys::{event_seq, master_cf};
use crate::storage::meta::{self, MetaStore};
use crate::storage::records::EventRecord;
use crate::storage::writer::Appended;
use crate::storage::{StorageError, db};

/// Events queued between the reader task and one client's socket.
const CHANNEL: usize = 64;
/// Events read from the store at a time while catching up.
const PAGE: usize = 500;
/// A comment line this often keeps proxies from closing an idle stream
/// (and finds clients that left).
const KEEPALIVE: Duration = Duration::from_secs(15);

#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct EventsQuery {
    /// Replay the retained events after this one first (as `Last-Event-ID`,
    /// which wins when both are given).
    after: Option<u64>,
    /// Only this cluster's events.
    cluster: Option<String>,
    /// Only these kinds, comma-separated; one ending in `.` or `*` matches
    /// by prefix (`operation.`).
    kind: Option<String>,
}

/// The `data:` of one event.
#[derive(Debug, Serialize, ToSchema)]
pub struct EventData {
    /// The event's number, as in `id:`: increasing, also across restarts.
    pub id: u64,
    /// When it happened (RFC 3339).
    pub at: String,
    /// As in `event:`: `cluster.status`, `instance.status`,
    /// `operation.created`, `operation.step_started`, `node.status`, ...
    pub kind: String,
    /// The cluster it concerns, if any.
    pub cluster: Option<String>,
    /// What changed; its fields depend on `kind`.
    pub data: Value,
}

/// The `data:` of the final `dropped` event.
#[derive(Debug, Serialize, ToSchema)]
pub struct DroppedData {
    pub reason: String,
}

/// One message of the stream as an SSE client reads it (as OpenAPI 3.2's
/// `itemSchema` would describe it; before 3.2, the media type's `schema`
/// describes each event of a `text/event-stream`).
#[derive(ToSchema)]
#[allow(dead_code)] // The framing's description; `message` and `dropped` write it.
pub struct SseEvent {
    /// The event's number (resume after it with `Last-Event-ID`); empty on
    /// `dropped`, which clears the browser's last id.
    id: String,
    /// The event's kind (as `EventData.kind`), or `dropped`.
    event: String,
    #[schema(schema_with = sse_data_schema)]
    data: String,
}

/// `data:`: a string holding JSON.
fn sse_data_schema() -> utoipa::openapi::schema::Object {
    use utoipa::openapi::schema::{ObjectBuilder, OneOfBuilder, Type};
    use utoipa::openapi::{Ref, RefOr};
    let content =
        OneOfBuilder::new().item(Ref::from_schema_name("EventData")).item(Ref::from_schema_name("DroppedData")).build();
    let mut data = ObjectBuilder::new()
        .schema_type(Type::String)
        .content_media_type("application/json")
        .description(Some("JSON: an `EventData`, or a `DroppedData` on `dropped`"))
        .build();
    data.content_schema = Some(Box::new(RefOr::T(content.into())));
    data
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

/// The event stream (server-sent events)
///
/// Every state change as it is stored: cluster status and description,
/// instance status and pid, operation created / step started / step ended
/// / progress / ended, node status, actor started / stopped / failed.
/// Each message is `id: N`, `event: KIND` and `data: JSON` (an
/// `EventData`), then a blank line; a line starting with `:` is a comment
/// (one opens the stream, one keeps it alive every 15 s of silence).
///
/// With `Last-Event-ID` (or `?after=N`) the retained events after `N` come
/// first, then the live ones, with no gap and no repeat. A client asking
/// for events no longer kept or past the newest, one too slow to keep up,
/// or one whose token is revoked gets a final `event: dropped` (its `data`
/// a `DroppedData`, its `id:` empty so the browser forgets its last id) and
/// the stream ends: reload the state and reconnect without `Last-Event-ID`.
#[utoipa::path(get, path = "/api/v1/events", operation_id = "events", tag = "events",
    params(EventsQuery,
        ("Last-Event-ID" = Option<u64>, Header, description = "Resume after this event")),
    responses(
        (status = 200, description = "An endless stream of events", body = SseEvent,
            content_type = "text/event-stream"),
        (status = 400, response = super::error::BadRequest),
        (status = 500, response = super::error::Internal),
        (status = 503, response = super::error::Unavailable)))]
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
    let token = req.extensions().get::<AuthedToken>().map(|t| t.0.id.clone()).unwrap_or_default();
    let store = state.shared.read_model.store().clone();
    // Before anything is read, so nothing committed meanwhile is missed.
    let live = store.subscribe_appends();
    let newest = newest(&store).await?;
    let (tx, rx) = mpsc::channel::<Bytes>(CHANNEL);
    let client = Client { store, tokens: state.tokens.clone(), token, filter, tx };
    match after {
        Some(n) if n > newest => {
            let reason = format!(
                "event {n} does not exist (the newest is {newest}); reload and reconnect without Last-Event-ID"
            );
            let _ = client.tx.try_send(dropped(&reason));
        }
        // From now on: the newest stored event is the starting point.
        None => drop(actix_web::rt::spawn(client.feed(live, newest, false))),
        Some(n) => drop(actix_web::rt::spawn(client.feed(live, n, true))),
    }
    let body = super::channel_body(rx);
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
    let body = EventData {
        id: e.seq,
        at: e.at.format(&time::format_description::well_known::Rfc3339).unwrap_or_default(),
        kind: e.kind.clone(),
        cluster: e.cluster.clone(),
        data: serde_json::from_str(&e.data).unwrap_or(Value::Null),
    };
    let body = serde_json::to_string(&body).unwrap_or_default();
    Bytes::from(format!("id: {}\nevent: {}\ndata: {body}\n\n", e.seq, e.kind))
}

/// The final event of a dropped stream; its empty `id:` clears the
/// browser's last event id, so its reconnect starts afresh.
fn dropped(reason: &str) -> Bytes {
    let data = serde_json::to_string(&DroppedData { reason: reason.to_string() }).unwrap_or_default();
    Bytes::from(format!("id:\nevent: dropped\ndata: {data}\n\n"))
}

/// One client's stream.
struct Client {
    store: Arc<dyn MetaStore>,
    tokens: Arc<ApiTokens>,
    /// The id of the token it connected with.
    token: String,
    filter: Filter,
    tx: mpsc::Sender<Bytes>,
}

/// Why a stream ends.
enum End {
    /// The client left.
    Gone,
    /// Told why, with a final `dropped` event.
    Dropped(String),
}

impl Client {
    /// Feeds the client until it leaves or is dropped.
    async fn feed(self, live: broadcast::Receiver<Arc<Appended>>, last: u64, resumed: bool) {
        if let End::Dropped(reason) = self.run(live, last, resumed).await {
            let _ = self.tx.send(dropped(&reason)).await;
        }
    }

    /// Sends `bytes`; `Err(Gone)` when the client left.
    async fn send(&self, bytes: Bytes) -> Result<(), End> {
        self.tx.send(bytes).await.map_err(|_| End::Gone)
    }

    async fn run(&self, mut live: broadcast::Receiver<Arc<Appended>>, mut last: u64, resumed: bool) -> End {
        // A comment first, so the client sees the stream open at once.
        if self.send(Bytes::from_static(b": flotilla events\n\n")).await.is_err() {
            return End::Gone;
        }
        let mut catch_up = resumed;
        let mut quiet_since = tokio::time::Instant::now();
        loop {
            if !self.tokens.contains(&self.token) {
                return End::Dropped("the token of this stream was revoked".into());
            }
            if catch_up {
                if let Err(end) = self.replay(&mut last).await {
                    return end;
                }
                catch_up = false;
                quiet_since = tokio::time::Instant::now();
            }
            let batch = tokio::select! {
                () = self.tx.closed() => return End::Gone,
                () = tokio::time::sleep_until(quiet_since + KEEPALIVE) => {
                    if self.send(Bytes::from_static(b": keepalive\n\n")).await.is_err() {
                        return End::Gone;
                    }
                    quiet_since = tokio::time::Instant::now();
                    continue;
                }
                r = live.recv() => r,
            };
            let batch = match batch {
                Ok(b) => b,
                // The live feed outran this client: the store has what it missed.
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    catch_up = true;
                    continue;
                }
                Err(broadcast::error::RecvError::Closed) => return End::Gone,
            };
            for (seq, value) in &batch.records {
                if *seq <= last {
                    continue;
                }
                if *seq > last + 1 {
                    // A number missing: a batch written while this client
                    // subscribed, or a failed write. The store says which.
                    catch_up = true;
                    break;
                }
                let Ok(mut e) = db::decode_value::<EventRecord>(master_cf::EVENTS, &seq.to_be_bytes(), value) else {
                    last = *seq;
                    continue;
                };
                e.seq = *seq;
                last = *seq;
                if self.filter.matches(&e) {
                    if self.send(message(&e)).await.is_err() {
                        return End::Gone;
                    }
                    quiet_since = tokio::time::Instant::now();
                }
            }
        }
    }

    /// Sends every stored event after `last` (updating it).
    async fn replay(&self, last: &mut u64) -> Result<(), End> {
        loop {
            let (s, after) = (self.store.clone(), *last);
            let page = tokio::task::spawn_blocking(move || meta::events_after(s.as_ref(), after, PAGE))
                .await
                .map_err(|e| e.to_string())
                .and_then(|r| r.map_err(|e: StorageError| e.to_string()))
                .map_err(|e| End::Dropped(format!("cannot read the stored events: {e}")))?;
            if let Some(e) = page.first() {
                // Numbers have no gaps unless a batch write failed; a first
                // event past `last + 1` when the log was trimmed means the
                // events in between are gone.
                if e.seq > *last + 1 && *last > 0 && trimmed_past(&self.store, *last).await {
                    return Err(End::Dropped(format!(
                        "events after {} are no longer kept (the oldest is {}); reload and reconnect without Last-Event-ID",
                        *last, e.seq
                    )));
                }
            }
            let full = page.len() == PAGE;
            for e in page {
                *last = e.seq;
                if self.filter.matches(&e) {
                    self.send(message(&e)).await?;
                }
            }
            if !full {
                return Ok(());
            }
        }
    }
}

/// Whether retention deleted events after `last`: the oldest kept is past it.
async fn trimmed_past(store: &Arc<dyn MetaStore>, last: u64) -> bool {
    let s = store.clone();
    let oldest = tokio::task::spawn_blocking(move || meta::events_after(s.as_ref(), 0, 1)).await;
    matches!(oldest, Ok(Ok(v)) if v.first().is_some_and(|e| e.seq > last + 1))
}
