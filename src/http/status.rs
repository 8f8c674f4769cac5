//! Read-only endpoints: health, nodes, operations (paged, with long-poll),
//! actors. All of them read snapshots (or the store, for ended
//! operations): none waits on an actor.

use std::time::Duration;

use actix_web::{HttpResponse, web};
use serde::Deserialize;
use time::OffsetDateTime;
use utoipa::IntoParams;

use super::AppState;
use super::dto::{ActorDto, ActorsDto, HealthDto, NodeDto, NodePage, OperationDto, OperationEnvelope, OperationPage};
use super::error::ApiError;
use crate::error::Error;
use crate::ids::{NodeId, OperationId};

/// Liveness and the counters a load test reads
///
/// Open without a token while the `open_health` setting is on (the default).
#[utoipa::path(get, path = "/api/v1/health", operation_id = "health", tag = "status",
    security((), ("bearer" = [])),
    responses((status = 200, description = "The master is alive", body = HealthDto)))]
pub async fn health(state: web::Data<AppState>) -> HttpResponse {
    let rm = &state.shared.read_model;
    let role = &state.shared.role;
    let following = role.following.as_ref();
    HttpResponse::Ok().json(HealthDto {
        status: "ok".into(),
        clusters: rm.clusters().len(),
        nodes: rm.nodes().len(),
        packages: rm.packages().len(),
        running_operations: rm.running_operations().len(),
        instance_transitions: rm.counters.instance_transitions.load(std::sync::atomic::Ordering::Relaxed),
        store: rm.store().stats(),
        role: if following.is_some() { "follower" } else { "leader" }.into(),
        leader: match following {
            Some(f) => f.leader.get().and_then(|l| l.info).map(|i| i.api_url),
            None => Some(role.api_url.clone()),
        },
        term: role.term(),
        name: role.name.clone(),
        pid: std::process::id(),
        store_engine: if role.leadership.is_some() || following.is_some() { "etcd" } else { "rocksdb" }.into(),
        applied_revision: following.map(|f| f.progress.applied_revision()),
        lag_ms: following.map(|f| f.progress.lag().as_millis() as u64),
        suspended: role.suspended(),
        masters: masters(&state),
        took_over: role.took_over.get().map(|t| super::dto::TookOverDto {
            from: t.from.into(),
            verified: t.verified.map(Into::into),
            ms: t.ms,
        }),
    })
}

/// The installation's masters as last read; read again in the background
/// when that is over 5 s old (health never waits on etcd).
fn masters(state: &AppState) -> Vec<super::dto::MasterDto> {
    let Some(dir) = state.shared.peers.clone() else { return Vec::new() };
    let (peers, stale) = dir.known(std::time::Duration::from_secs(5));
    if stale {
        tokio::task::spawn_blocking(move || dir.all());
    }
    peers.into_iter().map(|p| super::dto::MasterDto { name: p.name, api_url: p.api_url }).collect()
}

pub async fn not_found() -> Result<HttpResponse, ApiError> {
    Err(ApiError(Error::not_found("route", "no such endpoint; see /api/v1")))
}

#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ActorsQuery {
    /// Only this cluster's actor and its instance actors.
    cluster: Option<String>,
    /// At most this many instance actors (default 1000, at most 10000).
    limit: Option<usize>,
}

/// The supervision tree
///
/// The supervisor, cluster actors, node managers, and instance actors
/// (those of `?cluster=`, or the first `limit` overall), each with its
/// mailbox, what it handles now and for how long. On etcd, also every
/// master of the installation (`masters`: this one, the root, and the
/// others as their own health says now).
#[utoipa::path(get, path = "/api/v1/actors", operation_id = "list_actors", tag = "status", params(ActorsQuery), responses(
    (status = 200, description = "The actors", body = ActorsDto),
    (status = 400, response = super::error::BadRequest)))]
