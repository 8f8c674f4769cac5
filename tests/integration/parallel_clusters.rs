//! Independent clusters progress in parallel: one cluster's long operation
//! holds up that cluster only (its actor runs operations one at a time),
//! never the others; and `GET /nodes` says which agents are simulated.
//!
//! Where the clusters run: cluster actors are spread round robin over the
//! master's `actor_threads` arbiters, in the order they are started (one
//! start per create). This master has 2 of them, and three clusters are
//! created right after the held one (at once, so in no fixed order): three
//! consecutive starts cover every arbiter, so one of them shares the held
//! cluster's thread and two have the other. Whatever the placement, each
//! must get through its create, scale and stop while the held operation
//! still runs.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use flotilla::bench::sim::{Fleet, Latency};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::common::{PackageBuilder, TestEnv, all_instances, eventually};

/// How many arbiters the master runs (`actor_threads`), fixed so the
/// placement above does not depend on the machine's CPUs.
const ACTOR_THREADS: &str = "2";

/// The clusters created while the held one waits: more than the arbiters.
const OTHERS: [&str; 3] = ["b1", "b2", "b3"];

/// The longest any of their operations may take.
const OP_LIMIT_SECS: u64 = 15;

/// One role whose start is done only once its pidfile appears.
const HELD_SPEC: &str = r#"
[component]
name = "held"
version = "1.0.0"

[[roles]]
name = "svc"
count = { min = 1, max = 3 }
start = ["bin/start.sh"]
pidfile = "run/svc.pid"
stop_grace = "2s"
"#;

/// A start script that says it is waiting (`holding` in `gate`), waits
/// until the test creates `gate/release` (at most 45 s, then fails), then
/// daemonizes and writes its pidfile: the create's start step, and so the
/// operation, lasts as long as the test holds it.
fn held_package(gate: &Path) -> PackageBuilder {
    let gate = gate.display();
    let start = format!(
        "set -u\ntouch '{gate}/holding'\ni=0\nwhile [ ! -e '{gate}/release' ]; do\n  i=$((i + 1))\n  if [ $i -gt 450 ]; then echo 'never released' >&2; exit 1; fi\n  sleep 0.1\ndone\nsleep 100000 </dev/null >/dev/null 2>&1 &\necho $! > run/svc.pid\n"
    );
    PackageBuilder::new("held", "1.0.0").spec(HELD_SPEC).script("bin/start.sh", &start)
}

/// `GET /operations/{id}` until the operation has ended, at most
/// [`OP_LIMIT_SECS`]; the operation.
async fn ended(env: &TestEnv, id: &str, what: &str) -> Value {
    env.until(OP_LIMIT_SECS, what, async || {
        let (status, body) = env.get(&format!("/operations/{id}?wait=1")).await;
        let op = &body["operation"];
        if status == StatusCode::OK && !["Pending", "Running"].iter().any(|s| op["status"] == *s) {
            Ok(op.clone())
        } else {
            Err(format!("{status} {body:#}"))
        }
    })
    .await
}

/// The held cluster's operation, as the API shows it now: still Running,
/// and still the operation its cluster is busy with.
async fn assert_still_held(env: &TestEnv, held: &str, when: &str) {
    let (status, body) = env.get(&format!("/operations/{held}")).await;
    assert_eq!(status, StatusCode::OK, "GET /operations/{held}: {body:#}");
    assert_eq!(
        body["operation"]["status"], "Running",
        "{when}, the held cluster's operation is no longer running: the other cluster waited for it\n{body:#}"
    );
    let a = env.cluster("a").await;
    assert_eq!(a["operation"], held, "{when}, cluster a is not busy with its held operation: {a:#}");
}

/// POSTs `path` (with `body`), asserts 202; the operation's id.
async fn accepted(env: &TestEnv, path: &str, body: Option<Value>) -> String {
    let (status, resp) = match body {
        Some(b) => env.post(path, b).await,
        None => env.post_empty(path).await,
    };
    assert_eq!(status, StatusCode::ACCEPTED, "POST {path}: {resp:#}");
    resp["operation"]["id"].as_str().expect("operation id").to_string()
}

/// Waits for operation `id` of cluster `name` to end; the moment it has,
/// the held operation must still run; then it must have Succeeded.
async fn ends_while_held(env: &TestEnv, name: &str, what: &str, id: &str, held: &str) {
    let op = ended(env, id, &format!("{name}'s {what} ends while cluster a's create is held")).await;
    assert_still_held(env, held, &format!("when {name}'s {what} ended")).await;
    env.assert_succeeded(&op);
}

