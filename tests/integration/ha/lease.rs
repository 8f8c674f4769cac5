//! The leader's lease is renewed from a thread of its own, which no actor
//! load can starve: with the only actor thread and the supervisor's thread
//! blocked for three lease TTLs, the leader stays the leader (never
//! suspended, the same term), its follower never takes over, and it takes
//! writes again once they run.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::common::TestEnv;
use crate::common::etcd::EtcdCluster;
use crate::common::package::PackageBuilder;

/// Three TTLs of the default lease (2 s).
const BLOCKED: Duration = Duration::from_secs(6);

async fn block(env: &TestEnv, kind: &str, id: &str) {
    let root = env.api.trim_end_matches("/api/v1");
    let url = format!("{root}/test-hooks/actors/{kind}/{id}/block?ms={}", BLOCKED.as_millis());
    let resp = env.client.post(url).send().await.expect("POST a test hook");
    assert_eq!(resp.status(), StatusCode::OK, "{kind}/{id}: {}", resp.text().await.unwrap_or_default());
}

async fn health(client: &reqwest::Client, api: &str) -> Value {
    let resp = client.get(format!("{api}/health")).timeout(Duration::from_secs(2)).send().await;
    match resp {
        Ok(r) => r.json().await.unwrap_or(Value::Null),
        Err(e) => json!({ "error": e.to_string() }),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lease_outlives_every_actor_thread_blocked_for_three_ttls() {
    let etcd = EtcdCluster::start(3);
    let config =
        format!("test_hooks = true\nactor_threads = 1\n{}", crate::common::env::etcd_config("ha-lease", &etcd));
    let mut env = TestEnv::start_ha_laid_out("ha-lease", &config, 2, None).await;
    let (leader, h) = env.follow_leader(None, Duration::from_secs(10)).await;
    let term = h["term"].as_i64().expect("the leader's term");
    let spec = "[component]\nname = \"held\"\nversion = \"1.0.0\"\n\n[[roles]]\nname = \"svc\"\ncount = { min = 1, max = 1 }\nstart = [\"bin/start.sh\"]\nstop_grace = \"2s\"\n";
    env.upload(&PackageBuilder::new("held", "1.0.0").spec(spec).script("bin/start.sh", "exec sleep 100000\n")).await;
    env.create_active(json!({"name": "held", "package": {"name": "held", "version": "1.0.0"}})).await;
    let follower = 1 - leader;
    env.serving_follower(follower).await;

    // The one actor thread, then the supervisor's (the leadership's
    // watcher runs there too).
    block(&env, "cluster", "held").await;
    // The hook's answer only says the block was sent.
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let (_, actors) = env.get("/actors").await;
        let list = actors["actors"].as_array().cloned().unwrap_or_default();
        let held = list.iter().find(|a| a["kind"] == "cluster" && a["id"] == "held");
        if held.and_then(|a| a["current"].as_str()).is_some_and(|c| c.contains("blocked by a test hook")) {
            break;
        }
        assert!(Instant::now() < deadline, "the actor thread is not blocked: {held:#?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    block(&env, "supervisor", "supervisor").await;
    let blocked = Instant::now();
    let (leader_api, follower_api) = (env.ha_api(leader), env.ha_api(follower));
    let mut polls = 0;
    while blocked.elapsed() < BLOCKED {
        let (l, f) = (health(&env.client, &leader_api).await, health(&env.client, &follower_api).await);
        assert_eq!(l["role"], "leader", "the leader lost its place with its actor threads blocked: {l:#}");
        assert_eq!(l["term"], term, "{l:#}");
        assert_eq!(l["suspended"], false, "the lease's renewal waited on a blocked thread: {l:#}");
        assert_eq!((f["role"].as_str(), f["term"].as_i64()), (Some("follower"), Some(term)), "{f:#}");
        polls += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(polls >= 20, "only {polls} health polls answered in {BLOCKED:?}");

    // Once the threads run again, the same leader takes writes.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, v) = env.post("/tokens", json!({"name": "after-the-block", "scope": "read"})).await;
        if status == StatusCode::CREATED {
            break;
        }
        assert!(Instant::now() < deadline, "the leader took no write after the block: {status} {v:#}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let l = health(&env.client, &leader_api).await;
    assert_eq!((l["role"].as_str(), l["term"].as_i64()), (Some("leader"), Some(term)), "{l:#}");
}
