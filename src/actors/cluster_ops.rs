//! The cluster actor's implementation of [`OperationContext`]: how each
//! [`Action`] of a plan reaches instance actors, storage and the read model.
//!
//! Commands to several instances run in parallel; each runs to completion in
//! its own task (see `InstanceHandle::run`), so the runner's watchdog can stop
//! waiting without cancelling a command half-way.

use std::cell::RefCell;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use time::OffsetDateTime;

use super::Shared;
use super::cluster::Core;
use super::instance::{InstanceActor, InstanceCmd, Retire};
use crate::ids::InstanceId;
use crate::operations::runner::Outcome;
use crate::operations::{Action, OperationContext, StepFailure};
use crate::spec::ComponentSpec;
use crate::storage::WriteOp;
use crate::storage::records::{
    ClusterStatus, InstanceResult, LeftoverRecord, OperationKind, OperationRecord, PackageRecord, RECORD_VERSION,
};

use super::supervisor::{ClusterGone, Escalate, Supervisor};
use actix::Addr;

pub(super) struct ClusterOps {
    pub core: Rc<RefCell<Core>>,
    pub shared: Shared,
    pub kind: OperationKind,
    /// A force delete: what cannot be removed now is remembered as leftovers.
    pub force: bool,
    /// The cluster's status when the operation succeeds (None: unchanged).
    pub on_success: Option<ClusterStatus>,
    pub supervisor: Addr<Supervisor>,
}

/// The cluster's package as its record names it now (an upgrade changes it
/// mid-operation, and its undo changes it back).
pub(super) struct CurrentPackage {
    pub record: PackageRecord,
    pub spec: Arc<ComponentSpec>,
    pub blob: PathBuf,
}

impl ClusterOps {
    pub(super) fn cluster_name(&self) -> String {
        self.core.borrow().record.name.clone()
    }

    pub(super) fn current(&self) -> Result<CurrentPackage, String> {
        let pkg = self.core.borrow().record.package.clone();
        let state = self.shared.read_model.read();
        let p =
            state.packages.get(&(pkg.name.clone(), pkg.version.clone())).ok_or(format!("package {pkg} is missing"))?;
        let blob = self.shared.blobs.path_for(&p.record.sha256).map_err(|e| e.to_string())?;
        Ok(CurrentPackage { record: p.record.clone(), spec: p.spec.clone(), blob })
    }

    /// Persists and publishes the cluster record after `change`.
    pub async fn save_cluster(
        &self,
        change: impl FnOnce(&mut crate::storage::records::ClusterRecord),
    ) -> Result<(), String> {
        let snapshot = {
            let mut core = self.core.borrow_mut();
            change(&mut core.record);
            core.record.updated_at = OffsetDateTime::now_utc();
            core.record.clone()
        };
        let op = WriteOp::put_cluster(&snapshot).map_err(|e| e.to_string())?;
        self.shared.store.commit(vec![op]).await.map_err(|e| e.to_string())?;
        self.shared.read_model.write().clusters.insert(snapshot.name.clone(), snapshot);
        Ok(())
    }

    async fn allocate(&self, ids: &[InstanceId]) -> Result<Vec<InstanceResult>, StepFailure> {
        let records: Vec<_> = {
            let core = self.core.borrow();
            ids.iter()
                .filter(|id| !core.instances.contains_key(*id))
                .filter_map(|id| core.pending.get(id).cloned())
                .collect()
        };
        let mut ops = Vec::new();
        for r in &records {
            ops.push(WriteOp::put_instance(r).map_err(|e| fail(e.to_string()))?);
        }
        if !ops.is_empty() {
            self.shared.store.commit(ops).await.map_err(|e| fail(format!("cannot persist new instances: {e}")))?;
        }
        let mut results = Vec::new();
        for r in records {
            let handle = InstanceActor::start(
                r.clone(),
                self.shared.links.clone(),
                self.shared.store.clone(),
                self.shared.read_model.clone(),
            );
            let mut core = self.core.borrow_mut();
            core.pending.remove(&r.id);
            core.instances.insert(r.id.clone(), handle);
            let ports: Vec<String> = r.ports.iter().map(|(k, v)| format!("{k}={v}")).collect();
            results.push(InstanceResult::ok(&r.id, format!("allocated on {} ({})", r.node, ports.join(", "))));
        }
        Ok(results)
    }

