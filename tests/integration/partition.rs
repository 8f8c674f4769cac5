//! A network partition of one node, made for real (issue 9). The node's
//! agent runs in a network namespace of its own, joined to the master by a
//! veth pair the test makes; the partition is the host end of the pair set
//! down: every packet either way is lost, and neither end gets a RST or a
//! FIN, as with a cut cable or a dead switch. The heal sets it up again.
//!
//! Invariants checked: a partition shorter than the heartbeat timeout
//! changes nothing anyone can see, and a command sent during it is
//! applied once; a longer one makes the node `Unknown` then `Down` within
//! the configured bounds and its instances `Lost`, while its processes
//! keep running and nothing starts a second copy; on the heal the master
//! takes what the agent reports, so each instance has exactly one process
//! and the master shows its pid; other nodes are never disturbed; after
//! the agent stops nothing of its instances runs.

use std::process::Child;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common::netns::Netns;
use crate::common::scripts::started_at;
use crate::common::{PackageBuilder, TestEnv, all_instances, id_of, instance_pids, pid_of};

/// The agent in the namespace, stopped with SIGTERM when dropped (it was
/// started with `--stop-instances-on-exit`, so its instances stop too).
struct NsAgent(Child);

impl NsAgent {
    fn stop(&mut self) -> bool {
        let pid = nix::unistd::Pid::from_raw(self.0.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.0.try_wait() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
        false
    }
}

impl Drop for NsAgent {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            self.stop();
        }
    }
}

/// A master on the veth's host address, its three agents, and `node-p`
/// in the namespace, with a cluster `pt` of two instances on `node-p` and
/// a cluster `other` of one on `node-1`; every node Ready.
async fn setup(name: &str, ns: &Netns, node_down_after: &str) -> (TestEnv, NsAgent) {
    let env =
        TestEnv::start_listening_on(name, &[("FLOTILLA_MASTER_NODE_DOWN_AFTER", node_down_after)], ns.host_ip()).await;
    let mut cmd = env.extra_agent_command("agent-p", "node-p", ns.ns_ip(), Some(&env.join_token), Some(&ns.name));
    let agent = NsAgent(cmd.spawn().expect("spawn the agent in the namespace"));
    env.until(30, "node-p Ready", async || {
        let (_, n) = env.get("/nodes/node-p").await;
        if n["status"] == "Ready" { Ok(()) } else { Err(n.to_string()) }
    })
    .await;
    env.upload(&PackageBuilder::sleeper("part")).await;
    let pkg = json!({"name": "part", "version": "1.0.0"});
    env.create_active(json!({"name": "pt", "package": pkg, "roles": {"svc": {"count": 2, "nodes": ["node-p"]}}})).await;
    env.create_active(json!({"name": "other", "package": pkg, "roles": {"svc": {"count": 1, "nodes": ["node-1"]}}}))
        .await;
    (env, agent)
}

/// Each instance of `cluster` as the master shows it, with its one
/// process: panics unless it is `Running` with exactly one process
/// carrying its marker, and that is the pid the master shows.
async fn one_copy_each(env: &TestEnv, cluster: &str) -> Vec<Value> {
    let c = env.cluster(cluster).await;
    let instances = all_instances(&c);
    for i in &instances {
        assert_eq!(i["status"], "Running", "{cluster}: {i}");
        let pids = instance_pids(&id_of(i));
        assert_eq!(pids, vec![pid_of(i)], "{cluster}: exactly the one process the master shows: {i}");
    }
    instances
}

