//! `flotilla bench failover`: three etcd members and three masters on this
//! machine (`flotilla dev --ha`'s ports and settings: etcd heartbeat 20 ms,
//! election 200 ms, lease TTL 2 s), then the leader is killed again and
//! again, and each time the bench times the leader's `SIGKILL` -> a write
//! accepted by the new leader (its process dead, its machine up: a waiting
//! master sees the port refuse and revokes the lease). Then the leader is
//! paused (`SIGSTOP`, as a machine that vanished: nothing refuses, the
//! lease expires) and the same is timed. Meanwhile readers read every
//! master (the followers from their own view) and a writer writes to the
//! leader: every read that fails on a master that was not the one killed
//! is counted. Before the kills, reads on the leader and on a follower are
//! timed alike. Everything runs on this machine's cores: the three etcd
//! members, the three masters and the bench.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::process::Child;

use super::stats::{Samples, Summary};
use crate::dev::ha::Ha;

#[derive(Debug, Clone, clap::Args)]
pub struct FailoverArgs {
    /// Leader processes killed (`SIGKILL`), one after the other.
    #[arg(long, default_value_t = 100)]
    pub kills: usize,
    /// Leaders paused (`SIGSTOP`: a machine gone), one after the other.
    #[arg(long, default_value_t = 5)]
    pub pauses: usize,
    /// Reads timed on the leader, then on a follower, before the kills.
    #[arg(long, default_value_t = 2000)]
    pub reads: usize,
    /// The leader lease's TTL in seconds (`[etcd] lease_ttl_secs`): how
    /// long a vanished machine keeps its leadership.
    #[arg(long, default_value_t = crate::storage::etcd::EtcdSettings::default().lease_ttl_secs)]
    pub lease_ttl: i64,
    /// How a follower that wins boots (`[etcd] takeover`: view, store or checked).
    #[arg(long, default_value = "view", value_parser = ["view", "store", "checked"])]
    pub takeover: String,
    #[command(flatten)]
    pub load: super::failover_load::LoadArgs,
}

/// The masters and etcd members, stopped however the run ends.
struct Fleet {
    ha: Ha,
    etcd: Vec<(String, Child)>,
    masters: Vec<Option<Child>>,
    exe: std::path::PathBuf,
}

impl Fleet {
    fn respawn(&mut self, i: usize) -> Result<(), String> {
        let child = self.ha.spawn_master(&self.exe, &self.ha.root, i, None).map_err(|e| e.to_string())?;
        self.masters[i] = Some(child);
        Ok(())
    }

    /// Kills everything (a paused master too); the data goes unless
    /// `keep` (a failed run: its logs are there).
    async fn stop(mut self, keep: bool) {
        for m in self.masters.iter_mut().flatten() {
            if let Some(pid) = m.id() {
                let _ =
                    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGCONT);
            }
            let _ = m.kill().await;
        }
        for (_, e) in self.etcd.iter_mut() {
            let _ = e.kill().await;
        }
        if !keep {
            self.ha.remove_data();
        }
    }
}

