//! Settings for `flotilla master` and `flotilla agent`.
//!
//! Each is read, lowest priority first, from: built-in defaults; a TOML file
//! (`--config PATH`; `config/master.toml` and `config/agent.toml` document every
//! key); `FLOTILLA_MASTER_*` / `FLOTILLA_AGENT_*` environment variables (e.g.
//! `FLOTILLA_MASTER_HTTP_ADDR=0.0.0.0:7070`); then command-line flags. Unknown
//! keys and bad values stop start-up with an error naming the key.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot load configuration: {0}")]
    Load(String),
    #[error("invalid configuration value for `{key}`: {message}")]
    Invalid { key: &'static str, message: String },
    #[error("invalid configuration value for `{0}`")]
    Pool(#[from] crate::providers::pool_config::PoolConfigError),
}

/// The master's settings. See `config/master.toml` for each key's meaning.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MasterConfig {
    pub data_dir: PathBuf,
    pub http_addr: String,
    pub agent_addr: String,
    pub max_upload_bytes: u64,
    /// An upload that sends no bytes for this long is refused.
    #[serde(with = "humantime_serde_compat")]
    pub upload_idle_timeout: Duration,
    /// Once `upload_idle_timeout` has passed, an upload averaging fewer
    /// bytes per second than this is refused.
    pub upload_min_rate: u64,
    pub max_json_bytes: usize,
    /// A request body (a package upload's excepted) not received whole
    /// within this of the request's head is refused (`400 body_timeout`).
    #[serde(with = "humantime_serde_compat")]
    pub request_body_timeout: Duration,
    #[serde(with = "humantime_serde_compat")]
    pub heartbeat_interval: Duration,
    #[serde(with = "humantime_serde_compat")]
    pub node_unknown_after: Duration,
    #[serde(with = "humantime_serde_compat")]
    pub node_down_after: Duration,
    #[serde(with = "humantime_serde_compat")]
    pub agent_reply_timeout: Duration,
    #[serde(with = "humantime_serde_compat")]
    pub handshake_timeout: Duration,
    /// Agent connections held at once (links and handshakes under way);
    /// past it a new one is closed at once.
    pub max_agent_connections: usize,
    /// TLS and protocol handshakes of agents run at once; past it new
    /// connections wait in the listen backlog.
    pub max_agent_handshakes: usize,
    /// Of those, how many one source address may hold; past it a new
    /// connection from that address is closed at once (one host trickling
    /// handshakes cannot take every slot from the others).
    pub max_agent_handshakes_per_source: usize,
    /// Of those, how many one subnet (an IPv4 /24, an IPv6 /64) may hold;
    /// past it a new connection from that subnet is closed at once.
    pub max_agent_handshakes_per_subnet: usize,
    /// Handshakes kept, beyond `max_agent_handshakes`, for connections whose
    /// ClientHello names a certificate this master issued (enrolled agents
    /// reconnecting); enrollments and anything else never take them.
    pub reserved_agent_handshakes: usize,
    /// A connection that has not sent a whole TLS ClientHello within this
    /// is closed (long before `handshake_timeout`).
    #[serde(with = "humantime_serde_compat")]
    pub first_bytes_timeout: Duration,
    /// A frame an agent's connection cannot take within this closes the
    /// link: the agent stopped reading.
    #[serde(with = "humantime_serde_compat")]
    pub agent_send_timeout: Duration,
    pub endpoints_file: Option<PathBuf>,
    pub log_format: LogFormat,
    /// Threads cluster actors are spread over (0: one per CPU).
    pub actor_threads: usize,
    /// Threads agents' connections (node managers, link writers) are
    /// spread over, apart from the cluster actors' (0: one per two CPUs).
    pub link_threads: usize,
    /// How many nice steps the actor threads run bulk work below the
    /// process (instance commands, renders, agents' frames); a thread is
    /// raised back while an API request waits for it. 0: never lowered.
    /// Needs the right to raise a thread back (CAP_SYS_NICE or a high
    /// enough RLIMIT_NICE); without it the threads stay where they are.
    pub bulk_nice: u8,
    /// HTTP worker threads.
    pub http_workers: usize,
    /// Messages one cluster actor (or the supervisor) may have waiting;
    /// past it requests are answered `503 overloaded`.
    pub mailbox_capacity: usize,
    /// Commits the store may have queued; past it new requests are
    /// answered `503 overloaded` (internal writes wait).
    pub writer_queue: usize,
    /// Ended operations kept per cluster; older ones are deleted.
    pub operations_retained: usize,
    /// `GET /api/v1/health` answers without an API token (every other
    /// route needs one).
    pub open_health: bool,
    /// `GET /metrics` answers without an API token.
    pub open_metrics: bool,
    /// Events kept in the store (`GET /events` replays from them); older
    /// ones are deleted.
    pub events_retained: usize,
    /// An instance an agent holds that the master does not know (a leaked
    /// instance, shown in `GET /nodes/{id}`) is removed from its node this
    /// long after the master first saw it; 0: never, report only.
    #[serde(with = "humantime_serde_compat")]
    pub leaked_grace: Duration,
    /// A store write (one synced batch) still unanswered after this ends
    /// the master with that cause: a disk that no longer answers must not
    /// leave a master that accepts requests it can never record.
    #[serde(with = "humantime_serde_compat")]
    pub store_stall_limit: Duration,
    /// An API request its actor (a cluster's, the supervisor) has not
    /// taken within this is answered `503` and never runs.
    #[serde(with = "humantime_serde_compat")]
    pub request_take_limit: Duration,
    /// Serves `/test-hooks/...` (admin token): faults injected into actors
    /// and tasks for the supervision tests (a panic, a stall). Never for
    /// production: the master warns at start when it is on.
    pub test_hooks: bool,
    /// Where nodes come from (`[[node_pools]]`; none: only agents started
    /// by hand).
    pub node_pools: Vec<crate::providers::pool_config::PoolConfig>,
    /// How often each pool's resources are compared with the store (leak
    /// cleanup).
    #[serde(with = "humantime_serde_compat")]
    pub pool_cleanup_interval: Duration,
    /// A leaked resource is deleted once seen in two passes and this long
    /// after the first.
    #[serde(with = "humantime_serde_compat")]
    pub pool_leak_grace: Duration,
    /// Where the master's state lives: `rocksdb` (embedded in `data_dir`,
    /// one master) or `etcd` (several masters, one of them leading).
    pub store: StoreKind,
    /// `[etcd]`: how to reach etcd when `store = "etcd"`.
    pub etcd: crate::storage::etcd::EtcdSettings,
    /// This master's name among several (default: its `http_addr`).
    pub name: Option<String>,
    /// The API URL other masters send clients to (default:
    /// `http://<http_addr>`).
    pub advertise_url: Option<String>,
}