async fn node_status(env: &TestEnv, node: &str) -> String {
    let (_, n) = env.get(&format!("/nodes/{node}")).await;
    n["status"].as_str().unwrap_or("?").to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_shorter_than_the_timeout_changes_nothing_and_a_command_in_it_is_applied_once() {
    let ns = Netns::make();
    let (env, mut agent) = setup("part-short", &ns, "10s").await;
    let before = one_copy_each(&env, "pt").await;
    let starts_before: Vec<usize> = before.iter().map(|i| started_at(i).len()).collect();

    ns.cut();
    let cut_at = Instant::now();
    // A restart sent into the partition: its frames wait in TCP.
    let (status, body) = env.post_empty("/clusters/pt/restart").await;
    assert_eq!(status, reqwest::StatusCode::ACCEPTED, "restart: {body}");
    let op = body["operation"]["id"].as_str().expect("operation id").to_string();
    // Heartbeats every 2 s, Unknown after 6 s of silence: 2.5 s of
    // partition must not show.
    while cut_at.elapsed() < Duration::from_millis(2500) {
        for node in ["node-p", "node-1"] {
            assert_eq!(node_status(&env, node).await, "Ready", "{node} during a 2.5 s partition");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    ns.heal();
    let op = env.wait_op(&op).await;
    assert_eq!(op["status"], "Succeeded", "the restart sent into the partition: {op:#}");
    let healed = Instant::now();
    while healed.elapsed() < Duration::from_secs(3) {
        assert_eq!(node_status(&env, "node-p").await, "Ready", "node-p after the heal");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let after = one_copy_each(&env, "pt").await;
    for (b, a) in before.iter().zip(&after) {
        assert_eq!(id_of(b), id_of(a));
        assert_ne!(pid_of(b), pid_of(a), "restarted: a new process");
    }
    let starts_after: Vec<usize> = after.iter().map(|i| started_at(i).len()).collect();
    let once: Vec<usize> = starts_before.iter().map(|n| n + 1).collect();
    assert_eq!(starts_after, once, "the restart's start ran exactly once per instance");
    assert_eq!(env.cluster("pt").await["status"], "Active");
    one_copy_each(&env, "other").await;
    // The agent kept its connection: it never dialled again.
    let log = std::fs::read_to_string(env.master_dir().join("../agent-p.log")).expect("agent-p's log");
    assert_eq!(log.matches("connected to master").count(), 1, "one connection in all:\n{log}");

    assert!(agent.stop(), "the agent stops on SIGTERM");
    for i in &after {
        assert!(instance_pids(&id_of(i)).is_empty(), "{} still runs after its agent stopped", id_of(i));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_longer_than_the_timeout_marks_the_node_down_and_its_instances_lost_then_heals_to_one_copy() {
    let ns = Netns::make();
    let down_after = Duration::from_secs(8);
    let (env, mut agent) = setup("part-long", &ns, "8s").await;
    let before = one_copy_each(&env, "pt").await;
    let other_before = one_copy_each(&env, "other").await;

    ns.cut();
    let cut_at = Instant::now();
    // Sent into the partition: the master gives up on it when the link
    // closes; TCP may still deliver it after the heal, and then it must
    // be applied once and the master must see what it did.
    let (status, body) = env.post_empty("/clusters/pt/restart").await;
    assert_eq!(status, reqwest::StatusCode::ACCEPTED, "restart: {body}");
    let op = body["operation"]["id"].as_str().expect("operation id").to_string();

    let (mut unknown_at, mut down_at) = (None, None);
    while down_at.is_none() {
        let elapsed = cut_at.elapsed();
        assert!(elapsed < down_after + Duration::from_secs(5), "node-p not Down {elapsed:?} after the cut");
        match node_status(&env, "node-p").await.as_str() {
            "Ready" => assert!(unknown_at.is_none(), "node-p back to Ready while still cut off"),
            "Unknown" => {
                unknown_at.get_or_insert(elapsed);
            }
            "Down" => down_at = Some(elapsed),
            s => panic!("node-p {s} during the partition"),
        }
        assert_eq!(node_status(&env, "node-1").await, "Ready", "another node during the partition");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (unknown_at, down_at) = (unknown_at.expect("Unknown before Down"), down_at.unwrap());
    assert!(unknown_at >= Duration::from_millis(3500), "Unknown too early: {unknown_at:?}");
    assert!(down_at >= down_after - Duration::from_millis(2500), "Down too early: {down_at:?}");

    let lost = env
        .until(5, "pt's instances Lost", async || {
            let c = env.cluster("pt").await;
            let all = all_instances(&c);
            if all.iter().all(|i| i["status"] == "Lost") { Ok(c) } else { Err(c.to_string()) }
        })
        .await;
    for i in all_instances(&lost) {
        let why = i["last_error"].as_str().unwrap_or_default();
        // Marked Lost by the node's Down, or by the restart's stop that
        // the link's close failed (whichever came first): both say why.
        let said = why.contains("node node-p is down") || why.contains("node node-p is not connected");
        assert!(said, "why Lost: {i}");
        // Unknown to the master, still alive there: nothing stopped it,
        // nothing started a second copy.
        let old = before.iter().find(|b| id_of(b) == id_of(&i)).unwrap();
        assert_eq!(instance_pids(&id_of(&i)), vec![pid_of(old)], "the process runs on in the partition");
    }
    let op = env.wait_op(&op).await;
    assert_ne!(op["status"], "Succeeded", "a restart on a node cut off cannot have succeeded: {op:#}");
    let pt = env.cluster("pt").await;
    assert_eq!(pt["status"], "Error", "{pt:#}");
    assert!(pt["status_description"].as_str().is_some_and(|d| !d.is_empty()), "{pt:#}");
    let other = one_copy_each(&env, "other").await;
    assert_eq!(pid_of(&other[0]), pid_of(&other_before[0]), "the other node's instance untouched");

    ns.heal();
    let healed = Instant::now();
    env.until(30, "node-p Ready after the heal", async || {
        let s = node_status(&env, "node-p").await;
        if s == "Ready" { Ok(()) } else { Err(s) }
    })
    .await;
    env.until(10, "pt's instances reported again", async || {
        let c = env.cluster("pt").await;
        if all_instances(&c).iter().all(|i| i["status"] == "Running") { Ok(()) } else { Err(c.to_string()) }
    })
    .await;
    eprintln!(
        "partition: Unknown after {unknown_at:?}, Down after {down_at:?}, Ready {:?} after the heal",
        healed.elapsed()
    );
    let after = one_copy_each(&env, "pt").await;
    for (b, a) in before.iter().zip(&after) {
        // The restart reached the agent after the heal (then it ran once,
        // and the master shows the new process) or never did.
        let starts = started_at(a).len();
        if pid_of(a) == pid_of(b) {
            assert_eq!(starts, 1, "not restarted, started once: {a}");
        } else {
            assert_eq!(starts, 2, "restarted once, no more: {a}");
        }
    }
    // The operator puts the cluster back: nothing is started again.
    let op = env.run_op("/clusters/pt/start", None).await;
    assert_eq!(op["status"], "Succeeded", "{op:#}");
    assert_eq!(env.cluster("pt").await["status"], "Active");
    let again = one_copy_each(&env, "pt").await;
    for (a, b) in after.iter().zip(&again) {
        assert_eq!(pid_of(a), pid_of(b), "a start of a running instance starts nothing");
        assert_eq!(started_at(a).len(), started_at(b).len());
    }

    assert!(agent.stop(), "the agent stops on SIGTERM");
    for i in &again {
        assert!(instance_pids(&id_of(i)).is_empty(), "{} still runs after its agent stopped", id_of(i));
    }
}
