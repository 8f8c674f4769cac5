//! A master past its bounds: a full mailbox or store queue answers `503
//! overloaded` with `Retry-After` before anything of the request happened,
//! and nothing it acknowledged (202) is lost, across a restart too; a burst
//! of agent reports that a small cluster mailbox cannot take is not lost
//! either (the agent sends each report again until it is applied).

use std::collections::BTreeMap;

use futures::future::join_all;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::common::http::error_code;
use crate::common::{TestEnv, all_instances, id_of, sim};

/// What the master answered one of the concurrent requests.
struct Answer {
    what: String,
    /// The cluster it creates or scales.
    cluster: String,
    status: StatusCode,
    retry_after: Option<String>,
    body: Value,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overload_answers_503_with_retry_after_and_loses_nothing_acknowledged() {
    let env = [("FLOTILLA_MASTER_MAILBOX_CAPACITY", "1"), ("FLOTILLA_MASTER_WRITER_QUEUE", "1")];
    let mut env = TestEnv::start_sim("overload", &env, 2).await;
    env.upload(&sim::package("svc", "1.0.0", 50)).await;
    let pkg = json!({"name": "svc", "version": "1.0.0"});
    // Set up under the same tight bounds, where the master's own writes
    // (events of nodes and actors) can fill the one-request store queue:
    // retried while it answers 503, as a client would.
    let base = json!({"name": "base", "package": pkg, "roles": {"d": {"count": 2}}});
    let op = loop {
        let (status, _, body) = env.post_full("/clusters", base.clone()).await;
        if status == StatusCode::SERVICE_UNAVAILABLE && error_code(&body) == "overloaded" {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            continue;
        }
        assert_eq!(status, StatusCode::ACCEPTED, "{body:#}");
        break body["operation"].clone();
    };
    assert_eq!(env.wait_op(op["id"].as_str().unwrap()).await["status"], "Succeeded");

    // 30 creates of distinct clusters and 10 scale-outs of one, all at once.
    let creates = (0..30).map(|i| {
        let (env, name) = (&env, format!("c{i}"));
        let body = json!({"name": name, "package": pkg, "roles": {"d": {"count": 3}}});
        async move { (format!("create {name}"), name, env.post_full("/clusters", body).await) }
    });
    let scales = (0..10).map(|i| {
        let env = &env;
        async move {
            let r = env.post_full("/clusters/base/scale", json!({"role": "d", "add": 1})).await;
            (format!("scale #{i}"), "base".to_string(), r)
        }
    });
    let (created, scaled) = tokio::join!(join_all(creates), join_all(scales));
    let answers: Vec<Answer> = created
        .into_iter()
        .chain(scaled)
        .map(|(what, cluster, (status, headers, body))| Answer {
            what,
            cluster,
            status,
            retry_after: headers.get("retry-after").and_then(|v| v.to_str().ok()).map(String::from),
            body,
        })
        .collect();

    let mut overloaded = 0;
    let mut acknowledged: Vec<(&Answer, String)> = Vec::new();
    for a in &answers {
        match a.status {
            StatusCode::ACCEPTED => acknowledged.push((a, a.body["operation"]["id"].as_str().unwrap().to_string())),
            StatusCode::SERVICE_UNAVAILABLE => {
                assert_eq!(error_code(&a.body), "overloaded", "{}: {:#}", a.what, a.body);
                let secs = a.retry_after.as_deref().and_then(|s| s.parse::<u64>().ok());
                assert!(
                    secs.is_some_and(|s| s >= 1),
                    "{}: 503 without a Retry-After in seconds: {:?}",
                    a.what,
                    a.retry_after
                );
                overloaded += 1;
            }
            // Scales of one cluster: one runs, the others find it busy.
            StatusCode::CONFLICT if a.cluster == "base" && error_code(&a.body) == "cluster_busy" => {}
            other => panic!("{}: unexpected answer {other}: {:#}\n{}", a.what, a.body, env.log_tails()),
        }
    }
    let summary: Vec<String> = answers.iter().map(|a| format!("{}: {}", a.what, a.status.as_u16())).collect();
    assert!(overloaded > 0, "no request was refused 503 with a mailbox and a store queue of 1: {summary:?}");
    assert!(!acknowledged.is_empty(), "every request was refused: {summary:?}");

    // Every acknowledged operation ends Succeeded; every refused create left nothing.
    for (a, id) in &acknowledged {
        let op = env.wait_op(id).await;
        assert_eq!(op["status"], "Succeeded", "{}: {op:#}\n{}", a.what, env.log_tails());
    }
    let scales_done = acknowledged.iter().filter(|(a, _)| a.cluster == "base").count();
    let check = async |env: &TestEnv, when: &str| {
        for (a, id) in &acknowledged {
            let c = env.cluster(&a.cluster).await;
            assert_eq!(c["status"], "Active", "{when}: {}: {c:#}", a.what);
            let (status, op) = env.get(&format!("/operations/{id}")).await;
            assert_eq!(status, StatusCode::OK, "{when}: {}: operation {id} is gone: {op:#}", a.what);
            assert_eq!(op["operation"]["status"], "Succeeded", "{when}: {}: {op:#}", a.what);
        }
        for a in answers.iter().filter(|a| a.status == StatusCode::SERVICE_UNAVAILABLE && a.cluster != "base") {
            let (status, body) = env.get(&format!("/clusters/{}", a.cluster)).await;
            assert_eq!(status, StatusCode::NOT_FOUND, "{when}: {} was refused 503, yet: {body:#}", a.what);
        }
        let base = env.cluster("base").await;
        assert_eq!(base["roles"]["d"]["count"], 2 + scales_done, "{when}: {base:#}");
        assert_eq!(all_instances(&base).len(), 2 + scales_done, "{when}: {base:#}");
    };
    check(&env, "before the restart").await;
    env.restart_master().await;
    check(&env, "after a master restart").await;
    eprintln!("overload: {overloaded} of {} answered 503, {} acknowledged", answers.len(), acknowledged.len());
}

/// A pid the API shows for each instance, by id.
fn pids(cluster: &Value) -> BTreeMap<String, Option<u64>> {
    all_instances(cluster).iter().map(|i| (id_of(i), i["pid"].as_u64())).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_crash_reports_is_applied_whole_despite_a_small_mailbox() {
    const N: usize = 1000;
    let env = TestEnv::start_sim("reports", &[("FLOTILLA_MASTER_MAILBOX_CAPACITY", "8")], 2).await;
    env.upload(&sim::package("svc", "1.0.0", N as u32)).await;
    let body = json!({"name": "burst", "package": {"name": "svc", "version": "1.0.0"}, "roles": {"d": {"count": N}}});
    let before = pids(&env.create_active(body).await);
    assert_eq!(before.len(), N);
    assert!(before.values().all(Option::is_some), "{before:?}");

    // Every instance crashes at once; each agent restarts its own and
    // reports both the exit and the restart (2,000 reports).
    let fleet = env.fleet();
    let mut crashed = 0;
    for agent in &fleet.agents {
        let ids: Vec<_> = agent.state.lock().unwrap().instances.keys().cloned().collect();
        crashed += ids.iter().filter(|id| agent.crash(id, true)).count();
    }
    assert_eq!(crashed, N, "every instance ran on a simulated agent");

    // The pid each agent holds now: what the API must come to show.
    let truth = || {
        let mut m = BTreeMap::new();
        for agent in &fleet.agents {
            for (id, i) in agent.state.lock().unwrap().instances.iter() {
                m.insert(id.to_string(), i.pid.map(u64::from));
            }
        }
        m
    };
    let started = std::time::Instant::now();
    env.until(40, "every crash and restart applied", async || {
        let c = env.cluster("burst").await;
        let want = truth();
        let behind: Vec<String> = all_instances(&c)
            .iter()
            .filter(|i| {
                let (id, pid) = (id_of(i), i["pid"].as_u64());
                i["status"] != "Running" || pid == before[&id] || pid != want[&id]
            })
            .map(|i| format!("{} {} pid {} (agent: {:?})", i["id"], i["status"], i["pid"], want[&id_of(i)]))
            .collect();
        if behind.is_empty() && c["status"] == "Active" {
            Ok(())
        } else {
            let some = &behind[..behind.len().min(5)];
            Err(format!(
                "cluster {}; {} of {N} instances not shown restarted, e.g. {some:?}",
                c["status"],
                behind.len()
            ))
        }
    })
    .await;
    eprintln!("reports: every restart applied {:?} after the crash", started.elapsed());
}
