//! Tests of parsing and validation: one per rule of DESIGN.md §8, each
//! asserting the reported field and a key word of the message; plus
//! `resolve_config` and `check_count`.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::json;

use super::*;
use crate::storage::records::ConfigValue;

/// The DESIGN.md §8 example, with the `[...]` placeholders made real.
pub(super) const ZOOKEEPER: &str = r#"
[component]
name = "zookeeper"
version = "3.8.0"

[config]
tick_time = { type = "int", default = 2000, min = 100 }
heap = { type = "string", choices = ["small", "large"], default = "small", description = "JVM heap" }
ratio = { type = "float", default = 1, min = 0.5, max = 4.0 }
secret = { type = "string" }

[[roles]]
name = "server"
order = 0
count = { min = 1, max = 9, odd = true }
run_as = "zookeeper"
ports = ["client", "peer", "election"]
start = ["bin/zk-start.sh"]
pidfile = "run/zk.pid"
stop = ["bin/zk-stop.sh"]
stop_grace = "10s"
resources = { memory = "512M", cpu = 1.0 }
health = { tcp = "client" }
init = ["bin/zk-init.sh"]
scale_out = ["bin/zk-reconfig.sh", "add"]
scale_in = ["bin/zk-reconfig.sh", "remove"]
reload = ["/bin/kill", "-HUP", "1"]
destroy = ["bin/zk-destroy.sh"]
env = { ZOO_LOG_DIR = "{{ instance.dir }}/logs" }

[[roles.files]]
path = "conf/zoo.cfg"
template = """
clientPort={{ instance.ports.client }}
{% for m in cluster.roles.server.members %}server.{{ m.ordinal }}={{ m.host }}:{{ m.ports.peer }}:{{ m.ports.election }}
{% endfor %}"""

[[roles.files]]
path = "conf/myid"
template = "{{ instance.ordinal }}\n"
mode = 0o600

[[roles]]
name = "observer"
order = 1
start = ["java", "-jar", "observer.jar"]
health = { cmd = ["bin/ruok.sh"] }

[[roles]]
name = "ui"
order = 1
count = { min = 0, max = 2 }
start = ["./bin/ui"]
start_timeout = "2m"
hook_timeout = "30s"
"#;

/// The smallest valid spec, with `extra` appended inside its one role.
fn minimal(extra: &str) -> String {
    format!("[component]\nname = \"c\"\nversion = \"1\"\n[[roles]]\nname = \"web\"\nstart = [\"bin/run\"]\n{extra}\n")
}

/// Parses a spec that must fail and checks the field and a word of the message.
#[track_caller]
fn rejects(text: &str, field: &str, word: &str) {
    let err = ComponentSpec::parse(text).expect_err("spec accepted");
    assert_eq!(err.field, field, "{err}");
    assert!(err.message.contains(word), "message of {err} lacks {word:?}");
}

#[track_caller]
fn role_rejects(extra: &str, field: &str, word: &str) {
    rejects(&minimal(extra), field, word);
}

