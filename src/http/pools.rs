//! Node pools and node requests (`actors::pools`): `GET /pools`, `GET` and
//! `POST /node-requests`, `POST /nodes/{id}/hold`. `flotilla pool ls`,
//! `flotilla node request ls|create` and `flotilla node hold` call these.

use std::collections::BTreeMap;

use actix_web::{HttpResponse, web};
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use utoipa::{IntoParams, ToSchema};

use super::AppState;
use super::error::ApiError;
use crate::actors::pools::{NewRequest, PoolHealth, waiting_for};
use crate::error::Error;
use crate::ids::NodeId;
use crate::storage::pool_records::{Lifecycle, NodeRequestRecord, PoolNodeRecord};

/// One pool.
#[derive(Debug, Serialize, ToSchema)]
pub struct PoolDto {
    pub name: String,
    pub driver: String,
    /// The labels its nodes get.
    pub labels: BTreeMap<String, String>,
    pub priority: u8,
    pub max_nodes: u32,
    /// The most nodes it may hold: `max_nodes`, or fewer when `max_cpu` or
    /// `max_memory` (each node counted at `node_cpu`, `node_memory`) say so.
    pub capacity: u32,
    pub max_cpu: Option<f64>,
    pub max_memory: Option<u64>,
    pub node_cpu: Option<f64>,
    pub node_memory: Option<u64>,
    pub min_ready: u32,
    pub launch_retries: u32,
    pub max_disrupting: u32,
    /// Its nodes by lifecycle state (`launching`, `enrolling`, `ready`, `deleting`, `failed`).
    pub nodes_by_state: BTreeMap<String, usize>,
    /// Its nodes, each with its state.
    pub nodes: Vec<PoolNodeDto>,
    /// Requests it is serving.
    pub requests_waiting: usize,
    /// `ok`, `paused` (its provider's quota), `no_capacity`, `broken` (its settings) or `unhealthy` (a launch failed past its retries).
    pub health: String,
    #[schema(value_type = Object)]
    pub health_detail: PoolHealth,
    pub last_error: Option<String>,
    /// The tags every resource of the pool carries (`flotilla-master`,
    /// `flotilla-pool`; and `flotilla-node` with its node id): how to
    /// find them in the provider's console.
    pub tags: BTreeMap<String, String>,
}

/// A node a pool launched.
#[derive(Debug, Serialize, ToSchema)]
pub struct PoolNodeDto {
    pub node: String,
    pub pool: String,
    /// `launching`, `enrolling`, `ready`, `draining`, `deleting` or `failed`.
    pub state: String,
    pub external_id: Option<String>,
    pub request: Option<String>,
    pub attempt: u32,
    #[serde(with = "time::serde::rfc3339")]
    pub state_since: OffsetDateTime,
    pub last_error: Option<String>,
    #[serde(with = "time::serde::rfc3339::option")]
    pub held_until: Option<OffsetDateTime>,
    /// Why it is being removed (while `draining` or `deleting`).
    pub removal: Option<String>,
}

