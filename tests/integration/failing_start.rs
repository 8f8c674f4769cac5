//! A start that fails: the operation fails, the cluster goes `Error` (or a
//! scale-out is rolled back), and the description tells the operator why,
//! in the component's own words. A process that dies within its settle
//! window (1 s by default without a health check) is a failed start, not a
//! success followed by a crash.

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::common::{PackageBuilder, TestEnv, id_of, instance_pids, pid_of, role_instances};

const SPEC: &str = r#"
[component]
name = "bad"
version = "1.0.0"

[[roles]]
name = "svc"
count = { min = 1, max = 3 }
start = ["bin/start.sh"]
stop_grace = "2s"
"#;

#[tokio::test]
async fn failing_start_marks_the_cluster_error_with_the_reason() {
    let env = TestEnv::start("failing-start").await;
    // It lives 300 ms: with no settle window (the default before) its start
    // would count, and the create would succeed.
    let pkg = PackageBuilder::new("bad", "1.0.0")
        .spec(SPEC)
        .script("bin/start.sh", "sleep 0.3\necho \"boom: port in use\" >&2\nexit 3\n");
    env.upload(&pkg).await;
    let op = env.create_cluster(json!({"name": "bad", "package": {"name": "bad", "version": "1.0.0"}})).await;
    let op = env.wait_op(op["id"].as_str().unwrap()).await;
    let results: Vec<&serde_json::Value> =
        op["steps"].as_array().unwrap().iter().flat_map(|s| s["results"].as_array().unwrap()).collect();
    assert!(
        results.iter().any(|r| r["ok"] == false
            && r["exit_code"] == 3
            && r["stderr_tail"].as_str().unwrap().contains("boom: port in use")),
        "no step result carries the exit code and stderr: {op:#}"
    );

    let c = env.cluster("bad").await;
    assert_eq!(c["status"], "Error", "{c:#}");
    let why = c["status_description"].as_str().unwrap();
    assert!(why.contains("exit code 3"), "status_description {why:?} does not name the exit code");
    assert!(why.contains("boom: port in use"), "status_description {why:?} does not quote stderr");
    for i in role_instances(&c, "svc") {
        assert_eq!(instance_pids(&id_of(&i)), Vec::<u32>::new(), "a failed instance left processes: {i:#}");
    }
    // The cluster is kept in Error: nothing was rolled back, so the
    // operation must not claim it was.
    assert_eq!(op["status"], "Failed", "{op:#}");
}

