//! Health checks of instances (`ProcessSpec::health`): what gates `Started`
//! and answers `AgentRequest::CheckHealth`.
//!
//! A probe is a TCP connect to the node's address (the one announced in
//! `Hello`, which instances bind to) on a port, or a command run like a hook
//! (beside the instance, as its run-as user, output in `logs/health.*.log`);
//! healthy iff the connect succeeds or the command exits 0. Each attempt is
//! short (1 s connect, 5 s command); the wait polls with backoff from 50 ms
//! to 1 s until healthy or the deadline, and gives up at once when the
//! instance's main process exits meanwhile: a dead process will not become
//! healthy, and the operator wants its exit status, not a timeout.
//!
//! Start holds the instance lock while it waits (a start is not finished
//! before it is healthy); CheckHealth copies what it needs out of the record
//! and probes without the lock, so a slow check never blocks the instance's
//! other commands.

use std::path::PathBuf;
use std::time::Duration;

use tokio::time::Instant;

use super::hooks::describe_ms;
use super::node::{Node, failure, not_installed};
use super::process::{Ending, ExitInfo, ExitWatch, OneShot, RunAs, run_oneshot};
use crate::ids::InstanceId;
use crate::protocol::messages::{AgentResponse, CommandFailure, FailureKind, HealthProbe};
use crate::storage::agent_records::AgentInstanceRecord;

/// How long one TCP connect attempt may take.
pub const TCP_ATTEMPT: Duration = Duration::from_secs(1);
/// How long one health command may run.
pub const CMD_ATTEMPT: Duration = Duration::from_secs(5);
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(1);
/// Even with no time left, a probe gets this long (so a zero timeout still
/// answers from one real attempt).
const MIN_ATTEMPT: Duration = Duration::from_millis(100);

/// Why an instance is not healthy. Displayed after "instance X ".
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HealthError {
    #[error("did not pass its health check ({probe}) within {waited}: {last}")]
    TimedOut { probe: String, waited: String, last: String },
    #[error("exited while waiting for its health check ({probe}): {how}")]
    Exited { probe: String, how: String, exit_code: Option<i32>, stderr_tail: String },
}

/// Everything a probe needs, owned: taken from the record, then used
/// without holding the instance's lock.
#[derive(Debug, Clone)]
pub struct ProbeContext {
    pub probe: HealthProbe,
    pub address: String,
    pub dir: PathBuf,
    pub env: Vec<(String, String)>,
    pub run_as: RunAs,
}

/// "tcp port 2181", "command [\"bin/ruok\"]".
pub fn describe(probe: &HealthProbe) -> String {
    match probe {
        HealthProbe::Tcp { port } => format!("tcp port {port}"),
        HealthProbe::Cmd { argv } => format!("command {argv:?}"),
    }
}

/// One probe attempt of at most `budget` (capped per kind). `Err` says why
/// it is not healthy.
pub async fn probe_once(ctx: &ProbeContext, budget: Duration) -> Result<(), String> {
    match &ctx.probe {
        HealthProbe::Tcp { port } => {
            let limit = budget.min(TCP_ATTEMPT);
            let target = (ctx.address.as_str(), *port);
            match tokio::time::timeout(limit, tokio::net::TcpStream::connect(target)).await {
                Ok(Ok(_stream)) => Ok(()),
                Ok(Err(e)) => Err(format!("connect to {}:{port}: {e}", ctx.address)),
                Err(_) => Err(format!("connect to {}:{port} timed out after {}", ctx.address, describe_ms(ms(limit)))),
            }
        }
        HealthProbe::Cmd { argv } => {
            if argv.is_empty() {
                return Err("the health command is empty".into());
            }
            let limit = budget.min(CMD_ATTEMPT);
            let cmd =
                OneShot { argv, dir: &ctx.dir, env: &ctx.env, run_as: &ctx.run_as, log_name: "health", timeout: limit };
            let ran = run_oneshot(&cmd).await.map_err(|e| format!("cannot run: {}", crate::error::ErrorChain(&e)))?;
            let how = match ran.ending {
                Ending::Finished(status) if status.success() => return Ok(()),
                Ending::TimedOut => format!("did not finish within {}", describe_ms(ms(limit))),
                ending => describe_end(ending.code(), ending.signal()),
            };
            let last_line = ran.stderr_tail.lines().last().or_else(|| ran.stdout_tail.lines().last());
            Err(match last_line {
                Some(line) => format!("{how}: {line}"),
                None => how,
            })
        }
    }
}

