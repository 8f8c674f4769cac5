//! The leader partitioned from etcd, for real: master 0 runs in a network
//! namespace the test makes, reaching etcd through one veth pair and the
//! agents, the other masters and the test through another; the cut sets
//! the etcd pair's host end down (every packet lost, no RST or FIN). It
//! must stop commanding before its lease can expire and before any other
//! master leads (its health says `suspended`); a follower takes over, and
//! the agents reach it once the old leader lets them go; the old leader's writes are refused
//! meanwhile and land nowhere; on the heal etcd tells it its lease is
//! gone and it exits with that cause; started again (as systemd would) it
//! comes back as a follower. Every instance runs once throughout.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};

use super::create_mr;
use crate::common::env::{client_with_token, etcd_config};
use crate::common::etcd::EtcdCluster;
use crate::common::ha_env::HaLayout;
use crate::common::netns::Netns;
use crate::common::{TestEnv, all_instances, id_of, instance_pids, pid_of};

/// The lease TTL the masters run with (`[etcd] lease_ttl_secs`, default).
const TTL: Duration = Duration::from_secs(2);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_off_from_etcd_stops_commanding_in_time_a_follower_leads_and_it_comes_back_following() {
    // Link 0: the API, the agents and the other masters; link 1: etcd.
    let mut ns = Netns::make();
    ns.link();
    let k = std::process::id() % 200 + 1;
    // The other masters and the agents on host addresses the namespace
    // reaches (an agent dials from its own address).
    let others: Vec<String> = (1..=2).map(|i| format!("10.250.{k}.{i}")).collect();
    let agents: Vec<String> = (1..=3).map(|i| format!("10.250.{k}.{}", 10 + i)).collect();
    for a in others.iter().chain(&agents) {
        ns.reach_host_addr(a);
    }
    let etcd = EtcdCluster::start_also_on(3, Some(&ns.links[1].host_ip));
    let name = "ha-part";
    let config = etcd_config(name, &etcd);
    let through_ns: Vec<String> = etcd.endpoints_on().iter().map(|e| format!("{e:?}")).collect();
    let first = format!("store = \"etcd\"\n\n[etcd]\nendpoints = [{}]\nprefix = \"/{name}/\"\n", through_ns.join(", "));
    let mut addrs = vec![(format!("{}:7070", ns.ns_ip()), format!("{}:7071", ns.ns_ip()))];
    addrs.extend(others.iter().map(|o| (format!("{o}:7070"), format!("{o}:7071"))));
    let layout =
        HaLayout { addrs, netns: Some(ns.name.clone()), first_config: Some(first), agent_ips: Some(agents.clone()) };
    let mut env = TestEnv::start_ha_laid_out(name, &config, 3, Some(layout)).await;
    let (leader, h0) = env.follow_leader(None, Duration::from_secs(10)).await;
    assert_eq!(leader, 0, "master 0 started first and leads: {h0:#}");
    let term0 = h0["term"].as_i64().expect("term");
    for i in 1..=2 {
        env.serving_follower(i).await;
    }
    create_mr(&env, 3).await;
    let before = one_process_each(&env).await;

    // Cut: master 0 suspends itself before its lease can expire, and
    // before anyone else leads.
    let cut = Instant::now();
    ns.cut_link(1);
    let (mut suspended_at, mut led_at) = (None, None);
    let mut new_leader = None;
    while led_at.is_none() || suspended_at.is_none() {
        assert!(cut.elapsed() < Duration::from_secs(30), "no takeover within 30 s\n{}", env.log_tails());
        if suspended_at.is_none()
            && let Some(h) = env.ha_health(0).await
        {
            assert_eq!(h["role"], "leader", "{h:#}");
            if h["suspended"] == true {
                suspended_at = Some(cut.elapsed());
            }
        }
        for i in 1..=2 {
            if led_at.is_none()
                && let Some(h) = env.ha_health(i).await
                && h["role"] == "leader"
            {
                led_at = Some(cut.elapsed());
                new_leader = Some((i, h));
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (suspended_at, led_at) = (suspended_at.unwrap(), led_at.unwrap());
    // Suspended at 0.9 TTL after its last renewal was sent, which was at
    // most a third of the TTL before the cut (plus this loop's polling, up
    // to a second per master that is slow to answer).
    assert!(suspended_at < TTL + Duration::from_secs(1), "suspended {suspended_at:?} after the cut (TTL {TTL:?})");
    assert!(suspended_at < led_at, "suspended at {suspended_at:?}, but another master led at {led_at:?}");
    let (now, h1) = new_leader.unwrap();
    let term1 = h1["term"].as_i64().expect("term");
    assert!(term1 > term0, "the new term {term1} is above {term0}");

    // The old leader's writes are refused (it cannot reach etcd, and the
    // fence refuses them once it can), and land nowhere.
    let client = client_with_token(&env.token);
    let r = client
        .post(format!("{}/tokens", env.ha_api(0)))
        .json(&json!({"name": "written-while-cut"}))
        .timeout(Duration::from_secs(30))
        .send()
        .await;
    let refused = match r {
        Ok(r) => {
            assert!(!r.status().is_success(), "the cut-off leader accepted a write: {}", r.status());
            r.status().to_string()
        }
        Err(e) => e.to_string(),
    };
    eprintln!(
        "partition: suspended {suspended_at:?}, master {now} led {led_at:?} after the cut; the old leader's write: {refused}"
    );

    // The agents reach the new leader (the old one lets them go once it
    // has been suspended for as long as a command waits, 10 s); the
    // cluster runs there as before.
    env.api = env.ha_api(now);
    env.wait_ready().await;
    let log0 = env.ha_log(0);
    assert!(log0.contains("agents' links are closed"), "the suspended leader kept its agents\n{log0}");
    let (status, c) = env.get("/clusters/mr").await;
    assert_eq!(status, StatusCode::OK, "{c:#}");

    // Healed: etcd tells the old leader its lease is gone; it exits with
    // that cause, and started again it follows.
    ns.heal_link(1);
    super::exits_saying_why(&mut env, 0, Duration::from_secs(30), "the old leader, healed").await;
    env.respawn_ha(0);
    let h = env.serving_follower(0).await;
    assert_eq!(h["term"].as_i64(), Some(term1), "{h:#}");
    let (_, tokens) = env.get("/tokens").await;
    assert!(!tokens.to_string().contains("written-while-cut"), "a write of the cut-off leader landed: {tokens:#}");

    // Nothing was started twice or stopped: the same processes throughout.
    let after = one_process_each(&env).await;
    assert_eq!(after, before, "the instances' processes changed across the partition");
    let (still, h) = env.leader_within(Duration::from_secs(5)).await;
    assert_eq!((still, h["term"].as_i64()), (now, Some(term1)), "{h:#}");
}

/// Each instance of `mr` with its one process (the pid the leader shows,
/// and the only one carrying its marker).
async fn one_process_each(env: &TestEnv) -> Vec<(String, u32)> {
    let c: Value = env.cluster("mr").await;
    let members = all_instances(&c);
    assert_eq!(members.len(), 3, "{c:#}");
    let mut out: Vec<(String, u32)> = members.iter().map(|m| (id_of(m), pid_of(m))).collect();
    for (id, pid) in &out {
        assert_eq!(instance_pids(id), vec![*pid], "{id}: exactly the one process the master shows");
    }
    out.sort();
    out
}
