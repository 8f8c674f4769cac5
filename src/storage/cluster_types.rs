//! The small types a cluster's record and an operation's plan share (the
//! package it runs, its status, a role's limits): below both, so
//! `records` and `plan` need not import each other for them.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PackageRef {
    pub name: String,
    pub version: String,
}

impl std::fmt::Display for PackageRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.name, self.version)
    }
}

/// Cluster statuses: the seeds' Sahara vocabulary (DESIGN.md §7).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub enum ClusterStatus {
    Validating,
    Installing,
    Configuring,
    Starting,
    Active,
    Scaling,
    AddingInstances,
    Decommissioning,
    DeletingInstances,
    Stopping,
    Stopped,
    Restarting,
    Upgrading,
    Reconfiguring,
    Deleting,
    Error,
}

/// Every cluster status (for metrics that must show each, even at 0).
pub const CLUSTER_STATUSES: [ClusterStatus; 16] = [
    ClusterStatus::Validating,
    ClusterStatus::Installing,
    ClusterStatus::Configuring,
    ClusterStatus::Starting,
    ClusterStatus::Active,
    ClusterStatus::Scaling,
    ClusterStatus::AddingInstances,
    ClusterStatus::Decommissioning,
    ClusterStatus::DeletingInstances,
    ClusterStatus::Stopping,
    ClusterStatus::Stopped,
    ClusterStatus::Restarting,
    ClusterStatus::Upgrading,
    ClusterStatus::Reconfiguring,
    ClusterStatus::Deleting,
    ClusterStatus::Error,
];

/// Resource limits of a role's instances (enforced through their cgroups).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Limits {
    pub memory_bytes: Option<u64>,
    pub cpu: Option<f64>,
}