#[test]
fn parses_the_design_example() {
    let spec = ComponentSpec::parse(ZOOKEEPER).unwrap();
    assert_eq!(spec.component, ComponentInfo { name: "zookeeper".into(), version: "3.8.0".into() });
    assert_eq!(spec.roles.iter().map(|r| r.name.as_str()).collect::<Vec<_>>(), ["server", "observer", "ui"]);
    let tick = &spec.config["tick_time"];
    assert_eq!(tick.kind, ConfigType::Int);
    assert_eq!(tick.default, Some(ConfigValue::Int(2000)));
    assert_eq!(tick.min, Some(100.0));
    assert_eq!(spec.config["ratio"].default, Some(ConfigValue::Float(1.0)));
    assert_eq!(spec.config["heap"].description.as_deref(), Some("JVM heap"));
    assert_eq!(spec.config["secret"].default, None);

    let server = spec.role("server").unwrap();
    assert_eq!(server.count, CountRule { min: 1, max: 9, odd: true });
    assert_eq!(server.run_as.as_deref(), Some("zookeeper"));
    assert_eq!(server.ports, ["client", "peer", "election"]);
    assert_eq!(server.start, ["bin/zk-start.sh"]);
    assert_eq!(server.pidfile.as_deref(), Some("run/zk.pid"));
    assert_eq!(server.stop.as_deref(), Some(&["bin/zk-stop.sh".to_string()][..]));
    assert_eq!(server.stop_grace, Duration::from_secs(10));
    assert_eq!(server.resources, Some(Resources { memory_bytes: Some(512 << 20), cpu: Some(1.0) }));
    assert_eq!(server.health, Some(HealthCheck::Tcp { port: "client".into() }));
    assert_eq!(server.scale_in.as_ref().unwrap()[1], "remove");
    assert_eq!(server.env["ZOO_LOG_DIR"], "{{ instance.dir }}/logs");
    assert_eq!(server.files.len(), 2);
    assert_eq!(server.files[0].path, "conf/zoo.cfg");
    assert_eq!(server.files[0].mode, 0o644);
    assert!(server.files[0].template.starts_with("clientPort="));
    assert_eq!(server.files[1].mode, 0o600);

    let observer = spec.role("observer").unwrap();
    assert_eq!(observer.count, CountRule { min: 1, max: 1, odd: false });
    assert_eq!(observer.health, Some(HealthCheck::Cmd { argv: vec!["bin/ruok.sh".into()] }));
    assert_eq!(observer.stop_grace, Duration::from_secs(10));
    assert_eq!(observer.start_timeout, Duration::from_secs(60));
    assert_eq!(observer.hook_timeout, Duration::from_secs(60));
    assert!(observer.files.is_empty() && observer.env.is_empty() && observer.pidfile.is_none());

    let ui = spec.role("ui").unwrap();
    assert_eq!(ui.count, CountRule { min: 0, max: 2, odd: false });
    assert_eq!(ui.start_timeout, Duration::from_secs(120));
    assert_eq!(ui.hook_timeout, Duration::from_secs(30));
    assert!(spec.role("nope").is_none());
}

#[test]
fn roles_group_by_order() {
    let spec = ComponentSpec::parse(ZOOKEEPER).unwrap();
    let groups: Vec<Vec<&str>> =
        spec.roles_by_order().iter().map(|g| g.iter().map(|r| r.name.as_str()).collect()).collect();
    assert_eq!(groups, [vec!["server"], vec!["observer", "ui"]]);
}

#[test]
fn spec_error_converts_to_a_spec_violation() {
    let err = SpecError::new("roles.web.count", "count 2 must be odd");
    assert_eq!(err.to_string(), "roles.web.count: count 2 must be odd");
    let domain: crate::error::Error = err.into();
    assert_eq!(domain, crate::error::Error::spec("roles.web.count", "count 2 must be odd"));
}

#[test]
fn unknown_keys_are_refused() {
    role_rejects("colour = \"red\"", "roles.web.colour", "unknown field `colour`");
    rejects(&minimal("").replace("[component]", "[component]\nauthor = \"me\""), "component.author", "unknown field");
    rejects(
        &format!("{}[config]\nx = {{ type = \"int\", deflt = 1 }}\n", minimal("")),
        "config.x.deflt",
        "unknown field",
    );
}

#[test]
fn syntax_errors_name_the_line() {
    rejects("[component\nname = 1", "component.toml", "line 1");
}

#[test]
fn component_name_and_version() {
    rejects(&minimal("").replace("name = \"c\"", "name = \"Zoo\""), "component.name", "must");
    rejects(&minimal("").replace("version = \"1\"", "version = \"1/2\""), "component.version", "not allowed");
}

#[test]
fn roles_are_required_named_and_unique() {
    rejects("[component]\nname = \"c\"\nversion = \"1\"\n", "roles", "at least one role");
    rejects(&minimal("").replace("name = \"web\"", "name = \"Web\""), "roles[0].name", "invalid role name");
    rejects(&format!("{}[[roles]]\nname = \"web\"\nstart = [\"x\"]\n", minimal("")), "roles.web.name", "duplicate");
}

#[test]
fn count_rules() {
    role_rejects("count = { min = 0, max = 0 }", "roles.web.count.max", "at least 1");
    role_rejects("count = { min = 3, max = 2 }", "roles.web.count.min", "must not exceed");
    role_rejects("count = { max = 10001 }", "roles.web.count.max", "at most 10000");
    role_rejects("count = { min = 2, max = 2, odd = true }", "roles.web.count.odd", "no odd number");
    role_rejects("count = { min = -1 }", "roles.web.count.min", "invalid value");
    let spec = ComponentSpec::parse(&minimal("count = { min = 2, max = 3, odd = true }")).unwrap();
    assert_eq!(spec.roles[0].count, CountRule { min: 2, max: 3, odd: true });
    let spec = ComponentSpec::parse(&minimal("count = { min = 4 }")).unwrap();
    assert_eq!(spec.roles[0].count, CountRule { min: 4, max: 4, odd: false });
}

