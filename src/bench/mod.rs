//! `flotilla bench`: load tests of the master. Nothing here runs in a
//! production master or agent.
//!
//! - [`sim`]: simulated agents (the real protocol, a fake process layer)
//! - [`scale`]: the scale workload on simulated agents (default)
//! - [`real`]: latencies with real agents and real processes (`bench real`)
//! - [`linearity`]: the cost of an instance at 1/10 of `--instances` and at
//!   all of them, each on a fresh master (`bench linearity`)
//! - [`ceilings`]: the machine's fdatasync and spawn rates, measured in the same run
//! - [`client`], [`stats`], [`report`]: timed API calls, percentiles, the report
//! - [`master_proc`]: the master under test, a child process
//! - [`failover`]: three masters on three etcd members, the leader killed and paused (`bench failover`)
//! - [`package`]: the package deployed

pub mod ceilings;
pub mod client;
pub mod failover;
pub mod failover_load;
pub mod linearity;
pub mod master_proc;
pub mod package;
pub mod pools;
pub mod real;
pub mod report;
pub mod scale;
pub mod sim;
pub mod stats;

use std::path::PathBuf;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

use self::client::Api;
use self::master_proc::MasterProc;
use self::report::{Percentiles, Report};

#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub mode: Option<BenchMode>,
    /// Simulated agents, all in this process.
    #[arg(long, default_value_t = 50)]
    pub agents: usize,
    /// Instances to place in all (0: only connect the agents and measure them idle).
    #[arg(long, default_value_t = 2000)]
    pub instances: u64,
    /// Clusters the instances are spread over.
    #[arg(long, default_value_t = 20)]
    pub clusters: usize,
    /// Concurrent API clients, each running one operation at a time.
    #[arg(long, default_value_t = 20)]
    pub clients: usize,
    /// Instances a new cluster starts with.
    #[arg(long, default_value_t = 10)]
    pub initial: u32,
    /// Instances added per scale-out.
    #[arg(long, default_value_t = 100)]
    pub step: u32,
    /// Readers polling the API while the workload runs.
    #[arg(long, default_value_t = 2)]
    pub readers: usize,
    /// Instances crashed one by one to time how fast the API sees it.
    #[arg(long, default_value_t = 50)]
    pub crashes: usize,
    /// Only place the instances (no crash, restart, reconfigure or
    /// scale-in), and leave them: for measuring a master at rest.
    #[arg(long)]
    pub place_only: bool,
    /// How long the simulated install, start and stop take, in ms.
    #[arg(long, default_value_t = 0)]
    pub latency_ms: u64,
    /// Nice steps below the bench at which the simulated agents run. They
    /// stand for other machines: at 10, as the master's bulk work runs
    /// (its `bulk_nice`), they take cores from the master's requests and
    /// the API clients no more than its own bulk work does. 0: the bench's
    /// priority.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u8).range(0..=19))]
    pub sim_nice: u8,
    /// Seconds the idle agents are measured for.
    #[arg(long, default_value_t = 3)]
    pub idle_secs: u64,
    /// Node id prefix of the simulated agents.
    #[arg(long, default_value = "sim-")]
    pub prefix: String,
    /// Drive an existing master instead of starting one (`http://HOST:PORT`;
    /// with several masters, any of them: reads go to it, writes to the
    /// leader its `307` names).
    #[arg(long, requires = "agent_addr")]
    pub api: Option<String>,
    /// The existing master's agent listener (with `--api`; several
    /// masters' comma-separated: `HOST:PORT,HOST:PORT,...`).
    #[arg(long)]
    pub agent_addr: Option<String>,
    #[arg(long, env = "FLOTILLA_TOKEN")]
    pub token: Option<String>,
    /// Where the master started for the run keeps its data (default: a
    /// fresh directory under the temp dir, removed at the end).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Write the report as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Master settings for the run, `KEY=VALUE` (e.g. `actor_threads=2`).
    #[arg(long = "master-set", value_name = "KEY=VALUE")]
    pub master_set: Vec<String>,
    /// A config file the master starts with (e.g. `store = "etcd"` and its
    /// `[etcd]` table, to measure the master on etcd); `--master-set` wins.
    #[arg(long, value_name = "FILE")]
    pub master_config: Option<PathBuf>,
}

