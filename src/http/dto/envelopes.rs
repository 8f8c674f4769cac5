//! The answers that wrap resources: a page of a list with its cursor, or
//! one resource under its name (`{"operation": ...}`), so an answer can
//! grow fields without breaking its readers.

use serde::Serialize;
use utoipa::ToSchema;

use super::{ClusterSummaryDto, NodeDto, OperationDto, PackageDto};

/// `GET /clusters`.
#[derive(Debug, Serialize, ToSchema)]
pub struct ClusterPage {
    /// By name.
    pub clusters: Vec<ClusterSummaryDto>,
    /// How many clusters there are, over all pages.
    pub total: usize,
    /// The cursor of the next page (`?after=`), if there may be one.
    pub next: Option<String>,
}

/// `GET /nodes`.
#[derive(Debug, Serialize, ToSchema)]
pub struct NodePage {
    /// By id.
    pub nodes: Vec<NodeDto>,
    /// How many nodes there are, over all pages.
    pub total: usize,
    /// The cursor of the next page (`?after=`), if there may be one.
    pub next: Option<String>,
}

/// `GET /operations`.
#[derive(Debug, Serialize, ToSchema)]
pub struct OperationPage {
    /// Newest first, without per-instance results.
    pub operations: Vec<OperationDto>,
    /// The cursor of the next page (`?after=`), if there may be one.
    pub next: Option<String>,
}

/// One operation: `GET /operations/{id}`, and the `202 Accepted` answer of
/// every mutation (the operation just journaled).
#[derive(Debug, Serialize, ToSchema)]
pub struct OperationEnvelope {
    pub operation: OperationDto,
}

/// `GET /packages`.
#[derive(Debug, Serialize, ToSchema)]
pub struct PackageList {
    /// By name, then version.
    pub packages: Vec<PackageDto>,
}

/// `PUT /packages/{name}/{version}`: the package stored (or found unchanged).
#[derive(Debug, Serialize, ToSchema)]
pub struct PackageEnvelope {
    pub package: PackageDto,
}

/// `GET /packages/{name}/{version}`.
#[derive(Debug, Serialize, ToSchema)]
pub struct PackageDetail {
    pub package: PackageDto,
    /// Its `component.toml`, as uploaded.
    pub spec: String,
}