impl From<&PoolNodeRecord> for PoolNodeDto {
    fn from(n: &PoolNodeRecord) -> Self {
        PoolNodeDto {
            node: n.node.to_string(),
            pool: n.pool.clone(),
            state: n.state.as_str().into(),
            external_id: n.external_id.clone(),
            request: n.request.clone(),
            attempt: n.attempt,
            state_since: n.state_since,
            last_error: n.last_error.clone(),
            held_until: n.held_until,
            removal: n.removal.clone(),
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct PoolList {
    pub pools: Vec<PoolDto>,
}

/// The node pools
///
/// Each pool with its nodes by lifecycle state, the requests it serves,
/// and its health with its last error.
#[utoipa::path(get, path = "/api/v1/pools", operation_id = "list_pools", tag = "nodes",
    responses((status = 200, description = "Every pool, by priority", body = PoolList)))]
pub async fn list(state: web::Data<AppState>) -> HttpResponse {
    let view = state.pools.view();
    let now = OffsetDateTime::now_utc();
    let pools = state
        .pools
        .pools
        .iter()
        .map(|p| {
            let c = &p.config;
            let nodes: Vec<&PoolNodeRecord> = view.nodes.values().filter(|n| n.pool == c.name).collect();
            let mut by_state = BTreeMap::new();
            for n in &nodes {
                *by_state.entry(n.state.as_str().to_string()).or_insert(0) += 1;
            }
            let health = view.health.get(&c.name).cloned().unwrap_or_default();
            PoolDto {
                name: c.name.clone(),
                driver: c.driver.clone(),
                labels: c.labels.clone(),
                priority: c.priority,
                max_nodes: c.max_nodes,
                capacity: c.capacity().0,
                max_cpu: c.max_cpu,
                max_memory: c.max_memory,
                node_cpu: c.node_cpu,
                node_memory: c.node_memory,
                min_ready: c.min_ready,
                launch_retries: c.launch_retries,
                max_disrupting: c.max_disrupting,
                nodes_by_state: by_state,
                nodes: nodes.into_iter().map(PoolNodeDto::from).collect(),
                requests_waiting: waiting_for(&view.requests, &c.name),
                health: health.summary(now).into(),
                last_error: health.last_error.clone(),
                health_detail: health,
                tags: state.pools.tags(&c.name),
            }
        })
        .collect();
    HttpResponse::Ok().json(PoolList { pools })
}

/// A node request.
#[derive(Debug, Serialize, ToSchema)]
pub struct NodeRequestDto {
    pub id: String,
    pub labels: BTreeMap<String, String>,
    pub count: u32,
    /// Who asked: `api`, `min-ready:<pool>`, an operation id, `replace:<node>`.
    pub requestor: String,
    pub priority: u8,
    /// `requested`, `pending`, `fulfilled` or `failed`.
    pub state: String,
    pub pool: Option<String>,
    pub declined_by: Vec<String>,
    /// Why each pool declined it (`pool: reason`).
    pub reasons: Vec<String>,
    /// Its nodes that are ready.
    pub nodes: Vec<String>,
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339")]
    pub updated_at: OffsetDateTime,
}

impl From<&NodeRequestRecord> for NodeRequestDto {
    fn from(r: &NodeRequestRecord) -> Self {
        NodeRequestDto {
            id: r.id.clone(),
            labels: r.labels.clone(),
            count: r.count,
            requestor: r.requestor.clone(),
            priority: r.priority,
            state: r.state.as_str().into(),
            pool: r.pool.clone(),
            declined_by: r.declined_by.clone(),
            reasons: r.reasons.clone(),
            nodes: r.nodes.iter().map(|n| n.to_string()).collect(),
            created_at: r.created_at,
            updated_at: r.updated_at,
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct NodeRequestPage {
    pub node_requests: Vec<NodeRequestDto>,
    /// Pass as `after` for the next page.
    pub next: Option<String>,
}

#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct RequestsQuery {
    /// At most this many (default 100, at most 1000).
    limit: Option<usize>,
    /// The id of the last request of the previous page.
    after: Option<String>,
}

/// The node requests, newest first
#[utoipa::path(get, path = "/api/v1/node-requests", operation_id = "list_node_requests", tag = "nodes",
    params(RequestsQuery),
    responses(
        (status = 200, description = "A page of requests", body = NodeRequestPage),
        (status = 400, response = super::error::BadRequest)))]
pub async fn list_requests(state: web::Data<AppState>, q: web::Query<RequestsQuery>) -> HttpResponse {
    let limit = q.limit.unwrap_or(100).clamp(1, 1000);
    let view = state.pools.view();
    let older = view.requests.values().rev().filter(|r| q.after.as_ref().is_none_or(|a| r.id < *a));
    let page: Vec<NodeRequestDto> = older.take(limit).map(NodeRequestDto::from).collect();
    let next = (page.len() == limit).then(|| page.last().map(|r| r.id.clone())).flatten();
    HttpResponse::Ok().json(NodeRequestPage { node_requests: page, next })
}

/// `POST /node-requests`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({ "labels": { "class": "big" }, "count": 2 }))]
pub struct NewRequestBody {
    /// The labels every node must carry (`{}`: any pool).
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    pub count: u32,
    /// Lower is served first (default 100).
    #[serde(default)]
    pub priority: Option<u8>,
}

/// Requests nodes
///
/// Files a request for `count` nodes carrying `labels`; answered once it
/// is durable. The pools offering the labels serve it by priority; follow
/// it with `GET /node-requests`. Labels no pool offers: `409 no_pool_offers`.
#[utoipa::path(post, path = "/api/v1/node-requests", operation_id = "create_node_request", tag = "nodes",
    request_body = NewRequestBody,
    responses(
        (status = 201, description = "Filed", body = NodeRequestDto),
        (status = 400, response = super::error::BadRequest),
        (status = 409, response = super::error::Conflict),
        (status = 503, response = super::error::Unavailable)))]
