//! `flotilla bench pools`: node requests served by a pool of the `sim`
//! driver (`providers::sim`: a simulated cloud whose creates take a random
//! time in `--create-ms`). This process plays the machines: for each
//! machine the master's driver writes into the spool, it starts a
//! simulated agent (the real protocol and TLS enrollment, no real
//! processes) with that machine's join token, on threads of its own at
//! nice +10. Figures: requests fulfilled per second, the time from a
//! request's filing to its node being ready (p50/p99, from the master's
//! own timestamps), and the master's CPU per launch (the master is a child
//! process; the simulated machines run in this one).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::{Value, json};
use time::OffsetDateTime;
use tokio::sync::watch;

use super::client::Api;
use super::master_proc::MasterProc;
use super::sim::{Latency, SimAgent, address};
use super::stats::{Summary, round};
use crate::ids::NodeId;
use crate::providers::sim::SimMachine;

#[derive(Debug, Clone, clap::Args)]
pub struct PoolsArgs {
    /// Node requests filed, one node each (the pool holds as many).
    #[arg(long, default_value_t = 1000)]
    pub requests: usize,
    /// How long a simulated create takes, LOW-HIGH ms (uniform).
    #[arg(long, default_value = "1000-5000")]
    pub create_ms: String,
    /// Requests filed at once.
    #[arg(long, default_value_t = 50)]
    pub clients: usize,
}

/// Runs it on a fresh master in `dir`; the figures.
pub async fn run(p: &PoolsArgs, dir: &Path) -> Result<Value, String> {
    if p.requests == 0 || p.requests > 10_000 {
        return Err("--requests must be 1..=10000".into());
    }
    let spool = dir.join("spool");
    std::fs::create_dir_all(&spool).map_err(|e| format!("{}: {e}", spool.display()))?;
    let config = dir.join("master.toml");
    let text = format!(
        "[[node_pools]]\nname = \"sim\"\ndriver = \"sim\"\nmax_nodes = {}\nlaunch_timeout = \"60s\"\nenroll_timeout = \"120s\"\n\
         [node_pools.settings]\nspool = {:?}\ncreate_ms = {:?}\n",
        p.requests,
        spool.display().to_string(),
        p.create_ms
    );
    std::fs::write(&config, text).map_err(|e| format!("{}: {e}", config.display()))?;
    let master = MasterProc::spawn_with_config(&dir.join("master"), &[], Some(&config)).await?;
    let api = Api::new(&master.api, master.token.clone())?;
    let machines = Machines::start(spool.clone())?;
    let result = drive(p, &api, &master).await;
    machines.stop().await;
    master.stop().await;
    result
}

