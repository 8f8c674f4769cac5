//! `flotilla bench real`: real agents (child processes, like `flotilla
//! dev`) running real processes (the bench package's start script forks a
//! `sleep` and writes a pidfile):
//!
//! - API -> Running of one instance (`POST .../instances/{id}/start` until
//!   the API shows it `Running` with its pid; the operation, which ends
//!   once the start has settled, must then succeed), with the system idle
//!   and while another cluster scales up by `--instances`;
//! - real starts per second (a whole stopped cluster started) against the
//!   spawn ceiling;
//! - a scale-in of `--instances`;
//! - `kill -9` of a process until the API shows it.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::process::{Child, Command};

use super::Setup;
use super::client::Api;
use super::report::Report;
use super::stats::{Samples, round};

#[derive(Debug, Clone, clap::Args)]
pub struct RealArgs {
    /// Real agents (each on its own loopback address).
    #[arg(long, default_value_t = 3)]
    pub nodes: usize,
    /// Instances of the large scale-up and scale-in.
    #[arg(long, default_value_t = 1000)]
    pub instances: u32,
    /// Single-instance starts timed while idle.
    #[arg(long, default_value_t = 50)]
    pub samples: usize,
    /// Agents keep instances in process groups instead of cgroups (to
    /// measure what the cgroup moves cost).
    #[arg(long)]
    pub no_cgroups: bool,
}

/// Each step as `{name, began_s, done_s}` (seconds from the request).
fn steps_json(steps: &[(String, f64, f64)]) -> Value {
    let secs = |x: f64| if x.is_nan() { Value::Null } else { json!(round(x)) };
    steps
        .iter()
        .map(|(name, began, done)| json!({"name": name, "began_s": secs(*began), "done_s": secs(*done)}))
        .collect()
}

fn summary_json(s: &Samples) -> Value {
    let x = s.summary();
    json!({"count": x.count, "p50": x.p50, "p99": x.p99, "max": x.max})
}

pub async fn run(args: &RealArgs, setup: &mut Setup, report: &mut Report) -> Result<(), String> {
    let api = setup.api.clone();
    let progress = setup.progress.clone();
    progress.set_message("measuring spawns into cgroups");
    let cgroup_ceiling = match crate::agent::process::probe::spawn_in_cgroup_per_s(Duration::from_secs(2), 8).await {
        Some(Ok(rate)) => Some(rate),
        Some(Err(e)) => return Err(format!("spawning into a cgroup: {e}")),
        None => None,
    };
    progress.set_message(format!("starting {} real agents", args.nodes));
    let master = setup.master.agents.to_string();
    let made = api
        .post("/join-tokens", &json!({ "name": "bench-real", "uses": args.nodes.max(1) }))
        .await
        .map_err(|e| format!("making a join token for the agents: {e}"))?;
    let join_token = made["secret"].as_str().ok_or("the join token answer has no secret")?.to_string();
    let mut agents = start_agents(args.nodes, &setup.data_dir, &master, &join_token, args.no_cgroups)?;
    let outcome = workload(args, &api, &progress, report, cgroup_ceiling).await;
    progress.set_message("stopping the agents (and their instances)");
    for c in &agents {
        if let Some(pid) = c.id() {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGTERM);
        }
    }
    for c in agents.iter_mut() {
        if tokio::time::timeout(Duration::from_secs(120), c.wait()).await.is_err() {
            let _ = c.kill().await;
        }
    }
    outcome
}

fn start_agents(n: usize, dir: &Path, master: &str, join_token: &str, no_cgroups: bool) -> Result<Vec<Child>, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    // As root, instances run as `nobody` (never root); else as whoever runs the bench.
    let me = if nix::unistd::geteuid().is_root() {
        "nobody".to_string()
    } else {
        nix::unistd::User::from_uid(nix::unistd::geteuid())
            .ok()
            .flatten()
            .map(|u| u.name)
            .unwrap_or_else(|| "nobody".into())
    };
    let mut out = Vec::new();
    for i in 1..=n {
        let log = std::fs::File::create(dir.join(format!("agent-{i}.log"))).map_err(|e| e.to_string())?;
        let mut cmd = Command::new(&exe);
        cmd.arg("agent");
        if no_cgroups {
            cmd.arg("--no-cgroups");
        }
        let child = cmd
            .args(["--node-id", &format!("real-{i}")])
            .args(["--master", master])
            .args(["--address", &format!("127.0.0.{}", 10 + i)])
            .arg("--data-dir")
            .arg(dir.join(format!("agent-{i}")))
            .args(["--port-range", "20000-29999"])
            .args(["--default-run-as", &me])
            .arg("--stop-instances-on-exit")
            .env("FLOTILLA_AGENT_JOIN_TOKEN", join_token)
            .env("RUST_LOG", std::env::var("FLOTILLA_BENCH_AGENT_LOG").unwrap_or_else(|_| "warn".into()))
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("starting agent {i}: {e}"))?;
        out.push(child);
    }
    Ok(out)
}

