//! Read-only endpoints: health, nodes, operations (paged, with long-poll),
//! actors. All of them read snapshots (or the store, for ended
//! operations): none waits on an actor.

use std::time::Duration;

use actix_web::{HttpResponse, web};
use serde::Deserialize;
use serde_json::json;
use time::OffsetDateTime;

use super::AppState;
use super::dto::{NodeDto, OperationDto};
use super::error::ApiError;
use crate::error::Error;
use crate::ids::{NodeId, OperationId};

/// `GET /health`: liveness and the counters a load test reads.
pub async fn health(state: web::Data<AppState>) -> HttpResponse {
    let rm = &state.shared.read_model;
    let store = rm.store().stats();
    HttpResponse::Ok().json(json!({
        "status": "ok",
        "clusters": rm.clusters().len(),
        "nodes": rm.nodes().len(),
        "packages": rm.packages().len(),
        "running_operations": rm.running_operations().len(),
        "instance_transitions": rm.counters.instance_transitions.load(std::sync::atomic::Ordering::Relaxed),
        "store": store,
    }))
}

pub async fn not_found() -> Result<HttpResponse, ApiError> {
    Err(ApiError(Error::not_found("route", "no such endpoint; see /api/v1")))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ActorsQuery {
    /// Only this cluster's actor and its instance actors.
    cluster: Option<String>,
    /// At most this many instance actors (default 1000, at most 10000).
    limit: Option<usize>,
}

/// `GET /actors`: the supervisor, cluster actors, node managers, and
/// instance actors (those of `?cluster=`, or the first `limit` overall),
/// each with its mailbox, what it handles now and for how long.
pub async fn actors(state: web::Data<AppState>, q: web::Query<ActorsQuery>) -> HttpResponse {
    let rm = &state.shared.read_model;
    let now_ms = u64::try_from(OffsetDateTime::now_utc().unix_timestamp_nanos() / 1_000_000).unwrap_or(0);
    let mut out: Vec<serde_json::Value> = rm
        .actors()
        .into_iter()
        .filter(|a| q.cluster.as_ref().is_none_or(|c| a.kind == "cluster" && &a.id == c))
        .map(|a| {
            json!({
                "kind": a.kind, "id": a.id, "parent": a.parent, "state": a.state,
                "current": a.current, "current_ms": a.current_ms, "mailbox": a.mailbox,
                "oldest_message_ms": a.oldest_message_ms, "handled": a.handled, "last_error": a.last_error,
            })
        })
        .collect();
    let limit = q.limit.unwrap_or(1000).min(10_000);
    let clusters = rm.clusters();
    let mut instance_total = 0usize;
    for (name, cell) in clusters.iter().filter(|(n, _)| q.cluster.as_ref().is_none_or(|c| c == *n)) {
        let snap = cell.load();
        instance_total += snap.instances.len();
        for e in snap.instances.values() {
            if out.len() >= limit + 3 {
                break;
            }
            let (current, since, queued, oldest, handled) = e.stats.read();
            let age = |at: u64| (at > 0).then(|| now_ms.saturating_sub(at));
            out.push(json!({
                "kind": "instance", "id": e.record.id, "parent": format!("cluster/{name}"),
                "state": format!("{:?}", e.record.status), "current": current, "current_ms": age(since),
                "mailbox": queued, "oldest_message_ms": age(oldest), "handled": handled,
                "last_error": e.record.last_error,
            }));
        }
    }
    HttpResponse::Ok().json(json!({ "actors": out, "instance_actors": instance_total }))
}

fn node_dto(state: &AppState, n: &crate::actors::read_model::NodeEntry, with_instances: bool) -> NodeDto {
    let now = OffsetDateTime::now_utc();
    let t = state.shared.timing;
    let status = n.live.status_at(now, t.node_unknown_after, t.node_down_after);
    NodeDto::build(n, status, now, with_instances)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodesQuery {
    /// At most this many (default 1000, at most 10000).
    limit: Option<usize>,
    /// The last node id of the previous page.
    after: Option<String>,
}

/// `GET /nodes`: by id, a page at a time (`next` is the cursor), each with
/// its status, heartbeat age and instance count.
pub async fn list_nodes(state: web::Data<AppState>, q: web::Query<NodesQuery>) -> HttpResponse {
    let limit = q.limit.unwrap_or(1000).clamp(1, 10_000);
    let nodes = state.shared.read_model.nodes();
    let page: Vec<NodeDto> = match &q.after {
        Some(after) => nodes
            .range((std::ops::Bound::Excluded(NodeId::new(after.clone())), std::ops::Bound::Unbounded))
            .take(limit)
            .map(|(_, n)| node_dto(&state, n, false))
            .collect(),
        None => nodes.values().take(limit).map(|n| node_dto(&state, n, false)).collect(),
    };
    let next = (page.len() == limit).then(|| page.last().map(|n| n.id.clone())).flatten();
    HttpResponse::Ok().json(json!({ "nodes": page, "total": nodes.len(), "next": next }))
}

/// `GET /nodes/{id}`: one node, with the ids of its instances.
pub async fn get_node(state: web::Data<AppState>, path: web::Path<String>) -> Result<HttpResponse, ApiError> {
    let id = NodeId::new(path.into_inner());
    match state.shared.read_model.node(&id) {
        Some(n) => Ok(HttpResponse::Ok().json(node_dto(&state, &n, true))),
        None => Err(ApiError(Error::not_found("node", id))),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpsQuery {
    cluster: Option<String>,
    /// At most this many (default 100, at most 1000).
    limit: Option<usize>,
    /// The id of the last operation of the previous page.
    after: Option<String>,
}

fn parse_op_id(raw: &str) -> Result<OperationId, Error> {
    raw.parse().map_err(|_| Error::invalid("invalid_id", format!("{raw:?} is not an operation id")))
}

/// `GET /operations`: newest first, a page at a time (`next` is the
/// cursor for `?after=`), without per-instance results (those are in
/// `GET /operations/{id}`).
pub async fn list_operations(state: web::Data<AppState>, q: web::Query<OpsQuery>) -> Result<HttpResponse, ApiError> {
    let limit = q.limit.unwrap_or(100).clamp(1, 1000);
    let after = q.after.as_deref().map(parse_op_id).transpose()?;
    let cluster = match &q.cluster {
        // A cluster's operations outlive it: look the id up among the live
        // ones; a deleted cluster's name finds nothing.
        Some(name) => match state.shared.read_model.cluster(name) {
            Some(c) => Some(c.record.id),
            None => return Ok(HttpResponse::Ok().json(json!({ "operations": [], "next": null }))),
        },
        None => None,
    };
    let rm = state.shared.read_model.clone();
    let page = web::block(move || rm.operations_page(cluster.as_ref(), after.as_ref(), limit))
        .await
        .map_err(|e| Error::unavailable(format!("reading operations: {e}")))?
        .map_err(Error::from)?;
    let next = (page.len() == limit).then(|| page.last().map(|o| o.id.to_string())).flatten();
    let dtos: Vec<OperationDto> = page.iter().map(OperationDto::from).collect();
    Ok(HttpResponse::Ok().json(json!({ "operations": dtos, "next": next })))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WaitQuery {
    /// Seconds to wait for the operation to end (at most 120).
    wait: Option<u64>,
}

pub async fn get_operation(
    state: web::Data<AppState>,
    path: web::Path<String>,
    q: web::Query<WaitQuery>,
) -> Result<HttpResponse, ApiError> {
    let id = parse_op_id(&path.into_inner())?;
    let rm = state.shared.read_model.clone();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(q.wait.unwrap_or(0).min(120));
    loop {
        // Register for the wake-up before looking, so a change between the
        // look and the wait is not missed.
        let notified = rm.operation_changed.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        // While it runs, wait on the in-memory header; answer from the
        // store, which has every journaled step's results.
        let running = rm.running_operations().get(&id).is_some_and(|o| !o.status.is_terminal());
        if running && tokio::time::Instant::now() < deadline {
            let _ = tokio::time::timeout_at(deadline, notified).await;
            continue;
        }
        let r = rm.clone();
        let op = web::block(move || r.operation(&id))
            .await
            .map_err(|e| Error::unavailable(format!("reading the operation: {e}")))?
            .map_err(Error::from)?;
        let Some(op) = op else {
            return Err(ApiError(Error::not_found("operation", id)));
        };
        if op.status.is_terminal() || tokio::time::Instant::now() >= deadline {
            return Ok(HttpResponse::Ok().json(json!({ "operation": OperationDto::from(&*op) })));
        }
        let _ = tokio::time::timeout_at(deadline, notified).await;
    }
}
