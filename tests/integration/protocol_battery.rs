//! The protocol battery: one list of checks of the master <-> agent protocol
//! (`src/protocol/messages.rs`), run unchanged against a real agent
//! (`flotilla::agent::run` in this process, real packages, real processes)
//! and against a simulated one (`flotilla::bench::sim`), so the simulator
//! the load tests rely on cannot drift from the real agent.
//!
//! The test plays the master itself ([`FakeMaster`]): raw frames, no master
//! logic in between, so what is checked is exactly what an agent sends and in
//! which order. The two subjects differ only in how they start, how a process
//! is crashed, and what `Hello.simulated` says.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::Duration;

use flotilla::bench::sim::{Fleet, FleetConfig, Latency};
use flotilla::ids::InstanceId;
use flotilla::protocol::messages::{
    AgentEvent, AgentRequest, AgentResponse, ENV_CHANGED, FailureKind, InstallBegin, PROTOCOL_VERSION, ProcessSpec,
    RenderedFile,
};
use sha2::{Digest, Sha256};
use tokio::time::Instant;

use crate::common::PackageBuilder;
use crate::common::fake_master::{FakeMaster, WAIT};
use crate::common::procfs::pids_with_cwd_under;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_agent_passes_the_battery() {
    battery(Kind::Real).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simulated_agent_passes_the_battery() {
    battery(Kind::Sim).await;
}

/// A master that stops sending (not even heartbeats) while its socket
/// stays open: each kind of agent takes the link for dead within the idle
/// limit (15 s here) and dials again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_drop_a_link_that_goes_silent_and_dial_again() {
    for kind in [Kind::Real, Kind::Sim] {
        let mut m = FakeMaster::bind().await;
        let subject = Subject::start(kind, m.addr(), m.join_token());
        m.accept().await;
        let silent_since = Instant::now();
        // Nothing is read (no heartbeat echoed) and nothing sent.
        m.accept_within(Duration::from_secs(25)).await;
        let took = silent_since.elapsed();
        assert!(
            took >= Duration::from_millis(14_500) && took < Duration::from_secs(22),
            "{kind:?}: dialled again after {took:?} of silence; the idle limit is 15 s"
        );
        subject.stop().await;
    }
}

/// Several masters: a leader's term rides on its `Welcome` and on every
/// request. A request of a term below the highest the agent has seen (a
/// deposed leader that woke up) is refused and nothing is done; a master of
/// such a term is left at its `Welcome`, also after the agent restarts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_refuses_the_requests_and_the_welcome_of_an_older_master_term() {
    let _ = tracing_subscriber::fmt().with_test_writer().try_init();
    let mut m = FakeMaster::bind().await;
    m.term = 7;
    let subject = Subject::start(Kind::Real, m.addr(), m.join_token());
    m.accept().await;
    assert_eq!(m.call(AgentRequest::Ping).await, AgentResponse::Pong, "a request of the term it was welcomed with");

    // The old leader's command, driven at the agent on the same link.
    m.term = 5;
    match m.call(AgentRequest::Ping).await {
        AgentResponse::Failed(f) => {
            assert_eq!(f.kind, FailureKind::StaleTerm, "{f:?}");
            assert!(f.message.contains("term 5") && f.message.contains("term 7"), "{}", f.message);
        }
        other => m.fail(format!("a request of an older term was answered {other:?}")),
    }
    // A newer term is taken, and from then on the older is refused.
    m.term = 9;
    m.disconnect();
    m.accept().await;
    assert_eq!(m.call(AgentRequest::Ping).await, AgentResponse::Pong, "the newer leader's request");

    // The deposed master (term 7) is left at its Welcome, also by the agent
    // started again on its data dir (the term is kept in its store).
    m.term = 7;
    m.disconnect();
    m.accept().await;
    assert!(m.closed_by_agent_within(Duration::from_secs(5)).await, "the agent stayed with a master of an older term");
    let subject = subject.restart(m.addr(), m.join_token()).await;
    m.accept().await;
    assert!(m.closed_by_agent_within(Duration::from_secs(5)).await, "after a restart the agent forgot the term it saw");
    subject.stop().await;
}

// ---------------------------------------------------------------- subjects

