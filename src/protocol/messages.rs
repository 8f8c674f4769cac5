//! Every message that crosses the master <-> agent link.
//!
//! The link is one TCP connection dialled by the agent. After the handshake
//! (`Hello` -> `Welcome` | `Refused`) the master sends [`MasterFrame::Request`]s
//! and the agent answers each with a [`AgentFrame::Response`] carrying the same
//! `request_id`; the agent also sends unsolicited [`AgentEvent`]s.
//!
//! Frames of one request keep their order: the agent never reorders the
//! answers to one request (`InstallReady` always comes before `InstallResult`).
//!
//! Heartbeats are fire-and-forget (`AgentFrame::Event`). Process exits and
//! restarts are **reports** (`AgentFrame::Report`): each carries a sequence
//! number, and the agent keeps it and sends it again (on its own queue, and
//! after every reconnect) until the master answers `MasterFrame::Ack` with
//! that number, which it does once the report is applied and durable. So a
//! burst of crashes, a full queue or a dropped connection never loses one; a
//! report may arrive twice, and applying it is idempotent.
//!
//! A package install is one logical request spread over several frames that
//! share one `request_id`: `InstallBegin` (the agent answers `InstallReady`,
//! saying whether it needs the bytes), then, if it does, `InstallData` chunks
//! (each answered `InstallReceived` with the bytes taken in so far) and
//! `InstallEnd`, after which the agent answers `InstallResult`. A master
//! that gives up on an install before its `InstallEnd` (a deadline, a
//! cancelled step) sends `InstallAbort`: the agent drops what it took in,
//! and answers nothing. (Receipts and the window: protocol 9; the abort:
//! protocol 10.)
//!
//! Every instance command carries the instance's desired-state `generation`;
//! the agent refuses a command older than the newest one it has applied.
//! Every request (and the `Welcome`) carries the master's term; the agent
//! refuses one below the highest term it has seen (several masters on
//! etcd: a deposed leader's commands).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::ids::{ClusterId, InstanceId, NodeId};

/// Bumped on any incompatible change to these types. Both sides refuse a
/// peer with another version, with a message naming both versions.
pub const PROTOCOL_VERSION: u32 = 11;

/// At most this many ids in `Hello::unrecorded` (the rest are reported at
/// a later connection, once the first ones are removed).
pub const MAX_UNRECORDED: usize = 10_000;

/// Size of one `InstallData` chunk sent by the master.
pub const INSTALL_CHUNK_BYTES: usize = 1024 * 1024;

/// Chunks of one install the master sends ahead of the agent's
/// `InstallReceived`: the agent holds at most this many waiting for its
/// extractor (it refuses an install sent further ahead), so its link's
/// reader never waits for a slow extraction and memory stays bounded.
pub const INSTALL_WINDOW_CHUNKS: u64 = 8;

/// Largest frame either side accepts: one chunk plus generous room for headers
/// (rendered files travel in `InstallBegin`/`WriteFiles`).
pub const MAX_FRAME_BYTES: usize = 8 * 1024 * 1024;

/// The name `FilesWritten` lists among the changed files when a
/// `WriteFiles` changed the instance's environment.
pub const ENV_CHANGED: &str = "(environment)";

// ---------------------------------------------------------------- frames

/// A frame sent by the master.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum MasterFrame {
    Welcome(Welcome),
    /// The handshake failed; the master closes the connection after this.
    Refused {
        reason: String,
    },
    Request {
        request_id: u64,
        /// The sending master's term (its leadership's etcd revision; 0
        /// with the embedded store): an agent refuses a request of a term
        /// below the highest it has seen, so a deposed leader that wakes
        /// up commands nothing (protocol 11).
        term: i64,
        body: AgentRequest,
    },
    /// The report with this sequence number is applied and durable: the
    /// agent may forget it.
    Ack {
        seq: u64,
    },
    /// The answer to a good [`AgentFrame::Enroll`]; the master closes the
    /// connection after it, and the agent dials again with its certificate.
    Enrolled(Enrolled),
    /// Sent when the master has sent nothing else for a heartbeat
    /// interval: an agent that hears nothing for [`idle_limit`] takes the
    /// link for dead and dials again.
    Heartbeat,
}

