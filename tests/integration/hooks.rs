//! The AppCenter lifecycle hooks: `init` once before the first start,
//! `scale_out` on the existing members after new ones run, `scale_in` on the
//! remaining members before the removed ones stop (a non-zero exit vetoes,
//! the cluster stays Active with the reason), `destroy` on delete (a
//! non-zero exit vetoes unless `force=true`).

use serde_json::{Value, json};

use crate::common::{PackageBuilder, TestEnv, dir_of, error_code, id_of, pid_alive, pid_of, role_instances};

const SPEC: &str = r#"
[component]
name = "hk"
version = "1.0.0"

[config]
veto_scale_in = { type = "bool", default = false }
fail_destroy = { type = "bool", default = false }

[[roles]]
name = "node"
count = { min = 1, max = 5 }
ports = ["main"]
start = ["bin/start.sh"]
stop_grace = "2s"
init = ["bin/hook.sh", "init"]
scale_out = ["bin/hook.sh", "scale_out"]
scale_in = ["bin/hook.sh", "scale_in"]
destroy = ["bin/hook.sh", "destroy"]
hook_timeout = "5s"

[[roles.files]]
path = "conf/flags"
# Booleans render as Jinja does (True/False); spell them for the shell.
template = """veto_scale_in={{ "true" if cluster.config.veto_scale_in else "false" }}
fail_destroy={{ "true" if cluster.config.fail_destroy else "false" }}
"""

# A later role: its init runs only after every init of order 0 ended.
[[roles]]
name = "late"
order = 1
start = ["bin/sleep.sh"]
init = ["bin/stamp.sh"]
"#;

/// Refuses to start unless `init` ran first.
const START: &str =
    "set -eu\ngrep -q '^init' data/hooks.log || { echo 'init did not run' >&2; exit 1; }\nexec sleep 100000\n";

const HOOK: &str = r#"set -eu
if [ "$1" = init ]; then sleep 0.3; date +%s%N > data/init_done_at; fi
echo "$1" >> data/hooks.log
echo "ran $1"
case "$1" in
  scale_in) if grep -q 'veto_scale_in=true' conf/flags; then echo 'scale-in vetoed: quorum would break' >&2; exit 3; fi ;;
  destroy) if grep -q 'fail_destroy=true' conf/flags; then echo 'destroy refused: data not backed up' >&2; exit 4; fi ;;
esac
"#;

fn package() -> PackageBuilder {
    PackageBuilder::new("hk", "1.0.0")
        .spec(SPEC)
        .script("bin/start.sh", START)
        .script("bin/hook.sh", HOOK)
        .script("bin/sleep.sh", "exec sleep 100000\n")
        .script("bin/stamp.sh", "set -eu\ndate +%s%N > data/init_started_at\n")
}

fn stamp(instance: &Value, file: &str) -> u128 {
    let text = std::fs::read_to_string(dir_of(instance).join("data").join(file)).unwrap_or_default();
    text.trim().parse().unwrap_or_else(|_| panic!("{} has no data/{file}", id_of(instance)))
}

fn hooks_log(instance: &Value) -> Vec<String> {
    let text = std::fs::read_to_string(dir_of(instance).join("data/hooks.log")).unwrap_or_default();
    text.lines().map(str::to_string).collect()
}

async fn set_flag(env: &TestEnv, flag: &str, on: bool) {
    let op = env.run_op_patch("/clusters/hk/config", json!({"config": {flag: on}})).await;
    env.assert_succeeded(&op);
}

