//! `GET /clusters/{name}/instances/{id}/logs?stream=stdout|stderr&tail=N&follow=true`:
//! an instance's log, read from its agent (`ReadLog`). Without `follow`, the
//! last `tail` lines (default 100). With it, those lines and then what the
//! process writes, as a chunked `text/plain` stream: the master asks its
//! agent for what follows every [`POLL`] (less often while the log is
//! quiet) while the client stays, so neither side keeps state per reader;
//! a client that left is noticed at the next write, and a log silent for
//! [`IDLE_END`] ends its stream.
//!
//! Reads are bounded here as on the agent: at most [`MAX_PER_INSTANCE`]
//! reads (a followed log counts for as long as it is followed) of one
//! instance and [`MAX_PER_NODE`] of one node at once through this master;
//! one more is refused at once (`503 overloaded`, saying which bound). A
//! read the agent refuses because of what it found (a link, a FIFO, a file
//! of another user where the log should be) is `409 log_refused`, with the
//! agent's reason.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix_web::{HttpResponse, web};
use bytes::Bytes;
use serde::Deserialize;
use tokio::sync::mpsc;
use utoipa::{IntoParams, ToSchema};

use super::AppState;
use super::error::ApiError;
use crate::actors::node_link::{NodeError, NodeLink};
use crate::error::Error;
use crate::ids::{InstanceId, NodeId};
use crate::protocol::messages::{AgentRequest, AgentResponse, FailureKind, LogFrom, LogStream};

/// How often a followed log is read again while it grows; a quiet log is
/// read less and less often, down to every [`POLL_QUIET`].
const POLL: Duration = Duration::from_millis(300);
const POLL_QUIET: Duration = Duration::from_secs(5);
/// A followed log silent this long ends its stream (saying so): a client
/// that left is only noticed when a write to it fails.
const IDLE_END: Duration = Duration::from_secs(3600);
/// The most bytes one read asks for.
const CHUNK: u32 = 64 * 1024;
/// At most this many lines of `tail`.
const MAX_TAIL: u32 = 10_000;
/// Log reads (one-shot or followed) of one instance at once.
pub const MAX_PER_INSTANCE: usize = 4;
/// Log reads of the instances of one node at once.
pub const MAX_PER_NODE: usize = 16;

/// The log reads under way through this master, per node and per instance.
#[derive(Default)]
pub struct LogReaders(Mutex<(HashMap<NodeId, usize>, HashMap<InstanceId, usize>)>);

/// One read's place, given back when dropped (a followed log holds it
/// for as long as it is followed).
pub struct ReaderSlot(Arc<LogReaders>, NodeId, InstanceId);

impl LogReaders {
    fn take(self: &Arc<Self>, node: &NodeId, id: &InstanceId) -> Result<ReaderSlot, Error> {
        let mut guard = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let (nodes, instances) = &mut *guard;
        let on_node = nodes.get(node).copied().unwrap_or(0);
        if on_node >= MAX_PER_NODE {
            return Err(Error::overloaded(format!(
                "{on_node} log reads of instances on node {node} are under way (at most {MAX_PER_NODE}); retry shortly"
            )));
        }
        let of_instance = instances.get(id).copied().unwrap_or(0);
        if of_instance >= MAX_PER_INSTANCE {
            return Err(Error::overloaded(format!(
                "{of_instance} log reads of {id} are under way (at most {MAX_PER_INSTANCE}); retry shortly"
            )));
        }
        *nodes.entry(node.clone()).or_default() += 1;
        *instances.entry(id.clone()).or_default() += 1;
        Ok(ReaderSlot(self.clone(), node.clone(), id.clone()))
    }
}

impl Drop for ReaderSlot {
    fn drop(&mut self) {
        let mut guard = self.0.0.lock().unwrap_or_else(|p| p.into_inner());
        let (nodes, instances) = &mut *guard;
        if let Some(n) = nodes.get_mut(&self.1) {
            *n -= 1;
            if *n == 0 {
                nodes.remove(&self.1);
            }
        }
        if let Some(n) = instances.get_mut(&self.2) {
            *n -= 1;
            if *n == 0 {
                instances.remove(&self.2);
            }
        }
    }
}

/// Which of an instance's logs.
#[derive(Debug, Clone, Copy, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum StreamName {
    Stdout,
    Stderr,
}

#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct LogsQuery {
    /// `stdout` (the default) or `stderr`.
    stream: Option<StreamName>,
    /// The last this many lines first (default 100, at most 10000).
    tail: Option<u32>,
    /// Keep the answer open and send what the process writes next.
    #[serde(default)]
    follow: bool,
}