/// Probes until healthy or `deadline`; fails at once when `exit` (the main
/// process's exit) resolves first. `budget_ms` is the whole wait, for the
/// message.
pub async fn wait_healthy(
    ctx: &ProbeContext,
    deadline: Instant,
    budget_ms: u64,
    exit: Option<ExitWatch>,
) -> Result<(), HealthError> {
    let probe = describe(&ctx.probe);
    let exited = |info: ExitInfo| HealthError::Exited {
        probe: probe.clone(),
        how: describe_end(info.exit_code, info.signal),
        exit_code: info.exit_code,
        stderr_tail: info.stderr_tail,
    };
    // A watch that never resolves stands in for "no process to watch".
    let gone = async {
        match &exit {
            Some(w) => w.clone().wait().await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(gone);
    let mut backoff = FIRST_BACKOFF;
    loop {
        if let Some(info) = exit.as_ref().and_then(ExitWatch::try_exited) {
            return Err(exited(info));
        }
        let budget = deadline.saturating_duration_since(Instant::now()).max(MIN_ATTEMPT);
        // A probe dropped by the select cleans up after itself (oneshot.rs).
        let last = tokio::select! {
            r = probe_once(ctx, budget) => match r {
                Ok(()) => return Ok(()),
                Err(e) => e,
            },
            info = &mut gone => return Err(exited(info)),
        };
        let now = Instant::now();
        if now >= deadline {
            return Err(HealthError::TimedOut { probe: probe.clone(), waited: describe_ms(budget_ms), last });
        }
        tokio::select! {
            _ = tokio::time::sleep_until(deadline.min(now + backoff)) => {}
            info = &mut gone => return Err(exited(info)),
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// The `Failed` answer for an unhealthy instance.
pub fn health_failure(id: &InstanceId, e: HealthError) -> AgentResponse {
    let message = format!("instance {id} {e}");
    let (exit_code, stderr_tail) = match e {
        HealthError::Exited { exit_code, stderr_tail, .. } => (exit_code, stderr_tail),
        HealthError::TimedOut { .. } => (None, String::new()),
    };
    AgentResponse::Failed(CommandFailure {
        kind: FailureKind::Health,
        message,
        exit_code,
        stderr_tail,
        stdout_tail: String::new(),
    })
}

fn describe_end(code: Option<i32>, signal: Option<i32>) -> String {
    match (code, signal) {
        (Some(c), _) => format!("exited with code {c}"),
        (None, Some(s)) => format!("killed by signal {s} ({})", super::process::oneshot::signal_name(s)),
        (None, None) => "exited".into(),
    }
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Node {
    fn probe_context(
        &self,
        id: &InstanceId,
        probe: HealthProbe,
        rec: &AgentInstanceRecord,
        run_as: RunAs,
    ) -> ProbeContext {
        ProbeContext {
            probe,
            address: self.address.clone(),
            dir: self.instance_dir(id),
            env: rec.process.env.clone(),
            run_as,
        }
    }

    /// The end of a start with a health check: waits until it passes within
    /// what is left of `start_timeout_ms` (counted from `begun`). On failure
    /// the process is left running: the master's undo decides what to stop.
    pub(super) async fn gate_start(
        &self,
        id: &InstanceId,
        rec: &AgentInstanceRecord,
        run_as: &RunAs,
        begun: Instant,
        exit: ExitWatch,
    ) -> Result<(), AgentResponse> {
        let Some(probe) = rec.process.health.clone() else { return Ok(()) };
        let ctx = self.probe_context(id, probe, rec, run_as.clone());
        let budget = rec.process.start_timeout_ms;
        let deadline = begun + Duration::from_millis(budget);
        wait_healthy(&ctx, deadline, budget, Some(exit)).await.map_err(|e| health_failure(id, e))
    }

    /// `CheckHealth`: `Healthy` once the instance passes its check within
    /// `timeout_ms`; without a check, iff its main process runs.
    pub async fn check_health(&self, id: &InstanceId, timeout_ms: u64) -> AgentResponse {
        let deadline = Instant::now() + Duration::from_millis(timeout_ms);
        let (ctx, identity) = {
            let slot = self.slot(id);
            let guard = slot.lock("health").await;
            let Some(rec) = guard.as_ref() else { return not_installed(id) };
            let Some(identity) = rec.pid.clone().filter(|p| self.processes.is_alive(p)) else {
                return failure(FailureKind::Health, format!("instance {id} is not running"));
            };
            let ctx = match rec.process.health.clone() {
                None => None,
                Some(probe) => match self.run_as_of(rec, FailureKind::Health) {
                    Ok(run_as) => Some(self.probe_context(id, probe, rec, run_as)),
                    Err(resp) => return resp,
                },
            };
            (ctx, identity)
            // The lock is released here: the probes run without it.
        };
        let Some(ctx) = ctx else { return AgentResponse::Healthy };
        let exit = self.processes.exit_watch(id, &identity);
        match wait_healthy(&ctx, deadline, timeout_ms, Some(exit)).await {
            Ok(()) => AgentResponse::Healthy,
            Err(e) => health_failure(id, e),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant as StdInstant;

    use super::*;
    use crate::agent::process::users;
    use crate::agent::testkit::{TestNode, argv, spec};
    use crate::protocol::messages::ProcessSpec;

    fn ctx(probe: HealthProbe, dir: PathBuf) -> ProbeContext {
        ProbeContext {
            probe,
            address: "127.0.0.1".into(),
            dir,
            env: vec![("GREETING".into(), "hello".into())],
            run_as: users::current(),
        }
    }

    fn after(d: Duration) -> Instant {
        Instant::now() + d
    }

    /// A port on 127.0.0.1 nothing listens on (bound, then released).
    /// A port nothing listens on, held (bound, never listening: a connect
    /// is refused) until the socket is dropped, so a test running at the
    /// same time cannot take it meanwhile.
    fn closed_port() -> (tokio::net::TcpSocket, u16) {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let port = socket.local_addr().unwrap().port();
        (socket, port)
    }

    fn failed(resp: AgentResponse) -> CommandFailure {
        match resp {
            AgentResponse::Failed(f) => f,
            other => panic!("expected Failed, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn tcp_probe_passes_against_a_listener_and_fails_on_a_closed_port() {
        let tmp = tempfile::tempdir().unwrap();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let open = ctx(HealthProbe::Tcp { port }, tmp.path().into());
        assert_eq!(probe_once(&open, TCP_ATTEMPT).await, Ok(()));
        assert_eq!(wait_healthy(&open, after(Duration::from_secs(2)), 2000, None).await, Ok(()));

        let (_held, port) = closed_port();
        let closed = ctx(HealthProbe::Tcp { port }, tmp.path().into());
        let t = StdInstant::now();
        let err = wait_healthy(&closed, after(Duration::from_millis(600)), 600, None).await.unwrap_err();
        let took = t.elapsed();
        assert!(took >= Duration::from_millis(600) && took < Duration::from_secs(2), "{took:?}");
        let HealthError::TimedOut { probe, waited, last } = &err else { panic!("{err:?}") };
        assert_eq!((probe.as_str(), waited.as_str()), (format!("tcp port {}", port_of(&closed)).as_str(), "600ms"));
        assert!(last.starts_with(&format!("connect to 127.0.0.1:{}: ", port_of(&closed))), "{last}");
        assert!(last.contains("refused"), "{last}");
    }

    fn port_of(c: &ProbeContext) -> u16 {
        match c.probe {
            HealthProbe::Tcp { port } => port,
            HealthProbe::Cmd { .. } => panic!("not a tcp probe"),
        }
    }

    #[tokio::test]
    async fn tcp_probe_passes_once_the_port_opens() {
        let tmp = tempfile::tempdir().unwrap();
        let (held, port) = closed_port();
        let c = ctx(HealthProbe::Tcp { port }, tmp.path().into());
        let opener = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            drop(held);
            std::net::TcpListener::bind(("127.0.0.1", port)).unwrap()
        });
        let t = StdInstant::now();
        assert_eq!(wait_healthy(&c, after(Duration::from_secs(5)), 5000, None).await, Ok(()));
        assert!(t.elapsed() >= Duration::from_millis(300) && t.elapsed() < Duration::from_secs(3));
        drop(opener.await.unwrap());
    }

    #[tokio::test]
    async fn cmd_probe_runs_in_the_instance_dir_with_its_env() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_path_buf();
        let probe = HealthProbe::Cmd {
            argv: argv(&[
                "sh",
                "-c",
                "[ \"$GREETING\" = hello ] && test -f ready || { echo 'not ready yet' >&2; exit 2; }",
            ]),
        };
        let c = ctx(probe, dir.clone());
        assert_eq!(probe_once(&c, CMD_ATTEMPT).await, Err("exited with code 2: not ready yet".into()));
        let err = wait_healthy(&c, after(Duration::from_millis(300)), 300, None).await.unwrap_err();
        assert!(
            matches!(&err, HealthError::TimedOut { last, .. } if last == "exited with code 2: not ready yet"),
            "{err:?}"
        );
        assert!(std::fs::read_to_string(dir.join("logs/health.stderr.log")).unwrap().contains("not ready yet"));
        let ready = dir.join("ready");
        let writer = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            std::fs::write(ready, "").unwrap();
        });
        assert_eq!(wait_healthy(&c, after(Duration::from_secs(5)), 5000, None).await, Ok(()));
        writer.await.unwrap();
        // A command that hangs is bounded by the attempt budget.
        let slow = ctx(HealthProbe::Cmd { argv: argv(&["sleep", "1000"]) }, dir);
        let t = StdInstant::now();
        assert_eq!(probe_once(&slow, Duration::from_millis(200)).await, Err("did not finish within 200ms".into()));
        assert!(t.elapsed() < Duration::from_secs(3));
    }

    fn health_spec(start: &[&str], probe: HealthProbe, start_timeout_ms: u64) -> ProcessSpec {
        ProcessSpec { health: Some(probe), start_timeout_ms, ..spec(start) }
    }

    #[tokio::test]
    async fn start_waits_for_the_health_check() {
        let t = TestNode::new();
        let probe = HealthProbe::Cmd { argv: argv(&["test", "-f", "run/ready"]) };
        let id = t
            .install(
                "health-gate",
                "root",
                health_spec(&["bin/run.sh"], probe, 5000),
                &[("bin/run.sh", "mkdir -p run\nsleep 0.5\ntouch run/ready\nexec sleep 1000")],
            )
            .await;
        let begun = StdInstant::now();
        let resp = t.node.start(&id, 2).await;
        assert!(matches!(resp, AgentResponse::Started { already_running: false, .. }), "{resp:?}");
        assert!(begun.elapsed() >= Duration::from_millis(500), "answered before healthy: {:?}", begun.elapsed());
        assert!(t.node.instance_dir(&id).join("run/ready").exists());
        // Already running and healthy: answers at once.
        let again = t.node.start(&id, 2).await;
        assert!(matches!(again, AgentResponse::Started { already_running: true, .. }), "{again:?}");
        assert!(matches!(t.node.stop(&id, 3).await, AgentResponse::Stopped { was_running: true }));
    }

    #[tokio::test]
    async fn start_whose_health_check_never_passes_fails_with_kind_health_and_keeps_running() {
        let t = TestNode::new();
        let (_held, port) = closed_port();
        let id = t
            .install(
                "health-never",
                "root",
                health_spec(&["bin/run.sh"], HealthProbe::Tcp { port }, 800),
                &[("bin/run.sh", "exec sleep 1000")],
            )
            .await;
        let begun = StdInstant::now();
        let f = failed(t.node.start(&id, 2).await);
        let took = begun.elapsed();
        assert!(took >= Duration::from_millis(800) && took < Duration::from_secs(3), "{took:?}");
        assert_eq!(f.kind, FailureKind::Health);
        let prefix = format!(
            "instance {id} did not pass its health check (tcp port {port}) within 800ms: connect to 127.0.0.1:{port}: "
        );
        assert!(f.message.starts_with(&prefix), "{}", f.message);
        // Left running for the master's undo to stop.
        let rec = t.record(&id).await;
        assert!(rec.desired_running);
        assert!(rec.pid.as_ref().is_some_and(|p| t.node.processes.is_alive(p)));
        assert!(matches!(t.node.stop(&id, 3).await, AgentResponse::Stopped { was_running: true }));
    }

    #[tokio::test]
    async fn health_wait_fails_fast_when_the_process_exits() {
        let t = TestNode::new();
        let (_held, port) = closed_port();
        let probe = HealthProbe::Tcp { port };
        let id = t
            .install(
                "health-crash",
                "root",
                health_spec(&["bin/run.sh"], probe, 10_000),
                &[("bin/run.sh", "echo run >> runs\nsleep 0.6\necho 'cannot bind: address in use' >&2\nexit 4")],
            )
            .await;
        let begun = StdInstant::now();
        let f = failed(t.node.start(&id, 2).await);
        assert!(begun.elapsed() < Duration::from_secs(3), "waited {:?} for a dead process", begun.elapsed());
        assert_eq!(f.kind, FailureKind::Health);
        assert!(f.message.starts_with(&format!("instance {id} exited while waiting for its health check (tcp port")));
        assert!(f.message.ends_with("exited with code 4"), "{}", f.message);
        assert_eq!(f.exit_code, Some(4));
        assert_eq!(f.stderr_tail, "cannot bind: address in use");
        // A failed start, not a crash: the restart policy (1 s) does not
        // start it again behind the master's back.
        assert_eq!(t.record(&id).await.pid, None);
        assert_eq!(t.persisted(&id).pid, None);
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let runs = std::fs::read_to_string(t.node.instance_dir(&id).join("runs")).unwrap_or_default();
        assert_eq!(runs.lines().count(), 1, "started again after a failed start");
    }

    /// A crash the restart policy restarts, whose new process dies before
    /// it is healthy, is one more crash: the policy goes on. (A failed
    /// start forgetting its pid, meant for the master's starts only, once
    /// ended the policy at that first restart.)
    #[tokio::test]
    async fn a_restart_that_dies_before_it_is_healthy_is_restarted_again() {
        let t = TestNode::new();
        t.node.set_restart_policy(crate::agent::restart::RestartPolicy {
            max: 5,
            window: Duration::from_secs(60),
            backoff: Duration::from_millis(100),
        });
        let probe = HealthProbe::Cmd { argv: argv(&["test", "-f", "run/ready"]) };
        let script = "echo run >> runs\nn=$(wc -l < runs)\nmkdir -p run\ncase $n in\n  1) touch run/ready; sleep 0.5; rm -f run/ready; exit 3;;\n  2) exit 4;;\n  *) touch run/ready; exec sleep 1000;;\nesac";
        let id = t
            .install("health-restart", "root", health_spec(&["bin/run.sh"], probe, 5000), &[("bin/run.sh", script)])
            .await;
        assert!(matches!(t.node.start(&id, 2).await, AgentResponse::Started { .. }));
        let runs =
            || std::fs::read_to_string(t.node.instance_dir(&id).join("runs")).unwrap_or_default().lines().count();
        let deadline = StdInstant::now() + Duration::from_secs(15);
        while runs() < 3 && StdInstant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(runs(), 3, "crash, a restart that died unhealthy, then another restart");
        let deadline = StdInstant::now() + Duration::from_secs(5);
        while !t.record(&id).await.pid.as_ref().is_some_and(|p| t.node.processes.is_alive(p)) {
            assert!(StdInstant::now() < deadline, "the third run is not recorded running");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(matches!(t.node.stop(&id, 3).await, AgentResponse::Stopped { was_running: true }));
    }

    #[tokio::test]
    async fn check_health_without_a_probe_follows_the_process() {
        let t = TestNode::new();
        let id = t.install("health-none", "root", spec(&["bin/run.sh"]), &[("bin/run.sh", "exec sleep 1000")]).await;
        let f = failed(t.node.check_health(&id, 1000).await);
        assert_eq!(
            (f.kind, f.message.as_str()),
            (FailureKind::Health, format!("instance {id} is not running").as_str())
        );
        assert!(matches!(t.node.start(&id, 2).await, AgentResponse::Started { .. }));
        assert_eq!(t.node.check_health(&id, 1000).await, AgentResponse::Healthy);
        assert!(matches!(t.node.stop(&id, 3).await, AgentResponse::Stopped { .. }));
        let f = failed(t.node.check_health(&id, 1000).await);
        assert_eq!(f.kind, FailureKind::Health);
        let other = InstanceId::new("not-installed-2");
        assert_eq!(failed(t.node.check_health(&other, 1000).await).kind, FailureKind::UnknownInstance);
    }

    #[tokio::test]
    async fn check_health_probes_without_holding_the_instance_lock() {
        let t = TestNode::new();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let id = t
            .install(
                "health-check",
                "root",
                health_spec(&["bin/run.sh"], HealthProbe::Tcp { port }, 3000),
                &[("bin/run.sh", "exec sleep 1000"), ("bin/hook.sh", "true")],
            )
            .await;
        assert!(matches!(t.node.start(&id, 2).await, AgentResponse::Started { .. }));
        assert_eq!(t.node.check_health(&id, 1000).await, AgentResponse::Healthy);
        // Closed, but still held: a socket bound to the port without
        // listening refuses connections, and no other test can take the
        // port meanwhile (a released port could be bound by one, and the
        // check would pass).
        drop(listener);
        let holder = tokio::net::TcpSocket::new_v4().unwrap();
        holder.set_reuseaddr(true).unwrap();
        holder.bind(std::net::SocketAddr::from(([127, 0, 0, 1], port))).unwrap();
        // A failing check runs for its whole timeout; meanwhile the
        // instance's other commands are not blocked.
        let node = t.node.clone();
        let check_id = id.clone();
        let check = tokio::spawn(async move { node.check_health(&check_id, 1500).await });
        tokio::time::sleep(Duration::from_millis(100)).await;
        let begun = StdInstant::now();
        let hook = t.node.run_hook(&id, 2, "reload", &argv(&["bin/hook.sh"]), 5000).await;
        assert!(matches!(hook, AgentResponse::HookDone { .. }), "{hook:?}");
        assert!(begun.elapsed() < Duration::from_millis(1000), "the hook waited for the check");
        let f = failed(check.await.unwrap());
        assert_eq!(f.kind, FailureKind::Health);
        assert!(
            f.message.contains(&format!("did not pass its health check (tcp port {port}) within 1.5s")),
            "{}",
            f.message
        );
        // The process dies during a check: it says so at once.
        let node = t.node.clone();
        let check_id = id.clone();
        let check = tokio::spawn(async move { node.check_health(&check_id, 10_000).await });
        tokio::time::sleep(Duration::from_millis(100)).await;
        let begun = StdInstant::now();
        let pid = t.record(&id).await.pid.unwrap().pid;
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGKILL).unwrap();
        let f = failed(check.await.unwrap());
        assert!(begun.elapsed() < Duration::from_secs(2), "{:?}", begun.elapsed());
        assert!(
            f.message.contains("exited while waiting") && f.message.ends_with("killed by signal 9 (SIGKILL)"),
            "{}",
            f.message
        );
    }
}