/// The engine behind the master's store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StoreKind {
    #[default]
    Rocksdb,
    Etcd,
}

impl Default for MasterConfig {
    fn default() -> Self {
        MasterConfig {
            data_dir: PathBuf::from("./flotilla-data/master"),
            http_addr: "127.0.0.1:7070".into(),
            agent_addr: "127.0.0.1:7071".into(),
            max_upload_bytes: 1024 * 1024 * 1024,
            upload_idle_timeout: Duration::from_secs(30),
            upload_min_rate: 16 * 1024,
            max_json_bytes: 1024 * 1024,
            request_body_timeout: Duration::from_secs(10),
            heartbeat_interval: Duration::from_secs(2),
            node_unknown_after: Duration::from_secs(6),
            node_down_after: Duration::from_secs(30),
            agent_reply_timeout: Duration::from_secs(120),
            handshake_timeout: Duration::from_secs(10),
            max_agent_connections: 20_000,
            max_agent_handshakes: 256,
            max_agent_handshakes_per_source: 64,
            max_agent_handshakes_per_subnet: 128,
            reserved_agent_handshakes: 64,
            first_bytes_timeout: Duration::from_secs(3),
            agent_send_timeout: Duration::from_secs(10),
            endpoints_file: None,
            log_format: LogFormat::Text,
            actor_threads: 0,
            link_threads: 0,
            bulk_nice: 10,
            http_workers: 2,
            mailbox_capacity: 256,
            writer_queue: 8192,
            operations_retained: 1000,
            open_health: true,
            open_metrics: false,
            events_retained: 100_000,
            leaked_grace: Duration::from_secs(600),
            store_stall_limit: Duration::from_secs(60),
            request_take_limit: Duration::from_secs(30),
            test_hooks: false,
            node_pools: Vec::new(),
            pool_cleanup_interval: Duration::from_secs(60),
            pool_leak_grace: Duration::from_secs(300),
            store: StoreKind::Rocksdb,
            etcd: crate::storage::etcd::EtcdSettings::default(),
            name: None,
            advertise_url: None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

/// An agent's settings. See `config/agent.toml` for each key's meaning.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AgentConfig {
    pub node_id: String,
    pub master_addr: String,
    pub address: String,
    pub data_dir: PathBuf,
    pub port_range: String,
    pub labels: BTreeMap<String, String>,
    pub default_run_as: Option<String>,
    /// `FIRST-LAST`: the uids given as dynamic users, one per cluster whose
    /// spec names no `run_as` (when `default_run_as` is unset and the agent
    /// is root); empty: none (such instances run as `nobody`).
    pub dynamic_users: String,
    /// Whether an instance may run as uid 0 or gid 0 (by whatever name).
    pub allow_root: bool,
    /// The users a spec's `run_as` may name; empty: any user (but root,
    /// unless `allow_root`). The agent's default user is always allowed.
    pub allowed_run_as: Vec<String>,
    /// Whether a spec's `env` may set dynamic-loader variables (`LD_*`,
    /// `GCONV_PATH`, `GLIBC_TUNABLES`).
    pub allow_loader_env: bool,
    /// Enrolls with this when the data dir holds no certificate yet.
    pub join_token: Option<Secret>,
    pub use_cgroups: bool,
    pub stop_instances_on_exit: bool,
    #[serde(with = "humantime_serde_compat")]
    pub reconnect_max_backoff: Duration,
    #[serde(with = "humantime_serde_compat")]
    pub handshake_timeout: Duration,
    pub log_format: LogFormat,
    /// At most this many restarts of a crashed instance within
    /// `restart_window`; 0: never restart (the master marks it Failed).
    pub restart_max: u32,
    #[serde(with = "humantime_serde_compat")]
    pub restart_window: Duration,
    /// Delay before the first restart; doubles with each restart in the window.
    #[serde(with = "humantime_serde_compat")]
    pub restart_backoff: Duration,
}

impl Default for AgentConfig {
    fn default() -> Self {
        AgentConfig {
            node_id: String::new(),
            master_addr: "127.0.0.1:7071".into(),
            address: "127.0.0.1".into(),
            data_dir: PathBuf::from("./flotilla-data/agent"),
            port_range: "20000-29999".into(),
            labels: BTreeMap::new(),
            default_run_as: None,
            dynamic_users: "61184-65519".into(),
            allow_root: false,
            allowed_run_as: Vec::new(),
            allow_loader_env: false,
            join_token: None,
            use_cgroups: true,
            stop_instances_on_exit: false,
            reconnect_max_backoff: Duration::from_secs(5),
            handshake_timeout: Duration::from_secs(10),
            log_format: LogFormat::Text,
            restart_max: 3,
            restart_window: Duration::from_secs(300),
            restart_backoff: Duration::from_secs(1),
        }
    }
}

/// A setting that must not reach a log line: `{:?}` prints `<secret>`.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Secret(pub String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<secret>")
    }
}

