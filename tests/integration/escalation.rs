//! A member's failure and its cluster's `Error` are one durable batch: a
//! reader never sees a failed member in an `Active` cluster, and a master
//! killed right after the failure was recorded (and acknowledged to the
//! agent, which then forgets it) comes back with the cluster in `Error`
//! naming the member.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::common::{PackageBuilder, TestEnv, id_of, pid_of, role_instances};

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
