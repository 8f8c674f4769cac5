//! The cluster actor's implementation of [`OperationContext`]: how each
//! [`Action`] of a plan reaches instance actors, storage and the read model.
//!
//! Commands to several instances run in parallel; each runs to completion in
//! its own task (see `InstanceActor::run`), so the runner's watchdog can stop
//! waiting without cancelling a command half-way.

use std::cell::RefCell;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use actix::Addr;
use time::OffsetDateTime;

use super::Core;
use super::writes::{JOURNAL_RETRIES, cluster_writes, commit_retrying, commit_until_landed};
use crate::actors::Shared;
use crate::actors::instance::{ClusterEnv, InstanceActor};
use crate::actors::read_model::Reservation;
use crate::actors::supervisor::{ClusterGone, Escalate, Supervisor};
use crate::ids::InstanceId;
use crate::operations::runner::Outcome;
use crate::operations::{Action, OperationContext, StepFailure};
use crate::spec::ComponentSpec;
use crate::storage::keys::nanos;
use crate::storage::records::{
    ClusterRecord, ClusterStatus, InstanceRecord, InstanceResult, LeftoverRecord, OperationKind, OperationRecord,
    PackageRecord, RECORD_VERSION, StepStatus,
};
use crate::storage::{WriteOp, events};

pub(super) struct ClusterOps {
    pub core: Rc<RefCell<Core>>,
    pub env: Rc<ClusterEnv>,
    pub shared: Shared,
    pub kind: OperationKind,
    /// A force delete: what cannot be removed now is remembered as leftovers.
    pub force: bool,
    /// The cluster's status when the operation succeeds (None: unchanged).
    pub on_success: Option<ClusterStatus>,
    pub supervisor: Addr<Supervisor>,
    /// Step statuses as last journaled: a journal write appends an event
    /// for each step whose status changed since.
    pub journaled: RefCell<Vec<StepStatus>>,
    /// The operation and the step that runs now (as last journaled), for
    /// `operation.progress` events.
    pub running: RefCell<Option<(String, usize)>>,
    /// The operation's end is durable (and published).
    pub ended: std::cell::Cell<bool>,
    /// The running operation and what a master restart resumes it from,
    /// as journaled (`op_plans`): a step placing instances after a node
    /// request writes it again.
    pub plan: RefCell<Option<(crate::ids::OperationId, crate::storage::records::Resumable)>>,
    /// Nodes the operation has placed instances on that are not created
    /// yet, counted in the removal gate until it ends, so no pool retires
    /// them meanwhile (`read_model::removals`).
    pub holds: RefCell<Vec<crate::actors::read_model::removals::Allocating>>,
}

/// How often a running step's progress may become an event.
const PROGRESS_EVERY: Duration = Duration::from_secs(1);

/// The cluster's package as its record names it now (an upgrade changes it
/// mid-operation, and its undo changes it back). Shared, never copied.
pub(super) struct CurrentPackage {
    pub record: Arc<PackageRecord>,
    pub spec: Arc<ComponentSpec>,
    pub blob: PathBuf,
}

impl ClusterOps {
    /// The members that are `Failed` or `Lost`, named (at most a few) with
    /// why, as a cluster's `Error` says it; `None` when there are none.
    pub(super) fn failed_members(&self) -> Option<String> {
        super::failures::failed_members(&self.core.borrow())
    }

    pub(super) fn cluster_name(&self) -> String {
        self.core.borrow().record.name.clone()
    }

    pub(super) fn current(&self) -> Result<CurrentPackage, String> {
        let pkg = self.core.borrow().record.package.clone();
        let p = self.shared.read_model.package(&pkg.name, &pkg.version).ok_or(format!("package {pkg} is missing"))?;
        let blob = self.shared.blobs.path_for(&p.record.sha256).map_err(|e| e.to_string())?;
        Ok(CurrentPackage { record: p.record, spec: p.spec, blob })
    }