#[test]
fn port_rules() {
    role_rejects("ports = [\"Client\"]", "roles.web.ports[0]", "invalid port name");
    role_rejects("ports = [\"a\", \"b\", \"a\"]", "roles.web.ports[2]", "duplicate");
    let many: Vec<String> = (0..33).map(|i| format!("\"p{i}\"")).collect();
    role_rejects(&format!("ports = [{}]", many.join(",")), "roles.web.ports", "at most 32");
    let ok: Vec<String> = (0..32).map(|i| format!("\"p{i}\"")).collect();
    assert!(ComponentSpec::parse(&minimal(&format!("ports = [{}]", ok.join(",")))).is_ok());
}

#[test]
fn argv_rules() {
    let start = |s: &str| minimal("").replace("start = [\"bin/run\"]", &format!("start = {s}"));
    rejects(&start("[]"), "roles.web.start", "must not be empty");
    rejects(&start("[\"bin/run\", \"\"]"), "roles.web.start[1]", "must not be empty");
    rejects(&start("[\"bin/run\", \"a\\u0000b\"]"), "roles.web.start[1]", "NUL");
    rejects(&start("[\"../bin/run\"]"), "roles.web.start[0]", "..");
    role_rejects("stop = []", "roles.web.stop", "must not be empty");
    role_rejects("init = [\"a//b\"]", "roles.web.init[0]", "empty components");
    role_rejects("scale_out = [\"\"]", "roles.web.scale_out[0]", "must not be empty");
    role_rejects("scale_in = []", "roles.web.scale_in", "must not be empty");
    role_rejects("reload = [\"bin/../../x\"]", "roles.web.reload[0]", "..");
    role_rejects("destroy = []", "roles.web.destroy", "must not be empty");
    role_rejects("health = { cmd = [] }", "roles.web.health.cmd", "must not be empty");
    assert!(ComponentSpec::parse(&start("[\"/usr/bin/python3\", \"-m\", \"http.server\"]")).is_ok());
    assert!(ComponentSpec::parse(&start("[\"sleep\", \"1000\"]")).is_ok());
}

#[test]
fn pidfile_rules() {
    role_rejects("pidfile = \"/run/x.pid\"", "roles.web.pidfile", "not absolute");
    role_rejects("pidfile = \"run/../x.pid\"", "roles.web.pidfile", "..");
    role_rejects("pidfile = \"run//x.pid\"", "roles.web.pidfile", "empty components");
    role_rejects(&format!("pidfile = \"{}\"", "a".repeat(256)), "roles.web.pidfile", "255");
    role_rejects("pidfile = \"run\"", "roles.web.pidfile", "the instance owns");
}

#[test]
fn file_rules() {
    let file = |path: &str, extra: &str| format!("[[roles.files]]\npath = \"{path}\"\ntemplate = \"x\"\n{extra}\n");
    role_rejects(&file("/etc/passwd", ""), "roles.web.files[0].path", "not absolute");
    role_rejects(&file("conf/../../x", ""), "roles.web.files[0].path", "..");
    role_rejects(&file("conf//x", ""), "roles.web.files[0].path", "empty components");
    role_rejects(&file("a\\u0000b", ""), "roles.web.files[0].path", "NUL");
    role_rejects(&file(&"a".repeat(256), ""), "roles.web.files[0].path", "255");
    role_rejects(&file("data", ""), "roles.web.files[0].path", "which the instance owns");
    role_rejects(&file("logs", ""), "roles.web.files[0].path", "which the instance owns");
    role_rejects(&file("data/myid", ""), "roles.web.files[0].path", "inside data/");
    role_rejects(&file("run/app.pid", ""), "roles.web.files[0].path", "inside run/");
    role_rejects(&format!("{}{}", file("a", ""), file("a", "")), "roles.web.files[1].path", "duplicate");
    role_rejects(&file("a", "mode = 0o4755"), "roles.web.files[0].mode", "setuid");
    role_rejects(&file("a", "mode = \"0755\""), "roles.web.files[0].mode", "invalid type");
    role_rejects(&file("a", "mode = -1"), "roles.web.files[0].mode", "invalid value");
    let spec =
        ComponentSpec::parse(&minimal(&format!("{}{}", file("conf/myid", "mode = 493"), file("b", "")))).unwrap();
    assert_eq!(spec.roles[0].files[0].mode, 0o755);
    assert_eq!(spec.roles[0].files[1].mode, 0o644);
}

