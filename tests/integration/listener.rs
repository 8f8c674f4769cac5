//! The agent listener under a flood, on a real master: idle sockets and
//! half-done TLS handshakes from several addresses and /24s cannot keep an
//! enrolled agent out; a connection without a ClientHello is closed after
//! `first_bytes_timeout`; one /24 holds at most
//! `max_agent_handshakes_per_subnet` connections being admitted.
//!
//! The flood dials from loopback addresses of its own (all of 127/8 is
//! local), bound before `connect`, in /24s none of the env's agents use.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use flotilla::protocol::tls;
use flotilla::protocol::tls::join_token::JoinToken;
use serde_json::Value;

use crate::common::TestEnv;

/// A TCP connection to `to` from `from` (a loopback address), or why not.
fn connect_from(from: &str, to: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
    let ip: std::net::IpAddr = from.parse().map_err(|e| std::io::Error::new(ErrorKind::InvalidInput, e))?;
    socket.bind(&SocketAddr::new(ip, 0).into())?;
    socket.connect(&to.into())?;
    Ok(socket.into())
}

/// Whether the master has closed `s` (EOF or reset) within `within`;
/// false when it is still open then. Bytes the master sent are skipped.
fn closed_within(mut s: &TcpStream, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    let mut buf = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        s.set_read_timeout(Some(left)).expect("read timeout");
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => return false,
            Err(e) if matches!(e.kind(), ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted) => return true,
            Err(e) => panic!("reading from the master: {e}"),
        }
    }
}

/// The bytes of a real TLS ClientHello to this master (no certificate
/// claimed, as an attacker's or an enrolling agent's).
fn client_hello(env: &TestEnv) -> Vec<u8> {
    let token: JoinToken = env.join_token.parse().expect("join token");
    let config = tls::enroll_config(token.ca).expect("enrollment TLS config");
    let mut conn = rustls::ClientConnection::new(config, tls::master_name()).expect("a TLS client");
    let mut out = Vec::new();
    while conn.wants_write() {
        conn.write_tls(&mut out).expect("ClientHello bytes");
    }
    assert_eq!(out.first(), Some(&0x16), "a TLS handshake record");
    out
}

/// The env's agents' /24 (`127.0.K.0`): the flood keeps out of it.
fn agents_octet(env: &TestEnv) -> u16 {
    env.agent_ips[0].split('.').nth(2).and_then(|o| o.parse().ok()).expect("agent address 127.0.K.x")
}

/// Four third octets, none the agents'.
fn flood_octets(env: &TestEnv) -> [u16; 4] {
    let k = agents_octet(env);
    [1, 2, 3, 4].map(|i| (k + 50 * i) % 250 + 1)
}

/// 6 addresses (three in one /24, three in /24s of their own) × 64
/// connections, each sent `first` (nothing when empty). Connections the
/// master refused at once (the /24 of three is over its cap) are counted
/// as such, and kept all the same (they are closed).
fn flood(env: &TestEnv, first: &[u8]) -> (Vec<TcpStream>, usize) {
    let [a, b, c, d] = flood_octets(env);
    let sources = [
        format!("127.0.{a}.1"),
        format!("127.0.{a}.2"),
        format!("127.0.{a}.3"),
        format!("127.0.{b}.1"),
        format!("127.0.{c}.1"),
        format!("127.0.{d}.1"),
    ];
    let mut all = Vec::new();
    for from in &sources {
        for _ in 0..64 {
            let mut s = connect_from(from, env.agent_socket()).unwrap_or_else(|e| panic!("connect from {from}: {e}"));
            if !first.is_empty() {
                // A refused one may be reset already: that is its answer.
                let _ = s.write_all(first);
            }
            all.push(s);
        }
    }
    // Give the accept loop time to take (or refuse) every one.
    std::thread::sleep(Duration::from_millis(500));
    let refused = all.iter().filter(|s| closed_within(s, Duration::from_millis(1))).count();
    (all, refused)
}

async fn node(env: &TestEnv, id: &str) -> Value {
    let v: Value = env.client.get(format!("{}/nodes/{id}", env.api)).send().await.unwrap().json().await.unwrap();
    if v["node"].is_object() { v["node"].clone() } else { v }
}

/// Kills agent `i`, waits until the master has seen its link go, starts
/// it again: how long until it is connected and `Ready`.
async fn reconnect(env: &mut TestEnv, i: usize) -> Duration {
    let id = format!("node-{i}");
    env.kill_agent(i);
    env.until(15, &format!("{id} disconnected"), async || {
        let n = node(env, &id).await;
        if n["connected"] == false { Ok(()) } else { Err(format!("{n:#}")) }
    })
    .await;
    let asked = Instant::now();
    env.restart_agent(i).await;
    asked.elapsed()
}