    async fn allocate(&self, ids: &[InstanceId]) -> Result<Vec<InstanceResult>, StepFailure> {
        let records: Vec<InstanceRecord> = {
            let core = self.core.borrow();
            ids.iter()
                .filter(|id| !core.instances.contains_key(*id))
                .filter_map(|id| core.pending.get(id).cloned())
                .collect()
        };
        // Counted in until the instances are indexed on their nodes: a pool
        // removing one of them waits for it, or has marked it first and
        // this allocation fails (`read_model::removals`).
        let nodes: Vec<_> = records.iter().map(|r| r.node.clone()).collect();
        let _allocating = self.shared.read_model.removals.begin_allocate(&nodes).map_err(|node| {
            fail(format!("node {node} is being removed by its pool; place the instances again (a new operation)"))
        })?;
        let mut ops = Vec::with_capacity(records.len());
        for r in &records {
            ops.push(WriteOp::put_instance(r).map_err(|e| fail(e.to_string()))?);
            ops.push(events::append(&events::instance("instance.added", r)).map_err(|e| fail(e.to_string()))?);
        }
        if !ops.is_empty() {
            self.shared.store.commit(ops).await.map_err(|e| fail(format!("cannot persist new instances: {e}")))?;
            self.shared.read_model.count_transitions(records.len() as u64);
        }
        let mut results = Vec::with_capacity(records.len());
        let mut by_node: std::collections::BTreeMap<_, Vec<_>> = std::collections::BTreeMap::new();
        let cluster: Arc<str> = Arc::from(self.cluster_name().as_str());
        let handles: Vec<_> = records.iter().map(|r| InstanceActor::quiet(r.clone(), self.env.clone())).collect();
        self.env.cell.put_instances(handles.iter().map(|h| h.entry()));
        for (r, handle) in records.into_iter().zip(handles) {
            by_node.entry(r.node.clone()).or_default().push((r.id.clone(), cluster.clone()));
            let mut core = self.core.borrow_mut();
            core.pending.remove(&r.id);
            core.instances.insert(r.id.clone(), handle);
            let ports: Vec<String> = r.ports.iter().map(|(k, v)| format!("{k}={v}")).collect();
            results.push(InstanceResult::ok(&r.id, format!("allocated on {} ({})", r.node, ports.join(", "))));
        }
        for (node, ids) in by_node {
            if let Some(n) = self.shared.read_model.node(&node) {
                n.add_instances(&ids);
            }
        }
        Ok(results)
    }

    async fn forget(&self, ids: &[InstanceId]) -> Result<Vec<InstanceResult>, StepFailure> {
        let cluster_id = self.core.borrow().record.id;
        let mut ops: Vec<WriteOp> = ids.iter().map(|id| WriteOp::delete_instance(&cluster_id, id)).collect();
        // Before the delete is queued: work still queued on these
        // instances must not write their records back after it.
        let handles: Vec<_> = ids.iter().filter_map(|id| self.core.borrow().instances.get(id).cloned()).collect();
        for h in &handles {
            ops.push(
                events::append(&events::instance("instance.removed", &h.record())).map_err(|e| fail(e.to_string()))?,
            );
        }
        for h in &handles {
            h.set_forgotten(true);
        }
        if let Err(e) = self.shared.store.commit(ops).await {
            for h in &handles {
                h.set_forgotten(false);
            }
            return Err(fail(format!("cannot remove instance records: {e}")));
        }
        self.shared.read_model.count_transitions(ids.len() as u64);
        self.env.cell.remove_instances(ids);
        let leftovers = self.shared.read_model.leftovers();
        let mut results = Vec::with_capacity(ids.len());
        for id in ids {
            let removed = self.core.borrow_mut().instances.remove(id).map(|h| h.record());
            match removed {
                Some(r) => {
                    if let Some(n) = self.shared.read_model.node(&r.node) {
                        n.remove_instances(std::slice::from_ref(id));
                    }
                    // A leftover may still run and hold its ports: they are
                    // released when it is removed from its node.
                    if leftovers.contains_key(id) {
                        results.push(InstanceResult::ok(id, "forgotten; ports kept until its node removes it"));
                    } else {
                        self.shared.ports.release(&r.node, r.ports.values().copied());
                        results.push(InstanceResult::ok(id, "forgotten; ports released"));
                    }
                }
                None => results.push(InstanceResult::ok(id, "already forgotten")),
            }
        }
        Ok(results)
    }

