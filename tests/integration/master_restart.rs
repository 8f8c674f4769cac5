//! A master restart loses nothing: clusters, instances (ids, ports,
//! statuses, pids) and the operation journal read the same afterwards, the
//! processes kept running, and the cluster still takes operations.

use serde_json::{Value, json};

use crate::common::scripts::RECORD_AND_SLEEP;
use crate::common::{PackageBuilder, TestEnv, all_instances, id_of, instance_pids, pid_alive, pid_of};

pub(crate) const SPEC: &str = r#"
[component]
name = "mr"
version = "1.0.0"

[[roles]]
name = "svc"
count = { min = 1, max = 5 }
ports = ["main"]
start = ["bin/start.sh"]
stop_grace = "2s"
"#;

/// What a user compares: per instance its id, role, ordinal, node, ports,
/// status and pid; and the cluster's name, id and status.
fn summary(cluster: &Value) -> Value {
    let instances: Vec<Value> = all_instances(cluster)
        .iter()
        .map(|i| {
            json!({"id": i["id"], "role": i["role"], "ordinal": i["ordinal"], "node": i["node"],
                   "ports": i["ports"], "status": i["status"], "pid": i["pid"], "dir": i["dir"]})
        })
        .collect();
    json!({"name": cluster["name"], "id": cluster["id"], "status": cluster["status"], "instances": instances})
}

#[tokio::test]
async fn master_restart_keeps_clusters_instances_and_journal() {
    let mut env = TestEnv::start("master-restart").await;
    env.upload(&PackageBuilder::new("mr", "1.0.0").spec(SPEC).script("bin/start.sh", RECORD_AND_SLEEP)).await;
    let body = json!({"name": "mr", "package": {"name": "mr", "version": "1.0.0"}, "roles": {"svc": {"count": 3}}});
    let first = all_instances(&env.create_active(body).await);
    let stopped = id_of(&first[0]);
    env.run_ok(&format!("/clusters/mr/instances/{stopped}/stop"), None).await;

    let cluster_before = env.cluster("mr").await;
    let (_, list_before) = env.get("/clusters").await;
    let (_, ops_before) = env.get("/operations?cluster=mr").await;
    assert_eq!(ops_before["operations"].as_array().map(Vec::len), Some(2), "{ops_before:#}");
    let running: Vec<Value> =
        all_instances(&cluster_before).into_iter().filter(|i| i["id"] != stopped.as_str()).collect();
    assert_eq!(running.len(), 2);

    env.restart_master().await;

    let cluster_after = env.cluster("mr").await;
    assert_eq!(summary(&cluster_after), summary(&cluster_before), "the cluster changed across the restart");
    let (_, list_after) = env.get("/clusters").await;
    // The list shows summaries: status and instance counts by status.
    let names = |l: &Value| {
        l["clusters"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| json!({"name": c["name"], "id": c["id"], "status": c["status"], "instances": c["instances"]}))
            .collect::<Vec<_>>()
    };
    assert_eq!(names(&list_after), names(&list_before));
    let (_, ops_after) = env.get("/operations?cluster=mr").await;
    assert_eq!(ops_after, ops_before, "the operation journal changed across the restart");
    for i in &running {
        assert!(pid_alive(pid_of(i)), "{} stopped running across the master restart", i["id"]);
    }
    assert_eq!(instance_pids(&stopped), Vec::<u32>::new(), "the stopped instance came back");

    // The cluster still works.
    env.run_ok("/clusters/mr/stop", None).await;
    let c = env.cluster("mr").await;
    assert_eq!(c["status"], "Stopped", "{c:#}");
    for i in &running {
        assert!(!pid_alive(pid_of(i)), "{} survived stop after the restart", i["id"]);
        assert_eq!(instance_pids(&id_of(i)), Vec::<u32>::new());
    }
}

/// Healthy only three seconds after it started: a scale-out spends that long
/// in its start step, long enough to restart the master in the middle.
const SLOW_SPEC: &str = r#"
[component]
name = "slow"
version = "1.0.0"

