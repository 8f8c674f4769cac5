//! The log API never reads through what an instance planted in `logs/`:
//! a link to `/etc/shadow` or to the master's CA key, a link to `/dev/zero`,
//! `logs/` itself swapped for a link, a hard link to a root file, a FIFO
//! (which used to hold one agent thread per request until the agent
//! wedged), and a link swapped in and out while reads run.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::json;

use super::{attack, intruder};
use crate::common::{TestEnv, dir_of, eventually, id_of};

/// `GET` of `id`'s log `stream` in cluster `cluster`: (status, body text).
async fn read_log(env: &TestEnv, cluster: &str, id: &str, stream: &str) -> (StatusCode, String) {
    let url = format!("{}/clusters/{cluster}/instances/{id}/logs?stream={stream}&tail=3", env.api);
    let resp = env.client.get(url).send().await.expect("the log request");
    let status = resp.status();
    (status, resp.text().await.unwrap_or_default())
}

/// The read is refused with `409 log_refused`, saying `why`, and nothing of
/// `secret` is in the answer.
fn refused(status: StatusCode, body: &str, why: &str, secret: &str) {
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert!(body.contains("log_refused") && body.contains(why), "{body}");
    assert!(!body.contains(secret), "the answer holds what the link points at: {body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn links_in_logs_are_refused_and_nothing_outside_is_read() {
    let env = TestEnv::start("iso-log-links").await;
    env.upload(&intruder("1.0.0")).await;
    let shadow = std::fs::read_to_string("/etc/shadow").expect("/etc/shadow (the test runs as root)");
    let root_line = shadow.lines().next().expect("a line in /etc/shadow").to_string();

    let i = attack(&env, "shadow", "stdout-link", "/etc/shadow").await;
    let (status, body) = read_log(&env, "shadow", &id_of(&i), "stdout").await;
    refused(status, &body, "is a symbolic link", &root_line);

    // The master's CA key, on the same host as the agents.
    let ca_key = env.master_dir().join("ca/ca.key");
    assert!(ca_key.exists(), "no CA key at {}", ca_key.display());
    let i = attack(&env, "cakey", "stderr-link", &ca_key.display().to_string()).await;
    let (status, body) = read_log(&env, "cakey", &id_of(&i), "stderr").await;
    refused(status, &body, "is a symbolic link", "PRIVATE KEY");

    let i = attack(&env, "zero", "stdout-link", "/dev/zero").await;
    let started = Instant::now();
    let (status, body) = read_log(&env, "zero", &id_of(&i), "stdout").await;
    refused(status, &body, "is a symbolic link", "\0");
    assert!(started.elapsed() < Duration::from_secs(5), "the refusal took {:?}", started.elapsed());

    // logs/ itself a link to a directory holding a stdout.log.
    let elsewhere = tempfile::tempdir().unwrap();
    std::fs::write(elsewhere.path().join("stdout.log"), "ELSEWHERE\n").unwrap();
    let i = attack(&env, "logsdir", "logs-dir-link", &elsewhere.path().display().to_string()).await;
    let (status, body) = read_log(&env, "logsdir", &id_of(&i), "stdout").await;
    refused(status, &body, "logs is a symbolic link", "ELSEWHERE");

    // A hard link to a file of root's, as an instance could make where
    // fs.protected_hardlinks is off (made here by the test, as root: this
    // machine has it on). Same filesystem as the instance dir.
    let i = attack(&env, "hard", "none", "").await;
    let secret = env.master_dir().parent().unwrap().join("root-secret");
    std::fs::write(&secret, "ROOT ONLY\n").unwrap();
    let log = dir_of(&i).join("logs/stdout.log");
    std::fs::remove_file(&log).unwrap();
    std::fs::hard_link(&secret, &log).expect("a hard link on the instance's filesystem");
    let (status, body) = read_log(&env, "hard", &id_of(&i), "stdout").await;
    refused(status, &body, "belongs to uid 0", "ROOT ONLY");

    // And an instance's own log still reads.
    std::fs::remove_file(&log).unwrap();
    std::fs::write(&log, "mine\n").unwrap();
    let uid = std::fs::metadata(dir_of(&i)).map(|m| std::os::unix::fs::MetadataExt::uid(&m)).unwrap();
    std::os::unix::fs::chown(&log, Some(uid), Some(uid)).unwrap();
    let (status, body) = read_log(&env, "hard", &id_of(&i), "stdout").await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "mine\n"));
}