/// Without a settle window the start answers at once; a process that dies
/// just after is a crash: its agent restarts it (restart policy), and when
/// that gives up the cluster goes `Error`, with the exit code and stderr.
#[tokio::test]
async fn a_start_that_dies_after_answering_is_a_crash_reported_after_the_fact() {
    let env = TestEnv::start("late-crash").await;
    let spec = format!("{SPEC}start_settle = \"0s\"\n");
    let pkg = PackageBuilder::new("bad", "1.0.0")
        .spec(&spec)
        .script("bin/start.sh", "sleep 0.1\necho \"boom: port in use\" >&2\nexit 3\n");
    env.upload(&pkg).await;
    let body = json!({"name": "late", "package": {"name": "bad", "version": "1.0.0"}});
    let op = env.create_cluster(body).await;
    env.wait_op(op["id"].as_str().unwrap()).await;
    // The agent restarts it after 1 s, 2 s and 4 s, then gives up.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut restarting = None;
    let c = loop {
        let c = env.cluster("late").await;
        if let Some(i) = role_instances(&c, "svc").into_iter().find(|i| i["status"] == "Restarting") {
            restarting.get_or_insert(i);
        }
        if c["status"] == "Error" || std::time::Instant::now() > deadline {
            break c;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    // While the agent's policy retries, the instance says so: which
    // attempt, after how long, and how it last ended.
    let r = restarting.expect("the instance was never shown Restarting while its agent restarted it");
    let why = r["last_error"].as_str().unwrap_or_default();
    assert!(why.contains("restart 1 of at most 3") || why.contains("restart 2 of at most 3"), "{r:#}");
    assert!(why.contains("exit code 3") && why.contains("restarts it in"), "{r:#}");
    assert_eq!(c["status"], "Error", "the crash never reached the cluster: {c:#}");
    let why = c["status_description"].as_str().unwrap();
    assert!(why.contains("exit code 3") && why.contains("boom: port in use"), "{why:?}");
    for i in role_instances(&c, "svc") {
        assert_eq!(i["status"], "Failed", "{i:#}");
        assert_eq!(instance_pids(&id_of(&i)), Vec::<u32>::new(), "a crashed instance left processes: {i:#}");
    }
}

/// The `flotilla` CLI against `env`; (exit code, stdout + stderr).
fn cli(env: &TestEnv, args: &[&str]) -> (i32, String) {
    let base = env.api.trim_end_matches("/api/v1").to_string();
    let out = Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args(args)
        .env("FLOTILLA_API", &base)
        .env("FLOTILLA_TOKEN", &env.token)
        .output()
        .expect("run flotilla");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.code().unwrap_or(-1), text)
}

/// The newest operation of `kind` on `cluster`, ended.
async fn last_operation(env: &TestEnv, cluster: &str, kind: &str) -> serde_json::Value {
    let (_, ops) = env.get(&format!("/operations?cluster={cluster}&limit=100")).await;
    let newest = ops["operations"]
        .as_array()
        .and_then(|all| {
            all.iter().filter(|o| o["kind"] == kind).max_by_key(|o| o["created_at"].as_str().map(String::from))
        })
        .unwrap_or_else(|| panic!("no {kind} operation on {cluster}: {ops:#}"));
    env.wait_op(newest["id"].as_str().unwrap()).await
}

/// A start script that runs for good, or, while `flag` holds "bad", prints
/// a complaint and dies after 200 ms (inside the default settle window).
fn switchable(flag: &std::path::Path) -> PackageBuilder {
    let script = format!(
        "if [ \"$(cat {})\" = bad ]; then sleep 0.2; echo \"boom: disk full\" >&2; exit 3; fi\nexec sleep 1000\n",
        flag.display()
    );
    PackageBuilder::new("flip", "1.0.0").spec(&SPEC.replace("\"bad\"", "\"flip\"")).script("bin/start.sh", &script)
}

/// A directory the cluster's own user can read (the dynamic user of its
/// instances), holding the switch of [`switchable`].
fn flag_dir() -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::Builder::new().prefix("flotilla-flag").tempdir_in("/tmp").unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

fn set_flag(flag: &std::path::Path, mode: &str) {
    std::fs::write(flag, mode).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(flag, std::fs::Permissions::from_mode(0o644)).unwrap();
}

/// Each step that starts processes fails when they die at once, and the
/// CLI that asked for it exits non-zero naming the exit code: a create
/// (and its stderr), a scale-out (rolled back: the running members
/// untouched) and a start (the cluster goes `Error`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_scale_out_and_start_fail_when_the_process_dies_within_its_settle_window() {
    let env = TestEnv::start("settle-steps").await;
    let dir = flag_dir();
    let flag = dir.path().join("mode");
    set_flag(&flag, "bad");
    env.upload(&switchable(&flag)).await;

    // Create, as an operator scripting it would: the CLI says it failed.
    let (code, out) = cli(&env, &["cluster", "create", "b1", "--package", "flip:1.0.0", "--role", "svc=1"]);
    assert_ne!(code, 0, "a create whose process died at once exited 0: {out}");
    assert!(out.contains("exit code 3") && out.contains("boom: disk full"), "{out}");
    let c = env.cluster("b1").await;
    assert_eq!(c["status"], "Error", "{c:#}");
    let why = c["status_description"].as_str().unwrap_or_default();
    assert!(why.contains("exit code 3") && why.contains("boom: disk full"), "{why:?}");

    // A healthy cluster, then a scale-out whose new member dies: rolled
    // back, the running member keeps its process.
    set_flag(&flag, "good");
    let body = json!({"name": "ok", "package": {"name": "flip", "version": "1.0.0"}, "roles": {"svc": {"count": 1}}});
    env.create_active(body).await;
    let before = role_instances(&env.cluster("ok").await, "svc");
    let pid = pid_of(&before[0]);
    set_flag(&flag, "bad");
    let (code, out) = cli(&env, &["cluster", "scale", "ok", "svc", "--add", "1"]);
    assert_ne!(code, 0, "a scale-out whose member died at once exited 0: {out}");
    assert!(out.contains("exit code 3"), "{out}");
    let op = last_operation(&env, "ok", "ScaleOut").await;
    assert_ne!(op["status"], "Succeeded", "a scale-out whose member died at once succeeded: {op:#}");
    let text = op.to_string();
    assert!(text.contains("exit code 3") && text.contains("boom: disk full"), "{op:#}");
    let c = env.cluster("ok").await;
    let after = role_instances(&c, "svc");
    assert_eq!(after.len(), 1, "the failed member was not rolled back: {c:#}");
    assert_eq!((id_of(&after[0]), pid_of(&after[0])), (id_of(&before[0]), pid), "{c:#}");
    assert_eq!(instance_pids(&id_of(&after[0])), vec![pid]);

    // Stop, then a start that dies: the start fails, the cluster is Error.
    set_flag(&flag, "good");
    env.run_ok("/clusters/ok/stop", None).await;
    set_flag(&flag, "bad");
    let (code, out) = cli(&env, &["cluster", "start", "ok"]);
    assert_ne!(code, 0, "a start whose process died at once exited 0: {out}");
    assert!(out.contains("exit code 3"), "{out}");
    let op = last_operation(&env, "ok", "Start").await;
    assert_eq!(op["status"], "Failed", "{op:#}");
    let c = env.cluster("ok").await;
    assert_eq!(c["status"], "Error", "{c:#}");
    assert!(c["status_description"].as_str().unwrap_or_default().contains("exit code 3"), "{c:#}");
    for i in role_instances(&c, "svc") {
        assert_eq!(i["status"], "Failed", "{i:#}");
        assert!(i["pid"].is_null(), "a failed start still shows a pid: {i:#}");
        assert_eq!(instance_pids(&id_of(&i)), Vec::<u32>::new(), "{i:#}");
    }
}

