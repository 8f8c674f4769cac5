//! `flotilla bench linearity`: is an instance as cheap at 100,000 as at
//! 10,000 (B11)? Places a tenth of `--instances` on the master the run
//! started, then all of them on a fresh one, over the same `--clusters`
//! (so clusters also grow tenfold), and compares the master's CPU per
//! instance during placement, the memory an instance keeps at rest above
//! the master with its agents alone, and the time per placement.

use serde_json::json;

use super::client::Api;
use super::report::Report;
use super::stats::round;
use super::{BenchArgs, Setup};

pub async fn run(args: &BenchArgs, setup: &mut Setup, report: &mut Report) -> Result<(), String> {
    if args.api.is_some() {
        return Err("bench linearity starts its own masters; it cannot drive one given by --api".into());
    }
    let small_n = (args.instances / 10).max(1);
    let small = place(args, small_n, setup).await?;

    let master = super::start_master(args, &setup.data_dir.join("master-large"), &setup.progress).await?;
    let api = Api::new(&master.api, master.token.clone())?;
    let mut large_setup = Setup { api, master, progress: setup.progress.clone(), data_dir: setup.data_dir.clone() };
    let large = place(args, args.instances, &mut large_setup).await;
    large_setup.master.stop().await;
    let large = large?;

    let costs = |r: &Report| {
        let n = r.instances.max(1) as f64;
        json!({
            "instances": r.instances,
            "placements_per_s": r.placements_per_s,
            "cpu_ms_per_instance": r.place_cpu_ms_per_instance,
            "rest_kb_per_instance": round((r.master_rss_rest_mb - r.master_rss_idle_mb).max(0.0) * 1024.0 / n),
            "us_per_placement": round(r.placement_secs * 1e6 / n),
            "master_rss_rest_mb": r.master_rss_rest_mb,
            "master_rss_idle_mb": r.master_rss_idle_mb,
        })
    };
    let (s, l) = (costs(&small), costs(&large));
    let ratio = |k: &str| {
        let (a, b) = (s[k].as_f64().unwrap_or(0.0), l[k].as_f64().unwrap_or(0.0));
        if a > 0.0 { round(b / a) } else { f64::INFINITY }
    };
    let (cpu, mem, time) = (ratio("cpu_ms_per_instance"), ratio("rest_kb_per_instance"), ratio("us_per_placement"));
    report.instances = large.instances;
    report.agents = large.agents;
    report.linearity = Some(json!({
        "small": s, "large": l,
        "cpu_ratio": cpu, "memory_ratio": mem, "time_ratio": time,
    }));
    let mut put = |k: &str, figure: f64| {
        report.targets.insert(k.into(), json!({"figure": figure, "target": "<= 1.5", "met": figure <= 1.5}));
    };
    put("B11_cpu_per_instance_ratio", cpu);
    put("B11_memory_per_instance_ratio", mem);
    put("B11_time_per_instance_ratio", time);
    Ok(())
}

/// The placement alone, `n` instances, on `setup`'s master.
async fn place(args: &BenchArgs, n: u64, setup: &mut Setup) -> Result<Report, String> {
    let mut a = args.clone();
    a.instances = n;
    a.place_only = true;
    a.mode = None;
    let mut r = Report { agents: args.agents, ..Report::default() };
    super::scale::run(&a, setup, &mut r).await?;
    Ok(r)
}