/// Each file's change mode (Nomad's `change_mode`), its default, and what
/// is refused.
#[test]
fn change_mode_rules() {
    let file = |extra: &str| format!("[[roles.files]]\npath = \"a\"\ntemplate = \"x\"\n{extra}\n");
    let mode = |role_extra: &str, file_extra: &str| {
        ComponentSpec::parse(&minimal(&format!("{role_extra}\n{}", file(file_extra)))).unwrap().roles[0].files[0].change
    };
    let reload = "reload = [\"bin/reload\"]";
    assert_eq!(mode("", ""), ChangeMode::Restart, "the default without a reload hook");
    assert_eq!(mode(reload, ""), ChangeMode::Reload, "the default with one");
    assert_eq!(mode(reload, "change_mode = \"restart\""), ChangeMode::Restart);
    assert_eq!(mode("", "change_mode = \"noop\""), ChangeMode::Noop);
    assert_eq!(mode("", "change_mode = \"none\""), ChangeMode::Noop, "none is noop");
    assert_eq!(mode("", "change_mode = \"signal\"\nchange_signal = \"hup\""), ChangeMode::Signal(1));
    assert_eq!(mode("", "change_mode = \"signal\"\nchange_signal = \"SIGUSR1\""), ChangeMode::Signal(10));
    let f = "roles.web.files[0]";
    role_rejects(&file("change_mode = \"reload\""), &format!("{f}.change_mode"), "reload hook");
    role_rejects(&file("change_mode = \"bounce\""), &format!("{f}.change_mode"), "not one of");
    role_rejects(&file("change_mode = \"signal\""), &format!("{f}.change_signal"), "needs change_signal");
    role_rejects(&file("change_signal = \"SIGHUP\""), &format!("{f}.change_signal"), "only with");
    role_rejects(
        &file("change_mode = \"signal\"\nchange_signal = \"SIGNOPE\""),
        &format!("{f}.change_signal"),
        "not a signal",
    );
    role_rejects(
        &file("change_mode = \"signal\"\nchange_signal = \"KILL\""),
        &format!("{f}.change_signal"),
        "cannot be caught",
    );
    // Heaviest first: the mode that applies when several files change.
    assert!(ChangeMode::Restart > ChangeMode::Reload && ChangeMode::Reload > ChangeMode::Signal(1));
    assert!(ChangeMode::Signal(1) > ChangeMode::Noop);
}

#[test]
fn templates_are_compiled_at_parse_time() {
    role_rejects(
        "[[roles.files]]\npath = \"a\"\ntemplate = \"{% for x in y %}\"",
        "roles.web.files[0].template",
        "syntax error",
    );
    role_rejects("env = { A = \"{{ instance.dir \" }", "roles.web.env.A", "syntax error");
}

#[test]
fn run_as_rule() {
    role_rejects("run_as = \"Root\"", "roles.web.run_as", "invalid user name");
    role_rejects(&format!("run_as = \"{}\"", "u".repeat(33)), "roles.web.run_as", "[a-z_]");
    assert!(ComponentSpec::parse(&minimal("run_as = \"_svc-1\"")).is_ok());
}

#[test]
fn env_key_rule() {
    role_rejects("env = { \"1A\" = \"x\" }", "roles.web.env.1A", "invalid variable name");
    role_rejects("env = { \"A-B\" = \"x\" }", "roles.web.env.A-B", "invalid variable name");
}

#[test]
fn duration_rules() {
    role_rejects("stop_grace = \"0s\"", "roles.web.stop_grace", "greater than zero");
    role_rejects("start_timeout = \"2h\"", "roles.web.start_timeout", "at most 1h");
    role_rejects("hook_timeout = \"soon\"", "roles.web.hook_timeout", "invalid duration");
    role_rejects("stop_grace = 10", "roles.web.stop_grace", "invalid type");
}

