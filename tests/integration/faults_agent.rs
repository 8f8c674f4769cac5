//! Faults of the agent, injected for real (issue 9): the agent process
//! SIGKILLed again and again, restarted without its RocksDB, restarted
//! after a "reboot" (its records carry another boot id), killed in the
//! middle of a delete; and an instance in a crash loop that the operator
//! stops while its restart is pending.
//!
//! Each test checks the invariants that apply: at most one live copy of
//! an instance (read in `/proc` by the `FLOTILLA_INSTANCE` marker, and by
//! each process's start time, field 22 of `/proc/<pid>/stat`); no process
//! flotilla does not own is signalled; nothing is left running or on disk
//! once the instance is gone.

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use flotilla::storage::agent_records::PidIdentity;
use flotilla::storage::{AgentStore, WriteOp};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::{Value, json};

use crate::common::faulty::install_leftovers;
use crate::common::scripts::{RECORD_AND_SLEEP, started_at};
use crate::common::{
    PackageBuilder, TestEnv, all_instances, dir_of, eventually, id_of, instance_pids, pid_alive, pid_of,
};

/// A foreground role and a daemonizing one (pidfile; the agent is not the
/// daemon's parent), both recording each start in `data/started_at`.
const SPEC: &str = r#"
[component]
name = "af"
version = "1.0.0"

[[roles]]
name = "fg"
count = { min = 1, max = 5 }
start = ["bin/start.sh"]
stop_grace = "2s"

[[roles]]
name = "daemon"
count = { min = 0, max = 3 }
start = ["bin/daemon.sh"]
pidfile = "run/daemon.pid"
stop_grace = "2s"
"#;

const DAEMON: &str = "set -eu\ndate +%s%N >> data/started_at\nsleep 200001 </dev/null >/dev/null 2>&1 &\necho $! > run/daemon.pid\nexit 0\n";

fn package() -> PackageBuilder {
    PackageBuilder::new("af", "1.0.0")
        .spec(SPEC)
        .script("bin/start.sh", RECORD_AND_SLEEP)
        .script("bin/daemon.sh", DAEMON)
}

/// Field 22 of `/proc/<pid>/stat`: the process's start time in clock
/// ticks after boot (`None` when the pid is gone).
pub fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name, which is in parentheses: field 3 first.
    stat.rsplit_once(')')?.1.split_whitespace().nth(19)?.parse().ok()
}

/// Every instance of `cluster` on `node`: id -> (pid, start time).
fn identities(cluster: &Value) -> BTreeMap<String, (u32, u64)> {
    all_instances(cluster)
        .iter()
        .map(|i| {
            let pid = pid_of(i);
            (id_of(i), (pid, start_time(pid).unwrap_or_else(|| panic!("{pid} of {} is not running", id_of(i)))))
        })
        .collect()
}

/// Every instance runs exactly the process it ran at first: one live
/// process tree (one process here) carrying its marker, with the same pid
/// and start time, started once.
fn assert_same_single_copies(cluster: &Value, first: &BTreeMap<String, (u32, u64)>, when: &str) {
    for i in all_instances(cluster) {
        let id = id_of(&i);
        let (pid, started) = first[&id];
        assert_eq!(instance_pids(&id), vec![pid], "{when}: {id} must run exactly its first process {pid}");
        assert_eq!(start_time(pid), Some(started), "{when}: pid {pid} of {id} is another process now");
        assert_eq!(started_at(&i).len(), 1, "{when}: {id} was started again");
    }
}

