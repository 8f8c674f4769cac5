//! The validated component spec: what a package declares about its roles,
//! processes, hooks, files and config, with every rule of DESIGN.md §8
//! checked once at parse time so the rest of flotilla can trust it.
//!
//! `parse` goes text -> [`raw`](super::raw) (serde: keys and types) ->
//! these types (domain rules), stopping at the first violation, which names
//! its field as a dotted path.

use std::collections::BTreeMap;
use std::time::Duration;

use super::SpecError;
use super::checks::{self, ArgvProblem};
use super::config::{self, ConfigParam};
use super::raw::{self, RawCount, RawFile, RawHealth, RawResources, RawRole};
use super::render;
use crate::storage::records::ConfigValue;

/// The largest `count.max` a role may declare: what `flotilla bench` has
/// shown a master holds in one cluster (BENCHMARKS.md).
pub const MAX_COUNT: u32 = 10_000;
/// The most ports one role may declare.
pub const MAX_PORTS: usize = 32;
/// The file mode of a rendered file when the spec gives none.
pub const DEFAULT_FILE_MODE: u32 = 0o644;
pub const DEFAULT_STOP_GRACE: Duration = Duration::from_secs(10);
pub const DEFAULT_START_TIMEOUT: Duration = Duration::from_secs(60);
pub const DEFAULT_START_SETTLE: Duration = Duration::from_secs(1);
pub const DEFAULT_HOOK_TIMEOUT: Duration = Duration::from_secs(60);

/// A parsed and validated `component.toml`.
#[derive(Debug, Clone, PartialEq)]
pub struct ComponentSpec {
    pub component: ComponentInfo,
    pub config: BTreeMap<String, ConfigParam>,
    /// In file order.
    pub roles: Vec<RoleSpec>,
    /// Every template, compiled once.
    pub templates: render::Templates,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ComponentInfo {
    pub name: String,
    pub version: String,
}

/// How many instances a role may have. Without `count` in the spec a role
/// has exactly one; inside `count`, `min` defaults to 1 and `max` to `min`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CountRule {
    pub min: u32,
    pub max: u32,
    /// The count must be odd (quorum systems).
    pub odd: bool,
}

/// What gates `Running`: a TCP connect to a named port, or a command's exit status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HealthCheck {
    Tcp { port: String },
    Cmd { argv: Vec<String> },
}

/// Limits enforced through the instance's cgroup.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Resources {
    pub memory_bytes: Option<u64>,
    pub cpu: Option<f64>,
}

/// A file rendered on the master and written by the agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileSpec {
    /// Relative to the instance directory.
    pub path: String,
    pub template: String,
    pub mode: u32,
    /// What a running instance does when this file changes.
    pub change: ChangeMode,
}

/// What a running instance does when one of its rendered files changes
/// (Nomad's template `change_mode`). Ordered by weight: when several files
/// change, the heaviest mode applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ChangeMode {
    /// Nothing: the process reads the file when it wants to.
    Noop,
    /// This signal (a number) to the main process.
    Signal(i32),
    /// The role's `reload` hook.
    Reload,
    /// Stop and start.
    Restart,
}

/// One role of the component.
#[derive(Debug, Clone, PartialEq)]
pub struct RoleSpec {
    pub name: String,
    /// Lower starts first; equal orders run in parallel.
    pub order: i32,
    pub count: CountRule,
    pub run_as: Option<String>,
    /// Port names, allocated per instance from the node's range.
    pub ports: Vec<String>,
    pub start: Vec<String>,
    pub pidfile: Option<String>,
    pub stop: Option<Vec<String>>,
    pub stop_grace: Duration,
    pub start_timeout: Duration,
    /// A process that exits within this after its start is a failed start;
    /// later, a crash (restart policy). Default [`DEFAULT_START_SETTLE`]
    /// without a health check (at most `start_timeout`), zero with one (the
    /// check decides); `"0s"`: the start answers as soon as it runs.
    pub start_settle: Duration,
    pub resources: Option<Resources>,
    pub health: Option<HealthCheck>,
    pub init: Option<Vec<String>>,
    pub scale_out: Option<Vec<String>>,
    pub scale_in: Option<Vec<String>>,
    pub reload: Option<Vec<String>>,
    pub destroy: Option<Vec<String>>,
    pub hook_timeout: Duration,
    /// Values are templates, rendered per instance.
    pub env: BTreeMap<String, String>,
    pub files: Vec<FileSpec>,
    /// Labels a node must carry, each with this value, to be given the
    /// role's instances (`node_labels = { class = "big" }`); empty: any node.
    pub node_labels: BTreeMap<String, String>,
}

