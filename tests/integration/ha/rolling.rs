//! A rolling restart of all three masters (followers first, then the
//! leader in the middle of a scale-out), each stopped with SIGTERM and
//! started again, while a writer writes without pause: no acknowledged
//! write is lost, the scale-out ends on the next leader, and each member
//! runs once.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use nix::sys::signal::Signal;
use reqwest::StatusCode;
use serde_json::{Value, json};

use super::super::master_restart::slow_scale_out_under_way;
use crate::common::etcd::EtcdCluster;
use crate::common::{TestEnv, all_instances, id_of, instance_pids, pid_of};

/// Writes one token on whichever master leads; its name once acknowledged.
async fn write_one(client: &reqwest::Client, apis: &[String], name: &str) -> Option<String> {
    for api in apis {
        let r = client
            .post(format!("{api}/tokens"))
            .timeout(Duration::from_secs(5))
            .json(&json!({"name": name, "scope": "read"}))
            .send()
            .await;
        if r.is_ok_and(|r| r.status() == StatusCode::CREATED) {
            return Some(name.to_string());
        }
    }
    None
}

#[tokio::test]
async fn a_rolling_restart_of_every_master_under_load_loses_no_write_and_strands_no_operation() {
    let etcd = EtcdCluster::start(3);
    let mut env = TestEnv::start_ha_serving("ha-rolling", &etcd, 3).await;

    // The writer: tokens w-0, w-1, ... on whichever master takes them (a
    // client without redirects: followers answer 307, a master starting
    // 503); each name kept once acknowledged.
    let apis: Vec<String> = (0..3).map(|i| env.ha_api(i)).collect();
    let client = {
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert(reqwest::header::AUTHORIZATION, format!("Bearer {}", env.token).parse().unwrap());
        reqwest::Client::builder()
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .default_headers(headers)
            .build()
            .unwrap()
    };
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (client, apis, stop) = (client.clone(), apis.clone(), stop.clone());
        tokio::spawn(async move {
            let mut acked = Vec::new();
            let mut n = 0;
            while !stop.load(Ordering::SeqCst) {
                if let Some(name) = write_one(&client, &apis, &format!("w-{n}")).await {
                    acked.push(name);
                    n += 1;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            acked
        })
    };
    let mut op = None;
    for i in [1, 2, 0] {
        if i == 0 {
            // The leader goes in the middle of a scale-out (its new
            // members started, their health checks not yet passing).
            let id = slow_scale_out_under_way(&env, "slow").await;
            let (_, now) = env.get(&format!("/operations/{id}")).await;
            assert_eq!(
                now["operation"]["status"], "Running",
                "the scale-out ended before the leader's restart: {now:#}"
            );
            op = Some(id);
        }
        env.signal_ha(i, Signal::SIGTERM);
        let exit = env.ha_exit_within(i, Duration::from_secs(30)).await;
        assert!(exit.is_some(), "master {i} did not stop on SIGTERM\n{}", env.ha_log(i));
        env.respawn_ha(i);
        // Back: serving as a follower (or leading, if it won).
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let h = env.ha_health(i).await;
            let back = h.as_ref().is_some_and(|h| {
                h["role"] == "leader" || (h["role"] == "follower" && h["applied_revision"].as_i64() > Some(0))
            });
            if back {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "master {i} did not come back\n{}", env.ha_log(i));
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    env.follow_leader(None, Duration::from_secs(20)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::SeqCst);
    let acked = writer.await.unwrap();
    assert!(acked.len() > 20, "too few writes to tell: {}", acked.len());

    // No acknowledged write lost.
    let (_, tokens) = env.get("/tokens").await;
    let names: Vec<&str> = tokens["tokens"].as_array().unwrap().iter().filter_map(|t| t["name"].as_str()).collect();
    let lost: Vec<&String> = acked.iter().filter(|a| !names.contains(&a.as_str())).collect();
    assert!(lost.is_empty(), "{} acknowledged writes lost: {lost:?}", lost.len());

    // The scale-out ends on the next leader; each member runs once (one
    // process tree, the one the API shows).
    env.wait_ready().await;
    let done: Value = env.wait_op(&op.expect("the scale-out")).await;
    env.assert_succeeded(&done);
    let c = env.cluster("slow").await;
    let members = all_instances(&c);
    assert_eq!(members.len(), 4, "{c:#}");
    for m in &members {
        assert_eq!(m["status"], "Running", "{m:#}");
        assert_eq!(instance_pids(&id_of(m)), vec![pid_of(m)], "{} runs another or a second process tree", id_of(m));
    }
}
