//! The load `flotilla bench failover` can run its kills under (`--agents
//! N --instances M`): simulated agents that know all three masters (they
//! find the leader as real agents do, and dial the next one after a
//! failover), clusters of the bench package holding `M` simulated
//! instances (1,000 per cluster), and `--clients` clients that scale them
//! out by `--step` instances at a time on whichever master leads, each
//! operation followed to its end on any master (followers answer its long
//! poll). Every operation a master accepted must end `Succeeded`, through
//! every kill: the new leader resumes it from the journal.
//!
//! A client looks the leader up again when its master refuses the
//! connection, redirects (`307`) or is between leaders (`503`). A write
//! whose answer was lost (the leader killed after it was sent) is not sent
//! again: it may have landed; it is counted apart.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::sim::{Fleet, FleetConfig, Latency};
use super::stats::Samples;
use crate::dev::ha::Ha;

#[derive(Debug, Clone, clap::Args)]
pub struct LoadArgs {
    /// Simulated agents connected through the kills (0: no load).
    #[arg(long, default_value_t = 0)]
    pub agents: usize,
    /// Simulated instances placed on them before the kills, 1,000 per cluster.
    #[arg(long, default_value_t = 0)]
    pub instances: usize,
    /// Clients scaling clusters out through the kills, one operation each at a time.
    #[arg(long, default_value_t = 4)]
    pub clients: usize,
    /// Instances each scale-out adds.
    #[arg(long, default_value_t = 10)]
    pub step: usize,
}

/// Instances per cluster.
const PER_CLUSTER: usize = 1000;

/// The role's `count.max` (the most a spec allows): room for 900
/// scale-outs of 10 per cluster.
const MAX_COUNT: u32 = 10_000;

/// Node ids of the simulated agents start with it.
const PREFIX: &str = "fo-";

/// How long a write looks for a leader that takes it.
const WRITE_WITHIN: Duration = Duration::from_secs(60);

/// How long an operation may take to end (a failover or two included).
const OP_WITHIN: Duration = Duration::from_secs(600);

/// What the clients saw.
#[derive(Default)]
struct Counts {
    accepted: AtomicU64,
    succeeded: AtomicU64,
    /// Operations that ended otherwise, and writes refused for good.
    failures: std::sync::Mutex<Vec<String>>,
    /// Writes sent to a leader killed before it answered.
    answers_lost: AtomicU64,
    /// Times a write went to another master (refused, redirected, `503`).
    looked_again: AtomicU64,
    /// Times a write found its cluster busy (with an operation whose
    /// acceptance was lost) and waited.
    waited_busy: AtomicU64,
    /// Accepted -> ended `Succeeded`.
    ops: Samples,
}

impl Counts {
    fn fail(&self, why: String) {
        self.failures.lock().unwrap_or_else(|p| p.into_inner()).push(why);
    }
}

/// The fleet and the clients, running.
pub struct Load {
    fleet: Fleet,
    stop: Arc<AtomicBool>,
    clients: Vec<tokio::task::JoinHandle<()>>,
    counts: Arc<Counts>,
    args: LoadArgs,
    /// Clients that ran (no more than clusters: one operation at a time on each).
    running: usize,
}

/// Why a write did not go through.
enum WriteError {
    /// Sent, and its master died before answering: it may have landed.
    Lost,
    Failed(String),
}