/// The figure: 6 addresses × 64 connections, then an enrolled
/// agent reconnects and is `Ready` within 2 s. First idle sockets (held
/// here for the whole handshake deadline: `first_bytes_timeout` is set to
/// it, so this is not the 3 s deadline at work but the slots they never
/// get), then sockets that sent a ClientHello and went silent, which do
/// take every general handshake slot: the agent gets in through the room
/// kept for certificates of this master.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_and_half_open_floods_cannot_keep_an_enrolled_agent_out() {
    let master_env = [("FLOTILLA_MASTER_HANDSHAKE_TIMEOUT", "20s"), ("FLOTILLA_MASTER_FIRST_BYTES_TIMEOUT", "20s")];
    let mut env = TestEnv::start_with("listener-flood", &master_env).await;
    // How long a reconnect takes with no flood, for the message.
    let quiet = reconnect(&mut env, 3).await;

    let (idle, refused) = flood(&env, &[]);
    // 3 × 64 from one /24 against a cap of 128 per /24: 64 refused.
    assert_eq!(refused, 64, "connections refused at once out of 384 idle ones");
    let took = reconnect(&mut env, 1).await;
    eprintln!("reconnect: quiet {quiet:?}, beside the idle flood {took:?}");
    let still_open = idle.iter().filter(|s| !closed_within(s, Duration::from_millis(1))).count();
    assert!(
        took < Duration::from_secs(2),
        "Ready {took:?} after its restart beside 320 idle sockets (quiet: {quiet:?})"
    );
    assert_eq!(still_open, 320, "the idle flood was gone before the agent got in: this measured nothing");
    drop(idle);

    // Give the master time to see the idle ones go.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (half_open, refused) = flood(&env, &client_hello(&env));
    assert_eq!(refused, 64, "connections refused at once out of 384 half-open ones");
    let took = reconnect(&mut env, 2).await;
    eprintln!("reconnect: quiet {quiet:?}, beside the half-open flood {took:?}");
    let still_open = half_open.iter().filter(|s| !closed_within(s, Duration::from_millis(1))).count();
    assert!(
        took < Duration::from_secs(2),
        "Ready {took:?} after its restart beside 320 half-open TLS handshakes (quiet: {quiet:?})"
    );
    assert_eq!(still_open, 320, "the half-open flood was gone before the agent got in: this measured nothing");
    let log = env.master_log();
    assert!(log.contains("max_agent_handshakes_per_subnet (128)"), "the subnet refusals say why:\n{log}");
    drop(half_open);
}

/// A connection that sends nothing, or only part of a ClientHello, is
/// closed `first_bytes_timeout` after it was accepted, long before the
/// handshake's deadline; one that sends something else than TLS at once.
/// Each is counted by reason in the metrics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_without_a_client_hello_is_closed_after_the_first_bytes_deadline() {
    let master_env = [("FLOTILLA_MASTER_HANDSHAKE_TIMEOUT", "30s"), ("FLOTILLA_MASTER_FIRST_BYTES_TIMEOUT", "1s")];
    let env = TestEnv::start_sim("listener-first-bytes", &master_env, 1).await;
    let hello = client_hello(&env);
    let [a, ..] = flood_octets(&env);
    let from = format!("127.0.{a}.9");

    let opened = Instant::now();
    let silent = connect_from(&from, env.agent_socket()).unwrap();
    let mut partial = connect_from(&from, env.agent_socket()).unwrap();
    partial.write_all(&hello[..hello.len() / 2]).unwrap();
    let mut whole = connect_from(&from, env.agent_socket()).unwrap();
    whole.write_all(&hello).unwrap();
    assert!(!closed_within(&silent, Duration::from_millis(700)), "closed before the deadline");
    assert!(closed_within(&silent, Duration::from_secs(3)), "a silent connection still open 3.7 s in");
    assert!(closed_within(&partial, Duration::from_millis(500)), "half a ClientHello kept the connection");
    let took = opened.elapsed();
    assert!(took >= Duration::from_millis(900) && took < Duration::from_secs(4), "closed after {took:?}");
    // A whole ClientHello is past this deadline: its handshake goes on.
    assert!(
        !closed_within(&whole, Duration::from_millis(500)),
        "a whole ClientHello was cut at the first-bytes deadline"
    );

    let mut http = connect_from(&from, env.agent_socket()).unwrap();
    http.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    assert!(closed_within(&http, Duration::from_millis(500)), "a connection speaking HTTP is not closed at once");

    // Counted as each connection's task ends, just after its socket closed.
    let metrics = env.api.trim_end_matches("/api/v1").to_string() + "/metrics";
    env.until(5, "the refusals counted by reason", async || {
        let text = env.client.get(&metrics).send().await.map_err(|e| e.to_string())?.text().await.unwrap_or_default();
        let count = |reason: &str| {
            let wanted = format!("flotilla_agent_connections_refused_total{{reason=\"{reason}\"}} ");
            text.lines().find_map(|l| l.strip_prefix(wanted.as_str())).and_then(|v| v.trim().parse::<f64>().ok())
        };
        if count("no_client_hello") == Some(2.0) && count("not_tls") == Some(1.0) { Ok(()) } else { Err(text.clone()) }
    })
    .await;
    let log = env.master_log();
    assert!(log.contains("no TLS ClientHello within first_bytes_timeout (1s)"), "{log}");
}

