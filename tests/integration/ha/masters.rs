//! Real masters on real etcd members: a master keeps everything in etcd
//! (a kill -9 in the middle of a scale-out loses nothing and starts nothing
//! twice), a second master waits while one leads and takes over when it
//! dies, with every record, token and operation of the first.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common::etcd::EtcdCluster;
use crate::common::{TestEnv, env::client_with_token};

async fn health(client: &reqwest::Client, api: &str) -> Value {
    client.get(format!("{api}/health")).send().await.expect("health").json().await.expect("health json")
}

#[tokio::test]
async fn a_scale_out_cut_by_a_kill_9_of_the_master_on_etcd_is_resumed_by_the_next() {
    let etcd = EtcdCluster::start(3);
    let env = TestEnv::start_on_etcd("ha-resume", &etcd).await;
    let before = health(&env.client, &env.api).await;
    assert_eq!(before["store_engine"], "etcd", "{before:#}");
    assert_eq!(before["role"], "leader", "{before:#}");
    let first_term = before["term"].as_i64().expect("term");
    assert!(first_term > 0, "{before:#}");
    assert_eq!(before["pid"].as_u64(), Some(u64::from(env.master_pid())));

    // The next master waits for the dead one's lease (2 s) and leads in a
    // later term; its state is etcd's (nothing of it is in the data dir).
    let env = super::super::master_restart::interrupted_scale_out_is_resumed(env, true).await;
    let after = health(&env.client, &env.api).await;
    assert!(after["term"].as_i64().expect("term") > first_term, "before {before:#}\nafter {after:#}");
    assert!(!env.master_dir().join("db").exists(), "a master on etcd made a RocksDB store in its data dir");
}

