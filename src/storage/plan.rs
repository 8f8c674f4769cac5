//! The plan of an operation: an ordered list of [`Step`]s, each an
//! [`Action`] on a set of instances with the actions that undo it. Defined
//! here, below `operations/` (which builds and runs plans), because a plan
//! is journaled with its operation and storage must not depend on the
//! layer above it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::cluster_types::{ClusterStatus, Limits, PackageRef};
use super::config_value::ConfigValue;
use crate::ids::InstanceId;

/// A lifecycle hook of the component spec (the AppCenter lifecycle).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Hook {
    /// Once, after the first install, before the first start.
    Init,
    /// On existing members after new ones run.
    ScaleOut,
    /// On the remaining members before the removed ones stop; non-zero vetoes.
    ScaleIn,
    /// On delete, after the stop; non-zero vetoes unless forced.
    Destroy,
}

impl Hook {
    pub fn name(self) -> &'static str {
        match self {
            Hook::Init => "init",
            Hook::ScaleOut => "scale_out",
            Hook::ScaleIn => "scale_in",
            Hook::Destroy => "destroy",
        }
    }
}

/// One thing a step does. Every action is idempotent: running it twice has
/// the effect of running it once (install replaces, start on a running
/// instance and stop on a stopped one succeed without doing anything, a
/// roll skips instances that are already up to date).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Action {
    /// Send the package and rendered files to the agents, in parallel.
    Install(Vec<InstanceId>),
    /// Start the processes, in parallel; waits until each is healthy.
    Start(Vec<InstanceId>),
    /// Stop the processes (the whole tree), in parallel.
    Stop(Vec<InstanceId>),
    /// Re-render and write the config files of these instances. Nothing is
    /// restarted (used before a first start).
    WriteFiles(Vec<InstanceId>),
    /// Re-render and write the files (and environment); then every instance
    /// of `running` whose files changed (or that a previous attempt left
    /// stopped) runs its role's `reload` hook, or is restarted, `batch`
    /// instances at a time, waiting for health between batches. The others
    /// are not touched.
    Reconfigure(Rolling),
    /// Brings each instance in line with the cluster's current package
    /// version and its role's limits (see `Applied`): stop, install, start
    /// (if it is in `running`), health, `batch` at a time. Instances already
    /// in line are skipped, except that one of `running` found stopped (a
    /// replace interrupted half-way) is started.
    Roll(Rolling),
    /// Runs a hook on the instances whose role defines it: equal role order
    /// in parallel, orders in sequence.
    Hook {
        hook: Hook,
        ids: Vec<InstanceId>,
    },
    /// Remove the instances from their agents (stop, delete the directory
    /// and the agent's records).
    DeleteOnAgent(Vec<InstanceId>),
    /// Create the master's records of new instances (placement, ordinal and
    /// ports were decided during validation and are in the operation's params).
    Allocate(Vec<InstanceId>),
    /// Forget the instances on the master and release their ports. Their
    /// ordinals stay used, so they are never handed out again.
    Forget(Vec<InstanceId>),
    /// Changes the cluster's definition (durably), nothing else: the package
    /// version, the config values, or a role's limits.
    SetPackage(PackageRef),
    SetConfig(BTreeMap<String, ConfigValue>),
    SetLimits {
        role: String,
        limits: Option<Limits>,
    },
    /// The operator's start, before its starts: [`Reconfigure`](Self::Reconfigure)
    /// for a cluster that may be out of line (an undo could not reach a
    /// member's node and left its files rendering a cluster that is no
    /// more). Every member's files are written again; those of `running`
    /// whose files changed are reloaded or restarted. One its node does not
    /// hold is left to the start after it, which installs it again. A
    /// member in line is not touched. (Appended last: stored plans name
    /// actions by position.)
    RefreshFiles(Rolling),
    /// Placement waiting for nodes: files a node request for `nodes` more
    /// nodes carrying the labels role `role` requires (requestor
    /// `operation:<id>/<role>`), waits until the pools have served it, then
    /// places `ids` (ordinals from `first_ordinal`, reserved when the plan
    /// was made) and journals where they go; the `allocate` step after it
    /// creates them. Run again after a master restart, it finds its request
    /// rather than filing another. Nothing to undo: the nodes belong to
    /// their pool, which gives them back by its own rules. (Appended last.)
    AwaitNodes {
        role: String,
        first_ordinal: u32,
        nodes: u32,
        ids: Vec<InstanceId>,
    },
}