/// While a start settles, the instance already shows `Running` with its
/// pid (the process runs); the operation ends once it has settled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settling_start_shows_running_with_its_pid_before_the_operation_ends() {
    let env = TestEnv::start("settle-shown").await;
    let spec = format!("{SPEC}start_settle = \"4s\"\n");
    let pkg = PackageBuilder::new("bad", "1.0.0").spec(&spec).script("bin/start.sh", "exec sleep 1000\n");
    env.upload(&pkg).await;
    let begun = Instant::now();
    let op = env.create_cluster(json!({"name": "slow", "package": {"name": "bad", "version": "1.0.0"}})).await;
    let id = op["id"].as_str().unwrap().to_string();
    let shown = loop {
        let c = env.cluster("slow").await;
        if let Some(i) = role_instances(&c, "svc").into_iter().find(|i| i["status"] == "Running") {
            break i;
        }
        assert!(begun.elapsed() < Duration::from_secs(20), "never shown Running: {c:#}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let (_, running) = env.get(&format!("/operations/{id}")).await;
    let status = running["operation"]["status"].as_str().unwrap_or_else(|| panic!("no operation status: {running:#}"));
    assert_eq!(status, "Running", "the operation ended before its start settled: {running:#}");
    assert_eq!(instance_pids(&id_of(&shown)), vec![pid_of(&shown)], "the pid shown is not the process: {shown:#}");
    let op = env.wait_op(&id).await;
    assert_eq!(op["status"], "Succeeded", "{op:#}");
    assert!(begun.elapsed() >= Duration::from_secs(4), "the operation did not wait for the settle window");
    let c = env.cluster("slow").await;
    assert_eq!(pid_of(&role_instances(&c, "svc")[0]), pid_of(&shown), "{c:#}");
}
