//! `flotilla bench` as a user runs it: the real binary, a master it starts
//! in a temp dir of its own, simulated agents, the whole workload (create,
//! scale-out, crashes, restart, reconfigure, scale-in). What is checked is
//! what a user sees: the exit status, the table on stdout, the `--json`
//! report, and that no master and no data dir are left behind; and for a
//! workload that cannot be placed, the error and the non-zero exit.
//!
//! The bench puts its data dir under `$TMPDIR` (`flotilla-bench-<pid>`), so
//! each run gets a `TMPDIR` of its own: the dir and the master it starts
//! (`flotilla master --data-dir <that dir>/master`) are known and watched
//! in `/proc` while it runs. The bench runs in a process group of its own,
//! killed whole if it overruns its time limit, so a hang fails the test
//! and leaves nothing running.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::{cmdline, pid_alive};

/// One finished `flotilla bench` run.
struct Run {
    status: ExitStatus,
    stdout: String,
    stderr: String,
    took: Duration,
    /// `$TMPDIR/flotilla-bench-<pid>`: the data dir the bench makes for itself.
    data_dir: PathBuf,
    /// Whether `data_dir` existed while the bench ran.
    data_dir_seen: bool,
    /// The `flotilla master` processes seen (in `/proc`) with their data
    /// dir under `data_dir`.
    masters_seen: BTreeSet<u32>,
    /// What still ran right after the bench exited (killed then): masters
    /// of its data dir, and processes of its process group.
    masters_left: Vec<(u32, Vec<String>)>,
    group_left: Vec<(u32, Vec<String>)>,
}

fn all_pids() -> Vec<u32> {
    std::fs::read_dir("/proc")
        .map(|d| d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect())
        .unwrap_or_default()
}

/// Live processes running `flotilla master` with a `--data-dir` under `dir`.
fn masters_under(dir: &Path) -> Vec<u32> {
    let dir = dir.to_string_lossy().to_string();
    all_pids()
        .into_iter()
        .filter(|pid| {
            let args = cmdline(*pid);
            args.get(1).is_some_and(|a| a == "master")
                && args.windows(2).any(|w| w[0] == "--data-dir" && w[1].starts_with(&dir))
        })
        .filter(|pid| pid_alive(*pid))
        .collect()
}

/// The process group of `pid` (field 5 of `/proc/<pid>/stat`).
fn pgrp(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.split_whitespace().nth(2)?.parse().ok()
}

/// Live (not zombie) processes in process group `group`.
fn live_in_group(group: u32) -> Vec<(u32, Vec<String>)> {
    all_pids()
        .into_iter()
        .filter(|pid| pgrp(*pid) == Some(group) && pid_alive(*pid))
        .map(|pid| (pid, cmdline(pid)))
        .collect()
}

/// Runs `flotilla bench ARGS` with `$TMPDIR` = `tmp`, watching `/proc`
/// while it runs; killed (its whole process group) and failed after `limit`.
async fn bench(tmp: &Path, args: &[&str], limit: Duration) -> Run {
    let out_path = tmp.join("bench.stdout");
    let err_path = tmp.join("bench.stderr");
    let bench_tmp = tmp.join("tmp");
    std::fs::create_dir_all(&bench_tmp).expect("bench TMPDIR");
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .arg("bench")
        .args(args)
        .env("TMPDIR", &bench_tmp)
        .env_remove("FLOTILLA_TOKEN")
        .env_remove("FLOTILLA_BENCH_MASTER_LOG")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path).expect("stdout file"))
        .stderr(std::fs::File::create(&err_path).expect("stderr file"))
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .expect("start flotilla bench");
    let pid = child.id().expect("the bench's pid");
    let data_dir = bench_tmp.join(format!("flotilla-bench-{pid}"));
    let mut data_dir_seen = false;
    let mut masters_seen = BTreeSet::new();
    let started = Instant::now();
    let waited = tokio::time::timeout(limit, async {
        loop {
            tokio::select! {
                status = child.wait() => return status.expect("wait for the bench"),
                _ = tokio::time::sleep(Duration::from_millis(100)) => {
                    data_dir_seen |= data_dir.is_dir();
                    masters_seen.extend(masters_under(&data_dir));
                }
            }
        }
    })
    .await;
    let took = started.elapsed();
    let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
    let status = match waited {
        Ok(status) => status,
        Err(_) => {
            // The bench and the master it started share the group.
            let group = nix::unistd::Pid::from_raw(pid as i32);
            let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
            for m in masters_under(&data_dir) {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(m as i32), nix::sys::signal::Signal::SIGKILL);
            }
            let _ = child.wait().await;
            panic!(
                "flotilla bench {args:?} did not finish within {limit:?} (killed)\nstdout:\n{}\nstderr:\n{}",
                read(&out_path),
                read(&err_path)
            );
        }
    };
    let masters_left: Vec<(u32, Vec<String>)> = masters_under(&data_dir).into_iter().map(|p| (p, cmdline(p))).collect();
    let group_left = live_in_group(pid);
    // Killed here, so that a failing test leaves nothing running.
    for (p, _) in masters_left.iter().chain(&group_left) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(*p as i32), nix::sys::signal::Signal::SIGKILL);
    }
    Run {
        status,
        stdout: read(&out_path),
        stderr: read(&err_path),
        took,
        data_dir,
        data_dir_seen,
        masters_seen,
        masters_left,
        group_left,
    }
}