    async fn forget(&self, ids: &[InstanceId]) -> Result<Vec<InstanceResult>, StepFailure> {
        let cluster_id = self.core.borrow().record.id;
        let mut ops = Vec::new();
        for id in ids {
            ops.push(WriteOp::delete_instance(&cluster_id, id));
        }
        self.shared.store.commit(ops).await.map_err(|e| fail(format!("cannot remove instance records: {e}")))?;
        let mut results = Vec::new();
        for id in ids {
            let handle = self.core.borrow_mut().instances.remove(id);
            if let Some(h) = handle {
                h.addr.do_send(Retire);
            }
            let (removed, leftover) = {
                let mut state = self.shared.read_model.write();
                (state.instances.remove(id), state.leftovers.contains_key(id))
            };
            match removed {
                // A leftover may still run and hold its ports: they are
                // released when it is removed from its node.
                Some(_) if leftover => {
                    results.push(InstanceResult::ok(id, "forgotten; ports kept until its node removes it"))
                }
                Some(r) => {
                    self.shared.ports.release(&r.node, r.ports.values().copied());
                    results.push(InstanceResult::ok(id, "forgotten; ports released"));
                }
                None => results.push(InstanceResult::ok(id, "already forgotten")),
            }
        }
        Ok(results)
    }

    /// Remembers instances a force delete could not remove from their agents.
    pub(super) async fn remember_leftovers(&self, instances: &[crate::storage::records::InstanceRecord]) {
        let now = OffsetDateTime::now_utc();
        let records: Vec<LeftoverRecord> = instances
            .iter()
            .map(|i| LeftoverRecord {
                version: RECORD_VERSION,
                instance: i.id.clone(),
                node: i.node.clone(),
                cluster: i.cluster.clone(),
                ports: i.ports.values().copied().collect(),
                reason: i.last_error.clone().unwrap_or_else(|| "not removed by a force delete".into()),
                at: now,
            })
            .collect();
        let ops: Result<Vec<_>, _> = records.iter().map(WriteOp::put_leftover).collect();
        match ops {
            Ok(ops) => match self.shared.store.commit(ops).await {
                Ok(()) => {
                    let mut state = self.shared.read_model.write();
                    for r in records {
                        tracing::warn!(instance = %r.instance, node = %r.node, "left on its node by a force delete; removed when the agent reconnects");
                        state.leftovers.insert(r.instance.clone(), r);
                    }
                }
                Err(e) => tracing::error!(error = %e, "cannot record the leftovers of a force delete"),
            },
            Err(e) => tracing::error!(error = %e, "cannot encode leftovers"),
        }
    }

    /// Changes the cluster's definition durably (SetPackage/SetConfig/SetLimits).
    async fn define(&self, action: &Action) -> Result<Vec<InstanceResult>, StepFailure> {
        if let Action::SetPackage(p) = action
            && !self.shared.read_model.read().packages.contains_key(&(p.name.clone(), p.version.clone()))
        {
            return Err(fail(format!("package {p} is not uploaded")));
        }
        self.save_cluster(|r| match action {
            Action::SetPackage(p) => r.package = p.clone(),
            Action::SetConfig(c) => r.config = c.clone(),
            Action::SetLimits { role, limits } => r.roles.entry(role.clone()).or_default().limits = *limits,
            _ => {}
        })
        .await
        .map_err(fail)?;
        Ok(Vec::new())
    }
}

pub(super) fn fail(message: String) -> StepFailure {
    StepFailure { message, results: Vec::new() }
}

impl OperationContext for ClusterOps {
    async fn run_action(&self, action: &Action) -> Result<Vec<InstanceResult>, StepFailure> {
        match action {
            Action::Allocate(ids) => self.allocate(ids).await,
            Action::Forget(ids) => self.forget(ids).await,
            Action::Install(ids) => self.on_each_checked(ids, |id| self.render_install(id)).await,
            Action::WriteFiles(ids) => self.on_each_checked(ids, |id| self.render_files(id)).await,
            Action::Start(ids) => self.on_each_checked(ids, |id| self.start_cmd(id)).await,
            Action::Stop(ids) => self.on_each_checked(ids, |_| Ok(InstanceCmd::Stop)).await,
            Action::DeleteOnAgent(ids) => self.delete_on_agents(ids).await,
            Action::Hook { hook, ids } => self.hook(*hook, ids).await,
            Action::Reconfigure(r) => self.reconfigure(r).await,
            Action::Roll(r) => self.roll(r).await,
            Action::SetPackage(_) | Action::SetConfig(_) | Action::SetLimits { .. } => self.define(action).await,
        }
    }

