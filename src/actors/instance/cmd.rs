//! The messages of an instance actor: the commands a step sends it, what
//! an agent observed, and what a command's outcome is.

use std::cell::Cell;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use crate::actors::Shared;
use crate::actors::read_model::ClusterCell;
use crate::protocol::messages::{ENV_CHANGED, ProcessSpec, RenderedFile};
use crate::spec::{ChangeMode, ComponentSpec};
use crate::storage::records::{Applied, InstanceRecord, InstanceResult, PendingRestart};

/// What one instance should do now.
#[derive(Debug, Clone)]
pub enum InstanceCmd {
    Install(Box<InstallPayload>),
    /// Start and wait until healthy; `wait` is the role's start timeout,
    /// `settle` its start settle window, `checked` whether a health check
    /// follows it; `window` the step's place, given back once the process
    /// is spawned unless a health check follows (see [`Window`]).
    Start {
        wait: Duration,
        settle: Duration,
        checked: bool,
        window: Window,
    },
    Stop,
    /// Re-rendered files and environment; `rule` says what a change of
    /// each file owes the running process.
    WriteFiles {
        files: Vec<RenderedFile>,
        env: Vec<(String, String)>,
        rule: ChangeRule,
    },
    Delete,
    RunHook {
        hook: &'static str,
        argv: Vec<String>,
        timeout: Duration,
    },
    CheckHealth {
        timeout: Duration,
    },
    /// A signal to the main process (a file's `change_mode = "signal"`).
    Signal {
        signal: i32,
    },
}

/// A command's place in its step's window of commands in flight, which a
/// start without a health check gives back once its agent has spawned the
/// process: what is left of it (the settle window) is waiting, and holds
/// neither files nor the agent's spawning. Without that, a 1 s settle
/// bounded a scale-up to a window's worth of starts per second.
#[derive(Clone, Default)]
pub struct Window(Rc<Cell<Option<tokio::sync::OwnedSemaphorePermit>>>);

impl Window {
    pub fn new(permit: tokio::sync::OwnedSemaphorePermit) -> Window {
        Window(Rc::new(Cell::new(Some(permit))))
    }

    /// Gives the place back (once; later calls do nothing).
    pub fn release(&self) {
        self.0.take();
    }
}

impl std::fmt::Debug for Window {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let held = self.0.take();
        let is = held.is_some();
        self.0.set(held);
        write!(f, "Window {{ held: {is} }}")
    }
}

impl InstanceCmd {
    /// The start of an instance of `role`, outside any window.
    pub fn start_of(role: &crate::spec::RoleSpec) -> InstanceCmd {
        InstanceCmd::Start {
            wait: role.start_timeout,
            settle: role.start_settle,
            checked: role.health.is_some(),
            window: Window::default(),
        }
    }

    /// This command holding `place` in its step's window: a start gives it
    /// back once spawned, any other command when it ends.
    pub fn in_window(self, place: &Window) -> InstanceCmd {
        match self {
            // A health check is work on the agent (a probe, the process
            // booting under it): the place is kept until it answers.
            InstanceCmd::Start { wait, settle, checked: false, .. } => {
                InstanceCmd::Start { wait, settle, checked: false, window: place.clone() }
            }
            other => other,
        }
    }

    pub(super) fn verb(&self) -> &'static str {
        match self {
            InstanceCmd::Install(_) => "install",
            InstanceCmd::Start { .. } => "start",
            InstanceCmd::Stop => "stop",
            InstanceCmd::WriteFiles { .. } => "write files",
            InstanceCmd::Delete => "delete",
            InstanceCmd::RunHook { hook, .. } => hook,
            InstanceCmd::CheckHealth { .. } => "health check",
            InstanceCmd::Signal { .. } => "signal",
        }
    }
}

/// Which role's change modes apply to a `WriteFiles`.
#[derive(Debug, Clone)]
pub struct ChangeRule {
    pub spec: Arc<ComponentSpec>,
    pub role: Arc<str>,
}

impl ChangeRule {
    /// What the process owes after `changed` (paths, or `ENV_CHANGED`).
    pub(crate) fn owed(&self, changed: &[String]) -> Option<PendingRestart> {
        if changed.iter().any(|c| c == ENV_CHANGED) {
            return Some(PendingRestart::Restart);
        }
        let mode = self.spec.role(&self.role).map(|r| r.owed(changed)).unwrap_or(Some(ChangeMode::Restart))?;
        match mode {
            ChangeMode::Noop => None,
            ChangeMode::Signal(s) => Some(PendingRestart::Signal(s)),
            ChangeMode::Reload => Some(PendingRestart::Reload),
            ChangeMode::Restart => Some(PendingRestart::Restart),
        }
    }
}