/// Nothing of the run is left running: no master it started, nothing in
/// its process group.
fn assert_nothing_left_running(run: &Run) {
    assert!(
        !run.masters_seen.is_empty(),
        "no `flotilla master --data-dir {}/master` was seen while the bench ran\nstderr:\n{}",
        run.data_dir.display(),
        run.stderr
    );
    assert_eq!(run.masters_left, Vec::new(), "the bench's master still ran after the bench exited");
    assert_eq!(run.group_left, Vec::new(), "processes of the bench's process group still ran after it exited");
}

/// The value of the table row `label`: rows are `  LABEL VALUE` with the
/// label padded to 34 columns, so a shorter label ends in two spaces or more
/// ("master CPU" is not "master CPU with idle agents").
fn row<'a>(table: &'a str, label: &str) -> &'a str {
    table
        .lines()
        .find_map(|l| {
            let rest = l.trim_start().strip_prefix(label)?;
            let value = rest.trim_start();
            let gap = rest.len() - value.len();
            (gap >= 2 || (gap == 1 && label.len() >= 34)).then_some(value.trim_end())
        })
        .unwrap_or_else(|| panic!("no row {label:?} in the table:\n{table}"))
}

/// The numbers in a table value, in order: "1.5 / 2 ms (3 reads)" gives
/// 1.5, 2, 3; "12.5/s" gives 12.5; words such as "p50" are skipped.
fn numbers(value: &str) -> Vec<f64> {
    value
        .split_whitespace()
        .map(|w| w.trim_matches(|c| matches!(c, '(' | ')' | ',')))
        .map(|w| w.strip_suffix("/s").unwrap_or(w))
        .filter_map(|w| w.parse::<f64>().ok())
        .collect()
}

fn num(v: &Value, path: &str) -> f64 {
    let mut at = v;
    for k in path.split('.') {
        at = &at[k];
    }
    at.as_f64().unwrap_or_else(|| panic!("{path} is not a number in the report: {at}"))
}