/// How long an agent waits without a frame before it takes the link for
/// dead: five heartbeat intervals, and never less than 15 s (a master on a
/// loaded machine may send its heartbeat late; TCP keepalive catches a
/// vanished peer within about a minute anyway).
pub fn idle_limit(heartbeat_interval: std::time::Duration) -> std::time::Duration {
    (heartbeat_interval * 5).max(std::time::Duration::from_secs(15))
}

/// A frame sent by an agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum AgentFrame {
    Hello(Hello),
    /// The agent refuses the master (e.g. protocol version mismatch).
    Refused {
        reason: String,
    },
    Response {
        request_id: u64,
        body: AgentResponse,
    },
    /// Fire-and-forget news (heartbeats).
    Event(AgentEvent),
    /// News the master must acknowledge (`MasterFrame::Ack { seq }`); sent
    /// again until it is.
    Report {
        seq: u64,
        event: AgentEvent,
    },
    /// The first and only frame of a connection without a client
    /// certificate: asks for one.
    Enroll(EnrollRequest),
}

// ---------------------------------------------------------------- handshake

/// The agent's first frame.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Hello {
    pub protocol_version: u32,
    pub node_id: NodeId,
    /// The host instances on this node bind to and peers dial, e.g. `127.0.0.11`.
    pub address: String,
    /// Absolute path of the agent's instance root: instance `X` lives in
    /// `<instance_root>/X` (templates get it as `instance.dir`).
    pub instance_root: String,
    /// Inclusive port range the master may allocate instance ports from.
    pub port_range: (u16, u16),
    pub labels: BTreeMap<String, String>,
    pub agent_version: String,
    /// Whether this agent can put each instance in its own cgroup v2.
    pub cgroups: bool,
    /// Whether this agent can enforce `ProcessSpec::limits` (memory and CPU
    /// controllers it may write, through cgroup v2 or v1). The master refuses
    /// a request that needs limits on a node without them, before any side effect.
    pub resource_limits: bool,
    /// Everything the agent holds, so the master can reconcile.
    pub inventory: Vec<InstanceReport>,
    /// Instance directories under `instance_root` the agent holds no
    /// record (nor tombstone) of, e.g. left by a store that was lost; at
    /// most [`MAX_UNRECORDED`]. The master treats one it does not know as
    /// leaked (a `Delete` removes the directory and kills what carries the
    /// instance's marker); one it knows stays `Lost` as before. Added in
    /// protocol 6.
    pub unrecorded: Vec<InstanceId>,
    /// A simulated agent (`flotilla bench`): the real protocol over a fake
    /// process layer. The master shows it in `GET /nodes`.
    pub simulated: bool,
}

/// An agent asking for its certificate, with a join token (see
/// [`crate::protocol::tls::join_token`]). Sent over TLS, after the agent
/// checked the master's CA against the token's pin.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
pub struct EnrollRequest {
    pub protocol_version: u32,
    pub node_id: NodeId,
    pub token_id: String,
    pub token_secret: String,
    /// The node's public key (an uncompressed P-256 point); its private
    /// key stays on the node.
    pub public_key: Vec<u8>,
}

/// Never prints the token's secret.
impl std::fmt::Debug for EnrollRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EnrollRequest")
            .field("protocol_version", &self.protocol_version)
            .field("node_id", &self.node_id)
            .field("token_id", &self.token_id)
            .finish_non_exhaustive()
    }
}

/// The certificate issued to an enrolling agent, and the CA it chains to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Enrolled {
    pub certificate_der: Vec<u8>,
    pub ca_der: Vec<u8>,
}

/// The master's answer to a good `Hello`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Welcome {
    pub protocol_version: u32,
    /// How often the agent must send `AgentEvent::Heartbeat`.
    pub heartbeat_interval_ms: u64,
    /// The master's term: an agent that has seen a higher one leaves
    /// (another master leads) and dials the next master it knows.
    pub term: i64,
}

/// One instance as the agent sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InstanceReport {
    pub instance: InstanceId,
    pub generation: u64,
    pub desired_running: bool,
    pub running: bool,
    pub pid: Option<u32>,
}

// ---------------------------------------------------------------- requests