    /// Remembers instances a force delete could not remove from their agents.
    pub(super) async fn remember_leftovers(&self, instances: &[Arc<InstanceRecord>]) {
        let now = OffsetDateTime::now_utc();
        let records: Vec<LeftoverRecord> = instances
            .iter()
            .map(|i| LeftoverRecord {
                version: RECORD_VERSION,
                instance: i.id.clone(),
                node: i.node.clone(),
                cluster: i.cluster.to_string(),
                ports: i.ports.values().copied().collect(),
                reason: i.last_error.clone().unwrap_or_else(|| "not removed by a force delete".into()),
                at: now,
            })
            .collect();
        let ops: Result<Vec<_>, _> = records.iter().map(WriteOp::put_leftover).collect();
        match ops {
            Ok(ops) => match self.shared.store.commit(ops).await {
                Ok(()) => {
                    for r in &records {
                        tracing::warn!(instance = %r.instance, node = %r.node, "left on its node by a force delete; removed when the agent reconnects");
                    }
                    self.shared.read_model.put_leftovers(&records);
                }
                Err(e) => tracing::error!(error = %e, "cannot record the leftovers of a force delete"),
            },
            Err(e) => tracing::error!(error = %e, "cannot encode leftovers"),
        }
    }

    /// Changes the cluster's definition durably (SetPackage/SetConfig/SetLimits).
    async fn define(&self, action: &Action) -> Result<Vec<InstanceResult>, StepFailure> {
        if let Action::SetPackage(p) = action
            && self.shared.read_model.package(&p.name, &p.version).is_none()
        {
            return Err(fail(format!("package {p} is not uploaded")));
        }
        let params = match action {
            Action::SetPackage(p) => self.shared.read_model.package(&p.name, &p.version).map(|v| v.spec.config.clone()),
            _ => None,
        };
        self.save_cluster(|r| match action {
            Action::SetPackage(p) => {
                r.package = p.clone();
                if let Some(params) = &params {
                    crate::spec::config::hide_secrets(&mut r.config, params);
                }
            }
            Action::SetConfig(c) => r.config = c.clone(),
            Action::SetLimits { role, limits } => r.roles.entry(role.clone()).or_default().limits = *limits,
            _ => {}
        })
        .await
        .map_err(fail)?;
        Ok(Vec::new())
    }

    /// The writes that delete the oldest ended operations past the
    /// retention limit once `op` is counted among the ended ones, and the
    /// history that leaves (to keep once the writes are durable).
    fn retention(
        &self,
        op: &OperationRecord,
    ) -> (Vec<WriteOp>, std::collections::VecDeque<(u64, crate::ids::OperationId)>) {
        let keep = self.shared.limits.operations_retained.max(1);
        let core = self.core.borrow();
        let cluster = core.record.id;
        let mut history = core.history.clone();
        history.push_back((nanos(op.created_at), op.id));
        let mut writes = Vec::new();
        while history.len() > keep {
            if let Some((created, id)) = history.pop_front() {
                writes.extend(WriteOp::delete_operation(&id, &cluster, created));
            }
        }
        (writes, history)
    }
}

pub(super) fn fail(message: String) -> StepFailure {
    StepFailure { message, results: Vec::new() }
}

impl ClusterOps {
    /// Runs `action`, appending an `operation.progress` event each second
    /// in which its instance commands moved on.
    async fn run_reporting(&self, action: &Action) -> Result<Vec<InstanceResult>, StepFailure> {
        let started = std::time::Instant::now();
        let r = self.run_with_progress(action).await;
        let result = if r.is_ok() { "ok" } else { "failed" };
        metrics::histogram!("flotilla_step_duration_seconds", "action" => action.label(), "result" => result)
            .record(started.elapsed().as_secs_f64());
        r
    }