/// Sends a write to whichever master takes it (see the module doc).
async fn write(
    c: &reqwest::Client,
    urls: &[String],
    method: &str,
    path: &str,
    body: &Value,
    counts: &Counts,
) -> Result<Value, WriteError> {
    let deadline = Instant::now() + WRITE_WITHIN;
    let mut at = 0;
    loop {
        let url = format!("{}/api/v1{path}", urls[at % urls.len()]);
        let req = if method == "PUT" { c.put(&url) } else { c.post(&url) };
        match req.timeout(Duration::from_secs(30)).json(body).send().await {
            Ok(r) if r.status().is_success() => {
                return r.json().await.map_err(|e| WriteError::Failed(format!("{method} {path}: {e}")));
            }
            Ok(r) if r.status().is_redirection() => {
                let to = r.headers().get("location").and_then(|l| l.to_str().ok()).unwrap_or_default().to_string();
                at = urls.iter().position(|u| to.starts_with(u.as_str())).unwrap_or(at + 1);
            }
            Ok(r) if r.status() == reqwest::StatusCode::SERVICE_UNAVAILABLE => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Ok(r) => {
                let status = r.status();
                let text = r.text().await.unwrap_or_default();
                // Busy with an operation whose acceptance was lost in a
                // kill: this write waits for it to end.
                if status != reqwest::StatusCode::CONFLICT || !text.contains("cluster_busy") {
                    return Err(WriteError::Failed(format!("{method} {path}: {status} {text}")));
                }
                counts.waited_busy.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(100)).await;
                if Instant::now() > deadline + OP_WITHIN {
                    return Err(WriteError::Failed(format!("{method} {path}: {status} {text}")));
                }
                continue;
            }
            Err(e) if e.is_connect() => at += 1,
            Err(_) => return Err(WriteError::Lost),
        }
        counts.looked_again.fetch_add(1, Ordering::Relaxed);
        if Instant::now() > deadline {
            return Err(WriteError::Failed(format!("{method} {path}: no master took it within {WRITE_WITHIN:?}")));
        }
    }
}

