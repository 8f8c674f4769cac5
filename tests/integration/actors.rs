//! The supervision tree under the operator's verbs: a cluster actor killed
//! during a scale-out is restarted by its supervisor and the operation
//! completes, no process started twice; past its intensity it is given
//! up, its cluster `Error` saying so, until an operator restarts it; an
//! inventory that reached it dead is applied by its successor; the
//! supervised tasks and node managers come back; the root refuses.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common::{PackageBuilder, TestEnv, eventually, id_of, instance_pids, pid_of, role_instances};

async fn actor(env: &TestEnv, kind: &str, id: &str) -> Value {
    let (_, v) = env.get("/actors").await;
    v["actors"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["kind"] == kind && a["id"] == id)
        .cloned()
        .unwrap_or_else(|| panic!("no actor {kind}/{id} in {v:#}"))
}

async fn kill(env: &TestEnv, kind: &str, id: &str) -> (u16, Value) {
    let (status, v) = env.post_empty(&format!("/actors/{kind}/{id}/kill")).await;
    (status.as_u16(), v)
}

/// Until `check` holds for actor `kind/id` (at most 20 s).
async fn actor_until(env: &TestEnv, kind: &str, id: &str, what: &str, check: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let a = actor(env, kind, id).await;
        if check(&a) {
            return a;
        }
        assert!(Instant::now() < deadline, "{kind}/{id} never {what}: {a:#}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_actor_killed_during_a_scale_out_is_restarted_and_the_operation_completes() {
    let env = TestEnv::start("actors-kill").await;
    env.upload(&PackageBuilder::sleeper("ak")).await;
    let spec_max = json!({"name": "k", "package": {"name": "ak", "version": "1.0.0"}, "roles": {"svc": {"count": 2}}});
    let c = env.create_active(spec_max).await;
    let before: Vec<(String, u32)> = role_instances(&c, "svc").iter().map(|i| (id_of(i), pid_of(i))).collect();
    let a = actor(&env, "cluster", "k").await;
    assert_eq!((a["restarts"].as_u64(), a["health"].as_str()), (Some(0), Some("green")), "{a:#}");
    assert!(a["strategy"].as_str().unwrap().contains("3 in 60s"), "{a:#}");

    let (status, op) = env.post("/clusters/k/scale", json!({"role": "svc", "add": 3})).await;
    assert_eq!(status.as_u16(), 202, "{op:#}");
    let op = op["operation"].clone();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (status, v) = kill(&env, "cluster", "k").await;
    assert_eq!(status, 200, "{v:#}");
    // The new members' starts settle for a second: the kill lands inside.
    let (_, during) = env.get(&format!("/operations/{}", op["id"].as_str().unwrap())).await;
    assert_eq!(during["operation"]["status"], "Running", "the scale-out ended before the kill: {during:#}");
    let a = actor_until(&env, "cluster", "k", "restarted", |a| a["restarts"] == 1 && a["state"] != "restarting").await;
    assert_eq!(a["last_exit"]["reason"].as_str().map(|r| r.contains("killed by the operator")), Some(true), "{a:#}");
    let op = env.wait_op(op["id"].as_str().unwrap()).await;
    assert_eq!(op["status"], "Succeeded", "{op:#}");
    assert_scaled_out_cleanly(&env.cluster("k").await, &before, 5);
}

/// A node manager killed while its commands are out (the new members'
/// starts settle for a second): its agent dials again at once, and each cut
/// command is sent again on the new connection, so the scale-out succeeds
/// and no member starts twice (it failed "node is not connected").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_managers_killed_during_a_scale_out_cost_it_nothing() {
    let env = TestEnv::start("actors-kill-nm").await;
    env.upload(&PackageBuilder::sleeper("an")).await;
    let body = json!({"name": "n", "package": {"name": "an", "version": "1.0.0"}, "roles": {"svc": {"count": 2}}});
    let c = env.create_active(body).await;
    let before: Vec<(String, u32)> = role_instances(&c, "svc").iter().map(|i| (id_of(i), pid_of(i))).collect();

    let (status, op) = env.post("/clusters/n/scale", json!({"role": "svc", "add": 3})).await;
    assert_eq!(status.as_u16(), 202, "{op:#}");
    let op = op["operation"].clone();
    tokio::time::sleep(Duration::from_millis(300)).await;
    for node in ["node-1", "node-2", "node-3"] {
        let (status, v) = kill(&env, "node_manager", node).await;
        assert_eq!(status, 200, "{v:#}");
    }
    let (_, during) = env.get(&format!("/operations/{}", op["id"].as_str().unwrap())).await;
    assert_eq!(during["operation"]["status"], "Running", "the scale-out ended before the kills: {during:#}");
    let op = env.wait_op(op["id"].as_str().unwrap()).await;
    assert_eq!(op["status"], "Succeeded", "{op:#}");
    assert_scaled_out_cleanly(&env.cluster("n").await, &before, 5);
}