#[test]
fn start_settle_defaults_to_a_second_without_a_health_check() {
    let settle = |extra: &str| ComponentSpec::parse(&minimal(extra)).unwrap().roles[0].start_settle;
    assert_eq!(settle(""), Duration::from_secs(1));
    // A check decides when a start counts; no settle window on top.
    assert_eq!(settle("ports = [\"http\"]\nhealth = { tcp = \"http\" }"), Duration::ZERO);
    // Never longer than the start may take.
    assert_eq!(settle("start_timeout = \"300ms\""), Duration::from_millis(300));
    assert_eq!(settle("start_settle = \"0s\""), Duration::ZERO);
    assert_eq!(settle("start_settle = \"2500ms\""), Duration::from_millis(2500));
    role_rejects("start_settle = \"2m\"", "roles.web.start_settle", "longer than start_timeout");
    role_rejects("start_settle = \"later\"", "roles.web.start_settle", "invalid duration");
}

#[test]
fn health_rules() {
    role_rejects("ports = [\"http\"]\nhealth = { tcp = \"admin\" }", "roles.web.health.tcp", "not a declared port");
    role_rejects("health = { }", "roles.web.health", "exactly one");
    role_rejects("ports = [\"http\"]\nhealth = { tcp = \"http\", cmd = [\"x\"] }", "roles.web.health", "exactly one");
    role_rejects("health = { http = \"/\" }", "roles.web.health.http", "unknown field");
}

#[test]
fn resource_rules() {
    role_rejects("resources = { memory = \"1M\" }", "roles.web.resources.memory", "at least 4M");
    role_rejects("resources = { memory = \"lots\" }", "roles.web.resources.memory", "suffix");
    role_rejects("resources = { memory = \"1.5\" }", "roles.web.resources.memory", "512M");
    role_rejects("resources = { memory = -5 }", "roles.web.resources.memory", "negative");
    role_rejects("resources = { memory = 1.5 }", "roles.web.resources.memory", "got float");
    role_rejects("resources = { cpu = 0 }", "roles.web.resources.cpu", "> 0");
    role_rejects("resources = { cpu = 1025 }", "roles.web.resources.cpu", "<= 1024");
    role_rejects("resources = { cpu = nan }", "roles.web.resources.cpu", "> 0");
    let spec = ComponentSpec::parse(&minimal("resources = { memory = 8388608, cpu = 2 }")).unwrap();
    assert_eq!(spec.roles[0].resources, Some(Resources { memory_bytes: Some(8 << 20), cpu: Some(2.0) }));
}

fn with_config(param: &str) -> String {
    format!("{}[config]\n{param}\n", minimal(""))
}

#[test]
fn config_param_rules() {
    rejects(&with_config("Tick = { type = \"int\" }"), "config.Tick", "invalid parameter name");
    rejects(&with_config("t = { type = \"integer\" }"), "config.t.type", "unknown type");
    rejects(&with_config("t = { type = \"int\", default = \"2000\" }"), "config.t.default", "wrong type");
    rejects(&with_config("t = { type = \"int\", default = 1.5 }"), "config.t.default", "wrong type");
    rejects(&with_config("t = { type = \"bool\", default = 1 }"), "config.t.default", "wrong type");
    rejects(&with_config("t = { type = \"int\", default = 50, min = 100 }"), "config.t.default", "below the minimum");
    rejects(&with_config("t = { type = \"float\", default = 5.5, max = 5 }"), "config.t.default", "above the maximum");
    rejects(&with_config("t = { type = \"float\", default = nan }"), "config.t.default", "finite");
    rejects(&with_config("t = { type = \"int\", min = 10, max = 1 }"), "config.t.min", "must not exceed");
    rejects(&with_config("t = { type = \"string\", min = 1 }"), "config.t.min", "only to int and float");
    rejects(&with_config("t = { type = \"int\", choices = [\"a\"] }"), "config.t.choices", "only to string");
    rejects(&with_config("t = { type = \"string\", choices = [] }"), "config.t.choices", "must not be empty");
    rejects(&with_config("t = { type = \"string\", choices = [\"a\", \"a\"] }"), "config.t.choices", "duplicate");
    rejects(
        &with_config("t = { type = \"string\", choices = [\"a\"], default = \"b\" }"),
        "config.t.default",
        "not one of the choices",
    );
    rejects(&with_config("t = { default = 1 }"), "config.t", "missing field `type`");
}

fn given(pairs: serde_json::Value) -> BTreeMap<String, serde_json::Value> {
    serde_json::from_value(pairs).unwrap()
}

