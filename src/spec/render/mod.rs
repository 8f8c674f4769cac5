//! Template rendering of an instance's files and environment (DESIGN.md §8),
//! done on the master with minijinja.
//!
//! The environment is strict on purpose: an undefined variable is an error
//! (never silently empty output in a config file), there is no filesystem
//! loader (a template can't read the master's disk) and no auto-escaping
//! (these are config files, not HTML). The same context always renders to
//! the same bytes: maps are `BTreeMap`s and members are sorted by ordinal,
//! so the agent can tell an unchanged file by its content.
//!
//! minijinja is built without its `serde` feature, so the context is turned
//! into template values by hand ([`RenderContext::to_value`]).

use std::collections::BTreeMap;

use minijinja::value::Value;
use minijinja::{Environment, UndefinedBehavior};
use serde::{Deserialize, Serialize};

use super::SpecError;
use super::model::RoleSpec;
use crate::protocol::messages::RenderedFile;

/// Everything a template sees.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RenderContext {
    pub component: ComponentCtx,
    pub cluster: ClusterCtx,
    pub instance: InstanceCtx,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ComponentCtx {
    pub name: String,
    pub version: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClusterCtx {
    pub name: String,
    pub id: String,
    pub config: BTreeMap<String, serde_json::Value>,
    pub roles: BTreeMap<String, RoleCtx>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RoleCtx {
    pub count: u32,
    /// Rendered in ordinal order whatever the order here.
    pub members: Vec<MemberCtx>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemberCtx {
    pub id: String,
    pub ordinal: u32,
    pub host: String,
    pub node: String,
    pub ports: BTreeMap<String, u16>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InstanceCtx {
    pub id: String,
    pub ordinal: u32,
    pub role: String,
    pub host: String,
    pub node: String,
    pub ports: BTreeMap<String, u16>,
    pub dir: String,
    pub data_dir: String,
}

impl RenderContext {
    /// The context as a template value.
    pub fn to_value(&self) -> Value {
        context_value(component_value(&self.component), cluster_value(&self.cluster), instance_value(&self.instance))
    }
}

/// `component` as a template value.
pub fn component_value(c: &ComponentCtx) -> Value {
    map([("name", s(&c.name)), ("version", s(&c.version))])
}

/// `cluster` as a template value: built once per rendering pass and shared
/// (template values are reference-counted), so rendering N members costs N
/// instance values, not N copies of the member list.
pub fn cluster_value(c: &ClusterCtx) -> Value {
    let roles: BTreeMap<String, Value> = c
        .roles
        .iter()
        .map(|(name, role)| {
            let mut members: Vec<&MemberCtx> = role.members.iter().collect();
            members.sort_by_key(|m| m.ordinal);
            let members: Value = members
                .into_iter()
                .map(|m| {
                    map([
                        ("id", s(&m.id)),
                        ("ordinal", Value::from(m.ordinal)),
                        ("host", s(&m.host)),
                        ("node", s(&m.node)),
                        ("ports", ports(&m.ports)),
                    ])
                })
                .collect();
            (name.clone(), map([("count", Value::from(role.count)), ("members", members)]))
        })
        .collect();
    let config: BTreeMap<String, Value> = c.config.iter().map(|(k, v)| (k.clone(), json_value(v))).collect();
    map([
        ("name", s(&c.name)),
        ("id", s(&c.id)),
        ("config", Value::from_object(config)),
        ("roles", Value::from_object(roles)),
    ])
}

/// `instance` as a template value.
pub fn instance_value(i: &InstanceCtx) -> Value {
    map([
        ("id", s(&i.id)),
        ("ordinal", Value::from(i.ordinal)),
        ("role", s(&i.role)),
        ("host", s(&i.host)),
        ("node", s(&i.node)),
        ("ports", ports(&i.ports)),
        ("dir", s(&i.dir)),
        ("data_dir", s(&i.data_dir)),
    ])
}

/// The whole context from its three parts.
pub fn context_value(component: Value, cluster: Value, instance: Value) -> Value {
    map([("component", component), ("cluster", cluster), ("instance", instance)])
}

fn s(v: &str) -> Value {
    Value::from(v)
}

fn map<const N: usize>(entries: [(&str, Value); N]) -> Value {
    let m: BTreeMap<String, Value> = entries.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
    Value::from_object(m)
}

fn ports(p: &BTreeMap<String, u16>) -> Value {
    let m: BTreeMap<String, Value> = p.iter().map(|(k, v)| (k.clone(), Value::from(*v))).collect();
    Value::from_object(m)
}

fn json_value(v: &serde_json::Value) -> Value {
    use serde_json::Value as J;
    match v {
        J::Null => Value::from(()),
        J::Bool(b) => Value::from(*b),
        J::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => Value::from(i),
            (None, Some(u), _) => Value::from(u),
            (None, None, Some(f)) => Value::from(f),
            (None, None, None) => Value::from(n.to_string()),
        },
        J::String(st) => Value::from(st.as_str()),
        J::Array(a) => a.iter().map(json_value).collect(),
        J::Object(o) => {
            let m: BTreeMap<String, Value> = o.iter().map(|(k, v)| (k.clone(), json_value(v))).collect();
            Value::from_object(m)
        }
    }
}

/// How many template instructions one render may run: far above any real
/// config file (a 9-member `zoo.cfg` takes a few hundred), far below a
/// hostile template's nested loops. Rendering runs on the master's actor
/// threads, so a template must not be able to spin one forever.
pub const RENDER_FUEL: u64 = 2_000_000;

/// The largest rendered file (and environment value): the agent link's
/// frames are bounded, and a config file this big is a template gone wrong.
pub const MAX_RENDERED_BYTES: usize = 1024 * 1024;

/// The one environment configuration used to compile and to render.
fn environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_fuel(Some(RENDER_FUEL));
    env.set_undefined_behavior(UndefinedBehavior::Strict);
    env.set_auto_escape_callback(|_| minijinja::AutoEscape::None);
    // Names the undefined expression in errors ("`instance.ports.x` is undefined").
    env.set_debug(true);
    // A config file's final newline is content; Jinja's default drops it.
    let mut syntax = minijinja::syntax::SyntaxConfig::builder();
    syntax.keep_trailing_newline(true);
    if let Ok(syntax) = syntax.build() {
        env.set_syntax(syntax);
    }
    env
}

/// The field of file `index` of `role`'s template, also the template's name.
pub fn file_field(role: &str, index: usize) -> String {
    format!("roles.{role}.files[{index}].template")
}

/// The field of env variable `key` of `role`, also the template's name.
pub fn env_field(role: &str, key: &str) -> String {
    format!("roles.{role}.env.{key}")
}

fn template_error(field: &str, err: &minijinja::Error) -> SpecError {
    SpecError::new(field, format!("template error: {err}"))
}

/// Compiles a template without rendering it (the parse-time check).
pub fn compile(field: &str, source: &str) -> Result<(), SpecError> {
    let env = environment();
    env.template_from_named_str(field, source).map(|_| ()).map_err(|e| template_error(field, &e))
}

fn render_one(env: &Environment<'static>, field: &str, source: &str, ctx: &Value) -> Result<String, SpecError> {
    let out = env
        .template_from_named_str(field, source)
        .and_then(|t| t.render(ctx))
        .map_err(|e| template_error(field, &e))?;
    if out.len() > MAX_RENDERED_BYTES {
        return Err(SpecError::new(
            field,
            format!("renders to {} bytes, over the limit of {MAX_RENDERED_BYTES}", out.len()),
        ));
    }
    Ok(out)
}

/// Every template of a spec, compiled once when the spec is parsed: a
/// render then costs the render, not a parse of the template (the master
/// renders each of 100,000 instances).
#[derive(Clone)]
pub struct Templates(std::sync::Arc<Environment<'static>>, bool);

impl std::fmt::Debug for Templates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Templates")
    }
}

/// Compiled from the spec's own text: two specs are equal by that text.
impl PartialEq for Templates {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Templates {
    /// Compiles every file and environment template of `roles`.
    pub fn compile(roles: &[RoleSpec]) -> Result<Templates, SpecError> {
        let mut env = environment();
        for role in roles {
            for (i, file) in role.files.iter().enumerate() {
                let field = file_field(&role.name, i);
                env.add_template_owned(field.clone(), file.template.clone()).map_err(|e| template_error(&field, &e))?;
            }
            for (key, template) in &role.env {
                let field = env_field(&role.name, key);
                env.add_template_owned(field.clone(), template.clone()).map_err(|e| template_error(&field, &e))?;
            }
        }
        // Whether any template reads the member lists (`cluster.roles`, or
        // `cluster` as a whole): when none does, the master renders a
        // thousand members without building their list each time.
        let uses_members = env.templates().any(|(_, t)| {
            t.undeclared_variables(true).iter().any(|v| v == "cluster" || v.starts_with("cluster.roles"))
        });
        Ok(Templates(std::sync::Arc::new(env), uses_members))
    }

    /// Whether some template reads the member lists (see [`Templates::compile`]).
    pub fn uses_members(&self) -> bool {
        self.1
    }

    fn render(&self, field: &str, value: &Value) -> Result<String, SpecError> {
        let out = self.0.get_template(field).and_then(|t| t.render(value)).map_err(|e| template_error(field, &e))?;
        if out.len() > MAX_RENDERED_BYTES {
            return Err(SpecError::new(
                field,
                format!("renders to {} bytes, over the limit of {MAX_RENDERED_BYTES}", out.len()),
            ));
        }
        Ok(out)
    }

    /// Renders every file of `role` for the context `value`, in file order.
    pub fn render_files(&self, role: &RoleSpec, value: &Value) -> Result<Vec<RenderedFile>, SpecError> {
        role.files
            .iter()
            .enumerate()
            .map(|(i, file)| {
                let contents = self.render(&file_field(&role.name, i), value)?;
                Ok(RenderedFile { path: file.path.clone(), contents: contents.into_bytes(), mode: file.mode })
            })
            .collect()
    }

    /// Renders the environment of `role` for the context `value`, sorted by
    /// variable name.
    pub fn render_env(&self, role: &RoleSpec, value: &Value) -> Result<Vec<(String, String)>, SpecError> {
        role.env
            .keys()
            .map(|key| {
                let rendered = self.render(&env_field(&role.name, key), value)?;
                if rendered.contains('\0') {
                    return Err(SpecError::new(env_field(&role.name, key), "rendered value contains NUL"));
                }
                Ok((key.clone(), rendered))
            })
            .collect()
    }
}

/// Renders every file of `role` for the instance described by `ctx`, in file order.
pub fn render_files(role: &RoleSpec, ctx: &RenderContext) -> Result<Vec<RenderedFile>, SpecError> {
    let env = environment();
    let value = ctx.to_value();
    role.files
        .iter()
        .enumerate()
        .map(|(i, file)| {
            let contents = render_one(&env, &file_field(&role.name, i), &file.template, &value)?;
            Ok(RenderedFile { path: file.path.clone(), contents: contents.into_bytes(), mode: file.mode })
        })
        .collect()
}

/// Renders the environment of `role` for the instance described by `ctx`,
/// sorted by variable name.
pub fn render_env(role: &RoleSpec, ctx: &RenderContext) -> Result<Vec<(String, String)>, SpecError> {
    let env = environment();
    let value = ctx.to_value();
    role.env
        .iter()
        .map(|(key, template)| {
            let rendered = render_one(&env, &env_field(&role.name, key), template, &value)?;
            if rendered.contains('\0') {
                return Err(SpecError::new(env_field(&role.name, key), "rendered value contains NUL"));
            }
            Ok((key.clone(), rendered))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::ComponentSpec;

    #[test]
    fn a_hostile_template_runs_out_of_fuel_or_size_instead_of_hanging() {
        let env = environment();
        let ctx = Value::from(());
        let spin = "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}";
        let started = std::time::Instant::now();
        let err = render_one(&env, "roles.x.files[0].template", spin, &ctx).unwrap_err();
        assert!(err.message.contains("fuel"), "{err}");
        assert!(started.elapsed() < std::time::Duration::from_secs(20), "fuel did not stop it early");
        let big = "{% for a in range(60000) %}{{ 'x' * 100 }}{% endfor %}";
        let err = render_one(&env, "roles.x.files[0].template", big, &ctx).unwrap_err();
        assert!(err.message.contains("over the limit"), "{err}");
    }

    fn member(ordinal: u32, host: &str, base: u16) -> MemberCtx {
        MemberCtx {
            id: format!("zk-server-{ordinal}-abcdef"),
            ordinal,
            host: host.into(),
            node: format!("node-{ordinal}"),
            ports: BTreeMap::from([("client".into(), base), ("peer".into(), base + 1), ("election".into(), base + 2)]),
        }
    }

    /// Instance 2 of a three-member cluster, members given out of order.
    fn context() -> RenderContext {
        let members = vec![member(3, "127.0.0.13", 7000), member(1, "127.0.0.11", 5000), member(2, "127.0.0.12", 6000)];
        let me = &members[2];
        RenderContext {
            component: ComponentCtx { name: "zookeeper".into(), version: "3.8.0".into() },
            cluster: ClusterCtx {
                name: "zk".into(),
                id: "6f1c0d2e-0000-4000-8000-000000000000".into(),
                config: BTreeMap::from([
                    ("tick_time".into(), serde_json::json!(2000)),
                    ("heap".into(), serde_json::json!("small")),
                ]),
                roles: BTreeMap::from([("server".into(), RoleCtx { count: 3, members: members.clone() })]),
            },
            instance: InstanceCtx {
                id: me.id.clone(),
                ordinal: me.ordinal,
                role: "server".into(),
                host: me.host.clone(),
                node: me.node.clone(),
                ports: me.ports.clone(),
                dir: "/srv/flotilla/instances/zk-server-2-abcdef".into(),
                data_dir: "/srv/flotilla/instances/zk-server-2-abcdef/data".into(),
            },
        }
    }

    fn role(files: &str, env: &str) -> RoleSpec {
        let text = format!(
            "[component]\nname = \"zookeeper\"\nversion = \"3.8.0\"\n[[roles]]\nname = \"server\"\nports = [\"client\", \"peer\", \"election\"]\nstart = [\"bin/zk\"]\nenv = {{ {env} }}\n{files}"
        );
        let spec = ComponentSpec::parse(&text).unwrap();
        spec.roles.into_iter().next().unwrap()
    }

    const ZOO_CFG: &str = r#"
[[roles.files]]
path = "conf/zoo.cfg"
template = """
tickTime={{ cluster.config.tick_time }}
clientPort={{ instance.ports.client }}
dataDir={{ instance.data_dir }}
{% for m in cluster.roles.server.members %}server.{{ m.ordinal }}={{ m.host }}:{{ m.ports.peer }}:{{ m.ports.election }}
{% endfor %}"""

[[roles.files]]
path = "data/myid"
template = "{{ instance.ordinal }}\n"
mode = 0o600
"#;

    #[test]
    fn renders_a_zoo_cfg_listing_members_in_ordinal_order() {
        let files = render_files(&role(ZOO_CFG, ""), &context()).unwrap();
        assert_eq!(files.len(), 2);
        assert_eq!(files[0].path, "conf/zoo.cfg");
        assert_eq!(files[0].mode, 0o644);
        assert_eq!(
            String::from_utf8(files[0].contents.clone()).unwrap(),
            "tickTime=2000\n\
             clientPort=6000\n\
             dataDir=/srv/flotilla/instances/zk-server-2-abcdef/data\n\
             server.1=127.0.0.11:5001:5002\n\
             server.2=127.0.0.12:6001:6002\n\
             server.3=127.0.0.13:7001:7002\n"
        );
        assert_eq!(files[1], RenderedFile { path: "data/myid".into(), contents: b"2\n".to_vec(), mode: 0o600 });
    }

    #[test]
    fn rendering_is_byte_identical_across_runs() {
        let role = role(ZOO_CFG, "A = \"{{ cluster.config }}\", B = \"{{ cluster.roles }}\"");
        let first = (render_files(&role, &context()).unwrap(), render_env(&role, &context()).unwrap());
        for _ in 0..5 {
            let again = (render_files(&role, &context()).unwrap(), render_env(&role, &context()).unwrap());
            assert_eq!(first, again);
        }
    }

    #[test]
    fn an_undefined_variable_is_an_error_naming_the_file() {
        let files = r#"
[[roles.files]]
path = "a"
template = "ok"
[[roles.files]]
path = "b"
template = "line one\nport={{ instance.ports.admin }}\n"
"#;
        let err = render_files(&role(files, ""), &context()).unwrap_err();
        assert_eq!(err.field, "roles.server.files[1].template");
        assert!(err.message.contains("undefined"), "{err}");
        assert!(err.message.contains("instance.ports.admin"), "{err}");
        assert!(err.message.contains(":2"), "line number missing: {err}");

        let top = "[[roles.files]]\npath = \"a\"\ntemplate = \"{{ nothing }}\"\n";
        let err = render_files(&role(top, ""), &context()).unwrap_err();
        assert_eq!(err.field, "roles.server.files[0].template");
        assert!(err.message.contains("nothing"), "{err}");

        let in_if = "[[roles.files]]\npath = \"a\"\ntemplate = \"{% if cluster.config.missing %}x{% endif %}\"\n";
        assert!(render_files(&role(in_if, ""), &context()).is_err());
    }

    #[test]
    fn no_auto_escaping_and_no_filesystem() {
        let files = "[[roles.files]]\npath = \"a\"\ntemplate = \"{{ '<a&b>' }}\"\n";
        let out = render_files(&role(files, ""), &context()).unwrap();
        assert_eq!(out[0].contents, b"<a&b>");
        let include = "[[roles.files]]\npath = \"a\"\ntemplate = \"{% include '/etc/passwd' %}\"\n";
        let err = render_files(&role(include, ""), &context()).unwrap_err();
        assert!(err.message.contains("not found") || err.message.contains("does not exist"), "{err}");
    }

    #[test]
    fn renders_env_sorted_by_name() {
        let role = role(
            "",
            "ZOO_LOG_DIR = \"{{ instance.dir }}/logs\", HEAP = \"{{ cluster.config.heap }}\", ID = \"{{ instance.ordinal }}\"",
        );
        let env = render_env(&role, &context()).unwrap();
        assert_eq!(
            env,
            [
                ("HEAP".to_string(), "small".to_string()),
                ("ID".to_string(), "2".to_string()),
                ("ZOO_LOG_DIR".to_string(), "/srv/flotilla/instances/zk-server-2-abcdef/logs".to_string()),
            ]
        );
        let bad = role_with_env("X = \"{{ instance.nope }}\"");
        let err = render_env(&bad, &context()).unwrap_err();
        assert_eq!(err.field, "roles.server.env.X");
        assert!(err.message.contains("instance.nope"), "{err}");
    }

    fn role_with_env(env: &str) -> RoleSpec {
        role("", env)
    }
}