/// After a scale-out through a fault: the cluster `Active` with `count`
/// members of role `svc`, the old ones (`before`: id, pid) never
/// restarted, each running exactly the one process shown.
fn assert_scaled_out_cleanly(c: &Value, before: &[(String, u32)], count: usize) {
    assert_eq!(c["status"], "Active", "{c:#}");
    let members = role_instances(c, "svc");
    assert_eq!(members.len(), count, "{c:#}");
    for (id, pid) in before {
        let m = members.iter().find(|m| &id_of(m) == id).expect("an old member is gone");
        assert_eq!(pid_of(m), *pid, "an old member was restarted: {m:#}");
    }
    for m in &members {
        assert_eq!(m["status"], "Running", "{m:#}");
        assert_eq!(instance_pids(&id_of(m)), vec![pid_of(m)], "started twice, or not the pid shown: {m:#}");
    }
}

/// Kills cluster `name`'s actor past its intensity (three restarts in 60 s
/// are allowed; the fourth failure gives it up); its view once given up.
async fn give_up(env: &TestEnv, name: &str) -> Value {
    for n in 1..=3u64 {
        let (status, v) = kill(env, "cluster", name).await;
        assert_eq!(status, 200, "{v:#}");
        actor_until(env, "cluster", name, "restarted", |a| a["restarts"] == n && a["state"] != "restarting").await;
    }
    kill(env, "cluster", name).await;
    actor_until(env, "cluster", name, "given up", |a| a["state"] == "failed").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_its_intensity_a_cluster_actor_is_given_up_until_an_operator_restarts_it() {
    let env = TestEnv::start("actors-give-up").await;
    env.upload(&PackageBuilder::sleeper("ag")).await;
    env.create_active(json!({"name": "g", "package": {"name": "ag", "version": "1.0.0"}})).await;
    let a = give_up(&env, "g").await;
    assert_eq!(a["health"], "red", "{a:#}");
    let c = loop {
        let c = env.cluster("g").await;
        if c["status"] == "Error" {
            break c;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let why = c["status_description"].as_str().unwrap();
    assert!(why.contains("gave up after 4 failures") && why.contains("killed by the operator"), "{why}");
    // Mutations are refused, saying how to bring it back; reads work.
    let (status, v) = env.post_empty("/clusters/g/start").await;
    assert_eq!(status.as_u16(), 503, "{v:#}");
    assert!(v.to_string().contains("/actors/cluster/g/restart"), "{v:#}");
    // A kill of a failed actor, a restart of a live one: refused.
    assert_eq!(kill(&env, "cluster", "g").await.0, 409);

    let (status, v) = env.post_empty("/actors/cluster/g/restart").await;
    assert_eq!(status.as_u16(), 200, "{v:#}");
    let a = actor_until(&env, "cluster", "g", "back", |a| a["state"] != "failed" && a["state"] != "restarting").await;
    assert_eq!(a["health"], "green", "{a:#}");
    let (status, _) = env.post_empty("/actors/cluster/g/restart").await;
    assert_eq!(status.as_u16(), 409, "a live actor restarted");
    env.run_ok("/clusters/g/start", None).await;
    assert_eq!(env.cluster("g").await["status"], "Active");
}

/// A cluster's restarts are its own: one deleted after three restarts and
/// created again under its name is restarted at its next failure, not
/// given up for its predecessor's (a soak round's cluster was given up at
/// its first kill, the name's history carried over).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_created_again_under_a_name_does_not_inherit_its_restarts() {
    let env = TestEnv::start("actors-same-name").await;
    env.upload(&PackageBuilder::sleeper("as")).await;
    let body = json!({"name": "r", "package": {"name": "as", "version": "1.0.0"}});
    env.create_active(body.clone()).await;
    for n in 1..=3u64 {
        assert_eq!(kill(&env, "cluster", "r").await.0, 200);
        actor_until(&env, "cluster", "r", "restarted", |a| a["restarts"] == n && a["state"] != "restarting").await;
    }
    let (status, v) = env.delete("/clusters/r").await;
    assert_eq!(status.as_u16(), 202, "{v:#}");
    env.wait_op(v["operation"]["id"].as_str().expect("op id")).await;
    env.create_active(body).await;
    assert_eq!(kill(&env, "cluster", "r").await.0, 200);
    let a = actor_until(&env, "cluster", "r", "restarted", |a| a["restarts"] == 1 && a["state"] != "restarting").await;
    assert_ne!(a["state"], "failed", "{a:#}");
    assert_eq!(env.cluster("r").await["status"], "Active");
}

/// Cluster `name` of one sleeper (package `package`) on node-1: its
/// instance's id and pid.
async fn one_sleeper_on_node_1(env: &TestEnv, name: &str, package: &str) -> (String, u32) {
    env.upload(&PackageBuilder::sleeper(package)).await;
    let body = json!({"name": name, "package": {"name": package, "version": "1.0.0"},
        "roles": {"svc": {"count": 1, "nodes": ["node-1"]}}});
    let c = env.create_active(body).await;
    let i = role_instances(&c, "svc").remove(0);
    (id_of(&i), pid_of(&i))
}

/// An agent's inventory that reaches a cluster whose actor is dead (given
/// up here; one restarting, for its backoff, is the same) is held by the
/// node manager and applied by the actor that takes its place: a process
/// that died while its agent was away ends `Failed`, not `Running` with its
/// dead pid. (The inventory was dropped with the dead actor's mailbox, and
/// the restarted actor's records kept the dead process running.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inventory_reaching_a_dead_cluster_actor_is_applied_by_its_successor() {
    let mut env = TestEnv::start("actors-inventory").await;
    let (id, pid) = one_sleeper_on_node_1(&env, "v", "ai").await;
    assert_eq!(instance_pids(&id), vec![pid]);
    // The process dies while its agent is away: nothing reports the exit,
    // only the agent's inventory when it is back.
    env.kill_agent(1);
    let killed = std::process::Command::new("kill").args(["-9", &pid.to_string()]).status().unwrap();
    assert!(killed.success(), "kill -9 {pid}");
    assert!(eventually(5, || instance_pids(&id).is_empty()).await, "{id} still runs: {:?}", instance_pids(&id));
    let a = give_up(&env, "v").await;
    assert_eq!(a["state"], "failed", "{a:#}");
    env.restart_agent(1).await;
    // The inventory has reached the node manager; the records still say
    // what the dead actor last wrote.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let i = &env.cluster("v").await["instances"][0];
    assert_eq!((i["status"].as_str(), i["pid"].as_u64()), (Some("Running"), Some(u64::from(pid))), "{i:#}");
    // Held work is queued work: the node manager's mailbox shows it.
    let nm = actor(&env, "node_manager", "node-1").await;
    assert!(nm["mailbox"].as_u64() >= Some(1), "the held inventory line is not in its mailbox depth: {nm:#}");

    let (status, v) = env.post_empty("/actors/cluster/v/restart").await;
    assert_eq!(status.as_u16(), 200, "{v:#}");
    let deadline = Instant::now() + Duration::from_secs(10);
    let i = loop {
        let i = env.cluster("v").await["instances"][0].clone();
        if i["status"] != "Running" || Instant::now() > deadline {
            break i;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(i["status"], "Failed", "the dead process is still shown running: {i:#}");
    assert_eq!(i["pid"], Value::Null, "{i:#}");
    let error = i["last_error"].as_str().unwrap_or_default();
    assert!(error.contains("not running on node node-1 when its agent reconnected"), "{i:#}");
    actor_until(&env, "node_manager", "node-1", "done with what it held", |a| a["mailbox"] == 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_tasks_and_node_managers_come_back_and_the_root_refuses() {
    let mut env = TestEnv::start("actors-tasks").await;
    for task in ["agent_listener", "node_watcher", "leaked_sweep"] {
        let a = actor(&env, task, task).await;
        assert_eq!(a["parent"], "master", "{a:#}");
        let (status, v) = kill(&env, task, task).await;
        assert_eq!(status, 200, "{v:#}");
        actor_until(&env, task, task, "restarted", |a| a["restarts"] == 1 && a["state"] == "running").await;
    }
    // A task's id is its kind.
    assert_eq!(kill(&env, "agent_listener", "0").await.0, 404);
    // The operator's verb never ends the master: a kill past the listener's
    // intensity (5 in 60 s; 1 spent above) is refused.
    for n in 2..=5u64 {
        assert_eq!(kill(&env, "agent_listener", "agent_listener").await.0, 200);
        actor_until(&env, "agent_listener", "agent_listener", "restarted", |a| {
            a["restarts"] == n && a["state"] == "running"
        })
        .await;
    }
    let (status, v) = kill(&env, "agent_listener", "agent_listener").await;
    assert_eq!(status, 409, "{v:#}");
    assert!(v.to_string().contains("would end the master"), "{v:#}");
    // The restarted listener takes agents: one restarted connects again.
    env.restart_agent(1).await;
    // A killed node manager: its agent reconnects, a new one serves it.
    let connected =
        || env.master_log().lines().filter(|l| l.contains("agent connected") && l.contains("node-2")).count();
    let connections = connected();
    assert!(connections > 0, "no 'agent connected' line for node-2 in the master's log");
    let (status, v) = kill(&env, "node_manager", "node-2").await;
    assert_eq!(status, 200, "{v:#}");
    // A new node manager serves it: listed again, its agent's node Ready.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (_, v) = env.get("/actors").await;
        let listed = v["actors"].as_array().unwrap().iter().any(|a| a["kind"] == "node_manager" && a["id"] == "node-2");
        if listed {
            break;
        }
        assert!(Instant::now() < deadline, "no node manager for node-2 20 s after its kill: {v:#}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    env.wait_ready().await;
    assert!(eventually(20, || connected() > connections).await, "node-2's agent did not connect again");
    // The view shows the restart: the new node manager carries it on.
    let (_, v) = env.get("/actors").await;
    let rows: Vec<&Value> =
        v["actors"].as_array().unwrap().iter().filter(|a| a["kind"] == "node_manager" && a["id"] == "node-2").collect();
    assert!(!rows.is_empty(), "{v:#}");
    for a in rows {
        assert!(a["restarts"].as_u64() >= Some(1), "{a:#}");
        assert_eq!(a["last_exit"]["reason"], "killed by the operator", "{a:#}");
    }
    // The root's children that are not restarted are listed as the tree says.
    let (_, v) = env.get("/actors").await;
    let writer = v["actors"].as_array().unwrap().iter().find(|a| a["kind"] == "store_writer").cloned();
    let writer = writer.unwrap_or_else(|| panic!("the store writer is not listed: {v:#}"));
    assert_eq!((writer["parent"].as_str(), writer["state"].as_str()), (Some("master"), Some("running")), "{writer:#}");
    assert_eq!(writer["strategy"], "one_for_one, never restarted, then the master exits", "{writer:#}");
    for (kind, id) in [("supervisor", "supervisor"), ("store_writer", "store_writer")] {
        let (status, v) = kill(&env, kind, id).await;
        assert_eq!(status, 409, "{kind}: {v:#}");
    }
    assert_eq!(kill(&env, "cluster", "nope").await.0, 404);
    assert_eq!(kill(&env, "instance", "nope-svc-0").await.0, 404);
    // The master still serves.
    let (status, _) = env.get("/health").await;
    assert_eq!(status.as_u16(), 200);
}

/// Issue 23's first race, with the ordering injected: the agent's inventory
/// is delayed (held, its cluster's actor being dead) and the process dies
/// meanwhile, so reports made after the inventory was taken (the exit, the
/// agent's restart) arrive while it waits. They are applied after it, never
/// before: the instance ends showing the process that runs, not the dead
/// pid the inventory saw. (Reports that overtook the inventory once let it
/// set the dead pid back, and every later report was ignored.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_made_after_a_delayed_inventory_are_applied_after_it() {
    let mut env = TestEnv::start("actors-inventory-order").await;
    let (id, pid) = one_sleeper_on_node_1(&env, "o", "ao").await;
    let a = give_up(&env, "o").await;
    assert_eq!(a["state"], "failed", "{a:#}");
    // The agent comes back (its inventory: running, `pid`), then the
    // process dies: its exit and the agent's restart of it follow.
    env.kill_agent(1);
    env.restart_agent(1).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let killed = std::process::Command::new("kill").args(["-9", &pid.to_string()]).status().unwrap();
    assert!(killed.success(), "kill -9 {pid}");
    assert!(
        eventually(10, || instance_pids(&id).iter().any(|p| *p != pid)).await,
        "the agent did not start {id} again: {:?}",
        instance_pids(&id)
    );

    let (status, v) = env.post_empty("/actors/cluster/o/restart").await;
    assert_eq!(status.as_u16(), 200, "{v:#}");
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let i = env.cluster("o").await["instances"][0].clone();
        let live = instance_pids(&id);
        if i["status"] == "Running" && i["pid"].as_u64().is_some_and(|p| live == vec![p as u32]) {
            assert_ne!(i["pid"].as_u64(), Some(u64::from(pid)), "{i:#}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not shown running its live process {live:?} (the dead one was {pid}): {i:#}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
