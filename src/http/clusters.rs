//! Cluster and instance endpoints. Every mutation goes to the cluster's
//! actor (through the supervisor for create) and answers 202 with the
//! operation once it is journaled; with `?dry_run=true`, 200 with what it
//! would do and nothing changed (`actors/cluster/preview.rs`).

use actix_web::{HttpResponse, web};
use serde::Deserialize;
use utoipa::IntoParams;

use super::AppState;
use super::ask::{ask, taken_within};
use super::cluster_run::{accepted, run};
use super::dto::{
    ClusterDto, ClusterPage, ClusterSummaryDto, ConfigBody, CreateClusterBody, OperationEnvelope, ResizeBody,
    ScaleBody, UpgradeBody,
};
use super::error::ApiError;
use crate::actors::cluster::{OpRequest, PlanPreview, PreviewCreate};
use crate::actors::supervisor::{Create, CreateCluster, RoleRequest};
use crate::error::Error;
use crate::ids::{InstanceId, NodeId};
use crate::operations::lifecycle::InstanceVerb;
use crate::storage::records::{Limits, PackageRef};

/// `?dry_run=true` on a mutating route.
#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct DryRun {
    /// Check and plan, change nothing: `200` with what it would do.
    #[serde(default)]
    pub dry_run: bool,
}

/// What a cluster or instance mutation answers (for the API description).
#[derive(utoipa::IntoResponses)]
#[allow(dead_code)] // Describes the answers of `run`; never built.
pub enum Mutation {
    /// Accepted: the operation, journaled; `GET /operations/{id}?wait=S` follows it
    #[response(status = 202)]
    Accepted(OperationEnvelope),
    /// `?dry_run=true`: what it would do; nothing was changed
    #[response(status = 200)]
    Preview(PlanPreview),
    #[response(status = 400)]
    BadRequest(#[ref_response] super::error::BadRequest),
    #[response(status = 404)]
    NotFound(#[ref_response] super::error::NotFound),
    #[response(status = 409)]
    Conflict(#[ref_response] super::error::Conflict),
    #[response(status = 422)]
    SpecViolation(#[ref_response] super::error::SpecViolation),
    #[response(status = 500)]
    Internal(#[ref_response] super::error::Internal),
    #[response(status = 503)]
    Unavailable(#[ref_response] super::error::Unavailable),
}

/// Creates a cluster
///
/// `202` with the operation once it is journaled (`GET /operations/{id}?wait=S`
/// follows it); with `?dry_run=true`, `200` with the plan and the placement.
#[utoipa::path(post, path = "/api/v1/clusters", operation_id = "create_cluster", tag = "clusters", params(DryRun),
    responses(Mutation, (status = 413, response = super::error::TooLarge)))]
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
            let nodes = v.nodes.map(|n| n.into_iter().map(NodeId::new).collect());
            (k, RoleRequest { count: v.count, nodes, node_labels: v.node_labels })
        })
        .collect();
    let req = CreateCluster {
        name: b.name,
        package: PackageRef { name: b.package.name, version: b.package.version },
        roles,
        config: b.config,
    };
    let slot = state.reserve_supervisor()?;
    let limit = state.shared.limits.request_take_limit;
    if q.dry_run {
        let preview = ask(&state.supervisor, slot, limit, |slot| PreviewCreate(req, slot)).await??;
        return Ok(HttpResponse::Ok().json(preview));
    }
    // The new cluster's actor takes the create within the limit too.
    let (answer, claim) = ask(&state.supervisor, slot, limit, |slot| Create(req, slot)).await??.into_parts();
    let op = taken_within(answer, &claim, limit).await??;
    Ok(accepted(&op))
}

#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct PageQuery {
    /// At most this many (default 100, at most 1000).
    limit: Option<usize>,
    /// The last name of the previous page.
    after: Option<String>,
}

/// The clusters
///
/// Summaries (status, counts per role and status, the running operation),
/// by name, a page at a time; `next` is the cursor of the next page. The
/// instances are in `GET /clusters/{name}`.
#[utoipa::path(get, path = "/api/v1/clusters", operation_id = "list_clusters", tag = "clusters", params(PageQuery), responses(
    (status = 200, description = "A page of clusters", body = ClusterPage),
    (status = 400, response = super::error::BadRequest)))]
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
    HttpResponse::Ok().json(ClusterPage { clusters: page, total: clusters.len(), next })
}

