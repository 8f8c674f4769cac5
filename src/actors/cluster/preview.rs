//! `?dry_run=true`: what a request would do, decided exactly as the real
//! request is (the same validation, placement and plan), with nothing
//! journaled, sent or changed: the ports placed for new instances go back
//! and the role's ordinal counter is restored.
//!
//! A previewed create's instance ids differ from the real create's (each
//! create draws a new cluster id, and ids carry part of it); role, ordinal,
//! node and ports are the same.
//!
//! For every rolling step the preview says what each member would do. It
//! renders each member's files and environment as they are and as the
//! change would make them (new config, new membership), and applies the
//! role's change modes as the instance actor does after a real write:
//! unchanged, reload (the role's `reload` hook), signal, or restart,
//! combined with what it already owed, its status and whether it must run.
//! An upgrade or resize replaces each member not yet at the target version
//! and limits (stop, install, start).

use std::collections::BTreeMap;
use std::sync::Arc;

use actix::prelude::*;
use serde::Serialize;
use serde_json::Value;

use super::{ClusterActor, Prepared};
use crate::actors::instance::ChangeRule;
use crate::actors::read_model::Reservation;
use crate::actors::render::RenderBase;
use crate::actors::supervisor::{CreateCluster, NewPlacement, Supervisor};
use crate::error::Error;
use crate::ids::InstanceId;
use crate::operations::Action;
use crate::protocol::messages::ENV_CHANGED;
use crate::spec::ComponentSpec;
use crate::storage::records::{ClusterRecord, InstanceRecord, InstanceStatus, OperationKind, PendingRestart};

use super::OpRequest;

/// The answer of `?dry_run=true` on a cluster mutation: what it would do,
/// decided as the real request is; nothing was journaled or changed.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct PlanPreview {
    /// Always true: nothing was done.
    pub dry_run: bool,
    /// Always true: an invalid request is answered with its error instead.
    pub valid: bool,
    /// The operation it would start.
    pub kind: OperationKind,
    /// The parameters the operation would be recorded with.
    pub params: Value,
    /// The plan's steps, in order.
    pub steps: Vec<PreviewStep>,
    /// The instances it would add, placed as the real request would place them.
    pub new_instances: Vec<PlacedInstance>,
}

/// One step of a previewed plan.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct PreviewStep {
    pub name: String,
    /// `install`, `start`, `stop`, `reconfigure`, `roll`, ...
    pub action: String,
    /// The instances it touches.
    pub instances: Vec<String>,
    /// What undoes it when a later step fails.
    pub undo: Vec<String>,
    /// Rolling steps: what each member would do (instance id to `reload
    /// (...)`, `restart (...)`, `replace (...)`, `unchanged`, ...).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub members: Option<BTreeMap<String, String>>,
}

/// A new instance as the preview places it.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct PlacedInstance {
    /// A real create draws other ids (they carry the cluster's id).
    pub id: String,
    pub role: String,
    pub ordinal: u32,
    pub node: String,
    pub host: String,
    /// Port name to port.
    pub ports: BTreeMap<String, u16>,
}

/// Previews `OpRequest` on the cluster: the answer of `?dry_run=true`.
pub struct Preview(pub OpRequest, pub Reservation);

impl Message for Preview {
    type Result = Result<PlanPreview, Error>;
}

impl Handler<Preview> for ClusterActor {
    type Result = Result<PlanPreview, Error>;

    fn handle(&mut self, msg: Preview, _ctx: &mut Context<Self>) -> Self::Result {
        let Preview(req, slot) = msg;
        slot.take("preview")?;
        let answer = self.preview(req);
        // A dry run that says no is an answer, not a failure of the actor.
        self.stats.refused_if(answer.is_err());
        answer
    }
}

impl ClusterActor {
    fn preview(&mut self, req: OpRequest) -> Result<PlanPreview, Error> {
        if self.creating {
            return Err(Error::not_found("cluster", self.core.borrow().record.name.clone()));
        }
        if let Some(running) = self.core.borrow().record.operation {
            let name = self.core.borrow().record.name.clone();
            return Err(Error::conflict(
                "cluster_busy",
                format!("cluster {name} is busy with operation {running}; retry when it has ended"),
            ));
        }
        let saved = self.core.borrow().record.clone();
        let prepared = self.package().and_then(|(_, spec)| self.prepare(req, &spec).map(|p| (p, spec)));
        // `prepare` counts the ordinals it hands out: put the counter back.
        self.core.borrow_mut().record = saved;
        let (prepared, spec) = prepared?;
        for p in &prepared.pending {
            self.shared.ports.release(&p.node, p.ports.values().copied());
        }
        let effects = self.effects(&prepared, &spec)?;
        Ok(describe(&prepared, effects))
    }