impl RoleSpec {
    /// What a running instance owes after `changed` (paths of its files that
    /// changed): the heaviest mode among them; `None` when nothing changed.
    /// Its environment changing (`ENV_CHANGED`) always needs a restart.
    pub fn owed(&self, changed: &[String]) -> Option<ChangeMode> {
        changed
            .iter()
            .map(|c| self.files.iter().find(|f| &f.path == c).map(|f| f.change).unwrap_or(ChangeMode::Restart))
            .max()
    }
}

impl ComponentSpec {
    /// Parses and validates `component.toml`, compiling every template.
    pub fn parse(text: &str) -> Result<ComponentSpec, SpecError> {
        let raw = raw::parse(text)?;
        crate::ids::validate_name(&raw.component.name).map_err(|m| SpecError::new("component.name", m))?;
        crate::ids::validate_version(&raw.component.version).map_err(|m| SpecError::new("component.version", m))?;
        let config = raw
            .config
            .into_iter()
            .map(|(name, p)| Ok((name.clone(), ConfigParam::from_raw(&name, p)?)))
            .collect::<Result<BTreeMap<_, _>, SpecError>>()?;
        if raw.roles.is_empty() {
            return Err(SpecError::new("roles", "at least one role ([[roles]]) is required"));
        }
        let mut roles: Vec<RoleSpec> = Vec::with_capacity(raw.roles.len());
        for (i, r) in raw.roles.into_iter().enumerate() {
            crate::ids::validate_name(&r.name)
                .map_err(|m| SpecError::new(format!("roles[{i}].name"), format!("invalid role name: {m}")))?;
            if roles.iter().any(|o| o.name == r.name) {
                return Err(SpecError::new(format!("roles.{}.name", r.name), "duplicate role name"));
            }
            roles.push(role(r)?);
        }
        let templates = render::Templates::compile(&roles)?;
        Ok(ComponentSpec {
            component: ComponentInfo { name: raw.component.name, version: raw.component.version },
            config,
            roles,
            templates,
        })
    }

    /// The role named `name`.
    pub fn role(&self, name: &str) -> Option<&RoleSpec> {
        self.roles.iter().find(|r| r.name == name)
    }

    /// Roles grouped by equal `order`, groups ascending, file order inside a group.
    pub fn roles_by_order(&self) -> Vec<Vec<&RoleSpec>> {
        let mut groups: BTreeMap<i32, Vec<&RoleSpec>> = BTreeMap::new();
        for r in &self.roles {
            groups.entry(r.order).or_default().push(r);
        }
        groups.into_values().collect()
    }

    /// Validates a cluster's config: `given` values, else `base` (the current
    /// values), else defaults; see [`config`](super::config).
    pub fn resolve_config(
        &self,
        given: &BTreeMap<String, serde_json::Value>,
        base: Option<&BTreeMap<String, ConfigValue>>,
    ) -> Result<BTreeMap<String, ConfigValue>, SpecError> {
        config::resolve(&self.config, given, base)
    }

    /// Checks that `role` may have `count` instances.
    pub fn check_count(&self, role: &str, count: u32) -> Result<(), SpecError> {
        let Some(spec) = self.role(role) else {
            let known: Vec<&str> = self.roles.iter().map(|r| r.name.as_str()).collect();
            return Err(SpecError::new(
                format!("roles.{role}"),
                format!("unknown role; the component has roles [{}]", known.join(", ")),
            ));
        };
        let field = format!("roles.{role}.count");
        let rule = spec.count;
        if count < rule.min {
            return Err(SpecError::new(field, format!("count {count} is below the minimum {}", rule.min)));
        }
        if count > rule.max {
            return Err(SpecError::new(field, format!("count {count} is above the maximum {}", rule.max)));
        }
        if rule.odd && count.is_multiple_of(2) {
            return Err(SpecError::new(field, format!("count {count} must be odd (quorum)")));
        }
        Ok(())
    }
}

