//! How the instance actions of a plan reach the instances: in parallel for
//! plain actions, by role order for hooks, and batch by batch, health-gated,
//! for the rolling ones (reconfigure, roll).
//!
//! A rolling action's batch is the request's `batch` when it gave one, else
//! a quarter of the role's members (`max_unavailable` = 25 %, at least one),
//! and always one at a time in a quorum role (`odd = true`): so a change to
//! a role of 1,000 takes four rounds, not a thousand, while a ZooKeeper
//! ensemble never loses two members at once.
//!
//! Every command runs to completion in its own task (see
//! `InstanceActor::run`), so the runner's watchdog can stop waiting without
//! cancelling a command half-way.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::StreamExt;
use futures::future::join_all;

use super::ops::{ClusterOps, CurrentPackage, fail};
use crate::actors::instance::{ChangeRule, InstanceCmd, InstanceHandle, InstanceOutcome, Window};
use crate::actors::render::RenderBase;
use crate::ids::InstanceId;
use crate::operations::{Hook, Rolling, StepFailure};
use crate::spec::RoleSpec;
use crate::storage::records::{ClusterRecord, InstanceRecord, InstanceResult, InstanceStatus, PendingRestart};

/// The share of a role a rolling action takes down at once, in percent.
pub const MAX_UNAVAILABLE_PERCENT: usize = 25;

/// Commands of one step in flight at once (a start until its process is
/// spawned, see [`STEP_BEGUN`]). A step over 10,000 instances
/// still sends them all, but holds at most this many commands (and their
/// rendered files) in memory at a time; more would only queue behind the
/// links' own limits, and would slow the other starts on the same nodes
/// (`bench real`: an instance started through the API during a scale-up of
/// 1,000 took up to 0.33, 0.56 and 2.56 s in three runs at 1,024 at a time,
/// 0.56-0.59 s at 256).
pub const STEP_CONCURRENCY: usize = 256;

/// Commands of one step begun and not yet answered, those past their
/// window included: starts whose process is spawned and that wait out
/// their settle window or health check ([`Window`]). At 1 s of settle and
/// about 1,300 spawns a second, a scale-up has some 1,300 starts settling
/// at once; each holds an answer to wait for, no files.
pub const STEP_BEGUN: usize = 4096;

/// Stops and deletes in flight at once. They carry no files, and an agent
/// serves the stops waiting at the same time with one pass over `/proc`
/// (stops of a role with a stop command stay at [`STEP_CONCURRENCY`]: each
/// runs a program, e.g. a JVM's drain):
/// a scale-in of 999 real instances took 0.66-0.83 s in six runs with all
/// of them in flight, 0.70-1.13 s in five at 256 (four rounds of passes per
/// step).
pub const TEARDOWN_CONCURRENCY: usize = 1024;

/// What one rendering pass needs, owned (a [`RenderBase`] borrows it).
struct Pass {
    current: CurrentPackage,
    cluster: ClusterRecord,
    members: Vec<Arc<InstanceRecord>>,
}

impl ClusterOps {
    fn pass(&self) -> Result<Pass, String> {
        let current = self.current()?;
        let core = self.core.borrow();
        Ok(Pass { current, cluster: core.record.clone(), members: core.members() })
    }

    fn handle(&self, id: &InstanceId) -> Option<InstanceHandle> {
        self.core.borrow().instances.get(id).cloned()
    }

    /// Runs `cmd_for(id)` on every instance, [`STEP_CONCURRENCY`] at a
    /// time (each command is made, rendered files and all, only when its
    /// turn comes; a start's turn ends once its process is spawned, see
    /// [`Window`]); every outcome, in the order of `ids`.
    async fn on_each(
        &self,
        ids: &[InstanceId],
        cmd_for: impl Fn(&InstanceId) -> Result<InstanceCmd, String>,
    ) -> Vec<InstanceOutcome> {
        self.on_each_at(ids, STEP_CONCURRENCY, cmd_for).await
    }