pub async fn actors(state: web::Data<AppState>, q: web::Query<ActorsQuery>) -> HttpResponse {
    let rm = &state.shared.read_model;
    let now_ms = u64::try_from(OffsetDateTime::now_utc().unix_timestamp_nanos() / 1_000_000).unwrap_or(0);
    let mut out: Vec<ActorDto> = rm
        .actors()
        .into_iter()
        .filter(|a| q.cluster.as_ref().is_none_or(|c| a.kind == "cluster" && &a.id == c))
        .map(ActorDto::from)
        .collect();
    let limit = q.limit.unwrap_or(1000).min(10_000);
    let clusters = rm.clusters();
    let mut instance_total = 0usize;
    let mut listed = 0usize;
    for (name, cell) in clusters.iter().filter(|(n, _)| q.cluster.as_ref().is_none_or(|c| c == *n)) {
        let snap = cell.load();
        instance_total += snap.instances.len();
        for e in snap.instances.values() {
            if listed >= limit {
                break;
            }
            listed += 1;
            let (current, since, queued, oldest, handled) = e.stats.read();
            let age = |at: u64| (at > 0).then(|| now_ms.saturating_sub(at));
            out.push(ActorDto::from(crate::actors::read_model::ActorInfo {
                kind: "instance",
                id: e.record.id.to_string(),
                parent: Some(format!("cluster/{name}")),
                state: format!("{:?}", e.record.status),
                current: current.map(|c| c.to_string()),
                current_ms: age(since),
                mailbox: u64::from(queued),
                oldest_message_ms: age(oldest),
                handled,
                last_error: e.record.last_error.clone(),
                last_error_age_ms: None,
                refused: 0,
                restarts: 0,
                last_exit: None,
            }));
        }
    }
    let masters = if q.cluster.is_none() { super::peers_view::masters(&state).await } else { Vec::new() };
    HttpResponse::Ok().json(ActorsDto { actors: out, instance_actors: instance_total, masters })
}

fn node_dto(state: &AppState, n: &crate::actors::read_model::NodeEntry, with_instances: bool) -> NodeDto {
    let now = std::time::Instant::now();
    let t = state.shared.timing;
    let status = n.live.status_at(now, t.node_unknown_after, t.node_down_after);
    let mut dto = NodeDto::build(n, status, now, with_instances);
    let id = n.record().id.clone();
    dto.cordon = state.shared.read_model.cordon_of(&id).map(|c| (&*c).into());
    let (origin, lifecycle) = super::pools::origin_of(state, &id);
    (dto.origin, dto.lifecycle) = (Some(origin), lifecycle);
    dto
}

#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct NodesQuery {
    /// At most this many (default 1000, at most 10000).
    limit: Option<usize>,
    /// The last node id of the previous page.
    after: Option<String>,
}

/// The nodes
///
/// By id, a page at a time (`next` is the cursor), each with its status,
/// heartbeat age and instance count.
#[utoipa::path(get, path = "/api/v1/nodes", operation_id = "list_nodes", tag = "nodes", params(NodesQuery), responses(
    (status = 200, description = "A page of nodes", body = NodePage),
    (status = 400, response = super::error::BadRequest)))]
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
    HttpResponse::Ok().json(NodePage { nodes: page, total: nodes.len(), next })
}

/// One node, with the ids of its instances
#[utoipa::path(get, path = "/api/v1/nodes/{id}", operation_id = "get_node", tag = "nodes",
    params(("id" = String, Path, description = "The node's id", example = "node-1")),
    responses(
        (status = 200, description = "The node", body = NodeDto),
        (status = 404, response = super::error::NotFound)))]
pub async fn get_node(state: web::Data<AppState>, path: web::Path<String>) -> Result<HttpResponse, ApiError> {
    let id = NodeId::new(path.into_inner());
    match state.shared.read_model.node(&id) {
        Some(n) => {
            let mut dto = node_dto(&state, &n, true);
            dto.certificate = state.trust.cert_of(&id).map(|c| super::dto::NodeCertDto::from(&*c));
            let leaked = state.shared.read_model.leaked();
            dto.leaked =
                Some(leaked.values().filter(|l| l.node == id).map(|l| super::dto::LeakedDto::from(&**l)).collect());
            Ok(HttpResponse::Ok().json(dto))
        }
        None => Err(ApiError(Error::not_found("node", id))),
    }
}

#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct OpsQuery {
    /// Only this cluster's operations (none when it does not exist).
    cluster: Option<String>,
    /// At most this many (default 100, at most 1000).
    limit: Option<usize>,
    /// The id of the last operation of the previous page.
    #[param(format = "uuid")]
    after: Option<String>,
}