    /// What each member of each rolling step would do.
    fn effects(&self, prepared: &Prepared, spec: &Arc<ComponentSpec>) -> Result<BTreeMap<String, Members>, Error> {
        let now = self.core.borrow().record.clone();
        let members = self.core.borrow().members();
        // The cluster as the change leaves it: its config, its members.
        let mut after = now.clone();
        let mut removed: Vec<InstanceId> = Vec::new();
        for step in &prepared.plan.steps {
            match &step.action {
                Action::SetConfig(values) => after.config = values.clone(),
                Action::SetPackage(p) => after.package = p.clone(),
                Action::SetLimits { role, limits } => after.roles.entry(role.clone()).or_default().limits = *limits,
                Action::Forget(ids) => removed.extend(ids.iter().cloned()),
                _ => {}
            }
        }
        // An upgrade rolls onto the new version's spec.
        let after_spec = match &after.package {
            p if *p == now.package => spec.clone(),
            p => self.shared.read_model.package(&p.name, &p.version).map(|v| v.spec).unwrap_or_else(|| spec.clone()),
        };
        let mut after_members: Vec<Arc<InstanceRecord>> =
            members.iter().filter(|m| !removed.contains(&m.id)).cloned().collect();
        after_members.extend(prepared.pending.iter().cloned().map(Arc::new));
        let before_base = RenderBase::new(spec, &now, &members, &self.shared.read_model);
        let after_base = RenderBase::new(spec, &after, &after_members, &self.shared.read_model);
        let by_id: BTreeMap<&InstanceId, &Arc<InstanceRecord>> = members.iter().map(|m| (&m.id, m)).collect();
        let mut out = BTreeMap::new();
        for step in &prepared.plan.steps {
            let per_member: BTreeMap<String, String> = match &step.action {
                Action::RefreshFiles(r) => {
                    r.ids.iter().filter_map(|id| by_id.get(id)).map(|m| (m.id.to_string(), refresh(m))).collect()
                }
                Action::Reconfigure(r) => r
                    .ids
                    .iter()
                    .filter_map(|id| by_id.get(id))
                    .map(|m| {
                        let must_run = r.running.contains(&m.id);
                        Ok((m.id.to_string(), change(spec, &before_base, &after_base, m, must_run)?))
                    })
                    .collect::<Result<_, Error>>()?,
                Action::Roll(r) => r
                    .ids
                    .iter()
                    .filter_map(|id| by_id.get(id))
                    .map(|m| (m.id.to_string(), roll(&after_spec, &after, m, r.running.contains(&m.id))))
                    .collect(),
                _ => continue,
            };
            out.insert(step.name.clone(), per_member);
        }
        Ok(out)
    }
}

/// Instance id to what it would do, for one rolling step.
type Members = BTreeMap<String, String>;

/// What member `m` would do in a rolling reconfigure, decided as the real
/// step decides (`steps.rs`): its files are written; a member that must
/// run and owes something (what the new files need, combined with what an
/// earlier change left owed, or a start because it is not running) gets a
/// reload or a signal when that is all it owes and it runs, else a restart.
fn change(
    spec: &Arc<ComponentSpec>,
    before: &RenderBase,
    after: &RenderBase,
    m: &InstanceRecord,
    must_run: bool,
) -> Result<String, Error> {
    let (old_files, old_env) = before.files_and_env(m)?;
    let (new_files, new_env) = after.files_and_env(m)?;
    let old: BTreeMap<&str, (&[u8], u32)> =
        old_files.iter().map(|f| (f.path.as_str(), (f.contents.as_slice(), f.mode))).collect();
    let mut changed: Vec<String> = new_files
        .iter()
        .filter(|f| old.get(f.path.as_str()) != Some(&(f.contents.as_slice(), f.mode)))
        .map(|f| f.path.clone())
        .collect();
    if old_env != new_env {
        changed.push(ENV_CHANGED.to_string());
    }
    let rule = ChangeRule { spec: spec.clone(), role: m.role.clone() };
    let has_reload = spec.role(&m.role).is_some_and(|r| r.reload.is_some());
    let new = rule.owed(&changed).unwrap_or(PendingRestart::No);
    let owed = m.pending_restart.max(new);
    let running = m.status == InstanceStatus::Running;
    let mut why: Vec<String> = changed.clone();
    if owed != new {
        why.push("owed by an earlier change".into());
    }
    if !running {
        why.push(format!("{:?}", m.status));
    }
    let why = why.join(", ");
    Ok(if !must_run {
        if changed.is_empty() {
            "unchanged; stays stopped".into()
        } else {
            format!("files written ({why}); stays stopped")
        }
    } else if owed == PendingRestart::No && running {
        if changed.is_empty() {
            "unchanged".into()
        } else {
            format!("files written ({why}); no action (change mode noop)")
        }
    } else {
        match owed {
            PendingRestart::Reload if has_reload && running => format!("reload ({why})"),
            PendingRestart::Signal(s) if running => format!("signal {s} ({why})"),
            _ => format!("restart ({why})"),
        }
    })
}