    /// [`on_each`](Self::on_each) with `limit` commands in flight.
    async fn on_each_at(
        &self,
        ids: &[InstanceId],
        limit: usize,
        cmd_for: impl Fn(&InstanceId) -> Result<InstanceCmd, String>,
    ) -> Vec<InstanceOutcome> {
        let cmd_for = &cmd_for;
        let gate = &self.env.priority;
        let window = &Arc::new(tokio::sync::Semaphore::new(limit));
        futures::stream::iter(ids)
            .map(|id| {
                gate.gated(async move {
                    // Taken in the order of `ids` (the semaphore is fair),
                    // held until the command ends, or a start's spawn.
                    let place = match window.clone().acquire_owned().await {
                        Ok(p) => Window::new(p),
                        Err(_) => return InstanceResult::failed(id, "the step's window is closed").into(),
                    };
                    match (self.handle(id), cmd_for(id)) {
                        (Some(h), Ok(cmd)) => h.run(cmd.in_window(&place)).await,
                        (None, _) => {
                            InstanceResult::failed(id, format!("instance {id} is not part of this cluster")).into()
                        }
                        (_, Err(e)) => InstanceResult::failed(id, e).into(),
                    }
                })
            })
            .buffered(limit.max(STEP_BEGUN))
            .collect()
            .await
    }

    /// Stops every instance, [`TEARDOWN_CONCURRENCY`] at a time, or
    /// [`STEP_CONCURRENCY`] when a role among them has a stop command.
    pub(super) async fn stop_each(&self, ids: &[InstanceId]) -> Result<Vec<InstanceResult>, StepFailure> {
        let commands: Vec<String> = match self.current() {
            Ok(c) => c.spec.roles.iter().filter(|r| r.stop.is_some()).map(|r| r.name.clone()).collect(),
            Err(_) => Vec::new(),
        };
        let runs_a_command =
            |id: &InstanceId| self.record_of(id).is_ok_and(|r| commands.iter().any(|name| *name == *r.role));
        let limit = if !commands.is_empty() && ids.iter().any(runs_a_command) {
            STEP_CONCURRENCY
        } else {
            TEARDOWN_CONCURRENCY
        };
        let outcomes = self.on_each_at(ids, limit, |_| Ok(InstanceCmd::Stop)).await;
        checked(outcomes.into_iter().map(|o| o.result).collect())
    }

    /// [`on_each`](Self::on_each), failing the step when any instance failed.
    pub(super) async fn on_each_checked(
        &self,
        ids: &[InstanceId],
        cmd_for: impl Fn(&InstanceId) -> Result<InstanceCmd, String>,
    ) -> Result<Vec<InstanceResult>, StepFailure> {
        checked(self.on_each(ids, cmd_for).await.into_iter().map(|o| o.result).collect())
    }

    fn record_of(&self, id: &InstanceId) -> Result<Arc<InstanceRecord>, String> {
        self.handle(id).map(|h| h.record()).ok_or_else(|| format!("instance {id} has no record"))
    }

    fn role_of(&self, id: &InstanceId) -> Result<RoleSpec, String> {
        let inst = self.record_of(id)?;
        let current = self.current()?;
        current.spec.role(&inst.role).cloned().ok_or_else(|| format!("role {} is not in the package's spec", inst.role))
    }

    fn install_cmd(&self, base: &RenderBase, pass: &Pass, id: &InstanceId) -> Result<InstanceCmd, String> {
        let inst = self.record_of(id)?;
        let payload = base
            .install_payload(&inst, &pass.current.record, pass.current.blob.clone())
            .map_err(|e| format!("rendering {id}: {e}"))?;
        Ok(InstanceCmd::Install(Box::new(payload)))
    }

    fn files_cmd(&self, base: &RenderBase, pass: &Pass, id: &InstanceId) -> Result<InstanceCmd, String> {
        let inst = self.record_of(id)?;
        let (files, env) = base.files_and_env(&inst).map_err(|e| format!("rendering {id}: {e}"))?;
        let rule = ChangeRule { spec: pass.current.spec.clone(), role: inst.role.clone() };
        Ok(InstanceCmd::WriteFiles { files, env, rule })
    }

    pub(super) async fn install(&self, ids: &[InstanceId]) -> Result<Vec<InstanceResult>, StepFailure> {
        let pass = self.pass().map_err(fail)?;
        let base = RenderBase::new(&pass.current.spec, &pass.cluster, &pass.members, &self.shared.read_model);
        self.on_each_checked(ids, |id| self.install_cmd(&base, &pass, id)).await
    }

    pub(super) async fn write_files(&self, ids: &[InstanceId]) -> Result<Vec<InstanceResult>, StepFailure> {
        let pass = self.pass().map_err(fail)?;
        let base = RenderBase::new(&pass.current.spec, &pass.cluster, &pass.members, &self.shared.read_model);
        self.on_each_checked(ids, |id| self.files_cmd(&base, &pass, id)).await
    }

