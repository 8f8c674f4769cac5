//! A start command that fails: the operation fails, the cluster goes
//! `Error`, and the description tells the operator why, in the component's
//! own words.

use serde_json::json;

use crate::common::{PackageBuilder, TestEnv, id_of, instance_pids, role_instances};

const SPEC: &str = r#"
[component]
name = "bad"
version = "1.0.0"

[[roles]]
name = "svc"
count = { min = 1, max = 3 }
start = ["bin/start.sh"]
stop_grace = "2s"
# A foreground process that dies within this is a failed start (without
# it the start answers at once and the exit is a crash, reported later).
start_settle = "500ms"
"#;

#[tokio::test]
async fn failing_start_marks_the_cluster_error_with_the_reason() {
    let env = TestEnv::start("failing-start").await;
    let pkg = PackageBuilder::new("bad", "1.0.0")
        .spec(SPEC)
        .script("bin/start.sh", "echo \"boom: port in use\" >&2\nexit 3\n");
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
    let spec = SPEC.replace("start_settle = \"500ms\"\n", "");
    let pkg = PackageBuilder::new("bad", "1.0.0")
        .spec(&spec)
        .script("bin/start.sh", "sleep 0.1\necho \"boom: port in use\" >&2\nexit 3\n");
    env.upload(&pkg).await;
    let body = json!({"name": "late", "package": {"name": "bad", "version": "1.0.0"}});
    let op = env.create_cluster(body).await;
    env.wait_op(op["id"].as_str().unwrap()).await;
    // The agent restarts it after 1 s, 2 s and 4 s, then gives up.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let c = loop {
        let c = env.cluster("late").await;
        if c["status"] == "Error" || std::time::Instant::now() > deadline {
            break c;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    assert_eq!(c["status"], "Error", "the crash never reached the cluster: {c:#}");
    let why = c["status_description"].as_str().unwrap();
    assert!(why.contains("exit code 3") && why.contains("boom: port in use"), "{why:?}");
    for i in role_instances(&c, "svc") {
        assert_eq!(i["status"], "Failed", "{i:#}");
        assert_eq!(instance_pids(&id_of(&i)), Vec::<u32>::new(), "a crashed instance left processes: {i:#}");
    }
}