#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct GetQuery {
    /// `false`: leave the instance list out (the counts by status stay);
    /// page it with `GET /clusters/{name}/instances`.
    instances: Option<bool>,
}

/// One cluster, with its instances
#[utoipa::path(get, path = "/api/v1/clusters/{name}", operation_id = "get_cluster", tag = "clusters",
    params(("name" = String, Path, description = "The cluster's name", example = "demo"), GetQuery), responses(
    (status = 200, description = "The cluster", body = ClusterDto),
    (status = 400, response = super::error::BadRequest),
    (status = 404, response = super::error::NotFound)))]
pub async fn get(
    state: web::Data<AppState>,
    path: web::Path<String>,
    q: web::Query<GetQuery>,
) -> Result<HttpResponse, ApiError> {
    let name = path.into_inner();
    let c = state.shared.read_model.cluster(&name).ok_or_else(|| Error::not_found("cluster", &name))?;
    Ok(HttpResponse::Ok().json(ClusterDto::build(&c, q.instances.unwrap_or(true))))
}

/// Starts every instance of a cluster
#[utoipa::path(post, path = "/api/v1/clusters/{name}/start", operation_id = "start_cluster", tag = "clusters", params(("name" = String, Path, description = "The cluster's name", example = "demo"), DryRun), responses(Mutation))]
pub async fn start(
    state: web::Data<AppState>,
    path: web::Path<String>,
    q: web::Query<DryRun>,
) -> Result<HttpResponse, ApiError> {
    run(&state, &path.into_inner(), OpRequest::Start, q.dry_run).await
}

/// Stops every instance of a cluster
#[utoipa::path(post, path = "/api/v1/clusters/{name}/stop", operation_id = "stop_cluster", tag = "clusters", params(("name" = String, Path, description = "The cluster's name", example = "demo"), DryRun), responses(Mutation))]
pub async fn stop(
    state: web::Data<AppState>,
    path: web::Path<String>,
    q: web::Query<DryRun>,
) -> Result<HttpResponse, ApiError> {
    run(&state, &path.into_inner(), OpRequest::Stop, q.dry_run).await
}

/// Restarts a cluster: stops it (roles in reverse order), then starts it (roles in order)
#[utoipa::path(post, path = "/api/v1/clusters/{name}/restart", operation_id = "restart_cluster", tag = "clusters", params(("name" = String, Path, description = "The cluster's name", example = "demo"), DryRun), responses(Mutation))]
pub async fn restart(
    state: web::Data<AppState>,
    path: web::Path<String>,
    q: web::Query<DryRun>,
) -> Result<HttpResponse, ApiError> {
    run(&state, &path.into_inner(), OpRequest::Restart, q.dry_run).await
}

#[derive(Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct DeleteQuery {
    /// Delete even when stopping or removing an instance fails.
    #[serde(default)]
    force: bool,
    /// Check and plan, change nothing: `200` with what it would do.
    #[serde(default)]
    dry_run: bool,
}

/// Deletes a cluster: stops and removes every instance
#[utoipa::path(delete, path = "/api/v1/clusters/{name}", operation_id = "delete_cluster", tag = "clusters",
    params(("name" = String, Path, description = "The cluster's name", example = "demo"), DeleteQuery), responses(Mutation))]
pub async fn delete(
    state: web::Data<AppState>,
    path: web::Path<String>,
    q: web::Query<DeleteQuery>,
) -> Result<HttpResponse, ApiError> {
    run(&state, &path.into_inner(), OpRequest::Delete { force: q.force }, q.dry_run).await
}

/// Changes a cluster's config
///
/// Instances whose files change reload, are signalled or restart, `batch`
/// at a time, as the role's change modes say.
#[utoipa::path(patch, path = "/api/v1/clusters/{name}/config", operation_id = "configure_cluster", tag = "clusters", params(("name" = String, Path, description = "The cluster's name", example = "demo"), DryRun),
    responses(Mutation, (status = 413, response = super::error::TooLarge)))]
