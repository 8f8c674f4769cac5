//! A member's failure and its cluster's `Error` are one durable batch: a
//! reader never sees a failed member in an `Active` cluster, and a master
//! killed right after the failure was recorded (and acknowledged to the
//! agent, which then forgets it) comes back with the cluster in `Error`
//! naming the member.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::common::{PackageBuilder, TestEnv, id_of, pid_of, role_instances, sim};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_killed_right_after_a_member_failure_comes_back_with_the_cluster_in_error() {
    // No restarts: the crash is a failure at once.
    let cfg_dir = tempfile::Builder::new().prefix("flotilla-escalation-").tempdir().expect("temp dir");
    let cfg = cfg_dir.path().join("agent.toml");
    std::fs::write(&cfg, "restart_max = 0\n").expect("write the agent config");
    let mut env = TestEnv::start_with_agent_flag("escalation", 1, &format!("--config={}", cfg.display())).await;
    env.upload(&PackageBuilder::sleeper("esc")).await;
    let body = json!({"name": "e", "package": {"name": "esc", "version": "1.0.0"},
        "roles": {"svc": {"count": 1, "nodes": ["node-1"]}}});
    let c = env.create_active(body).await;
    let member = role_instances(&c, "svc").remove(0);
    let id = id_of(&member);
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid_of(&member) as i32), nix::sys::signal::Signal::SIGKILL)
        .expect("kill the instance's process");

    // The moment the member shows Failed, the cluster shows Error: both
    // come from one write.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let c = env.cluster("e").await;
        let m = role_instances(&c, "svc").remove(0);
        if m["status"] == "Failed" {
            assert_eq!(c["status"], "Error", "a failed member shown in a cluster that is not Error: {c:#}");
            break;
        }
        assert_eq!(c["status"], "Active", "{c:#}");
        assert!(Instant::now() < deadline, "the crash never reached the master: {c:#}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    env.kill_master();
    env.start_master_again().await;
    let c = env.cluster("e").await;
    assert_eq!(c["status"], "Error", "{c:#}");
    let why = c["status_description"].as_str().unwrap_or_default();
    assert!(why.contains(&id) && why.contains("signal 9"), "the Error does not name the member and its end: {why:?}");
    assert_eq!(role_instances(&c, "svc")[0]["status"], "Failed", "{c:#}");
}

/// The same with the kill placed exactly: a simulated agent's process dies
/// (no restart), and the master is killed -9 the moment the agent has the
/// acknowledgement of that report (its outbox empty: it will never send it
/// again). The Error and the member's failure were durable before that
/// acknowledgement: after the restart the cluster is `Error` naming the
/// member and how it ended (not only what the agent's inventory says when
/// it reconnects: "not running ... when its agent reconnected").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_killed_the_moment_the_agent_has_the_acknowledgement_comes_back_with_the_cluster_in_error() {
    let mut env = TestEnv::start_sim("escalation-ack", &[], 1).await;
    env.upload(&sim::package("eack", "1.0.0", 3)).await;
    let body = json!({"name": "e", "package": {"name": "eack", "version": "1.0.0"}, "roles": {"d": {"count": 1}}});
    let c = env.create_active(body).await;
    let id = id_of(&role_instances(&c, "d").remove(0));
    let agent = env.fleet().agents[0].clone();
    env.until(10, "the agent's earlier reports acknowledged", async || {
        if agent.outbox.is_empty() { Ok(()) } else { Err(format!("{} unacknowledged", agent.outbox.len())) }
    })
    .await;

    assert!(agent.crash(&flotilla::ids::InstanceId::new(&id), false), "{id} was not running on the agent");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !agent.outbox.is_empty() {
        assert!(Instant::now() < deadline, "the master never acknowledged the exit of {id}");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    env.kill_master();
    env.start_master_again().await;
    let c = env.cluster("e").await;
    assert_eq!(c["status"], "Error", "{c:#}");
    let why = c["status_description"].as_str().unwrap_or_default();
    assert!(
        why.contains(&id) && why.contains("signal 9") && why.contains("killed by the simulator"),
        "the Error does not name the member and how it ended: {why:?}"
    );
    assert_eq!(role_instances(&c, "d")[0]["status"], "Failed", "{c:#}");
}