/// What member `m` would do in a start's refresh: its files are written
/// again (the master cannot know whether its node's copy is stale); what
/// that or an earlier change owes is applied at its start step.
fn refresh(m: &InstanceRecord) -> String {
    let owed = match m.pending_restart {
        PendingRestart::No => "a reload or restart if its node's copy was stale".to_string(),
        PendingRestart::Reload => "the reload it owes".into(),
        PendingRestart::Signal(s) => format!("the signal {s} it owes"),
        PendingRestart::Restart => "the restart it owes".into(),
    };
    format!("files written again; its start applies {owed}")
}

/// What member `m` would do in a roll (upgrade, resize), as `steps.rs`
/// decides: replaced when it is not at the target version and limits,
/// started when it must run and is found stopped, else left alone.
fn roll(spec: &ComponentSpec, after: &ClusterRecord, m: &InstanceRecord, must_run: bool) -> String {
    let target = crate::actors::render::target(spec, after, m);
    if m.applied.as_deref() != Some(&target) {
        if must_run { "replace (stop, install, start)".into() } else { "replace (stop, install; stays stopped)".into() }
    } else if must_run && m.status != InstanceStatus::Running {
        "start (found stopped)".into()
    } else {
        format!("unchanged (already at {} with these limits)", target.package_version)
    }
}

/// The preview of a create the supervisor validated and placed
/// (`pending`, whose ports the caller gives back).
fn create_preview(spec: &ComponentSpec, placed: NewPlacement, params: String) -> PlanPreview {
    let groups = super::new_groups(spec, &placed.pending, &placed.waits);
    let plan = crate::operations::create::plan(&groups);
    let p = Prepared {
        kind: crate::storage::records::OperationKind::Create,
        plan: crate::operations::await_nodes::first(placed.waits, None, false, plan),
        params,
        pending: placed.pending,
        on_success: None,
        force: false,
    };
    describe(&p, BTreeMap::new())
}

/// The preview of a prepared plan.
fn describe(p: &Prepared, mut effects: BTreeMap<String, Members>) -> PlanPreview {
    let steps = p
        .plan
        .steps
        .iter()
        .map(|s| PreviewStep {
            name: s.name.clone(),
            action: s.action.label().to_string(),
            instances: s.action.instances().iter().map(|i| i.to_string()).collect(),
            undo: s.undo.iter().map(|u| u.label().to_string()).collect(),
            members: effects.remove(&s.name),
        })
        .collect();
    let new_instances = p
        .pending
        .iter()
        .map(|i| PlacedInstance {
            id: i.id.to_string(),
            role: i.role.to_string(),
            ordinal: i.ordinal,
            node: i.node.to_string(),
            host: i.host.to_string(),
            ports: i.ports.to_map(),
        })
        .collect();
    PlanPreview {
        dry_run: true,
        valid: true,
        kind: p.kind,
        params: serde_json::from_str::<Value>(&p.params).unwrap_or(Value::Null),
        steps,
        new_instances,
    }
}

/// `POST /clusters?dry_run=true`: the create validated and placed as a real
/// one would be, its plan answered, nothing kept (the ports go back).
pub struct PreviewCreate(pub CreateCluster, pub Reservation);

impl Message for PreviewCreate {
    type Result = Result<PlanPreview, Error>;
}

impl Handler<PreviewCreate> for Supervisor {
    type Result = Result<PlanPreview, Error>;

    fn handle(&mut self, msg: PreviewCreate, _ctx: &mut Context<Self>) -> Self::Result {
        let PreviewCreate(req, slot) = msg;
        slot.take("preview create")?;
        let answer = self.validate_create(&req).and_then(|(record, roles)| {
            let view = self
                .shared()
                .read_model
                .package(&record.package.name, &record.package.version)
                .ok_or_else(|| Error::not_found("package", &record.package))?;
            let placed = crate::actors::supervisor::place_new_cluster(self.shared(), &record, &view.spec, &roles)?;
            for p in &placed.pending {
                self.shared().ports.release(&p.node, p.ports.values().copied());
            }
            let params = req.params(&record.config);
            Ok(create_preview(&view.spec, placed, params))
        });
        self.stats().refused_if(answer.is_err());
        answer
    }
}