#[test]
fn resolve_config_takes_defaults_then_base_then_given() {
    let spec = ComponentSpec::parse(ZOOKEEPER).unwrap();
    let resolved = spec.resolve_config(&given(json!({"secret": "s3"})), None).unwrap();
    assert_eq!(resolved["tick_time"], ConfigValue::Int(2000));
    assert_eq!(resolved["heap"], ConfigValue::Str("small".into()));
    assert_eq!(resolved["ratio"], ConfigValue::Float(1.0));
    assert_eq!(resolved["secret"], ConfigValue::Str("s3".into()));

    // A float parameter takes a JSON integer; base values survive; given ones win.
    let base = spec.resolve_config(&given(json!({"secret": "s3", "ratio": 2, "heap": "large"})), None).unwrap();
    assert_eq!(base["ratio"], ConfigValue::Float(2.0));
    let mut old = base.clone();
    old.insert("removed_in_this_version".into(), ConfigValue::Bool(true));
    let next = spec.resolve_config(&given(json!({"tick_time": 3000})), Some(&old)).unwrap();
    assert_eq!(next["tick_time"], ConfigValue::Int(3000));
    assert_eq!(next["heap"], ConfigValue::Str("large".into()));
    assert_eq!(next["secret"], ConfigValue::Str("s3".into()));
    assert!(!next.contains_key("removed_in_this_version"));
}

#[track_caller]
fn resolve_rejects(values: serde_json::Value, field: &str, word: &str) {
    let spec = ComponentSpec::parse(ZOOKEEPER).unwrap();
    let err = spec.resolve_config(&given(values), None).expect_err("config accepted");
    assert_eq!(err.field, field, "{err}");
    assert!(err.message.contains(word), "message of {err} lacks {word:?}");
}

#[test]
fn resolve_config_refuses_bad_values() {
    resolve_rejects(json!({"secret": "s", "tick_time": "2000"}), "config.tick_time", "wrong type");
    resolve_rejects(json!({"secret": "s", "tick_time": 1.5}), "config.tick_time", "wrong type");
    resolve_rejects(
        json!({"secret": "s", "tick_time": 18446744073709551615u64}),
        "config.tick_time",
        "out of the range",
    );
    resolve_rejects(json!({"secret": "s", "tick_time": 99}), "config.tick_time", "below the minimum");
    resolve_rejects(json!({"secret": "s", "ratio": 4.5}), "config.ratio", "above the maximum");
    resolve_rejects(json!({"secret": "s", "heap": "huge"}), "config.heap", "not one of the choices");
    resolve_rejects(json!({"secret": 5}), "config.secret", "wrong type");
    resolve_rejects(json!({"secret": null}), "config.secret", "wrong type");
    resolve_rejects(json!({"secret": "s", "tickTime": 2000}), "config.tickTime", "unknown config parameter");
    resolve_rejects(json!({}), "config.secret", "required");
}

#[test]
fn resolve_config_rechecks_base_values() {
    let spec = ComponentSpec::parse(ZOOKEEPER).unwrap();
    let base = BTreeMap::from([
        ("secret".to_string(), ConfigValue::Str("s".into())),
        ("tick_time".to_string(), ConfigValue::Str("2000".into())),
    ]);
    let err = spec.resolve_config(&BTreeMap::new(), Some(&base)).unwrap_err();
    assert_eq!(err.field, "config.tick_time");
    assert!(err.message.contains("wrong type"), "{err}");
}

#[test]
fn check_count_rules() {
    let spec = ComponentSpec::parse(ZOOKEEPER).unwrap();
    assert!(spec.check_count("server", 3).is_ok());
    assert!(spec.check_count("server", 9).is_ok());
    assert!(spec.check_count("ui", 0).is_ok());
    let check = |role: &str, n: u32, field: &str, word: &str| {
        let err = spec.check_count(role, n).expect_err("count accepted");
        assert_eq!(err.field, field, "{err}");
        assert!(err.message.contains(word), "message of {err} lacks {word:?}");
    };
    check("server", 4, "roles.server.count", "odd");
    check("server", 0, "roles.server.count", "below the minimum 1");
    check("server", 11, "roles.server.count", "above the maximum 9");
    check("ui", 3, "roles.ui.count", "above the maximum 2");
    check("observer", 2, "roles.observer.count", "above the maximum 1");
    check("worker", 1, "roles.worker", "unknown role");
}