    async fn journal(&self, record: &OperationRecord) -> Result<(), String> {
        let op = WriteOp::put_operation(record).map_err(|e| e.to_string())?;
        self.shared.store.commit(vec![op]).await.map_err(|e| e.to_string())?;
        self.shared.read_model.put_operation(record);
        Ok(())
    }

    async fn complete(&self, record: &OperationRecord, outcome: &Outcome) -> Result<(), String> {
        let verb = format!("{:?}", self.kind).to_lowercase();
        let name = self.cluster_name();
        if self.kind == OperationKind::Delete && *outcome == Outcome::Succeeded {
            let cluster_id = self.core.borrow().record.id;
            let ops =
                vec![WriteOp::delete_cluster(&cluster_id), WriteOp::put_operation(record).map_err(|e| e.to_string())?];
            self.shared.store.commit(ops).await.map_err(|e| e.to_string())?;
            self.shared.read_model.write().clusters.remove(&name);
            // The name is free before anyone can see the delete has ended.
            let _ = self.supervisor.send(ClusterGone { name }).await;
            self.shared.read_model.put_operation(record);
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
            Outcome::Failed { step, error, undone, .. } => {
                let tail = if *undone { "" } else { "; the rollback failed too, see the operation's steps" };
                (Some(ClusterStatus::Error), format!("{verb} failed at step {step}: {error}{tail}"), true)
            }
        };
        let snapshot = {
            let mut core = self.core.borrow_mut();
            // Instances placed for this operation that it never created
            // (it failed before its allocate step) give their ports back.
            for p in std::mem::take(&mut core.pending).into_values() {
                self.shared.ports.release(&p.node, p.ports.values().copied());
            }
            if let Some(s) = status {
                core.record.status = s;
            }
            core.record.status_description = description.clone();
            core.record.operation = None;
            core.record.updated_at = OffsetDateTime::now_utc();
            core.record.clone()
        };
        // One batch: the cluster's new status and the operation's end are
        // durable together, and published cluster first, so whoever sees
        // the operation ended sees the cluster as it left it.
        let ops = vec![
            WriteOp::put_cluster(&snapshot).map_err(|e| e.to_string())?,
            WriteOp::put_operation(record).map_err(|e| e.to_string())?,
        ];
        // A store frozen by a shutdown refuses the write: clients must not
        // see an end the next master will not (it resumes the operation
        // from its journal). Any other write error is shown as it is.
        let written = self.shared.store.commit(ops).await;
        if let Err(e @ crate::storage::StorageError::Frozen) = &written {
            return Err(e.to_string());
        }
        self.shared.read_model.write().clusters.insert(name.clone(), snapshot);
        self.shared.read_model.put_operation(record);
        if escalate {
            self.supervisor.do_send(Escalate {
                cluster: name,
                operation: Some(record.id),
                description,
                recorded: true,
            });
        }
        written.map_err(|e| e.to_string())
    }

    async fn set_status(&self, status: ClusterStatus, description: &str) -> Result<(), String> {
        self.save_cluster(|r| {
            r.status = status;
            r.status_description = description.to_string();
        })
        .await
    }

    fn deadline(&self, action: &Action) -> Duration {
        let base = self.shared.timing.step_deadline();
        let Ok(current) = self.current() else { return base };
        let spec = &current.spec;
        let max = |f: fn(&crate::spec::RoleSpec) -> Duration| spec.roles.iter().map(f).max().unwrap_or_default();
        // Stop may run a stop command and then wait out each instance's
        // grace period before the KILL; start waits for health.
        let stop = max(|r| r.stop_grace) * 2;
        let start = max(|r| r.start_timeout);
        let hook = max(|r| r.hook_timeout);
        let batches = |ids: &[InstanceId], batch: usize| ids.len().div_ceil(batch.max(1)) as u32;
        match action {
            Action::Stop(_) | Action::DeleteOnAgent(_) => base + stop,
            Action::Start(_) => base + start,
            Action::Hook { .. } => (base + hook) * spec.roles_by_order().len() as u32,
            // Per batch: a reload (hook + health) or a restart (stop + start).
            Action::Reconfigure(r) => base + (base + stop + start + hook) * batches(&r.ids, r.batch),
            // Per batch: stop, install, start.
            Action::Roll(r) => base + (base * 2 + stop + start) * batches(&r.ids, r.batch),
            _ => base,
        }
    }
}