/// Agent `kill -9` in a loop, 10 times, while its instances run: the
/// processes keep running and each agent re-adopts them (same pid and start
/// time); no second copy is started; the master keeps them `Running` with
/// the same pid, runs no operation, and the cluster stays `Active`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_killed_ten_times_readopts_every_process() {
    let mut env = TestEnv::start("faults-agent-loop").await;
    env.upload(&package()).await;
    let body = json!({"name": "kl", "package": {"name": "af", "version": "1.0.0"},
        "roles": {"fg": {"count": 3, "nodes": ["node-1"]}, "daemon": {"count": 1, "nodes": ["node-1"]}}});
    let cluster = env.create_active(body).await;
    // The daemon's pidfile can name the forked child before it exec'd:
    // wait until every process is the server itself.
    let settled = eventually(5, || {
        all_instances(&cluster).iter().all(|i| {
            let pids = instance_pids(&id_of(i));
            pids == [pid_of(i)] && crate::common::cmdline(pid_of(i)).first().map(String::as_str) == Some("sleep")
        })
    })
    .await;
    assert!(settled, "the instances did not settle to one sleep each");
    let first = identities(&cluster);
    assert_same_single_copies(&cluster, &first, "before any kill");

    let began = Instant::now();
    let mut reconnects = Vec::new();
    for round in 1..=10u64 {
        env.kill_agent(1);
        // Dead for a varying while: 0 to 450 ms.
        tokio::time::sleep(Duration::from_millis(round * 50 % 500)).await;
        let back = Instant::now();
        env.restart_agent(1).await;
        // Ready may still be the dead agent's link: wait for the new one.
        let connects = round as usize + 1;
        let up = eventually(15, || env.agent_log(1).matches("connected to master").count() >= connects).await;
        assert!(up, "round {round}: the new agent never connected\n{}", env.log_tails());
        env.wait_ready().await;
        reconnects.push(back.elapsed());
        // Its inventory reconciled by the master (nothing may change).
        tokio::time::sleep(Duration::from_millis(300)).await;
        let c = env.cluster("kl").await;
        assert_eq!(c["status"], "Active", "round {round}: {c:#}");
        for i in all_instances(&c) {
            assert_eq!(i["status"], "Running", "round {round}: {i:#}");
            assert_eq!(i["pid"].as_u64(), Some(first[&id_of(&i)].0 as u64), "round {round}: {i:#}");
        }
        assert_same_single_copies(&c, &first, &format!("after kill {round}"));
    }
    let took = began.elapsed();
    // Past any restart delay a confused agent might be waiting out.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let c = env.cluster("kl").await;
    assert_same_single_copies(&c, &first, "1.5 s after the last restart");
    let log = env.agent_log(1);
    let adopted = log.matches("re-adopted running process").count();
    assert_eq!(adopted, 40, "each of 10 agent starts re-adopts 4 processes; the log says {adopted}");
    assert!(!log.contains("process is gone since the agent stopped"), "{log}");
    let (_, ops) = env.get("/operations?cluster=kl").await;
    assert_eq!(ops["operations"].as_array().map(Vec::len), Some(1), "only the create ran: {ops:#}");

    // The adopted processes are still under control: a stop leaves none.
    env.run_ok("/clusters/kl/stop", None).await;
    for (id, (pid, _)) in &first {
        assert!(!pid_alive(*pid), "{id}: {pid} survived a stop after the agent restarts");
        assert_eq!(instance_pids(id), Vec::<u32>::new());
    }
    eprintln!("faults-agent-loop: 10 kills in {took:?}; agent back and Ready after {reconnects:?}");
}

