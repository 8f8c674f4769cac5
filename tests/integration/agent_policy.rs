//! What an agent lets a package ask for (issue 9), decided by the agent's
//! own config and tried on real agents: root is refused by uid, not by name;
//! `allowed_run_as` limits the users a spec may name; loader variables in a
//! spec's env are refused. And a cluster whose create failed at install
//! (a `run_as` user missing on the nodes) is deleted without `force`.

use std::process::Command;

use serde_json::{Value, json};

use crate::common::{PackageBuilder, TestEnv, id_of, instance_pids, pid_of, proc_uid, role_instances};

fn spec(name: &str, extra: &str) -> String {
    format!(
        r#"
[component]
name = "{name}"
version = "1.0.0"

[[roles]]
name = "svc"
count = {{ min = 1, max = 3 }}
start = ["bin/start.sh"]
stop_grace = "2s"
{extra}
"#
    )
}

fn package(name: &str, extra: &str) -> PackageBuilder {
    PackageBuilder::new(name, "1.0.0").spec(&spec(name, extra)).script("bin/start.sh", "exec sleep 100000\n")
}

fn create_body(cluster: &str, package: &str, count: u32, nodes: Option<&[&str]>) -> Value {
    let mut role = json!({ "count": count });
    if let Some(nodes) = nodes {
        role["nodes"] = json!(nodes);
    }
    json!({"name": cluster, "package": {"name": package, "version": "1.0.0"}, "roles": {"svc": role}})
}

/// Creates a cluster that must fail; answers (the operation, the cluster).
async fn create_failing(env: &TestEnv, body: Value) -> (Value, Value) {
    let name = body["name"].as_str().unwrap().to_string();
    let op = env.create_cluster(body).await;
    let op = env.wait_op(op["id"].as_str().unwrap()).await;
    assert_ne!(op["status"], "Succeeded", "the create of {name} must fail: {op:#}");
    let c = env.cluster(&name).await;
    assert_eq!(c["status"], "Error", "{c:#}");
    eprintln!("agent_policy: the create of {name} failed: {}", c["status_description"]);
    (op, c)
}

/// A plain `DELETE` (no force) of a cluster in Error succeeds, and nothing
/// of it is left on any agent.
async fn delete_without_force(env: &TestEnv, name: &str) {
    let (status, resp) = env.delete(&format!("/clusters/{name}")).await;
    assert_eq!(status, 202, "DELETE /clusters/{name}: {resp:#}");
    let op = env.wait_op(resp["operation"]["id"].as_str().unwrap()).await;
    env.assert_succeeded(&op);
    let (status, body) = env.get(&format!("/clusters/{name}")).await;
    assert_eq!(status, 404, "{name} is still there after its delete: {body:#}");
    let left: Vec<_> = env.agent_instance_dirs().into_iter().filter(|d| d.to_string_lossy().contains(name)).collect();
    assert!(left.is_empty(), "instance dirs of {name} left on the agents: {left:?}");
}

/// Tried as a new user would: a `run_as` naming a user missing on the
/// nodes fails the create at install, the cluster goes Error, and the
/// plain delete used to fail at its stop step ("not installed on this
/// node"). Stop and delete of an instance an agent does not hold are done.
#[tokio::test]
async fn a_cluster_whose_install_failed_is_deleted_without_force() {
    let env = TestEnv::start("install-failed-delete").await;
    // With a destroy hook: there is nothing to destroy where nothing was
    // installed, so it must not veto the delete either.
    let ghost = package("ghost", "run_as = \"no-such-user-flt\"\ndestroy = [\"bin/destroy.sh\"]")
        .script("bin/destroy.sh", "exit 1\n");
    env.upload(&ghost).await;
    let (op, c) = create_failing(&env, create_body("gh", "ghost", 3, None)).await;
    assert!(op.to_string().contains("no-such-user-flt"), "the failure names the user: {op:#}");
    assert_eq!(role_instances(&c, "svc").len(), 3, "{c:#}");
    delete_without_force(&env, "gh").await;
    // The name is free again.
    env.upload(&package("fine", "")).await;
    env.create_active(create_body("gh", "fine", 1, None)).await;
}