/// An operation id as the API shows it: a hyphenated UUID (the other
/// spellings `uuid` parses are refused, as the API description says).
fn parse_op_id(raw: &str) -> Result<OperationId, Error> {
    let hyphenated = raw.len() == 36;
    hyphenated
        .then(|| raw.parse().ok())
        .flatten()
        .ok_or_else(|| Error::invalid("invalid_id", format!("{raw:?} is not an operation id")))
}

/// The operations
///
/// Newest first, a page at a time (`next` is the cursor for `?after=`),
/// without per-instance results (those are in `GET /operations/{id}`).
#[utoipa::path(get, path = "/api/v1/operations", operation_id = "list_operations", tag = "operations", params(OpsQuery), responses(
    (status = 200, description = "A page of operations", body = OperationPage),
    (status = 400, response = super::error::BadRequest),
    (status = 404, description = "The `after` cursor names no operation (deleted with its cluster, or never \
        one): start again without it", body = super::error::ErrorBody),
    (status = 500, response = super::error::Internal),
    (status = 503, response = super::error::Unavailable)))]
pub async fn list_operations(state: web::Data<AppState>, q: web::Query<OpsQuery>) -> Result<HttpResponse, ApiError> {
    let limit = q.limit.unwrap_or(100).clamp(1, 1000);
    let after = q.after.as_deref().map(parse_op_id).transpose()?;
    let cluster = match &q.cluster {
        // A cluster's operations outlive it: look the id up among the live
        // ones; a deleted cluster's name finds nothing.
        Some(name) => match state.shared.read_model.cluster(name) {
            Some(c) => Some(c.record.id),
            None => return Ok(HttpResponse::Ok().json(OperationPage { operations: Vec::new(), next: None })),
        },
        None => None,
    };
    let rm = state.shared.read_model.clone();
    let page = web::block(move || rm.operations_page(cluster.as_ref(), after.as_ref(), limit))
        .await
        .map_err(|e| Error::unavailable(format!("reading operations: {e}")))?
        .map_err(Error::from)?;
    let next = (page.len() == limit).then(|| page.last().map(|o| o.id.to_string())).flatten();
    let mut dtos: Vec<OperationDto> = page.iter().map(OperationDto::from).collect();
    OperationDto::attach_requests(&mut dtos, &state.pools);
    Ok(HttpResponse::Ok().json(OperationPage { operations: dtos, next }))
}

#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct WaitQuery {
    /// Seconds to wait for the operation to end (0 to 120).
    #[param(maximum = 120)]
    wait: Option<u64>,
}

/// The longest `?wait=`, in seconds.
const MAX_WAIT: u64 = 120;

/// One operation, with every step's per-instance results
///
/// `?wait=S` long-polls: the answer comes when the operation ends, or
/// after `S` seconds with it as it is then.
#[utoipa::path(get, path = "/api/v1/operations/{id}", operation_id = "get_operation", tag = "operations",
    params(("id" = String, Path, format = "uuid", description = "The operation's id"), WaitQuery),
    responses(
        (status = 200, description = "The operation", body = OperationEnvelope),
        (status = 400, response = super::error::BadRequest),
        (status = 404, response = super::error::NotFound),
        (status = 500, response = super::error::Internal),
        (status = 503, response = super::error::Unavailable)))]
pub async fn get_operation(
    state: web::Data<AppState>,
    path: web::Path<String>,
    q: web::Query<WaitQuery>,
) -> Result<HttpResponse, ApiError> {
    let id = parse_op_id(&path.into_inner())?;
    let wait = q.wait.unwrap_or(0);
    if wait > MAX_WAIT {
        return Err(ApiError(Error::invalid("invalid_query", format!("wait: at most {MAX_WAIT} seconds, got {wait}"))));
    }
    let rm = state.shared.read_model.clone();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(wait);
    loop {
        // Register for the wake-up before looking, so a change between the
        // look and the wait is not missed.
        let notified = rm.operation_changed.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        // While it runs, wait on the in-memory header; answer from the
        // store, which has every journaled step's results. One on its way
        // to the store (just accepted) is waited for the same way.
        let running = rm.running_operations().get(&id).is_some_and(|o| !o.status.is_terminal()) || rm.is_accepting(&id);
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
            let mut operation = [OperationDto::from(&*op)];
            OperationDto::attach_requests(&mut operation, &state.pools);
            let [operation] = operation;
            return Ok(HttpResponse::Ok().json(OperationEnvelope { operation }));
        }
        let _ = tokio::time::timeout_at(deadline, notified).await;
    }
}
