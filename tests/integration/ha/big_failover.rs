//! The leader killed (`kill -9`) in the middle of a scale-out to 150 real
//! instances on three real agents: a follower leads, the operation ends
//! `Succeeded` on it, each instance runs once (one process tree, started
//! once), and reads on the followers never fail meanwhile. The new leader
//! boots from the view it kept as a follower, checked against the store.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::json;

use crate::common::etcd::EtcdCluster;
use crate::common::package::PackageBuilder;
use crate::common::procfs::pids_by_instance;
use crate::common::scripts::started_at;
use crate::common::{TestEnv, all_instances, id_of, pid_alive, pid_of, sim};

const SPEC: &str = r#"
[component]
name = "wide"
version = "1.0.0"

[[roles]]
name = "svc"
count = { min = 1, max = 200 }
start = ["bin/start.sh"]
stop_grace = "2s"
"#;

/// Scales `cluster` out by `body`, kills the leader (`kill -9`) once
/// `running` counts `at_least` (within `within`), follows the next leader
/// and waits for the scale-out to end `Succeeded` there; the cluster then,
/// `Active`.
async fn scale_out_across_a_kill(
    env: &mut TestEnv,
    cluster: &str,
    body: serde_json::Value,
    at_least: usize,
    within: Duration,
    running: impl AsyncFn(&TestEnv) -> usize,
) -> serde_json::Value {
    let (status, resp) = env.post(&format!("/clusters/{cluster}/scale"), body).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{resp:#}");
    let op = resp["operation"]["id"].as_str().expect("op id").to_string();
    let deadline = Instant::now() + within;
    loop {
        let n = running(env).await;
        if n >= at_least {
            break;
        }
        assert!(Instant::now() < deadline, "the scale-out did not get going: {n} running");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    env.kill_master();
    env.follow_leader(Some(0), Duration::from_secs(20)).await;
    env.wait_ready().await;
    // It booted from the view it kept as a follower (the tests' `takeover
    // = "checked"` compared that view with the store first), trusted
    // because every revision since its load brought its watch an event
    // (the test's etcd holds this installation alone).
    let h = env.get("/health").await.1;
    assert_eq!(h["took_over"]["from"], "view", "{h:#}");
    assert_eq!(h["took_over"]["verified"], "revisions", "{h:#}");
    let done = env.wait_op(&op).await;
    env.assert_succeeded(&done);
    let c = env.cluster(cluster).await;
    assert_eq!(c["status"], "Active", "{}", c["status"]);
    c
}

#[tokio::test]
async fn a_scale_out_to_150_real_instances_ends_on_the_next_leader_after_a_kill_9() {
    let etcd = EtcdCluster::start(3);
    let mut env = TestEnv::start_ha_serving("ha-wide", &etcd, 3).await;
    let start = "set -eu\ndate +%s%N >> data/started_at\nexec sleep 100000\n";
    env.upload(&PackageBuilder::new("wide", "1.0.0").spec(SPEC).script("bin/start.sh", start)).await;
    let body =
        json!({"name": "wide", "package": {"name": "wide", "version": "1.0.0"}, "roles": {"svc": {"count": 10}}});
    env.create_active(body).await;
    // Every master has the tarball before the leader goes.
    let sha = env.get("/packages/wide/1.0.0").await.1["package"]["sha256"].as_str().expect("sha256").to_string();
    for i in 0..3 {
        let path = env.ha_dir(i).join("packages").join(&sha);
        assert!(crate::common::procfs::eventually(20, || path.exists()).await, "master {i} lacks the tarball");
    }

    // Readers on both followers all along.
    let stop = Arc::new(AtomicBool::new(false));
    let (reads, failures) = (Arc::new(AtomicU64::new(0)), Arc::new(std::sync::Mutex::new(Vec::new())));
    let mut readers = Vec::new();
    for i in 1..=2 {
        let url = format!("{}/clusters/wide?instances=false", env.ha_api(i));
        let client = crate::common::env::client_with_token(&env.token);
        let (stop, reads, failures) = (stop.clone(), reads.clone(), failures.clone());
        readers.push(tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                match client.get(&url).timeout(Duration::from_secs(10)).send().await {
                    Ok(r) if r.status() == StatusCode::OK => {}
                    Ok(r) => failures.lock().unwrap().push(format!("{url}: {}", r.status())),
                    Err(e) => failures.lock().unwrap().push(format!("{url}: {e}")),
                }
                reads.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }));
    }

    // Killed once the scale-out is well under way: some new members run.
    let running = async |env: &TestEnv| {
        all_instances(&env.cluster("wide").await).iter().filter(|i| i["status"] == "Running").count()
    };
    let body = json!({"role": "svc", "add": 140});
    let c = scale_out_across_a_kill(&mut env, "wide", body, 30, Duration::from_secs(60), running).await;
    let members = all_instances(&c);
    assert_eq!(members.len(), 150);
    let running = pids_by_instance();
    for m in &members {
        assert_eq!(m["status"], "Running", "{m:#}");
        let pid = pid_of(m);
        assert!(pid_alive(pid), "{} reports pid {pid}, not alive", id_of(m));
        let pids = running.get(&id_of(m)).cloned().unwrap_or_default();
        assert_eq!(pids, vec![pid], "{} runs another process tree than the one shown", id_of(m));
        assert_eq!(started_at(m).len(), 1, "{} was started more than once", id_of(m));
    }
    stop.store(true, Ordering::SeqCst);
    for r in readers {
        r.await.unwrap();
    }
    let failures = failures.lock().unwrap();
    assert!(failures.is_empty(), "{} of {} reads failed: {failures:#?}", failures.len(), reads.load(Ordering::SeqCst));
}