/// A FIFO where the log should be: every read is refused at once (the
/// agent opens non-blocking and checks what it opened), a burst of them
/// neither piles up threads on the agent nor stops it working, and the
/// bounds on concurrent reads answer `503 overloaded` rather than queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fifo_log_neither_blocks_nor_wedges_the_agent() {
    let env = TestEnv::start("iso-log-fifo").await;
    env.upload(&intruder("1.0.0")).await;
    let i = attack(&env, "fifo", "fifo", "").await;
    let id = id_of(&i);
    let node: usize = i["node"].as_str().unwrap().trim_start_matches("node-").parse().unwrap();
    let threads = |pid: u32| -> usize {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        status.lines().find_map(|l| l.strip_prefix("Threads:")).unwrap().trim().parse().unwrap()
    };
    let before = threads(env.agent_pid(node));

    let started = Instant::now();
    let reads = (0..200).map(|_| read_log(&env, "fifo", &id, "stdout"));
    let answers = futures::future::join_all(reads).await;
    let took = started.elapsed();
    let refused_fifo = answers.iter().filter(|(s, b)| *s == StatusCode::CONFLICT && b.contains("a FIFO")).count();
    let overloaded = answers.iter().filter(|(s, _)| *s == StatusCode::SERVICE_UNAVAILABLE).count();
    assert_eq!(refused_fifo + overloaded, 200, "{:?}", answers.iter().find(|(s, _)| *s != StatusCode::CONFLICT));
    assert!(refused_fifo > 0, "no read reached the agent");
    assert!(took < Duration::from_secs(20), "200 reads took {took:?}");
    let after = threads(env.agent_pid(node));
    assert!(after < before + 20, "the agent went from {before} to {after} threads");

    // The node still works: a new cluster there starts, and the FIFO's
    // own cluster is deleted (the FIFO removed, never opened).
    let c = env
        .create_active(json!({
            "name": "after", "package": {"name": "intruder", "version": "1.0.0"},
            "roles": {"svc": {"count": 1, "nodes": [i["node"]]}},
        }))
        .await;
    assert_eq!(c["status"], "Active", "{c:#}");
    let dir = dir_of(&i);
    let (status, body) = env.delete("/clusters/fifo").await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body:#}");
    let gone = eventually(30, || !dir.exists()).await;
    assert!(gone, "the FIFO's instance dir is left: {}", dir.display());
}

/// A link swapped in and out of `stdout.log` in a loop while the API
/// reads it: each answer is the real log or a refusal, never the target.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_swapped_in_during_reads_is_never_followed() {
    let env = TestEnv::start("iso-log-swap").await;
    env.upload(&intruder("1.0.0")).await;
    let target = env.master_dir().parent().unwrap().join("swap-target");
    std::fs::write(&target, "TARGET\n").unwrap();
    let i = attack(&env, "swap", "swap", &target.display().to_string()).await;
    let id = id_of(&i);
    let (mut real, mut refusals) = (0, 0);
    for _ in 0..300 {
        let (status, body) = read_log(&env, "swap", &id, "stdout").await;
        assert!(!body.contains("TARGET"), "read through the link: {body}");
        match status {
            StatusCode::OK => {
                real += 1;
            }
            StatusCode::CONFLICT => refusals += 1,
            other => panic!("{other}: {body}"),
        }
    }
    assert!(real > 0 && refusals > 0, "the race did not run both ways: {real} reads, {refusals} refusals");
}