    async fn run_with_progress(&self, action: &Action) -> Result<Vec<InstanceResult>, StepFailure> {
        let work = self.run_action_now(action);
        tokio::pin!(work);
        let mut seen = self.progress();
        let answered = || self.env.answered.load(Ordering::Relaxed);
        let base = answered();
        // Steps that send each instance one command say how many of them
        // are answered; a rolling step sends each several (stop, install,
        // start; or files, then a reload or restart) and says only that it
        // moves (`total` 0).
        let one_each = matches!(
            action,
            Action::Install(_) | Action::WriteFiles(_) | Action::Start(_) | Action::Stop(_) | Action::DeleteOnAgent(_)
        );
        let total = if one_each { action.instances().len() } else { 0 };
        loop {
            match tokio::time::timeout(PROGRESS_EVERY, &mut work).await {
                Ok(r) => return r,
                Err(_) => {
                    let now = self.progress();
                    if now != seen
                        && let Some((op, step)) = self.running.borrow().clone()
                    {
                        let done = if one_each { (answered() - base).min(total as u64) } else { answered() - base };
                        let e = events::progress(&op, &self.cluster_name(), step, done, total);
                        crate::actors::announce::announce(&self.shared, vec![e]);
                    }
                    seen = now;
                }
            }
        }
    }

    async fn run_action_now(&self, action: &Action) -> Result<Vec<InstanceResult>, StepFailure> {
        match action {
            Action::Allocate(ids) => self.allocate(ids).await,
            Action::Forget(ids) => self.forget(ids).await,
            Action::Install(ids) => self.install(ids).await,
            Action::WriteFiles(ids) => self.write_files(ids).await,
            Action::Start(ids) => self.start(ids).await,
            Action::Stop(ids) => self.stop_each(ids).await,
            Action::DeleteOnAgent(ids) => self.delete_on_agents(ids).await,
            Action::Hook { hook, ids } => self.hook(*hook, ids).await,
            Action::Reconfigure(r) => self.reconfigure(r).await,
            Action::RefreshFiles(r) => self.refresh_files(r).await,
            Action::Roll(r) => self.roll(r).await,
            Action::SetPackage(_) | Action::SetConfig(_) | Action::SetLimits { .. } => self.define(action).await,
            Action::AwaitNodes { role, first_ordinal, nodes, ids } => {
                self.await_nodes(role, *first_ordinal, *nodes, ids).await
            }
        }
    }
}

impl OperationContext for ClusterOps {
    async fn run_action(&self, action: &Action) -> Result<Vec<InstanceResult>, StepFailure> {
        self.run_reporting(action).await
    }

    async fn journal(&self, record: &OperationRecord, steps: &[usize]) -> Result<(), String> {
        let mut ops = vec![WriteOp::put_operation(record).map_err(|e| e.to_string())?];
        // Every step not yet written, not only the last: a failed write
        // left the earlier ones to this one.
        for &i in steps {
            if let Some(s) = record.steps.get(i) {
                ops.push(WriteOp::put_step_results(&record.id, i, &s.results).map_err(|e| e.to_string())?);
            }
        }
        for e in events::steps_changed(&self.journaled.borrow(), record) {
            ops.push(events::append(&e).map_err(|e| e.to_string())?);
        }
        commit_retrying(&self.shared, ops, &JOURNAL_RETRIES, "the journal of an operation")
            .await
            .map_err(|e| crate::error::ErrorChain(&e).to_string())?;
        *self.journaled.borrow_mut() = record.steps.iter().map(|s| s.status).collect();
        let running = record.steps.iter().position(|s| matches!(s.status, StepStatus::Running | StepStatus::Undoing));
        *self.running.borrow_mut() = running.map(|i| (record.id.to_string(), i));
        self.shared.read_model.put_operation(record);
        Ok(())
    }