#[tokio::test]
async fn a_second_master_waits_while_one_leads_and_takes_over_with_everything_when_it_dies() {
    let etcd = EtcdCluster::start(3);
    let mut env = TestEnv::start_on_etcd("ha-standby", &etcd).await;
    let (status, _) =
        env.post("/clusters", json!({"name": "kept", "package": {"name": "nope", "version": "1"}, "roles": {}})).await;
    assert_eq!(status, 404, "a cluster of an unknown package is refused");
    let (status, token) = env.post("/tokens", json!({"name": "ops", "scope": "read"})).await;
    assert_eq!(status, 201, "{token:#}");
    let (_, nodes_before) = env.get("/nodes").await;

    let (mut standby, dir) = env.spawn_other_master("standby");
    let waiting = crate::common::eventually(20, || env.log_file("standby.log").contains("another master leads")).await;
    assert!(waiting, "the standby never said it waits\n{}", env.log_file("standby.log"));
    assert!(!dir.join("endpoints.json").exists(), "the standby listens while another leads");
    assert!(standby.try_wait().unwrap().is_none(), "the standby exited");
    let serving =
        crate::common::eventually(20, || env.log_file("standby.log").contains("serves reads from its own view")).await;
    assert!(serving, "the standby never served reads as a follower\n{}", env.log_file("standby.log"));
    // Another installation's write on the same etcd: a revision that
    // brings the standby's watch no event, so the view it boots from is
    // checked against the store's keys (`verified: keys`), not trusted.
    etcd.ctl(&["put", "/another-installation/x", "1"]);

    let killed = Instant::now();
    env.kill_master();
    // Its process gone (its API port refuses connections), the standby
    // revokes its lease: it leads well before the lease (2 s) could expire.
    while !env.log_file("standby.log").contains("this master leads") {
        assert!(killed.elapsed() < Duration::from_secs(20), "no takeover\n{}", env.log_file("standby.log"));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let took = killed.elapsed();
    let log = env.log_file("standby.log");
    assert!(log.contains("revoking its lease"), "{log}");
    assert!(took < Duration::from_millis(1200), "the takeover took {took:?}");
    let endpoints = dir.join("endpoints.json");
    let mut api = None;
    while api.is_none() {
        if let Ok(bytes) = std::fs::read(&endpoints)
            && let Ok(v) = serde_json::from_slice::<Value>(&bytes)
        {
            api = v["api_url"].as_str().map(|a| format!("{a}/api/v1"));
        }
        assert!(
            killed.elapsed() < Duration::from_secs(20),
            "the standby did not take over within 20 s\n{}",
            env.log_file("standby.log")
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let api = api.unwrap();
    // The first master's token works on the second: tokens live in etcd.
    let h = health(&env.client, &api).await;
    assert_eq!(h["name"], "standby", "{h:#}");
    assert_eq!(h["role"], "leader", "{h:#}");
    assert_eq!(h["took_over"]["from"], "view", "{h:#}");
    assert_eq!(h["took_over"]["verified"], "keys", "{h:#}");
    assert!(h["store"]["sent_again"].is_u64(), "the etcd store counts transactions sent again: {h:#}");
    let nodes: Value = env.client.get(format!("{api}/nodes")).send().await.unwrap().json().await.unwrap();
    let ids = |v: &Value| {
        let mut ids: Vec<String> =
            v["nodes"].as_array().unwrap().iter().map(|n| n["id"].as_str().unwrap().to_string()).collect();
        ids.sort();
        ids
    };
    assert_eq!(ids(&nodes), ids(&nodes_before), "the nodes the first master knew");
    let reader = client_with_token(token["secret"].as_str().expect("the token"));
    let r = reader.get(format!("{api}/clusters")).send().await.unwrap();
    assert_eq!(r.status(), 200, "a token made on the first master");
    let _ = standby.kill();
    let _ = standby.wait();
}

/// A write as the API takes it: a new API token (one store commit).
async fn make_token(client: &reqwest::Client, api: &str, name: &str) -> (u16, Value) {
    let r = client.post(format!("{api}/tokens")).json(&json!({"name": name})).send().await.expect("POST /tokens");
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// The API tokens etcd holds under the env's prefix.
fn tokens_in_etcd(etcd: &EtcdCluster, name: &str) -> usize {
    etcd.ctl(&["get", "--prefix", "--keys-only", &format!("/{name}/tokens/")]).lines().filter(|l| !l.is_empty()).count()
}

#[tokio::test]
async fn with_one_etcd_member_lost_writes_go_on_with_two_they_are_refused_and_reads_served_until_it_heals() {
    let mut etcd = EtcdCluster::start(3);
    let mut env = TestEnv::start_on_etcd("ha-quorum", &etcd).await;
    let (_, nodes_before) = env.get("/nodes").await;

    etcd.kill(2);
    let (status, body) = make_token(&env.client, &env.api, "one-lost").await;
    assert_eq!(status, 201, "with two members of three a write is taken: {body:#}");

    etcd.kill(1);
    let refused = Instant::now();
    let (status, body) = make_token(&env.client, &env.api, "two-lost").await;
    assert_eq!(status, 503, "without quorum a write is refused: {body:#}");
    let message = body["error"]["message"].as_str().unwrap_or_default().to_string();
    assert!(message.contains("etcd"), "the refusal names the store: {message}");
    assert!(refused.elapsed() < Duration::from_secs(20), "the refusal took {:?}", refused.elapsed());
    // Reads go on from what the master holds.
    let (status, nodes) = env.get("/nodes").await;
    assert_eq!(status, 200);
    assert_eq!(nodes["nodes"].as_array().map(Vec::len), nodes_before["nodes"].as_array().map(Vec::len));
    let h = health(&env.client, &env.api).await;
    assert_eq!(h["role"], "leader", "{h:#}");

    // Healed: writes resume. The refused write's fate was unknown: if it
    // landed after all (etcd's leader had it in its log), the master's
    // memory is behind its store and it exits to be started again (as its
    // service manager would); if not, the same master goes on in its term.
    etcd.restart(1);
    etcd.restart(2);
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        if env.wait_master_exit(Duration::ZERO).await.is_some() {
            let log = env.master_log();
            assert!(log.contains("did land in etcd"), "the master exited for another cause\n{log}");
            env.start_master_again().await;
        }
        // (The master may exit between the look above and this write.)
        let sent = env.client.post(format!("{}/tokens", env.api)).json(&json!({"name": "healed"})).send().await;
        if sent.is_ok_and(|r| r.status() == 201) {
            break;
        }
        assert!(Instant::now() < deadline, "no write taken within 40 s of etcd healing\n{}", env.log_tails());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let after = health(&env.client, &env.api).await;
    if after["pid"] == h["pid"] {
        assert_eq!(after["term"], h["term"], "the same master in the same term");
    }
    // What the master shows is what etcd holds: first token, one-lost,
    // healed, and two-lost exactly when it landed.
    let (_, tokens) = env.get("/tokens").await;
    let names: Vec<&str> = tokens["tokens"].as_array().unwrap().iter().filter_map(|t| t["name"].as_str()).collect();
    assert!(names.contains(&"one-lost") && names.contains(&"healed"), "{names:?}");
    assert_eq!(names.len(), tokens_in_etcd(&etcd, "ha-quorum"), "{names:?}");
}

/// The CLI run against a waiting master finds the leader: a read and a
/// write go through the `307` with the token and body, and a list of
/// masters whose first cannot be reached goes on to the next.
#[tokio::test]
async fn the_cli_reaches_the_leader_through_a_waiting_master() {
    let etcd = EtcdCluster::start(3);
    let env = TestEnv::start_ha("ha-cli", &etcd, 2).await;
    let (leader, _) = env.leader_within(Duration::from_secs(10)).await;
    let waiting = 1 - leader;
    let h = env.ha_health(waiting).await.expect("the waiting master answers");
    assert_eq!(h["role"], "follower", "{h:#}");
    assert_eq!(h["leader"].as_str(), Some(env.ha_api(leader).trim_end_matches("/api/v1")), "{h:#}");
    let cli = |api: String, args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_flotilla"))
            .args(args)
            .args(["--api", &api, "--token", &env.token, "--json"])
            .output()
            .expect("run the CLI");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let follower = env.ha_api(waiting).trim_end_matches("/api/v1").to_string();
    let (code, out, err) = cli(follower.clone(), &["token", "create", "through-the-follower"]);
    assert_eq!(code, Some(0), "{out}\n{err}");
    let (code, out, err) = cli(follower, &["node", "ls"]);
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert!(out.contains("node-1") && out.contains("node-3"), "{out}");
    // A master nobody listens at first in the list, then the follower.
    let list = format!("http://127.0.0.1:9,{}", env.ha_api(waiting).trim_end_matches("/api/v1"));
    let (code, out, err) = cli(list, &["token", "ls"]);
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert!(out.contains("through-the-follower"), "{out}");
}
