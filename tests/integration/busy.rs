//! One operation at a time per cluster: a second mutating request while one
//! runs answers `409 cluster_busy` naming the running operation, and changes
//! nothing.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::common::http::error_code;
use crate::common::{PackageBuilder, TestEnv, role_instances};

const SPEC: &str = r#"
[component]
name = "slow"
version = "1.0.0"

[[roles]]
name = "svc"
count = { min = 1, max = 5 }
start = ["bin/start.sh"]
pidfile = "run/svc.pid"
stop_grace = "2s"
"#;

/// Takes two seconds to come up (the pidfile appears late), so every start
/// keeps its operation running that long.
const SLOW_START: &str = "sleep 2\nsleep 100000 </dev/null >/dev/null 2>&1 &\necho $! > run/svc.pid\n";

fn assert_busy(status: StatusCode, body: &Value, running_op: &str) {
    assert_eq!((status, error_code(body)), (StatusCode::CONFLICT, "cluster_busy"), "{body:#}");
    let msg = body["error"]["message"].as_str().unwrap_or_default();
    assert!(msg.contains(running_op), "the 409 does not name the running operation {running_op}: {msg:?}");
}

#[tokio::test]
async fn a_second_mutation_while_one_runs_is_refused_busy() {
    let env = TestEnv::start("busy").await;
    env.upload(&PackageBuilder::new("slow", "1.0.0").spec(SPEC).script("bin/start.sh", SLOW_START)).await;

    // Create runs for 2 s; a stop meanwhile is refused.
    let create = env.create_cluster(json!({"name": "busy", "package": {"name": "slow", "version": "1.0.0"}})).await;
    let create_id = create["id"].as_str().unwrap().to_string();
    let (status, body) = env.post_empty("/clusters/busy/stop").await;
    assert_busy(status, &body, &create_id);
    let c = env.cluster("busy").await;
    assert_eq!(c["operation"], create_id.as_str(), "the cluster shows its running operation: {c:#}");
    let op = env.wait_op(&create_id).await;
    env.assert_succeeded(&op);
    assert_eq!(env.cluster("busy").await["status"], "Active");

    // Two mutations fired at once: exactly one runs.
    let (restart, scale) = tokio::join!(
        env.post_empty("/clusters/busy/restart"),
        env.post("/clusters/busy/scale", json!({"role": "svc", "add": 1})),
    );
    let (accepted, refused) = match (restart.0, scale.0) {
        (StatusCode::ACCEPTED, _) => (restart, scale),
        (_, StatusCode::ACCEPTED) => (scale, restart),
        _ => panic!("neither request was accepted: restart {restart:?}, scale {scale:?}"),
    };
    let running = accepted.1["operation"]["id"].as_str().unwrap().to_string();
    assert_busy(refused.0, &refused.1, &running);
    let op = env.wait_op(&running).await;
    env.assert_succeeded(&op);
    let c = env.cluster("busy").await;
    let expected = if op["kind"] == "ScaleOut" { 2 } else { 1 };
    assert_eq!(role_instances(&c, "svc").len(), expected, "the refused request changed the cluster: {c:#}");
    let (_, ops) = env.get("/operations?cluster=busy").await;
    assert_eq!(ops["operations"].as_array().unwrap().len(), 2, "a refused request left an operation: {ops:#}");

    // Once it has ended, the cluster takes the next request.
    env.run_ok("/clusters/busy/stop", None).await;
    assert_eq!(env.cluster("busy").await["status"], "Stopped");

    // The refusals are counted on its actor, not painted as failures.
    let (_, actors) = env.get("/actors").await;
    let a = actors["actors"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["kind"] == "cluster" && a["id"] == "busy")
        .unwrap_or_else(|| panic!("no actor for cluster busy: {actors:#}"));
    assert!(a["refused"].as_u64() >= Some(2), "{a:#}");
    assert_eq!((a["health"].as_str(), &a["last_error"]), (Some("green"), &Value::Null), "{a:#}");
}
