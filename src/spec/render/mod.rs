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
//!
//! A render is bounded in time by fuel ([`RENDER_FUEL`] instructions) and in
//! memory by [`TEMPLATE_MEMORY_BUDGET`]: each template runs as a rewritten
//! copy of its compiled instructions with the budget's checks spliced in,
//! among filters that estimate what they would add before they run.
//!
//! | file | owns |
//! |---|---|
//! | `mod.rs` | the context, the environment, [`Templates`] and rendering |
//! | `budget.rs` | the byte budget, its checks and the estimates |
//! | `constants.rs` | the memory compiling may take: constants minijinja folds |
//! | `rewrite.rs` | the copy of a template's instructions with the checks in |
//! | `builtins.rs` | the filters, tests and functions a template may call |

mod budget;
#[cfg(test)]
mod budget_tests;
mod builtins;
mod constants;
#[cfg(test)]
mod equivalence_tests;
mod rewrite;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

use minijinja::machinery::{self, Instructions};
use minijinja::value::Value;
use minijinja::{AutoEscape, Environment, UndefinedBehavior};
use serde::{Deserialize, Serialize};

pub use self::budget::{TEMPLATE_MEMORY_BUDGET, budget_message};
use super::SpecError;
use super::model::RoleSpec;
use crate::alloc_meter;
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

/// The one environment configuration used to compile and to render: no
/// filter, test or function but the budgeted built-ins (`builtins.rs`) and
/// the budget's own checks.
fn environment() -> Environment<'static> {
    let mut env = Environment::empty();
    env.set_fuel(Some(RENDER_FUEL));
    env.set_undefined_behavior(UndefinedBehavior::Strict);
    env.set_auto_escape_callback(|_| minijinja::AutoEscape::None);
    // Names the undefined expression in errors ("`instance.ports.x` is undefined").
    env.set_debug(true);
    env.set_syntax(syntax());
    builtins::install(&mut env);
    budget::add_checks(&mut env);
    env
}

/// A config file's final newline is content; Jinja's default drops it.
fn syntax() -> minijinja::syntax::SyntaxConfig {
    let mut syntax = minijinja::syntax::SyntaxConfig::builder();
    syntax.keep_trailing_newline(true);
    syntax.build().unwrap_or_default()
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

/// Compiles a template without rendering it (the parse-time check): its
/// syntax, and that it can run under the budget (no `include`, ...).
pub fn compile(field: &str, source: &str) -> Result<(), SpecError> {
    Templates::from_sources([(field.to_owned(), source.to_owned())]).map(|_| ())
}

/// One template as it runs: its rewritten instructions.
struct Program<'a> {
    instructions: Instructions<'a>,
    /// minijinja's guess of the output size, for the first allocation.
    size_hint: usize,
}

/// Every template of a spec by name, borrowing their text from the
/// environment that compiled them.
struct Programs<'a>(BTreeMap<&'a str, Program<'a>>);

self_cell::self_cell!(
    /// The environment (templates, filters) and the rewritten programs
    /// made from it, kept together so a render copies no instructions.
    struct Compiled {
        owner: Environment<'static>,
        #[covariant]
        dependent: Programs,
    }
);