/// An instance's log
///
/// Without `follow`, the last `tail` lines. With it, those lines and then
/// what the process writes, as a chunked `text/plain` stream that ends
/// when the client leaves, the instance goes away, or the log stays
/// silent for an hour (a last bracketed line says why).
#[utoipa::path(get, path = "/api/v1/clusters/{name}/instances/{id}/logs", operation_id = "instance_logs", tag = "instances",
    params(("name" = String, Path, description = "The cluster's name", example = "demo"),
        ("id" = String, Path, description = "The instance's id"), LogsQuery),
    responses(
        (status = 200, description = "The log's text (a stream with `follow=true`)", body = String,
            content_type = "text/plain; charset=utf-8"),
        (status = 400, response = super::error::BadRequest),
        (status = 404, response = super::error::NotFound),
        (status = 503, response = super::error::Unavailable)))]
pub async fn logs(
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
    q: web::Query<LogsQuery>,
) -> Result<HttpResponse, ApiError> {
    let (name, id) = path.into_inner();
    let stream = match q.stream.unwrap_or(StreamName::Stdout) {
        StreamName::Stdout => LogStream::Stdout,
        StreamName::Stderr => LogStream::Stderr,
    };
    let tail = q.tail.unwrap_or(100);
    if tail > MAX_TAIL {
        return Err(
            Error::invalid("invalid_query", format!("tail must be at most {MAX_TAIL} lines, got {tail}")).into()
        );
    }
    let cluster = state.shared.read_model.cluster(&name).ok_or_else(|| Error::not_found("cluster", &name))?;
    let id = InstanceId::new(id);
    let node =
        cluster.instances.get(&id).map(|i| i.record.node.clone()).ok_or_else(|| Error::not_found("instance", &id))?;
    let link =
        state.shared.links.get(&node).ok_or_else(|| Error::unavailable(format!("node {node} is not connected")))?;
    let slot = state.log_readers.take(&node, &id)?;
    let (first, mut next) = read(&link, &id, stream, LogFrom::Tail(tail)).await?;
    if !q.follow {
        return Ok(HttpResponse::Ok().content_type("text/plain; charset=utf-8").body(first));
    }
    let (tx, rx) = mpsc::channel::<Bytes>(16);
    actix_web::rt::spawn(async move {
        let _slot = slot;
        if tx.send(Bytes::from(first)).await.is_err() {
            return;
        }
        let (mut wait, mut last_data) = (POLL, tokio::time::Instant::now());
        loop {
            tokio::select! {
                () = tx.closed() => return,
                () = tokio::time::sleep(wait) => {}
            }
            if last_data.elapsed() >= IDLE_END {
                let _ = tx.send(Bytes::from_static(b"\n[flotilla: no output for an hour; the stream ends]\n")).await;
                return;
            }
            match read(&link, &id, stream, LogFrom::Offset(next)).await {
                Ok((data, n)) => {
                    next = n;
                    if data.is_empty() {
                        wait = (wait * 2).min(POLL_QUIET);
                        continue;
                    }
                    (wait, last_data) = (POLL, tokio::time::Instant::now());
                    if tx.send(Bytes::from(data)).await.is_err() {
                        return;
                    }
                }
                // The agent's own bound on reads at once (other readers
                // through other masters, or one-shot reads beside the
                // followers this master lets through): try again later.
                Err(ApiError(Error::Overloaded { .. })) => wait = (wait * 2).min(POLL_QUIET),
                Err(e) => {
                    let _ = tx.send(Bytes::from(format!("\n[flotilla: the log stream ended: {}]\n", e.0))).await;
                    return;
                }
            }
        }
    });
    let body = super::channel_body(rx);
    Ok(HttpResponse::Ok()
        .content_type("text/plain; charset=utf-8")
        .insert_header(("cache-control", "no-cache"))
        .streaming(body))
}

/// One `ReadLog` through `link`: (bytes, the offset to read from next).
async fn read(link: &NodeLink, id: &InstanceId, stream: LogStream, from: LogFrom) -> Result<(Vec<u8>, u64), ApiError> {
    let req = AgentRequest::ReadLog { instance: id.clone(), stream, from, max_bytes: CHUNK };
    let refused = |f: &crate::protocol::messages::CommandFailure| match f.kind {
        // What the agent found where the log should be (a link, a FIFO,
        // another user's file): the read is refused, not failed.
        FailureKind::BadRequest => {
            Error::conflict("log_refused", format!("the agent refused to read the log: {}", f.message))
        }
        FailureKind::Busy => Error::overloaded(format!("the agent is busy: {}", f.message)),
        _ => Error::unavailable(format!("the agent could not read the log: {}", f.message)),
    };
    match link.call(req, "ReadLog").await {
        Ok(AgentResponse::LogChunk { data, next_offset }) => Ok((data, next_offset)),
        Ok(AgentResponse::Failed(f)) | Err(NodeError::Failed(f)) => Err(ApiError(refused(&f))),
        Ok(other) => Err(ApiError(Error::unavailable(format!("unexpected answer to ReadLog: {other:?}")))),
        Err(e) => Err(ApiError(Error::unavailable(format!("reading the log: {}", crate::error::ErrorChain(&e))))),
    }
}