/// The agent restarted with its RocksDB deleted: it holds no record, so it
/// reports none; it must not start a second copy of the instances still
/// running, and the master marks them `Lost` (it cannot know their state).
/// A start of the cluster then installs them again (package and rendered
/// files; the agent first ends what is left of each on its node) and
/// starts them, also the one an operator stopped meanwhile (`Stopped`, so
/// known only by the agent's "not installed"): each runs exactly one
/// process and the cluster is `Active`.
/// A delete then removes everything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_restarted_without_its_db_starts_no_second_copy() {
    let mut env = TestEnv::start("faults-agent-nodb").await;
    env.upload(&package()).await;
    let body = json!({"name": "nd", "package": {"name": "af", "version": "1.0.0"},
        "roles": {"fg": {"count": 2, "nodes": ["node-1"]}}});
    let cluster = env.create_active(body).await;
    let first = identities(&cluster);

    env.kill_agent(1);
    let db = env.agent_dir(1).join("db");
    std::fs::remove_dir_all(&db).unwrap_or_else(|e| panic!("removing {}: {e}", db.display()));
    env.restart_agent(1).await;

    let c = env
        .until(15, "the master marks the instances Lost", async || {
            let c = env.cluster("nd").await;
            if all_instances(&c).iter().all(|i| i["status"] == "Lost") { Ok(c) } else { Err(format!("{c:#}")) }
        })
        .await;
    // Longer than a restart delay: still nothing started.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_same_single_copies(&c, &first, "after the agent came back without its db");
    for i in all_instances(&c) {
        assert!(i["pid"].is_null(), "a Lost instance shows no pid: {i:#}");
        let why = i["last_error"].as_str().unwrap_or_default();
        assert!(why.contains("no longer holds"), "{i:#}");
    }

    // One of them stopped by the operator reads `Stopped`, not `Lost`
    // (its agent holds nothing to stop): the start finds out from the
    // agent's answer ("not installed") instead.
    let stopped = id_of(&all_instances(&c)[1]);
    env.run_ok(&format!("/clusters/nd/instances/{stopped}/stop"), None).await;
    let s = all_instances(&env.cluster("nd").await).into_iter().find(|i| id_of(i) == stopped).unwrap();
    assert_eq!(s["status"], "Stopped", "{s:#}");

    // A start installs each instance its node no longer holds again, then
    // starts it: the leftover process is ended first, so exactly one copy
    // runs.
    let op = env.run_ok("/clusters/nd/start", None).await;
    let c = env.cluster("nd").await;
    assert_eq!(c["status"], "Active", "after the start: {c:#}\n{op:#}");
    for i in all_instances(&c) {
        let id = id_of(&i);
        assert_eq!(i["status"], "Running", "{i:#}\n{op:#}");
        let pid = pid_of(&i);
        assert_eq!(instance_pids(&id), vec![pid], "{id}: exactly one process after the start");
        assert_ne!(pid, first[&id].0, "{id}: the leftover of before the db loss is ended, not adopted");
        assert!(!pid_alive(first[&id].0), "{id}: its leftover {} survived the reinstall", first[&id].0);
        // `data/` is carried across the reinstall: two starts recorded.
        assert_eq!(started_at(&i).len(), 2, "{id}: started once before and once by the start");
    }
    // Its files could not be put in line first (the agent holds nothing),
    // so the start step's result for each says it was installed again.
    let results_of = |prefix: &str| -> Vec<&Value> {
        op["steps"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|s| s["name"].as_str().is_some_and(|n| n.starts_with(prefix)))
            .flat_map(|s| s["results"].as_array().unwrap())
            .collect()
    };
    let refreshed = results_of("refresh-files");
    assert_eq!(refreshed.len(), 2, "one refresh per instance: {op:#}");
    assert!(refreshed.iter().all(|r| r["message"].as_str().is_some_and(|m| m.starts_with("not held"))), "{op:#}");
    let results = results_of("start-order");
    assert_eq!(results.len(), 2, "one start result per instance: {op:#}");
    for r in &results {
        let m = r["message"].as_str().unwrap_or_default();
        assert!(r["ok"] == true && m.starts_with("installed (") && m.contains("then started as pid"), "{op:#}");
    }
    let (_, ops) = env.get("/operations?cluster=nd").await;
    assert!(ops["operations"].as_array().is_some_and(|o| o.len() == 3), "create, stop and start only: {ops:#}");

    // A delete removes everything: the agent holds the records again.
    let (status, resp) = env.delete("/clusters/nd").await;
    assert_eq!(status, 202, "{resp:#}");
    env.assert_succeeded(&env.wait_op(resp["operation"]["id"].as_str().unwrap()).await);
    for i in all_instances(&c) {
        let id = id_of(&i);
        assert_eq!(instance_pids(&id), Vec::<u32>::new(), "{id}: a process survived the delete");
        assert!(!dir_of(&i).exists(), "{id}: {} survived the delete", dir_of(&i).display());
    }
}

