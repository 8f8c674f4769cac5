//! Upgrade: a rolling, health-gated replacement of every instance's package,
//! keeping its data; a version whose instances do not come up is rolled
//! back, and the cluster returns to Active with the reason.
//! Also the scale-out rollback: a new member that fails to start is
//! removed again, and the cluster is Active as it was.

use serde_json::{Value, json};

use crate::common::{PackageBuilder, TestEnv, dir_of, error_code, id_of, pid_alive, pid_of, role_instances};

fn spec(version: &str) -> String {
    format!(
        r#"
[component]
name = "up"
version = "{version}"

[[roles]]
name = "svc"
count = {{ min = 1, max = 7 }}
ports = ["main"]
start = ["bin/start.sh"]
stop_grace = "2s"
start_timeout = "5s"
# The health check (data/version is there) passes on data an older version
# left: a start that dies at once is caught by this window, not by it.
start_settle = "300ms"
init = ["bin/init.sh"]
health = {{ cmd = ["bin/health.sh"] }}

[[roles.files]]
path = "conf/members"
template = "{{% for m in cluster.roles.svc.members %}}{{{{ m.ordinal }}}} {{% endfor %}}\n"

[[roles.files]]
path = "conf/ordinal"
template = "{{{{ instance.ordinal }}}}\n"
"#
    )
}

/// Records its version; `broken` exits at once, `picky` refuses ordinals above 3.
fn start(version: &str, mode: &str) -> String {
    let check = match mode {
        "broken" => "echo 'this version cannot start' >&2; exit 2\n".to_string(),
        "picky" => "if [ \"$(cat conf/ordinal)\" -gt 3 ]; then echo \"member $(cat conf/ordinal) refuses to join\" >&2; exit 2; fi\n".to_string(),
        _ => String::new(),
    };
    format!("set -eu\n{check}echo {version} > data/version\nexec sleep 100000\n")
}

fn package(version: &str, mode: &str) -> PackageBuilder {
    PackageBuilder::new("up", version)
        .spec(&spec(version))
        .script("bin/start.sh", &start(version, mode))
        .script("bin/init.sh", "set -eu\ndate +%s%N > data/created\n")
        .script("bin/health.sh", "test -s data/version\n")
}

fn read(i: &Value, rel: &str) -> String {
    std::fs::read_to_string(dir_of(i).join(rel)).unwrap_or_default()
}