/// `useradd`s a user (possibly `-o -u 0`: an alias of root), removed on drop.
struct TempUser(String);

impl TempUser {
    fn add(name: &str, extra: &[&str]) -> TempUser {
        let _ = Command::new("userdel").arg(name).output();
        let out = Command::new("useradd")
            .args(["--system", "--no-create-home", "--shell", "/usr/sbin/nologin"])
            .args(extra)
            .arg(name)
            .output()
            .expect("useradd (the test runs as root, as CI does)");
        assert!(out.status.success(), "useradd {name}: {}", String::from_utf8_lossy(&out.stderr));
        TempUser(name.to_string())
    }
}

impl Drop for TempUser {
    fn drop(&mut self) {
        let _ = Command::new("userdel").arg(&self.0).output();
    }
}

/// The agent decides, by its own config: node-1 runs with
/// `allowed_run_as = ["daemon"]`; every agent with the defaults
/// (`allow_root = false`, `allow_loader_env = false`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_refuse_root_by_uid_users_not_allowed_and_loader_variables() {
    assert!(nix::unistd::geteuid().is_root(), "this test needs root (useradd, and agents that switch users)");
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("agent.toml");
    std::fs::write(&config, "allowed_run_as = [\"daemon\"]\n").unwrap();
    let flag = format!("--config={}", config.display());
    let env = TestEnv::start_with_agent_flag("agent-policy", 1, &flag).await;

    // Root under another name is root: refused by uid (0), with the rule.
    let alias = TempUser::add(&format!("fltroot{}", std::process::id() % 100_000), &["--non-unique", "--uid", "0"]);
    env.upload(&package("rooted", &format!("run_as = \"{}\"", alias.0))).await;
    let (op, c) = create_failing(&env, create_body("rt", "rooted", 3, None)).await;
    let text = op.to_string();
    assert!(text.contains(&alias.0) && text.contains("uid 0"), "the refusal names the user and its uid: {op:#}");
    assert!(text.contains("allow_root = false"), "the refusal names the rule: {op:#}");
    for i in role_instances(&c, "svc") {
        assert_eq!(instance_pids(&id_of(&i)), Vec::<u32>::new(), "an instance of {} runs: {i:#}", alias.0);
    }
    delete_without_force(&env, "rt").await;

    // allowed_run_as on node-1: `bin` is refused there, `daemon` runs.
    env.upload(&package("binuser", "run_as = \"bin\"")).await;
    let (op, _) = create_failing(&env, create_body("bu", "binuser", 1, Some(&["node-1"]))).await;
    let text = op.to_string();
    assert!(text.contains("\\\"bin\\\"") && text.contains("allowed_run_as (daemon)"), "{op:#}");
    delete_without_force(&env, "bu").await;
    env.upload(&package("daemonuser", "run_as = \"daemon\"")).await;
    let c = env.create_active(create_body("du", "daemonuser", 1, Some(&["node-1"]))).await;
    let daemon = nix::unistd::User::from_name("daemon").unwrap().expect("user daemon").uid.as_raw();
    assert_eq!(proc_uid(pid_of(&role_instances(&c, "svc")[0])), Some(daemon), "{c:#}");
    // The other nodes have no list: any non-root user.
    env.create_active(create_body("bu2", "binuser", 1, Some(&["node-2"]))).await;

    // A loader variable in the spec's env: refused by the agent.
    env.upload(&package("preload", "env = { LD_PRELOAD = \"/nonexistent/evil.so\", GREETING = \"hi\" }")).await;
    let (op, _) = create_failing(&env, create_body("pl", "preload", 1, None)).await;
    let text = op.to_string();
    assert!(text.contains("LD_PRELOAD") && text.contains("allow_loader_env = false"), "{op:#}");
    delete_without_force(&env, "pl").await;
}