pub async fn run(a: &FailoverArgs, dir: &Path) -> Result<Value, String> {
    if a.kills + a.pauses == 0 {
        return Err("--kills and --pauses: at least one of them".into());
    }
    let ha = Ha::prepare(dir).map_err(|e| e.to_string())?;
    // Its config ends with the `[etcd]` table.
    let mut config = std::fs::read_to_string(&ha.config).map_err(|e| format!("{}: {e}", ha.config.display()))?;
    config.push_str(&format!("lease_ttl_secs = {}\ntakeover = {:?}\n", a.lease_ttl, a.takeover));
    std::fs::write(&ha.config, config).map_err(|e| format!("{}: {e}", ha.config.display()))?;
    let exe = std::env::current_exe().map_err(|e| format!("finding the flotilla binary: {e}"))?;
    let mut fleet = Fleet { ha, etcd: Vec::new(), masters: Vec::new(), exe };
    let endpoints = dir.join("endpoints.json");
    let _ = std::fs::remove_file(&endpoints);
    let run = async {
        for i in 0..3 {
            fleet.etcd.push((format!("etcd-{i}"), fleet.ha.spawn_etcd(i).map_err(|e| e.to_string())?));
        }
        fleet.ha.wait_etcd(&mut fleet.etcd).await.map_err(|e| e.to_string())?;
        // The first one makes the installation's CA and token (`--init`)
        // and leads; the others start once it listens.
        let first =
            fleet.ha.spawn_master(&fleet.exe, &fleet.ha.root, 0, Some(&endpoints)).map_err(|e| e.to_string())?;
        fleet.masters.push(Some(first));
        let token_file = fleet.ha.root.join("master").join("token");
        let deadline = Instant::now() + Duration::from_secs(60);
        while !endpoints.exists() {
            if Instant::now() > deadline {
                return Err(format!("the first master did not lead within 60 s (see {})", fleet.ha.root.display()));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let token = std::fs::read_to_string(&token_file)
            .map_err(|e| format!("the first master's API token {}: {e}", token_file.display()))?
            .trim()
            .to_string();
        for i in 1..3 {
            let child = fleet.ha.spawn_master(&fleet.exe, &fleet.ha.root, i, None).map_err(|e| e.to_string())?;
            fleet.masters.push(Some(child));
        }
        drive(a, &mut fleet, &token).await
    };
    // Ctrl-C stops the members and masters too (they run in process
    // groups of their own, on fixed ports).
    let result = tokio::select! {
        r = run => r,
        () = crate::shutdown::signal() => Err("interrupted".to_string()),
    };
    let keep = result.is_err();
    if keep {
        eprintln!("flotilla bench failover: the masters' and etcd's data are kept in {}", dir.display());
    }
    fleet.stop(keep).await;
    result
}

fn client(token: &str) -> Result<reqwest::Client, String> {
    let mut headers = reqwest::header::HeaderMap::new();
    let value = format!("Bearer {token}").parse().map_err(|e| format!("the token: {e}"))?;
    headers.insert(reqwest::header::AUTHORIZATION, value);
    reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(2))
        .default_headers(headers)
        .build()
        .map_err(|e| e.to_string())
}

async fn health(c: &reqwest::Client, url: &str) -> Option<Value> {
    c.get(format!("{url}/api/v1/health")).send().await.ok()?.json().await.ok()
}

/// Waits (60 s at most) until one master leads and the other two serve as
/// followers; the leader's index and pid.
async fn settled(c: &reqwest::Client, urls: &[String]) -> Result<(usize, i32), String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut leader = None;
        let mut following = 0;
        for (i, u) in urls.iter().enumerate() {
            match health(c, u).await {
                Some(h) if h["role"] == "leader" => leader = h["pid"].as_i64().map(|p| (i, p as i32)),
                Some(h) if h["role"] == "follower" && h["applied_revision"].as_i64().is_some_and(|r| r > 0) => {
                    following += 1
                }
                _ => {}
            }
        }
        if let (Some(l), 2) = (leader, following) {
            return Ok(l);
        }
        if Instant::now() > deadline {
            return Err("the masters did not settle (one leader, two followers) within 60 s".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// From `since`, the time until a master other than `gone` accepts a
/// write, and which master did.
async fn first_write(
    c: &reqwest::Client,
    urls: &[String],
    gone: usize,
    since: Instant,
    n: usize,
) -> Result<(f64, usize), String> {
    loop {
        for (i, u) in urls.iter().enumerate() {
            if i == gone {
                continue;
            }
            let r = c
                .post(format!("{u}/api/v1/tokens"))
                // Long enough that a write is not timed out here and
                // counted only at a later try.
                .timeout(Duration::from_secs(2))
                .json(&json!({"name": format!("failover-{n}"), "scope": "read"}))
                .send()
                .await;
            if r.is_ok_and(|r| r.status() == reqwest::StatusCode::CREATED) {
                return Ok((since.elapsed().as_secs_f64() * 1000.0, i));
            }
        }
        if since.elapsed() > Duration::from_secs(30) {
            return Err(format!("no master took a write within 30 s of the leader's loss (round {n})"));
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// `n` reads of `GET /clusters` on `url`, one after the other.
async fn time_reads(c: &reqwest::Client, url: &str, n: usize) -> Result<Summary, String> {
    let samples = Samples::default();
    for _ in 0..n {
        let t = Instant::now();
        let r = c.get(format!("{url}/api/v1/clusters")).send().await.map_err(|e| e.to_string())?;
        if !r.status().is_success() {
            return Err(format!("GET {url}/api/v1/clusters: {}", r.status()));
        }
        let _ = r.bytes().await;
        samples.add(t.elapsed());
    }
    Ok(samples.summary())
}

async fn drive(a: &FailoverArgs, fleet: &mut Fleet, token: &str) -> Result<Value, String> {
    let c = client(token)?;
    let urls = Ha::api_urls();
    let (leader, _) = settled(&c, &urls).await?;
    let follower = (leader + 1) % 3;
    let leader_reads = time_reads(&c, &urls[leader], a.reads).await?;
    let follower_reads = time_reads(&c, &urls[follower], a.reads).await?;
    let load = super::failover_load::start(&c, &a.load).await?;

    // Readers on every master all along; a read fails unless its master is
    // the one last killed and not yet back as a serving follower (`down`).
    let stop = Arc::new(AtomicBool::new(false));
    let down = Arc::new(AtomicU64::new(u64::MAX));
    let (reads, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(std::sync::Mutex::new(Vec::<String>::new())));
    let mut readers = Vec::new();
    for (i, url) in urls.iter().cloned().enumerate() {
        let (c, stop, down, reads, failed) = (c.clone(), stop.clone(), down.clone(), reads.clone(), failed.clone());
        readers.push(tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                let r = c.get(format!("{url}/api/v1/clusters")).send().await;
                let ok = matches!(&r, Ok(r) if r.status().is_success());
                if !ok && down.load(Ordering::SeqCst) != i as u64 {
                    let why = match r {
                        Ok(r) => r.status().to_string(),
                        Err(e) => e.to_string(),
                    };
                    failed.lock().unwrap_or_else(|p| p.into_inner()).push(format!("{url}: {why}"));
                }
                reads.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }));
    }
    let (kills, pauses) = (Samples::default(), Samples::default());
    // The new leader's own figure (`took_over` in its health): from its
    // win to serving, and how many booted from their follower's view.
    let (took_over, from_view) = (Samples::default(), AtomicU64::new(0));
    let outcome = async {
        for n in 0..a.kills + a.pauses {
            let (leader, pid) = settled(&c, &urls).await?;
            down.store(leader as u64, Ordering::SeqCst);
            let pid = nix::unistd::Pid::from_raw(pid);
            let pause = n >= a.kills;
            let signal = if pause { nix::sys::signal::Signal::SIGSTOP } else { nix::sys::signal::Signal::SIGKILL };
            let t = Instant::now();
            nix::sys::signal::kill(pid, signal).map_err(|e| format!("signalling the leader: {e}"))?;
            let (ms, next) = first_write(&c, &urls, leader, t, n).await?;
            if let Some(h) = health(&c, &urls[next]).await
                && let Some(took) = h["took_over"]["ms"].as_u64()
            {
                took_over.add(Duration::from_millis(took));
                if h["took_over"]["from"] == "view" {
                    from_view.fetch_add(1, Ordering::Relaxed);
                }
            }
            if pause {
                pauses.add(Duration::from_secs_f64(ms / 1000.0));
                // Woken, it learns it was deposed and exits.
                let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT);
            } else {
                kills.add(Duration::from_secs_f64(ms / 1000.0));
            }
            if let Some(mut child) = fleet.masters[leader].take() {
                let ended = tokio::time::timeout(Duration::from_secs(30), child.wait()).await;
                if ended.is_err() {
                    let _ = child.kill().await;
                }
            }
            // It counts again once it serves as a follower (`settled`).
            fleet.respawn(leader)?;
        }
        settled(&c, &urls).await?;
        Ok::<_, String>(())
    }
    .await;
    stop.store(true, Ordering::SeqCst);
    for r in readers {
        let _ = r.await;
    }
    let load = match load {
        Some(l) => Some(l.stop(&c).await),
        None => None,
    };
    outcome?;
    let failed = failed.lock().unwrap_or_else(|p| p.into_inner()).clone();
    Ok(json!({
        "kills": kills.summary(),
        "pauses": pauses.summary(),
        "lease_ttl_s": a.lease_ttl,
        "leader_read_ms": leader_reads,
        "follower_read_ms": follower_reads,
        "reads_during": reads.load(Ordering::SeqCst),
        "reads_failed": failed.len(),
        "read_failures": failed.iter().take(10).collect::<Vec<_>>(),
        "took_over_ms": took_over.summary(),
        "took_over_from_view": from_view.load(Ordering::Relaxed),
        "load": load,
    }))
}