/// A process the test owns (not flotilla's): `sleep`, its own child.
fn bystander() -> Child {
    Command::new("sleep")
        .arg("100007")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn a bystander process")
}

/// Rewrites the agent's records offline (the agent is stopped), through
/// flotilla's own storage API: `change` edits each instance record.
async fn edit_agent_records(dir: &std::path::Path, mut change: impl FnMut(&mut PidIdentity, &str)) {
    let store = AgentStore::open(dir).unwrap_or_else(|e| panic!("opening {}: {e}", dir.display()));
    let snap = store.load_all().expect("load the agent's records");
    let mut ops = Vec::new();
    for mut rec in snap.instances {
        let id = rec.id.as_str().to_string();
        let pid = rec.pid.as_mut().unwrap_or_else(|| panic!("{id} has no recorded pid"));
        change(pid, &id);
        ops.push(WriteOp::put_agent_instance(&rec).expect("encode a record"));
    }
    store.writer().commit(ops).await.expect("write the records");
}

/// A host "reboot": the agent's records carry the boot id of another boot.
/// Their pids mean nothing now, whatever runs under them: one record names
/// a live process the test owns (same pid and start time; only the boot
/// differs), the other its real process. The agent never signals the
/// test's process (by its recorded pid or otherwise), and reports the
/// instances not running (`Failed`). Both real processes it kills at its
/// start, found by their marker, not their pid: they are flotilla's, and
/// no record says they run (orphans, as a start cut short between its
/// spawn and its record leaves). The operator's start then gives each exactly
/// one copy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_reboot_no_recorded_pid_is_signalled() {
    let mut env = TestEnv::start("faults-agent-reboot").await;
    env.upload(&package()).await;
    let body = json!({"name": "rb", "package": {"name": "af", "version": "1.0.0"},
        "roles": {"fg": {"count": 2, "nodes": ["node-1"]}}});
    let cluster = env.create_active(body).await;
    let first = identities(&cluster);
    let ids: Vec<String> = first.keys().cloned().collect();
    let mut other = bystander();
    let other_pid = other.id();
    let other_start = start_time(other_pid).expect("the bystander runs");

    env.kill_agent(1);
    edit_agent_records(&env.agent_dir(1).join("db"), |pid, id| {
        if id == ids[0] {
            *pid = PidIdentity { pid: other_pid, start_time: other_start, boot_id: "a-previous-boot".into() };
        } else {
            pid.boot_id = "a-previous-boot".into();
        }
    })
    .await;
    env.restart_agent(1).await;

    let c = env
        .until(15, "the master sees the instances not running", async || {
            let c = env.cluster("rb").await;
            if all_instances(&c).iter().all(|i| i["status"] == "Failed") { Ok(c) } else { Err(format!("{c:#}")) }
        })
        .await;
    let log = env.agent_log(1);
    assert_eq!(log.matches("process is gone since the agent stopped").count(), 2, "{log}");
    assert!(!log.contains("re-adopted running process"), "a pid of another boot was adopted:\n{log}");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(start_time(other_pid), Some(other_start), "the bystander {other_pid} was killed");
    for id in &ids {
        assert!(!pid_alive(first[id].0), "the orphan of {id} (its marker says it is flotilla's) still runs");
    }
    assert_eq!(log.matches("killed what an interrupted start left running").count(), 2, "{log}");
    for i in all_instances(&c) {
        assert_eq!(started_at(&i).len(), 1, "{} was started again on its own", id_of(&i));
    }

    env.run_ok("/clusters/rb/start", None).await;
    let c = env.cluster("rb").await;
    for i in all_instances(&c) {
        assert_eq!(instance_pids(&id_of(&i)), vec![pid_of(&i)], "exactly one copy of {}", id_of(&i));
    }
    env.run_ok("/clusters/rb/stop", None).await;
    assert!(pid_alive(other_pid), "the bystander {other_pid} was killed by the start or the stop");
    assert_eq!(start_time(other_pid), Some(other_start));
    let _ = other.kill();
    let _ = other.wait();
}

