//! `GET .../instances/{id}/logs`: an instance's stdout and stderr read from
//! its real agent: the last lines, and a followed log that shows what the
//! process writes after the request.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::json;

use crate::common::{PackageBuilder, TestEnv, id_of, role_instances};

/// A role that writes to its log (also `scopes`).
pub const SPEC: &str = r#"
[component]
name = "talk"
version = "1.0.0"

[[roles]]
name = "svc"
count = { min = 1, max = 2 }
start = ["bin/talk.sh"]
stop_grace = "2s"
"#;

const TALK: &str = "echo started >&2\ni=0\nwhile true; do i=$((i+1)); echo \"tick $i\"; sleep 0.1; done\n";

/// The numbers of the `tick N` lines of `text`.
fn ticks(text: &str) -> Vec<u64> {
    text.lines().filter_map(|l| l.strip_prefix("tick ")).map(|n| n.parse().unwrap()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instances_log_is_tailed_and_followed_from_its_agent() {
    let env = TestEnv::start("instance-logs").await;
    env.upload(&PackageBuilder::new("talk", "1.0.0").spec(SPEC).script("bin/talk.sh", TALK)).await;
    let c = env.create_active(json!({"name": "talk", "package": {"name": "talk", "version": "1.0.0"}})).await;
    let id = id_of(&role_instances(&c, "svc")[0]);
    let base = format!("{}/clusters/talk/instances/{id}/logs", env.api);
    tokio::time::sleep(Duration::from_millis(600)).await;

    // The last three lines, whole and in order.
    let text = env.client.get(format!("{base}?tail=3")).send().await.unwrap().text().await.unwrap();
    let n = ticks(&text);
    assert_eq!(n.len(), 3, "{text:?}");
    assert!(n.windows(2).all(|w| w[1] == w[0] + 1), "{text:?}");
    assert_eq!(text.lines().count(), 3, "only whole lines: {text:?}");

    let err = env.client.get(format!("{base}?stream=stderr")).send().await.unwrap().text().await.unwrap();
    assert_eq!(err, "started\n");

    // Followed: lines written after the request arrive on the same response.
    let mut resp = env.client.get(format!("{base}?tail=1&follow=true")).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let mut seen = String::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while ticks(&seen).len() < 8 && Instant::now() < deadline {
        if let Ok(Ok(Some(chunk))) = tokio::time::timeout(Duration::from_secs(2), resp.chunk()).await {
            seen.push_str(&String::from_utf8_lossy(&chunk));
        }
    }
    let n = ticks(&seen);
    assert!(n.len() >= 8, "followed lines: {seen:?}");
    assert!(n.windows(2).all(|w| w[1] == w[0] + 1), "no line lost or repeated: {seen:?}");
    drop(resp);

    let (status, _) = env.get("/clusters/talk/instances/talk-svc-9-000000/logs").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, body) = env.get(&format!("/clusters/talk/instances/{id}/logs?stream=both")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body:#}");
}