#[test]
fn templates_know_whether_they_read_the_member_lists() {
    let with = ComponentSpec::parse(ZOOKEEPER).unwrap();
    assert!(with.templates.uses_members(), "zoo.cfg lists the members");
    let without = ComponentSpec::parse(&ZOOKEEPER.replace(
        "{% for m in cluster.roles.server.members %}server.{{ m.ordinal }}={{ m.host }}:{{ m.ports.peer }}:{{ m.ports.election }}\n{% endfor %}",
        "",
    ))
    .unwrap();
    assert!(!without.templates.uses_members(), "{:?}", without.roles[0].files);
}

#[test]
fn a_secret_is_typed_hidden_and_survives_a_type_change() {
    let text = "[component]\nname = \"c\"\nversion = \"1\"\n[config]\npw = { type = \"secret\" }\n[[roles]]\nname = \"web\"\nstart = [\"bin/run\"]\n";
    let spec = ComponentSpec::parse(text).unwrap();
    let typed = spec.resolve_config(&given(json!({"pw": "hunter2"})), None).unwrap();
    assert_eq!(typed["pw"], ConfigValue::Secret("hunter2".into()));
    assert_eq!(typed["pw"].to_json(), json!("hunter2"), "templates see the value");
    assert_eq!(typed["pw"].to_public_json(), json!({"secret": "set"}));
    assert!(!format!("{typed:?}").contains("hunter2"), "Debug shows the secret: {typed:?}");
    // Given back as shown: unchanged; a wrong type: refused without the value.
    let again = spec.resolve_config(&given(json!({"pw": {"secret": "set"}})), Some(&typed)).unwrap();
    assert_eq!(again["pw"], ConfigValue::Secret("hunter2".into()));
    let err = spec.resolve_config(&given(json!({"pw": 987654})), None).unwrap_err();
    assert!(!err.message.contains("987654"), "{err}");
    // As shown without a value to keep, it is not a string.
    spec.resolve_config(&given(json!({"pw": {"secret": "set"}})), None).unwrap_err();
    // A plain string that becomes a secret in a new version is hidden from
    // then on, and one that stops being a secret stays hidden.
    let plain = BTreeMap::from([("pw".to_string(), ConfigValue::Str("old".into()))]);
    assert_eq!(spec.resolve_config(&given(json!({})), Some(&plain)).unwrap()["pw"], ConfigValue::Secret("old".into()));
    let as_string = ComponentSpec::parse(&text.replace("\"secret\"", "\"string\"")).unwrap();
    let kept = as_string.resolve_config(&given(json!({})), Some(&typed)).unwrap();
    assert!(kept["pw"].is_secret(), "{kept:?}");
    // An upgrade's new package hides what it declares secret.
    let mut kept = plain.clone();
    super::config::hide_secrets(&mut kept, &spec.config);
    assert_eq!(kept["pw"], ConfigValue::Secret("old".into()));
    // An operation's parameters keep only that it was set.
    let shown = crate::storage::records::mask_secrets(&given(json!({"pw": "hunter2"})), &typed);
    assert_eq!(shown["pw"], json!({"secret": "set"}));
    // A package cannot ship one.
    rejects(&text.replace("type = \"secret\"", "type = \"secret\", default = \"x\""), "config.pw.default", "secret");
}

#[test]
fn node_labels_are_names_and_bounded() {
    let spec = ComponentSpec::parse(&minimal("node_labels = { class = \"big\", zone = \"a-1\" }")).unwrap();
    let want: BTreeMap<String, String> = [("class".into(), "big".into()), ("zone".into(), "a-1".into())].into();
    assert_eq!(spec.roles[0].node_labels, want);
    assert!(ComponentSpec::parse(&minimal("")).unwrap().roles[0].node_labels.is_empty());
    role_rejects("node_labels = { Class = \"big\" }", "roles.web.node_labels.Class", "invalid label name");
    role_rejects("node_labels = { class = \"B g\" }", "roles.web.node_labels.class", "invalid label value");
    role_rejects("node_labels = { class = 3 }", "roles.web.node_labels.class", "invalid type");
    let many: Vec<String> = (0..65).map(|i| format!("l{i} = \"v\"")).collect();
    role_rejects(&format!("node_labels = {{ {} }}", many.join(", ")), "roles.web.node_labels", "at most 64");
}
