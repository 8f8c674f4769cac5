//! How the instance actions of a plan reach the instances: in parallel for
//! plain actions, by role order for hooks, and batch by batch, health-gated,
//! for the rolling ones (reconfigure, roll).
//!
//! Every command runs to completion in its own task (see
//! `InstanceHandle::run`), so the runner's watchdog can stop waiting without
//! cancelling a command half-way.

use futures::future::join_all;

use super::cluster_ops::ClusterOps;
use super::instance::{InstanceCmd, InstanceOutcome};
use crate::ids::InstanceId;
use crate::operations::{Hook, Rolling, StepFailure};
use crate::spec::RoleSpec;
use crate::storage::records::{InstanceRecord, InstanceResult, InstanceStatus, PendingRestart};

impl ClusterOps {
    /// Runs `cmd_for(id)` on every instance in parallel; every outcome.
    async fn on_each(
        &self,
        ids: &[InstanceId],
        cmd_for: impl Fn(&InstanceId) -> Result<InstanceCmd, String>,
    ) -> Vec<InstanceOutcome> {
        let mut futures = Vec::new();
        let mut out = Vec::new();
        for id in ids {
            let handle = self.core.borrow().instances.get(id).cloned();
            match (handle, cmd_for(id)) {
                (Some(h), Ok(cmd)) => futures.push(async move { h.run(cmd).await }),
                (None, _) => {
                    out.push(InstanceResult::failed(id, format!("instance {id} is not part of this cluster")).into())
                }
                (_, Err(e)) => out.push(InstanceResult::failed(id, e).into()),
            }
        }
        out.extend(join_all(futures).await);
        out
    }

    /// [`on_each`](Self::on_each), failing the step when any instance failed.
    pub(super) async fn on_each_checked(
        &self,
        ids: &[InstanceId],
        cmd_for: impl Fn(&InstanceId) -> Result<InstanceCmd, String>,
    ) -> Result<Vec<InstanceResult>, StepFailure> {
        checked(self.on_each(ids, cmd_for).await.into_iter().map(|o| o.result).collect())
    }

    fn record_of(&self, id: &InstanceId) -> Result<InstanceRecord, String> {
        self.shared.read_model.read().instances.get(id).cloned().ok_or_else(|| format!("instance {id} has no record"))
    }

    fn role_of(&self, id: &InstanceId) -> Result<RoleSpec, String> {
        let inst = self.record_of(id)?;
        let current = self.current()?;
        current.spec.role(&inst.role).cloned().ok_or_else(|| format!("role {} is not in the package's spec", inst.role))
    }

    pub(super) fn render_install(&self, id: &InstanceId) -> Result<InstanceCmd, String> {
        let current = self.current()?;
        let state = self.shared.read_model.read();
        let inst = state.instances.get(id).ok_or_else(|| format!("instance {id} has no record"))?;
        let members = state.cluster_instances(&self.cluster_name());
        let core = self.core.borrow();
        let payload = super::render::install_payload(
            &current.spec,
            &core.record,
            &members,
            inst,
            &state,
            &current.record,
            current.blob.clone(),
        )
        .map_err(|e| format!("rendering {id}: {e}"))?;
        Ok(InstanceCmd::Install(Box::new(payload)))
    }

    pub(super) fn render_files(&self, id: &InstanceId) -> Result<InstanceCmd, String> {
        let current = self.current()?;
        let state = self.shared.read_model.read();
        let inst = state.instances.get(id).ok_or_else(|| format!("instance {id} has no record"))?;
        let role = current.spec.role(&inst.role).ok_or_else(|| format!("role {} not in spec", inst.role))?;
        let members = state.cluster_instances(&self.cluster_name());
        let core = self.core.borrow();
        let (files, env) = super::render::files_and_env(&current.spec, role, &core.record, &members, inst, &state)
            .map_err(|e| format!("rendering {id}: {e}"))?;
        Ok(InstanceCmd::WriteFiles { files, env })
    }

    pub(super) fn start_cmd(&self, id: &InstanceId) -> Result<InstanceCmd, String> {
        Ok(InstanceCmd::Start { wait: self.role_of(id)?.start_timeout })
    }