    /// Starts the instances. One its node no longer holds (an install cut
    /// short, or an agent answering the start that it does not hold it: it
    /// lost its store) is installed again, package and rendered files, and
    /// then started. A `Lost` one is started first like any other: `Lost`
    /// may mean its node was away and it runs on (the agent would refuse an
    /// install over it). One not running whose install is not the
    /// cluster's package version or limits is installed again first too
    /// (an upgrade or resize whose undo failed left it so: started as it
    /// is, it would run another version than the cluster shows). A reinstall that fails fails the
    /// step with its reason.
    pub(super) async fn start(&self, ids: &[InstanceId]) -> Result<Vec<InstanceResult>, StepFailure> {
        let current = self.current().map_err(fail)?;
        let start_cmd = |id: &InstanceId| {
            let inst = self.record_of(id)?;
            let role = current.spec.role(&inst.role).ok_or_else(|| format!("role {} is not in the spec", inst.role))?;
            Ok(InstanceCmd::start_of(role))
        };
        let cluster = self.core.borrow().record.clone();
        // Not a Lost one: it may run on a node that was away (its start
        // comes first; "not held" reinstalls it).
        let out_of_line = |i: &InstanceRecord| {
            !matches!(i.status, InstanceStatus::Running | InstanceStatus::Lost)
                && i.applied.as_deref() != Some(&crate::actors::render::target(&current.spec, &cluster, i))
        };
        let gone: Vec<InstanceId> = ids
            .iter()
            .filter(|id| self.record_of(id).is_ok_and(|i| i.status == InstanceStatus::Installing || out_of_line(&i)))
            .cloned()
            .collect();
        let mut reinstalled = self.reinstall(&gone).await?;
        let mut outcomes = self.on_each(ids, start_cmd).await;
        let not_held: Vec<InstanceId> = outcomes
            .iter()
            .filter(|o| o.not_held && !gone.contains(&o.result.instance))
            .map(|o| o.result.instance.clone())
            .collect();
        if !not_held.is_empty() {
            reinstalled.extend(self.reinstall(&not_held).await?);
            let again = self.on_each(&not_held, start_cmd).await;
            for o in &mut outcomes {
                if let Some(a) = again.iter().find(|a| a.result.instance == o.result.instance) {
                    *o = a.clone();
                }
            }
        }
        // A member that ran already and owes a reload or a restart (its
        // files changed: the refresh before this start, or an earlier
        // change) gets it now, in its role's start order, a batch at a time.
        let started_ok = |id: &InstanceId| outcomes.iter().any(|o| o.result.instance == *id && o.result.ok);
        let owing: Vec<InstanceId> = ids
            .iter()
            .filter(|id| {
                started_ok(id)
                    && self
                        .record_of(id)
                        .is_ok_and(|i| i.status == InstanceStatus::Running && i.pending_restart != PendingRestart::No)
            })
            .cloned()
            .collect();
        let applied = self.apply_owed(&current.spec, owing, 0).await;
        // One result per instance: a reinstall or an owed restart shows in
        // its start's.
        let results = outcomes
            .into_iter()
            .map(|o| {
                let mut r = o.result;
                if let Some(i) = reinstalled.iter().find(|i| i.instance == r.instance) {
                    r.message = format!("{}; then {}", i.message, r.message);
                }
                if let Some(a) = applied.iter().find(|a| a.instance == r.instance) {
                    r = InstanceResult { message: format!("{}; then {}", r.message, a.message), ..a.clone() };
                }
                r
            })
            .collect();
        checked(results)
    }

