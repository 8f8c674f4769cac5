//! Multi-step cluster operations (DESIGN.md §6).
//!
//! An operation is a [`Plan`]: an ordered list of [`Step`]s, each an
//! [`Action`] on a set of instances and, where the action changes the world,
//! an undo action. [`runner::run`] executes a plan against an
//! [`OperationContext`], journals every step by name, fails a step that
//! passes its deadline, and on failure undoes the completed steps in reverse.
//!
//! This module knows nothing of actix or HTTP: the cluster actor implements
//! `OperationContext`, and the unit tests use a fake one. Each file below
//! builds the plans of some operations (`create`, `lifecycle`, `scale`,
//! `change`: config, upgrade, resize; `delete`; `await_nodes`: placement
//! waiting for a node request; `replace`: a member moved to another node); `world` (tests only) is a
//! model of a cluster on which every plan is failed at each step (the real
//! system's counterpart, with each step also run twice across a master
//! restart, is `tests/integration/faults_steps/`). A plan is journaled with
//! its operation, so a master restart resumes it (see [`runner::run`]).

pub mod await_nodes;
pub mod change;
pub mod create;
pub mod delete;
pub mod lifecycle;
pub mod replace;
pub mod runner;
#[cfg(test)]
mod runner_props;
pub mod scale;
#[cfg(test)]
mod world;

use std::time::Duration;

pub use crate::storage::plan::{Action, Hook, Plan, Rolling, Step};
use crate::storage::records::{ClusterStatus, InstanceResult, OperationRecord};

/// Why a step failed, with the per-instance results that show it.
#[derive(Debug, Clone, PartialEq)]
pub struct StepFailure {
    pub message: String,
    pub results: Vec<InstanceResult>,
}

/// What a step may do to the world. The cluster actor implements it over
/// instance actors and storage; tests implement it with a fake.
#[allow(async_fn_in_trait)] // implementations run on one actix arbiter; no Send bound wanted
pub trait OperationContext {
    /// Runs one action to completion. Must be idempotent. The commands it
    /// sends must finish on their own even if this future is dropped (the
    /// watchdog stops waiting, it does not cancel work mid-way).
    async fn run_action(&self, action: &Action) -> Result<Vec<InstanceResult>, StepFailure>;
    /// Makes the record durable and visible (journal), before returning,
    /// with the results of the steps `steps`: those whose results changed
    /// since the last journal write that succeeded (the others' are stored
    /// already). Retries a write that fails for a moment; an error means
    /// the journal cannot be written, and the runner stops the operation.
    async fn journal(&self, record: &OperationRecord, steps: &[usize]) -> Result<(), String>;
    /// Shows a cluster status while a step runs.
    async fn set_status(&self, status: ClusterStatus, description: &str) -> Result<(), String>;
    /// Records the operation's end: the final record (status set), with
    /// the results of the steps `steps` (those no journal write carried),
    /// made durable and visible together with whatever the end changes (the
    /// cluster's status), so no reader sees one without the other.
    async fn complete(
        &self,
        record: &OperationRecord,
        steps: &[usize],
        outcome: &runner::Outcome,
    ) -> Result<(), String>;
    /// How long `action` may go without progress before the watchdog
    /// fails its step.
    fn deadline(&self, action: &Action) -> Duration;
    /// A counter that moves whenever the operation's work moves (a command
    /// answered, a package chunk sent): a step is failed only when it stays
    /// still for a whole `deadline`, so a big step is not cut short while
    /// it advances, and a stuck one is.
    fn progress(&self) -> u64;
}