pub async fn create_request(
    state: web::Data<AppState>,
    body: web::Json<NewRequestBody>,
) -> Result<HttpResponse, ApiError> {
    let body = body.into_inner();
    let r = NewRequest {
        labels: body.labels,
        count: body.count,
        requestor: "api".into(),
        priority: body.priority.unwrap_or(100),
    };
    let pools = state.pools.clone();
    let record = tokio::spawn(async move { pools.request(r).await })
        .await
        .map_err(|e| Error::Internal { message: format!("request task: {e}") })??;
    Ok(HttpResponse::Created().json(NodeRequestDto::from(&record)))
}

/// `POST /nodes/{id}/hold`.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({ "for": "2h" }))]
pub struct HoldBody {
    /// Held until this time (RFC 3339).
    #[serde(default, with = "time::serde::rfc3339::option")]
    pub until: Option<OffsetDateTime>,
    /// Held this long from now (`"2h"`); default 24 h.
    #[serde(default, rename = "for")]
    pub for_: Option<String>,
    /// Ends a hold.
    #[serde(default)]
    pub release: bool,
}

/// Holds a provider node
///
/// Keeps a node a pool launched out of every cleanup (a failed launch is
/// kept for debugging instead of deleted; leak cleanup and idle give-back
/// skip it) until the hold expires. `{"release": true}` ends it.
#[utoipa::path(post, path = "/api/v1/nodes/{id}/hold", operation_id = "hold_node", tag = "nodes",
    params(("id" = String, Path, description = "The node's id")),
    request_body = HoldBody,
    responses(
        (status = 200, description = "Held (or released)", body = PoolNodeDto),
        (status = 400, response = super::error::BadRequest),
        (status = 404, response = super::error::NotFound),
        (status = 503, response = super::error::Unavailable)))]
pub async fn hold(
    state: web::Data<AppState>,
    id: web::Path<String>,
    body: web::Json<HoldBody>,
) -> Result<HttpResponse, ApiError> {
    let node = NodeId::new(id.into_inner());
    let b = body.into_inner();
    let now = OffsetDateTime::now_utc();
    let until = match (b.release, b.until, b.for_) {
        (true, None, None) => None,
        (true, _, _) => return Err(Error::invalid("invalid_request", "release takes neither until nor for").into()),
        (false, Some(_), Some(_)) => {
            return Err(Error::invalid("invalid_request", "give until or for, not both").into());
        }
        (false, Some(t), None) if t <= now => {
            return Err(Error::invalid("invalid_request", "until is in the past").into());
        }
        (false, Some(t), None) => Some(t),
        (false, None, f) => {
            let d = match f {
                Some(s) => humantime::parse_duration(&s).map_err(|e| {
                    Error::invalid("invalid_request", format!("for: {s:?} is not a duration like \"2h\": {e}"))
                })?,
                None => std::time::Duration::from_secs(24 * 3600),
            };
            if d > std::time::Duration::from_secs(365 * 24 * 3600) {
                return Err(Error::invalid("invalid_request", "for: at most a year").into());
            }
            Some(now + d)
        }
    };
    let pools = state.pools.clone();
    let record = tokio::spawn(async move { pools.hold(&node, until).await })
        .await
        .map_err(|e| Error::Internal { message: format!("hold task: {e}") })??;
    Ok(HttpResponse::Ok().json(PoolNodeDto::from(&record)))
}

/// Removes a provider node
///
/// Journals its removal: the node is cordoned and `draining`, its members
/// are moved off one at a time (each by its cluster's replace; one that
/// cannot move puts the node back, with the reason), then it is deleted
/// through its driver, its certificate revoked and the node forgotten (a
/// master restart in the middle finishes it). Refused while it is still
/// launching (`409 node_busy`) and beyond the pool's `max_disrupting`
/// (`409 disruption_budget`). A held failed launch is deleted at once.
#[utoipa::path(post, path = "/api/v1/nodes/{id}/remove", operation_id = "remove_node", tag = "nodes",
    params(("id" = String, Path, description = "The node's id")),
    responses(
        (status = 202, description = "Its removal is journaled", body = PoolNodeDto),
        (status = 404, response = super::error::NotFound),
        (status = 409, response = super::error::Conflict),
        (status = 503, response = super::error::Unavailable)))]