[[roles]]
name = "svc"
count = { min = 1, max = 7 }
ports = ["main"]
start = ["bin/start.sh"]
stop_grace = "2s"
start_timeout = "30s"
health = { cmd = ["bin/health.sh"] }

[[roles.files]]
path = "conf/members"
template = "{% for m in cluster.roles.svc.members %}{{ m.ordinal }} {% endfor %}\n"
"#;

const SLOW_HEALTH: &str =
    "set -eu\nstarted=$(head -n 1 data/started_at)\n[ $(( $(date +%s%N) - started )) -ge 3000000000 ]\n";

#[tokio::test]
async fn an_operation_interrupted_by_a_master_restart_is_resumed() {
    operation_interrupted_by_the_master_is_resumed("op-resume", false).await;
}

/// The same with the master SIGKILLed (no shutdown at all).
#[tokio::test]
async fn an_operation_interrupted_by_a_master_kill_9_is_resumed() {
    operation_interrupted_by_the_master_is_resumed("op-resume-kill9", true).await;
}

/// A scale-out held in its start step (the new members wait for health)
/// when the master stops (SIGTERM) or dies (`kill_9`): the next master
/// resumes it, names it in its log, and it ends `Succeeded` with every
/// member started exactly as often as an uninterrupted run starts it.
async fn operation_interrupted_by_the_master_is_resumed(name: &str, kill_9: bool) {
    interrupted_scale_out_is_resumed(TestEnv::start(name).await, kill_9).await;
}

/// Cluster `name` of two members of the slow package, then a scale-out by
/// two held in its start step (the new members installed and started,
/// waiting for health); its operation id.
pub(crate) async fn slow_scale_out_under_way(env: &TestEnv, name: &str) -> String {
    let pkg = PackageBuilder::new("slow", "1.0.0")
        .spec(SLOW_SPEC)
        .script("bin/start.sh", RECORD_AND_SLEEP)
        .script("bin/health.sh", SLOW_HEALTH);
    env.upload(&pkg).await;
    let body = json!({"name": name, "package": {"name": "slow", "version": "1.0.0"}, "roles": {"svc": {"count": 2}}});
    env.create_active(body).await;
    let (status, resp) = env.post(&format!("/clusters/{name}/scale"), json!({"role": "svc", "add": 2})).await;
    assert_eq!(status, 202, "{resp:#}");
    let op_id = resp["operation"]["id"].as_str().unwrap().to_string();
    let reached = crate::common::eventually(20, || {
        env.agent_instance_dirs().iter().filter(|d| d.join("data/started_at").exists()).count() == 4
    })
    .await;
    assert!(reached, "the new members never started");
    op_id
}

/// The scale-out above, on `env` (its store on RocksDB or etcd).
pub(crate) async fn interrupted_scale_out_is_resumed(mut env: TestEnv, kill_9: bool) -> TestEnv {
    let op_id = slow_scale_out_under_way(&env, "rs").await;
    if kill_9 {
        env.kill_master();
        env.start_master_again().await;
    } else {
        env.restart_master().await;
    }

    let op = env.wait_op(&op_id).await;
    env.assert_succeeded(&op);
    let resumed = super::faults_master::resumed_operations(&env.master_log());
    assert_eq!(
        resumed,
        std::collections::BTreeSet::from([op_id.clone()]),
        "the scale-out was not resumed by the new master"
    );
    let c = env.cluster("rs").await;
    assert_eq!(c["status"], "Active", "{c:#}");
    let members = all_instances(&c);
    assert_eq!(members.len(), 4);
    for m in &members {
        assert_eq!(m["status"], "Running", "{m:#}");
        assert!(pid_alive(pid_of(m)));
        assert_eq!(instance_pids(&id_of(m)).len(), 1, "{} runs more than one process tree", id_of(m));
        // New members start once; old ones once more, for their new member list.
        let starts = if m["ordinal"].as_u64() > Some(2) { 1 } else { 2 };
        assert_eq!(crate::common::scripts::started_at(m).len(), starts, "{} started too often", id_of(m));
        assert_eq!(crate::common::scripts::rendered(m, "conf/members"), "1 2 3 4 \n", "{}", id_of(m));
    }
    env
}