pub async fn reconfigure(
    state: web::Data<AppState>,
    path: web::Path<String>,
    body: web::Json<ConfigBody>,
    q: web::Query<DryRun>,
) -> Result<HttpResponse, ApiError> {
    let b = body.into_inner();
    run(&state, &path.into_inner(), OpRequest::Reconfigure { values: b.config, batch: b.batch }, q.dry_run).await
}

/// Upgrades a cluster to another version of its package, `batch` at a time
#[utoipa::path(post, path = "/api/v1/clusters/{name}/upgrade", operation_id = "upgrade_cluster", tag = "clusters", params(("name" = String, Path, description = "The cluster's name", example = "demo"), DryRun),
    responses(Mutation, (status = 413, response = super::error::TooLarge)))]
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

/// Gives a role new resource limits (vertical scale), `batch` at a time
#[utoipa::path(patch, path = "/api/v1/clusters/{name}/roles/{role}", operation_id = "resize_role", tag = "clusters",
    params(("name" = String, Path, description = "The cluster's name", example = "demo"), ("role" = String, Path, description = "The role", example = "server"), DryRun),
    responses(Mutation, (status = 413, response = super::error::TooLarge)))]
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

/// Adds instances to a role (`add`), or removes given ones (`remove`)
#[utoipa::path(post, path = "/api/v1/clusters/{name}/scale", operation_id = "scale_cluster", tag = "clusters", params(("name" = String, Path, description = "The cluster's name", example = "demo"), DryRun),
    responses(Mutation, (status = 413, response = super::error::TooLarge)))]
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

async fn instance_verb(
    state: &AppState,
    path: web::Path<(String, String)>,
    q: web::Query<DryRun>,
    verb: InstanceVerb,
) -> Result<HttpResponse, ApiError> {
    let (name, id) = path.into_inner();
    run(state, &name, OpRequest::Instance { id: InstanceId::new(id), verb }, q.dry_run).await
}

/// Starts one instance
#[utoipa::path(post, path = "/api/v1/clusters/{name}/instances/{id}/start", operation_id = "start_instance", tag = "instances",
    params(("name" = String, Path, description = "The cluster's name", example = "demo"), ("id" = String, Path, description = "The instance's id"), DryRun), responses(Mutation))]
pub async fn start_instance(
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
    q: web::Query<DryRun>,
) -> Result<HttpResponse, ApiError> {
    instance_verb(&state, path, q, InstanceVerb::Start).await
}

/// Stops one instance
#[utoipa::path(post, path = "/api/v1/clusters/{name}/instances/{id}/stop", operation_id = "stop_instance", tag = "instances",
    params(("name" = String, Path, description = "The cluster's name", example = "demo"), ("id" = String, Path, description = "The instance's id"), DryRun), responses(Mutation))]
pub async fn stop_instance(
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
    q: web::Query<DryRun>,
) -> Result<HttpResponse, ApiError> {
    instance_verb(&state, path, q, InstanceVerb::Stop).await
}

/// Restarts one instance
#[utoipa::path(post, path = "/api/v1/clusters/{name}/instances/{id}/restart", operation_id = "restart_instance", tag = "instances",
    params(("name" = String, Path, description = "The cluster's name", example = "demo"), ("id" = String, Path, description = "The instance's id"), DryRun), responses(Mutation))]
pub async fn restart_instance(
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
    q: web::Query<DryRun>,
) -> Result<HttpResponse, ApiError> {
    instance_verb(&state, path, q, InstanceVerb::Restart).await
}

/// Moves one instance to another node: a replacement is added (scale-out),
/// then the instance removed (scale-in), in one operation. `409
/// unsafe_replace` for a quorum role while another member is not running;
/// `409 no_matching_nodes` when no other node may take it.
#[utoipa::path(post, path = "/api/v1/clusters/{name}/instances/{id}/replace", operation_id = "replace_instance", tag = "instances",
    params(("name" = String, Path, description = "The cluster's name", example = "demo"), ("id" = String, Path, description = "The instance's id"), DryRun), responses(Mutation))]
pub async fn replace_instance(
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
    q: web::Query<DryRun>,
) -> Result<HttpResponse, ApiError> {
    let (name, id) = path.into_inner();
    run(&state, &name, OpRequest::Replace { id: InstanceId::new(id) }, q.dry_run).await
}