async fn drive(p: &PoolsArgs, api: &Api, master: &MasterProc) -> Result<Value, String> {
    let cpu_before = master.usage().map(|u| u.1).unwrap_or(0.0);
    let started = Instant::now();
    let filed: Vec<Result<String, String>> = futures::stream::iter(0..p.requests)
        .map(|_| async {
            let v = api
                .post("/node-requests", &json!({"labels": {}, "count": 1}))
                .await
                .map_err(|e| format!("{}: {}", e.path, e.detail))?;
            v["id"].as_str().map(String::from).ok_or_else(|| format!("no id in {v}"))
        })
        .buffer_unordered(p.clients.max(1))
        .collect()
        .await;
    let ids: BTreeSet<String> = filed.into_iter().collect::<Result<_, _>>()?;
    let filing_secs = started.elapsed().as_secs_f64();
    // Until every request is done (the slowest create plus enrollment,
    // with room for a loaded machine).
    let deadline = Instant::now() + Duration::from_secs(600);
    let done = loop {
        let all = all_requests(api).await?;
        let ours: Vec<&Value> = all.iter().filter(|r| r["id"].as_str().is_some_and(|id| ids.contains(id))).collect();
        let finished = ours.iter().filter(|r| r["state"] == "fulfilled" || r["state"] == "failed").count();
        if finished == ids.len() {
            break ours.into_iter().cloned().collect::<Vec<_>>();
        }
        if Instant::now() > deadline {
            return Err(format!("{finished} of {} requests done after 600 s", ids.len()));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let secs = started.elapsed().as_secs_f64();
    let cpu = master.usage().map(|u| u.1).unwrap_or(0.0) - cpu_before;
    let at = |r: &Value, k: &str| {
        r[k].as_str().and_then(|t| OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339).ok())
    };
    let mut latencies: Vec<f64> = done
        .iter()
        .filter(|r| r["state"] == "fulfilled")
        .filter_map(|r| Some((at(r, "updated_at")? - at(r, "created_at")?).as_seconds_f64() * 1000.0))
        .collect();
    latencies.sort_by(|a, b| a.total_cmp(b));
    let fulfilled = latencies.len();
    let lat = Summary::of(&latencies);
    let (lo, hi) = parse_range(&p.create_ms)?;
    Ok(json!({
        "requests": ids.len(),
        "fulfilled": fulfilled,
        "failed": ids.len() - fulfilled,
        "create_ms": [lo, hi],
        "filing_secs": round(filing_secs),
        "secs": round(secs),
        "fulfilled_per_s": round(fulfilled as f64 / secs),
        // All launched at once: the create time itself bounds the rate.
        "ceiling_per_s": round(ids.len() as f64 / (hi as f64 / 1000.0)),
        "request_to_ready_ms": {"p50": lat.p50, "p99": lat.p99, "max": lat.max},
        "mean_create_ms": (lo + hi) / 2,
        "master_cpu_ms_per_launch": round(cpu * 1000.0 / ids.len() as f64),
        "master_cpu_secs": round(cpu),
    }))
}

fn parse_range(s: &str) -> Result<(u64, u64), String> {
    s.split_once('-')
        .and_then(|(a, b)| Some((a.trim().parse().ok()?, b.trim().parse().ok()?)))
        .filter(|(a, b)| a <= b)
        .ok_or_else(|| format!("--create-ms {s:?}: expected LOW-HIGH in ms"))
}

/// Every node request, newest first, page by page.
async fn all_requests(api: &Api) -> Result<Vec<Value>, String> {
    let mut out = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let path = match &after {
            Some(a) => format!("/node-requests?limit=1000&after={a}"),
            None => "/node-requests?limit=1000".to_string(),
        };
        let v = api.get(&path).await.map_err(|e| format!("{}: {}", e.path, e.detail))?;
        out.extend(v["node_requests"].as_array().cloned().unwrap_or_default());
        match v["next"].as_str() {
            Some(n) => after = Some(n.to_string()),
            None => return Ok(out),
        }
    }
}

/// The simulated machines: a simulated agent for each file in the spool,
/// stopped when its file goes.
struct Machines {
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl Machines {
    fn start(spool: std::path::PathBuf) -> Result<Machines, String> {
        let nice = crate::thread_nice::current_lowered(10).map_err(|e| e.to_string())?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("sim-machines")
            .on_thread_start(move || {
                let _ = crate::thread_nice::set_current_for_good(nice);
            })
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        let (stop, stopped) = watch::channel(false);
        let handle = runtime.handle().clone();
        let task = runtime.spawn(watch_spool(spool, stopped, handle));
        Ok(Machines { stop, task, runtime: Some(runtime) })
    }

    async fn stop(mut self) {
        let _ = self.stop.send(true);
        let _ = (&mut self.task).await;
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

async fn watch_spool(spool: std::path::PathBuf, mut stopped: watch::Receiver<bool>, rt: tokio::runtime::Handle) {
    let mut running: BTreeMap<String, watch::Sender<bool>> = BTreeMap::new();
    let mut n = 0usize;
    loop {
        let mut seen = BTreeSet::new();
        if let Ok(dir) = std::fs::read_dir(&spool) {
            for e in dir.flatten() {
                let name = e.file_name().to_string_lossy().to_string();
                let Some(id) = name.strip_suffix(".json") else { continue };
                seen.insert(id.to_string());
                if running.contains_key(id) {
                    continue;
                }
                let Ok(m) = std::fs::read(e.path()).and_then(|b| Ok(serde_json::from_slice::<SimMachine>(&b)?)) else {
                    continue;
                };
                let agent = SimAgent::new(NodeId::new(m.node), address(n), (20000, 29999), Latency::default());
                n += 1;
                let (tx, rx) = watch::channel(false);
                rt.spawn(agent.serve(
                    crate::agent::masters::Masters::one(m.master_addr),
                    Arc::from(m.join_token.as_str()),
                    rx,
                ));
                running.insert(id.to_string(), tx);
            }
        }
        running.retain(|id, tx| {
            let keep = seen.contains(id);
            if !keep {
                let _ = tx.send(true);
            }
            keep
        });
        tokio::select! {
            _ = stopped.changed() => break,
            _ = tokio::time::sleep(Duration::from_millis(50)) => {}
        }
    }
    for tx in running.values() {
        let _ = tx.send(true);
    }
}