/// The same with 2,000 simulated instances on 20 simulated agents that
/// know all three masters: the kill lands mid-scale-out, the next leader
/// ends it `Succeeded`, every instance `Running` and started once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scale_out_to_2000_simulated_instances_ends_on_the_next_leader_after_a_kill_9() {
    const TOTAL: usize = 2000;
    let etcd = EtcdCluster::start(3);
    let mut env = TestEnv::start_ha_sim("ha-simw", &etcd, 3, 20).await;
    let (leader, h) = env.follow_leader(None, Duration::from_secs(10)).await;
    assert_eq!(leader, 0, "master 0 started first and leads: {h:#}");
    env.upload(&sim::package("simw", "1.0.0", TOTAL as u32)).await;
    let body = json!({"name": "simw", "package": {"name": "simw", "version": "1.0.0"}, "roles": {"d": {"count": 100}}});
    env.create_active(body).await;
    for i in 1..=2 {
        env.serving_follower(i).await;
    }

    // Killed once the scale-out is under way and far from done.
    let running = async |env: &TestEnv| {
        let n = env.fleet().running();
        assert!(n < TOTAL, "the scale-out ended before the kill: {n} running");
        n
    };
    let body = json!({"role": "d", "add": TOTAL - 100});
    let c = scale_out_across_a_kill(&mut env, "simw", body, 300, Duration::from_secs(120), running).await;
    let members = all_instances(&c);
    assert_eq!(members.len(), TOTAL);
    let not_running: Vec<_> = members.iter().filter(|m| m["status"] != "Running").take(3).collect();
    assert!(not_running.is_empty(), "not Running, e.g. {not_running:#?}");
    assert_eq!(env.fleet().running(), TOTAL, "the simulated agents do not run {TOTAL} instances");
    let mut starts = std::collections::HashMap::new();
    for a in &env.fleet().agents {
        for (id, i) in &a.state.lock().unwrap().instances {
            *starts.entry(id.to_string()).or_insert(0u32) += i.starts;
        }
    }
    for m in &members {
        assert_eq!(starts.get(&id_of(m)), Some(&1), "{} was not started exactly once", id_of(m));
    }
}