/// Everything an install needs besides the instance itself.
#[derive(Debug, Clone)]
pub struct InstallPayload {
    pub run_as: Option<String>,
    pub process: ProcessSpec,
    pub files: Vec<RenderedFile>,
    pub package_sha256: String,
    pub package_size: u64,
    pub blob: PathBuf,
    /// Recorded on the instance once the install succeeded.
    pub applied: Arc<Applied>,
}

/// The answer to one command: the result an operation journals, and for
/// `WriteFiles` the files that changed.
#[derive(Debug, Clone)]
pub struct InstanceOutcome {
    pub result: InstanceResult,
    pub changed: Vec<String>,
    /// The agent answered that it does not hold the instance (it lost its
    /// store, or the instance otherwise): a start installs it again.
    pub not_held: bool,
}

/// What an agent reported about the instance outside of a command.
#[derive(Debug, Clone)]
pub enum Observation {
    /// Its process exited without being asked to; `restarting`: its agent
    /// will start it again (restart policy), so it is not Failed (yet).
    Exited { pid: u32, description: String, restarting: bool },
    /// How the agent's restart went: the new pid, or why it failed.
    Restarted { pid: Option<u32>, error: Option<String> },
    /// A start of `generation` with a settle window spawned `pid`: shown
    /// `Running` with it while the start settles. Handed to the running
    /// start directly ([`InstanceActor::spawned`]), not queued behind it.
    Spawned { generation: u64, pid: u32 },
    /// The agent's inventory after it (re)connected: whether it holds the
    /// instance, at which `generation` (the last command it applied), and
    /// the connection whose `Hello` carried it (`connection`: the master's
    /// link id). It describes the agent before any command of that
    /// connection, so it is ignored once one was sent, or when it is older
    /// than the instance's generation.
    Inventory { present: bool, running: bool, pid: Option<u32>, generation: Option<u64>, connection: Option<u64> },
    /// Its node was judged `Down`: nothing was heard from its agent for
    /// `silent_for` (a partition, a dead machine). Nothing is known of the
    /// instance until the agent's next inventory.
    NodeDown { silent_for: std::time::Duration },
}

/// What the instance actors of one cluster share (all on its arbiter).
pub struct ClusterEnv {
    pub shared: Shared,
    /// Where the cluster's snapshot is published.
    pub cell: Arc<ClusterCell>,
    /// Bumped whenever a command of the cluster moves (an answer, a package
    /// chunk sent): the step watchdog's sign of life.
    pub progress: Arc<AtomicU64>,
    /// Instance commands answered (the `done` of `operation.progress`).
    pub answered: AtomicU64,
    /// The gate of the cluster's thread: instance commands wait while an
    /// API request to a cluster there is being answered.
    pub priority: Arc<crate::actors::priority::Priority>,
    /// The cluster actor's counters: its instance actors' queued work is
    /// counted in its mailbox depth (`ActorStats::inner`).
    pub stats: Arc<crate::actors::read_model::ActorStats>,
    /// What a member's failure does to its cluster (set by the cluster
    /// actor once it exists).
    pub failures: std::cell::RefCell<Option<std::rc::Rc<dyn MemberFailures>>>,
    /// Held by whoever writes the cluster record (its operations' ends and
    /// changes, a refusal's note, a member failure that changes it), from
    /// reading the record to applying what landed: two such writes never
    /// cross, so none is built from a record another is about to change.
    pub record_writes: tokio::sync::Mutex<()>,
    /// Its instance commands queued or running (`in_flight`).
    pub in_flight: super::in_flight::InFlight,
}

/// The cluster's side of a member's failure, asked by the instance actor
/// as it writes it: the writes that put the cluster in `Error` (in the
/// same batch as the member's), and what to do once they are durable; or
/// `None` (the cluster is busy with an operation, which judges it when it
/// ends, or says so already).
pub trait MemberFailures {
    /// Whether the failure of `member` may change the cluster record (then
    /// it is written holding `ClusterEnv::record_writes`): not while an
    /// operation runs (its end judges), nor once the `Error` names as many
    /// members as it names.
    fn may_escalate(&self, member: &InstanceRecord) -> bool;
    #[allow(clippy::type_complexity)]
    fn escalate(&self, member: &InstanceRecord) -> Option<(Vec<crate::storage::WriteOp>, Box<dyn FnOnce()>)>;
    /// A failure landed without changing the cluster (it was busy): if the
    /// cluster is free now, it checks its members (the operation's end may
    /// have been written before this failure was).
    fn landed(&self);
    /// One of its instance actors failed (a panic in a turn, an operator's
    /// kill): the cluster's actor fails with it, `why` (one_for_all).
    fn linked_failed(&self, why: String);
}
