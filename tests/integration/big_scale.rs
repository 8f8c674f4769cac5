//! Big scale-outs: reads stay answered while a cluster of simulated agents
//! grows to 10,000 instances, and one request adds 200 real processes on
//! the real agents (and a delete leaves none behind).

use std::sync::atomic::{AtomicBool, Ordering};

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::common::procfs::pids_by_instance;
use crate::common::{TestEnv, all_instances, dir_of, id_of, pid_alive, pid_of, sim};

/// The body of a 200 answer to `GET path`, checked to hold `key` as an array.
async fn read(env: &TestEnv, path: &str, key: &str) -> Value {
    let (status, body) = env.get(path).await;
    assert_eq!(status, StatusCode::OK, "GET {path} while scaling: {body:#}");
    assert!(body[key].is_array(), "GET {path}: no {key:?} array: {body:#}");
    body
}

/// Each item of `items` has every field of `fields` as a string.
fn has_strings(items: &Value, fields: &[&str], what: &str) {
    for item in items.as_array().expect("array") {
        for f in fields {
            assert!(item[f].is_string(), "{what}: {f:?} is not a string in {item:#}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_stay_answered_while_a_cluster_scales_to_ten_thousand() {
    const STEP: u64 = 2000;
    const TOTAL: u64 = 10_000;
    let env = TestEnv::start_sim("tenk", &[], 20).await;
    env.upload(&sim::package("svc", "1.0.0", TOTAL as u32)).await;
    let body = json!({"name": "big", "package": {"name": "svc", "version": "1.0.0"}, "roles": {"d": {"count": STEP}}});
    let create = env.create_cluster(body).await;

    let done = AtomicBool::new(false);
    let scaling = async {
        let op = env.wait_op(create["id"].as_str().unwrap()).await;
        env.assert_succeeded(&op);
        for _ in 1..TOTAL / STEP {
            env.run_ok("/clusters/big/scale", Some(json!({"role": "d", "add": STEP}))).await;
        }
        done.store(true, Ordering::SeqCst);
    };
    let reading = async {
        let (mut rounds, mut seen) = (0u64, 0usize);
        while !done.load(Ordering::SeqCst) {
            let list = read(&env, "/clusters", "clusters").await;
            has_strings(&list["clusters"], &["name", "status"], "GET /clusters");
            assert_eq!(list["total"], 1, "{list:#}");
            let nodes = read(&env, "/nodes", "nodes").await;
            assert_eq!(nodes["nodes"].as_array().unwrap().len(), 20, "{nodes:#}");
            has_strings(&nodes["nodes"], &["id", "status"], "GET /nodes");
            let ops = read(&env, "/operations", "operations").await;
            has_strings(&ops["operations"], &["id", "kind", "status"], "GET /operations");
            let c = read(&env, "/clusters/big", "instances").await;
            assert_eq!(c["name"], "big", "{}", c["name"]);
            has_strings(&c["instances"], &["id", "status", "node"], "GET /clusters/big");
            // Scale-outs only add: no read may see fewer instances than an earlier one.
            let n = c["instances"].as_array().unwrap().len();
            assert!(n >= seen && n as u64 <= TOTAL, "GET /clusters/big: {n} instances after {seen}");
            seen = n;
            rounds += 1;
        }
        rounds
    };
    let started = std::time::Instant::now();
    let ((), rounds) = tokio::join!(scaling, reading);
    eprintln!("tenk: 10,000 instances in {:?}, {rounds} rounds of reads meanwhile", started.elapsed());
    assert!(rounds >= 5, "only {rounds} rounds of reads ran while scaling");

    let c = env.cluster("big").await;
    assert_eq!((&c["status"], &c["roles"]["d"]["count"]), (&json!("Active"), &json!(TOTAL)), "{}", c["status"]);
    let instances = all_instances(&c);
    assert_eq!(instances.len() as u64, TOTAL);
    let not_running: Vec<&Value> = instances.iter().filter(|i| i["status"] != "Running").take(3).collect();
    assert!(not_running.is_empty(), "instances not Running, e.g. {not_running:#?}");
    assert_eq!(env.fleet().running() as u64, TOTAL, "the agents do not run 10,000 instances");
}

#[tokio::test]
async fn one_request_adds_two_hundred_real_processes_and_a_delete_leaves_none() {
    let env = TestEnv::start("many").await;
    env.upload(&sim::package("many", "1.0.0", 300)).await;
    env.create_active(json!({"name": "many", "package": {"name": "many", "version": "1.0.0"}})).await;
    let started = std::time::Instant::now();
    let op = env.run_ok("/clusters/many/scale", Some(json!({"role": "d", "add": 200}))).await;
    eprintln!("many: 200 processes added in {:?}", started.elapsed());
    assert_eq!(op["kind"], "ScaleOut", "{op:#}");

    let c = env.cluster("many").await;
    assert_eq!((&c["status"], &c["roles"]["d"]["count"]), (&json!("Active"), &json!(201)), "{}", c["status"]);
    let instances = all_instances(&c);
    assert_eq!(instances.len(), 201);
    let running = pids_by_instance();
    for i in &instances {
        assert_eq!(i["status"], "Running", "{i:#}");
        let pid = pid_of(i);
        assert!(pid_alive(pid), "{} reports pid {pid}, which is not alive", i["id"]);
        let pids = running.get(&id_of(i)).cloned().unwrap_or_default();
        assert!(pids.contains(&pid), "{}: pid {pid} is not among its processes {pids:?}", i["id"]);
        assert!(dir_of(i).is_dir(), "{} has no directory", i["id"]);
    }
    let nodes: std::collections::BTreeSet<&str> = instances.iter().map(|i| i["node"].as_str().unwrap()).collect();
    assert_eq!(nodes.len(), 3, "spread over every node: {nodes:?}");

    let (status, resp) = env.delete("/clusters/many").await;
    assert_eq!(status, StatusCode::ACCEPTED, "{resp:#}");
    let op = env.wait_op(resp["operation"]["id"].as_str().unwrap()).await;
    env.assert_succeeded(&op);
    let left = pids_by_instance();
    for i in &instances {
        let id = id_of(i);
        assert!(!pid_alive(pid_of(i)), "{id}: pid {} still runs after the delete", pid_of(i));
        assert!(!left.contains_key(&id), "{id}: processes left after the delete: {:?}", left.get(&id));
        assert!(!dir_of(i).exists(), "{} still exists", dir_of(i).display());
    }
    assert!(env.agent_instance_dirs().is_empty(), "left on the agents: {:?}", env.agent_instance_dirs());
}