/// An instance whose directory holds 150,000 files: removing it (the
/// last part of the agent's delete, after the tombstone and the stop)
/// takes long enough to kill the agent in the middle of it.
const MANY_FILES: &str = "set -eu\nmkdir -p data/many\ncd data/many\nseq 1 150000 | xargs touch\ncd ../..\ndate +%s%N >> data/started_at\nexec sleep 100000\n";

fn entries(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir).map(|rd| rd.count()).unwrap_or(0)
}

/// The agent SIGKILLed in the middle of a delete (while it removes the
/// instance's directory, its tombstone written): on its restart it
/// finishes the delete from the tombstone (nothing runs, the directory is
/// gone), and the cluster ends deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_killed_mid_delete_finishes_it_from_the_tombstone() {
    let mut env = TestEnv::start("faults-agent-middelete").await;
    let pkg = PackageBuilder::new("af", "1.0.0")
        .spec(SPEC)
        .script("bin/start.sh", MANY_FILES)
        .script("bin/daemon.sh", DAEMON);
    env.upload(&pkg).await;
    let body = json!({"name": "md", "package": {"name": "af", "version": "1.0.0"},
        "roles": {"fg": {"count": 1, "nodes": ["node-1"]}}});
    let c = env.create_active(body).await;
    let inst = all_instances(&c).remove(0);
    let (id, dir) = (id_of(&inst), dir_of(&inst));
    let many = dir.join("data/many");
    let made = eventually(60, || dir.join("data/started_at").exists()).await;
    assert!(made, "the start script did not make its files");
    let full = entries(&many);
    assert_eq!(full, 150_000);

    let (status, resp) = env.delete("/clusters/md").await;
    assert_eq!(status, 202, "{resp:#}");
    let op_id = resp["operation"]["id"].as_str().unwrap().to_string();
    // The removal has begun: kill the agent in the middle of it.
    let removing = eventually(30, || entries(&many) < full - 1000).await;
    assert!(removing, "the agent never began removing {}", many.display());
    env.kill_agent(1);
    let left = entries(&many);
    assert!(left > 0 && dir.exists(), "the removal ended before the agent was killed");
    let killed = Instant::now();
    env.restart_agent(1).await;

    let gone = eventually(20, || instance_pids(&id).is_empty() && !dir.exists()).await;
    assert!(gone, "{id}: processes {:?}, dir {} exists: {}", instance_pids(&id), dir.display(), dir.exists());
    let log = env.agent_log(1);
    assert!(log.contains("finishing a delete interrupted by an agent restart"), "{log}");
    let op = env.wait_op(&op_id).await;
    eprintln!(
        "faults-agent-middelete: killed with {left} of {full} files left; the delete op ended {} ({:?} after the kill)",
        op["status"],
        killed.elapsed()
    );
    if op["status"] != "Succeeded" {
        // The agent's death failed the step; a second delete finds nothing left.
        let (status, resp) = env.delete("/clusters/md").await;
        assert_eq!(status, 202, "{resp:#}");
        env.assert_succeeded(&env.wait_op(resp["operation"]["id"].as_str().unwrap()).await);
    }
    let (status, _) = env.get("/clusters/md").await;
    assert_eq!(status, 404, "the cluster is still there");
    assert!(!pid_alive(pid_of(&inst)));
}

