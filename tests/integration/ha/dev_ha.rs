//! `flotilla dev --ha`: three etcd members, three masters and the agents,
//! one command; the leader killed, another leads and the CLI follows it,
//! the killed one comes back as a follower; Ctrl-C leaves nothing behind,
//! etcd's data included.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::dev::Dev;

async fn health(url: &str) -> Option<Value> {
    let r = reqwest::Client::new().get(format!("{url}/api/v1/health")).timeout(Duration::from_secs(1)).send().await;
    r.ok()?.json().await.ok()
}

/// The master that leads (its URL and health), waiting up to `within`.
/// (A master killed and restarted by `dev` on its own port may lead again:
/// `not` excludes a process, not a URL.)
async fn leader(dev: &Dev, urls: &[String], within: Duration, not: Option<u64>) -> (String, Value) {
    let deadline = Instant::now() + within;
    loop {
        for u in urls {
            if let Some(h) = health(u).await
                && h["role"] == "leader"
                && h["pid"].as_u64() != not
            {
                return (u.clone(), h);
            }
        }
        assert!(Instant::now() < deadline, "no master leads within {within:?}\n{}", dev.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn dev_ha_runs_three_masters_on_etcd_survives_the_leaders_death_and_leaves_nothing() {
    let _ports = crate::common::dev::HA_PORTS.lock().await;
    let mut dev = Dev::start_ha(2);
    let endpoints: Value = serde_json::from_slice(&std::fs::read(dev.endpoints()).unwrap()).unwrap();
    let urls: Vec<String> =
        endpoints["api_urls"].as_array().expect("api_urls").iter().map(|u| u.as_str().unwrap().to_string()).collect();
    assert_eq!(urls.len(), 3, "{endpoints:#}");
    let (first, h) = leader(&dev, &urls, Duration::from_secs(10), None).await;
    let mut roles = Vec::new();
    for u in &urls {
        roles.push(health(u).await.map(|h| h["role"].clone()));
    }
    assert_eq!(roles.iter().filter(|r| r.as_ref().is_some_and(|r| r == "leader")).count(), 1, "{roles:?}");
    dev.ok(&["cluster", "create", "demo", "--package", "web:1.0.0", "--role", "server=2"]);
    let c = dev.cluster("demo");
    assert_eq!(c["status"], "Active", "{c:#}");

    let pid = h["pid"].as_u64().expect("pid") as i32;
    let killed = Instant::now();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL).unwrap();
    let (next, h2) = leader(&dev, &urls, Duration::from_secs(15), h["pid"].as_u64()).await;
    assert!(h2["term"].as_i64() > h["term"].as_i64(), "{h:#}\n{h2:#}");
    assert!(killed.elapsed() < Duration::from_secs(8), "a new leader after {:?}", killed.elapsed());
    // The CLI (endpoints.json's api_urls) finds it; the cluster is there,
    // and the agents follow it.
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let (code, out, _) = dev.run(&["node", "ls", "--json"], &[]);
        if code == 0 && out.matches("\"Ready\"").count() == 2 {
            break;
        }
        assert!(Instant::now() < deadline, "the agents did not follow the new leader {next}: {out}\n{}", dev.log());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(dev.cluster("demo")["status"], "Active");
    // The killed master is back (a new process on its port), waiting, or
    // leading if it won the campaign.
    let deadline = Instant::now() + Duration::from_secs(20);
    while health(&first).await.is_none_or(|h| h["pid"] == pid || (next != first && h["role"] != "follower")) {
        assert!(Instant::now() < deadline, "the killed master did not come back as a follower\n{}", dev.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let status = dev.interrupt();
    assert!(status.success(), "flotilla dev --ha exited {status}\n{}", dev.log());
    let ha_dir = dev.dir.path().join("ha");
    assert!(!ha_dir.exists(), "the masters', agents' and etcd's data is left at {}", ha_dir.display());
    let left: Vec<u32> = crate::common::procfs::all_pids()
        .into_iter()
        .filter(|p| {
            std::fs::read(format!("/proc/{p}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(&*dev.dir.path().to_string_lossy()))
        })
        .collect();
    assert!(left.is_empty(), "processes of the dev env still run: {left:?}");
}