async fn workload(
    args: &RealArgs,
    api: &Api,
    progress: &indicatif::ProgressBar,
    report: &mut Report,
    cgroup_ceiling: Option<f64>,
) -> Result<(), String> {
    let e = |e: super::client::ApiError| e.to_string();
    let started = Instant::now();
    loop {
        let v = api.get("/nodes").await.map_err(e)?;
        let ready = v["nodes"].as_array().map(|a| a.iter().filter(|n| n["status"] == "Ready").count()).unwrap_or(0);
        if ready >= args.nodes {
            break;
        }
        if started.elapsed() > Duration::from_secs(60) {
            return Err(format!("{} real agents did not become Ready within 60 s", args.nodes));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    api.put_package(
        super::package::NAME,
        super::package::VERSION,
        super::package::tarball(args.instances + 10).map_err(|e| e.to_string())?,
    )
    .await
    .map_err(e)?;
    let create = |name: &str, n: u32| json!({"name": name, "package": {"name": super::package::NAME, "version": super::package::VERSION}, "roles": {"d": {"count": n}}});
    succeed(api.run_op("POST", "/clusters", &create("probe", 1)).await.map_err(e)?)?;
    let probe = api.get("/clusters/probe").await.map_err(e)?;
    let id = probe["instances"][0]["id"].as_str().unwrap_or_default().to_string();

    // Idle: stop, then time the start until Running.
    progress.set_message("timing single starts (idle)");
    let idle = Samples::default();
    for _ in 0..args.samples {
        idle.add(start_once(api, &id).await?);
    }

    // During a large scale-up.
    progress.set_message(format!("timing single starts during a {}-instance scale-up", args.instances));
    succeed(api.run_op("POST", "/clusters", &create("big", 1)).await.map_err(e)?)?;
    let scale_started = Instant::now();
    let api2 = api.clone();
    let add = args.instances.saturating_sub(1).max(1);
    let scale =
        tokio::spawn(
            async move { api2.run_op("POST", "/clusters/big/scale", &json!({"role": "d", "add": add})).await },
        );
    let busy = Samples::default();
    while !scale.is_finished() {
        busy.add(start_once(api, &id).await?);
    }
    let scaled = scale.await.map_err(|e| e.to_string())?.map_err(e)?;
    succeed(scaled)?;
    let scale_secs = scale_started.elapsed().as_secs_f64();

    // Real starts per second: the whole big cluster stopped, then started.
    progress.set_message("stopping and starting the large cluster");
    succeed(api.run_op("POST", "/clusters/big/stop", &json!({})).await.map_err(e)?)?;
    let (op, took, start_steps) = api.run_op_stepped("POST", "/clusters/big/start", &json!({})).await.map_err(e)?;
    succeed((op, took))?;
    let starts_per_s = args.instances as f64 / took.as_secs_f64();

    // kill -9 -> visible.
    progress.set_message("killing processes");
    let exits = Samples::default();
    let big = api.get("/clusters/big").await.map_err(e)?;
    for inst in big["instances"].as_array().into_iter().flatten().take(20) {
        let (Some(pid), Some(iid)) = (inst["pid"].as_i64(), inst["id"].as_str()) else { continue };
        let t = Instant::now();
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGKILL);
        loop {
            let c = api.get("/clusters/big").await.map_err(e)?;
            let moved =
                c["instances"].as_array().into_iter().flatten().any(|i| i["id"] == iid && i["pid"] != inst["pid"]);
            if moved {
                exits.add(t.elapsed());
                break;
            }
            if t.elapsed() > Duration::from_secs(10) {
                return Err(format!("kill -9 of {iid} was not visible after 10 s"));
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    // Let the agents' restarts land before the scale-in.
    tokio::time::sleep(Duration::from_secs(2)).await;

    progress.set_message(format!("scaling in {} instances", args.instances - 1));
    let c = api.get("/clusters/big").await.map_err(e)?;
    let remove: Vec<Value> = c["instances"].as_array().into_iter().flatten().skip(1).map(|i| i["id"].clone()).collect();
    let removed = remove.len();
    let (op, scale_in, scale_in_steps) =
        api.run_op_stepped("POST", "/clusters/big/scale", &json!({"role": "d", "remove": remove})).await.map_err(e)?;
    succeed((op, scale_in))?;

    let ratio = starts_per_s / report.spawn_per_s.max(1.0);
    report.instances = args.instances as u64;
    report.real = Some(json!({
        "nodes": args.nodes,
        "start_to_running_idle_ms": summary_json(&idle),
        "start_to_running_during_scale_up_ms": summary_json(&busy),
        "scale_up_instances": args.instances,
        "scale_up_secs": round(scale_secs),
        "starts_per_s": round(starts_per_s),
        "starts_per_spawn_ceiling": round(ratio),
        "cgroups": !args.no_cgroups,
        "spawn_in_cgroup_per_s": cgroup_ceiling.map(round),
        "starts_per_cgroup_spawn_ceiling": cgroup_ceiling.map(|c| round(starts_per_s / c.max(1.0))),
        "scale_in_instances": removed,
        "scale_in_secs": round(scale_in.as_secs_f64()),
        "kill_visible_ms": summary_json(&exits),
        "start_steps": steps_json(&start_steps),
        "scale_in_steps": steps_json(&scale_in_steps),
    }));
    let idle_p99 = idle.summary().p99;
    let busy_p99 = busy.summary().p99;
    let kill_p99 = exits.summary().p99;
    for (k, figure, target, met) in [
        ("B3_start_p99_idle_ms", idle_p99, "<= 30", idle_p99 <= 30.0),
        ("B3_start_p99_during_scale_up_ms", busy_p99, "<= 1000", busy_p99 <= 1000.0),
        ("B4_starts_per_spawn_ceiling", round(ratio), ">= 0.30", ratio >= 0.30),
        ("B4_scale_in_secs", round(scale_in.as_secs_f64()), "<= 1", scale_in.as_secs_f64() <= 1.0),
        ("B10_kill_visible_p99_ms", kill_p99, "<= 100", kill_p99 <= 100.0),
    ] {
        report.targets.insert(k.into(), json!({"figure": figure, "target": target, "met": met}));
    }
    Ok(())
}

/// Stops the instance, then times its start until the API shows it
/// `Running` with a pid (its process runs). The start then settles (1 s by
/// default) and must succeed, or the run fails: a start that dies is never
/// a sample.
async fn start_once(api: &Api, id: &str) -> Result<Duration, String> {
    let e = |e: super::client::ApiError| e.to_string();
    succeed(api.run_op("POST", &format!("/clusters/probe/instances/{id}/stop"), &json!({})).await.map_err(e)?)?;
    let asked = Instant::now();
    let accepted = api.post(&format!("/clusters/probe/instances/{id}/start"), &json!({})).await.map_err(e)?;
    let op = accepted["operation"]["id"].as_str().ok_or_else(|| format!("no operation in {accepted}"))?.to_string();
    let shown = loop {
        let c = api.get("/clusters/probe").await.map_err(e)?;
        let running = c["instances"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|i| i["id"] == id && i["status"] == "Running" && i["pid"].as_u64().is_some());
        if running {
            break asked.elapsed();
        }
        if asked.elapsed() > Duration::from_secs(20) {
            return Err(format!("the start of {id} was not shown Running after 20 s"));
        }
        // As the kill's visibility below: fine enough for a 30 ms target,
        // light enough not to load the master it measures.
        tokio::time::sleep(Duration::from_millis(2)).await;
    };
    succeed((api.wait_op(&op).await.map_err(e)?, Duration::ZERO))?;
    Ok(shown)
}

fn succeed((op, _): (Value, Duration)) -> Result<(), String> {
    if op["status"] == "Succeeded" {
        Ok(())
    } else {
        Err(format!("operation {} {}: {}", op["kind"], op["status"], op["error"]))
    }
}
