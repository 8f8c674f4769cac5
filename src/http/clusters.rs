//! Cluster and instance endpoints. Every mutation goes to the cluster's
//! actor (through the supervisor for create) and answers 202 with the
//! operation once it is journaled; with `?dry_run=true`, 200 with what it
//! would do and nothing changed (`actors/cluster/preview.rs`).

use actix_web::{HttpResponse, web};
use serde::Deserialize;
use serde_json::json;

use super::AppState;
use super::dto::{
    ClusterDto, ClusterSummaryDto, ConfigBody, CreateClusterBody, OperationDto, ResizeBody, ScaleBody, UpgradeBody,
};
use super::error::ApiError;
use crate::actors::cluster::{OpRequest, Preview, PreviewCreate, RunOperation};
use crate::actors::read_model::Reservation;
use crate::actors::registry::ClusterHandle;
use crate::actors::supervisor::{Create, CreateCluster, RoleRequest};
use crate::error::Error;
use crate::ids::{InstanceId, NodeId};
use crate::operations::lifecycle::InstanceVerb;
use crate::storage::records::{Limits, OperationRecord, PackageRef};

fn accepted(op: &OperationRecord) -> HttpResponse {
    HttpResponse::Accepted().json(json!({ "operation": OperationDto::from(op) }))
}

fn mailbox(e: actix::MailboxError) -> ApiError {
    ApiError(Error::unavailable(format!("actor unavailable: {e}")))
}

/// The cluster's actor, with a place reserved in its mailbox.
fn cluster_actor(state: &AppState, name: &str) -> Result<(ClusterHandle, Reservation), ApiError> {
    let handle = state.shared.registry.get(name).ok_or_else(|| ApiError(Error::not_found("cluster", name)))?;
    let slot = handle.reserve(state.shared.limits.cluster_mailbox)?;
    Ok((handle, slot))
}

/// `?dry_run=true` on a mutating route.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DryRun {
    #[serde(default)]
    pub dry_run: bool,
}

async fn run(state: &AppState, name: &str, req: OpRequest, dry_run: bool) -> Result<HttpResponse, ApiError> {
    let (handle, slot) = cluster_actor(state, name)?;
    if dry_run {
        let preview = handle.addr.send(Preview(req, slot)).await.map_err(mailbox)??;
        return Ok(HttpResponse::Ok().json(preview));
    }
    let op = handle.addr.send(RunOperation(req, slot)).await.map_err(mailbox)??;
    Ok(accepted(&op))
}

