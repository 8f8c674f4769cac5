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

use futures::future::join_all;
use time::OffsetDateTime;

use super::Shared;
use super::cluster::Core;
use super::instance::{InstanceActor, InstanceCmd, Retire};
use crate::ids::InstanceId;
use crate::operations::runner::Outcome;
use crate::operations::{Action, OperationContext, StepFailure};
use crate::spec::ComponentSpec;
use crate::storage::WriteOp;
use crate::storage::records::{ClusterStatus, InstanceResult, OperationKind, OperationRecord, PackageRecord};

use super::supervisor::{ClusterGone, Escalate, Supervisor};
use actix::Addr;

pub(super) struct ClusterOps {
    pub core: Rc<RefCell<Core>>,
    pub shared: Shared,
    pub spec: Arc<ComponentSpec>,
    pub package: PackageRecord,
    pub blob: PathBuf,
    pub kind: OperationKind,
    /// The cluster's status when the operation succeeds (None: unchanged).
    pub on_success: Option<ClusterStatus>,
    pub supervisor: Addr<Supervisor>,
}

impl ClusterOps {
    fn cluster_name(&self) -> String {
        self.core.borrow().record.name.clone()
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
            results.push(ok(&r.id, format!("allocated on {} ({})", r.node, ports.join(", "))));
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
            let removed = self.shared.read_model.write().instances.remove(id);
            if let Some(r) = removed {
                self.shared.ports.release(&r.node, r.ports.values().copied());
            }
            results.push(ok(id, "forgotten; ports released".into()));
        }
        Ok(results)
    }

    /// Runs `cmd_for(id)` on every instance in parallel.
    async fn on_each(
        &self,
        ids: &[InstanceId],
        cmd_for: impl Fn(&InstanceId) -> Result<InstanceCmd, String>,
    ) -> Result<Vec<InstanceResult>, StepFailure> {
        let mut futures = Vec::new();
        let mut results = Vec::new();
        for id in ids {
            let handle = self.core.borrow().instances.get(id).cloned();
            match (handle, cmd_for(id)) {
                (Some(h), Ok(cmd)) => futures.push(async move { h.run(cmd).await }),
                (None, _) => results.push(bad(id, format!("instance {id} is not part of this cluster"))),
                (_, Err(e)) => results.push(bad(id, e)),
            }
        }
        results.extend(join_all(futures).await);
        let failures: Vec<&str> = results.iter().filter(|r| !r.ok).map(|r| r.message.as_str()).collect();
        if failures.is_empty() { Ok(results) } else { Err(StepFailure { message: failures.join("; "), results }) }
    }

    fn render_install(&self, id: &InstanceId) -> Result<InstanceCmd, String> {
        let state = self.shared.read_model.read();
        let name = self.cluster_name();
        let inst = state.instances.get(id).ok_or_else(|| format!("instance {id} has no record"))?;
        let members = state.cluster_instances(&name);
        let core = self.core.borrow();
        let payload = super::render::install_payload(
            &self.spec,
            &core.record,
            &members,
            inst,
            &state,
            &self.package,
            self.blob.clone(),
        )
        .map_err(|e| format!("rendering {id}: {e}"))?;
        Ok(InstanceCmd::Install(Box::new(payload)))
    }

    fn render_files(&self, id: &InstanceId) -> Result<InstanceCmd, String> {
        let state = self.shared.read_model.read();
        let name = self.cluster_name();
        let inst = state.instances.get(id).ok_or_else(|| format!("instance {id} has no record"))?;
        let role = self.spec.role(&inst.role).ok_or_else(|| format!("role {} not in spec", inst.role))?;
        let members = state.cluster_instances(&name);
        let core = self.core.borrow();
        let files = super::render::files(&self.spec, role, &core.record, &members, inst, &state)
            .map_err(|e| format!("rendering {id}: {e}"))?;
        Ok(InstanceCmd::WriteFiles(files))
    }
}

fn ok(id: &InstanceId, message: String) -> InstanceResult {
    InstanceResult { instance: id.clone(), ok: true, message, exit_code: None, stderr_tail: String::new() }
}

fn bad(id: &InstanceId, message: String) -> InstanceResult {
    InstanceResult { instance: id.clone(), ok: false, message, exit_code: None, stderr_tail: String::new() }
}

fn fail(message: String) -> StepFailure {
    StepFailure { message, results: Vec::new() }
}

impl OperationContext for ClusterOps {
    async fn run_action(&self, action: &Action) -> Result<Vec<InstanceResult>, StepFailure> {
        match action {
            Action::Allocate(ids) => self.allocate(ids).await,
            Action::Forget(ids) => self.forget(ids).await,
            Action::Install(ids) => self.on_each(ids, |id| self.render_install(id)).await,
            Action::WriteFiles(ids) => self.on_each(ids, |id| self.render_files(id)).await,
            Action::Start(ids) => self.on_each(ids, |_| Ok(InstanceCmd::Start)).await,
            Action::Stop(ids) => self.on_each(ids, |_| Ok(InstanceCmd::Stop)).await,
            Action::DeleteOnAgent(ids) => self.on_each(ids, |_| Ok(InstanceCmd::Delete)).await,
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
                if matches!(self.kind, OperationKind::ScaleOut | OperationKind::ScaleIn) =>
            {
                // Sahara: a scale rolled back leaves the cluster Active, with the reason.
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
        let written = self.shared.store.commit(ops).await.map_err(|e| e.to_string());
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
        written
    }

    async fn set_status(&self, status: ClusterStatus, description: &str) -> Result<(), String> {
        self.save_cluster(|r| {
            r.status = status;
            r.status_description = description.to_string();
        })
        .await
    }

    fn deadline(&self, action: &Action) -> Duration {
        match action {
            // Stop may run a stop command and then wait out each instance's
            // grace period before the KILL.
            Action::Stop(_) | Action::DeleteOnAgent(_) => {
                let grace = self.spec.roles.iter().map(|r| r.stop_grace).max().unwrap_or_default();
                self.shared.timing.step_deadline() + grace * 2
            }
            _ => self.shared.timing.step_deadline(),
        }
    }
}
