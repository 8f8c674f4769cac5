//! Faults injected where each kind of child runs (the master's test hooks,
//! `test_hooks`): a panic in every supervised kind during a scale-out of
//! 200 simulated instances, and the operator's kill of each, each
//! restarted by its supervisor, nothing started twice; a task past its intensity and a panicking supervisor end
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
/// last for a failure whose reason contains `why`. (A task shows
/// `running`; a cluster actor its cluster's state or its operation:
/// anything but down.)
async fn restarted_for(env: &TestEnv, kind: &str, id: &str, restarts: u64, why: &str) -> Value {
    env.until(30, &format!("{kind}/{id} restarted after '{why}'"), async || match actor(env, kind, id).await {
        Some(a)
            if a["restarts"].as_u64() >= Some(restarts)
                && !matches!(a["state"].as_str(), None | Some("restarting" | "failed" | "giving up"))
                && a["last_exit"]["reason"].as_str().is_some_and(|r| r.contains(why)) =>
        {
            Ok(a)
        }
        other => Err(format!("{other:#?}")),
    })
    .await
}

/// [`restarted_for`] a panic the hook injected.
async fn restarted(env: &TestEnv, kind: &str, id: &str, restarts: u64) -> Value {
    restarted_for(env, kind, id, restarts, "a panic injected by a test hook").await
}

/// How each child is failed: a panic injected where it runs, or the
/// operator's `kill` verb.
#[derive(Clone, Copy, PartialEq)]
enum Via {
    Panic,
    Kill,
}

impl Via {
    async fn fail(self, env: &TestEnv, kind: &str, id: &str) {
        let (status, v) = match self {
            Via::Panic => inject(env, kind, id, "panic").await,
            Via::Kill => {
                let (status, v) = env.post_empty(&format!("/actors/{kind}/{id}/kill")).await;
                (status.as_u16(), v)
            }
        };
        assert_eq!(status, 200, "failing {kind}/{id}: {v:#}");
    }

