//! `flotilla bench --api` pointed at a follower, with every master's agent
//! address: its reads are served there, its writes follow the follower's
//! `307` to the leader with the token, its simulated agents find the
//! leader, and the workload ends with what it asked for on the leader.

use std::time::Duration;

use serde_json::Value;

use crate::common::TestEnv;
use crate::common::etcd::EtcdCluster;

#[tokio::test]
async fn bench_against_a_follower_writes_through_the_leader_and_reads_on_the_follower() {
    let etcd = EtcdCluster::start(3);
    let env = TestEnv::start_ha_serving("ha-bench-api", &etcd, 2).await;
    let follower = env.ha_api(1).trim_end_matches("/api/v1").to_string();
    let tmp = tempfile::Builder::new().prefix("flotilla-bench-api-").tempdir().expect("temp dir");
    let json_path = tmp.path().join("report.json");
    let args = [
        "bench",
        "--api",
        &follower,
        "--agent-addr",
        &env.master_list(),
        "--token",
        &env.token,
        "--agents",
        "4",
        "--instances",
        "40",
        "--clusters",
        "2",
        "--clients",
        "2",
        "--step",
        "10",
        "--prefix",
        "bsim-",
        "--json",
        &json_path.to_string_lossy(),
    ];
    let out = tokio::time::timeout(
        Duration::from_secs(240),
        tokio::process::Command::new(env!("CARGO_BIN_EXE_flotilla"))
            .args(args)
            .env_remove("FLOTILLA_TOKEN")
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the bench finishes within 240 s")
    .expect("run flotilla bench");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "flotilla bench {args:?}: {}\nstdout:\n{stdout}\nstderr:\n{stderr}", out.status);
    let text = std::fs::read_to_string(&json_path).expect("the --json report was written");
    let r: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("the report is not JSON ({e}):\n{text}"));
    let api = &r["api"];
    // Reads stayed on the follower: each read only the leader answers
    // (`GET /nodes`) went there through a redirect, besides the first
    // write's (the leader is remembered for the next ones).
    let leader_reads = api["routes"]["GET /nodes"]["count"].as_u64().unwrap_or(0);
    assert!(leader_reads >= 1, "the readers asked for nodes: {api:#}");
    assert!(
        api["redirected"].as_u64().unwrap_or(0) > leader_reads,
        "every node read and a write went through the follower's redirect: {api:#}"
    );
    assert!(api["writes"].as_u64().unwrap_or(0) >= 2, "{api:#}");
    assert!(api["reads"].as_u64().unwrap_or(0) >= 1, "{api:#}");
    assert!(stdout.contains("307 followed to the leader"), "the table says so:\n{stdout}");
    // The leader holds what the bench made, placed on its simulated agents.
    let (leader, h) = env.leader_within(Duration::from_secs(5)).await;
    assert_eq!(leader, 0, "the leader did not change: {h:#}");
    let clusters: Value =
        env.client.get(format!("{}/clusters", env.ha_api(0))).send().await.unwrap().json().await.unwrap();
    let list = clusters["clusters"].as_array().cloned().unwrap_or_default();
    assert!(!list.is_empty(), "the bench's clusters are on the leader: {clusters:#}");
    let nodes: Value = env.client.get(format!("{}/nodes", env.ha_api(0))).send().await.unwrap().json().await.unwrap();
    let sims = nodes["nodes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|n| n["id"].as_str().is_some_and(|i| i.starts_with("bsim-")));
    assert_eq!(sims.count(), 4, "every simulated agent reached the leader: {nodes:#}");
}
