//! A member's failure and its cluster's `Error` are one durable batch: a
//! reader never sees a failed member in an `Active` cluster, and a master
//! killed right after the failure was recorded (and acknowledged to the
//! agent, which then forgets it) comes back with the cluster in `Error`
//! naming the member.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::common::sse::SseReader;
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

/// A storm: every member of a 120-member cluster dies at once (no restart)
/// while other clusters are created. One escalation per cluster: the
/// `Error` names at most 5 members, at most 5 `actor.failed` events are
/// written for it, and no create is refused for an overloaded supervisor
/// (N failures once made N escalations, N cluster writes and N events, and
/// creates answered 503 meanwhile).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storm_of_member_failures_is_one_escalation_and_creates_go_on() {
    let env = TestEnv::start_sim("escalation-storm", &[], 3).await;
    env.upload(&sim::package("st", "1.0.0", 200)).await;
    let body = json!({"name": "s", "package": {"name": "st", "version": "1.0.0"}, "roles": {"d": {"count": 120}}});
    let c = env.create_active(body).await;
    assert_eq!(role_instances(&c, "d").len(), 120);
    let mut events = SseReader::open(&env.client, &env.api, "?cluster=s&kind=actor.failed", None).await;

    let env = &env;
    let creates = (0..10).map(|i| {
        let body = json!({"name": format!("c{i}"), "package": {"name": "st", "version": "1.0.0"}});
        async move { env.post("/clusters", body).await }
    });
    let crashes = async {
        for agent in &env.fleet().agents {
            let held: Vec<_> = agent.state.lock().unwrap().instances.keys().cloned().collect();
            for id in held {
                agent.crash(&id, false);
            }
        }
    };
    let (answers, ()) = tokio::join!(futures::future::join_all(creates), crashes);
    for (status, v) in answers {
        assert!(status.is_success(), "a create during the storm was refused: {status} {v:#}");
    }

    let c = env
        .until(60, "every member Failed", async || {
            let c = env.cluster("s").await;
            let left = role_instances(&c, "d").iter().filter(|m| m["status"] != "Failed").count();
            if left == 0 { Ok(c) } else { Err(format!("{left} members not Failed yet; cluster {}", c["status"])) }
        })
        .await;
    assert_eq!(c["status"], "Error", "{c:#}");
    let why = c["status_description"].as_str().unwrap_or_default();
    let named = why.matches(" failed: ").count();
    assert!((1..=5).contains(&named), "the Error names {named} members: {why}");
    assert!(why.len() < 5 * 600, "the Error's description is {} bytes", why.len());
    let mut failed = Vec::new();
    while let Some(e) = events.next(Duration::from_secs(3)).await {
        failed.push(e);
    }
    assert!((1..=5).contains(&failed.len()), "{} actor.failed events for one cluster: {failed:#?}", failed.len());
    for i in 0..10 {
        let (status, _) = env.get(&format!("/clusters/c{i}")).await;
        assert_eq!(status.as_u16(), 200, "cluster c{i}");
    }
}