/// What the master asks an agent to do.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum AgentRequest {
    /// Boxed: the header is much larger than the other requests.
    InstallBegin(Box<InstallBegin>),
    InstallData {
        instance: InstanceId,
        seq: u32,
        /// Encoded as one byte string (a length and a copy), not a sequence of
        /// integers: 1 MiB chunks cross the codec at memcpy speed.
        #[serde(with = "serde_bytes")]
        bytes: Vec<u8>,
    },
    InstallEnd {
        instance: InstanceId,
    },
    /// Writes (re-rendered) files into an installed instance, and replaces
    /// its environment when `env` is given (used at the next start), and
    /// reports what changed (`(environment)` for the env). Does not restart
    /// anything.
    WriteFiles {
        instance: InstanceId,
        generation: u64,
        files: Vec<RenderedFile>,
        env: Option<Vec<(String, String)>>,
    },
    /// Starts the instance. A foreground process that exits within
    /// `settle_ms` is a failed start; later, a crash (reported).
    Start {
        instance: InstanceId,
        generation: u64,
        settle_ms: u64,
    },
    Stop {
        instance: InstanceId,
        generation: u64,
    },
    /// Stops the instance if it runs, then removes its directory and records.
    Delete {
        instance: InstanceId,
        generation: u64,
    },
    /// Runs one lifecycle hook (`init`, `scale_out`, `scale_in`, `reload`,
    /// `destroy`) of an installed instance: argv relative to the instance
    /// directory, as the run-as user, with the instance's env, at most
    /// `timeout_ms` (then its process group is killed). Exit 0 answers
    /// `HookDone`; anything else `Failed` with kind `Hook` (or `Timeout`),
    /// the exit code and both tails.
    RunHook {
        instance: InstanceId,
        generation: u64,
        hook: String,
        argv: Vec<String>,
        timeout_ms: u64,
    },
    /// Waits until the instance passes its health check (`ProcessSpec::health`),
    /// at most `timeout_ms`. An instance without a check is healthy when its
    /// process runs. Answers `Healthy`, or `Failed` with kind `Health`.
    CheckHealth {
        instance: InstanceId,
        timeout_ms: u64,
    },
    /// Sends `signal` (a number; the master resolves names) to the
    /// instance's main process, checked by pid identity (a file's
    /// `change_mode = "signal"`). Answers `Signalled`.
    Signal {
        instance: InstanceId,
        generation: u64,
        signal: i32,
    },
    /// Reads an installed instance's log (`logs/stdout.log` or
    /// `logs/stderr.log`): its last `Tail(n)` lines, or what follows byte
    /// `Offset(o)` (from the start if the log is shorter: it was cut), at
    /// most `max_bytes`. Answers `LogChunk`. (Since protocol 4.)
    ReadLog {
        instance: InstanceId,
        stream: LogStream,
        from: LogFrom,
        max_bytes: u32,
    },
    Ping,
    /// The master gave up on the install of this `request_id` before its
    /// `InstallEnd`: the agent stops feeding it, removes what it extracted
    /// and answers nothing. Ignored for an install that has ended or
    /// failed already. (Last: since protocol 10.)
    InstallAbort {
        instance: InstanceId,
    },
}

/// Which of an instance's logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum LogStream {
    Stdout,
    Stderr,
}

/// Where a `ReadLog` starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum LogFrom {
    /// The last this many lines.
    Tail(u32),
    /// After this many bytes.
    Offset(u64),
}

/// The header of a package install: everything the agent needs to create or
/// replace an instance directory, except the package bytes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InstallBegin {
    pub instance: InstanceId,
    /// The instance's cluster: a root agent gives each cluster whose spec
    /// names no `run_as` a user of its own (`node::dynamic_users`).
    pub cluster: ClusterId,
    pub generation: u64,
    /// The run-as user from the spec; `None` means the agent's default.
    pub run_as: Option<String>,
    pub process: ProcessSpec,
    pub files: Vec<RenderedFile>,
    pub package_sha256: String,
    pub package_size: u64,
}

/// How to run and stop an instance. Commands are argv arrays relative to the
/// instance directory, never shell strings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProcessSpec {
    pub start: Vec<String>,
    pub stop: Option<Vec<String>>,
    /// Present: the start command daemonizes and writes this pidfile
    /// (relative to the instance directory). Absent: the child is the process.
    pub pidfile: Option<String>,
    pub stop_grace_ms: u64,
    /// How long a start may take: until the pid is known and, with a
    /// `health` check, until it passes. `Start` answers `Started` only then.
    pub start_timeout_ms: u64,
    pub env: Vec<(String, String)>,
    /// What gates `Running`; `None`: a running process is healthy.
    pub health: Option<HealthProbe>,
    /// Applied to the instance's cgroup at each start.
    pub limits: Option<ResourceLimits>,
}

