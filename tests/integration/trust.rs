//! The agent link's trust, on a real master and real agents: agents enroll
//! with a join token and connect with the certificate they keep; the
//! master knows a node by its certificate, refuses what it did not issue
//! (or revoked), and checks every `Hello`.

use std::os::unix::fs::PermissionsExt;
use std::process::Child;
use std::time::{Duration, Instant};

use flotilla::ids::NodeId;
use flotilla::protocol::codec::{AgentCodec, ProtocolError};
use flotilla::protocol::handshake::agent_handshake;
use flotilla::protocol::messages::{Hello, PROTOCOL_VERSION};
use flotilla::protocol::tls;
use flotilla::protocol::tls::credentials::Credentials;
use flotilla::protocol::tls::join_token::JoinToken;
use serde_json::Value;
use tokio_util::codec::Framed;

use crate::common::env::TestEnv;

/// Waits up to `within` for `child` to exit; its log then.
fn exits_saying(child: &mut Child, log: &std::path::Path, within: Duration, wanted: &str) -> String {
    let deadline = Instant::now() + within;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            assert!(!status.success(), "the agent exited 0; log:\n{text}");
            assert!(text.contains(wanted), "the agent's log does not say {wanted:?}:\n{text}");
            return text;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the agent still runs after {within:?}; log:\n{}", std::fs::read_to_string(log).unwrap_or_default());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

async fn node(env: &TestEnv, id: &str) -> Value {
    let v: Value = env.client.get(format!("{}/nodes/{id}", env.api)).send().await.unwrap().json().await.unwrap();
    if v["node"].is_object() { v["node"].clone() } else { v }
}

/// Connects to the master with `credentials` and sends `hello`: the
/// master's answer.
async fn hello_with(env: &TestEnv, credentials: &Credentials, hello: Hello) -> Result<(), ProtocolError> {
    let tcp = tokio::net::TcpStream::connect(env.agent_socket()).await?;
    let stream = tls::connect(credentials.client_config().unwrap(), tcp, Duration::from_secs(5)).await?;
    let mut framed = Framed::new(stream, AgentCodec::default());
    agent_handshake(&mut framed, hello, Duration::from_secs(5)).await.map(|_| ())
}

fn hello(node: &str) -> Hello {
    Hello {
        protocol_version: PROTOCOL_VERSION,
        node_id: NodeId::new(node),
        address: "127.0.0.1".into(),
        instance_root: "/tmp/nowhere".into(),
        port_range: (40000, 40010),
        labels: Default::default(),
        agent_version: "test".into(),
        cgroups: false,
        resource_limits: false,
        inventory: vec![],
        unrecorded: vec![],
        simulated: false,
    }
}

fn refused(result: Result<(), ProtocolError>, wanted: &str) {
    match result {
        Err(ProtocolError::Refused { reason }) => assert!(reason.contains(wanted), "refused, but saying {reason:?}"),
        other => panic!("expected a refusal saying {wanted:?}, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_enroll_once_and_the_master_knows_them_by_their_certificate() {
    let mut env = TestEnv::start("trust").await;

    // Each agent keeps its key (0600, in a 0700 dir) and the certificate
    // the master lists for its node.
    for i in 1..=3 {
        let dir = env.agent_dir(i).join("tls");
        let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&dir), 0o700, "{}", dir.display());
        assert_eq!(mode(&dir.join("node.key")), 0o600);
        let kept = Credentials::load(&env.agent_dir(i)).unwrap().expect("credentials kept");
        assert_eq!(kept.node_id.as_str(), format!("node-{i}"));
        let n = node(&env, &format!("node-{i}")).await;
        assert_eq!(n["certificate"]["fingerprint"], hex::encode(kept.fingerprint()), "{n:#}");
        assert!(n["certificate"]["revoked_at"].is_null());
    }

    // A restart (kill -9, same command line) connects with the kept
    // certificate: no second enrollment, the token's uses untouched.
    let before = node(&env, "node-1").await["certificate"]["fingerprint"].clone();
    let tokens: Value = env.client.get(format!("{}/join-tokens", env.api)).send().await.unwrap().json().await.unwrap();
    let uses_before = tokens["join_tokens"][0]["uses_left"].clone();
    env.kill_agent(1);
    env.restart_agent(1).await;
    assert_eq!(node(&env, "node-1").await["certificate"]["fingerprint"], before);
    let tokens: Value = env.client.get(format!("{}/join-tokens", env.api)).send().await.unwrap().json().await.unwrap();
    assert_eq!(tokens["join_tokens"][0]["uses_left"], uses_before, "{tokens:#}");
    assert!(!tokens.to_string().contains(&env.join_token), "a list shows a token's secret");

    // No certificate: only an enrollment is heard; a Hello is refused.
    let token: JoinToken = env.join_token.parse().unwrap();
    let tcp = tokio::net::TcpStream::connect(env.agent_socket()).await.unwrap();
    let stream = tls::connect(tls::enroll_config(token.ca).unwrap(), tcp, Duration::from_secs(5)).await.unwrap();
    let mut framed = Framed::new(stream, AgentCodec::default());
    refused(agent_handshake(&mut framed, hello("node-9"), Duration::from_secs(5)).await.map(|_| ()), "no certificate");

    // Plain TCP (no TLS at all) gets nowhere.
    let tcp = tokio::net::TcpStream::connect(env.agent_socket()).await.unwrap();
    let mut framed = Framed::new(Box::new(tcp) as flotilla::protocol::handshake::LinkStream, AgentCodec::default());
    assert!(agent_handshake(&mut framed, hello("node-9"), Duration::from_secs(5)).await.is_err());

    // node-2's certificate cannot speak for node-1, and its Hello is checked.
    let node2 = Credentials::load(&env.agent_dir(2)).unwrap().unwrap();
    refused(hello_with(&env, &node2, hello("node-1")).await, "this certificate is node node-2's, not node-1");
    let mut bad = hello("node-2");
    bad.address = "node-2.example.com".into();
    refused(hello_with(&env, &node2, bad).await, "is not an IP address");
    let mut bad = hello("node-2");
    bad.instance_root = "../../etc".into();
    refused(hello_with(&env, &node2, bad).await, "must be absolute");
    assert_eq!(node(&env, "node-2").await["connected"], true, "a refused Hello took the real link down");

    // A certificate from another CA is refused in the TLS handshake.
    let stranger = flotilla::protocol::tls::testkit::TestAuthority::new().unwrap();
    let other = flotilla::agent::enroll::request(
        &NodeId::new("node-1"),
        &stranger.join_token(),
        flotilla::protocol::tls::credentials::NewKey::generate().unwrap(),
        flotilla::agent::masters::Masters::one(env.agent_socket()),
        "127.0.0.1",
        Duration::from_secs(2),
        Duration::from_millis(100),
    )
    .await;
    assert!(
        matches!(other, Err(flotilla::agent::enroll::EnrollError::WrongMaster { .. })),
        "a token pinning another CA enrolled: {other:?}"
    );

    // Join tokens: a bad one, a used one, one for a node already enrolled.
    let (mut child, log) = env.spawn_extra_agent("garbage", "node-7", Some("flj_nope"));
    exits_saying(&mut child, &log, Duration::from_secs(20), "not a join token");
    let (mut child, log) = env.spawn_extra_agent("none", "node-7", None);
    exits_saying(&mut child, &log, Duration::from_secs(20), "not enrolled");
    let wrong = JoinToken { secret: "f".repeat(32), ..token.clone() }.to_string();
    let (mut child, log) = env.spawn_extra_agent("wrong", "node-7", Some(&wrong));
    exits_saying(&mut child, &log, Duration::from_secs(20), "unknown join token");
    let once = env.make_join_token(1).await;
    let (mut first, _) = env.spawn_extra_agent("once-a", "node-4", Some(&once));
    env.until(20, "node-4 enrolled and connected", async || {
        let n = node(&env, "node-4").await;
        if n["connected"] == true { Ok(()) } else { Err(format!("{n:#}")) }
    })
    .await;
    let (mut child, log) = env.spawn_extra_agent("once-b", "node-5", Some(&once));
    exits_saying(&mut child, &log, Duration::from_secs(20), "unknown join token");
    let fresh = env.make_join_token(1).await;
    let (mut child, log) = env.spawn_extra_agent("twin", "node-4", Some(&fresh));
    exits_saying(&mut child, &log, Duration::from_secs(20), "node node-4 is enrolled already");
    let _ = first.kill();
    let _ = first.wait();

    // A token bound to a node: shown with it, and refused to another node
    // id without spending its use.
    let body = serde_json::json!({ "name": "bound", "node": "node-6" });
    let resp = env.client.post(format!("{}/join-tokens", env.api)).json(&body).send().await.unwrap();
    assert_eq!(resp.status(), 201);
    let made: Value = resp.json().await.unwrap();
    assert_eq!(made["token"]["node"], "node-6", "{made:#}");
    let bound_id = made["token"]["id"].as_str().unwrap().to_string();
    let (mut child, log) = env.spawn_extra_agent("unbound", "node-5", Some(made["secret"].as_str().unwrap()));
    exits_saying(&mut child, &log, Duration::from_secs(20), "is bound to node node-6, not node-5");
    let tokens: Value = env.client.get(format!("{}/join-tokens", env.api)).send().await.unwrap().json().await.unwrap();
    let listed = tokens["join_tokens"].as_array().unwrap();
    let bound = listed.iter().find(|t| t["id"] == bound_id.as_str()).expect("the bound token is listed");
    assert_eq!((&bound["node"], &bound["uses_left"]), (&Value::from("node-6"), &Value::from(1)), "{tokens:#}");
    assert!(listed.iter().filter(|t| t["id"] != bound_id.as_str()).all(|t| t["node"].is_null()), "{tokens:#}");

    // Revoked: the link closes at once and stays closed.
    let resp = env.client.post(format!("{}/nodes/node-3/revoke", env.api)).send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["disconnected"], true, "{v:#}");
    let revoked_at = Instant::now();
    env.until(5, "node-3 disconnected", async || {
        let n = node(&env, "node-3").await;
        if n["connected"] == false { Ok(()) } else { Err(format!("{n:#}")) }
    })
    .await;
    assert!(
        revoked_at.elapsed() < Duration::from_secs(3),
        "the link outlived the revocation by {:?}",
        revoked_at.elapsed()
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    let n = node(&env, "node-3").await;
    assert_eq!(n["connected"], false, "a revoked node connected again: {n:#}");
    assert!(n["certificate"]["revoked_at"].is_string(), "{n:#}");
    assert!(env.agent_log(3).contains("was revoked"), "the agent's log does not say why:\n{}", env.agent_log(3));

    // Enrolled again (its old credentials removed, a new token): back.
    env.kill_agent(3);
    std::fs::remove_dir_all(env.agent_dir(3).join("tls")).unwrap();
    env.join_token = env.make_join_token(1).await;
    env.restart_agent(3).await;
    let n = node(&env, "node-3").await;
    assert!(n["certificate"]["revoked_at"].is_null(), "{n:#}");
    assert_ne!(n["certificate"]["fingerprint"], v["revoked"]["fingerprint"]);
    // The CA's key is the master's alone.
    let ca_key = env.master_dir().join("ca/ca.key");
    assert_eq!(std::fs::metadata(&ca_key).unwrap().permissions().mode() & 0o777, 0o600);
    assert_eq!(std::fs::metadata(env.master_dir().join("ca")).unwrap().permissions().mode() & 0o777, 0o700);
}

/// One host trickling handshakes (connections that never send a byte, as
/// a slowloris does) holds at most `max_agent_handshakes_per_source` of
/// the handshake slots: an agent from another address is admitted at
/// once, not after the silent ones time out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_trickling_handshakes_cannot_keep_other_agents_out() {
    let master_env = [
        ("FLOTILLA_MASTER_MAX_AGENT_HANDSHAKES", "8"),
        ("FLOTILLA_MASTER_MAX_AGENT_HANDSHAKES_PER_SOURCE", "4"),
        ("FLOTILLA_MASTER_HANDSHAKE_TIMEOUT", "60s"),
    ];
    let env = TestEnv::start_with("slowloris", &master_env).await;
    // From 127.0.0.1; the agents of this env dial from 127.0.K.1x.
    let silent: Vec<std::net::TcpStream> =
        (0..40).map(|_| std::net::TcpStream::connect(env.agent_socket()).expect("connect")).collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let token = env.make_join_token(1).await;
    let asked = Instant::now();
    // Killed however the test ends (a failed assertion included).
    struct Killed(Child);
    impl Drop for Killed {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _agent = Killed(env.spawn_extra_agent("late", "node-9", Some(&token)).0);
    env.until(15, "node-9 admitted beside 40 silent connections", async || {
        let n = node(&env, "node-9").await;
        if n["connected"] == true { Ok(()) } else { Err(format!("{n:#}")) }
    })
    .await;
    // Without the cap the silent ones would hold all 8 slots for 60 s.
    assert!(asked.elapsed() < Duration::from_secs(15), "admitted after {:?}", asked.elapsed());
    let log = env.master_log();
    assert!(log.contains("max_agent_handshakes_per_source (4) connections being admitted already"), "{log}");
    drop(silent);
}