pub async fn create(
    state: web::Data<AppState>,
    body: web::Json<CreateClusterBody>,
    q: web::Query<DryRun>,
) -> Result<HttpResponse, ApiError> {
    let b = body.into_inner();
    let roles = b
        .roles
        .into_iter()
        .map(|(k, v)| {
            (k, RoleRequest { count: v.count, nodes: v.nodes.map(|n| n.into_iter().map(NodeId::new).collect()) })
        })
        .collect();
    let req = CreateCluster {
        name: b.name,
        package: PackageRef { name: b.package.name, version: b.package.version },
        roles,
        config: b.config,
    };
    let slot = state.reserve_supervisor()?;
    if q.dry_run {
        let preview = state.supervisor.send(PreviewCreate(req, slot)).await.map_err(mailbox)??;
        return Ok(HttpResponse::Ok().json(preview));
    }
    let op = state.supervisor.send(Create(req, slot)).await.map_err(mailbox)??;
    Ok(accepted(&op))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PageQuery {
    /// At most this many (default 100, at most 1000).
    limit: Option<usize>,
    /// The last name of the previous page.
    after: Option<String>,
}

/// `GET /clusters`: summaries (status, counts per role and status, the
/// running operation), by name, a page at a time; `next` is the cursor of
/// the next page. The instances are in `GET /clusters/{name}`.
pub async fn list(state: web::Data<AppState>, q: web::Query<PageQuery>) -> HttpResponse {
    let limit = q.limit.unwrap_or(100).clamp(1, 1000);
    let clusters = state.shared.read_model.clusters();
    let page: Vec<ClusterSummaryDto> = match &q.after {
        Some(after) => clusters
            .range::<_, String>((std::ops::Bound::Excluded(after.clone()), std::ops::Bound::Unbounded))
            .take(limit)
            .map(|(_, c)| ClusterSummaryDto::build(&c.load()))
            .collect(),
        None => clusters.values().take(limit).map(|c| ClusterSummaryDto::build(&c.load())).collect(),
    };
    let next = (page.len() == limit).then(|| page.last().map(|c| c.name.clone())).flatten();
    HttpResponse::Ok().json(json!({ "clusters": page, "total": clusters.len(), "next": next }))
}

pub async fn get(state: web::Data<AppState>, path: web::Path<String>) -> Result<HttpResponse, ApiError> {
    let name = path.into_inner();
    let c = state.shared.read_model.cluster(&name).ok_or_else(|| Error::not_found("cluster", &name))?;
    Ok(HttpResponse::Ok().json(ClusterDto::build(&c)))
}

pub async fn start(
    state: web::Data<AppState>,
    path: web::Path<String>,
    q: web::Query<DryRun>,
) -> Result<HttpResponse, ApiError> {
    run(&state, &path.into_inner(), OpRequest::Start, q.dry_run).await
}

pub async fn stop(
    state: web::Data<AppState>,
    path: web::Path<String>,
    q: web::Query<DryRun>,
) -> Result<HttpResponse, ApiError> {
    run(&state, &path.into_inner(), OpRequest::Stop, q.dry_run).await
}

pub async fn restart(
    state: web::Data<AppState>,
    path: web::Path<String>,
    q: web::Query<DryRun>,
) -> Result<HttpResponse, ApiError> {
    run(&state, &path.into_inner(), OpRequest::Restart, q.dry_run).await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeleteQuery {
    #[serde(default)]
    force: bool,
    #[serde(default)]
    dry_run: bool,
}

pub async fn delete(
    state: web::Data<AppState>,
    path: web::Path<String>,
    q: web::Query<DeleteQuery>,
) -> Result<HttpResponse, ApiError> {
    run(&state, &path.into_inner(), OpRequest::Delete { force: q.force }, q.dry_run).await
}

pub async fn reconfigure(
    state: web::Data<AppState>,
    path: web::Path<String>,
    body: web::Json<ConfigBody>,
    q: web::Query<DryRun>,
) -> Result<HttpResponse, ApiError> {
    let b = body.into_inner();
    run(&state, &path.into_inner(), OpRequest::Reconfigure { values: b.config, batch: b.batch }, q.dry_run).await
}

pub async fn upgrade(
    state: web::Data<AppState>,
    path: web::Path<String>,
    body: web::Json<UpgradeBody>,
    q: web::Query<DryRun>,
) -> Result<HttpResponse, ApiError> {
    let b = body.into_inner();
    crate::ids::validate_version(&b.version).map_err(|m| Error::invalid("invalid_request", format!("version: {m}")))?;
    run(&state, &path.into_inner(), OpRequest::Upgrade { version: b.version, batch: b.batch }, q.dry_run).await
}

pub async fn resize(
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
    body: web::Json<ResizeBody>,
    q: web::Query<DryRun>,
) -> Result<HttpResponse, ApiError> {
    let (name, role) = path.into_inner();
    let b = body.into_inner();
    let memory_bytes = match b.resources.memory {
        None => None,
        Some(serde_json::Value::String(s)) => Some(
            crate::spec::checks::parse_memory(&s)
                .map_err(|m| Error::invalid("invalid_request", format!("resources.memory: {m}")))?,
        ),
        Some(serde_json::Value::Number(n)) => Some(n.as_u64().ok_or_else(|| {
            Error::invalid("invalid_request", "resources.memory: a whole number of bytes or a string like \"512M\"")
        })?),
        Some(_) => {
            return Err(ApiError(Error::invalid(
                "invalid_request",
                "resources.memory: a whole number of bytes or a string like \"512M\"",
            )));
        }
    };
    let limits = Limits { memory_bytes, cpu: b.resources.cpu };
    run(&state, &name, OpRequest::Resize { role, limits, batch: b.batch }, q.dry_run).await
}

pub async fn scale(
    state: web::Data<AppState>,
    path: web::Path<String>,
    body: web::Json<ScaleBody>,
    q: web::Query<DryRun>,
) -> Result<HttpResponse, ApiError> {
    let b = body.into_inner();
    let req = match (b.add, b.remove) {
        (Some(add), None) => {
            OpRequest::ScaleOut { role: b.role, add, nodes: b.nodes.map(|n| n.into_iter().map(NodeId::new).collect()) }
        }
        (None, Some(remove)) => {
            if b.nodes.is_some() {
                return Err(ApiError(Error::invalid("invalid_request", "nodes: only with add")));
            }
            if remove.is_empty() {
                return Err(ApiError(Error::invalid("invalid_request", "remove: list at least one instance id")));
            }
            OpRequest::ScaleIn { role: b.role, remove: remove.into_iter().map(InstanceId::new).collect() }
        }
        _ => {
            return Err(ApiError(Error::invalid(
                "invalid_request",
                "give exactly one of add (a number) or remove (instance ids)",
            )));
        }
    };
    run(&state, &path.into_inner(), req, q.dry_run).await
}

pub async fn instance_verb(
    state: web::Data<AppState>,
    path: web::Path<(String, String, String)>,
    q: web::Query<DryRun>,
) -> Result<HttpResponse, ApiError> {
    let (name, id, verb) = path.into_inner();
    let verb = match verb.as_str() {
        "start" => InstanceVerb::Start,
        "stop" => InstanceVerb::Stop,
        "restart" => InstanceVerb::Restart,
        other => return Err(ApiError(Error::not_found("instance action", other))),
    };
    run(&state, &name, OpRequest::Instance { id: InstanceId::new(id), verb }, q.dry_run).await
}