/// A health check, resolved by the master (port names become numbers).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum HealthProbe {
    /// A TCP connect to the node's address on this port succeeds.
    Tcp { port: u16 },
    /// This argv (relative to the instance dir, as the run-as user) exits 0.
    Cmd { argv: Vec<String> },
}

/// Resource limits of one instance.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ResourceLimits {
    pub memory_bytes: Option<u64>,
    /// CPUs (1.5 = one and a half cores of CPU time per period).
    pub cpu: Option<f64>,
}

/// A file rendered on the master, written by the agent. `path` is relative to
/// the instance directory and validated on both sides.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RenderedFile {
    pub path: String,
    #[serde(with = "serde_bytes")]
    pub contents: Vec<u8>,
    pub mode: u32,
}

// ---------------------------------------------------------------- responses

/// The agent's answer to one request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum AgentResponse {
    /// Answer to `InstallBegin`: `need_bytes == false` means the agent holds
    /// the package already and installed from its copy; `InstallResult` follows
    /// at once without data frames.
    InstallReady {
        need_bytes: bool,
    },
    InstallResult {
        files_written: u32,
    },
    FilesWritten {
        changed: Vec<String>,
    },
    Started {
        pid: u32,
        already_running: bool,
    },
    Stopped {
        was_running: bool,
    },
    Deleted {
        existed: bool,
    },
    HookDone {
        exit_code: i32,
        stdout_tail: String,
        stderr_tail: String,
    },
    Healthy,
    /// Answer to `Signal`: `delivered == false` when the process was not running.
    Signalled {
        delivered: bool,
    },
    Pong,
    /// Answer to `ReadLog`: the bytes read and the offset to ask from next.
    LogChunk {
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
        next_offset: u64,
    },
    Failed(CommandFailure),
    /// Sent after each `InstallData` chunk the agent has taken in: `bytes`
    /// received so far. It is the install's proof of progress: the
    /// master's deadline for `InstallResult` counts from the last one, so
    /// an install to an agent that reads slowly never fails while its
    /// bytes still move (the socket buffers hold megabytes the master has
    /// long "sent").
    InstallReceived {
        bytes: u64,
    },
}

/// Why a command failed on the agent, with what an operator needs to fix it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CommandFailure {
    pub kind: FailureKind,
    pub message: String,
    /// Exit code of the failed process, when one exited.
    pub exit_code: Option<i32>,
    /// Last lines of the failed process's stderr.
    pub stderr_tail: String,
    /// Last lines of its stdout (hooks; empty otherwise).
    pub stdout_tail: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum FailureKind {
    /// The command carried a generation older than one already applied.
    StaleGeneration,
    /// The request came from a master whose term is below the highest the
    /// agent has seen (a deposed leader); nothing was done.
    StaleTerm,
    UnknownInstance,
    BadRequest,
    Install,
    Start,
    Stop,
    /// A hook exited non-zero.
    Hook,
    /// The health check did not pass in time (or the process died meanwhile).
    Health,
    Timeout,
    Internal,
    /// Refused at once because the agent is at a bound (concurrent log
    /// reads); nothing was done, and retrying shortly may succeed.
    Busy,
}

// ---------------------------------------------------------------- events

/// Unsolicited news from an agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum AgentEvent {
    Heartbeat,
    /// A process the agent was running exited without being asked to stop.
    ProcessExited {
        instance: InstanceId,
        pid: u32,
        exit_code: Option<i32>,
        signal: Option<i32>,
        stderr_tail: String,
        /// The agent restarts it after this delay (its restart policy); `None`:
        /// it stays down.
        restart_in_ms: Option<u64>,
        /// Which restart in the policy's window this one is (1 for the first;
        /// with `restart_in_ms`), and the most the policy allows there.
        /// (Since protocol 8.)
        attempt: u32,
        max_attempts: u32,
    },
    /// A start with a settle window spawned its process: the master may show
    /// it running with its pid; the start's answer comes once it has
    /// settled (or its death fails it). (Since protocol 8.)
    ProcessSpawned {
        instance: InstanceId,
        generation: u64,
        pid: u32,
    },
    /// The outcome of a restart announced by `ProcessExited`: the new pid
    /// (healthy, when the spec has a check), or why it failed (it stays down).
    ProcessRestarted {
        instance: InstanceId,
        pid: Option<u32>,
        error: Option<String>,
    },
}
