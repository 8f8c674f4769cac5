//! Read-only endpoints: health, nodes, operations (with long-poll), actors.

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

pub async fn health(state: web::Data<AppState>) -> HttpResponse {
    let s = state.read_model.read();
    HttpResponse::Ok().json(json!({
        "status": "ok",
        "clusters": s.clusters.len(),
        "nodes": s.nodes.len(),
        "packages": s.packages.len(),
    }))
}

pub async fn not_found() -> Result<HttpResponse, ApiError> {
    Err(ApiError(Error::not_found("route", "no such endpoint; see /api/v1")))
}

pub async fn actors(state: web::Data<AppState>) -> HttpResponse {
    let actors: Vec<_> = state
        .read_model
        .actors()
        .into_iter()
        .map(|a| {
            json!({
                "kind": a.kind, "id": a.id, "parent": a.parent, "state": a.state,
                "current": a.current, "mailbox": a.mailbox, "handled": a.handled, "last_error": a.last_error,
            })
        })
        .collect();
    HttpResponse::Ok().json(json!({ "actors": actors }))
}

fn node_dtos(state: &AppState, filter: Option<&NodeId>) -> Vec<NodeDto> {
    let s = state.read_model.read();
    let now = OffsetDateTime::now_utc();
    s.nodes
        .values()
        .filter(|v| filter.is_none_or(|f| &v.record.id == f))
        .map(|v| {
            let status = v.status_at(now, state.timing.node_unknown_after, state.timing.node_down_after);
            NodeDto::build(v, status, &s, now)
        })
        .collect()
}

pub async fn list_nodes(state: web::Data<AppState>) -> HttpResponse {
    HttpResponse::Ok().json(json!({ "nodes": node_dtos(&state, None) }))
}

pub async fn get_node(state: web::Data<AppState>, path: web::Path<String>) -> Result<HttpResponse, ApiError> {
    let id = NodeId::new(path.into_inner());
    let mut v = node_dtos(&state, Some(&id));
    match v.pop() {
        Some(n) => Ok(HttpResponse::Ok().json(n)),
        None => Err(ApiError(Error::not_found("node", id))),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpsQuery {
    cluster: Option<String>,
    limit: Option<usize>,
}

pub async fn list_operations(state: web::Data<AppState>, q: web::Query<OpsQuery>) -> HttpResponse {
    let s = state.read_model.read();
    let mut ops: Vec<_> =
        s.operations.values().filter(|o| q.cluster.as_ref().is_none_or(|c| &o.cluster == c)).collect();
    ops.sort_by_key(|o| std::cmp::Reverse(o.created_at));
    let dtos: Vec<OperationDto> =
        ops.into_iter().take(q.limit.unwrap_or(100).min(1000)).map(OperationDto::from).collect();
    HttpResponse::Ok().json(json!({ "operations": dtos }))
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
    let raw = path.into_inner();
    let id: OperationId =
        raw.parse().map_err(|_| Error::invalid("invalid_id", format!("{raw:?} is not an operation id")))?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(q.wait.unwrap_or(0).min(120));
    loop {
        // Register for the wake-up before looking, so a change between the
        // look and the wait is not missed.
        let notified = state.read_model.operation_changed.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let op = state.read_model.read().operations.get(&id).cloned();
        let Some(op) = op else {
            return Err(ApiError(Error::not_found("operation", id)));
        };
        if op.status.is_terminal() || tokio::time::Instant::now() >= deadline {
            return Ok(HttpResponse::Ok().json(json!({ "operation": OperationDto::from(&op) })));
        }
        let _ = tokio::time::timeout_at(deadline, notified).await;
    }
}