#[tokio::test]
async fn upgrade_and_back_then_a_broken_version_is_rolled_back() {
    let env = TestEnv::start("upgrade").await;
    for (v, mode) in [("1.0.0", ""), ("2.0.0", ""), ("3.0.0", "broken")] {
        env.upload(&package(v, mode)).await;
    }
    let body = json!({"name": "up", "package": {"name": "up", "version": "1.0.0"}, "roles": {"svc": {"count": 3}}});
    let v1 = role_instances(&env.create_active(body).await, "svc");
    let created: Vec<String> = v1.iter().map(|i| read(i, "data/created")).collect();

    for version in ["2.0.0", "1.0.0"] {
        let (status, resp) = env.post("/clusters/up/upgrade", json!({"version": version})).await;
        assert_eq!(status, 202, "{resp:#}");
        if version == "2.0.0" {
            // The version an upgrade's undo would go back to stays in use,
            // and so does the one it goes to, from its 202 on.
            for v in ["1.0.0", "2.0.0"] {
                let (status, body) = env.delete(&format!("/packages/up/{v}")).await;
                assert_eq!((status.as_u16(), error_code(&body)), (409, "package_in_use"), "{v}: {body:#}");
            }
        }
        let op = env.wait_op(resp["operation"]["id"].as_str().unwrap()).await;
        env.assert_succeeded(&op);
        assert_eq!(op["kind"], "Upgrade");
        let c = env.cluster("up").await;
        assert_eq!((c["status"].as_str(), c["package"]["version"].as_str()), (Some("Active"), Some(version)));
        for (i, before) in role_instances(&c, "svc").iter().zip(&created) {
            assert_eq!(read(i, "data/version").trim(), version, "{}", id_of(i));
            assert_eq!(&read(i, "data/created"), before, "{} lost its data", id_of(i));
            assert!(pid_alive(pid_of(i)));
        }
    }

    // 3.0.0 cannot start: the first replaced instance is put back on 1.0.0,
    // the others were never touched, and the cluster says why.
    let before = role_instances(&env.cluster("up").await, "svc");
    let op = env.run_op("/clusters/up/upgrade", Some(json!({"version": "3.0.0"}))).await;
    assert_eq!(op["status"], "RolledBack", "{op:#}");
    let c = env.cluster("up").await;
    assert_eq!(c["status"], "Active", "{c:#}");
    assert_eq!(c["package"]["version"], "1.0.0");
    let why = c["status_description"].as_str().unwrap();
    assert!(why.contains("rolled back") && why.contains("this version cannot start"), "{why}");
    for (i, b) in role_instances(&c, "svc").iter().zip(&before) {
        assert_eq!(read(i, "data/version").trim(), "1.0.0", "{}", id_of(i));
        assert_eq!(i["status"], "Running");
        assert!(pid_alive(pid_of(i)));
        if id_of(i) != id_of(&before[0]) {
            assert_eq!(pid_of(i), pid_of(b), "{} was touched although the first one failed", id_of(i));
        }
    }

    // 4.0.0 cannot even be installed (its run-as user exists nowhere): the
    // first instance was already stopped for its replacement when the
    // install failed; the rollback must start it again, on 1.0.0.
    env.upload(&package("4.0.0", "").spec(&spec("4.0.0").replace("start = [", "run_as = \"nosuchuser\"\nstart = [")))
        .await;
    let op = env.run_op("/clusters/up/upgrade", Some(json!({"version": "4.0.0"}))).await;
    assert_eq!(op["status"], "RolledBack", "{op:#}");
    let c = env.cluster("up").await;
    assert_eq!(c["status"], "Active", "{c:#}");
    assert!(c["status_description"].as_str().unwrap().contains("nosuchuser"), "{c:#}");
    for i in role_instances(&c, "svc") {
        assert_eq!(i["status"], "Running", "{i:#}");
        assert!(pid_alive(pid_of(&i)), "{} was left stopped by the rollback", id_of(&i));
        assert_eq!(read(&i, "data/version").trim(), "1.0.0");
    }

    // An unknown version is refused up front.
    let (status, body) = env.post("/clusters/up/upgrade", json!({"version": "9.9.9"})).await;
    assert_eq!(status, 404, "{body:#}");
}

#[tokio::test]
async fn a_scale_out_whose_new_member_fails_is_rolled_back() {
    let env = TestEnv::start("scale-rollback").await;
    env.upload(&package("1.0.0", "picky")).await;
    let body = json!({"name": "sr", "package": {"name": "up", "version": "1.0.0"}, "roles": {"svc": {"count": 3}}});
    let before = role_instances(&env.create_active(body).await, "svc");

    let op = env.run_op("/clusters/sr/scale", Some(json!({"role": "svc", "add": 2}))).await;
    assert_eq!(op["status"], "RolledBack", "{op:#}");
    let c = env.cluster("sr").await;
    assert_eq!(c["status"], "Active", "{c:#}");
    let why = c["status_description"].as_str().unwrap();
    assert!(why.contains("rolled back") && why.contains("refuses to join"), "{why}");
    let after = role_instances(&c, "svc");
    assert_eq!(after.len(), 3, "{c:#}");
    for (a, b) in after.iter().zip(&before) {
        assert_eq!(pid_of(a), pid_of(b), "{} was restarted", id_of(a));
        assert_eq!(read(a, "conf/members"), "1 2 3 \n", "{} keeps the old membership", id_of(a));
    }
    // The new members left nothing behind on any agent.
    let instances_dirs = env.agent_instance_dirs();
    assert_eq!(instances_dirs.len(), 3, "{instances_dirs:?}");

    // Ordinals are never reused: the next members are 6 and 7 (and refuse too).
    let op = env.run_op("/clusters/sr/scale", Some(json!({"role": "svc", "add": 2}))).await;
    let allocate = op["steps"].as_array().unwrap().iter().find(|s| s["name"] == "allocate").unwrap();
    let ids: Vec<&str> =
        allocate["results"].as_array().unwrap().iter().map(|r| r["instance"].as_str().unwrap()).collect();
    assert_eq!(ids.len(), 2, "{op:#}");
    assert!(ids.iter().all(|i| i.starts_with("sr-svc-6-") || i.starts_with("sr-svc-7-")), "{ids:?}");
}
