//! The driver interface: what a provider of machines does, and nothing
//! more (shaped like Nodepool's state-machine adapter and Karpenter's cloud
//! provider). A driver holds no policy: retries, timeouts, quota, leak
//! cleanup and disruption budgets live once in the launcher
//! (`actors::pools`), which calls these five methods.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use futures::future::BoxFuture;

use crate::ids::NodeId;

/// Tag naming the installation that made a resource (the master's CA
/// fingerprint, 16 hex digits): leak cleanup only ever touches its own.
pub const TAG_MASTER: &str = "flotilla-master";
/// Tag naming the pool a resource was made for.
pub const TAG_POOL: &str = "flotilla-pool";
/// Tag naming the node id the resource's agent enrolls as.
pub const TAG_NODE: &str = "flotilla-node";

/// What a launch asks the driver for.
#[derive(Clone)]
pub struct LaunchSpec {
    /// The node id its agent must enroll as (`--node-id`).
    pub node: NodeId,
    pub pool: String,
    /// The labels the node's agent announces (`--label`).
    pub labels: BTreeMap<String, String>,
    /// Every resource the launch makes carries these ([`TAG_MASTER`],
    /// [`TAG_POOL`], [`TAG_NODE`]).
    pub tags: BTreeMap<String, String>,
    /// A join token bound to `node`, single use (`FLOTILLA_AGENT_JOIN_TOKEN`).
    pub join_token: String,
    /// The master's agent listener as it is bound (an unspecified IP means
    /// every interface: the driver puts the address its machine reaches).
    pub master_addr: SocketAddr,
}

impl std::fmt::Debug for LaunchSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LaunchSpec")
            .field("node", &self.node)
            .field("pool", &self.pool)
            .field("labels", &self.labels)
            .field("tags", &self.tags)
            .field("master_addr", &self.master_addr)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
impl LaunchSpec {
    /// A launch of `node` in pool `p`, labelled `zone=a`, tagged as this
    /// installation's drivers tag, with a well-formed token (drivers' tests).
    pub fn for_test(node: &str, master: &str) -> LaunchSpec {
        let tags = [(TAG_MASTER, "0123456789abcdef"), (TAG_POOL, "p"), (TAG_NODE, node)];
        LaunchSpec {
            node: NodeId::new(node),
            pool: "p".into(),
            labels: BTreeMap::from([("zone".to_string(), "a".to_string())]),
            tags: tags.into_iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            join_token: format!("flj_{}_{}_{}", "a1".repeat(6), "b2".repeat(16), "c3".repeat(32)),
            master_addr: master.parse().expect("a socket address"),
        }
    }
}

/// Where a resource is, as its provider sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ResourceState {
    /// Being made (a cloud instance `pending`).
    Pending,
    /// Made, its agent started.
    Running,
    /// Being taken down.
    Stopping,
    /// Not there (deleted, or never made).
    Gone,
}

/// One resource a provider holds, as `list()` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resource {
    pub external_id: String,
    pub tags: BTreeMap<String, String>,
    pub state: ResourceState,
}

impl Resource {
    pub fn tag(&self, key: &str) -> Option<&str> {
        self.tags.get(key).map(String::as_str)
    }
}

/// What the provider lets this pool hold, whatever the pool's own limits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DriverQuota {
    pub max_nodes: Option<u32>,
}

/// How the launcher treats a driver's failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorClass {
    /// Over the provider's quota: the pool pauses for the label; not a
    /// failed attempt.
    Quota,
    /// The provider has no machine of this kind now: the pool declines the
    /// request and remembers it for a while.
    Capacity,
    /// The pool's settings cannot work (a bad image, a missing binary): the
    /// label is marked broken in the pool.
    Config,
    /// Anything else: tried again with backoff.
    Transient,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{class:?}: {message}")]
pub struct DriverError {
    pub class: ErrorClass,
    pub message: String,
}

impl DriverError {
    pub fn new(class: ErrorClass, message: impl Into<String>) -> DriverError {
        DriverError { class, message: message.into() }
    }
    pub fn transient(message: impl Into<String>) -> DriverError {
        DriverError::new(ErrorClass::Transient, message)
    }
    pub fn config(message: impl Into<String>) -> DriverError {
        DriverError::new(ErrorClass::Config, message)
    }
}

/// A provider of machines. Every method may be called concurrently; each
/// is bounded in time by the launcher, not the driver.
pub trait Driver: Send + Sync + 'static {
    /// The driver's name (`local`, `static`, `ec2`, `sim`).
    fn kind(&self) -> &'static str;
    /// Makes one machine for `spec` with its agent started, tagged with
    /// `spec.tags`; answers its external id. Called again with the same
    /// node after an unwound try: the driver may reuse nothing of it.
    fn create<'a>(&'a self, spec: &'a LaunchSpec) -> BoxFuture<'a, Result<String, DriverError>>;
    /// Where `external_id` is now.
    fn status<'a>(&'a self, external_id: &'a str) -> BoxFuture<'a, Result<ResourceState, DriverError>>;
    /// Takes `external_id` down with everything it runs. Idempotent: a
    /// resource already gone is a success.
    fn delete<'a>(&'a self, external_id: &'a str) -> BoxFuture<'a, Result<(), DriverError>>;
    /// Every resource of this pool's kind the provider holds, with its
    /// tags; an error when any part could not be listed (a partial listing
    /// is never answered as a whole one).
    fn list(&self) -> BoxFuture<'_, Result<Vec<Resource>, DriverError>>;
    /// What the provider allows.
    fn quota(&self) -> BoxFuture<'_, Result<DriverQuota, DriverError>>;
    /// The last `max_bytes` of what the driver logged about one of its
    /// hosts (the static driver's bootstrap log, `address:port`); `None`
    /// for a driver that keeps no log per host. Blocking: a file read.
    fn host_log(&self, _host: &str, _max_bytes: u64) -> Option<Result<String, DriverError>> {
        None
    }
}
