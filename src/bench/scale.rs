//! `flotilla bench` (scale): a master and many simulated agents on this
//! machine, driven by concurrent API clients through a whole life cycle:
//! create `--clusters`, scale them out until `--instances` run, crash some
//! instances (how fast the API sees it), restart, reconfigure and scale in
//! every cluster; with readers measuring the API all along.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::sync::Mutex;

use super::client::Api;
use super::report::Report;
use super::sim::{Fleet, FleetConfig, Latency};
use super::stats::{ByKind, Samples, round};
use super::{BenchArgs, Setup};

/// One cluster of the workload and how far it has grown.
struct Target {
    name: String,
    have: u32,
    want: u32,
}

pub async fn run(args: &BenchArgs, setup: &mut Setup, report: &mut Report) -> Result<(), String> {
    let api = setup.api.clone();
    let master = &setup.master;
    let progress = &setup.progress;

    // Agents.
    let before_fleet = super::ceilings::proc_usage(std::process::id()).map(|u| u.0).unwrap_or(0.0);
    progress.set_message(format!("connecting {} simulated agents", args.agents));
    let latency = Latency {
        install: Duration::from_millis(args.latency_ms),
        start: Duration::from_millis(args.latency_ms),
        stop: Duration::from_millis(args.latency_ms),
        other: Duration::ZERO,
        restart: Duration::from_millis(200),
    };
    let made = api
        .post("/join-tokens", &serde_json::json!({ "name": "bench", "uses": args.agents.max(1), "ttl_seconds": 3600 }))
        .await
        .map_err(|e| format!("making a join token for the simulated agents: {e}"))?;
    let join_token = made["secret"].as_str().ok_or("the join token answer has no secret")?.to_string();
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2);
    let fleet = Fleet::start_apart(
        &FleetConfig {
            masters: master.agents.clone(),
            agents: args.agents,
            prefix: args.prefix.clone(),
            port_range: (20000, 60000),
            latency,
            join_token,
        },
        threads,
        args.sim_nice,
    )
    .map_err(|e| format!("cannot start the simulated agents' runtime: {e}"))?;
    wait_ready(&api, args.agents, &args.prefix).await?;
    let after_fleet = super::ceilings::proc_usage(std::process::id()).map(|u| u.0).unwrap_or(0.0);
    report.sim_rss_per_agent_kb = round((after_fleet - before_fleet).max(0.0) * 1024.0 / args.agents.max(1) as f64);

    // Idle: what connected agents alone cost the master (heartbeats).
    progress.set_message(format!("measuring {} idle agents for {} s", args.agents, args.idle_secs));
    if let Some((_, cpu0)) = master.usage() {
        let t0 = Instant::now();
        tokio::time::sleep(Duration::from_secs(args.idle_secs)).await;
        if let Some((rss, cpu1)) = master.usage() {
            report.master_measured = true;
            report.idle_master_cpu_pct = round((cpu1 - cpu0) / t0.elapsed().as_secs_f64() * 100.0);
            report.master_rss_idle_mb = round(rss);
        }
    }
    if args.instances == 0 {
        fleet.stop().await;
        return Ok(());
    }

    let per_cluster = args.instances.div_ceil(args.clusters.max(1) as u64) as u32;
    api.put_package(
        super::package::NAME,
        super::package::VERSION,
        super::package::tarball(per_cluster.max(1)).map_err(|e| e.to_string())?,
    )
    .await
    .map_err(|e| e.to_string())?;

    let ops = Arc::new(ByKind::default());
    let stop_readers = Arc::new(AtomicBool::new(false));
    let readers = start_readers(&api, args.readers, stop_readers.clone(), &args.prefix);
    let health0 = api.get("/health").await.map_err(|e| e.to_string())?;
    let cpu_start = master.usage().map(|u| u.1);
    let run_started = Instant::now();

    // Create, then scale out until every cluster has its share.
    progress.set_length(args.instances);
    progress.set_message("placing instances");
    let mut targets = VecDeque::new();
    let mut left = args.instances;
    for i in 0..args.clusters {
        let want = (left.min(per_cluster as u64)) as u32;
        left -= want as u64;
        if want == 0 {
            break;
        }
        targets.push_back(Target { name: format!("b{i}"), have: 0, want });
    }
    let queue = Arc::new(Mutex::new(targets));
    let placed = Arc::new(AtomicU64::new(0));
    let failures = Arc::new(Mutex::new(Vec::<String>::new()));
    let place_started = Instant::now();
    let mut clients = Vec::new();
    for _ in 0..args.clients.max(1) {
        let (api, queue, ops, placed, failures, progress) =
            (api.clone(), queue.clone(), ops.clone(), placed.clone(), failures.clone(), progress.clone());
        let step = args.step;
        let initial = args.initial.max(1);
        clients.push(tokio::spawn(async move {
            loop {
                let Some(mut t) = queue.lock().await.pop_front() else { return };
                let (kind, result) = if t.have == 0 {
                    let n = initial.min(t.want);
                    let body = json!({"name": t.name, "package": {"name": super::package::NAME, "version": super::package::VERSION},
                                      "roles": {"d": {"count": n}}});
                    ("Create", api.run_op("POST", "/clusters", &body).await.map(|r| (r, n)))
                } else {
                    let n = step.min(t.want - t.have);
                    let body = json!({"role": "d", "add": n});
                    ("ScaleOut", api.run_op("POST", &format!("/clusters/{}/scale", t.name), &body).await.map(|r| (r, n)))
                };
                match result {
                    Ok(((op, took), n)) if op["status"] == "Succeeded" => {
                        ops.add(kind, took);
                        t.have += n;
                        placed.fetch_add(n as u64, Ordering::Relaxed);
                        progress.inc(n as u64);
                        if t.have < t.want {
                            queue.lock().await.push_back(t);
                        }
                    }
                    Ok(((op, _), _)) => {
                        failures.lock().await.push(format!("{kind} of {}: {}", t.name, op["error"]));
                        return;
                    }
                    Err(e) => {
                        failures.lock().await.push(format!("{kind} of {}: {e}", t.name));
                        return;
                    }
                }
            }
        }));
    }
    for c in clients {
        let _ = c.await;
    }
    let place_secs = place_started.elapsed().as_secs_f64();
    let failed = failures.lock().await.clone();
    if !failed.is_empty() {
        stop_readers.store(true, Ordering::Relaxed);
        fleet.stop().await;
        return Err(format!("{} operations failed; first: {}", failed.len(), failed[0]));
    }
    let health1 = api.get("/health").await.map_err(|e| e.to_string())?;
    let instances = placed.load(Ordering::Relaxed);
    report.instances = instances;
    report.placements_per_s = round(instances as f64 / place_secs);
    report.placement_secs = round(place_secs);
    let transitions =
        health1["instance_transitions"].as_u64().unwrap_or(0) - health0["instance_transitions"].as_u64().unwrap_or(0);
    report.durable_transitions_per_s = round(transitions as f64 / place_secs);
    let batches = health1["store"]["batches"].as_u64().unwrap_or(0) - health0["store"]["batches"].as_u64().unwrap_or(0);
    report.store_syncs_per_s = round(batches as f64 / place_secs);
    if let Some((rss, cpu)) = master.usage() {
        report.master_rss_mb = round(rss);
        if let Some(c0) = cpu_start {
            report.place_cpu_ms_per_instance = round((cpu - c0) * 1000.0 / instances.max(1) as f64);
        }
    }
    report.running_in_simulator = fleet.running() as u64;

    // The largest cluster, read whole.
    progress.set_message("reading the largest cluster");
    let mut largest = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        api.get("/clusters/b0").await.map_err(|e| e.to_string())?;
        largest.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    largest.sort_by(|a, b| a.total_cmp(b));
    report.api.get_largest_cluster_ms = round(largest[largest.len() / 2]);

    // At rest: the memory the placed instances keep, once the allocator
    // has given back what the placement's transients used.
    progress.set_message("waiting for the master's memory to settle");
    if let Some(rss) = settled_rss(master).await {
        report.master_rss_rest_mb = round(rss);
    }
    if args.place_only {
        stop_readers.store(true, Ordering::Relaxed);
        for r in readers {
            let _ = r.await;
        }
        run_cpu(report, master, cpu_start, run_started, instances);
        report.operations = ops.summaries();
        fleet.stop().await;
        return Ok(());
    }

    // A crash: how long until the API shows it.
    progress.set_message("crashing instances");
    let exits = Samples::default();
    let names: Vec<String> = (0..args.clusters).map(|i| format!("b{i}")).collect();
    for k in 0..args.crashes {
        let name = &names[k % names.len()];
        let c = api.get(&format!("/clusters/{name}")).await.map_err(|e| e.to_string())?;
        let Some(victim) = c["instances"].as_array().and_then(|v| v.iter().find(|i| i["status"] == "Running")).cloned()
        else {
            continue;
        };
        let id = victim["id"].as_str().unwrap_or_default().to_string();
        let t = Instant::now();
        fleet.crash(&crate::ids::InstanceId::new(id.clone()), true);
        loop {
            let c = api.get(&format!("/clusters/{name}")).await.map_err(|e| e.to_string())?;
            let seen = c["instances"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|i| i["id"] == id.as_str() && i["pid"] != victim["pid"]);
            if seen {
                exits.add(t.elapsed());
                break;
            }
            if t.elapsed() > Duration::from_secs(10) {
                return Err(format!("the crash of {id} was not visible after 10 s"));
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        // Let the simulated restart land before the next one.
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let e = exits.summary();
    report.exit_visible_ms = json!({"count": e.count, "p50": e.p50, "p99": e.p99, "max": e.max});

    // Restart, reconfigure, scale in: every cluster, M at a time.
    for phase in ["Restart", "Reconfigure", "ScaleIn"] {
        progress.set_message(format!("{phase} of every cluster"));
        let queue = Arc::new(Mutex::new(names.iter().cloned().collect::<VecDeque<_>>()));
        let mut clients = Vec::new();
        for _ in 0..args.clients.max(1) {
            let (api, queue, ops, failures) = (api.clone(), queue.clone(), ops.clone(), failures.clone());
            clients.push(tokio::spawn(async move {
                loop {
                    let Some(name) = queue.lock().await.pop_front() else { return };
                    let result = match phase {
                        "Restart" => api.run_op("POST", &format!("/clusters/{name}/restart"), &json!({})).await,
                        "Reconfigure" => {
                            api.run_op(
                                "PATCH",
                                &format!("/clusters/{name}/config"),
                                &json!({"config": {"greeting": "bonjour"}}),
                            )
                            .await
                        }
                        _ => {
                            let c = match api.get(&format!("/clusters/{name}")).await {
                                Ok(c) => c,
                                Err(e) => {
                                    failures.lock().await.push(e.to_string());
                                    return;
                                }
                            };
                            let all: Vec<Value> = c["instances"].as_array().cloned().unwrap_or_default();
                            let remove: Vec<Value> =
                                all.iter().rev().take(all.len() / 10).map(|i| i["id"].clone()).collect();
                            if remove.is_empty() {
                                continue;
                            }
                            api.run_op(
                                "POST",
                                &format!("/clusters/{name}/scale"),
                                &json!({"role": "d", "remove": remove}),
                            )
                            .await
                        }
                    };
                    match result {
                        Ok((op, took)) if op["status"] == "Succeeded" => ops.add(phase, took),
                        Ok((op, _)) => failures.lock().await.push(format!("{phase} of {name}: {}", op["error"])),
                        Err(e) => failures.lock().await.push(format!("{phase} of {name}: {e}")),
                    }
                }
            }));
        }
        for c in clients {
            let _ = c.await;
        }
    }
    stop_readers.store(true, Ordering::Relaxed);
    for r in readers {
        let _ = r.await;
    }
    run_cpu(report, master, cpu_start, run_started, instances);
    report.operations = ops.summaries();
    let failed = failures.lock().await.clone();
    report.failures = failed.len();
    fleet.stop().await;
    if let Some(f) = failed.first() {
        return Err(format!("{} operations failed; first: {f}", failed.len()));
    }
    Ok(())
}

/// Waits until every simulated agent is a Ready node.
async fn wait_ready(api: &Api, n: usize, prefix: &str) -> Result<(), String> {
    let started = Instant::now();
    loop {
        if let Ok(v) = api.get("/nodes?limit=10000").await {
            let ready = v["nodes"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter(|n| n["status"] == "Ready" && n["id"].as_str().is_some_and(|i| i.starts_with(prefix)))
                        .count()
                })
                .unwrap_or(0);
            if ready >= n {
                return Ok(());
            }
        }
        if started.elapsed() > Duration::from_secs(120) {
            return Err(format!("{n} simulated agents did not all become Ready within 120 s"));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Readers that GET the list of clusters, the nodes and one cluster in a
/// loop while the workload runs (what a dashboard does).
fn start_readers(api: &Api, n: usize, stop: Arc<AtomicBool>, _prefix: &str) -> Vec<tokio::task::JoinHandle<()>> {
    (0..n)
        .map(|k| {
            let api = api.clone();
            let stop = stop.clone();
            tokio::spawn(async move {
                let paths = ["/clusters?limit=100", "/nodes", "/operations?limit=20"];
                let mut i = k;
                while !stop.load(Ordering::Relaxed) {
                    let _ = api.get(paths[i % paths.len()]).await;
                    i += 1;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            })
        })
        .collect()
}

/// The master's CPU from the first create to now: its share of one core,
/// and per placed instance.
fn run_cpu(
    report: &mut Report,
    master: &super::master_proc::MasterProc,
    cpu_start: Option<f64>,
    started: Instant,
    instances: u64,
) {
    let elapsed = started.elapsed().as_secs_f64();
    if let (Some(c0), Some((_, c1))) = (cpu_start, master.usage()) {
        report.master_cpu_pct = round((c1 - c0) / elapsed * 100.0);
        report.master_cpu_ms_per_instance = round((c1 - c0) * 1000.0 / instances.max(1) as f64);
    }
}

/// The master's RSS (MiB) once it stops falling: sampled each second until
/// five seconds in a row gave back less than 1 %, at most 30 s. Idle
/// blocking threads and the allocators return a burst's memory over
/// seconds; an early sample counts that as kept.
async fn settled_rss(master: &super::master_proc::MasterProc) -> Option<f64> {
    let mut samples = Vec::new();
    for _ in 0..30 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        samples.push(master.usage()?.0);
        if let [.., before, _, _, _, _, now] = samples[..]
            && before - now < before * 0.01
        {
            break;
        }
    }
    samples.last().copied()
}
