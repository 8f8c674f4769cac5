//! Builds the template context of DESIGN.md §8 from the master's records
//! and renders instances' files and environment.
//!
//! Rendering happens on the master, from the cluster actor's own view of
//! its membership, so every instance sees the same member list. A
//! [`RenderBase`] is made once per rendering pass (one step): the component
//! and cluster parts of the context, member list included, become template
//! values once, and each instance adds only its own part. So re-rendering a
//! role of N members costs N renders, not N² context building.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use minijinja::value::Value;

use super::instance::InstallPayload;
use super::read_model::ReadModel;
use crate::error::Error;
use crate::protocol::messages::{HealthProbe, ProcessSpec, RenderedFile, ResourceLimits};
use crate::spec::render::{
    ClusterCtx, ComponentCtx, InstanceCtx, MemberCtx, RoleCtx, cluster_value, component_value, context_value,
    instance_value,
};
use crate::spec::{ComponentSpec, HealthCheck, RoleSpec};
use crate::storage::records::{Applied, ClusterRecord, InstanceRecord, Limits, PackageRecord};

/// An instance's rendered environment, in the order the spec lists it.
pub type Env = Vec<(String, String)>;

/// What every instance of one rendering pass shares.
pub struct RenderBase<'a> {
    pub spec: &'a ComponentSpec,
    cluster: &'a ClusterRecord,
    component: Value,
    cluster_value: Value,
    /// Node id -> its instance root.
    roots: BTreeMap<String, String>,
    /// What the instances of each role are installed with at the cluster's
    /// package version: one `Applied` shared by all of them.
    applied: BTreeMap<String, Arc<Applied>>,
}

impl<'a> RenderBase<'a> {
    /// The shared part of the context for `cluster` with `members`.
    pub fn new(
        spec: &'a ComponentSpec,
        cluster: &'a ClusterRecord,
        members: &[Arc<InstanceRecord>],
        read_model: &ReadModel,
    ) -> RenderBase<'a> {
        let mut roles: BTreeMap<String, RoleCtx> =
            spec.roles.iter().map(|r| (r.name.clone(), RoleCtx { count: 0, members: Vec::new() })).collect();
        let mut roots = BTreeMap::new();
        let lists = spec.templates.uses_members();
        for m in members {
            let role = roles.entry(m.role.to_string()).or_insert_with(|| RoleCtx { count: 0, members: Vec::new() });
            role.count += 1;
            if !lists {
                // No template reads the member list: only the counts.
                if !roots.contains_key(m.node.as_str()) {
                    let root = read_model.node(&m.node).map(|n| n.record().instance_root.clone()).unwrap_or_default();
                    roots.insert(m.node.to_string(), root);
                }
                continue;
            }
            role.members.push(MemberCtx {
                id: m.id.to_string(),
                ordinal: m.ordinal,
                host: m.host.to_string(),
                node: m.node.to_string(),
                ports: m.ports.to_map(),
            });
            if !roots.contains_key(m.node.as_str()) {
                let root = read_model.node(&m.node).map(|n| n.record().instance_root.clone()).unwrap_or_default();
                roots.insert(m.node.to_string(), root);
            }
        }
        let component = component_value(&ComponentCtx {
            name: spec.component.name.clone(),
            version: spec.component.version.clone(),
        });
        let cluster_value = cluster_value(&ClusterCtx {
            name: cluster.name.clone(),
            id: cluster.id.to_string(),
            config: cluster.config.iter().map(|(k, v)| (k.clone(), v.to_json())).collect(),
            roles,
        });
        let version: Arc<str> = cluster.package.version.as_str().into();
        let applied = spec
            .roles
            .iter()
            .map(|r| {
                let limits = effective_limits(spec, cluster, &r.name);
                (r.name.clone(), Arc::new(Applied { package_version: version.clone(), limits }))
            })
            .collect();
        RenderBase { spec, cluster, component, cluster_value, roots, applied }
    }

    /// The directory of an instance on its node.
    fn dir(&self, inst: &InstanceRecord) -> String {
        let root = self.roots.get(inst.node.as_str()).map(String::as_str).unwrap_or_default();
        format!("{}/{}", root.trim_end_matches('/'), inst.id)
    }

    fn context(&self, inst: &InstanceRecord) -> Value {
        let dir = self.dir(inst);
        let instance = instance_value(&InstanceCtx {
            id: inst.id.to_string(),
            ordinal: inst.ordinal,
            role: inst.role.to_string(),
            host: inst.host.to_string(),
            node: inst.node.to_string(),
            ports: inst.ports.to_map(),
            data_dir: format!("{dir}/data"),
            dir,
        });
        context_value(self.component.clone(), self.cluster_value.clone(), instance)
    }

    fn role(&self, inst: &InstanceRecord) -> Result<&'a RoleSpec, Error> {
        self.spec
            .role(&inst.role)
            .ok_or_else(|| Error::spec(format!("roles.{}", inst.role), "role not in the package's spec"))
    }

    /// The rendered files and environment of one instance.
    pub fn files_and_env(&self, inst: &InstanceRecord) -> Result<(Vec<RenderedFile>, Env), Error> {
        let role = self.role(inst)?;
        let ctx = self.context(inst);
        let t = &self.spec.templates;
        Ok((t.render_files(role, &ctx)?, t.render_env(role, &ctx)?))
    }

    /// The full install payload of one instance: process spec with rendered env, files.
    pub fn install_payload(
        &self,
        inst: &InstanceRecord,
        package: &PackageRecord,
        blob: PathBuf,
    ) -> Result<InstallPayload, Error> {
        let role = self.role(inst)?;
        let (files, env) = self.files_and_env(inst)?;
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
        let limits = effective_limits(self.spec, self.cluster, &inst.role);
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
            applied: match self.applied.get(&role.name) {
                Some(a) if *a.package_version == package.package_version => a.clone(),
                _ => Arc::new(Applied { package_version: package.package_version.as_str().into(), limits }),
            },
        })
    }
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
    Applied {
        package_version: cluster.package.version.as_str().into(),
        limits: effective_limits(spec, cluster, &inst.role),
    }
}
