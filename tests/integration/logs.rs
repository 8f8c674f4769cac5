//! Logs people can read: a master logging to a file writes no colour
//! codes; `log_format = json` gives one JSON object per line; a master that
//! cannot start says why on one line, causes included, without a backtrace;
//! `SIGUSR2` dumps the master's actors and an agent's instance slots.

use std::process::Command;
use std::time::Duration;

use nix::sys::signal::Signal;
use serde_json::json;

use crate::common::{PackageBuilder, TestEnv, pid_of, role_instances};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_to_a_file_are_plain_text_or_json_lines() {
    let env = TestEnv::start_sim("logs-text", &[], 1).await;
    let log = env.master_log();
    assert!(log.contains("master ready"), "{log}");
    assert!(!log.contains('\u{1b}'), "colour codes in a log file:\n{log}");

    let env = TestEnv::start_sim("logs-json", &[("FLOTILLA_MASTER_LOG_FORMAT", "json")], 1).await;
    let log = env.master_log();
    let lines: Vec<serde_json::Value> =
        log.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON line ({e}): {l}"))).collect();
    assert!(lines.iter().any(|l| l["fields"]["message"] == "master ready"), "{log}");
    assert!(lines.iter().all(|l| l["level"].is_string() && l["timestamp"].is_string()));
}

#[test]
fn a_failed_start_is_one_line_with_its_causes() {
    let dir = tempfile::tempdir().unwrap();
    // The port is taken: the master cannot listen (`--init`: it gets past
    // making its first token and its CA).
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let out = Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args(["master", "--init", "--http-addr", &addr, "--agent-addr", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path())
        .env("RUST_BACKTRACE", "1")
        .env("RUST_LOG", "off")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "one line: {err}");
    assert!(lines[0].starts_with("flotilla: master failed: cannot listen on "), "{err}");
    assert!(lines[0].contains("in use"), "the cause is named: {err}");
    assert!(!err.contains("backtrace"), "{err}");

    // Without `--init`, a data dir with no CA for the agent link: said so,
    // with the way out.
    let fresh = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args(["master", "--http-addr", "127.0.0.1:0", "--agent-addr", "127.0.0.1:0", "--data-dir"])
        .arg(fresh.path())
        .env("RUST_LOG", "off")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(err.contains("holds no CA for the agent link; start the master once with --init"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigusr2_dumps_the_actors_and_the_instance_slots() {
    let env = TestEnv::start("logs-dump").await;
    env.upload(&PackageBuilder::sleeper("dmp")).await;
    let c = env
        .create_active(
            json!({"name": "dmp", "package": {"name": "dmp", "version": "1.0.0"}, "roles": {"svc": {"count": 1}}}),
        )
        .await;
    let inst = role_instances(&c, "svc").remove(0);
    let (id, pid) = (inst["id"].as_str().unwrap().to_string(), pid_of(&inst));
    let node: usize = inst["node"].as_str().unwrap().trim_start_matches("node-").parse().unwrap();

    env.signal_master(Signal::SIGUSR2);
    env.signal_agent(node, Signal::SIGUSR2);
    env.until(10, "the dumps in the logs", async || {
        let (m, a) = (env.master_log(), env.agent_log(node));
        let master_ok = m.contains("SIGUSR2: actors")
            && m.contains("supervisor supervisor: running, mailbox 0")
            && m.lines().any(|l| l.contains("cluster dmp:") && l.contains("mailbox"));
        let agent_ok = a.contains("SIGUSR2: instance slots")
            && a.lines().any(|l| {
                l.contains(&format!("instance {id}: generation"))
                    && l.contains(&format!("pid {pid} (start time"))
                    && l.contains("lock free")
            });
        if master_ok && agent_ok { Ok(()) } else { Err(format!("master dump: {master_ok}, agent dump: {agent_ok}")) }
    })
    .await;
    // The signal did not stop anything.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(env.cluster("dmp").await["status"], "Active");
}