/// Validates one role whose name is already checked.
fn role(r: RawRole) -> Result<RoleSpec, SpecError> {
    let p = format!("roles.{}", r.name);
    let f = |key: &str| format!("{p}.{key}");
    let count = count(&p, r.count)?;
    if let Some(user) = &r.run_as {
        checks::check_user_name(user).map_err(|m| SpecError::new(f("run_as"), format!("invalid user name: {m}")))?;
    }
    if r.ports.len() > MAX_PORTS {
        return Err(SpecError::new(f("ports"), format!("at most {MAX_PORTS} ports, got {}", r.ports.len())));
    }
    for (i, port) in r.ports.iter().enumerate() {
        let field = format!("{p}.ports[{i}]");
        checks::check_port_name(port).map_err(|m| SpecError::new(&field, format!("invalid port name: {m}")))?;
        if r.ports[..i].contains(port) {
            return Err(SpecError::new(field, format!("duplicate port name {port:?}")));
        }
    }
    argv(&f("start"), &r.start)?;
    for (key, cmd) in [
        ("stop", &r.stop),
        ("init", &r.init),
        ("scale_out", &r.scale_out),
        ("scale_in", &r.scale_in),
        ("reload", &r.reload),
        ("destroy", &r.destroy),
    ] {
        if let Some(cmd) = cmd {
            argv(&f(key), cmd)?;
        }
    }
    if let Some(pidfile) = &r.pidfile {
        checks::check_pidfile_path(pidfile).map_err(|m| SpecError::new(f("pidfile"), m))?;
    }
    let duration = |key: &str, v: &Option<String>, default: Duration| match v {
        None => Ok(default),
        Some(s) => checks::parse_duration(s).map_err(|m| SpecError::new(f(key), m)),
    };
    let stop_grace = duration("stop_grace", &r.stop_grace, DEFAULT_STOP_GRACE)?;
    let start_timeout = duration("start_timeout", &r.start_timeout, DEFAULT_START_TIMEOUT)?;
    // Without a health check, a start counts once its process has stayed
    // up this long (Nomad's `min_healthy_time`); with one, once it passes.
    let settle_default = if r.health.is_some() { Duration::ZERO } else { DEFAULT_START_SETTLE.min(start_timeout) };
    let start_settle = match r.start_settle.as_deref().map(str::trim) {
        // Zero is allowed here (only): the start counts as soon as it runs.
        Some(s) if humantime::parse_duration(s).is_ok_and(|d| d.is_zero()) => Duration::ZERO,
        _ => duration("start_settle", &r.start_settle, settle_default)?,
    };
    if start_settle > start_timeout {
        return Err(SpecError::new(f("start_settle"), "must not be longer than start_timeout"));
    }
    let hook_timeout = duration("hook_timeout", &r.hook_timeout, DEFAULT_HOOK_TIMEOUT)?;
    let resources = r.resources.map(|res| resources(&p, res)).transpose()?;
    let health = r.health.map(|h| health(&p, h, &r.ports)).transpose()?;
    for (key, value) in &r.env {
        let field = render::env_field(&r.name, key);
        checks::check_env_name(key).map_err(|m| SpecError::new(&field, format!("invalid variable name: {m}")))?;
        render::compile(&field, value)?;
    }
    let has_reload = r.reload.is_some();
    let files = r
        .files
        .into_iter()
        .enumerate()
        .map(|(i, file)| file_spec(&r.name, i, file, has_reload))
        .collect::<Result<Vec<_>, _>>()?;
    for (i, file) in files.iter().enumerate() {
        if files[..i].iter().any(|o| o.path == file.path) {
            return Err(SpecError::new(format!("{p}.files[{i}].path"), format!("duplicate file path {:?}", file.path)));
        }
    }
    crate::ids::validate_labels(r.node_labels.iter()).map_err(|(key, m)| {
        let field = key.map(|k| format!("{p}.node_labels.{k}")).unwrap_or_else(|| f("node_labels"));
        SpecError::new(field, m)
    })?;
    Ok(RoleSpec {
        name: r.name,
        order: r.order,
        count,
        run_as: r.run_as,
        ports: r.ports,
        start: r.start,
        pidfile: r.pidfile,
        stop: r.stop,
        stop_grace,
        start_timeout,
        start_settle,
        resources,
        health,
        init: r.init,
        scale_out: r.scale_out,
        scale_in: r.scale_in,
        reload: r.reload,
        destroy: r.destroy,
        hook_timeout,
        env: r.env,
        files,
        node_labels: r.node_labels,
    })
}

fn count(p: &str, raw: Option<RawCount>) -> Result<CountRule, SpecError> {
    let Some(raw) = raw else {
        return Ok(CountRule { min: 1, max: 1, odd: false });
    };
    let min = raw.min.unwrap_or(1);
    let max = raw.max.unwrap_or(min);
    if max < 1 {
        return Err(SpecError::new(format!("{p}.count.max"), "max must be at least 1"));
    }
    if max > MAX_COUNT {
        return Err(SpecError::new(format!("{p}.count.max"), format!("max {max} must be at most {MAX_COUNT}")));
    }
    if min > max {
        return Err(SpecError::new(format!("{p}.count.min"), format!("min {min} must not exceed max {max}")));
    }
    // With min < max the range always holds an odd number; only a fixed even count can't.
    if raw.odd && min == max && min.is_multiple_of(2) {
        return Err(SpecError::new(
            format!("{p}.count.odd"),
            format!("odd is required but no odd number lies in [{min}, {max}]"),
        ));
    }
    Ok(CountRule { min, max, odd: raw.odd })
}

fn argv(field: &str, cmd: &[String]) -> Result<(), SpecError> {
    checks::check_argv(cmd).map_err(|problem| match problem {
        ArgvProblem::Whole(m) => SpecError::new(field, m),
        ArgvProblem::Element(i, m) => SpecError::new(format!("{field}[{i}]"), m),
    })
}