impl Action {
    /// A short name of what it does (a metrics label; no ids).
    pub fn label(&self) -> &'static str {
        match self {
            Action::Install(_) => "install",
            Action::Start(_) => "start",
            Action::Stop(_) => "stop",
            Action::WriteFiles(_) => "write_files",
            Action::Reconfigure(_) => "reconfigure",
            Action::Roll(_) => "roll",
            Action::Hook { .. } => "hook",
            Action::DeleteOnAgent(_) => "delete_on_agent",
            Action::Allocate(_) => "allocate",
            Action::Forget(_) => "forget",
            Action::SetPackage(_) => "set_package",
            Action::SetConfig(_) => "set_config",
            Action::SetLimits { .. } => "set_limits",
            Action::RefreshFiles(_) => "refresh_files",
            Action::AwaitNodes { .. } => "await_nodes",
        }
    }

    /// The instances the action touches (empty for definition changes).
    pub fn instances(&self) -> &[InstanceId] {
        match self {
            Action::Install(v)
            | Action::Start(v)
            | Action::Stop(v)
            | Action::WriteFiles(v)
            | Action::DeleteOnAgent(v)
            | Action::Allocate(v)
            | Action::Forget(v)
            | Action::Reconfigure(Rolling { ids: v, .. })
            | Action::RefreshFiles(Rolling { ids: v, .. })
            | Action::Roll(Rolling { ids: v, .. })
            | Action::Hook { ids: v, .. }
            | Action::AwaitNodes { ids: v, .. } => v,
            Action::SetPackage(_) | Action::SetConfig(_) | Action::SetLimits { .. } => &[],
        }
    }

    /// An instance action with no instances does nothing.
    pub fn is_noop(&self) -> bool {
        match self {
            Action::SetPackage(_) | Action::SetConfig(_) | Action::SetLimits { .. } => false,
            _ => self.instances().is_empty(),
        }
    }
}

/// The instances a rolling action touches, how many at a time, and which of
/// them must be running when it is done. `running` is decided when the plan
/// is made and journaled with it, so a step that runs again after a master
/// restart, or an undo after a half-done replace, never mistakes an instance
/// the action stopped itself for one the operator stopped.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Rolling {
    pub ids: Vec<InstanceId>,
    pub batch: usize,
    pub running: Vec<InstanceId>,
}

impl Rolling {
    /// Every one of `ids` runs.
    pub fn all_running(ids: &[InstanceId], batch: usize) -> Rolling {
        Rolling { ids: ids.to_vec(), batch, running: ids.to_vec() }
    }
}

/// One step of a plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Step {
    /// Unique within the plan; the journal key (e.g. `start-order-0`).
    pub name: String,
    /// The cluster status to show while this step runs, if it changes.
    pub status: Option<ClusterStatus>,
    pub action: Action,
    /// Run in order to put back what the action did. Empty when there is
    /// nothing to put back; the plan builder says why in a comment.
    pub undo: Vec<Action>,
    /// True when a failure can be fully rolled back past this step: it has
    /// an undo, or an earlier step's undo covers it, or it changes nothing
    /// (a vetoing hook). An operation whose failure passed a step that is
    /// not reversible ends `Failed`, never `RolledBack`.
    pub reversible: bool,
    /// A failure of this step is recorded but does not fail the operation
    /// (force delete: clean what can be cleaned, say what could not).
    pub best_effort: bool,
}

impl Step {
    pub fn new(name: impl Into<String>, status: Option<ClusterStatus>, action: Action, undo: Vec<Action>) -> Self {
        let mut undo = undo;
        undo.retain(|a| !a.is_noop());
        let reversible = !undo.is_empty();
        Step { name: name.into(), status, action, undo, reversible, best_effort: false }
    }

    /// Marks a step whose effect an earlier step's undo puts back, or that
    /// has no effect to put back.
    pub fn covered_by_earlier_undo(mut self) -> Self {
        self.reversible = true;
        self
    }

    pub fn best_effort(mut self, yes: bool) -> Self {
        self.best_effort = yes;
        self
    }
}

/// The steps of one operation.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Plan {
    pub steps: Vec<Step>,
}

impl Plan {
    pub fn push(&mut self, step: Step) {
        // A step with no instances does nothing; leaving it out keeps the
        // journal honest about what ran.
        if !step.action.is_noop() {
            self.steps.push(step);
        }
    }
}