#[derive(Debug, Clone, clap::Subcommand)]
pub enum BenchMode {
    /// The scale workload on simulated agents (the default).
    Scale,
    /// Real agents and real processes: API -> Running latencies idle and
    /// during a large scale-up, real starts per second, a large scale-in,
    /// and how fast a killed process shows.
    Real(real::RealArgs),
    /// Places a tenth of `--instances`, then all of them, each on a fresh
    /// master, and compares what one instance costs (CPU, memory, time).
    Linearity,
    /// Node requests served by a pool of simulated machines (`sim`
    /// driver): requests fulfilled per second, request -> node ready, the
    /// master's CPU per launch.
    Pools(pools::PoolsArgs),
    /// Three masters on three etcd members (`dev --ha`'s ports): the
    /// leader killed again and again, then paused; leader loss -> a write
    /// accepted by the next leader, p50/p99, and reads on every master
    /// meanwhile.
    Failover(failover::FailoverArgs),
}

/// Concurrent committers of the store probe: as many instance commands as
/// a few operations' steps have in flight at once (256 each).
const STORE_PROBE_COMMITTERS: usize = 1024;

/// What every workload gets.
pub struct Setup {
    pub api: Api,
    pub master: MasterProc,
    pub progress: ProgressBar,
    pub data_dir: PathBuf,
}

/// Runs the benchmark; the report is printed (and written with `--json`).
pub async fn run(args: BenchArgs) -> Result<Report, String> {
    if let Some(BenchMode::Pools(p)) = &args.mode {
        crate::fd_limit::raise();
        let dir = args
            .data_dir
            .clone()
            .unwrap_or_else(|| std::env::temp_dir().join(format!("flotilla-bench-pools-{}", std::process::id())));
        let figures = pools::run(p, &dir).await;
        if args.data_dir.is_none() {
            let _ = std::fs::remove_dir_all(&dir);
        }
        let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        return Ok(Report { mode: "pools".into(), cores, pools: Some(figures?), ..Report::default() });
    }
    if let Some(BenchMode::Failover(f)) = &args.mode {
        let dir = args
            .data_dir
            .clone()
            .unwrap_or_else(|| std::env::temp_dir().join(format!("flotilla-bench-failover-{}", std::process::id())));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let figures = failover::run(f, &dir).await;
        if args.data_dir.is_none() && figures.is_ok() {
            let _ = std::fs::remove_dir_all(&dir);
        }
        let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        let report = Report { mode: "failover".into(), cores, failover: Some(figures?), ..Report::default() };
        if let Some(path) = &args.json {
            let text = serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?;
            std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))?;
        }
        return Ok(report);
    }
    check_workload(&args)?;
    // The simulated agents' sockets.
    crate::fd_limit::raise();
    let mut report = Report {
        agents: args.agents,
        clusters: args.clusters,
        clients: args.clients,
        cores: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        sim_nice: args.sim_nice,
        master_set: args.master_set.clone(),
        ..Report::default()
    };
    let owned_dir = args.data_dir.is_none();
    let data_dir = args
        .data_dir
        .clone()
        .unwrap_or_else(|| std::env::temp_dir().join(format!("flotilla-bench-{}", std::process::id())));
    std::fs::create_dir_all(&data_dir).map_err(|e| format!("{}: {e}", data_dir.display()))?;
    let progress = ProgressBar::new(0);
    progress.set_style(
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    progress.enable_steady_tick(Duration::from_millis(200));

    progress.set_message("measuring the machine's ceilings");
    let dir = data_dir.clone();
    let (sync, spawn) = tokio::task::spawn_blocking(move || {
        (ceilings::fdatasync_per_s(&dir, Duration::from_secs(1)), ceilings::spawn_per_s(Duration::from_secs(1)))
    })
    .await
    .map_err(|e| e.to_string())?;
    report.fdatasync_per_s = stats::round(sync.map_err(|e| format!("fdatasync probe: {e}"))?);
    report.spawn_per_s = stats::round(spawn.map_err(|e| format!("spawn probe: {e}"))?);
    if !matches!(args.mode, Some(BenchMode::Real(_))) {
        let store =
            ceilings::store_transitions_per_s(&data_dir, Duration::from_secs(2), STORE_PROBE_COMMITTERS).await?;
        report.store_transitions_per_s = stats::round(store);
    }

    let master = start_master(&args, &data_dir.join("master"), &progress).await?;
    let api = Api::new(&master.api, master.token.clone())?;
    let mut setup = Setup { api: api.clone(), master, progress: progress.clone(), data_dir: data_dir.clone() };
    let outcome = match &args.mode {
        None | Some(BenchMode::Scale) => {
            report.mode = "scale".into();
            scale::run(&args, &mut setup, &mut report).await
        }
        Some(BenchMode::Real(r)) => {
            report.mode = "real".into();
            real::run(r, &mut setup, &mut report).await
        }
        Some(BenchMode::Linearity) => {
            report.mode = "linearity".into();
            linearity::run(&args, &mut setup, &mut report).await
        }
        Some(BenchMode::Pools(_)) | Some(BenchMode::Failover(_)) => Err("this mode runs apart (see `run`)".into()),
    };
    progress.finish_and_clear();
    let reads = api.reads.summary();
    let whole = api.whole_cluster_reads.summary();
    let all = api.all_reads.summary();
    let writes = api.writes.summary();
    report.api.read_ms = Percentiles { p50: reads.p50, p99: reads.p99 };
    report.api.whole_cluster_read_ms = Percentiles { p50: whole.p50, p99: whole.p99 };
    report.api.all_read_ms = Percentiles { p50: all.p50, p99: all.p99 };
    report.api.write_ms = Percentiles { p50: writes.p50, p99: writes.p99 };
    report.api.reads = reads.count;
    report.api.whole_cluster_reads = whole.count;
    report.api.writes = writes.count;
    report.api.routes = api.routes.summaries();
    report.api.overloaded = api.overloaded.load(std::sync::atomic::Ordering::Relaxed);
    report.api.redirected = api.redirected.load(std::sync::atomic::Ordering::Relaxed);
    report.api.between_leaders = api.between_leaders.load(std::sync::atomic::Ordering::Relaxed);
    if report.mode == "scale" {
        report.judge();
    }
    setup.master.stop().await;
    if owned_dir && outcome.is_ok() {
        let _ = std::fs::remove_dir_all(&data_dir);
    }
    outcome.map_err(|e| format!("{e} (the master's log: {})", data_dir.join("master/master.log").display()))?;
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?;
        std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(report)
}