/// A crash loop across agent restarts (issue 9: restart counts never go
/// down). With `restart_max = 2` in a 10-minute window, the agent is
/// SIGKILLed and started again before each crash of the instance: the
/// restarts it already made are persisted with the instance and loaded
/// again, so the instance is started at most `restart_max + 1` times in
/// all, and the crash after the last restart leaves it `Failed` with
/// nothing running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_counts_survive_agent_kills_in_a_crash_loop() {
    const MAX: usize = 2;
    let cfg_dir = tempfile::Builder::new().prefix("flotilla-restarts-").tempdir().expect("temp dir");
    let cfg = cfg_dir.path().join("agent.toml");
    std::fs::write(&cfg, format!("restart_max = {MAX}\nrestart_window = \"10m\"\nrestart_backoff = \"200ms\"\n"))
        .expect("write the agent config");
    let mut env =
        TestEnv::start_with_agent_flag("faults-agent-restarts", 1, &format!("--config={}", cfg.display())).await;
    env.upload(&package()).await;
    let body = json!({"name": "rc", "package": {"name": "af", "version": "1.0.0"},
        "roles": {"fg": {"count": 1, "nodes": ["node-1"]}}});
    let c = env.create_active(body).await;
    let mut inst = all_instances(&c).remove(0);
    let id = id_of(&inst);

    let mut crashes = 0;
    let mut connects = 1;
    let failed = loop {
        // The agent dies and comes back while the instance runs: it
        // re-adopts the process, and with it the restarts already spent.
        env.kill_agent(1);
        env.restart_agent(1).await;
        connects += 1;
        let up = eventually(15, || env.agent_log(1).matches("connected to master").count() >= connects).await;
        assert!(up, "crash {}: the new agent never connected\n{}", crashes + 1, env.log_tails());
        env.wait_ready().await;
        let i = all_instances(&env.cluster("rc").await).remove(0);
        assert_eq!((&i["status"], &i["pid"]), (&json!("Running"), &inst["pid"]), "re-adopted: {i:#}");

        kill(Pid::from_raw(pid_of(&inst) as i32), Signal::SIGKILL).unwrap();
        crashes += 1;
        let i = env
            .until(15, "the crash is restarted, or the instance Failed", async || {
                let i = all_instances(&env.cluster("rc").await).remove(0);
                let restarted = i["status"] == "Running" && i["pid"] != inst["pid"];
                if restarted || i["status"] == "Failed" { Ok(i) } else { Err(format!("{i:#}")) }
            })
            .await;
        let starts = started_at(&i).len();
        assert!(starts <= MAX + 1, "crash {crashes}: {starts} starts, more than restart_max + 1 = {}", MAX + 1);
        if i["status"] == "Failed" {
            break i;
        }
        assert!(crashes <= MAX, "crash {crashes} was restarted: the agent forgot its earlier restarts\n{i:#}");
        inst = i;
    };
    assert_eq!(crashes, MAX + 1, "the policy gave up too early: {failed:#}");
    let why = failed["last_error"].as_str().unwrap_or_default();
    assert!(why.contains("gave up"), "{failed:#}");
    // Past any delay the policy could still be waiting out.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let i = all_instances(&env.cluster("rc").await).remove(0);
    assert_eq!(i["status"], "Failed", "{i:#}");
    assert_eq!(instance_pids(&id), Vec::<u32>::new(), "nothing runs after the policy gave up");
    assert_eq!(started_at(&i).len(), MAX + 1, "started once, restarted restart_max times");
    let log = env.agent_log(1);
    assert_eq!(log.matches("restarted after an unexpected exit").count(), MAX, "{log}");
    // Loaded by each agent started after a restart: rounds 2 to MAX + 1.
    assert_eq!(log.matches("restart history loaded").count(), MAX, "{log}");
}