    /// Installs again, before a start, instances their node no longer
    /// holds, or holds at another version or limits than the cluster's.
    async fn reinstall(&self, ids: &[InstanceId]) -> Result<Vec<InstanceResult>, StepFailure> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        tracing::info!(cluster = %self.core.borrow().record.name, instances = ids.len(), "installing again instances their node no longer holds (or holds out of line with the cluster), to start them");
        self.install(ids).await.map_err(|f| StepFailure {
            message: format!(
                "installing again what its node no longer holds (or holds at another version or limits than the cluster's), to start it: {}",
                f.message
            ),
            results: f.results,
        })
    }

    /// Runs `hook` on the instances whose role defines it: equal role order
    /// in parallel, orders in sequence, stopping at the first failing order.
    pub(super) async fn hook(&self, hook: Hook, ids: &[InstanceId]) -> Result<Vec<InstanceResult>, StepFailure> {
        let current = self.current().map_err(fail)?;
        let mut results = Vec::new();
        let mut known = Vec::new();
        for id in ids {
            match self.record_of(id) {
                Ok(inst) => known.push(inst),
                // Forgotten already (a delete run again): nothing to run it on.
                Err(_) => results.push(InstanceResult::ok(id, format!("no record; no {} hook to run", hook.name()))),
            }
        }
        for group in current.spec.roles_by_order() {
            let mut run = Vec::new();
            for inst in &known {
                let id = &inst.id;
                let Some(role) = group.iter().find(|r| *r.name == *inst.role) else { continue };
                match hook_argv(role, hook) {
                    Some(_) => run.push(id.clone()),
                    None => {
                        results.push(InstanceResult::ok(id, format!("role {} has no {} hook", role.name, hook.name())))
                    }
                }
            }
            let outcomes = self
                .on_each(&run, |id| {
                    let inst = self.record_of(id)?;
                    let role =
                        current.spec.role(&inst.role).ok_or_else(|| format!("role {} not in spec", inst.role))?;
                    let argv = hook_argv(role, hook).cloned().unwrap_or_default();
                    Ok(InstanceCmd::RunHook { hook: hook.name(), argv, timeout: role.hook_timeout })
                })
                .await;
            results.extend(outcomes.into_iter().map(|o| o.result));
            if results.iter().any(|r| !r.ok) {
                return checked(results);
            }
        }
        Ok(results)
    }

    /// Splits `ids` into the batches of a rolling action: roles in the
    /// order of `ids`, each role's instances `batch` at a time (see the
    /// module doc for the default).
    fn batches(&self, spec: &crate::spec::ComponentSpec, ids: Vec<InstanceId>, batch: usize) -> Vec<Vec<InstanceId>> {
        let mut by_role: BTreeMap<(i32, Arc<str>), Vec<InstanceId>> = BTreeMap::new();
        let members = self.core.borrow().members();
        let mut size_of: BTreeMap<Arc<str>, usize> = BTreeMap::new();
        for m in &members {
            *size_of.entry(m.role.clone()).or_default() += 1;
        }
        for id in ids {
            let role = self.record_of(&id).map(|r| r.role.clone()).unwrap_or_default();
            let order = spec.role(&role).map(|r| r.order).unwrap_or_default();
            by_role.entry((order, role)).or_default().push(id);
        }
        let mut out = Vec::new();
        for ((_, role), ids) in by_role {
            let quorum = spec.role(&role).is_some_and(|r| r.count.odd);
            let n = if quorum {
                1
            } else if batch > 0 {
                batch
            } else {
                (size_of.get(&role).copied().unwrap_or(1) * MAX_UNAVAILABLE_PERCENT / 100).max(1)
            };
            out.extend(ids.chunks(n).map(|c| c.to_vec()));
        }
        out
    }

    /// Writes the re-rendered files of every instance; then each instance
    /// that must run and owes something (its files changed while it ran,
    /// now or in an attempt a master restart interrupted: `pending_restart`
    /// is durable) or is found stopped (a restart interrupted half-way)
    /// is signalled, reloaded or restarted as its files' change modes say,
    /// a batch at a time. The rest are not touched.
    pub(super) async fn reconfigure(&self, r: &Rolling) -> Result<Vec<InstanceResult>, StepFailure> {
        let results = self.write_every(&r.ids, false).await?;
        let owes = |i: &InstanceRecord| i.pending_restart != PendingRestart::No || i.status != InstanceStatus::Running;
        let todo: Vec<InstanceId> =
            r.running.iter().filter(|id| self.record_of(id).is_ok_and(|i| owes(&i))).cloned().collect();
        let spec = self.current().map_err(fail)?.spec;
        let mut all = results;
        all.extend(self.apply_owed(&spec, todo, r.batch).await);
        checked(all)
    }

    /// The operator's start, before its starts: every member's files written
    /// again, and nothing else. What a member owes for them (recorded by
    /// the write) is applied by its start step, in role order; a member
    /// its node does not hold is no failure: its start installs it again,
    /// files and all.
    pub(super) async fn refresh_files(&self, r: &Rolling) -> Result<Vec<InstanceResult>, StepFailure> {
        self.write_every(&r.ids, true).await
    }

    /// Writes the re-rendered files of `ids`; with `not_held_ok`, one its
    /// node does not hold is a success.
    async fn write_every(&self, ids: &[InstanceId], not_held_ok: bool) -> Result<Vec<InstanceResult>, StepFailure> {
        let pass = self.pass().map_err(fail)?;
        let written = {
            let base = RenderBase::new(&pass.current.spec, &pass.cluster, &pass.members, &self.shared.read_model);
            self.on_each(ids, |id| self.files_cmd(&base, &pass, id)).await
        };
        let written = written
            .into_iter()
            .map(|o| {
                if not_held_ok && o.not_held {
                    InstanceResult::ok(&o.result.instance, "not held by its node: its start installs it again")
                } else {
                    o.result
                }
            })
            .collect();
        checked(written)
    }

    /// Applies what each of `todo` owes ([`apply_change`](Self::apply_change)),
    /// a batch at a time (see [`batches`](Self::batches)), stopping after a
    /// batch with a failure.
    async fn apply_owed(
        &self,
        spec: &crate::spec::ComponentSpec,
        todo: Vec<InstanceId>,
        batch: usize,
    ) -> Vec<InstanceResult> {
        let mut applied = Vec::new();
        for chunk in self.batches(spec, todo, batch) {
            let gate = &self.env.priority;
            let outcomes = join_all(chunk.iter().map(|id| gate.gated(self.apply_change(id)))).await;
            applied.extend(outcomes);
            if applied.iter().any(|r| !r.ok) {
                break;
            }
        }
        applied
    }

    /// What the instance owes for its new files: a signal or a reload (with
    /// a health check after) when that is all its changed files need and it
    /// runs; else a restart (stop, start): for a new environment, a file
    /// whose mode is restart, or an instance not known to run (stop is
    /// idempotent, and a process the master thinks down, e.g. one that
    /// failed its health check, may still run).
    async fn apply_change(&self, id: &InstanceId) -> InstanceResult {
        let (role, inst) = match (self.role_of(id), self.record_of(id)) {
            (Ok(r), Ok(i)) => (r, i),
            (Err(e), _) | (_, Err(e)) => return InstanceResult::failed(id, e),
        };
        let Some(handle) = self.handle(id) else {
            return InstanceResult::failed(id, format!("instance {id} is not part of this cluster"));
        };
        let running = inst.status == InstanceStatus::Running;
        let health = InstanceCmd::CheckHealth { timeout: role.start_timeout };
        let (steps, how) = match (inst.pending_restart, &role.reload) {
            (PendingRestart::Reload, Some(argv)) if running => (
                vec![InstanceCmd::RunHook { hook: "reload", argv: argv.clone(), timeout: role.hook_timeout }, health],
                "reloaded",
            ),
            (PendingRestart::Signal(signal), _) if running => {
                (vec![InstanceCmd::Signal { signal }, health], "signalled")
            }
            _ => (vec![InstanceCmd::Stop, InstanceCmd::start_of(&role)], "restarted"),
        };
        in_sequence(&handle, steps, format!("{how} with its new files")).await
    }

    /// Brings each instance in line with the cluster's package version and
    /// its role's limits: stop, install, start (if it must run), a batch at
    /// a time. An instance already in line is skipped, or started if it
    /// must run and is found stopped (a replace cut short: the undo of a
    /// failed install, or a step run again after a master restart).
    pub(super) async fn roll(&self, r: &Rolling) -> Result<Vec<InstanceResult>, StepFailure> {
        let current = self.current().map_err(fail)?;
        let mut results = Vec::new();
        let mut todo = Vec::new();
        let mut how: BTreeMap<InstanceId, (bool, bool)> = BTreeMap::new();
        let cluster = self.core.borrow().record.clone();
        for id in &r.ids {
            let inst = self.record_of(id).map_err(fail)?;
            let target = crate::actors::render::target(&current.spec, &cluster, &inst);
            let must_run = r.running.contains(id);
            if inst.applied.as_deref() != Some(&target) {
                todo.push(id.clone());
                how.insert(id.clone(), (must_run, true));
            } else if must_run && inst.status != InstanceStatus::Running {
                todo.push(id.clone());
                how.insert(id.clone(), (true, false));
            } else {
                results
                    .push(InstanceResult::ok(id, format!("already at {} with these limits", target.package_version)));
            }
        }
        for chunk in self.batches(&current.spec, todo, r.batch) {
            let gate = &self.env.priority;
            let outcomes = join_all(chunk.iter().map(|id| {
                let (run, install) = how.get(id).copied().unwrap_or((false, true));
                gate.gated(self.replace(id, run, install))
            }))
            .await;
            results.extend(outcomes);
            if results.iter().any(|r| !r.ok) {
                break;
            }
        }
        checked(results)
    }

    /// Stop, install (unless `install` is false: only a start is owed),
    /// start when it must run.
    async fn replace(&self, id: &InstanceId, must_run: bool, install: bool) -> InstanceResult {
        let Some(handle) = self.handle(id) else {
            return InstanceResult::failed(id, format!("instance {id} is not part of this cluster"));
        };
        // Stop first either way: a process the master thinks down may run.
        let mut steps = vec![InstanceCmd::Stop];
        if install {
            let pass = match self.pass() {
                Ok(p) => p,
                Err(e) => return InstanceResult::failed(id, e),
            };
            let base = RenderBase::new(&pass.current.spec, &pass.cluster, &pass.members, &self.shared.read_model);
            match self.install_cmd(&base, &pass, id) {
                Ok(cmd) => steps.push(cmd),
                Err(e) => return InstanceResult::failed(id, e),
            }
        }
        if must_run {
            match self.role_of(id) {
                Ok(role) => steps.push(InstanceCmd::start_of(&role)),
                Err(e) => return InstanceResult::failed(id, e),
            }
        }
        let version = self.core.borrow().record.package.version.clone();
        let done =
            if install { format!("replaced by version {version}") } else { "started again (found stopped)".into() };
        in_sequence(&handle, steps, done).await
    }

    /// Removes the instances from their agents. Under a force delete, an
    /// instance that could not be removed is remembered as a leftover of its
    /// node and removed when the agent reconnects.
    pub(super) async fn delete_on_agents(&self, ids: &[InstanceId]) -> Result<Vec<InstanceResult>, StepFailure> {
        let results: Vec<InstanceResult> = self
            .on_each_at(ids, TEARDOWN_CONCURRENCY, |_| Ok(InstanceCmd::Delete))
            .await
            .into_iter()
            .map(|o| o.result)
            .collect();
        if self.force {
            let failed: Vec<Arc<InstanceRecord>> =
                results.iter().filter(|r| !r.ok).filter_map(|r| self.record_of(&r.instance).ok()).collect();
            if !failed.is_empty() {
                self.remember_leftovers(&failed).await;
            }
        }
        checked(results)
    }
}