/// The master under test: `--api` if given, else a fresh child in `dir`
/// with the `--master-set` settings.
pub async fn start_master(
    args: &BenchArgs,
    dir: &std::path::Path,
    progress: &ProgressBar,
) -> Result<MasterProc, String> {
    let mut env: Vec<(String, String)> = args
        .master_set
        .iter()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (format!("FLOTILLA_MASTER_{}", k.to_ascii_uppercase()), v.to_string()))
        .collect();
    // The whole fleet is one host. Each simulated agent dials from its own
    // loopback address (`sim::address`), so the per-source handshake cap,
    // meant for a host among many, does not bind it; lifted all the same,
    // so a change of addressing cannot quietly throttle a run. The fleet
    // does fill /24s (250 agents each), so the per-subnet cap is lifted too.
    for cap in ["FLOTILLA_MASTER_MAX_AGENT_HANDSHAKES_PER_SOURCE", "FLOTILLA_MASTER_MAX_AGENT_HANDSHAKES_PER_SUBNET"] {
        if !env.iter().any(|(k, _)| k == cap) {
            env.push((cap.to_string(), "65536".to_string()));
        }
    }
    match (&args.api, &args.agent_addr) {
        (Some(api), Some(agents)) => {
            let agents = crate::agent::masters::Masters::parse(agents).map_err(|e| format!("--agent-addr: {e}"))?;
            Ok(MasterProc::attach(api, agents, args.token.clone()))
        }
        _ => {
            progress.set_message("starting the master");
            MasterProc::spawn_with_config(dir, &env, args.master_config.as_deref()).await
        }
    }
}

/// Refuses, before anything starts, a scale workload the flags cannot
/// describe, naming the flags (not the bench's package, which the master
/// would refuse only after the agents had connected).
fn check_workload(args: &BenchArgs) -> Result<(), String> {
    if matches!(args.mode, Some(BenchMode::Real(_))) || args.instances == 0 {
        return Ok(());
    }
    if args.clusters == 0 {
        return Err(format!("--clusters 0 cannot hold --instances {}: give at least 1", args.instances));
    }
    if args.clients == 0 {
        return Err("--clients must be at least 1".into());
    }
    let max = u64::from(crate::spec::model::MAX_COUNT);
    let per_cluster = args.instances.div_ceil(args.clusters as u64);
    if per_cluster > max {
        return Err(format!(
            "--instances {} over --clusters {} puts {per_cluster} in a cluster, more than a role may hold ({max}, \
             count.max): give --clusters {} or more",
            args.instances,
            args.clusters,
            args.instances.div_ceil(max)
        ));
    }
    Ok(())
}
