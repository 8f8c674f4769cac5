//! Stop, start and restart of a whole cluster and of a single instance,
//! checked on the real processes; start and stop are idempotent.

use serde_json::{Value, json};

use crate::common::scripts::{RECORD_AND_SLEEP, started_at};
use crate::common::{PackageBuilder, TestEnv, id_of, instance_pids, pid_alive, pid_of, role_instances};

const SPEC: &str = r#"
[component]
name = "lc"
version = "1.0.0"

[[roles]]
name = "svc"
count = { min = 1, max = 5 }
start = ["bin/start.sh"]
stop_grace = "2s"
"#;

async fn setup(name: &str) -> (TestEnv, Vec<Value>) {
    let env = TestEnv::start(name).await;
    env.upload(&PackageBuilder::new("lc", "1.0.0").spec(SPEC).script("bin/start.sh", RECORD_AND_SLEEP)).await;
    let body = json!({"name": "lc", "package": {"name": "lc", "version": "1.0.0"}, "roles": {"svc": {"count": 3}}});
    let cluster = env.create_active(body).await;
    let instances = role_instances(&cluster, "svc");
    assert_eq!(instances.len(), 3, "{cluster:#}");
    (env, instances)
}

fn assert_running(i: &Value) -> u32 {
    assert_eq!(i["status"], "Running", "{i:#}");
    let pid = pid_of(i);
    assert!(pid_alive(pid), "{} reports pid {pid}, which is not alive", i["id"]);
    // A process caught inside its `exec` (the start script execs `sleep`)
    // can show an empty environ for a moment: look again before failing.
    let id = i["id"].as_str().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    while !instance_pids(id).contains(&pid) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(instance_pids(id).contains(&pid), "pid {pid} does not carry the marker of {id}");
    pid
}

fn assert_stopped(i: &Value) {
    assert_eq!(i["status"], "Stopped", "{i:#}");
    assert!(i["pid"].is_null(), "a stopped instance reports a pid: {i:#}");
    let left = instance_pids(i["id"].as_str().unwrap());
    assert!(left.is_empty(), "processes of stopped {} still run: {left:?}", i["id"]);
}

#[tokio::test]
async fn cluster_stop_start_restart() {
    let (env, first) = setup("lifecycle-cluster").await;
    let pids0: Vec<u32> = first.iter().map(assert_running).collect();

    let op = env.run_ok("/clusters/lc/stop", None).await;
    assert_eq!(op["kind"], "Stop");
    let c = env.cluster("lc").await;
    assert_eq!(c["status"], "Stopped", "{c:#}");
    role_instances(&c, "svc").iter().for_each(assert_stopped);
    assert!(pids0.iter().all(|p| !pid_alive(*p)), "old processes survived stop");

    env.run_ok("/clusters/lc/start", None).await;
    let c = env.cluster("lc").await;
    assert_eq!(c["status"], "Active", "{c:#}");
    let now = role_instances(&c, "svc");
    let pids1: Vec<u32> = now.iter().map(assert_running).collect();
    for i in &now {
        assert_eq!(started_at(i).len(), 2, "{} should have started twice", i["id"]);
    }

    let op = env.run_ok("/clusters/lc/restart", None).await;
    assert_eq!(op["kind"], "Restart");
    let c = env.cluster("lc").await;
    assert_eq!(c["status"], "Active", "{c:#}");
    let now = role_instances(&c, "svc");
    let pids2: Vec<u32> = now.iter().map(assert_running).collect();
    for (old, new) in pids1.iter().zip(&pids2) {
        assert_ne!(old, new, "restart kept pid {old}");
        assert!(!pid_alive(*old), "pre-restart process {old} still runs");
    }
    for i in &now {
        assert_eq!(started_at(i).len(), 3, "{} should have started three times", i["id"]);
    }
}

#[tokio::test]
async fn instance_stop_start_restart_and_idempotence() {
    let (env, first) = setup("lifecycle-instance").await;
    let target = id_of(&first[1]);
    let others: Vec<(String, u32)> = [&first[0], &first[2]].iter().map(|i| (id_of(i), assert_running(i))).collect();
    let path = |verb: &str| format!("/clusters/lc/instances/{target}/{verb}");
    let get = |c: &Value| role_instances(c, "svc").into_iter().find(|i| i["id"] == target.as_str()).expect("target");

    let op = env.run_ok(&path("stop"), None).await;
    assert_eq!(op["kind"], "StopInstance");
    let c = env.cluster("lc").await;
    assert_stopped(&get(&c));
    for (id, pid) in &others {
        let i = role_instances(&c, "svc").into_iter().find(|i| i["id"] == id.as_str()).expect("other");
        assert_eq!(assert_running(&i), *pid, "stopping {target} touched {id}");
    }

    // Stop on a stopped instance: nothing to do, and it says so by succeeding.
    env.run_ok(&path("stop"), None).await;
    assert_stopped(&get(&env.cluster("lc").await));

    env.run_ok(&path("start"), None).await;
    let started = get(&env.cluster("lc").await);
    let pid = assert_running(&started);
    assert_eq!(started_at(&started).len(), 2);

    // Start on a running instance: succeeds without running the script again.
    env.run_ok(&path("start"), None).await;
    let again = get(&env.cluster("lc").await);
    assert_eq!(assert_running(&again), pid, "start on a running instance changed its pid");
    assert_eq!(started_at(&again).len(), 2, "start on a running instance ran the start script again");

    let op = env.run_ok(&path("restart"), None).await;
    assert_eq!(op["kind"], "RestartInstance");
    let restarted = get(&env.cluster("lc").await);
    let new_pid = assert_running(&restarted);
    assert_ne!(new_pid, pid, "restart kept the pid");
    assert!(!pid_alive(pid), "the pre-restart process still runs");
    assert_eq!(started_at(&restarted).len(), 3);
}