/// Every template of a spec, compiled once when the spec is parsed: a
/// render then costs the render, not a parse of the template (the master
/// renders each of 100,000 instances).
#[derive(Clone)]
pub struct Templates(std::sync::Arc<Compiled>, bool);

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
        let mut sources = Vec::new();
        for role in roles {
            for (i, file) in role.files.iter().enumerate() {
                sources.push((file_field(&role.name, i), file.template.clone()));
            }
            for (key, template) in &role.env {
                sources.push((env_field(&role.name, key), template.clone()));
            }
        }
        Templates::from_sources(sources)
    }

    /// Compiles and rewrites templates given as (name, source).
    fn from_sources(sources: impl IntoIterator<Item = (String, String)>) -> Result<Templates, SpecError> {
        let mut env = environment();
        for (field, source) in sources {
            // Before minijinja compiles it: compiling folds constants.
            constants::check(&field, &source, syntax())
                .map_err(|m| SpecError::new(&field, format!("template error: {m}")))?;
            env.add_template_owned(field.clone(), source).map_err(|e| template_error(&field, &e))?;
        }
        // Whether any template reads the member lists (`cluster.roles`, or
        // `cluster` as a whole): when none does, the master renders a
        // thousand members without building their list each time.
        let uses_members = env.templates().any(|(_, t)| {
            t.undeclared_variables(true).iter().any(|v| v == "cluster" || v.starts_with("cluster.roles"))
        });
        let compiled = Compiled::try_new(env, |env| {
            let mut programs = BTreeMap::new();
            for (name, template) in env.templates() {
                let compiled = machinery::get_compiled_template(&template);
                let instructions = rewrite::rewrite(&compiled.instructions)
                    .map_err(|r| SpecError::new(name, format!("template error: {}", r.0)))?;
                let name: &str = compiled.instructions.name();
                programs.insert(name, Program { instructions, size_hint: compiled.buffer_size_hint });
            }
            Ok::<_, SpecError>(Programs(programs))
        })?;
        Ok(Templates(std::sync::Arc::new(compiled), uses_members))
    }

    /// Whether some template reads the member lists (see [`Templates::compile`]).
    pub fn uses_members(&self) -> bool {
        self.1
    }

    /// Renders template `field` for the context `value`, within the fuel,
    /// the memory budget and the output cap.
    fn render(&self, field: &str, value: &Value) -> Result<String, SpecError> {
        let out = self.0.with_dependent(|env, programs| match programs.0.get(field) {
            Some(program) => run(env, program, field, value),
            None => Err(SpecError::new(field, "template error: no such template")),
        })?;
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

/// Runs one program under the byte meter: every byte it allocates on this
/// thread counts against the budget until it returns (its state included,
/// dropped inside the meter).
fn run(env: &Environment<'_>, program: &Program<'_>, field: &str, value: &Value) -> Result<String, SpecError> {
    budget::reset();
    let (result, _) = alloc_meter::measure(|| {
        let mut out = String::with_capacity(program.size_hint);
        let blocks = BTreeMap::new();
        let result = machinery::eval(
            env,
            &program.instructions,
            value.clone(),
            &blocks,
            &mut machinery::make_string_output(&mut out),
            AutoEscape::None,
        )
        .map(drop);
        result.map(|()| out)
    });
    // A refusal may surface as another error (a filter that wraps it), or
    // not at all (one that swallows it): the budget is what happened.
    if budget::exceeded() {
        let at = match &result {
            Err(e) => e.line().map(|l| format!(" at line {l}")).unwrap_or_default(),
            Ok(_) => String::new(),
        };
        return Err(SpecError::new(field, format!("{}{at}", budget_message())));
    }
    result.map_err(|e| template_error(field, &e))
}

/// Compiles `source` as template `field` and renders it once for `value`:
/// what the tests of this module drive.
#[cfg(test)]
fn render_source(field: &str, source: &str, value: &Value) -> Result<String, SpecError> {
    Templates::from_sources([(field.to_owned(), source.to_owned())])?.render(field, value)
}

/// Renders every file of `role` for the instance described by `ctx`, in
/// file order (compiling the role's templates first; the master keeps them
/// compiled in [`Templates`]).
pub fn render_files(role: &RoleSpec, ctx: &RenderContext) -> Result<Vec<RenderedFile>, SpecError> {
    Templates::compile(std::slice::from_ref(role))?.render_files(role, &ctx.to_value())
}

/// Renders the environment of `role` for the instance described by `ctx`,
/// sorted by variable name.
pub fn render_env(role: &RoleSpec, ctx: &RenderContext) -> Result<Vec<(String, String)>, SpecError> {
    Templates::compile(std::slice::from_ref(role))?.render_env(role, &ctx.to_value())
}
