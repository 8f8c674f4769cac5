//! `GET /metrics` on a real master with real agents: Prometheus text that a
//! Prometheus parser reads, behind the token unless `open_metrics`, whose
//! counters, gauges and histograms move with a scripted operation.

use prometheus_parse::{Sample, Scrape, Value};
use serde_json::json;

use crate::common::{PackageBuilder, TestEnv};

fn root(env: &TestEnv) -> String {
    env.api.trim_end_matches("/api/v1").to_string()
}

async fn scrape(env: &TestEnv) -> Vec<Sample> {
    let resp = env.client.get(format!("{}/metrics", root(env))).send().await.expect("GET /metrics");
    assert_eq!(resp.status(), reqwest::StatusCode::OK);
    let ct = resp.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
    assert!(ct.starts_with("text/plain"), "{ct}");
    let text = resp.text().await.unwrap();
    Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).expect("Prometheus text").samples
}

/// The value of `metric` with `labels` (a counter, gauge or untyped value;
/// for a histogram its count), if the scrape has it.
fn value(samples: &[Sample], metric: &str, labels: &[(&str, &str)]) -> Option<f64> {
    samples
        .iter()
        .filter(|s| s.metric == metric && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .map(|s| match &s.value {
            Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => *v,
            Value::Histogram(buckets) => buckets.iter().map(|b| b.count).fold(0.0, f64::max),
            _ => f64::NAN,
        })
        .reduce(|a, b| a + b)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_parse_need_the_token_and_move_with_an_operation() {
    let env = TestEnv::start("metrics").await;
    let none = reqwest::Client::builder().no_proxy().build().unwrap();
    let resp = none.get(format!("{}/metrics", root(&env))).send().await.unwrap();
    assert_eq!(resp.status(), reqwest::StatusCode::UNAUTHORIZED, "the token is needed by default");

    // A made-up method is counted as "other", never as a label of its own.
    let odd = reqwest::Method::from_bytes(b"FROBNICATE1").unwrap();
    let _ = env.client.request(odd, format!("{}/clusters", env.api)).send().await.unwrap();

    let before = scrape(&env).await;
    assert!(!before.iter().any(|s| s.labels.values().any(|v| v == "FROBNICATE1")), "a method became a label");
    assert!(value(&before, "flotilla_http_requests_total", &[("method", "other")]).is_some());
    assert_eq!(value(&before, "flotilla_nodes", &[("status", "Ready")]), Some(3.0));
    assert_eq!(value(&before, "flotilla_clusters", &[("status", "Active")]), Some(0.0));
    assert_eq!(value(&before, "flotilla_operations_total", &[("kind", "Create")]), None);
    for n in ["node-1", "node-2", "node-3"] {
        let age = value(&before, "flotilla_node_heartbeat_age_seconds", &[("node", n)]).expect("heartbeat age");
        assert!((0.0..10.0).contains(&age), "{n}: {age}");
    }

    env.upload(&PackageBuilder::sleeper("mx")).await;
    env.create_active(
        json!({"name": "mx", "package": {"name": "mx", "version": "1.0.0"}, "roles": {"svc": {"count": 2}}}),
    )
    .await;
    env.run_ok("/clusters/mx/stop", None).await;

    let after = scrape(&env).await;
    let ops = |kind| value(&after, "flotilla_operations_total", &[("kind", kind), ("result", "Succeeded")]);
    assert_eq!((ops("Create"), ops("Stop")), (Some(1.0), Some(1.0)));
    assert_eq!(value(&after, "flotilla_clusters", &[("status", "Stopped")]), Some(1.0));
    assert_eq!(value(&after, "flotilla_instances", &[("status", "Stopped")]), Some(2.0));
    assert_eq!(value(&after, "flotilla_instances", &[("status", "Running")]), Some(0.0));
    let starts = value(&after, "flotilla_step_duration_seconds", &[("action", "start"), ("result", "ok")]);
    assert!(starts.is_some_and(|n| n >= 1.0), "a start step timed: {starts:?}");
    let commits = value(&after, "flotilla_store_commit_seconds", &[]).unwrap_or(0.0);
    let commits_before = value(&before, "flotilla_store_commit_seconds", &[]).unwrap_or(0.0);
    assert!(commits > commits_before, "store commits timed: {commits_before} -> {commits}");
    assert!(value(&after, "flotilla_store_batch_requests", &[]).is_some());
    let sent = |s: &[Sample]| value(s, "flotilla_agent_link_bytes_total", &[("direction", "sent")]).unwrap_or(0.0);
    assert!(sent(&after) > sent(&before) + 1000.0, "a package went to the agents");
    let creates = value(
        &after,
        "flotilla_http_requests_total",
        &[("method", "POST"), ("route", "/api/v1/clusters"), ("status", "202")],
    );
    assert_eq!(creates, Some(1.0), "requests by route pattern");
    assert!(
        value(&after, "flotilla_http_request_duration_seconds", &[("route", "/api/v1/clusters/:name/stop")]).is_some(),
        "routes are patterns, never names: {:?}",
        after
            .iter()
            .filter(|s| s.metric.starts_with("flotilla_http_request_duration"))
            .map(|s| s.labels.get("route"))
            .collect::<std::collections::BTreeSet<_>>()
    );
    assert!(value(&after, "flotilla_mailbox_depth", &[("kind", "cluster")]).is_some());
    // Each actor thread's lag (one thread per core by default), ticked 10
    // times a second from the start.
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    for thread in (0..threads).map(|t| t.to_string()) {
        let ticks = value(&after, "flotilla_actor_thread_lag_seconds", &[("thread", &thread)]);
        assert!(ticks.is_some_and(|n| n >= 1.0), "actor thread {thread}'s lag is measured: {ticks:?}");
    }
    // And each thread of agents' connections (one per two cores, at least one).
    for thread in (0..(threads / 2).max(1)).map(|t| format!("link-{t}")) {
        let ticks = value(&after, "flotilla_actor_thread_lag_seconds", &[("thread", &thread)]);
        assert!(ticks.is_some_and(|n| n >= 1.0), "{thread}'s lag is measured: {ticks:?}");
    }
    let waits = value(&after, "flotilla_actor_mailbox_wait_seconds", &[("kind", "cluster")]);
    assert!(waits.is_some_and(|n| n >= 2.0), "the create and the stop waited in the cluster's mailbox: {waits:?}");
    assert!(!after.iter().any(|s| s.labels.values().any(|v| v.contains("mx-svc-"))), "no instance ids in labels");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_metrics_answers_without_a_token() {
    let env = TestEnv::start_sim("metrics-open", &[("FLOTILLA_MASTER_OPEN_METRICS", "true")], 1).await;
    let none = reqwest::Client::builder().no_proxy().build().unwrap();
    let resp = none.get(format!("{}/metrics", root(&env))).send().await.unwrap();
    assert_eq!(resp.status(), reqwest::StatusCode::OK);
    assert!(resp.text().await.unwrap().contains("flotilla_nodes"));
}