#[tokio::test]
async fn hooks_run_in_the_lifecycle_and_veto_where_they_may() {
    let env = TestEnv::start("hooks").await;
    env.upload(&package()).await;
    let body = json!({"name": "hk", "package": {"name": "hk", "version": "1.0.0"}, "roles": {"node": {"count": 2}}});
    let created = env.create_active(body).await;
    let first = role_instances(&created, "node");
    for i in &first {
        assert_eq!(hooks_log(i), ["init"], "{}", id_of(i));
    }
    // Equal order in parallel, orders in sequence: the order-1 role's init
    // began after both order-0 inits (each takes 0.3 s) had ended.
    let late = &role_instances(&created, "late")[0];
    let order0_done = first.iter().map(|i| stamp(i, "init_done_at")).max().unwrap();
    assert!(stamp(late, "init_started_at") > order0_done, "late's init ran before the order-0 inits ended");
    // The list has no per-instance results; the operation itself has them.
    let (_, ops) = env.get("/operations?cluster=hk").await;
    let create_id = ops["operations"][0]["id"].as_str().unwrap().to_string();
    let (_, create) = env.get(&format!("/operations/{create_id}")).await;
    let create = &create["operation"];
    let init = create["steps"].as_array().unwrap().iter().find(|s| s["name"] == "init").expect("an init step");
    for r in init["results"].as_array().unwrap().iter().filter(|r| r["instance"].as_str().unwrap().contains("-node-")) {
        assert_eq!((r["exit_code"].as_i64(), r["stdout_tail"].as_str()), (Some(0), Some("ran init")), "{r:#}");
    }

    // init runs once: a restart does not run it again.
    env.run_ok("/clusters/hk/restart", None).await;
    // scale_out runs on the existing members once the new one runs.
    env.run_ok("/clusters/hk/scale", Some(json!({"role": "node", "add": 1}))).await;
    let three = role_instances(&env.cluster("hk").await, "node");
    for i in &three {
        let expected: &[&str] =
            if first.iter().any(|f| id_of(f) == id_of(i)) { &["init", "scale_out"] } else { &["init"] };
        assert_eq!(hooks_log(i), expected, "{}", id_of(i));
    }

    // A scale_in hook that exits non-zero vetoes: nothing stops, the cluster
    // stays Active and says why.
    set_flag(&env, "veto_scale_in", true).await;
    let before = role_instances(&env.cluster("hk").await, "node");
    let victim = id_of(&before[2]);
    let op = env.run_op("/clusters/hk/scale", Some(json!({"role": "node", "remove": [victim]}))).await;
    assert_eq!(op["status"], "RolledBack", "{op:#}");
    let c = env.cluster("hk").await;
    assert_eq!(c["status"], "Active", "{c:#}");
    let why = c["status_description"].as_str().unwrap();
    assert!(why.contains("scale-in vetoed: quorum would break") && why.contains("exit code 3"), "{why}");
    let after = role_instances(&c, "node");
    assert_eq!(after.len(), 3);
    for (b, a) in before.iter().zip(&after) {
        assert_eq!(pid_of(b), pid_of(a), "a vetoed scale-in touched {}", id_of(a));
        assert!(pid_alive(pid_of(a)));
    }

    set_flag(&env, "veto_scale_in", false).await;
    env.run_ok("/clusters/hk/scale", Some(json!({"role": "node", "remove": [victim.clone()]}))).await;
    let two = role_instances(&env.cluster("hk").await, "node");
    assert_eq!(two.len(), 2);
    for i in &two {
        assert_eq!(hooks_log(i).last().map(String::as_str), Some("scale_in"), "{}", id_of(i));
    }

    // A destroy hook that exits non-zero vetoes the delete: Error, the reason,
    // and nothing removed.
    set_flag(&env, "fail_destroy", true).await;
    let (status, resp) = env.delete("/clusters/hk").await;
    assert_eq!(status, 202, "{resp:#}");
    let op = env.wait_op(resp["operation"]["id"].as_str().unwrap()).await;
    assert_eq!(op["status"], "Failed", "{op:#}");
    let c = env.cluster("hk").await;
    assert_eq!(c["status"], "Error");
    let why = c["status_description"].as_str().unwrap();
    assert!(why.contains("destroy refused: data not backed up"), "{why}");
    for i in &two {
        assert!(dir_of(i).exists(), "a vetoed delete removed {}", id_of(i));
    }

    // force=true deletes anyway and records what the hook said.
    let (status, resp) = env.delete("/clusters/hk?force=true").await;
    assert_eq!(status, 202, "{resp:#}");
    let op = env.wait_op(resp["operation"]["id"].as_str().unwrap()).await;
    env.assert_succeeded(&op);
    let destroy = op["steps"].as_array().unwrap().iter().find(|s| s["name"] == "destroy").unwrap();
    assert!(destroy["error"].as_str().unwrap_or_default().contains("destroy refused"), "{destroy:#}");
    for i in &two {
        assert!(!dir_of(i).exists(), "{} left its directory", id_of(i));
    }
    let (status, body) = env.get("/clusters/hk").await;
    assert_eq!((status.as_u16(), error_code(&body)), (404, "not_found"));
}

/// A force delete while an agent is down: the cluster is gone at once, what
/// the agent held is remembered, and removed (processes and directory) as
/// soon as the agent is back.
#[tokio::test]
async fn force_delete_finishes_on_an_agent_that_comes_back() {
    let mut env = TestEnv::start("force-leftover").await;
    env.upload(&package()).await;
    let body = json!({"name": "fl", "package": {"name": "hk", "version": "1.0.0"}, "roles": {"node": {"count": 3}}});
    let nodes = role_instances(&env.create_active(body).await, "node");
    let on3 = nodes.iter().find(|i| i["node"] == "node-3").expect("one instance on node-3").clone();
    env.kill_agent(3);
    assert!(pid_alive(pid_of(&on3)), "a killed agent leaves its instances running");

    let (status, resp) = env.delete("/clusters/fl?force=true").await;
    assert_eq!(status, 202, "{resp:#}");
    let op = env.wait_op(resp["operation"]["id"].as_str().unwrap()).await;
    env.assert_succeeded(&op);
    let deleted = op["steps"].as_array().unwrap().iter().find(|s| s["name"] == "delete-instances").unwrap();
    assert!(deleted["error"].as_str().unwrap_or_default().contains("node-3"), "{deleted:#}");
    let (status, _) = env.get("/clusters/fl").await;
    assert_eq!(status, 404);
    for i in nodes.iter().filter(|i| i["node"] != "node-3") {
        assert!(!dir_of(i).exists() && !pid_alive(pid_of(i)), "{} was not removed", id_of(i));
    }
    assert!(dir_of(&on3).exists(), "node-3 was down: its instance is still there");

    env.restart_agent(3).await;
    let gone = crate::common::eventually(20, || !dir_of(&on3).exists() && !pid_alive(pid_of(&on3))).await;
    assert!(gone, "the leftover {} was not removed when its agent came back", id_of(&on3));
}
