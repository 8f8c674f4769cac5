//! How the instance actions of a plan reach the instances: in parallel for
//! plain actions, by role order for hooks, and batch by batch, health-gated,
//! for the rolling ones (reconfigure, roll).
//!
//! Every command runs to completion in its own task (see
//! `InstanceHandle::run`), so the runner's watchdog can stop waiting without
//! cancelling a command half-way.

use futures::future::join_all;

use super::cluster_ops::{ClusterOps, ok};
use super::instance::{InstanceCmd, InstanceOutcome};
use crate::ids::InstanceId;
use crate::operations::{Hook, StepFailure};
use crate::spec::RoleSpec;
use crate::storage::records::{DesiredState, InstanceRecord, InstanceResult};

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
        let files = super::render::files(&current.spec, role, &core.record, &members, inst, &state)
            .map_err(|e| format!("rendering {id}: {e}"))?;
        Ok(InstanceCmd::WriteFiles(files))
    }

    pub(super) fn start_cmd(&self, id: &InstanceId) -> Result<InstanceCmd, String> {
        Ok(InstanceCmd::Start { wait: self.role_of(id)?.start_timeout })
    }

    /// Runs `hook` on the instances whose role defines it: equal role order
    /// in parallel, orders in sequence, stopping at the first failing order.
    pub(super) async fn hook(&self, hook: Hook, ids: &[InstanceId]) -> Result<Vec<InstanceResult>, StepFailure> {
        let current = self.current().map_err(super::cluster_ops::fail)?;
        let mut results = Vec::new();
        for group in current.spec.roles_by_order() {
            let mut run = Vec::new();
            for id in ids {
                let Ok(inst) = self.record_of(id) else { continue };
                let Some(role) = group.iter().find(|r| r.name == inst.role) else { continue };
                match hook_argv(role, hook) {
                    Some(_) => run.push(id.clone()),
                    None => results.push(ok(id, format!("role {} has no {} hook", role.name, hook.name()))),
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

    /// Writes the re-rendered files of every instance; then the running ones
    /// whose files changed reload (the role's `reload` hook, then a health
    /// check) or restart (stop, start, health), `batch` at a time. The rest
    /// are not touched.
    pub(super) async fn reconfigure(
        &self,
        ids: &[InstanceId],
        batch: usize,
    ) -> Result<Vec<InstanceResult>, StepFailure> {
        let written = self.on_each(ids, |id| self.render_files(id)).await;
        let mut results: Vec<InstanceResult> = Vec::new();
        let mut changed = Vec::new();
        for o in written {
            let running = self.record_of(&o.result.instance).is_ok_and(|r| r.desired == DesiredState::Running);
            if o.result.ok && !o.changed.is_empty() && running {
                changed.push(o.result.instance.clone());
            }
            results.push(o.result);
        }
        let results = checked(results)?;
        let mut applied = Vec::new();
        for chunk in changed.chunks(batch.max(1)) {
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

    async fn reload_or_restart(&self, id: &InstanceId) -> InstanceResult {
        let role = match self.role_of(id) {
            Ok(r) => r,
            Err(e) => return InstanceResult::failed(id, e),
        };
        let Some(handle) = self.core.borrow().instances.get(id).cloned() else {
            return InstanceResult::failed(id, format!("instance {id} is not part of this cluster"));
        };
        let steps = match &role.reload {
            Some(argv) => vec![
                InstanceCmd::RunHook { hook: "reload", argv: argv.clone(), timeout: role.hook_timeout },
                InstanceCmd::CheckHealth { timeout: role.start_timeout },
            ],
            None => vec![InstanceCmd::Stop, InstanceCmd::Start { wait: role.start_timeout }],
        };
        let how = if role.reload.is_some() { "reloaded" } else { "restarted" };
        in_sequence(&handle, steps, format!("{how} with its new files")).await
    }

    /// Brings each instance in line with the cluster's package version and
    /// its role's limits: stop, install, start (if it ran), `batch` at a
    /// time. Instances already in line are skipped.
    pub(super) async fn roll(&self, ids: &[InstanceId], batch: usize) -> Result<Vec<InstanceResult>, StepFailure> {
        let current = self.current().map_err(super::cluster_ops::fail)?;
        let mut results = Vec::new();
        let mut todo = Vec::new();
        for id in ids {
            let inst = self.record_of(id).map_err(super::cluster_ops::fail)?;
            let target = super::render::target(&current.spec, &self.core.borrow().record, &inst);
            if inst.applied.as_ref() == Some(&target) {
                results.push(ok(id, format!("already at {} with these limits", target.package_version)));
            } else {
                todo.push((id.clone(), inst.desired == DesiredState::Running));
            }
        }
        for chunk in todo.chunks(batch.max(1)) {
            let outcomes = join_all(chunk.iter().map(|(id, running)| self.replace(id, *running))).await;
            results.extend(outcomes);
            if results.iter().any(|r| !r.ok) {
                break;
            }
        }
        checked(results)
    }

    async fn replace(&self, id: &InstanceId, was_running: bool) -> InstanceResult {
        let Some(handle) = self.core.borrow().instances.get(id).cloned() else {
            return InstanceResult::failed(id, format!("instance {id} is not part of this cluster"));
        };
        let mut steps = vec![InstanceCmd::Stop];
        match self.render_install(id) {
            Ok(cmd) => steps.push(cmd),
            Err(e) => return InstanceResult::failed(id, e),
        }
        if was_running {
            match self.start_cmd(id) {
                Ok(cmd) => steps.push(cmd),
                Err(e) => return InstanceResult::failed(id, e),
            }
        }
        let version = self.core.borrow().record.package.version.clone();
        in_sequence(&handle, steps, format!("replaced by version {version}")).await
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