/// Create, scale out and stop cluster `name`, each ended and Succeeded
/// while the held operation still runs; how long the three took.
async fn lifecycle(env: &TestEnv, name: &str, held: &str) -> Duration {
    let began = Instant::now();
    let create = env.create_cluster(json!({"name": name, "package": {"name": "quick", "version": "1.0.0"}})).await;
    ends_while_held(env, name, "create", create["id"].as_str().expect("op id"), held).await;
    let scale = accepted(env, &format!("/clusters/{name}/scale"), Some(json!({"role": "svc", "add": 1}))).await;
    ends_while_held(env, name, "scale", &scale, held).await;
    let stop = accepted(env, &format!("/clusters/{name}/stop"), None).await;
    ends_while_held(env, name, "stop", &stop, held).await;
    let c = env.cluster(name).await;
    let instances = all_instances(&c);
    assert_eq!(c["status"], "Stopped", "{c:#}");
    assert_eq!(instances.len(), 2, "{name} was scaled out to 2: {c:#}");
    assert!(instances.iter().all(|i| i["status"] == "Stopped"), "{c:#}");
    began.elapsed()
}

#[tokio::test]
async fn other_clusters_create_scale_and_stop_while_one_operation_is_held() {
    let env = TestEnv::start_with("parallel", &[("FLOTILLA_MASTER_ACTOR_THREADS", ACTOR_THREADS)]).await;
    // The held start script runs as its cluster's user: it must reach the gate and
    // write in it.
    let gate = tempfile::Builder::new().prefix("flotilla-gate-").tempdir().expect("gate dir");
    std::fs::set_permissions(gate.path(), std::fs::Permissions::from_mode(0o1777)).expect("chmod gate");
    env.upload(&held_package(gate.path())).await;
    env.upload(&PackageBuilder::sleeper("quick")).await;

    let create_a = env.create_cluster(json!({"name": "a", "package": {"name": "held", "version": "1.0.0"}})).await;
    let held = create_a["id"].as_str().expect("op id").to_string();
    let holding = eventually(20, || gate.path().join("holding").exists()).await;
    assert!(holding, "cluster a's start script never ran\n{}", env.log_tails());
    assert_still_held(&env, &held, "once a's start script waits").await;
    let held_at = Instant::now();

    let (b1, b2, b3) = tokio::join!(
        lifecycle(&env, OTHERS[0], &held),
        lifecycle(&env, OTHERS[1], &held),
        lifecycle(&env, OTHERS[2], &held),
    );
    let others_took = held_at.elapsed();
    assert_still_held(&env, &held, "once every other cluster was stopped").await;

    // Released, the held create goes on and succeeds.
    std::fs::write(gate.path().join("release"), b"").expect("release");
    let op = env.wait_op(&held).await;
    env.assert_succeeded(&op);
    let a = env.cluster("a").await;
    assert_eq!(a["status"], "Active", "{a:#}");
    assert!(all_instances(&a).iter().all(|i| i["status"] == "Running"), "{a:#}");
    eprintln!(
        "parallel: with a's create held, b1/b2/b3 went through create, scale and stop in {b1:?}/{b2:?}/{b3:?} \
         ({others_took:?} in all); a's create then took {:?} more",
        held_at.elapsed() - others_took
    );
}

/// Whether `GET /nodes` and `GET /nodes/{id}` mark each node `simulated`,
/// in one master with both kinds: three real agents and two simulated ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_say_which_agents_are_simulated() {
    let mut env = TestEnv::start("simflag").await;
    env.fleet = Some(Fleet::start(&env.fleet_config(2, Latency::default())));
    let nodes = env
        .until(30, "GET /nodes shows the 3 real and 2 simulated agents Ready", async || {
            let (status, body) = env.get("/nodes").await;
            let list = body["nodes"].as_array().cloned().unwrap_or_default();
            let ready = list.iter().filter(|n| n["status"] == "Ready" && n["connected"] == true).count();
            if status == StatusCode::OK && list.len() == 5 && ready == 5 {
                Ok(list)
            } else {
                Err(format!("{status} {body:#}"))
            }
        })
        .await;
    let expected = [("node-1", false), ("node-2", false), ("node-3", false), ("sim-1", true), ("sim-2", true)];
    let mut listed: Vec<(String, Value)> =
        nodes.iter().map(|n| (n["id"].as_str().expect("node id").to_string(), n["simulated"].clone())).collect();
    listed.sort_by(|x, y| x.0.cmp(&y.0));
    let want: Vec<(String, Value)> = expected.iter().map(|(id, sim)| (id.to_string(), json!(sim))).collect();
    assert_eq!(listed, want, "GET /nodes: (id, simulated) of every node");
    for (id, sim) in expected {
        let n = env.node(id).await;
        assert_eq!((&n["id"], &n["simulated"]), (&json!(id), &json!(sim)), "GET /nodes/{id}: {n:#}");
    }
}
