//! `GET /clusters/{name}/instances`: one cluster's instances a page at a
//! time, by role and ordinal, optionally of one role or status. What the
//! dashboard reads for a cluster of 10,000 members; `GET /clusters/{name}`
//! still answers every instance at once.

use actix_web::{HttpResponse, web};
use serde::{Deserialize, Serialize};

use super::AppState;
use super::dto::{INSTANCE_STATUSES, InstanceDto};
use super::error::ApiError;
use crate::error::Error;

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct InstancesQuery {
    /// At most this many (default 100, at most 1000).
    limit: Option<usize>,
    /// The cursor of the previous page's `next` (`ROLE/ORDINAL`).
    after: Option<String>,
    /// Only this role's instances.
    role: Option<String>,
    /// Only instances in this status (`Running`, `Failed`, ...).
    #[param(value_type = Option<crate::storage::records::InstanceStatus>)]
    status: Option<String>,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct InstancePage {
    pub instances: Vec<InstanceDto>,
    /// How many match the filters, over all pages.
    pub total: usize,
    /// The cursor of the next page (`?after=`), if there is one.
    pub next: Option<String>,
}

#[utoipa::path(get, path = "/api/v1/clusters/{name}/instances", operation_id = "list_instances", tag = "instances",
    params(("name" = String, Path, description = "The cluster's name", example = "demo"), InstancesQuery),
    responses(
        (status = 200, description = "A page of the cluster's instances, by role and ordinal", body = InstancePage),
        (status = 400, response = super::error::BadRequest),
        (status = 404, response = super::error::NotFound)))]
pub async fn list(
    state: web::Data<AppState>,
    path: web::Path<String>,
    q: web::Query<InstancesQuery>,
) -> Result<HttpResponse, ApiError> {
    let name = path.into_inner();
    let cell = state.shared.read_model.cluster(&name).ok_or_else(|| Error::not_found("cluster", &name))?;
    let limit = q.limit.unwrap_or(100).clamp(1, 1000);
    let status = match &q.status {
        Some(s) => Some(INSTANCE_STATUSES.into_iter().find(|x| format!("{x:?}") == *s).ok_or_else(|| {
            Error::invalid("invalid_status", format!("{s:?} is not an instance status; one of {INSTANCE_STATUSES:?}"))
        })?),
        None => None,
    };
    // The cursor is the last (role, ordinal) shown, not an instance id, so
    // paging goes on when that member was removed in between.
    let from = match &q.after {
        Some(raw) => Some(
            raw.rsplit_once('/')
                .and_then(|(role, n)| Some((role.to_string(), n.parse::<u32>().ok()?)))
                .ok_or_else(|| Error::invalid("invalid_cursor", format!("{raw:?} is not ROLE/ORDINAL")))?,
        ),
        None => None,
    };
    let matching: Vec<_> = cell
        .sorted_instances()
        .into_iter()
        .filter(|e| q.role.as_ref().is_none_or(|r| **r == *e.record.role))
        .filter(|e| status.is_none_or(|s| s == e.record.status))
        .collect();
    let start = match &from {
        Some((role, ordinal)) => {
            matching.partition_point(|e| (&*e.record.role, e.record.ordinal) <= (role.as_str(), *ordinal))
        }
        None => 0,
    };
    let instances: Vec<InstanceDto> =
        matching[start..].iter().take(limit).map(|e| InstanceDto::from(&*e.record)).collect();
    let next = (start + instances.len() < matching.len())
        .then(|| instances.last().map(|i| format!("{}/{}", i.role, i.ordinal)))
        .flatten();
    Ok(HttpResponse::Ok().json(InstancePage { instances, total: matching.len(), next }))
}
