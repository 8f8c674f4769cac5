//! The master's store refusing the write inside each step that runs a
//! script. The master's data dir is on a 16 MiB tmpfs the test mounts
//! (small enough that RocksDB's 32 MiB WAL preallocation fails and
//! every page is taken when written); while the step's script is held
//! the test fills the tmpfs and writes through the API until the store
//! refuses a write (`ENOSPC` for real: a write that still fits in the
//! WAL's last page succeeds), then lets the script go.
//!
//! What the master does: the step's end cannot be journaled, the
//! operation stops there (`Halted`: "the journal cannot be written",
//! nothing more done or undone), its end cannot be recorded either, so
//! the cluster stays busy with it; reads keep answering. The test then
//! stops the master (SIGTERM), frees the space and starts it again: the
//! next master resumes the operation from its journal (the step runs
//! again) and it ends as an uninterrupted run would; every write the
//! API acknowledged is there, the refused one is not.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use serde_json::json;

use super::{Bench, Kind, as_uninterrupted};
use crate::common::TestEnv;
use crate::common::faulty::{Tmpfs, operation, step_status, wait_held};

/// Writes join tokens `poke-<scenario>-<n>` until the store refuses one:
/// (those acknowledged, the refused one).
async fn write_until_refused(env: &TestEnv, scenario: &str) -> (Vec<String>, String) {
    let mut acked = Vec::new();
    for n in 0..200 {
        let name = format!("poke-{scenario}-{n}");
        let (status, body) = env.post("/join-tokens", json!({"name": name, "uses": 1})).await;
        match status.as_u16() {
            201 => acked.push(name),
            // Not a 500: the operator reads what to do.
            503 if body["error"]["message"].as_str().is_some_and(|m| m.contains("disk is full")) => {
                return (acked, name);
            }
            s => panic!("POST /join-tokens answered {s}: {body:#}"),
        }
    }
    panic!("the store took 200 writes on a full disk");
}

async fn join_token_names(env: &TestEnv) -> BTreeSet<String> {
    let (_, body) = env.get("/join-tokens").await;
    body["join_tokens"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["name"].as_str().map(str::to_string))
        .collect()
}

/// SIGTERM, and waits until the master no longer answers (then reaps it).
async fn stop_master(env: &mut TestEnv) {
    env.signal_master(nix::sys::signal::Signal::SIGTERM);
    let deadline = Instant::now() + Duration::from_secs(30);
    let url = format!("{}/health", env.api);
    while reqwest::Client::new().get(&url).timeout(Duration::from_millis(500)).send().await.is_ok() {
        assert!(Instant::now() < deadline, "the master still answers 30 s after SIGTERM");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    env.kill_master();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_refusing_the_write_inside_each_step() {
    let mut env = TestEnv::start("faults-steps-store").await;
    env.kill_master();
    let fs = Tmpfs::mount_over(&env.master_dir(), 16);
    env.start_master_again().await;
    env.wait_ready().await;
    let mut b = Bench::with(env, "ss").await;
    let mut count = 0;
    for kind in Kind::ALL {
        for (step, what, tag) in kind.scripted() {
            let began = Instant::now();
            let (name, ctl) = b.next();
            let before = b.prepare(kind, &name, &ctl).await;
            ctl.hold(what, tag);
            let earlier = ctl.runs(what, tag);
            let id = b.request(kind, &name, &ctl, before.as_ref()).await;
            let at = format!("{kind:?}, the store full in step {step} ({what} of {tag} held)");
            wait_held(&b.env, &ctl, &id, step, what, tag).await;
            fs.fill();
            let (acked, refused) = write_until_refused(&b.env, &name).await;
            ctl.release(what, tag);

            // The operation stops where it is: nothing more is done.
            let halted = format!("operation={id} step={step}");
            let stopped = crate::common::eventually(15, || {
                b.env.master_log().lines().any(|l| l.contains("the journal cannot be written") && l.contains(&halted))
            })
            .await;
            assert!(stopped, "{at}: the operation did not stop at {step}\n{}", b.env.log_tails());
            let op = operation(&b.env, &id).await;
            assert_eq!((op["status"].as_str(), step_status(&op, step).as_str()), (Some("Running"), "Running"), "{at}");
            let c = b.env.cluster(&name).await;
            assert_eq!(c["operation"].as_str(), Some(id.as_str()), "{at}: the cluster is not busy with it: {c:#}");

            stop_master(&mut b.env).await;
            fs.free();
            b.env.start_master_again().await;
            b.env.wait_ready().await;
            let op = b.wait(&id).await;
            assert_eq!(op["status"], "Succeeded", "{at}: {op:#}");
            let names = join_token_names(&b.env).await;
            for a in &acked {
                assert!(names.contains(a), "{at}: the acknowledged join token {a} is lost");
            }
            assert!(!names.contains(&refused), "{at}: the refused join token {refused} is there");
            let runs = ctl.runs(what, tag) - earlier;
            let expected = if matches!(what, "start" | "stop") { 1 } else { 2 };
            assert_eq!(runs, expected, "{at}: {what} of {tag} ran {runs} times: {:?}", ctl.ran());
            let mut all = before.as_ref().map(super::ids).unwrap_or_default();
            all.extend(as_uninterrupted(&b, kind, &name, &ctl, &at).await);
            b.clean(&name, &all).await;
            b.took(format!("{kind:?} {step} ({} writes, then refused)", acked.len()), began);
            count += 1;
        }
    }
    assert_eq!(count, 24);
    b.summary();
    // The master first (it holds files on the tmpfs), then the mount.
    drop(b);
    drop(fs);
}
