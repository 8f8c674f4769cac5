//! Agents that misbehave on the wire, simulated in the test process: one
//! that stops reading its socket in the middle of an install (its
//! operation must end, saying so, instead of hanging), and one whose
//! connection went half-open while it dialed again (the new connection
//! must take over, the old one be closed).

use std::io::Read;
use std::sync::Arc;
use std::time::{Duration, Instant};

use flotilla::bench::sim::{Latency, SimAgent, address};
use flotilla::ids::InstanceId;
use serde_json::{Value, json};

use crate::common::sim::{self, CLOSE_WAIT, ESTABLISHED, tcp_to};
use crate::common::{TestEnv, all_instances, id_of};

/// `n` bytes from the kernel's random source: a package gzip cannot shrink.
fn random_bytes(n: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(n as usize);
    std::fs::File::open("/dev/urandom").expect("/dev/urandom").take(n).read_to_end(&mut out).expect("read random");
    out
}

/// Whether the node is connected and Ready, as `GET /nodes/{id}` says.
fn ready(node: &Value) -> bool {
    node["connected"] == true && node["status"] == "Ready"
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_stops_reading_mid_install_fails_the_operation_and_is_dropped() {
    // The master's send deadline (`agent_send_timeout`), and how much later
    // than it the link may be seen closed on a busy machine.
    const SEND_TIMEOUT: Duration = Duration::from_secs(1);
    const MARGIN: Duration = Duration::from_secs(2);
    let env = TestEnv::start_sim("stall", &[("FLOTILLA_MASTER_AGENT_SEND_TIMEOUT", "1s")], 1).await;
    let agent = env.fleet().agents[0].clone();
    env.upload(&sim::package("big", "1.0.0", 3)).await;
    let body = json!({"name": "st", "package": {"name": "big", "version": "1.0.0"}, "roles": {"d": {"count": 1}}});
    env.create_active(body).await;
    // Version 2 carries 24 MiB of incompressible bytes: more than the
    // socket buffers on both sides hold, so its chunks must block.
    let v2 = sim::package("big", "2.0.0", 3).file("lib/blob.bin", 0o644, random_bytes(24 << 20));
    let sha = env.upload(&v2).await["sha256"].as_str().expect("sha256").to_string();

    agent.stall_at_next_install();
    let started = Instant::now();
    // Beside the upgrade: when the agent stopped reading (its switch, looked
    // at every millisecond), then when `GET /nodes/sim-1` first showed its
    // link closed (asked every 20 ms).
    let watch = async {
        let limit = Instant::now() + Duration::from_secs(30);
        while !agent.faults.stalled.load(std::sync::atomic::Ordering::SeqCst) {
            assert!(Instant::now() < limit, "the agent did not stop reading within 30 s\n{}", env.log_tails());
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let stalled = Instant::now();
        loop {
            let n = env.node("sim-1").await;
            if n["connected"] == false {
                break (stalled, Instant::now());
            }
            assert!(Instant::now() < limit, "the stalled sim-1 still connected after 30 s: {n:#}\n{}", env.log_tails());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let upgrade = async {
        let (status, resp) = env.post("/clusters/st/upgrade", json!({"version": "2.0.0"})).await;
        assert_eq!(status, reqwest::StatusCode::ACCEPTED, "{resp:#}");
        let id = resp["operation"]["id"].as_str().unwrap().to_string();
        let op = env
            .until(30, "the upgrade to a stalled agent ends", async || {
                let (_, body) = env.get(&format!("/operations/{id}?wait=5")).await;
                let op = &body["operation"];
                if ["Failed", "RolledBack"].iter().any(|s| op["status"] == *s) {
                    Ok(op.clone())
                } else {
                    Err(format!("{op:#}"))
                }
            })
            .await;
        (op, Instant::now())
    };
    let ((stalled_at, closed_at), (op, ended_at)) = tokio::join!(watch, upgrade);
    let took = started.elapsed();
    // The master closed the link once nothing could be sent for its send
    // deadline: not before it, and not much after.
    let closed_after = closed_at - stalled_at;
    assert!(
        closed_after >= SEND_TIMEOUT / 2 && closed_after <= SEND_TIMEOUT + MARGIN,
        "the link was seen closed {closed_after:?} after the agent stopped reading; the send deadline is \
         {SEND_TIMEOUT:?} (allowed: {:?} to {:?})\n{}",
        SEND_TIMEOUT / 2,
        SEND_TIMEOUT + MARGIN,
        env.master_log()
    );
    // Every request waiting on the closed link failed at once: so did the
    // operation (its reason is checked below).
    let ended_after = ended_at - stalled_at;
    assert!(
        ended_after <= SEND_TIMEOUT + MARGIN,
        "the upgrade ended {ended_after:?} after the agent stopped reading; the send deadline is {SEND_TIMEOUT:?}: {op:#}"
    );
    assert!(agent.faults.stalled.load(std::sync::atomic::Ordering::Relaxed), "the agent never stalled");
    let error = op["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("sim-1") && error.contains("stopped reading"),
        "the operation's error does not say that node sim-1 stopped reading: {op:#}"
    );
    env.until(10, "GET /nodes shows sim-1 not connected", async || {
        let n = env.node("sim-1").await;
        if n["connected"] == false { Ok(()) } else { Err(format!("{n:#}")) }
    })
    .await;

    // Reading again, the agent finds its connection closed and dials again.
    agent.set_stalled(false);
    env.until(30, "sim-1 connected and Ready again", async || {
        let n = env.node("sim-1").await;
        if ready(&n) { Ok(()) } else { Err(format!("{n:#}")) }
    })
    .await;
    // The cluster works again, and the package now crosses the new link.
    let c = env.cluster("st").await;
    if c["status"] != "Active" {
        env.run_ok("/clusters/st/start", None).await;
    }
    let c = env.cluster("st").await;
    if c["package"]["version"] == "2.0.0" {
        env.run_ok("/clusters/st/restart", None).await;
    } else {
        env.run_ok("/clusters/st/upgrade", Some(json!({"version": "2.0.0"}))).await;
    }
    let c = env.cluster("st").await;
    assert_eq!((&c["status"], &c["package"]["version"]), (&json!("Active"), &json!("2.0.0")), "{c:#}");
    assert!(all_instances(&c).iter().all(|i| i["status"] == "Running"), "{c:#}");
    assert!(agent.state.lock().unwrap().packages.contains(&sha), "the agent never received version 2 in full");
    eprintln!(
        "stall: the link closed {closed_after:?} after the agent stopped reading; the stalled upgrade ended {} \
         {:?} after it ({took:?} after the request): {error}",
        op["status"], ended_after
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_dials_again_replaces_its_half_open_connection() {
    let env = TestEnv::start_sim("halfopen", &[], 1).await;
    let old = env.fleet().agents[0].clone();
    env.upload(&sim::package("svc", "1.0.0", 5)).await;
    let body = json!({"name": "ho", "package": {"name": "svc", "version": "1.0.0"}, "roles": {"d": {"count": 3}}});
    let before = all_instances(&env.create_active(body).await);
    let port = env.agent_socket().port();
    // Only the link: the enrollment's connection may linger in TIME_WAIT.
    let conns: Vec<_> = tcp_to(port).into_iter().filter(|&(_, s)| s == ESTABLISHED).collect();
    let [(old_port, ESTABLISHED)] = conns[..] else { panic!("one connection from the agent expected: {conns:?}") };

    // The link goes half-open: the old connection neither reads nor
    // writes, and stays open. The same agent (same node id, same state)
    // dials again, as after a network partition.
    old.set_frozen(true);
    let new = SimAgent::new(old.node.clone(), address(0), old.port_range, Latency::default());
    {
        let held = old.state.lock().unwrap();
        let mut s = new.state.lock().unwrap();
        s.instances = held.instances.clone();
        s.packages = held.packages.clone();
    }
    new.adopt_credentials(&old);
    let (_stop, stop_rx) = tokio::sync::watch::channel(false);
    let master = flotilla::agent::masters::Masters::one(env.agent_socket());
    tokio::spawn(Arc::clone(&new).serve(master, env.join_token.as_str().into(), stop_rx));

    env.until(15, "the new connection accepted, the old one closed by the master", async || {
        let n = env.node("sim-1").await;
        let conns = tcp_to(port);
        let old_closed = conns.iter().any(|&(p, s)| p == old_port && s == CLOSE_WAIT);
        let new_open = conns.iter().any(|&(p, s)| p != old_port && s == ESTABLISHED);
        if ready(&n) && new.connected.load(std::sync::atomic::Ordering::Relaxed) && old_closed && new_open {
            Ok(())
        } else {
            Err(format!("node {n:#}; sockets to the master (local port, state): {conns:?}, old port {old_port}"))
        }
    })
    .await;
    assert!(before.iter().all(|i| i["status"] == "Running"), "{before:#?}");
    let c = env.cluster("ho").await;
    assert_eq!(c["status"], "Active", "the reconnect changed the cluster: {c:#}");

    // A new operation reaches the instances through the new connection only.
    let generation = |a: &SimAgent, id: &str| a.state.lock().unwrap().instances[&InstanceId::new(id)].generation;
    let old_gens: Vec<u64> = before.iter().map(|i| generation(&old, &id_of(i))).collect();
    env.run_ok("/clusters/ho/restart", None).await;
    let after = all_instances(&env.cluster("ho").await);
    for (i, old_gen) in after.iter().zip(old_gens) {
        let id = id_of(i);
        let held = new.state.lock().unwrap().instances[&InstanceId::new(&id)].clone();
        assert_eq!(i["status"], "Running", "{i:#}");
        assert_eq!(i["pid"].as_u64(), held.pid.map(u64::from), "{id}: the API's pid is not the new agent's");
        assert_eq!(i["generation"].as_u64(), Some(held.generation), "{id}: the new agent did not get the restart");
        assert!(held.generation > old_gen, "{id}: the restart did not reach the new agent");
        assert_eq!(generation(&old, &id), old_gen, "{id}: the half-open connection got a command");
    }
}

/// An agent that goes silent (stops reading and writing, its socket left
/// open, as on a host that froze): the master closes its link once the
/// node is judged Down (`node_down_after`, here 5 s), and the agent is
/// admitted again when it comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_master_closes_a_link_that_goes_silent() {
    let master_env = [
        ("FLOTILLA_MASTER_HEARTBEAT_INTERVAL", "500ms"),
        ("FLOTILLA_MASTER_NODE_UNKNOWN_AFTER", "2s"),
        ("FLOTILLA_MASTER_NODE_DOWN_AFTER", "5s"),
    ];
    let env = TestEnv::start_sim("silent", &master_env, 1).await;
    let agent = env.fleet().agents[0].clone();
    let port = env.agent_socket().port();
    agent.set_frozen(true);
    let frozen_at = Instant::now();
    env.until(25, "the master closed the silent link", async || {
        let n = env.node("sim-1").await;
        let conns = tcp_to(port);
        if n["connected"] == false && conns.iter().any(|&(_, s)| s == CLOSE_WAIT) {
            Ok(())
        } else {
            Err(format!("node {n:#}; sockets to the master: {conns:?}"))
        }
    })
    .await;
    let took = frozen_at.elapsed();
    // Closed when the node is judged Down (`node_down_after`), not before.
    assert!(took.as_secs_f64() >= 4.5 && took.as_secs_f64() < 10.0, "closed after {took:?}; the limit is 5 s");
    assert!(env.master_log().contains("no frame from the agent within the idle limit"), "{}", env.master_log());
    agent.set_frozen(false);
    env.wait_ready().await;
}

/// An install has no fixed deadline: to an agent that reads in bursts
/// (stalls shorter than the send deadline), an install that outlasts the
/// reply deadline twice over succeeds, because its bytes keep moving. That
/// includes the megabytes still in the socket buffers when the master has
/// queued `InstallEnd`: the deadline for the result counts from the
/// agent's last `InstallReceived` (without it this failed under load with
/// "did not answer InstallEnd within 1s").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_install_slower_than_the_reply_deadline_succeeds_while_its_bytes_move() {
    const REPLY_TIMEOUT: Duration = Duration::from_secs(1);
    let master = [("FLOTILLA_MASTER_AGENT_REPLY_TIMEOUT", "1s"), ("FLOTILLA_MASTER_AGENT_SEND_TIMEOUT", "3s")];
    let env = TestEnv::start_sim("slowinstall", &master, 1).await;
    let agent = env.fleet().agents[0].clone();
    let pkg = sim::package("slow", "1.0.0", 3).file("lib/blob.bin", 0o644, random_bytes(64 << 20));
    let sha = env.upload(&pkg).await["sha256"].as_str().expect("sha256").to_string();

    // The agent reads for 10 ms, then not for 400 ms, until the create ends.
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let pulse = {
        let (agent, done) = (agent.clone(), done.clone());
        tokio::spawn(async move {
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                agent.set_stalled(false);
                tokio::time::sleep(Duration::from_millis(10)).await;
                agent.set_stalled(true);
                tokio::time::sleep(Duration::from_millis(400)).await;
            }
            agent.set_stalled(false);
        })
    };
    let started = Instant::now();
    let body = json!({"name": "sl", "package": {"name": "slow", "version": "1.0.0"}, "roles": {"d": {"count": 1}}});
    let op = env.create_cluster(body).await;
    let op = env.wait_op(op["id"].as_str().expect("op id")).await;
    let took = started.elapsed();
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    pulse.await.expect("pulse");
    env.assert_succeeded(&op);
    assert!(
        took > REPLY_TIMEOUT * 2,
        "the create took {took:?}: the agent's pauses did not slow the install past the reply deadline \
         ({REPLY_TIMEOUT:?}), so this shows nothing"
    );
    assert!(agent.state.lock().unwrap().packages.contains(&sha), "the agent does not have the package in full");
    // A link closed mid-install would have failed the create (its
    // requests fail at once), so its success says the link held.
    let after = env.node("sim-1").await;
    assert!(ready(&after), "{after:#}");
    eprintln!("slow install: the create took {took:?} against a reply deadline of {REPLY_TIMEOUT:?}");
}