/// p50 <= p99 <= max, all above zero, in an operation summary.
fn assert_ordered(what: &str, o: &Value, p50: &str, p99: &str, max: &str) {
    let (a, b, c) = (num(o, p50), num(o, p99), num(o, max));
    assert!(a > 0.0 && a <= b && b <= c, "{what}: want 0 < p50 <= p99 <= max, got {o}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_runs_the_whole_workload_prints_the_table_writes_the_json_and_cleans_up() {
    let tmp = tempfile::Builder::new().prefix("flotilla-bench-cli-").tempdir().expect("temp dir");
    let json_path = tmp.path().join("report.json");
    let json_arg = json_path.to_string_lossy().to_string();
    let args = [
        "--agents",
        "5",
        "--instances",
        "60",
        "--clusters",
        "3",
        "--clients",
        "3",
        "--step",
        "10",
        "--crashes",
        "2",
        "--json",
        &json_arg,
    ];
    let run = bench(tmp.path(), &args, Duration::from_secs(240)).await;
    assert!(
        run.status.success(),
        "flotilla bench {args:?}: {}\nstdout:\n{}\nstderr:\n{}",
        run.status,
        run.stdout,
        run.stderr
    );
    eprintln!("flotilla bench took {:.1} s", run.took.as_secs_f64());

    // The report.
    let text = std::fs::read_to_string(&json_path).expect("the --json report was written");
    let r: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("the report is not JSON ({e}):\n{text}"));
    assert_eq!(r["mode"], "scale", "{r:#}");
    assert_eq!(r["agents"], 5, "{r:#}");
    assert_eq!(r["instances"], 60, "{r:#}");
    assert_eq!(r["clusters"], 3, "{r:#}");
    assert_eq!(r["clients"], 3, "{r:#}");
    assert_eq!(r["failures"], 0, "{r:#}");
    assert_eq!(r["running_in_simulator"], 60, "every placed instance runs in the simulator: {r:#}");
    assert_eq!(r["master_measured"], true, "the bench's own master is its child: {r:#}");
    for k in [
        "placements_per_s",
        "placement_secs",
        "durable_transitions_per_s",
        "fdatasync_per_s",
        "store_transitions_per_s",
        "spawn_per_s",
        "master_rss_mb",
        "master_rss_idle_mb",
        "master_rss_rest_mb",
        "sim_rss_per_agent_kb",
    ] {
        assert!(num(&r, k) > 0.0, "{k} > 0: {r:#}");
    }
    for k in ["master_cpu_pct", "master_cpu_ms_per_instance", "idle_master_cpu_pct"] {
        assert!(num(&r, k) >= 0.0, "{k} >= 0: {r:#}");
    }
    let api = &r["api"];
    for k in ["read_ms", "whole_cluster_read_ms", "all_read_ms", "write_ms"] {
        let (p50, p99) = (num(api, &format!("{k}.p50")), num(api, &format!("{k}.p99")));
        assert!(p50 > 0.0 && p50 <= p99, "api.{k}: want 0 < p50 <= p99: {api:#}");
    }
    assert!(num(api, "get_largest_cluster_ms") > 0.0, "{api:#}");
    assert!(num(api, "reads") > 0.0, "the readers polled the API: {api:#}");
    // Whole clusters apart: the crashes and the scale-ins read them (3
    // clusters: 3 scale-ins, each crash at least twice), and the largest
    // cluster five times.
    assert!(num(api, "whole_cluster_reads") >= 3.0 + 2.0 * 2.0 + 5.0, "{api:#}");
    assert_eq!(
        num(api, "whole_cluster_reads"),
        num(api, "routes.GET /clusters/{}.count"),
        "whole-cluster reads are the GET /clusters/{{}} route: {api:#}"
    );
    let (bounded, whole, all) =
        (num(api, "read_ms.p99"), num(api, "whole_cluster_read_ms.p99"), num(api, "all_read_ms.p99"));
    assert!(
        all >= bounded.min(whole) && all <= bounded.max(whole),
        "all reads' p99 {all} lies between {bounded} and {whole}"
    );
    // One write per operation at least (15), plus the join token.
    assert!(num(api, "writes") >= 16.0, "{api:#}");
    for route in ["POST /clusters", "POST /clusters/{}/scale", "POST /clusters/{}/restart", "PATCH /clusters/{}/config"]
    {
        let o = &api["routes"][route];
        assert!(num(o, "count") >= 1.0, "route {route} timed: {api:#}");
        assert_ordered(route, o, "p50_ms", "p99_ms", "max_ms");
    }

    // Each kind of operation, as many as the workload makes: a create and
    // a scale-out (10 + 10 = 20 each) per cluster, then a restart, a
    // reconfigure and a scale-in of every cluster.
    let ops = r["operations"].as_object().unwrap_or_else(|| panic!("no operations: {r:#}"));
    let kinds: BTreeSet<&str> = ops.keys().map(String::as_str).collect();
    assert_eq!(kinds, BTreeSet::from(["Create", "Reconfigure", "Restart", "ScaleIn", "ScaleOut"]), "{r:#}");
    for (kind, o) in ops {
        assert_eq!(o["count"], 3, "{kind}: one per cluster: {o}");
        assert_ordered(kind, o, "p50_ms", "p99_ms", "max_ms");
    }

    // The crashes: each timed until the API showed it.
    let exits = &r["exit_visible_ms"];
    assert_eq!(exits["count"], 2, "{r:#}");
    assert_ordered("exit_visible_ms", exits, "p50", "p99", "max");

    // The targets the run can judge, each consistent with its figure.
    let targets = r["targets"].as_object().unwrap_or_else(|| panic!("no targets: {r:#}"));
    let keys: BTreeSet<&str> = targets.keys().map(String::as_str).collect();
    let want = BTreeSet::from([
        "B1_placements_per_s",
        "B2_transitions_per_fdatasync",
        "B5_read_p99_ms",
        "B5_whole_cluster_read_p99_ms",
        "B5_get_largest_cluster_ms",
        "B5_write_p99_ms",
        "B8_rss_mb_per_10k_instances",
        "B9_idle_master_cpu_pct_per_1000_agents",
        "B10_exit_visible_p99_ms",
        "B12_sim_kb_per_agent",
    ]);
    assert_eq!(keys, want, "{:#}", r["targets"]);
    for (k, t) in targets {
        let figure = num(t, "figure");
        let target = t["target"].as_str().unwrap_or_else(|| panic!("{k}: no target: {t}"));
        let met = t["met"].as_bool().unwrap_or_else(|| panic!("{k}: met is not a bool: {t}"));
        let should = match target.split_once(' ') {
            Some(("<=", v)) => figure <= v.parse::<f64>().expect("target bound"),
            Some((">=", v)) => figure >= v.parse::<f64>().expect("target bound"),
            _ => panic!("{k}: target {target:?} is neither <= nor >="),
        };
        assert_eq!(met, should, "{k}: met does not follow from figure {figure} and target {target}");
    }
    for (k, figure) in [
        ("B1_placements_per_s", "placements_per_s"),
        ("B5_read_p99_ms", "api.read_ms.p99"),
        ("B5_write_p99_ms", "api.write_ms.p99"),
        ("B5_whole_cluster_read_p99_ms", "api.whole_cluster_read_ms.p99"),
        ("B5_get_largest_cluster_ms", "api.get_largest_cluster_ms"),
        ("B10_exit_visible_p99_ms", "exit_visible_ms.p99"),
        ("B12_sim_kb_per_agent", "sim_rss_per_agent_kb"),
    ] {
        assert_eq!(num(&targets[k], "figure"), num(&r, figure), "{k} judges {figure}");
    }
    // Whole clusters (20 instances here) get the bounded reads' 10 ms: B5's
    // 25 us per instance (250 ms for 10,000) would give them less.
    for k in ["B5_whole_cluster_read_p99_ms", "B5_get_largest_cluster_ms"] {
        assert_eq!(targets[k]["target"], "<= 10", "{k}: {:#}", targets[k]);
    }

    // The table on stdout: the same figures.
    let t = &run.stdout;
    assert_eq!(row(t, "agents (simulated)"), "5", "{t}");
    assert_eq!(row(t, "instances placed"), "60", "{t}");
    assert_eq!(
        numbers(row(t, "placed per second")),
        vec![num(&r, "placements_per_s"), num(&r, "placement_secs")],
        "placed per second (seconds): {t}"
    );
    for (label, key) in [
        ("durable transitions per second", "durable_transitions_per_s"),
        ("fdatasync ceiling (one writer)", "fdatasync_per_s"),
        ("spawn ceiling (/bin/true)", "spawn_per_s"),
        ("GET of the largest cluster", "api.get_largest_cluster_ms"),
    ] {
        assert_eq!(numbers(row(t, label)), vec![num(&r, key)], "{label}: {t}");
    }
    let alone = numbers(row(t, "store alone: transitions per second"));
    assert_eq!(alone[0], num(&r, "store_transitions_per_s"), "{t}");
    let ratio = num(&r, "store_transitions_per_s") / num(&r, "fdatasync_per_s");
    assert!(
        (alone[1] - ratio).abs() <= 0.01 * ratio.max(1.0),
        "store alone: {} x fdatasync, want {ratio}: {t}",
        alone[1]
    );
    assert_eq!(
        numbers(row(t, "master RSS"))[..3],
        [num(&r, "master_rss_mb"), num(&r, "master_rss_rest_mb"), num(&r, "master_rss_idle_mb")],
        "{t}"
    );
    assert_eq!(numbers(row(t, "master CPU"))[0], num(&r, "master_cpu_pct"), "{t}");
    assert_eq!(
        numbers(row(t, "API read p50 / p99")),
        vec![num(&r, "api.read_ms.p50"), num(&r, "api.read_ms.p99"), num(&r, "api.reads")],
        "{t}"
    );
    assert_eq!(
        numbers(row(t, "whole-cluster GET p50 / p99")),
        vec![
            num(&r, "api.whole_cluster_read_ms.p50"),
            num(&r, "api.whole_cluster_read_ms.p99"),
            num(&r, "api.whole_cluster_reads")
        ],
        "{t}"
    );
    assert_eq!(
        numbers(row(t, "all reads p50 / p99")),
        vec![num(&r, "api.all_read_ms.p50"), num(&r, "api.all_read_ms.p99")],
        "{t}"
    );
    assert_eq!(
        numbers(row(t, "API write p50 / p99")),
        vec![num(&r, "api.write_ms.p50"), num(&r, "api.write_ms.p99"), num(&r, "api.writes")],
        "{t}"
    );
    assert_eq!(
        numbers(row(t, "exit -> visible p50 / p99")),
        vec![num(&r, "exit_visible_ms.p50"), num(&r, "exit_visible_ms.p99")],
        "{t}"
    );
    for (kind, o) in ops {
        assert_eq!(
            numbers(row(t, &format!("op {kind}"))),
            vec![num(o, "count"), num(o, "p50_ms"), num(o, "p99_ms"), num(o, "max_ms")],
            "{t}"
        );
    }
    for (k, v) in targets {
        let shown = row(t, k);
        let mark = if v["met"] == true { " met" } else { " MISSED" };
        assert!(shown.ends_with(mark), "target {k}: {shown:?} should end with {mark:?}: {t}");
        assert_eq!(numbers(shown)[0], num(v, "figure"), "target {k}: {t}");
    }

    // Cleaned up: its master stopped, its own data dir removed.
    assert_nothing_left_running(&run);
    assert!(run.data_dir_seen, "the bench's data dir {} was never seen", run.data_dir.display());
    assert!(!run.data_dir.exists(), "the bench left its data dir {} behind", run.data_dir.display());
}