    async fn complete(&self, record: &OperationRecord, steps: &[usize], outcome: &Outcome) -> Result<(), String> {
        let verb = format!("{:?}", self.kind).to_lowercase();
        let name = self.cluster_name();
        let kind = format!("{:?}", self.kind);
        metrics::counter!("flotilla_operations_total", "kind" => kind, "result" => format!("{:?}", record.status))
            .increment(1);
        // A node request it filed and no longer waits for is cancelled.
        if let Some(pools) = self.shared.pools.get() {
            let why = format!("operation {} ended {:?}", record.id, record.status);
            pools.cancel(format!("operation:{}/", record.id), why);
        }
        // An ended operation keeps no plan: nothing will resume it.
        let mut ended = record.clone();
        ended.resume = None;
        let mut end =
            vec![WriteOp::put_operation(&ended).map_err(|e| e.to_string())?, WriteOp::delete_op_plan(&ended.id)];
        // Results no journal write carried (the last one failed).
        for &i in steps {
            if let Some(s) = ended.steps.get(i) {
                end.push(WriteOp::put_step_results(&ended.id, i, &s.results).map_err(|e| e.to_string())?);
            }
        }
        // Step changes a failed journal write left unannounced, then the end.
        for e in events::steps_changed(&self.journaled.borrow(), &ended) {
            end.push(events::append(&e).map_err(|e| e.to_string())?);
        }
        end.push(events::append(&events::operation("operation.ended", &ended)).map_err(|e| e.to_string())?);
        if self.kind == OperationKind::Delete && *outcome == Outcome::Succeeded {
            let cluster_id = self.core.borrow().record.id;
            let gone =
                events::event("cluster.deleted", Some(&name), serde_json::json!({ "id": cluster_id.to_string() }));
            let mut ops = vec![WriteOp::delete_cluster(&cluster_id), events::append(&gone).map_err(|e| e.to_string())?];
            ops.append(&mut end);
            commit_until_landed(&self.shared, "the end of a delete", || Ok(ops.clone()))
                .await
                .map_err(|e| format!("the end of the delete is not recorded ({e}); the cluster stays busy with it until the master restarts"))?;
            self.ended.set(true);
            self.shared.read_model.remove_cluster(&name);
            // The name is free before anyone can see the delete has ended.
            let slot = Reservation::counted(&self.shared.supervisor);
            let mut operations: Vec<_> = self.core.borrow().history.iter().copied().collect();
            operations.push((nanos(ended.created_at), ended.id));
            let gone = ClusterGone { name, cluster: cluster_id, operations, slot };
            let _ = self.supervisor.send(gone).await;
            self.shared.read_model.put_operation(&ended);
            return Ok(());
        }
        let (status, description, escalate) = match outcome {
            Outcome::Succeeded => (self.on_success, format!("{verb} succeeded"), false),
            Outcome::Failed { step, error, rolled_back: true, .. }
                if matches!(
                    self.kind,
                    OperationKind::ScaleOut
                        | OperationKind::ScaleIn
                        | OperationKind::Upgrade
                        | OperationKind::Reconfigure
                        | OperationKind::Resize
                        | OperationKind::Replace
                ) =>
            {
                // Sahara: a change rolled back (or vetoed by a hook before it
                // changed anything) leaves the cluster Active, with the reason.
                (
                    Some(ClusterStatus::Active),
                    format!("{verb} failed at step {step} and was rolled back: {error}"),
                    false,
                )
            }
            Outcome::Failed { step, error, undone, not_put_back, .. } => {
                let tail = if *undone {
                    String::new()
                } else {
                    format!("; the rollback failed too, not put back: {}", not_put_back.join("; "))
                };
                (Some(ClusterStatus::Error), format!("{verb} failed at step {step}: {error}{tail}"), true)
            }
            Outcome::Halted { step, error } => (
                Some(ClusterStatus::Error),
                format!(
                    "{verb} stopped at step {step}: {error}; check the instances, then start, stop or delete the cluster"
                ),
                true,
            ),
        };
        // The cluster as the operation leaves it: the actor's record changes
        // (and the cluster stops being busy) only once the end is durable.
        // An operation that leaves an Active cluster with a failed member
        // (one that died while it ran, on a member it did not touch) leaves
        // it in Error, naming the member, in the same batch.
        let leave = |failed: &Option<String>, r: &mut ClusterRecord| {
            if let Some(s) = status {
                r.status = s;
            }
            r.status_description = description.clone();
            if r.status == ClusterStatus::Active
                && let Some(members) = failed
            {
                r.status = ClusterStatus::Error;
                r.status_description = format!("{description}, but {members}");
            }
            r.operation = None;
        };
        // In turn with the other writes of the cluster record (a member's
        // failure waits, and then finds the cluster free and as this end
        // leaves it).
        let _turn = self.env.record_writes.lock().await;
        let mut failed = None;
        // One batch: the cluster's new status, the operation's end and the
        // history past retention, durable together and published cluster
        // first, so whoever sees the operation ended sees the cluster as it
        // left it.
        let (trim, history) = self.retention(&ended);
        let mut written = None;
        // Tried until it lands: a write that fails is never only logged. A
        // store frozen by a shutdown leaves the end unpublished and the
        // cluster busy with the operation: clients never see an end the
        // store does not hold, and the next master resumes the operation
        // (or ends it) from its journal.
        let landed = commit_until_landed(&self.shared, "the end of an operation", || {
            // Decided at each try, from the members as they are then.
            failed = self.failed_members();
            let (snapshot, mut ops) = cluster_writes(&self.core.borrow().record, &|r| leave(&failed, r))?;
            ops.extend(end.iter().cloned());
            ops.extend(trim.iter().cloned());
            written = Some(snapshot);
            Ok(ops)
        })
        .await;
        if let Err(e) = landed {
            return Err(format!(
                "the end of the operation is not recorded ({e}); the cluster stays busy with it until the master restarts"
            ));
        }
        let snapshot = written.expect("a landed write was built");
        let escalate = escalate || (snapshot.status == ClusterStatus::Error && failed.is_some());
        let description = snapshot.status_description.clone();
        {
            let mut core = self.core.borrow_mut();
            // Instances placed for this operation that it never created
            // (it failed before its allocate step) give their ports back.
            for p in std::mem::take(&mut core.pending).into_values() {
                self.shared.ports.release(&p.node, p.ports.values().copied());
            }
            leave(&failed, &mut core.record);
            core.record.updated_at = snapshot.updated_at;
            core.history = history;
        }
        self.ended.set(true);
        self.env.cell.set_record(snapshot);
        self.shared.read_model.put_operation(&ended);
        if escalate {
            let slot = Reservation::counted(&self.shared.supervisor);
            self.supervisor.do_send(Escalate { slot, cluster: name, operation: Some(record.id), description });
        }
        Ok(())
    }

