//! Faults injected where each kind of child runs (the master's test hooks,
//! `test_hooks`): a panic in every supervised kind during a scale-out of
//! 200 simulated instances, each restarted by its supervisor, nothing
//! started twice; a task past its intensity and a panicking supervisor end
//! the master with the cause; a request a stalled actor does not take in
//! time is refused and never runs, and one an actor failed before taking
//! goes to its restarted successor.

use std::time::{Duration, Instant};

use flotilla::bench::sim::Latency;
use serde_json::{Value, json};

use crate::common::{TestEnv, id_of, pid_of, role_instances, sim};

const HOOKS: [(&str, &str); 1] = [("FLOTILLA_MASTER_TEST_HOOKS", "true")];

/// `POST /test-hooks/actors/{kind}/{id}/{fault}`.
async fn inject(env: &TestEnv, kind: &str, id: &str, fault: &str) -> (u16, Value) {
    let root = env.api.trim_end_matches("/api/v1");
    let resp = env
        .client
        .post(format!("{root}/test-hooks/actors/{kind}/{id}/{fault}"))
        .send()
        .await
        .expect("POST a test hook");
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

async fn actor(env: &TestEnv, kind: &str, id: &str) -> Option<Value> {
    let (_, v) = env.get("/actors").await;
    v["actors"].as_array()?.iter().find(|a| a["kind"] == kind && a["id"] == id).cloned()
}

/// Until actor `kind/id` runs again after at least `restarts` restarts, the
/// last for a panic the hook injected. (A task shows `running`; a cluster
/// actor its cluster's state or its operation: anything but down.)
async fn restarted(env: &TestEnv, kind: &str, id: &str, restarts: u64) -> Value {
    env.until(30, &format!("{kind}/{id} restarted after its panic"), async || match actor(env, kind, id).await {
        Some(a)
            if a["restarts"].as_u64() >= Some(restarts)
                && !matches!(a["state"].as_str(), None | Some("restarting" | "failed" | "giving up"))
                && a["last_exit"]["reason"].as_str().is_some_and(|r| r.contains("a panic injected by a test hook")) =>
        {
            Ok(a)
        }
        other => Err(format!("{other:#?}")),
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_kind_of_child_panics_during_a_scale_out_of_two_hundred_and_comes_back() {
    // Slow enough that the scale-out still runs once every panic is in.
    let latency = Latency { install: Duration::from_secs(6), start: Duration::from_secs(3), ..Default::default() };
    let env = TestEnv::start_sim_with("inject", &HOOKS, 3, latency).await;
    env.upload(&sim::package("inj", "1.0.0", 400)).await;
    let body = json!({"name": "p", "package": {"name": "inj", "version": "1.0.0"}, "roles": {"d": {"count": 3}}});
    let c = env.create_active(body).await;
    let before: Vec<(String, u32)> = role_instances(&c, "d").iter().map(|i| (id_of(i), pid_of(i))).collect();
    let connection_before = env.fleet().agents[1].connections();

    let (status, op) = env.post("/clusters/p/scale", json!({"role": "d", "add": 200})).await;
    assert_eq!(status.as_u16(), 202, "{op:#}");
    let op_id = op["operation"]["id"].as_str().expect("op id").to_string();
    let kinds = [
        ("node_watcher", "node_watcher"),
        ("leaked_sweep", "leaked_sweep"),
        ("agent_listener", "agent_listener"),
        ("node_manager", "sim-2"),
        ("cluster", "p"),
    ];
    let injecting = Instant::now();
    for (kind, id) in kinds {
        let (status, v) = inject(&env, kind, id, "panic").await;
        assert_eq!(status, 200, "injecting a panic into {kind}/{id}: {v:#}");
    }
    eprintln!("five panics injected in {:?}", injecting.elapsed());
    let (_, during) = env.get(&format!("/operations/{op_id}")).await;
    assert_eq!(
        during["operation"]["status"], "Running",
        "the scale-out ended before the panics: this shows nothing\n{during:#}"
    );

    // Each is restarted by its supervisor, and the view says why.
    for (kind, id) in &kinds[..3] {
        restarted(&env, kind, id, 1).await;
    }
    let cluster_actor = restarted(&env, "cluster", "p", 1).await;
    assert!(cluster_actor["strategy"].as_str().unwrap_or("").contains("3 in 60s"), "{cluster_actor:#}");
    // A node manager's panic closes its link: the agent dials again, and
    // a new node manager serves the new connection.
    env.until(30, "sim-2 connected again through a new node manager", async || {
        let n = env.node("sim-2").await;
        let now = env.fleet().agents[1].connections();
        if now > connection_before && n["connected"] == true && n["status"] == "Ready" {
            Ok(())
        } else {
            Err(format!("connections {connection_before} -> {now}; {n:#}"))
        }
    })
    .await;
    assert!(
        env.master_log().contains("a panic injected by a test hook (node manager of sim-2)"),
        "{}",
        env.master_log()
    );
    // The new node manager carries its predecessor's restart and end.
    restarted(&env, "node_manager", "sim-2", 1).await;

    // The scale-out ends honestly: all of it, or undone; nothing twice.
    let op = env.wait_op(&op_id).await;
    let c = env.cluster("p").await;
    assert!(c["operation"].is_null(), "the cluster is still busy after its operation ended: {c:#}");
    let members = role_instances(&c, "d");
    match op["status"].as_str() {
        Some("Succeeded") => {
            assert_eq!((c["status"].as_str(), members.len()), (Some("Active"), 203), "{c:#}");
        }
        Some("Failed" | "RolledBack") => {
            let error = op["error"].as_str().unwrap_or("");
            assert!(!error.is_empty(), "a failed scale-out without its reason: {op:#}");
            match c["status"].as_str() {
                Some("Active") => assert_eq!(members.len(), 3, "a scale-out undone leaves its members: {c:#}"),
                Some("Error") => assert!(c["status_description"].as_str().is_some_and(|d| !d.is_empty()), "{c:#}"),
                other => panic!("after a failed scale-out the cluster is {other:?}: {c:#}"),
            }
            eprintln!("the scale-out failed: {error}; the cluster is {}", c["status"]);
        }
        other => panic!("the scale-out ended {other:?}: {op:#}"),
    }
    for (id, pid) in &before {
        let m = members.iter().find(|m| &id_of(m) == id).unwrap_or_else(|| panic!("old member {id} is gone: {c:#}"));
        assert_eq!((m["status"].as_str(), pid_of(m)), (Some("Running"), *pid), "an old member was touched: {m:#}");
    }
    let listed: std::collections::HashSet<String> = members.iter().map(id_of).collect();
    for agent in &env.fleet().agents {
        let state = agent.state.lock().unwrap();
        for (id, held) in &state.instances {
            assert!(held.starts <= 1, "{id} was started {} times on {}", held.starts, agent.node);
            assert!(listed.contains(id.as_str()), "{} holds {id}, which the cluster does not list", agent.node);
        }
    }
    for m in members.iter().filter(|m| m["status"] == "Running") {
        let node = m["node"].as_str().expect("node");
        let agent = env.fleet().agents.iter().find(|a| a.node.as_str() == node).expect("the member's agent");
        let held = agent.state.lock().unwrap().instances.get(&flotilla::ids::InstanceId::new(id_of(m))).cloned();
        assert_eq!(held.and_then(|h| h.pid), Some(pid_of(m)), "the API's pid is not the agent's: {m:#}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_that_panics_past_its_intensity_ends_the_master_with_the_cause() {
    let mut env = TestEnv::start_sim("inject-fatal", &HOOKS, 1).await;
    // Five restarts in 60 s are allowed; the sixth failure is fatal.
    for n in 1..=5u64 {
        let (status, v) = inject(&env, "node_watcher", "node_watcher", "panic").await;
        assert_eq!(status, 200, "panic {n}: {v:#}");
        restarted(&env, "node_watcher", "node_watcher", n).await;
    }
    let (status, v) = inject(&env, "node_watcher", "node_watcher", "panic").await;
    assert_eq!(status, 200, "the sixth panic: {v:#}");
    let exit = env.wait_master_exit(Duration::from_secs(30)).await.expect("the master still runs after a sixth panic");
    assert_eq!(exit.code(), Some(1), "{exit}");
    let log = env.master_log();
    assert!(
        log.contains(
            "node_watcher failed 6 times within 60s: panicked: a panic injected by a test hook (node_watcher)"
        ),
        "the master's log does not give the cause:\n{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_supervisor_ends_the_master_with_the_cause() {
    let mut env = TestEnv::start_sim("inject-root", &HOOKS, 1).await;
    let (status, v) = inject(&env, "supervisor", "supervisor", "panic").await;
    assert_eq!(status, 200, "{v:#}");
    let exit =
        env.wait_master_exit(Duration::from_secs(30)).await.expect("the master still runs without its supervisor");
    assert_eq!(exit.code(), Some(1), "{exit}");
    let log = env.master_log();
    assert!(
        log.contains("the supervisor failed") && log.contains("a panic injected by a test hook (supervisor)"),
        "the master's log does not give the cause:\n{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_its_actor_does_not_take_in_time_is_refused_and_never_runs() {
    let master = [HOOKS[0], ("FLOTILLA_MASTER_REQUEST_TAKE_LIMIT", "1s")];
    let env = TestEnv::start_sim("inject-take", &master, 1).await;
    env.upload(&sim::package("tk", "1.0.0", 3)).await;
    env.create_active(json!({"name": "t", "package": {"name": "tk", "version": "1.0.0"}})).await;

    let (status, v) = inject(&env, "cluster", "t", "stall?ms=4000").await;
    assert_eq!(status, 200, "{v:#}");
    let asked = Instant::now();
    let (status, v) = env.post_empty("/clusters/t/stop").await;
    let waited = asked.elapsed();
    assert_eq!(status.as_u16(), 503, "a stop its stalled actor could not take: {v:#}");
    let message = v["error"]["message"].as_str().or(v["message"].as_str()).unwrap_or("");
    assert!(message.contains("did not take the request within 1s") && message.contains("nothing was done"), "{v:#}");
    assert!(waited >= Duration::from_secs(1) && waited < Duration::from_secs(3), "answered after {waited:?}");

    // Once the actor runs again it drops the request: no stop ever runs.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let (_, ops) = env.get("/operations?cluster=t").await;
    let kinds: Vec<&str> = ops["operations"].as_array().unwrap().iter().filter_map(|o| o["kind"].as_str()).collect();
    assert_eq!(kinds, ["Create"], "the refused stop ran: {ops:#}");
    let c = env.cluster("t").await;
    assert_eq!(c["status"], "Active", "{c:#}");
    assert!(role_instances(&c, "d").iter().all(|i| i["status"] == "Running"), "{c:#}");
    // The actor itself is fine: the next stop runs.
    env.run_ok("/clusters/t/stop", None).await;
}

/// An actor that fails with a request still in its mailbox has done nothing
/// with it: the request goes to the actor its supervisor starts in its
/// place, and its caller gets the `202` (a soak round once got
/// `503 "actor unavailable: Mailbox has closed"` here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_its_actor_failed_before_taking_goes_to_the_restarted_actor() {
    let env = TestEnv::start_sim("inject-resend", &HOOKS, 1).await;
    env.upload(&sim::package("rs", "1.0.0", 3)).await;
    env.create_active(json!({"name": "r", "package": {"name": "rs", "version": "1.0.0"}})).await;

    // Held, then failing: the stop waits in the mailbox behind the panic.
    let (status, v) = inject(&env, "cluster", "r", "stall?ms=3000").await;
    assert_eq!(status, 200, "{v:#}");
    let (status, v) = inject(&env, "cluster", "r", "panic").await;
    assert_eq!(status, 200, "{v:#}");
    let (status, v) = env.post_empty("/clusters/r/stop").await;
    assert_eq!(status.as_u16(), 202, "a stop whose actor failed before taking it: {v:#}");
    let op = env.wait_op(v["operation"]["id"].as_str().expect("an operation id")).await;
    env.assert_succeeded(&op);

    // The actor did fail and come back, and the stop ran once, on its successor.
    let a = restarted(&env, "cluster", "r", 1).await;
    assert_eq!(a["restarts"], 1, "{a:#}");
    let (_, ops) = env.get("/operations?cluster=r").await;
    let mut kinds: Vec<&str> =
        ops["operations"].as_array().unwrap().iter().filter_map(|o| o["kind"].as_str()).collect();
    kinds.sort_unstable();
    assert_eq!(kinds, ["Create", "Stop"], "{ops:#}");
    let c = env.cluster("r").await;
    assert_eq!(c["status"], "Stopped", "{c:#}");
}