impl AgentConfig {
    /// The parsed, validated port range.
    pub fn ports(&self) -> Result<(u16, u16), ConfigError> {
        parse_port_range(&self.port_range)
    }

    /// The uids dynamic users are given from (inclusive); `None` when
    /// `dynamic_users` is empty.
    pub fn dynamic_uids(&self) -> Result<Option<(u32, u32)>, ConfigError> {
        let text = self.dynamic_users.trim();
        if text.is_empty() {
            return Ok(None);
        }
        let bad = |m: &str| ConfigError::Invalid { key: "dynamic_users", message: format!("{text:?}: {m}") };
        let (a, b) = text.split_once('-').ok_or_else(|| bad("expected FIRST-LAST, e.g. 61184-65519"))?;
        let a: u32 = a.trim().parse().map_err(|_| bad("FIRST is not a uid"))?;
        let b: u32 = b.trim().parse().map_err(|_| bad("LAST is not a uid"))?;
        if a < 1000 || b < a || b >= 65534 {
            return Err(bad("need 1000 <= FIRST <= LAST < 65534 (above the system users, below nobody)"));
        }
        Ok(Some((a, b)))
    }
}

fn parse_port_range(s: &str) -> Result<(u16, u16), ConfigError> {
    let bad = |m: &str| ConfigError::Invalid { key: "port_range", message: format!("{s:?}: {m}") };
    let (lo, hi) = s.split_once('-').ok_or_else(|| bad("expected LOW-HIGH, e.g. 20000-29999"))?;
    let lo: u16 = lo.trim().parse().map_err(|_| bad("LOW is not a port number"))?;
    let hi: u16 = hi.trim().parse().map_err(|_| bad("HIGH is not a port number"))?;
    if lo < 1024 || lo > hi {
        return Err(bad("need 1024 <= LOW <= HIGH"));
    }
    Ok((lo, hi))
}