/// Follows operation `id` on any master until it ends; the ended operation.
async fn ended(c: &reqwest::Client, urls: &[String], id: &str) -> Result<Value, String> {
    let deadline = Instant::now() + OP_WITHIN;
    let mut at = 0;
    loop {
        let url = format!("{}/api/v1/operations/{id}?wait=20", urls[at % urls.len()]);
        let got = c.get(&url).timeout(Duration::from_secs(30)).send().await;
        match got {
            Ok(r) if r.status().is_success() => {
                let op = r.json::<Value>().await.map_err(|e| e.to_string())?["operation"].clone();
                if !matches!(op["status"].as_str().unwrap_or_default(), "Pending" | "Running") {
                    return Ok(op);
                }
            }
            // Its master is gone or between roles: another one answers.
            _ => {
                at += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        if Instant::now() > deadline {
            return Err(format!("operation {id} did not end within {OP_WITHIN:?}"));
        }
    }
}

/// Runs `method path` and waits for its operation to end `Succeeded`; its time.
async fn run_op(
    c: &reqwest::Client,
    urls: &[String],
    path: &str,
    body: &Value,
    counts: &Counts,
) -> Result<Duration, WriteError> {
    let t = Instant::now();
    let accepted = write(c, urls, "POST", path, body, counts).await?;
    counts.accepted.fetch_add(1, Ordering::Relaxed);
    let id = accepted["operation"]["id"].as_str().unwrap_or_default().to_string();
    let op = ended(c, urls, &id).await.map_err(WriteError::Failed)?;
    if op["status"] != "Succeeded" {
        return Err(WriteError::Failed(format!("{path}: operation {id} ended {}: {}", op["status"], op["error"])));
    }
    Ok(t.elapsed())
}

/// Connects the fleet, places the instances and starts the clients.
pub async fn start(c: &reqwest::Client, a: &LoadArgs) -> Result<Option<Load>, String> {
    if a.agents == 0 && a.instances == 0 {
        return Ok(None);
    }
    if a.agents == 0 {
        return Err("--instances needs --agents to run on".into());
    }
    let urls = Ha::api_urls();
    // The setup's writes (not the workload's).
    let setup = Counts::default();
    let failed = |what: &str, e: WriteError| match e {
        WriteError::Lost => format!("{what}: its master died before answering"),
        WriteError::Failed(why) => format!("{what}: {why}"),
    };
    let body = json!({ "name": "failover", "uses": a.agents, "ttl_seconds": 3600 });
    let made = write(c, &urls, "POST", "/join-tokens", &body, &setup).await.map_err(|e| failed("a join token", e))?;
    let join_token = made["secret"].as_str().ok_or("the join token answer has no secret")?.to_string();
    let masters = crate::agent::masters::Masters::parse(&Ha::agent_addrs())?;
    let config = FleetConfig {
        masters,
        agents: a.agents,
        prefix: PREFIX.into(),
        port_range: (20000, 60000),
        latency: Latency { restart: Duration::from_millis(200), ..Latency::default() },
        join_token,
    };
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2);
    let fleet = Fleet::start_apart(&config, threads, 10).map_err(|e| format!("starting the simulated agents: {e}"))?;
    ready(c, &urls, a.agents).await?;
    upload(c, &urls).await?;
    let clusters: Vec<String> = (0..a.instances.div_ceil(PER_CLUSTER)).map(|i| format!("fo-{i}")).collect();
    for (i, name) in clusters.iter().enumerate() {
        let count = (a.instances - i * PER_CLUSTER).min(PER_CLUSTER);
        let body = json!({
            "name": name,
            "package": { "name": super::package::NAME, "version": super::package::VERSION },
            "roles": { "d": { "count": count } }
        });
        run_op(c, &urls, "/clusters", &body, &setup).await.map_err(|e| failed(&format!("creating {name}"), e))?;
    }
    let counts = Arc::new(Counts::default());
    let stop = Arc::new(AtomicBool::new(false));
    let clusters = Arc::new(clusters);
    // Each client has clusters of its own (an operation at a time on each).
    let every = a.clients.min(clusters.len());
    let clients = (0..every)
        .map(|i| {
            let (c, urls, stop, counts, clusters, step, every) =
                (c.clone(), urls.clone(), stop.clone(), counts.clone(), clusters.clone(), a.step, every);
            tokio::spawn(async move {
                // Its clusters; one whose operation ended otherwise than
                // `Succeeded` is left alone from then on (it is in `Error`:
                // an operator would look).
                let mut mine: Vec<&String> = clusters.iter().skip(i).step_by(every).collect();
                let mut n = 0;
                while !stop.load(Ordering::SeqCst) && !mine.is_empty() {
                    n = (n + 1) % mine.len();
                    let path = format!("/clusters/{}/scale", mine[n]);
                    match run_op(&c, &urls, &path, &json!({ "role": "d", "add": step }), &counts).await {
                        Ok(took) => {
                            counts.succeeded.fetch_add(1, Ordering::Relaxed);
                            counts.ops.add(took);
                        }
                        Err(WriteError::Lost) => {
                            counts.answers_lost.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(WriteError::Failed(why)) => {
                            // Its operation ended otherwise: the cluster is
                            // in `Error` (a write refused for good is only counted).
                            if why.contains("operation ") && why.contains(" ended ") {
                                mine.remove(n);
                            }
                            counts.fail(why);
                        }
                    }
                }
            })
        })
        .collect();
    Ok(Some(Load { fleet, stop, clients, counts, args: a.clone(), running: every }))
}

/// Waits (120 s at most) until `n` simulated agents are `Ready` on the leader.
async fn ready(c: &reqwest::Client, urls: &[String], n: usize) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        for u in urls {
            let Ok(r) = c.get(format!("{u}/api/v1/nodes?limit=100000")).timeout(Duration::from_secs(10)).send().await
            else {
                continue;
            };
            let Ok(v) = r.json::<Value>().await else { continue };
            let up = v["nodes"].as_array().into_iter().flatten();
            if up.filter(|n| n["status"] == "Ready" && n["id"].as_str().is_some_and(|i| i.starts_with(PREFIX))).count()
                >= n
            {
                return Ok(());
            }
        }
        if Instant::now() > deadline {
            return Err(format!("{n} simulated agents did not all become Ready within 120 s"));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Uploads the bench package to whichever master leads.
async fn upload(c: &reqwest::Client, urls: &[String]) -> Result<(), String> {
    let bytes = super::package::tarball(MAX_COUNT).map_err(|e| format!("building the bench package: {e}"))?;
    let path = format!("/packages/{}/{}", super::package::NAME, super::package::VERSION);
    let deadline = Instant::now() + WRITE_WITHIN;
    loop {
        for u in urls {
            let r =
                c.put(format!("{u}/api/v1{path}")).timeout(Duration::from_secs(30)).body(bytes.clone()).send().await;
            match r {
                Ok(r) if r.status().is_success() => return Ok(()),
                Ok(r) if r.status().is_redirection() || r.status() == reqwest::StatusCode::SERVICE_UNAVAILABLE => {}
                Ok(r) => return Err(format!("PUT {path}: {} {}", r.status(), r.text().await.unwrap_or_default())),
                Err(_) => {}
            }
        }
        if Instant::now() > deadline {
            return Err(format!("PUT {path}: no master took it within {WRITE_WITHIN:?}"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

impl Load {
    /// Stops the clients once their operations have ended, then the fleet;
    /// what they saw.
    pub async fn stop(self, c: &reqwest::Client) -> Value {
        self.stop.store(true, Ordering::SeqCst);
        for client in self.clients {
            let _ = client.await;
        }
        let stored = stored_operations(c).await;
        self.fleet.stop().await;
        let counts = &self.counts;
        let failures = counts.failures.lock().unwrap_or_else(|p| p.into_inner()).clone();
        json!({
            "agents": self.args.agents,
            "instances": self.args.instances,
            "clients": self.running,
            "step": self.args.step,
            "ops_accepted": counts.accepted.load(Ordering::Relaxed),
            "ops_succeeded": counts.succeeded.load(Ordering::Relaxed),
            "ops_failed": failures.len(),
            "failures": failures.iter().take(10).collect::<Vec<_>>(),
            "answers_lost": counts.answers_lost.load(Ordering::Relaxed),
            "writes_sent_elsewhere": counts.looked_again.load(Ordering::Relaxed),
            "writes_waiting_for_a_busy_cluster": counts.waited_busy.load(Ordering::Relaxed),
            "op_ms": counts.ops.summary(),
            "stored_operations": stored,
        })
    }
}

/// Every operation the masters still store (those whose acceptance was
/// lost in a kill included), counted by kind and status, once none is
/// pending or running (one whose acceptance a kill lost may still run when
/// the clients stop; 120 s at most): all must have ended `Succeeded`.
async fn stored_operations(c: &reqwest::Client) -> Value {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let listed = list_operations(c).await;
        let done = |by: &std::collections::BTreeMap<String, u64>| {
            !by.keys().any(|k| k.ends_with(" Pending") || k.ends_with(" Running"))
        };
        match listed {
            Ok(by) if done(&by) || Instant::now() > deadline => return json!(by),
            Err(why) if Instant::now() > deadline => return json!({ "error": why }),
            _ => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
}

/// Every stored operation, counted by kind and status, read page by page
/// from whichever master answers.
async fn list_operations(c: &reqwest::Client) -> Result<std::collections::BTreeMap<String, u64>, String> {
    let urls = Ha::api_urls();
    let mut by = std::collections::BTreeMap::<String, u64>::new();
    let (mut after, mut at, mut tries) = (None::<String>, 0, 0);
    loop {
        let mut url = format!("{}/api/v1/operations?limit=1000", urls[at % urls.len()]);
        if let Some(a) = &after {
            url.push_str(&format!("&after={a}"));
        }
        let page = match c.get(&url).timeout(Duration::from_secs(30)).send().await {
            Ok(r) if r.status().is_success() => r.json::<Value>().await.map_err(|e| format!("{url}: {e}"))?,
            other => {
                tries += 1;
                if tries > 30 {
                    return Err(format!("{url}: {:?}", other.map(|r| r.status())));
                }
                at += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        for op in page["operations"].as_array().into_iter().flatten() {
            let kind_status =
                format!("{} {}", op["kind"].as_str().unwrap_or("?"), op["status"].as_str().unwrap_or("?"));
            *by.entry(kind_status).or_default() += 1;
        }
        match page["next"].as_str() {
            Some(next) => after = Some(next.to_string()),
            None => return Ok(by),
        }
    }
}