/// A cluster of 10,001 instances: above the role's maximum count (10,000),
/// so the package the bench makes for it is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_refuses_a_workload_its_flags_cannot_describe_before_starting_anything() {
    let tmp = tempfile::Builder::new().prefix("flotilla-bench-cli-").tempdir().expect("temp dir");
    let json_path = tmp.path().join("report.json");
    let json_arg = json_path.to_string_lossy().to_string();
    let cases: [(&[&str], &[&str]); 3] = [
        // 10,001 in one cluster: above what a role may hold.
        (&["--instances", "10001", "--clusters", "1"], &["--instances 10001", "--clusters 1", "10000", "--clusters 2"]),
        (&["--instances", "10", "--clusters", "0"], &["--clusters 0", "--instances 10"]),
        (&["--instances", "10", "--clients", "0"], &["--clients"]),
    ];
    for (flags, words) in cases {
        let args: Vec<&str> = ["--agents", "2", "--json", &json_arg].iter().chain(flags).copied().collect();
        let run = bench(tmp.path(), &args, Duration::from_secs(60)).await;
        let said = format!("flotilla bench {args:?}\nstdout:\n{}\nstderr:\n{}", run.stdout, run.stderr);
        assert_eq!(run.status.code(), Some(1), "{said}");
        // The error is the last line (warnings the bench logs may come first).
        let err = run.stderr.trim().lines().last().unwrap_or_default();
        assert!(err.starts_with("flotilla: "), "{said}");
        for w in words {
            assert!(err.contains(w), "the error should name {w:?}: {err}");
        }
        // Refused before anything started: no master, no data dir, no report.
        assert!(run.took < Duration::from_secs(5), "refused only after {:?}: {said}", run.took);
        assert!(run.masters_seen.is_empty(), "a master was started for a refused workload: {said}");
        assert!(!run.data_dir_seen && !run.data_dir.exists(), "{} was made: {said}", run.data_dir.display());
        assert!(!run.stdout.contains("placed per second"), "{said}");
        assert!(!json_path.exists(), "a refused run wrote {}", json_path.display());
        assert_eq!(run.group_left, Vec::new(), "processes of the bench's process group still ran after it exited");
    }
}