/// Loads settings of type `T`: defaults, then `file`, then environment
/// variables with `env_prefix` (`FLOTILLA_MASTER` → `FLOTILLA_MASTER_HTTP_ADDR`),
/// then `overrides` (from command-line flags).
fn load<T: for<'de> Deserialize<'de>>(
    file: Option<&Path>,
    env_prefix: &str,
    env: Option<config::Map<String, String>>,
    overrides: &[(&str, String)],
) -> Result<T, ConfigError> {
    let mut builder = config::Config::builder();
    if let Some(path) = file {
        if !path.exists() {
            return Err(ConfigError::Load(format!("config file {} does not exist", path.display())));
        }
        builder = builder.add_source(config::File::from(path).format(config::FileFormat::Toml));
    }
    builder = builder.add_source(
        config::Environment::with_prefix(env_prefix)
            .prefix_separator("_")
            .try_parsing(true)
            // The agent's one list: `FLOTILLA_AGENT_ALLOWED_RUN_AS=app,web`.
            .list_separator(",")
            .with_list_parse_key("allowed_run_as")
            .source(env),
    );
    for (key, value) in overrides {
        builder = builder.set_override(*key, value.clone()).map_err(|e| ConfigError::Load(e.to_string()))?;
    }
    let cfg = builder.build().map_err(|e| ConfigError::Load(e.to_string()))?;
    cfg.try_deserialize().map_err(|e| ConfigError::Load(e.to_string()))
}

impl MasterConfig {
    pub fn load(file: Option<&Path>, overrides: &[(&str, String)]) -> Result<Self, ConfigError> {
        Self::load_with_env(file, None, overrides)
    }

    fn load_with_env(
        file: Option<&Path>,
        env: Option<config::Map<String, String>>,
        overrides: &[(&str, String)],
    ) -> Result<Self, ConfigError> {
        let cfg: MasterConfig = load(file, "FLOTILLA_MASTER", env, overrides)?;
        cfg.validate()?;
        Ok(cfg)
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        check_addr("http_addr", &self.http_addr)?;
        check_addr("agent_addr", &self.agent_addr)?;
        if self.max_upload_bytes < 1024 {
            return Err(ConfigError::Invalid { key: "max_upload_bytes", message: "must be at least 1024".into() });
        }
        if self.max_json_bytes < 1024 {
            return Err(ConfigError::Invalid { key: "max_json_bytes", message: "must be at least 1024".into() });
        }
        check_nonzero("heartbeat_interval", self.heartbeat_interval)?;
        check_nonzero("upload_idle_timeout", self.upload_idle_timeout)?;
        check_nonzero("request_body_timeout", self.request_body_timeout)?;
        if self.node_unknown_after <= self.heartbeat_interval {
            return Err(ConfigError::Invalid {
                key: "node_unknown_after",
                message: "must be longer than heartbeat_interval".into(),
            });
        }
        if self.node_down_after < self.node_unknown_after {
            return Err(ConfigError::Invalid {
                key: "node_down_after",
                message: "must not be shorter than node_unknown_after".into(),
            });
        }
        check_nonzero("agent_reply_timeout", self.agent_reply_timeout)?;
        check_nonzero("agent_send_timeout", self.agent_send_timeout)?;
        check_nonzero("store_stall_limit", self.store_stall_limit)?;
        check_nonzero("request_take_limit", self.request_take_limit)?;
        check_nonzero("pool_cleanup_interval", self.pool_cleanup_interval)?;
        crate::providers::pool_config::check_all(&self.node_pools)?;
        if self.store == StoreKind::Etcd {
            self.etcd.validate().map_err(|message| ConfigError::Invalid { key: "etcd", message })?;
        }
        if self.bulk_nice > 19 {
            return Err(ConfigError::Invalid {
                key: "bulk_nice",
                message: format!("{} is outside 0..=19", self.bulk_nice),
            });
        }
        for (key, v, max) in [
            ("actor_threads", self.actor_threads, 256),
            ("link_threads", self.link_threads, 256),
            ("http_workers", self.http_workers, 256),
            ("mailbox_capacity", self.mailbox_capacity, 1 << 20),
            ("writer_queue", self.writer_queue, 1 << 20),
            ("operations_retained", self.operations_retained, 1 << 20),
            ("events_retained", self.events_retained, 1 << 24),
            ("max_agent_connections", self.max_agent_connections, 1 << 20),
            ("max_agent_handshakes", self.max_agent_handshakes, 1 << 16),
            ("max_agent_handshakes_per_source", self.max_agent_handshakes_per_source, 1 << 16),
            ("max_agent_handshakes_per_subnet", self.max_agent_handshakes_per_subnet, 1 << 16),
            ("reserved_agent_handshakes", self.reserved_agent_handshakes, 1 << 16),
        ] {
            let min = usize::from(!matches!(key, "actor_threads" | "link_threads" | "reserved_agent_handshakes"));
            if v < min || v > max {
                return Err(ConfigError::Invalid { key, message: format!("{v} is outside {min}..={max}") });
            }
        }
        check_nonzero("handshake_timeout", self.handshake_timeout)?;
        check_nonzero("first_bytes_timeout", self.first_bytes_timeout)?;
        if self.first_bytes_timeout > self.handshake_timeout {
            return Err(ConfigError::Invalid {
                key: "first_bytes_timeout",
                message: "must not be longer than handshake_timeout".into(),
            });
        }
        Ok(())
    }
}