/// One /24 holds at most `max_agent_handshakes_per_subnet` connections
/// being admitted, however many addresses it spreads them over; a
/// connection past it is closed at once, and another /24 is not held back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_subnet_holds_at_most_its_cap_of_connections_being_admitted() {
    let master_env = [
        ("FLOTILLA_MASTER_HANDSHAKE_TIMEOUT", "30s"),
        ("FLOTILLA_MASTER_FIRST_BYTES_TIMEOUT", "30s"),
        ("FLOTILLA_MASTER_MAX_AGENT_HANDSHAKES_PER_SUBNET", "8"),
    ];
    let env = TestEnv::start_sim("listener-subnet", &master_env, 1).await;
    let [a, b, ..] = flood_octets(&env);
    // 4 addresses × 4: under the per-address cap (64) each.
    let same: Vec<TcpStream> = (1..=4)
        .flat_map(|host| (0..4).map(move |_| format!("127.0.{a}.{host}")))
        .map(|from| connect_from(&from, env.agent_socket()).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let open = same.iter().filter(|s| !closed_within(s, Duration::from_millis(50))).count();
    assert_eq!(open, 8, "connections from one /24 left open (cap 8)");
    let other: Vec<TcpStream> =
        (0..4).map(|_| connect_from(&format!("127.0.{b}.1"), env.agent_socket()).unwrap()).collect();
    std::thread::sleep(Duration::from_millis(300));
    let open = other.iter().filter(|s| !closed_within(s, Duration::from_millis(50))).count();
    assert_eq!(open, 4, "another /24 was held back");
    let log = env.master_log();
    assert!(log.contains("max_agent_handshakes_per_subnet (8)"), "{log}");
}

/// A ClientHello that names a live certificate of this master takes a
/// reserved slot; a connection that then does not present that very
/// certificate is closed as soon as TLS ends, not at the handshake's
/// deadline, and counted as `claim_broken`: a replayed claim buys nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_not_backed_by_its_certificate_is_closed_when_tls_ends() {
    let master_env = [("FLOTILLA_MASTER_HANDSHAKE_TIMEOUT", "30s")];
    let env = TestEnv::start_sim("listener-claim", &master_env, 1).await;
    let sim: Value = node(&env, "sim-1").await;
    let hex_fp = sim["certificate"]["fingerprint"].as_str().unwrap_or_else(|| panic!("no fingerprint: {sim:#}"));
    let mut fp = [0u8; 32];
    hex::decode_to_slice(hex_fp, &mut fp).expect("a hex SHA-256");

    let token: JoinToken = env.join_token.parse().expect("join token");
    let mut config = (*tls::enroll_config(token.ca).expect("TLS config")).clone();
    config.alpn_protocols = vec![tls::certificate_claim(&fp)];
    let tcp = tokio::net::TcpStream::connect(env.agent_socket()).await.unwrap();
    let asked = Instant::now();
    let mut stream = tls::connect(std::sync::Arc::new(config), tcp, Duration::from_secs(5)).await.expect("TLS");
    let mut buf = [0u8; 64];
    let read = tokio::time::timeout(Duration::from_secs(5), tokio::io::AsyncReadExt::read(&mut stream, &mut buf)).await;
    assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "the connection was not closed: {read:?}");
    assert!(asked.elapsed() < Duration::from_secs(3), "closed after {:?}", asked.elapsed());
    env.until(5, "the broken claim logged", async || {
        let log = env.master_log();
        if log.contains(&format!("its ClientHello named certificate {hex_fp}, it presented none")) {
            Ok(())
        } else {
            Err(log)
        }
    })
    .await;
    assert_eq!(node(&env, "sim-1").await["connected"], true, "the real sim-1 lost its link");
}