fn resources(p: &str, raw: RawResources) -> Result<Resources, SpecError> {
    let mfield = format!("{p}.resources.memory");
    let memory_bytes = match raw.memory {
        None => None,
        Some(toml::Value::String(s)) => Some(checks::parse_memory(&s).map_err(|m| SpecError::new(&mfield, m))?),
        Some(toml::Value::Integer(n)) => {
            let bytes = u64::try_from(n).map_err(|_| SpecError::new(&mfield, "memory must not be negative"))?;
            checks::check_memory(bytes).map_err(|m| SpecError::new(&mfield, m))?;
            Some(bytes)
        }
        Some(other) => {
            return Err(SpecError::new(
                mfield,
                format!("memory must be a string like \"512M\" or a number of bytes, got {}", other.type_str()),
            ));
        }
    };
    if let Some(cpu) = raw.cpu
        && !(cpu > 0.0 && cpu <= 1024.0)
    {
        return Err(SpecError::new(format!("{p}.resources.cpu"), format!("cpu must be > 0 and <= 1024, got {cpu}")));
    }
    Ok(Resources { memory_bytes, cpu: raw.cpu })
}

fn health(p: &str, raw: RawHealth, ports: &[String]) -> Result<HealthCheck, SpecError> {
    match (raw.tcp, raw.cmd) {
        (Some(port), None) => {
            if !ports.contains(&port) {
                return Err(SpecError::new(
                    format!("{p}.health.tcp"),
                    format!("port {port:?} is not a declared port of the role ({})", ports.join(", ")),
                ));
            }
            Ok(HealthCheck::Tcp { port })
        }
        (None, Some(cmd)) => {
            argv(&format!("{p}.health.cmd"), &cmd)?;
            Ok(HealthCheck::Cmd { argv: cmd })
        }
        _ => Err(SpecError::new(format!("{p}.health"), "health needs exactly one of tcp or cmd")),
    }
}

fn file_spec(role: &str, i: usize, raw: RawFile, has_reload: bool) -> Result<FileSpec, SpecError> {
    let p = format!("roles.{role}.files[{i}]");
    let change = change_mode(&p, raw.change_mode.as_deref(), raw.change_signal.as_deref(), has_reload)?;
    checks::check_file_path(&raw.path).map_err(|m| SpecError::new(format!("{p}.path"), m))?;
    let mode = raw.mode.unwrap_or(DEFAULT_FILE_MODE);
    if mode > 0o777 {
        return Err(SpecError::new(
            format!("{p}.mode"),
            format!("mode {mode:#o} must be at most 0o777 (no setuid, setgid or sticky bits)"),
        ));
    }
    render::compile(&render::file_field(role, i), &raw.template)?;
    Ok(FileSpec { path: raw.path, template: raw.template, mode, change })
}

/// A file's change mode; absent: `reload` when the role has a reload hook,
/// else `restart`.
fn change_mode(p: &str, mode: Option<&str>, signal: Option<&str>, has_reload: bool) -> Result<ChangeMode, SpecError> {
    let field = format!("{p}.change_mode");
    if signal.is_some() && mode != Some("signal") {
        return Err(SpecError::new(format!("{p}.change_signal"), "only with change_mode = \"signal\""));
    }
    match mode {
        None if has_reload => Ok(ChangeMode::Reload),
        None | Some("restart") => Ok(ChangeMode::Restart),
        Some("reload") if has_reload => Ok(ChangeMode::Reload),
        Some("reload") => Err(SpecError::new(field, "\"reload\" needs the role's reload hook")),
        // Nomad spells it `noop`; the issue that asked for change modes, `none`.
        Some("noop" | "none") => Ok(ChangeMode::Noop),
        Some("signal") => {
            let sfield = format!("{p}.change_signal");
            let name = signal.ok_or_else(|| {
                SpecError::new(&sfield, "change_mode = \"signal\" needs change_signal, e.g. \"SIGHUP\"")
            })?;
            let upper = name.to_ascii_uppercase();
            let full = if upper.starts_with("SIG") { upper } else { format!("SIG{upper}") };
            let sig: nix::sys::signal::Signal =
                full.parse().map_err(|_| SpecError::new(&sfield, format!("{name:?} is not a signal name")))?;
            if matches!(sig, nix::sys::signal::Signal::SIGKILL | nix::sys::signal::Signal::SIGSTOP) {
                return Err(SpecError::new(sfield, format!("{name} cannot be caught; use change_mode = \"restart\"")));
            }
            Ok(ChangeMode::Signal(sig as i32))
        }
        Some(other) => Err(SpecError::new(
            field,
            format!("{other:?} is not one of \"restart\", \"reload\", \"signal\", \"noop\" (or \"none\")"),
        )),
    }
}