impl AgentConfig {
    pub fn load(file: Option<&Path>, overrides: &[(&str, String)]) -> Result<Self, ConfigError> {
        Self::load_with_env(file, None, overrides)
    }

    fn load_with_env(
        file: Option<&Path>,
        env: Option<config::Map<String, String>>,
        overrides: &[(&str, String)],
    ) -> Result<Self, ConfigError> {
        let cfg: AgentConfig = load(file, "FLOTILLA_AGENT", env, overrides)?;
        cfg.validate()?;
        Ok(cfg)
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.node_id.is_empty() {
            return Err(ConfigError::Invalid {
                key: "node_id",
                message: "must be set (e.g. node_id = \"node-1\")".into(),
            });
        }
        crate::ids::validate_name(&self.node_id).map_err(|m| ConfigError::Invalid { key: "node_id", message: m })?;
        crate::agent::masters::Masters::parse(&self.master_addr)
            .map_err(|message| ConfigError::Invalid { key: "master_addr", message })?;
        self.address.parse::<std::net::IpAddr>().map_err(|_| ConfigError::Invalid {
            key: "address",
            message: format!("{:?} is not an IP address", self.address),
        })?;
        self.ports()?;
        self.dynamic_uids()?;
        if let Some(bad) =
            self.allowed_run_as.iter().find(|u| u.is_empty() || u.contains([',', ':', '/']) || u.trim() != *u)
        {
            return Err(ConfigError::Invalid { key: "allowed_run_as", message: format!("{bad:?} is not a user name") });
        }
        crate::ids::validate_labels(self.labels.iter()).map_err(|(key, m)| ConfigError::Invalid {
            key: "labels",
            message: match key {
                Some(k) => format!("{k:?}: {m}"),
                None => m,
            },
        })?;
        check_nonzero("reconnect_max_backoff", self.reconnect_max_backoff)?;
        check_nonzero("restart_window", self.restart_window)?;
        check_nonzero("restart_backoff", self.restart_backoff)?;
        if self.restart_max > 100 {
            return Err(ConfigError::Invalid {
                key: "restart_max",
                message: format!("{} is over 100", self.restart_max),
            });
        }
        check_nonzero("handshake_timeout", self.handshake_timeout)
    }
}

fn check_addr(key: &'static str, value: &str) -> Result<(), ConfigError> {
    value
        .parse::<SocketAddr>()
        .map(|_| ())
        .map_err(|_| ConfigError::Invalid { key, message: format!("{value:?} is not HOST:PORT with an IP host") })
}

fn check_nonzero(key: &'static str, d: Duration) -> Result<(), ConfigError> {
    if d.is_zero() {
        return Err(ConfigError::Invalid { key, message: "must be greater than zero".into() });
    }
    Ok(())
}

/// Durations are written as humantime strings (`"2s"`, `"1m 30s"`).
/// Durations written like "5s" (the one parser, shared with the store's settings).
use crate::storage::serde_time::duration_text as humantime_serde_compat;

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