#[derive(Debug, Clone, Copy)]
enum Kind {
    Real,
    Sim,
}

/// The agent under test.
enum Subject {
    Real {
        stop: Option<tokio::sync::oneshot::Sender<()>>,
        task: Option<tokio::task::JoinHandle<Result<(), flotilla::agent::AgentError>>>,
        dir: tempfile::TempDir,
    },
    Sim {
        fleet: Option<Fleet>,
    },
}

impl Subject {
    /// Starts the agent, dialling the fake master at `master`.
    fn start(kind: Kind, master: SocketAddr, join_token: String) -> Subject {
        Subject::start_in(kind, master, join_token, None)
    }

    /// The real agent stopped and started again on its data dir.
    async fn restart(mut self, master: SocketAddr, join_token: String) -> Subject {
        let Subject::Real { stop, task, dir } = &mut self else { panic!("only a real agent restarts") };
        let _ = stop.take().expect("running").send(());
        let ended = tokio::time::timeout(Duration::from_secs(30), task.take().expect("running")).await;
        ended.expect("the real agent did not stop within 30 s").expect("agent task").expect("the real agent failed");
        let mut kept = std::mem::replace(dir, tempfile::tempdir().expect("temp dir"));
        // In this process the stopped agent's last tasks may hold its
        // store's lock a moment longer (a process that exits frees it at once).
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let mut started = Subject::start_in(Kind::Real, master, join_token.clone(), Some(kept));
            tokio::time::sleep(Duration::from_millis(300)).await;
            let Subject::Real { task, dir, .. } = &mut started else { unreachable!() };
            if !task.as_ref().is_some_and(|t| t.is_finished()) {
                return started;
            }
            let ended = task.take().expect("started").await;
            assert!(Instant::now() < deadline, "the agent did not start again on its data dir: {ended:?}");
            kept = std::mem::replace(dir, tempfile::tempdir().expect("temp dir"));
        }
    }

    fn start_in(kind: Kind, master: SocketAddr, join_token: String, dir: Option<tempfile::TempDir>) -> Subject {
        match kind {
            Kind::Real => {
                let dir = dir.unwrap_or_else(|| {
                    tempfile::Builder::new().prefix("flotilla-battery-").tempdir().expect("temp dir")
                });
                // The tests run as root: instances run as the current user.
                let me = nix::unistd::User::from_uid(nix::unistd::geteuid())
                    .expect("user lookup")
                    .expect("the current user has a name")
                    .name;
                let overrides: Vec<(&str, String)> = vec![
                    ("node_id", "battery-real".into()),
                    ("master_addr", master.to_string()),
                    ("address", "127.0.0.1".into()),
                    ("data_dir", dir.path().display().to_string()),
                    ("port_range", "20000-29999".into()),
                    ("use_cgroups", "false".into()),
                    ("restart_max", "0".into()),
                    ("default_run_as", me),
                    ("allow_root", "true".into()),
                    ("stop_instances_on_exit", "true".into()),
                    ("join_token", join_token),
                ];
                let cfg = flotilla::config::AgentConfig::load(None, &overrides).expect("agent config");
                let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
                let task = tokio::spawn(flotilla::agent::run(cfg, async move {
                    let _ = stopped.await;
                }));
                Subject::Real { stop: Some(stop), task: Some(task), dir }
            }
            Kind::Sim => Subject::Sim {
                fleet: Some(Fleet::start(&FleetConfig {
                    masters: flotilla::agent::masters::Masters::one(master),
                    agents: 1,
                    prefix: "battery-sim-".into(),
                    port_range: (20000, 29999),
                    latency: Latency::default(),
                    join_token,
                })),
            },
        }
    }

    fn node_id(&self) -> &'static str {
        match self {
            Subject::Real { .. } => "battery-real",
            Subject::Sim { .. } => "battery-sim-1",
        }
    }

    fn simulated(&self) -> bool {
        matches!(self, Subject::Sim { .. })
    }

    /// What an install left behind in the real agent's data directory (a
    /// staging directory, a partial download), if it is still there after
    /// 5 s; `None` once it is gone (and always for the simulated agent).
    async fn await_no_leftovers(&self) -> Option<Vec<std::path::PathBuf>> {
        let Subject::Real { dir, .. } = self else { return None };
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let left: Vec<std::path::PathBuf> = walk(dir.path())
                .into_iter()
                .filter(|p| {
                    let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
                    name.starts_with(".staging-") || name.starts_with(".incoming-")
                })
                .collect();
            if left.is_empty() {
                return None;
            }
            if Instant::now() > deadline {
                return Some(left);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Kills `instance`'s process (`pid`, as `Started` said) behind the
    /// agent's back.
    fn crash(&self, instance: &InstanceId, pid: u32) {
        match self {
            Subject::Real { .. } => {
                let pid = nix::unistd::Pid::from_raw(pid as i32);
                nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL).expect("kill -9 the instance");
            }
            Subject::Sim { fleet } => {
                let crashed = fleet.as_ref().expect("fleet").crash(instance, false);
                assert!(crashed, "the simulator says {instance} was not running");
            }
        }
    }

    /// Waits until `pid` ignores SIGHUP: `Started` answers once the process
    /// is spawned, before its shell has run `trap '' HUP`, and a signal sent
    /// in between kills it. The simulator's processes are ready at once.
    async fn await_hup_ignored(&self, pid: u32) {
        if self.simulated() {
            return;
        }
        let deadline = Instant::now() + WAIT;
        loop {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
                .unwrap_or_else(|e| panic!("/proc/{pid}/status of the instance: {e}"));
            let ignored = status
                .lines()
                .find_map(|l| l.strip_prefix("SigIgn:"))
                .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
                .is_some_and(|mask| mask & 1 != 0);
            if ignored {
                return;
            }
            assert!(Instant::now() < deadline, "pid {pid} did not ignore SIGHUP within {WAIT:?}:\n{status}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Stops the agent and waits for it.
    async fn stop(mut self) {
        match &mut self {
            Subject::Real { stop, task, .. } => {
                let _ = stop.take().expect("stop once").send(());
                let task = task.take().expect("stop once");
                let ended = tokio::time::timeout(Duration::from_secs(30), task).await;
                let ended = ended.expect("the real agent did not stop within 30 s");
                ended.expect("agent task").expect("the real agent failed");
            }
            Subject::Sim { fleet } => {
                let fleet = fleet.take().expect("stop once");
                tokio::time::timeout(Duration::from_secs(30), fleet.stop())
                    .await
                    .expect("the simulated agent did not stop within 30 s");
            }
        }
    }
}

impl Drop for Subject {
    /// After a failure, no instance process may outlive the test.
    fn drop(&mut self) {
        if let Subject::Real { dir, .. } = self {
            for pid in pids_with_cwd_under(dir.path()) {
                let _ =
                    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGKILL);
            }
        }
    }
}

// ---------------------------------------------------------------- fixtures

/// Ignores SIGHUP (the ignore survives `exec`), so check 8's signal is
/// delivered and the instance keeps running.
const START: &str = "trap '' HUP\nexec sleep 1000\n";
const RELOAD: &str = "echo reloaded\n";
const SPEC: &str = r#"
[component]
name = "battery"
version = "1.0.0"

[[roles]]
name = "main"
start = ["bin/start.sh"]
reload = ["bin/reload.sh"]
"#;

/// A package's bytes and sha256.
struct Package {
    bytes: Vec<u8>,
    sha256: String,
}

fn package(version: &str) -> Package {
    let bytes = PackageBuilder::new("battery", version)
        .spec(&SPEC.replace("1.0.0", version))
        .script("bin/start.sh", START)
        .script("bin/reload.sh", RELOAD)
        .build();
    let sha256 = hex::encode(Sha256::digest(&bytes));
    Package { bytes, sha256 }
}

fn id(s: &str) -> InstanceId {
    InstanceId::new(s)
}

fn file(path: &str, contents: &str) -> RenderedFile {
    RenderedFile { path: path.into(), contents: contents.as_bytes().to_vec(), mode: 0o644 }
}

fn begin(instance: &InstanceId, generation: u64, files: Vec<RenderedFile>, sha256: &str, size: u64) -> InstallBegin {
    InstallBegin {
        instance: instance.clone(),
        cluster: flotilla::ids::ClusterId(uuid::Uuid::from_u128(1)),
        generation,
        run_as: None,
        process: ProcessSpec {
            start: vec!["bin/start.sh".into()],
            stop: None,
            pidfile: None,
            stop_grace_ms: 2000,
            start_timeout_ms: 10_000,
            env: vec![],
            health: None,
            limits: None,
        },
        files,
        package_sha256: sha256.into(),
        package_size: size,
    }
}

/// Small chunks, so a package travels in several `InstallData` frames.
const CHUNK: usize = 256;

/// `InstallBegin` (which must answer `InstallReady { need_bytes: true }`),
/// every chunk of `bytes`, `InstallEnd`; returns the final answer. Each
/// chunk must be answered `InstallReceived` with the bytes taken in so far,
/// in order and before the final answer: the master's install deadline
/// counts from the last of them. Like the master, at most
/// `INSTALL_WINDOW_CHUNKS` chunks go ahead of the receipts.
async fn install_with_bytes(m: &mut FakeMaster, b: InstallBegin, bytes: &[u8]) -> AgentResponse {
    let instance = b.instance.clone();
    let rid = m.request(AgentRequest::InstallBegin(Box::new(b))).await;
    let ready = m.reply(rid).await;
    if ready != (AgentResponse::InstallReady { need_bytes: true }) {
        m.fail(format!(
            "InstallBegin of new package for {instance}: expected InstallReady {{ need_bytes: true }}, got {ready:?}"
        ));
    }
    let mut received = Vec::new();
    let mut early = None;
    for (seq, chunk) in bytes.chunks(CHUNK).enumerate() {
        if early.is_none() && seq as u64 >= received.len() as u64 + flotilla::protocol::messages::INSTALL_WINDOW_CHUNKS
        {
            match m.reply(rid).await {
                AgentResponse::InstallReceived { bytes } => received.push(bytes),
                other => early = Some(other),
            }
        }
        let data = AgentRequest::InstallData { instance: instance.clone(), seq: seq as u32, bytes: chunk.to_vec() };
        m.send(rid, data).await;
    }
    m.send(rid, AgentRequest::InstallEnd { instance }).await;
    loop {
        let next = match early.take() {
            Some(e) => e,
            None => m.reply(rid).await,
        };
        match next {
            AgentResponse::InstallReceived { bytes } => received.push(bytes),
            last => {
                let want: Vec<u64> =
                    (1..=bytes.len().div_ceil(CHUNK)).map(|n| (n * CHUNK).min(bytes.len()) as u64).collect();
                if received != want {
                    m.fail(format!("InstallReceived after each chunk: expected {want:?}, got {received:?}"));
                }
                return last;
            }
        }
    }
}

#[track_caller]
fn assert_failed(m: &FakeMaster, got: &AgentResponse, kind: FailureKind, what: &str) {
    match got {
        AgentResponse::Failed(f) if f.kind == kind => {}
        other => m.fail(format!("{what}: expected Failed with kind {kind:?}, got {other:?}")),
    }
}

// ---------------------------------------------------------------- the battery

async fn battery(kind: Kind) {
    let began = std::time::Instant::now();
    let mut m = FakeMaster::bind().await;
    let subject = Subject::start(kind, m.addr(), m.join_token());
    let a = id("battery-a");

    // 1. Hello.
    let hello = m.accept().await;
    assert_eq!(hello.node_id.as_str(), subject.node_id(), "Hello.node_id");
    assert_eq!(hello.simulated, subject.simulated(), "Hello.simulated");
    assert_eq!(hello.protocol_version, PROTOCOL_VERSION, "Hello.protocol_version");
    assert!(hello.inventory.is_empty(), "a fresh agent holds nothing, its Hello says {:?}", hello.inventory);

    // 2. An install with bytes: every RenderedFile sent is written.
    let pkg = package("1.0.0");
    let size = pkg.bytes.len() as u64;
    let files = vec![file("conf/app.conf", "v1\n"), file("conf/other.conf", "same\n")];
    let got = install_with_bytes(&mut m, begin(&a, 1, files, &pkg.sha256, size), &pkg.bytes).await;
    assert_eq!(got, AgentResponse::InstallResult { files_written: 2 }, "install of {a} with bytes");

    // 3. Cached installs, sent back to back: each request answers exactly
    // InstallReady { need_bytes: false } then InstallResult, never reversed.
    let cached: Vec<InstanceId> = (0..60).map(|i| id(&format!("battery-c-{i:02}"))).collect();
    let mut order: Vec<(u64, Vec<AgentResponse>)> = Vec::new();
    for c in &cached {
        let b = begin(c, 1, vec![file("conf/app.conf", c.as_str())], &pkg.sha256, size);
        order.push((m.request(AgentRequest::InstallBegin(Box::new(b))).await, Vec::new()));
    }
    let deadline = Instant::now() + WAIT * 3;
    while order.iter().any(|(_, got)| got.len() < 2) {
        let (rid, body) = m.next_response(deadline).await;
        match order.iter_mut().find(|(r, _)| *r == rid) {
            Some((_, got)) => got.push(body),
            None => m.fail(format!("an answer to request {rid}, which is not one of the 60 installs: {body:?}")),
        }
    }
    // A third frame for one of them, sent before this Pong, fails the call.
    let pong = m.call(AgentRequest::Ping).await;
    assert_eq!(pong, AgentResponse::Pong, "Ping after the cached installs");
    let expected =
        [AgentResponse::InstallReady { need_bytes: false }, AgentResponse::InstallResult { files_written: 1 }];
    for ((rid, got), c) in order.iter().zip(&cached) {
        if got.as_slice() != expected.as_slice() {
            m.fail(format!("cached install of {c} (request {rid}) answered {got:?}, expected exactly {expected:?}"));
        }
    }

    // 3b. An install of an instance whose lock a long request holds (a hook
    // here; a start waiting for health alike) does not stop the agent
    // reading its link: a Ping sent after it is answered while the hook
    // still runs. (The master closes a link it cannot write to for 10 s.)
    let busy = &cached[0];
    let hook_rid = m
        .request(AgentRequest::RunHook {
            instance: busy.clone(),
            generation: 1,
            hook: "reload".into(),
            argv: vec!["sleep".into(), "4".into()],
            timeout_ms: 10_000,
        })
        .await;
    // Time for the hook's task to take the lock before the install comes.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let b = begin(busy, 2, vec![file("conf/app.conf", busy.as_str())], &pkg.sha256, size);
    let install_rid = m.request(AgentRequest::InstallBegin(Box::new(b))).await;
    let ping_sent = Instant::now();
    let ping_rid = m.request(AgentRequest::Ping).await;
    let mut answers: Vec<(u64, AgentResponse)> = Vec::new();
    while !answers.iter().any(|(r, _)| *r == ping_rid) {
        answers.push(m.next_response(Instant::now() + WAIT).await);
    }
    let waited = ping_sent.elapsed();
    if waited > Duration::from_secs(2) {
        m.fail(format!("Ping behind an install of {busy}, whose hook holds it, took {waited:?}: the read loop waited"));
    }
    while answers.iter().filter(|(r, _)| *r == hook_rid || *r == install_rid).count() < 3 {
        answers.push(m.next_response(Instant::now() + WAIT).await);
    }
    let of = |rid: u64| answers.iter().filter(|(r, _)| *r == rid).map(|(_, b)| b.clone()).collect::<Vec<_>>();
    if !matches!(of(hook_rid).as_slice(), [AgentResponse::HookDone { exit_code: 0, .. }]) {
        m.fail(format!("the long hook of {busy}: {:?}", of(hook_rid)));
    }
    assert_eq!(of(install_rid), expected.to_vec(), "install of {busy} while its hook ran");

    // 4. A wrong sha256 or size of a new package fails the install at its end.
    let pkg2 = package("2.0.0");
    let size2 = pkg2.bytes.len() as u64;
    let wrong_sha = hex::encode(Sha256::digest(b"not the package"));
    let bad_sha = id("battery-bad-sha");
    let got = install_with_bytes(&mut m, begin(&bad_sha, 1, vec![], &wrong_sha, size2), &pkg2.bytes).await;
    assert_failed(&m, &got, FailureKind::Install, "install with a wrong sha256");
    let bad_size = id("battery-bad-size");
    let got = install_with_bytes(&mut m, begin(&bad_size, 1, vec![], &pkg2.sha256, size2 + 1), &pkg2.bytes).await;
    assert_failed(&m, &got, FailureKind::Install, "install with a wrong size");
    // The failed transfers cached nothing: the package still needs its bytes.
    let b = id("battery-b");
    let got = install_with_bytes(&mut m, begin(&b, 1, vec![], &pkg2.sha256, size2), &pkg2.bytes).await;
    assert_eq!(got, AgentResponse::InstallResult { files_written: 0 }, "install of {b} after the failed ones");

    // 4b. An install the master aborts mid-stream is answered nothing more
    // than the receipts of what was sent, leaves nothing behind (no
    // staging directory, no partial download), and the instance installs
    // afterwards.
    let pkg3 = package("3.0.0");
    let size3 = pkg3.bytes.len() as u64;
    let ab = id("battery-abort");
    let rid = m.request(AgentRequest::InstallBegin(Box::new(begin(&ab, 1, vec![], &pkg3.sha256, size3)))).await;
    assert_eq!(m.reply(rid).await, AgentResponse::InstallReady { need_bytes: true }, "InstallBegin of {ab}");
    let sent: Vec<&[u8]> = pkg3.bytes.chunks(CHUNK).take(2).collect();
    assert_eq!(sent.len(), 2, "the package spans several chunks");
    for (seq, chunk) in sent.iter().enumerate() {
        m.send(rid, AgentRequest::InstallData { instance: ab.clone(), seq: seq as u32, bytes: chunk.to_vec() }).await;
    }
    m.send(rid, AgentRequest::InstallAbort { instance: ab.clone() }).await;
    let ping = m.request(AgentRequest::Ping).await;
    loop {
        match m.next_response(Instant::now() + WAIT).await {
            (r, AgentResponse::Pong) if r == ping => break,
            (r, AgentResponse::InstallReceived { .. }) if r == rid => {}
            (r, other) => m.fail(format!("after aborting the install of {ab} (request {rid}): {other:?} to {r}")),
        }
    }
    if let Some(left) = subject.await_no_leftovers().await {
        m.fail(format!("an aborted install left {left:?}"));
    }
    let got = install_with_bytes(&mut m, begin(&ab, 2, vec![], &pkg3.sha256, size3), &pkg3.bytes).await;
    assert_eq!(got, AgentResponse::InstallResult { files_written: 0 }, "install of {ab} after its abort");

    // 5. Stale generations: after a command at 5, every command at 3 is refused.
    let got = m.call(AgentRequest::WriteFiles { instance: a.clone(), generation: 5, files: vec![], env: None }).await;
    assert_eq!(got, AgentResponse::FilesWritten { changed: vec![] }, "empty WriteFiles at generation 5");
    let stale = [
        AgentRequest::InstallBegin(Box::new(begin(&a, 3, vec![], &pkg.sha256, size))),
        AgentRequest::WriteFiles { instance: a.clone(), generation: 3, files: vec![], env: None },
        AgentRequest::Start { instance: a.clone(), generation: 3, settle_ms: 0 },
        AgentRequest::Stop { instance: a.clone(), generation: 3 },
        AgentRequest::Signal { instance: a.clone(), generation: 3, signal: 1 },
        AgentRequest::RunHook {
            instance: a.clone(),
            generation: 3,
            hook: "reload".into(),
            argv: vec!["bin/reload.sh".into()],
            timeout_ms: 10_000,
        },
        AgentRequest::Delete { instance: a.clone(), generation: 3 },
    ];
    for req in stale {
        let what = format!("{req:?} after generation 5");
        let got = m.call(req).await;
        assert_failed(&m, &got, FailureKind::StaleGeneration, &what);
    }

    // 6. Start and stop are idempotent and say what they found.
    let start = |generation| AgentRequest::Start { instance: a.clone(), generation, settle_ms: 0 };
    let stop = |generation| AgentRequest::Stop { instance: a.clone(), generation };
    let pid = match m.call(start(6)).await {
        AgentResponse::Started { pid, already_running: false } => pid,
        other => m.fail(format!("first Start of {a}: expected Started {{ already_running: false }}, got {other:?}")),
    };
    let got = m.call(start(7)).await;
    assert_eq!(got, AgentResponse::Started { pid, already_running: true }, "second Start of {a}");
    assert_eq!(m.call(stop(8)).await, AgentResponse::Stopped { was_running: true }, "first Stop of {a}");
    assert_eq!(m.call(stop(9)).await, AgentResponse::Stopped { was_running: false }, "second Stop of {a}");

    // 7. WriteFiles lists what changed: files by path, the env as ENV_CHANGED.
    let write = |generation, files: Vec<RenderedFile>, env: Option<Vec<(String, String)>>| AgentRequest::WriteFiles {
        instance: a.clone(),
        generation,
        files,
        env,
    };
    let v2 = || vec![file("conf/app.conf", "v2\n"), file("conf/other.conf", "same\n")];
    let got = m.call(write(10, v2(), None)).await;
    assert_eq!(got, AgentResponse::FilesWritten { changed: vec!["conf/app.conf".into()] }, "WriteFiles v2");
    // The same command sent again (its link closed before the answer, the
    // master cannot know it arrived): the first answer again, so the
    // master learns what it changed.
    let got = m.call(write(10, v2(), None)).await;
    assert_eq!(got, AgentResponse::FilesWritten { changed: vec!["conf/app.conf".into()] }, "WriteFiles v2 again");
    let got = m.call(write(11, v2(), None)).await;
    assert_eq!(got, AgentResponse::FilesWritten { changed: vec![] }, "the same WriteFiles again");
    let private = RenderedFile { mode: 0o600, ..file("conf/other.conf", "same\n") };
    let got = m.call(write(12, vec![private], None)).await;
    let changed = vec!["conf/other.conf".to_string()];
    assert_eq!(got, AgentResponse::FilesWritten { changed }, "WriteFiles changing only a file's mode");
    let env = || Some(vec![("BATTERY_MODE".to_string(), "on".to_string())]);
    let got = m.call(write(13, vec![], env())).await;
    assert_eq!(got, AgentResponse::FilesWritten { changed: vec![ENV_CHANGED.into()] }, "WriteFiles with a new env");
    let got = m.call(write(14, vec![], env())).await;
    assert_eq!(got, AgentResponse::FilesWritten { changed: vec![] }, "WriteFiles with the same env again");

    // 8 and 9. Signal reaches a running process (which ignores SIGHUP and so
    // stays healthy), hooks run, and a stopped process gets no signal.
    let signal = |generation| AgentRequest::Signal { instance: a.clone(), generation, signal: 1 };
    let pid = match m.call(start(15)).await {
        AgentResponse::Started { pid, already_running: false } => pid,
        other => m.fail(format!("Start of {a} for the signal: expected a fresh Started, got {other:?}")),
    };
    subject.await_hup_ignored(pid).await;
    assert_eq!(m.call(signal(16)).await, AgentResponse::Signalled { delivered: true }, "SIGHUP to running {a}");
    let got = m.call(AgentRequest::CheckHealth { instance: a.clone(), timeout_ms: 5000 }).await;
    assert_eq!(got, AgentResponse::Healthy, "CheckHealth of {a} (pid {pid}) after SIGHUP");
    let hook = |instance: &InstanceId, generation| AgentRequest::RunHook {
        instance: instance.clone(),
        generation,
        hook: "reload".into(),
        argv: vec!["bin/reload.sh".into()],
        timeout_ms: 10_000,
    };
    match m.call(hook(&a, 16)).await {
        AgentResponse::HookDone { exit_code: 0, .. } => {}
        other => m.fail(format!("RunHook reload of {a}: expected HookDone {{ exit_code: 0 }}, got {other:?}")),
    }
    let odd_hook = |name: &str, argv: Vec<String>| AgentRequest::RunHook {
        instance: a.clone(),
        generation: 17,
        hook: name.into(),
        argv,
        timeout_ms: 10_000,
    };
    let got = m.call(odd_hook("bogus", vec!["bin/reload.sh".into()])).await;
    assert_failed(&m, &got, FailureKind::BadRequest, "RunHook of an unknown hook");
    let got = m.call(odd_hook("reload", vec![])).await;
    assert_failed(&m, &got, FailureKind::BadRequest, "RunHook with an empty command");
    assert_eq!(m.call(stop(18)).await, AgentResponse::Stopped { was_running: true }, "Stop of {a} after the hook");
    assert_eq!(m.call(signal(19)).await, AgentResponse::Signalled { delivered: false }, "SIGHUP to stopped {a}");
    let got = m.call(AgentRequest::CheckHealth { instance: a.clone(), timeout_ms: 1000 }).await;
    assert_failed(&m, &got, FailureKind::Health, "CheckHealth of a stopped instance");

    // 10. Commands for an instance never installed (or whose install
    // failed) are refused as unknown, but a stop, which has nothing to do
    // (a cluster whose install failed must still be deletable).
    for unknown in [id("battery-never"), bad_sha.clone()] {
        let u = unknown.clone();
        let got = m.call(AgentRequest::Stop { instance: u.clone(), generation: 1 }).await;
        assert_eq!(got, AgentResponse::Stopped { was_running: false }, "Stop of {u}, not installed");
        let requests = [
            AgentRequest::Start { instance: u.clone(), generation: 1, settle_ms: 0 },
            AgentRequest::WriteFiles { instance: u.clone(), generation: 1, files: vec![], env: None },
            AgentRequest::Signal { instance: u.clone(), generation: 1, signal: 1 },
            AgentRequest::CheckHealth { instance: u.clone(), timeout_ms: 1000 },
            hook(&u, 1),
        ];
        for req in requests {
            let what = format!("{req:?} for an instance not installed");
            let got = m.call(req).await;
            assert_failed(&m, &got, FailureKind::UnknownInstance, &what);
        }
    }

    // 11. A crash is a report, kept and sent again after a reconnect until
    // acknowledged, and not after.
    let pid = match m.call(start(20)).await {
        AgentResponse::Started { pid, already_running: false } => pid,
        other => m.fail(format!("Start of {a} before the crash: expected a fresh Started, got {other:?}")),
    };
    subject.crash(&a, pid);
    let exited = |_: u64, e: &AgentEvent| matches!(e, AgentEvent::ProcessExited { instance, .. } if *instance == a);
    let (seq, event) = m.report("ProcessExited", exited).await;
    match &event {
        AgentEvent::ProcessExited { pid: p, signal: Some(9), restart_in_ms: None, .. } if *p == pid => {}
        other => m.fail(format!("crash of {a} (pid {pid}, SIGKILL, no restart): reported as {other:?}")),
    }
    m.disconnect();
    let hello = m.accept().await;
    let mut held: Vec<&str> = hello.inventory.iter().map(|r| r.instance.as_str()).collect();
    held.sort_unstable();
    let mut want: BTreeSet<String> = cached.iter().map(|c| c.to_string()).collect();
    want.extend([a.to_string(), b.to_string(), ab.to_string()]);
    assert_eq!(held, want.iter().map(String::as_str).collect::<Vec<_>>(), "inventory after the reconnect");
    let report = hello.inventory.iter().find(|r| r.instance == a).expect("a is in the inventory");
    assert!(
        !report.running && report.pid.is_none() && report.desired_running && report.generation == 20,
        "after the crash the inventory must show {a} wanted running, not running, generation 20: {report:?}"
    );
    let (again, resent) = m.report("the same report again", |s, _| s == seq).await;
    assert_eq!((again, &resent), (seq, &event), "the unacknowledged report, sent again after the reconnect");
    m.send_frame(flotilla::protocol::messages::MasterFrame::Ack { seq }).await;
    // Longer than RESEND_AFTER (3 s): an acknowledged report never comes back.
    m.no_report(seq, Duration::from_secs(4)).await;

    // 12. Delete is idempotent; Ping answers Pong.
    let delete = |generation| AgentRequest::Delete { instance: a.clone(), generation };
    assert_eq!(m.call(delete(21)).await, AgentResponse::Deleted { existed: true }, "first Delete of {a}");
    assert_eq!(m.call(delete(22)).await, AgentResponse::Deleted { existed: false }, "second Delete of {a}");
    assert_eq!(m.call(AgentRequest::Ping).await, AgentResponse::Pong, "Ping");

    subject.stop().await;
    eprintln!("protocol battery against the {kind:?} agent passed in {:.1?}", began.elapsed());
}

/// Every path under `dir` (not following links).
fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else { return out };
    for e in entries.flatten() {
        let p = e.path();
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            out.extend(walk(&p));
        }
        out.push(p);
    }
    out
}