    /// Runs `hook` on the instances whose role defines it: equal role order
    /// in parallel, orders in sequence, stopping at the first failing order.
    pub(super) async fn hook(&self, hook: Hook, ids: &[InstanceId]) -> Result<Vec<InstanceResult>, StepFailure> {
        let current = self.current().map_err(super::cluster_ops::fail)?;
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
                let Some(role) = group.iter().find(|r| r.name == inst.role) else { continue };
                match hook_argv(role, hook) {
                    Some(_) => run.push(id.clone()),
                    None => {
                        results.push(InstanceResult::ok(id, format!("role {} has no {} hook", role.name, hook.name())))
                    }
                }
            }
            let outcomes = self
                .on_each(&run, |id| {
                    let role = self.role_of(id)?;
                    let argv = hook_argv(&role, hook).cloned().unwrap_or_default();
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

    /// Writes the re-rendered files of every instance; then each instance
    /// that must run and owes a restart (its files changed while it ran,
    /// now or in an attempt a master restart interrupted: `pending_restart`
    /// is durable) or is found stopped (a restart interrupted half-way)
    /// reloads or restarts, `batch` at a time. The rest are not touched.
    pub(super) async fn reconfigure(&self, r: &Rolling) -> Result<Vec<InstanceResult>, StepFailure> {
        let written = self.on_each(&r.ids, |id| self.render_files(id)).await;
        let results = checked(written.into_iter().map(|o| o.result).collect())?;
        let owes = |i: &InstanceRecord| i.pending_restart != PendingRestart::No || i.status != InstanceStatus::Running;
        let todo: Vec<InstanceId> =
            r.running.iter().filter(|id| self.record_of(id).is_ok_and(|i| owes(&i))).cloned().collect();
        let mut applied = Vec::new();
        for chunk in todo.chunks(r.batch.max(1)) {
            let outcomes = join_all(chunk.iter().map(|id| self.reload_or_restart(id))).await;
            applied.extend(outcomes);
            if applied.iter().any(|r| !r.ok) {
                break;
            }
        }
        let mut all = results;
        all.extend(applied);
        checked(all)
    }

    /// A reload when only files changed and the role has a `reload` hook;
    /// else a restart (stop, start): for a new environment, or an instance
    /// not known to run (stop is idempotent, and a process the master
    /// thinks down, e.g. one that failed its health check, may still run).
    async fn reload_or_restart(&self, id: &InstanceId) -> InstanceResult {
        let (role, inst) = match (self.role_of(id), self.record_of(id)) {
            (Ok(r), Ok(i)) => (r, i),
            (Err(e), _) | (_, Err(e)) => return InstanceResult::failed(id, e),
        };
        let Some(handle) = self.core.borrow().instances.get(id).cloned() else {
            return InstanceResult::failed(id, format!("instance {id} is not part of this cluster"));
        };
        let reload = role
            .reload
            .as_ref()
            .filter(|_| inst.status == InstanceStatus::Running && inst.pending_restart == PendingRestart::Reload);
        let (steps, how) = match reload {
            Some(argv) => (
                vec![
                    InstanceCmd::RunHook { hook: "reload", argv: argv.clone(), timeout: role.hook_timeout },
                    InstanceCmd::CheckHealth { timeout: role.start_timeout },
                ],
                "reloaded",
            ),
            None => (vec![InstanceCmd::Stop, InstanceCmd::Start { wait: role.start_timeout }], "restarted"),
        };
        in_sequence(&handle, steps, format!("{how} with its new files")).await
    }

    /// Brings each instance in line with the cluster's package version and
    /// its role's limits: stop, install, start (if it must run), `batch` at
    /// a time. An instance already in line is skipped, or started if it
    /// must run and is found stopped (a replace cut short: the undo of a
    /// failed install, or a step run again after a master restart).
    pub(super) async fn roll(&self, r: &Rolling) -> Result<Vec<InstanceResult>, StepFailure> {
        let current = self.current().map_err(super::cluster_ops::fail)?;
        let mut results = Vec::new();
        let mut todo = Vec::new();
        for id in &r.ids {
            let inst = self.record_of(id).map_err(super::cluster_ops::fail)?;
            let target = super::render::target(&current.spec, &self.core.borrow().record, &inst);
            let must_run = r.running.contains(id);
            if inst.applied.as_ref() != Some(&target) {
                todo.push((id.clone(), must_run, true));
            } else if must_run && inst.status != InstanceStatus::Running {
                todo.push((id.clone(), true, false));
            } else {
                results
                    .push(InstanceResult::ok(id, format!("already at {} with these limits", target.package_version)));
            }
        }
        for chunk in todo.chunks(r.batch.max(1)) {
            let outcomes = join_all(chunk.iter().map(|(id, run, install)| self.replace(id, *run, *install))).await;
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
        let Some(handle) = self.core.borrow().instances.get(id).cloned() else {
            return InstanceResult::failed(id, format!("instance {id} is not part of this cluster"));
        };
        // Stop first either way: a process the master thinks down may run.
        let mut steps = vec![InstanceCmd::Stop];
        if install {
            match self.render_install(id) {
                Ok(cmd) => steps.push(cmd),
                Err(e) => return InstanceResult::failed(id, e),
            }
        }
        if must_run {
            match self.start_cmd(id) {
                Ok(cmd) => steps.push(cmd),
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
        let results: Vec<InstanceResult> =
            self.on_each(ids, |_| Ok(InstanceCmd::Delete)).await.into_iter().map(|o| o.result).collect();
        if self.force {
            let failed: Vec<InstanceRecord> =
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
async fn in_sequence(
    handle: &super::instance::InstanceHandle,
    steps: Vec<InstanceCmd>,
    done: String,
) -> InstanceResult {
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
        None => InstanceResult::failed(&InstanceId::new(handle.stats.id.clone()), "nothing to do"),
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
    if failures.is_empty() { Ok(results) } else { Err(StepFailure { message: failures.join("; "), results }) }
}