    async fn set_status(&self, status: ClusterStatus, description: &str) -> Result<(), String> {
        self.save_cluster(|r| {
            r.status = status;
            r.status_description = description.to_string();
        })
        .await
    }

    /// How long a step may go without progress: long enough for the
    /// slowest single thing it waits for (a stop's grace, a start's health
    /// wait, a hook, one rolling batch).
    fn deadline(&self, action: &Action) -> Duration {
        let base = self.shared.timing.step_idle();
        let Ok(current) = self.current() else { return base };
        let spec = &current.spec;
        let max = |f: fn(&crate::spec::RoleSpec) -> Duration| spec.roles.iter().map(f).max().unwrap_or_default();
        // Stop may run a stop command and then wait out each instance's
        // grace period before the KILL; start waits for health.
        let stop = max(|r| r.stop_grace) * 2;
        let start = max(|r| r.start_timeout);
        let hook = max(|r| r.hook_timeout);
        match action {
            Action::Stop(_) | Action::DeleteOnAgent(_) => base + stop,
            Action::Hook { .. } => base + hook,
            // A reload (hook + health) or a restart (stop + start); a start
            // applies what a running member owes for its files too.
            Action::Reconfigure(_) | Action::Start(_) => base + stop + start + hook,
            // Stop, install, start.
            Action::Roll(_) => base * 2 + stop + start,
            // Every launch try of the slowest pool, with nothing of its
            // request changing meanwhile (known from the config: a step
            // resumed at boot starts before the pools run).
            Action::AwaitNodes { .. } => base + self.shared.timing.pool_quiet,
            _ => base,
        }
    }

    fn progress(&self) -> u64 {
        self.env.progress.load(Ordering::Relaxed)
    }
}