    /// What the view's `last_exit` says of it.
    fn why(self) -> &'static str {
        match self {
            Via::Panic => "a panic injected by a test hook",
            Via::Kill => "killed by the operator",
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_kind_of_child_panics_during_a_scale_out_of_two_hundred_and_comes_back() {
    each_kind_fails_during_a_scale_out_of_two_hundred("inject", Via::Panic).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_kind_of_child_killed_by_the_operator_during_a_scale_out_of_two_hundred_comes_back() {
    each_kind_fails_during_a_scale_out_of_two_hundred("inject-kill", Via::Kill).await;
}

/// Every kind of child fails (`via`) while 200 simulated instances are
/// added: each is restarted by its supervisor and the view says why; the
/// scale-out ends honestly (all of it, or undone with its reason), no
/// process is started twice, no old member touched, the API's pids the
/// agents'. Panics also hit a link writer (its node manager's group
/// restarts), an event write (lost, counted) and an instance actor (its
/// cluster's actor fails with it).
async fn each_kind_fails_during_a_scale_out_of_two_hundred(name: &str, via: Via) {
    // Slow enough that the scale-out still runs once every failure is in.
    let latency = Latency { install: Duration::from_secs(6), start: Duration::from_secs(3), ..Default::default() };
    let env = TestEnv::start_sim_with(name, &HOOKS, 3, latency).await;
    env.upload(&sim::package("inj", "1.0.0", 400)).await;
    let body = json!({"name": "p", "package": {"name": "inj", "version": "1.0.0"}, "roles": {"d": {"count": 3}}});
    let c = env.create_active(body).await;
    let before: Vec<(String, u32)> = role_instances(&c, "d").iter().map(|i| (id_of(i), pid_of(i))).collect();
    let connections_before: Vec<u64> = env.fleet().agents.iter().map(|a| a.connections()).collect();

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
        via.fail(&env, kind, id).await;
    }
    if via == Via::Panic {
        // No verb for these: a link writer is killed with its node
        // manager; an event write is a temporary task.
        via.fail(&env, "link_writer", "sim-3").await;
        via.fail(&env, "announce", "announce").await;
    }
    eprintln!("{} failures in {:?}", kinds.len(), injecting.elapsed());
    let (_, during) = env.get(&format!("/operations/{op_id}")).await;
    assert_eq!(
        during["operation"]["status"], "Running",
        "the scale-out ended before the failures: this shows nothing\n{during:#}"
    );

    // Each is restarted by its supervisor, and the view says why.
    for (kind, id) in &kinds[..3] {
        restarted_for(&env, kind, id, 1, via.why()).await;
    }
    let cluster_actor = restarted_for(&env, "cluster", "p", 1, via.why()).await;
    assert!(cluster_actor["strategy"].as_str().unwrap_or("").contains("3 in 60s"), "{cluster_actor:#}");
    // A node manager's failure (a link writer's too: one group) closes
    // its link: the agent dials again, and a new node manager serves the
    // new connection, carrying its predecessor's restart and end.
    let mut failed_links = vec![(1, "sim-2", via.why())];
    if via == Via::Panic {
        failed_links.push((
            2,
            "sim-3",
            "its link writer panicked: a panic injected by a test hook (link writer of sim-3)",
        ));
    }
    for (i, node, why) in failed_links {
        env.until(30, &format!("{node} connected again through a new node manager"), async || {
            let n = env.node(node).await;
            let now = env.fleet().agents[i].connections();
            if now > connections_before[i] && n["connected"] == true && n["status"] == "Ready" {
                Ok(())
            } else {
                Err(format!("connections {} -> {now}; {n:#}", connections_before[i]))
            }
        })
        .await;
        restarted_for(&env, "node_manager", node, 1, why).await;
    }
    if via == Via::Panic {
        let log = env.master_log();
        assert!(log.contains("a panic injected by a test hook (node manager of sim-2)"), "{log}");
        // The event write is lost, logged and counted; nothing else is touched.
        assert!(log.contains("a panic injected by a test hook (announce)"), "{log}");
        let root = env.api.trim_end_matches("/api/v1");
        let metrics = env.client.get(format!("{root}/metrics")).send().await.unwrap().text().await.unwrap();
        assert!(metrics.contains("flotilla_task_failures_total{kind=\"announce\"} 1"), "{metrics}");
    }

    // An instance actor fails: its cluster's actor fails with it (one
    // group), and is restarted. A new member not yet started: its start is
    // a turn still to come, where an injected panic fires.
    let member = env
        .until(30, "a new member not yet started", async || {
            let c = env.cluster("p").await;
            role_instances(&c, "d")
                .iter()
                .find(|m| {
                    matches!(m["status"].as_str(), Some("Pending" | "Installing" | "Installed"))
                        && !before.iter().any(|(id, _)| *id == id_of(m))
                })
                .map(id_of)
                .ok_or_else(|| format!("{c:#}"))
        })
        .await;
    via.fail(&env, "instance", &member).await;
    let why = match via {
        Via::Panic => format!("its instance actor {member} panicked"),
        Via::Kill => format!("its instance actor {member} was killed by the operator"),
    };
    restarted_for(&env, "cluster", "p", 2, &why).await;

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

/// The actor view tells a held mailbox: a cluster actor that takes no
/// message (stalled) while a request waits shows the request in its
/// mailbox, green at first, amber once it has waited over 5 s, and green
/// with an empty mailbox again once the actor runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_waiting_over_five_seconds_turns_its_actor_amber_until_it_is_taken() {
    let master = [HOOKS[0], ("FLOTILLA_MASTER_REQUEST_TAKE_LIMIT", "1s")];
    let env = TestEnv::start_sim("inject-amber", &master, 1).await;
    env.upload(&sim::package("am", "1.0.0", 3)).await;
    env.create_active(json!({"name": "a", "package": {"name": "am", "version": "1.0.0"}})).await;
    let a = actor(&env, "cluster", "a").await.expect("cluster/a listed");
    assert_eq!((a["health"].as_str(), a["mailbox"].as_u64()), (Some("green"), Some(0)), "{a:#}");

    // Taken before the stall begins: it ends 9 s after this at the earliest.
    let stalled = Instant::now();
    let (status, v) = inject(&env, "cluster", "a", "stall?ms=9000").await;
    assert_eq!(status, 200, "{v:#}");
    let (status, v) = env.post_empty("/clusters/a/stop").await;
    assert_eq!(status.as_u16(), 503, "{v:#}");
    let a = actor(&env, "cluster", "a").await.expect("cluster/a listed");
    assert!(stalled.elapsed() < Duration::from_secs(4), "the stop took {:?} to be refused", stalled.elapsed());
    assert_eq!((a["health"].as_str(), a["mailbox"].as_u64()), (Some("green"), Some(1)), "waiting under 5 s: {a:#}");
    let a = env
        .until(8, "cluster/a amber", async || match actor(&env, "cluster", "a").await {
            Some(a) if a["health"] == "amber" => Ok(a),
            other => Err(format!("{other:#?}")),
        })
        .await;
    // Still waiting (the stall has not ended), for over 5 s.
    assert!(a["oldest_message_ms"].as_u64() > Some(5_000), "{a:#}");
    assert_eq!(a["mailbox"], 1, "{a:#}");
    let a = env
        .until(15, "cluster/a green again", async || match actor(&env, "cluster", "a").await {
            Some(a) if a["health"] == "green" && a["mailbox"] == 0 => Ok(a),
            other => Err(format!("{other:#?}")),
        })
        .await;
    assert!(stalled.elapsed() >= Duration::from_secs(9), "green before the stall ended: {a:#}");
    assert_eq!(a["restarts"], 0, "a stall is not a failure: {a:#}");
}

/// A create waits for its new cluster's actor as any request does: on a
/// saturated thread (blocked here; one actor thread) the actor does not
/// take it within the limit, the caller is answered that nothing was done,
/// and the actor, once it runs, drops the create and frees the name: the
/// cluster never appears, and the same create then succeeds. (The caller
/// waited without a deadline.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_its_new_actor_does_not_take_in_time_is_refused_and_frees_the_name() {
    let master = [HOOKS[0], ("FLOTILLA_MASTER_REQUEST_TAKE_LIMIT", "1s"), ("FLOTILLA_MASTER_ACTOR_THREADS", "1")];
    let env = TestEnv::start_sim("inject-create-late", &master, 1).await;
    env.upload(&sim::package("cl", "1.0.0", 3)).await;
    env.create_active(json!({"name": "first", "package": {"name": "cl", "version": "1.0.0"}})).await;

    let (status, v) = inject(&env, "cluster", "first", "block?ms=4000").await;
    assert_eq!(status, 200, "{v:#}");
    // The hook's answer only says the block was sent: the create could
    // reach the thread first (it did once, on a loaded machine).
    env.until(3, "the thread of first's actor is blocked", async || {
        let a = actor(&env, "cluster", "first").await;
        let current = a.as_ref().and_then(|a| a["current"].as_str()).unwrap_or_default();
        if current.contains("blocked by a test hook") { Ok(()) } else { Err(format!("{a:#?}")) }
    })
    .await;
    let body = json!({"name": "late", "package": {"name": "cl", "version": "1.0.0"}});
    let asked = Instant::now();
    let (status, v) = env.post("/clusters", body.clone()).await;
    let waited = asked.elapsed();
    assert_eq!(status.as_u16(), 503, "a create its actor could not take: {v:#}");
    let message = v["error"]["message"].as_str().or(v["message"].as_str()).unwrap_or("");
    assert!(message.contains("did not take the request within 1s") && message.contains("nothing was done"), "{v:#}");
    assert!(waited < Duration::from_secs(3), "answered after {waited:?}, not at the limit");
    // A retry while the dropped create still holds the name: told to
    // retry, not that the cluster exists (it never will).
    let (status, v) = env.post("/clusters", body.clone()).await;
    assert_eq!(status.as_u16(), 503, "a retry while the name is held: {v:#}");
    let message = v["error"]["message"].as_str().unwrap_or("");
    assert!(message.contains("under way") && message.contains("retry"), "{v:#}");

    // Once the thread runs again the create is dropped: never shown, the
    // name free, no operation.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let (status, v) = env.get("/clusters/late").await;
    assert_eq!(status.as_u16(), 404, "the refused create left a cluster: {v:#}");
    let (_, ops) = env.get("/operations?cluster=late").await;
    assert_eq!(ops["operations"].as_array().map(Vec::len), Some(0), "{ops:#}");
    let c = env.create_active(body).await;
    assert_eq!(c["status"], "Active", "{c:#}");
}

/// A cluster actor restarted while one of its nodes has been Down for a
/// while resumes its operation at once: it waits only for nodes that may
/// still come back (silent for less than `node_down_after`). It waited
/// `node_down_after` anew at each restart, so an actor killed every few
/// seconds (the soak's killer) never resumed its operation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_actor_does_not_wait_for_a_node_long_down() {
    let master = [
        ("FLOTILLA_MASTER_HEARTBEAT_INTERVAL", "500ms"),
        ("FLOTILLA_MASTER_NODE_UNKNOWN_AFTER", "2s"),
        ("FLOTILLA_MASTER_NODE_DOWN_AFTER", "8s"),
    ];
    let latency = Latency { stop: Duration::from_secs(2), ..Default::default() };
    let env = TestEnv::start_sim_with("inject-resume-down", &master, 2, latency).await;
    env.upload(&sim::package("rd", "1.0.0", 4)).await;
    let body = json!({"name": "w", "package": {"name": "rd", "version": "1.0.0"}, "roles": {"d": {"count": 4}}});
    let c = env.create_active(body).await;
    let nodes: std::collections::HashSet<String> =
        role_instances(&c, "d").iter().filter_map(|m| m["node"].as_str().map(String::from)).collect();
    assert_eq!(nodes.len(), 2, "the members are not on both nodes: {c:#}");
    env.fleet().agents[1].set_frozen(true);
    env.until(20, "sim-2 Down", async || {
        let n = env.node("sim-2").await;
        if n["status"] == "Down" { Ok(()) } else { Err(format!("{n:#}")) }
    })
    .await;

    let (status, v) = env.post_empty("/clusters/w/stop").await;
    assert_eq!(status.as_u16(), 202, "{v:#}");
    let op = v["operation"]["id"].as_str().expect("op id").to_string();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (status, v) = env.post_empty("/actors/cluster/w/kill").await;
    assert_eq!(status.as_u16(), 200, "{v:#}");
    let killed = Instant::now();
    let op = env.wait_op(&op).await;
    let took = killed.elapsed();
    assert!(
        took < Duration::from_secs(6),
        "the resumed stop ended {took:?} after the kill: it waited for the Down node"
    );
    // sim-2's stops could not be sent: the stop ends saying so.
    assert_ne!(op["status"], "Running", "{op:#}");
    assert!(env.master_log().contains("resuming an operation"), "the kill did not interrupt the stop");
    env.fleet().agents[1].set_frozen(false);
}