/// A crash loop, and the operator stops the instance while the agent's
/// restart is pending (between the crash and the backoff's end): the stop
/// wins, the pending restart never happens, and nothing runs afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_stop_during_a_restart_backoff_is_not_fought() {
    let env = TestEnv::start("faults-agent-crashstop").await;
    env.upload(&package()).await;
    let body = json!({"name": "cs", "package": {"name": "af", "version": "1.0.0"},
        "roles": {"fg": {"count": 1, "nodes": ["node-1"]}}});
    let c = env.create_active(body).await;
    let inst = all_instances(&c).remove(0);
    let id = id_of(&inst);

    // First crash: restarted after 1 s.
    kill(Pid::from_raw(pid_of(&inst) as i32), Signal::SIGKILL).unwrap();
    let i = env
        .until(5, "the first crash is restarted", async || {
            let i = all_instances(&env.cluster("cs").await).remove(0);
            if i["status"] == "Running" && i["pid"] != inst["pid"] { Ok(i) } else { Err(format!("{i:#}")) }
        })
        .await;
    // Second crash: the restart is due 2 s later; stop it at once.
    kill(Pid::from_raw(pid_of(&i) as i32), Signal::SIGKILL).unwrap();
    let crashed = Instant::now();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let op = env.run_ok(&format!("/clusters/cs/instances/{id}/stop"), None).await;
    let stopped_after = crashed.elapsed();
    assert!(stopped_after < Duration::from_secs(2), "the stop ended only {stopped_after:?} after the crash");
    // Well past the pending restart (2 s) and the next one (4 s).
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(instance_pids(&id), Vec::<u32>::new(), "the agent restarted what the operator stopped");
    let i = all_instances(&env.cluster("cs").await).remove(0);
    assert_eq!(i["status"], "Stopped", "{i:#}\n{op:#}");
    assert_eq!(started_at(&i).len(), 2, "started once and restarted once, never after the stop");
    let log = env.agent_log(1);
    assert_eq!(log.matches("restarted after an unexpected exit").count(), 1, "{log}");
}

/// The agent SIGKILLed in the middle of an install (a 24 MiB package
/// streaming into its staging dir): on its restart nothing of the
/// interrupted install is left (no staging dir, no partial package), the
/// create ends, and a delete leaves nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_killed_mid_install_leaves_no_staging() {
    use std::io::Read;
    let mut env = TestEnv::start("faults-agent-midinstall").await;
    let mut blob = Vec::new();
    std::fs::File::open("/dev/urandom").unwrap().take(24 << 20).read_to_end(&mut blob).unwrap();
    env.upload(&package().file("lib/blob.bin", 0o644, blob)).await;
    let body = json!({"name": "mi", "package": {"name": "af", "version": "1.0.0"},
        "roles": {"fg": {"count": 1, "nodes": ["node-1"]}}});
    let op = env.create_cluster(body).await;
    let staging = eventually(30, || !install_leftovers(&env, 1).is_empty()).await;
    assert!(staging, "the install never began on node-1");
    env.kill_agent(1);
    let left = install_leftovers(&env, 1);
    env.restart_agent(1).await;
    assert!(!left.is_empty(), "the agent was killed after its install had ended: nothing was in staging");
    let op = env.wait_op(op["id"].as_str().unwrap()).await;
    eprintln!("faults-agent-midinstall: killed with {left:?} in place; the create ended {}", op["status"]);
    // The install was cut by the lost link: the create fails at it, saying
    // so, and the cluster is in error. The agent, not the master, ended the
    // link, so nothing waits for it to come back and sends the install
    // again (only a link the master ended, a killed node manager, is).
    assert_eq!(op["status"], "Failed", "{op:#}");
    let error = op["error"].as_str().unwrap_or_default();
    assert!(error.contains("install") && error.contains("not connected"), "{op:#}");
    let c = env.cluster("mi").await;
    assert_eq!(c["status"], "Error", "{c:#}");
    let swept = eventually(5, || install_leftovers(&env, 1).is_empty()).await;
    let now = install_leftovers(&env, 1);
    // Nor is there a directory of the instance: it was never placed.
    let placed: Vec<_> =
        env.agent_instance_dirs().into_iter().filter(|d| !d.to_string_lossy().contains("/.")).collect();
    assert_eq!(placed, Vec::<std::path::PathBuf>::new(), "an instance dir after the cut install");
    let (status, resp) = env.delete("/clusters/mi?force=true").await;
    assert_eq!(status, 202, "{resp:#}");
    env.wait_op(resp["operation"]["id"].as_str().unwrap()).await;
    assert!(swept, "left by the killed install after the agent's restart: {now:?}");
    assert_eq!(env.agent_instance_dirs(), Vec::<std::path::PathBuf>::new(), "instance dirs left after the delete");
}
