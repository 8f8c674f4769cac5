//! `?dry_run=true` answers of the package routes. A cluster mutation's
//! preview is the plan the cluster actor prepared
//! ([`crate::actors::cluster::PlanPreview`]).

use serde::Serialize;
use utoipa::ToSchema;

/// A package as an upload would store it.
#[derive(Debug, Serialize, ToSchema)]
pub struct PackageCheckDto {
    pub name: String,
    pub version: String,
    pub sha256: String,
    pub size: u64,
    pub roles: Vec<String>,
}

/// `PUT` or `DELETE /packages/{name}/{version}?dry_run=true`: every check
/// passed, nothing kept or removed.
#[derive(Debug, Serialize, ToSchema)]
pub struct PackagePreview {
    /// Always true: nothing was done.
    pub dry_run: bool,
    pub valid: bool,
    /// `create`, `nothing (unchanged)` or `delete NAME/VERSION`.
    pub would: String,
    /// What an upload would store (`would` = `create` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub package: Option<PackageCheckDto>,
}

/// The `200` of `PUT /packages/{name}/{version}`: the same bytes were there
/// already, or (`?dry_run=true`) what the upload would do.
#[derive(Debug, Serialize, ToSchema)]
#[serde(untagged)]
pub enum PackageUploadAnswer {
    Unchanged(super::PackageEnvelope),
    DryRun(PackagePreview),
}