pub async fn remove(state: web::Data<AppState>, id: web::Path<String>) -> Result<HttpResponse, ApiError> {
    let node = NodeId::new(id.into_inner());
    let pools = state.pools.clone();
    let record = tokio::spawn(async move { pools.remove(&node).await })
        .await
        .map_err(|e| Error::Internal { message: format!("remove task: {e}") })??;
    tracing::warn!(node = %record.node, pool = %record.pool, "node removal journaled");
    Ok(HttpResponse::Accepted().json(PoolNodeDto::from(&record)))
}

#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct HostLogQuery {
    /// Bytes from its end (default 65536, at most 1048576).
    bytes: Option<u64>,
}

/// One host's log of a static pool
///
/// What the static driver did on the host (`address:port`): each ssh and
/// scp command and its output, never a token; the last `bytes`, from a
/// line's start (`text/plain`). `409 no_host_log` for a pool whose driver
/// keeps none.
#[utoipa::path(get, path = "/api/v1/pools/{name}/hosts/{host}/log", operation_id = "pool_host_log", tag = "nodes",
    params(("name" = String, Path, description = "The pool"), ("host" = String, Path, description = "`address:port`", example = "10.1.2.3:22"), HostLogQuery),
    responses(
        (status = 200, description = "The end of the host's log", body = String, content_type = "text/plain"),
        (status = 400, response = super::error::BadRequest),
        (status = 404, response = super::error::NotFound),
        (status = 409, response = super::error::Conflict)))]
pub async fn host_log(
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
    q: web::Query<HostLogQuery>,
) -> Result<HttpResponse, ApiError> {
    let (name, host) = path.into_inner();
    let pool = state.pools.pool(&name).ok_or_else(|| Error::not_found("pool", &name))?;
    let driver = pool.driver.clone();
    let max = q.bytes.unwrap_or(64 << 10).min(1 << 20);
    let shown = host.clone();
    let read = web::block(move || driver.host_log(&host, max))
        .await
        .map_err(|e| Error::unavailable(format!("reading the log: {e}")))?;
    match read {
        None => Err(ApiError(Error::conflict(
            "no_host_log",
            format!("pool {name} is a {} pool: only static pools keep a log per host", pool.config.driver),
        ))),
        Some(Err(e)) if e.class == crate::providers::ErrorClass::Config => {
            Err(ApiError(Error::NotFound { kind: "host", id: format!("{shown} ({})", e.message) }))
        }
        Some(Err(e)) => Err(ApiError(Error::unavailable(e.message))),
        Some(Ok(text)) => Ok(HttpResponse::Ok().content_type("text/plain; charset=utf-8").body(text)),
    }
}

/// Where a node came from (`GET /nodes`).
#[derive(Debug, Serialize, ToSchema)]
pub struct OriginDto {
    /// `manual` (an agent started by hand) or `provider` (launched by a pool).
    pub kind: String,
    pub pool: Option<String>,
    pub external_id: Option<String>,
    pub request: Option<String>,
}

/// A node's origin and lifecycle state (`ready`, `cordoned`, or a
/// provider node's `launching` ... `deleting`, `failed`).
pub fn origin_of(state: &AppState, node: &NodeId) -> (OriginDto, String) {
    let cordoned = state.shared.read_model.cordon_of(node).is_some();
    match state.pools.node(node) {
        Some(n) => {
            let lifecycle = match n.state {
                Lifecycle::Ready if cordoned => "cordoned",
                s => s.as_str(),
            };
            let origin = OriginDto {
                kind: "provider".into(),
                pool: Some(n.pool.clone()),
                external_id: n.external_id.clone(),
                request: n.request.clone(),
            };
            (origin, lifecycle.into())
        }
        None => (
            OriginDto { kind: "manual".into(), pool: None, external_id: None, request: None },
            if cordoned { "cordoned" } else { "ready" }.into(),
        ),
    }
}