/// Runs `steps` on one instance, one after the other, stopping at the first
/// failure; the result names what happened.
async fn in_sequence(handle: &InstanceHandle, steps: Vec<InstanceCmd>, done: String) -> InstanceResult {
    let mut last = None;
    for cmd in steps {
        let out = handle.run(cmd).await;
        if !out.result.ok {
            return out.result;
        }
        last = Some(out.result);
    }
    match last {
        Some(r) => InstanceResult { message: done, ..r },
        None => InstanceResult::failed(&handle.id(), "nothing to do"),
    }
}

fn hook_argv(role: &RoleSpec, hook: Hook) -> Option<&Vec<String>> {
    match hook {
        Hook::Init => role.init.as_ref(),
        Hook::ScaleOut => role.scale_out.as_ref(),
        Hook::ScaleIn => role.scale_in.as_ref(),
        Hook::Destroy => role.destroy.as_ref(),
    }
}

/// Ok with every result, or a step failure naming every failed instance.
fn checked(results: Vec<InstanceResult>) -> Result<Vec<InstanceResult>, StepFailure> {
    let failures: Vec<&str> = results.iter().filter(|r| !r.ok).map(|r| r.message.as_str()).collect();
    if failures.is_empty() {
        return Ok(results);
    }
    // Bounded: 250 members on a lost node would repeat one cause 250
    // times; each instance's own result keeps its message.
    let mut message = failures.iter().take(SHOWN_FAILURES).copied().collect::<Vec<_>>().join("; ");
    if failures.len() > SHOWN_FAILURES {
        message.push_str(&format!(
            "; and {} more failed (each instance's result in the step says why)",
            failures.len() - SHOWN_FAILURES
        ));
    }
    Err(StepFailure { message, results })
}

/// How many instances' failures a step's error names.
const SHOWN_FAILURES: usize = 5;
