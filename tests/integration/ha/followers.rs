//! Warm followers: a master that does not lead keeps its own read model
//! from an etcd watch and answers reads from it (the same answers as the
//! leader's, the same event numbers), sends writes and leader-only reads to
//! the leader, and keeps answering reads while the leader is killed.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::common::TestEnv;
use crate::common::etcd::EtcdCluster;
use crate::common::http::all_instances;
use crate::common::sse::SseReader;

/// Polls `check` every 50 ms for up to `secs` seconds until it holds.
async fn until<F, Fut>(secs: u64, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if check().await {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A client with `token` that shows redirects instead of following them.
fn raw_client(token: &str) -> reqwest::Client {
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert(reqwest::header::AUTHORIZATION, format!("Bearer {token}").parse().expect("header"));
    reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(10))
        .default_headers(headers)
        .build()
        .expect("client")
}

async fn get(client: &reqwest::Client, url: &str) -> (StatusCode, Value) {
    let r = client.get(url).send().await.unwrap_or_else(|e| panic!("GET {url}: {e}"));
    let status = r.status();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// What a reader compares of a cluster: its status and each member.
fn summary(cluster: &Value) -> Value {
    let members: Vec<Value> =
        all_instances(cluster).iter().map(|i| json!([i["id"], i["status"], i["node"], i["pid"]])).collect();
    assert!(!members.is_empty(), "a cluster without members: {cluster:#}");
    json!({"status": cluster["status"], "operation": cluster["operation"], "members": members})
}

/// The first `n` events of `GET {api}/events?after=0`, as (id, kind).
async fn first_events(client: &reqwest::Client, api: &str, n: usize) -> Vec<(Option<u64>, String)> {
    let mut reader = SseReader::open(client, api, "?after=0", None).await;
    let mut out = Vec::new();
    while out.len() < n {
        let e = reader.next(Duration::from_secs(20)).await;
        let e = e.unwrap_or_else(|| panic!("{api}/events ended after {} events: {out:?}", out.len()));
        out.push((e.id, e.kind));
    }
    out
}

#[tokio::test]
async fn a_follower_serves_reads_from_its_own_view_and_sends_the_rest_to_the_leader() {
    let etcd = EtcdCluster::start(3);
    let mut env = TestEnv::start_ha("ha-follow", &etcd, 2).await;
    let (leader, lh) = env.follow_leader(None, Duration::from_secs(10)).await;
    assert_eq!(leader, 0, "{lh:#}");
    let h = env.serving_follower(1).await;
    let leader_url = env.ha_api(0).trim_end_matches("/api/v1").to_string();
    assert_eq!(h["leader"], leader_url.as_str(), "{h:#}");
    assert_eq!(h["term"], lh["term"], "{h:#}");
    assert!(h["lag_ms"].as_u64().is_some_and(|l| l < 2_000), "{h:#}");
    let (leader_api, follower_api) = (env.ha_api(0), env.ha_api(1));
    let raw = raw_client(&env.token);

    let created = super::create_mr(&env, 2).await;

    // The follower shows what the leader shows (within its lag).
    let same = until(20, || async {
        let (s, c) = get(&raw, &format!("{follower_api}/clusters/mr")).await;
        s == StatusCode::OK && summary(&c) == summary(&created)
    })
    .await;
    let (_, on_follower) = get(&raw, &format!("{follower_api}/clusters/mr")).await;
    assert!(same, "leader: {:#}\nfollower: {:#}", summary(&created), summary(&on_follower));
    let (s, list) = get(&raw, &format!("{follower_api}/clusters")).await;
    assert_eq!((s, list["total"].as_u64()), (StatusCode::OK, Some(1)), "{list:#}");
    let (s, pkgs) = get(&raw, &format!("{follower_api}/packages")).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(pkgs["packages"].as_array().map(Vec::len), Some(1), "{pkgs:#}");

    // A long poll on the follower ends when the leader's operation does.
    let (status, resp) = env.post("/clusters/mr/scale", json!({"role": "svc", "add": 1})).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{resp:#}");
    let op = resp["operation"]["id"].as_str().expect("op id").to_string();
    let waited = Instant::now();
    let (s, polled) = get(&raw, &format!("{follower_api}/operations/{op}?wait=30")).await;
    assert_eq!(s, StatusCode::OK, "{polled:#}");
    assert_eq!(polled["operation"]["status"], "Succeeded", "{polled:#}");
    assert!(waited.elapsed() < Duration::from_secs(25), "the long poll ran to its end: {:?}", waited.elapsed());
    let (_, on_leader) = get(&raw, &format!("{leader_api}/operations/{op}")).await;
    assert_eq!(polled["operation"]["steps"], on_leader["operation"]["steps"]);

    // The same events, with the same numbers, on either master.
    let (from_leader, from_follower) =
        (first_events(&raw, &leader_api, 8).await, first_events(&raw, &follower_api, 8).await);
    assert_eq!(from_leader, from_follower);
    // Live: once a follower's stream has caught up from the store, a new
    // event reaches it only through the follower's watch.
    let mut live = SseReader::open(&raw, &follower_api, "?after=0&kind=operation.created", None).await;
    let caught_up = live.until(Duration::from_secs(20), |e| e.data["data"]["operation"] == op.as_str()).await;
    assert!(caught_up.last().is_some_and(|e| e.data["data"]["operation"] == op.as_str()), "{caught_up:#?}");
    let c = env.cluster("mr").await;
    let first = all_instances(&c)[0]["id"].as_str().expect("an instance").to_string();
    let (status, resp) = env.post_empty(&format!("/clusters/mr/instances/{first}/restart")).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{resp:#}");
    let restart = resp["operation"]["id"].as_str().expect("op id").to_string();
    let seen = live.next(Duration::from_secs(10)).await;
    assert!(
        seen.as_ref().is_some_and(|e| e.data["data"]["operation"] == restart.as_str()),
        "the follower's stream did not carry the leader's new event: {seen:#?}"
    );
    env.wait_op(&restart).await;

    // Writes and what only the leader knows: sent there, path and query kept.
    let r = raw.post(format!("{follower_api}/clusters/mr/scale?dry_run=true")).json(&json!({})).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::TEMPORARY_REDIRECT);
    let to = r.headers()["location"].to_str().unwrap().to_string();
    assert_eq!(to, format!("{leader_api}/clusters/mr/scale?dry_run=true"));
    for path in ["/nodes", "/actors", "/tokens", "/pools"] {
        let r = raw.get(format!("{follower_api}{path}")).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::TEMPORARY_REDIRECT, "GET {path} on a follower");
    }
    // Tokens come through the watch: a new one works on the follower, and
    // once revoked on the leader the follower refuses it too.
    let (status, t) = env.post("/tokens", json!({"name": "viewer", "scope": "read"})).await;
    assert_eq!(status, StatusCode::CREATED, "{t:#}");
    let viewer = raw_client(t["secret"].as_str().expect("secret"));
    let works = until(20, || async { get(&viewer, &format!("{follower_api}/clusters")).await.0 == StatusCode::OK });
    assert!(works.await, "a token made on the leader does not work on the follower");
    let id = t["token"]["id"].as_str().expect("token id");
    let r = env.client.delete(format!("{leader_api}/tokens/{id}")).send().await.unwrap();
    assert!(r.status().is_success(), "revoke: {}", r.status());
    let refused =
        until(20, || async { get(&viewer, &format!("{follower_api}/clusters")).await.0 == StatusCode::UNAUTHORIZED });
    assert!(refused.await, "a revoked token still reads on the follower");

    // The installation's masters beside the actor tree: the leader its
    // root, the follower as its own health says; unreachable once gone.
    let (_, a) = env.get("/actors").await;
    let m = a["masters"].as_array().expect("masters").clone();
    assert_eq!(m.len(), 2, "{a:#}");
    assert_eq!((&m[0]["this"], &m[0]["role"], &m[0]["term"]), (&json!(true), &json!("leader"), &lh["term"]), "{m:#?}");
    let pid1 = env.ha_pid(1);
    assert_eq!(
        (&m[1]["this"], &m[1]["role"], &m[1]["pid"]),
        (&json!(false), &json!("follower"), &json!(pid1)),
        "{m:#?}"
    );
    env.signal_ha(1, nix::sys::signal::Signal::SIGKILL);
    let gone = until(20, || async { env.get("/actors").await.1["masters"][1]["role"] == "unreachable" });
    assert!(gone.await, "a killed follower is not shown unreachable: {:#}", env.get("/actors").await.1["masters"]);
}

#[tokio::test]
async fn reads_on_followers_never_fail_while_the_leader_is_killed() {
    let etcd = EtcdCluster::start(3);
    let mut env = TestEnv::start_ha_serving("ha-follow-kill", &etcd, 3).await;
    super::create_mr(&env, 2).await;
    for i in 1..=2 {
        let api = env.ha_api(i);
        let raw = raw_client(&env.token);
        let shown = until(20, || async { get(&raw, &format!("{api}/clusters/mr")).await.0 == StatusCode::OK });
        assert!(shown.await, "follower {i} does not show the cluster");
    }

    // Both followers read without pause through the kill and the takeover
    // (the one that wins answers from its own master once it has booted).
    let stop = Arc::new(AtomicBool::new(false));
    let (reads, failures) = (Arc::new(AtomicU64::new(0)), Arc::new(std::sync::Mutex::new(Vec::new())));
    let mut readers = Vec::new();
    for i in 1..=2 {
        let (url, raw) = (format!("{}/clusters/mr", env.ha_api(i)), raw_client(&env.token));
        let (stop, reads, failures) = (stop.clone(), reads.clone(), failures.clone());
        readers.push(tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                match raw.get(&url).send().await {
                    Ok(r) if r.status() == StatusCode::OK => {}
                    Ok(r) => failures.lock().unwrap().push(format!("{url}: {}", r.status())),
                    Err(e) => failures.lock().unwrap().push(format!("{url}: {e}")),
                }
                reads.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    env.kill_master();
    let (now, _) = env.follow_leader(Some(0), Duration::from_secs(20)).await;
    env.wait_ready().await;
    // A write on the new leader reaches the follower left.
    let c = env.cluster("mr").await;
    let first = summary(&c)["members"][0][0].as_str().expect("an instance").to_string();
    let op = env.run_op(&format!("/clusters/mr/instances/{first}/stop"), None).await;
    env.assert_succeeded(&op);
    let other = if now == 1 { 2 } else { 1 };
    let (api, raw) = (env.ha_api(other), raw_client(&env.token));
    let seen = until(20, || async {
        let (s, c) = get(&raw, &format!("{api}/clusters/mr")).await;
        s == StatusCode::OK
            && summary(&c)["members"]
                .as_array()
                .is_some_and(|m| m.iter().any(|m| m[0] == first.as_str() && m[1] == "Stopped"))
    });
    assert!(seen.await, "the follower left does not show the new leader's stop\n{}", env.ha_log(other));
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::SeqCst);
    for r in readers {
        r.await.unwrap();
    }
    let failures = failures.lock().unwrap();
    assert!(failures.is_empty(), "{} of {} reads failed: {failures:#?}", failures.len(), reads.load(Ordering::SeqCst));
    assert!(reads.load(Ordering::SeqCst) > 50, "too few reads to tell");
}