/// `flotilla bench pools` end to end, small: a master with a `sim` pool,
/// the bench playing the machines; every request fulfilled, the figures
/// printed.
#[test]
fn bench_pools_serves_every_request_and_prints_its_figures() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args(["bench", "--data-dir"])
        .arg(dir.path())
        .args(["pools", "--requests", "30", "--create-ms", "50-300"])
        .output()
        .expect("run flotilla bench pools");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("30 filed, 30 fulfilled, 0 failed"), "{text}");
    for row in ["fulfilled per second", "request -> node ready", "master CPU per launch"] {
        assert!(text.contains(row), "{row}: {text}");
    }
}

/// `bench failover` on three real etcd members and three real masters:
/// every kill and pause is followed by a write on the next leader, a
/// killed leader is replaced well within its lease, a paused one only
/// when its lease expires (nothing may revoke a live leader's lease), and
/// no read on a surviving master fails meanwhile. Under load: simulated
/// agents that know every master, 2,000 simulated instances, two clients
/// scaling out through the kills, each new leader booting from its
/// follower's view where that passes its check: every operation stored
/// ends `Succeeded`.
#[tokio::test]
async fn bench_failover_times_leader_loss_and_no_read_fails() {
    let _ports = crate::common::dev::HA_PORTS.lock().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let json = dir.path().join("f.json");
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args(["bench", "--data-dir"])
        .arg(dir.path().join("run"))
        .arg("--json")
        .arg(&json)
        .args(["failover", "--kills", "3", "--pauses", "1", "--reads", "100"])
        .args(["--agents", "10", "--instances", "2000", "--clients", "2", "--takeover", "view"])
        .output()
        .await
        .expect("run flotilla bench failover");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    for row in ["leader SIGKILL -> write accepted", "leader SIGSTOP -> write accepted", "reads on a follower"] {
        assert!(text.contains(row), "{row}: {text}");
    }
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).expect("the JSON report")).unwrap();
    let f = &report["failover"];
    assert_eq!((f["kills"]["count"].as_u64(), f["pauses"]["count"].as_u64()), (Some(3), Some(1)), "{f:#}");
    assert_eq!(f["reads_failed"], 0, "{f:#}");
    let ttl_ms = f["lease_ttl_s"].as_f64().unwrap() * 1000.0;
    assert!(f["kills"]["max"].as_f64().unwrap() < ttl_ms, "a killed leader waited out its lease: {f:#}");
    assert!(f["pauses"]["p50"].as_f64().unwrap() >= ttl_ms * 0.5, "a paused leader lost its lease early: {f:#}");
    // Each new leader said how it took over (from its view when that
    // passed the keys-only check against the store, else from the store).
    assert_eq!(f["took_over_ms"]["count"], 4, "{f:#}");
    let load = &f["load"];
    assert_eq!(load["ops_failed"], 0, "{load:#}");
    assert!(load["ops_accepted"].as_u64().unwrap() > 0, "no scale-out ran through the kills: {load:#}");
    assert_eq!(load["ops_accepted"], load["ops_succeeded"], "{load:#}");
    let stored = load["stored_operations"].as_object().unwrap_or_else(|| panic!("{load:#}"));
    assert_eq!(stored.get("Create Succeeded").and_then(|n| n.as_u64()), Some(2), "{load:#}");
    for (kind_status, n) in stored {
        assert!(kind_status.ends_with(" Succeeded"), "{n} operations {kind_status}: {load:#}");
    }
}
