//! The renderer's behaviour on ordinary templates: context, order, errors.

use super::*;
use crate::spec::ComponentSpec;

#[test]
fn a_hostile_template_runs_out_of_fuel_or_size_instead_of_hanging() {
    let ctx = Value::from(());
    let spin = "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}";
    let started = std::time::Instant::now();
    let err = render_source("roles.x.files[0].template", spin, &ctx).unwrap_err();
    assert!(err.message.contains("fuel"), "{err}");
    assert!(started.elapsed() < std::time::Duration::from_secs(20), "fuel did not stop it early");
    let big = "{% for a in range(60000) %}{{ 'x' * 100 }}{% endfor %}";
    let err = render_source("roles.x.files[0].template", big, &ctx).unwrap_err();
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
path = "conf/myid"
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
    assert_eq!(files[1], RenderedFile { path: "conf/myid".into(), contents: b"2\n".to_vec(), mode: 0o600 });
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
    // No include at all: refused when the spec is parsed.
    let include = "[component]\nname = \"z\"\nversion = \"1\"\n[[roles]]\nname = \"s\"\nstart = [\"bin/z\"]\n[[roles.files]]\npath = \"a\"\ntemplate = \"{% include '/etc/passwd' %}\"\n";
    let err = ComponentSpec::parse(include).unwrap_err();
    assert!(err.to_string().contains("`include` and `import` are not available"), "{err}");
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
