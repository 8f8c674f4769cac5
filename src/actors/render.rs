//! Builds the template context of DESIGN.md §8 from the master's records
//! and renders an instance's files and environment.
//!
//! Rendering happens on the master, from the read model's view of the
//! cluster's current membership, so every instance sees the same member list.

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::error::Error;
use crate::protocol::messages::{HealthProbe, ProcessSpec, RenderedFile, ResourceLimits};
use crate::spec::render::{ClusterCtx, ComponentCtx, InstanceCtx, MemberCtx, RenderContext, RoleCtx};
use crate::spec::{ComponentSpec, HealthCheck, RoleSpec};
use crate::storage::records::{Applied, ClusterRecord, InstanceRecord, Limits, PackageRecord};

use super::instance::InstallPayload;
use super::read_model::State;

/// The directory of an instance on its node.
pub fn instance_dir(state: &State, inst: &InstanceRecord) -> String {
    let root = state.nodes.get(&inst.node).map(|n| n.record.instance_root.clone()).unwrap_or_default();
    format!("{}/{}", root.trim_end_matches('/'), inst.id)
}

/// The context for rendering `inst`'s files, given every member of its cluster.
pub fn context(
    spec: &ComponentSpec,
    cluster: &ClusterRecord,
    members: &[InstanceRecord],
    inst: &InstanceRecord,
    state: &State,
) -> RenderContext {
    let mut roles: BTreeMap<String, RoleCtx> =
        spec.roles.iter().map(|r| (r.name.clone(), RoleCtx { count: 0, members: Vec::new() })).collect();
    for m in members {
        let role = roles.entry(m.role.clone()).or_insert_with(|| RoleCtx { count: 0, members: Vec::new() });
        role.count += 1;
        role.members.push(MemberCtx {
            id: m.id.to_string(),
            ordinal: m.ordinal,
            host: m.host.clone(),
            node: m.node.to_string(),
            ports: m.ports.clone(),
        });
    }
    for r in roles.values_mut() {
        r.members.sort_by_key(|m| m.ordinal);
    }
    let dir = instance_dir(state, inst);
    RenderContext {
        component: ComponentCtx { name: spec.component.name.clone(), version: spec.component.version.clone() },
        cluster: ClusterCtx {
            name: cluster.name.clone(),
            id: cluster.id.to_string(),
            config: cluster.config.iter().map(|(k, v)| (k.clone(), v.to_json())).collect(),
            roles,
        },
        instance: InstanceCtx {
            id: inst.id.to_string(),
            ordinal: inst.ordinal,
            role: inst.role.clone(),
            host: inst.host.clone(),
            node: inst.node.to_string(),
            ports: inst.ports.clone(),
            data_dir: format!("{dir}/data"),
            dir,
        },
    }
}

/// An instance's rendered environment, in the order the spec lists it.
pub type Env = Vec<(String, String)>;

/// The rendered files and environment of one instance.
pub fn files_and_env(
    spec: &ComponentSpec,
    role: &RoleSpec,
    cluster: &ClusterRecord,
    members: &[InstanceRecord],
    inst: &InstanceRecord,
    state: &State,
) -> Result<(Vec<RenderedFile>, Env), Error> {
    let ctx = context(spec, cluster, members, inst, state);
    Ok((crate::spec::render::render_files(role, &ctx)?, crate::spec::render::render_env(role, &ctx)?))
}

/// The full install payload of one instance: process spec with rendered env, files.
pub fn install_payload(
    spec: &ComponentSpec,
    cluster: &ClusterRecord,
    members: &[InstanceRecord],
    inst: &InstanceRecord,
    state: &State,
    package: &PackageRecord,
    blob: PathBuf,
) -> Result<InstallPayload, Error> {
    let role = spec
        .role(&inst.role)
        .ok_or_else(|| Error::spec(format!("roles.{}", inst.role), "role not in the package's spec"))?;
    let ctx = context(spec, cluster, members, inst, state);
    let files = crate::spec::render::render_files(role, &ctx)?;
    let env = crate::spec::render::render_env(role, &ctx)?;
    let health = match &role.health {
        None => None,
        Some(HealthCheck::Cmd { argv }) => Some(HealthProbe::Cmd { argv: argv.clone() }),
        Some(HealthCheck::Tcp { port }) => {
            let number = inst.ports.get(port).copied().ok_or_else(|| {
                Error::spec(format!("roles.{}.health.tcp", role.name), format!("instance has no port {port:?}"))
            })?;
            Some(HealthProbe::Tcp { port: number })
        }
    };
    let limits = effective_limits(spec, cluster, &inst.role);
    Ok(InstallPayload {
        run_as: role.run_as.clone(),
        process: ProcessSpec {
            start: role.start.clone(),
            stop: role.stop.clone(),
            pidfile: role.pidfile.clone(),
            stop_grace_ms: role.stop_grace.as_millis() as u64,
            start_timeout_ms: role.start_timeout.as_millis() as u64,
            env,
            health,
            limits: limits.map(|l| ResourceLimits { memory_bytes: l.memory_bytes, cpu: l.cpu }),
        },
        files,
        package_sha256: package.sha256.clone(),
        package_size: package.size,
        blob,
        applied: Applied { package_version: package.package_version.clone(), limits },
    })
}

/// The limits `role`'s instances run with: a vertical scale's, else the spec's.
pub fn effective_limits(spec: &ComponentSpec, cluster: &ClusterRecord, role: &str) -> Option<Limits> {
    if let Some(l) = cluster.roles.get(role).and_then(|r| r.limits) {
        return Some(l);
    }
    spec.role(role).and_then(|r| r.resources).map(|r| Limits { memory_bytes: r.memory_bytes, cpu: r.cpu })
}

/// What `inst` should have been installed with, by its cluster's definition.
pub fn target(spec: &ComponentSpec, cluster: &ClusterRecord, inst: &InstanceRecord) -> Applied {
    Applied { package_version: cluster.package.version.clone(), limits: effective_limits(spec, cluster, &inst.role) }
}
