//! Lifecycle hooks of installed instances (`AgentRequest::RunHook`): `init`,
//! `scale_out`, `scale_in`, `reload`, `destroy` (DESIGN.md §8).
//!
//! A hook runs while the instance's slot lock is held, so it never
//! interleaves with a start, stop, delete or another hook of the same
//! instance; the master decides when hooks run, the agent only serializes.
//! The command itself runs beside the instance, not in its tree (see
//! [`super::process::oneshot`]), bounded by the request's timeout, and its
//! output goes to `logs/hook-<name>.stdout.log` / `.stderr.log`. The name
//! becomes part of those file names, so only the five known names pass.
//!
//! A hook is a command of the instance's current intent: it carries a
//! generation, refused when older than the one applied and stored when newer
//! (like `WriteFiles`), but it changes nothing else in the record.

use std::time::Duration;

use super::node::{Node, admit, failure};
use super::process::oneshot::signal_name;
use super::process::{Ending, OneShot, run_oneshot};
use crate::ids::InstanceId;
use crate::protocol::messages::{AgentResponse, CommandFailure, FailureKind};

/// Every hook a spec may define.
pub const HOOKS: [&str; 5] = ["init", "scale_out", "scale_in", "reload", "destroy"];

/// Refuses a hook request naming no known hook or with an empty command
/// (the real agent and the simulated one answer alike).
pub fn check_hook_request(id: &InstanceId, hook: &str, argv: &[String]) -> Result<(), AgentResponse> {
    if !HOOKS.contains(&hook) {
        return Err(failure(
            FailureKind::BadRequest,
            format!("unknown hook {hook:?} (expected one of {})", HOOKS.join(", ")),
        ));
    }
    if argv.is_empty() {
        return Err(failure(FailureKind::BadRequest, format!("hook {hook} of {id} has an empty command")));
    }
    Ok(())
}

impl Node {
    /// Runs hook `hook` (`argv`) of instance `id`, at most `timeout_ms`.
    pub async fn run_hook(
        &self,
        id: &InstanceId,
        generation: u64,
        hook: &str,
        argv: &[String],
        timeout_ms: u64,
    ) -> AgentResponse {
        if let Err(refused) = check_hook_request(id, hook, argv) {
            return refused;
        }
        let slot = self.slot(id);
        // Held until the hook ended: see the module doc.
        let mut guard = slot.lock("hook").await;
        if guard.is_none() && hook == "destroy" {
            // Never installed here (its install failed) or already deleted:
            // there is nothing to destroy, and refusing would veto the
            // delete of a cluster whose create failed at install.
            tracing::info!(instance = %id, generation, "destroy hook of an instance not installed on this node: nothing to do");
            return AgentResponse::HookDone { exit_code: 0, stdout_tail: String::new(), stderr_tail: String::new() };
        }
        let rec = match admit(&mut guard, id, generation) {
            Ok(rec) => rec,
            Err(refused) => return refused,
        };
        let run_as = match self.run_as_of(rec, FailureKind::Hook) {
            Ok(u) => u,
            Err(resp) => return resp,
        };
        if generation > rec.generation {
            // Applied before it runs: a late duplicate of an older command
            // is refused even if this hook fails.
            rec.generation = generation;
            let r = rec.clone();
            if let Err(e) = self.persist(&r).await {
                return failure(FailureKind::Internal, e);
            }
        }
        let dir = self.instance_dir(id);
        let log_name = format!("hook-{hook}");
        let cmd = OneShot {
            argv,
            dir: &dir,
            env: &rec.process.env,
            run_as: &run_as,
            log_name: &log_name,
            timeout: Duration::from_millis(timeout_ms),
        };
        let ran = match run_oneshot(&cmd).await {
            Ok(r) => r,
            Err(e) => {
                return failure(
                    FailureKind::Hook,
                    format!("hook {hook} of {id} could not run: {}", crate::error::ErrorChain(&e)),
                );
            }
        };
        let (kind, message) = match ran.ending {
            Ending::Finished(status) if status.success() => {
                tracing::info!(instance = %id, hook, "hook succeeded");
                return AgentResponse::HookDone {
                    exit_code: 0,
                    stdout_tail: ran.stdout_tail,
                    stderr_tail: ran.stderr_tail,
                };
            }
            Ending::TimedOut => (
                FailureKind::Timeout,
                format!(
                    "hook {hook} of {id} did not finish within {}; its process group was killed",
                    describe_ms(timeout_ms)
                ),
            ),
            ending => match (ending.code(), ending.signal()) {
                (Some(code), _) => (FailureKind::Hook, format!("hook {hook} of {id} exited with code {code}")),
                (None, Some(sig)) => (
                    FailureKind::Hook,
                    format!("hook {hook} of {id} was killed by signal {sig} ({})", signal_name(sig)),
                ),
                (None, None) => (FailureKind::Hook, format!("hook {hook} of {id} ended without an exit status")),
            },
        };
        tracing::warn!(instance = %id, hook, %message, "hook failed");
        AgentResponse::Failed(CommandFailure {
            kind,
            message,
            exit_code: ran.ending.code(),
            stderr_tail: ran.stderr_tail,
            stdout_tail: ran.stdout_tail,
        })
    }
}

/// "2s", "1.5s", "250ms": a timeout as an operator reads it.
pub fn describe_ms(ms: u64) -> String {
    if ms >= 1000 && ms.is_multiple_of(100) {
        let s = format!("{:.1}", ms as f64 / 1000.0);
        format!("{}s", s.trim_end_matches(".0"))
    } else {
        format!("{ms}ms")
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;
    use crate::agent::process::identity::read_stat;
    use crate::agent::testkit::{TestNode, argv, spec};

    fn failed(resp: AgentResponse) -> CommandFailure {
        match resp {
            AgentResponse::Failed(f) => f,
            other => panic!("expected Failed, got {other:?}"),
        }
    }

    /// Pids of running (non-zombie) processes in process group `pgid`.
    fn group_members(pgid: i32) -> Vec<u32> {
        std::fs::read_dir("/proc")
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
            .filter(|pid| read_stat(*pid).is_some_and(|s| s.is_running() && s.pgid == pgid))
            .collect()
    }

    #[test]
    fn describes_timeouts() {
        assert_eq!(describe_ms(2000), "2s");
        assert_eq!(describe_ms(1500), "1.5s");
        assert_eq!(describe_ms(250), "250ms");
        assert_eq!(describe_ms(1234), "1234ms");
    }

    #[tokio::test]
    async fn hook_exit_0_returns_this_runs_tails_and_runs_like_the_instance() {
        let t = TestNode::new();
        let id = t.install("hook-ok", "nobody", spec(&["bin/run.sh"]), &[(
            "bin/init.sh",
            "echo \"init $GREETING as $(id -u) in $PWD marker=${FLOTILLA_INSTANCE:-none} args=$*\"\necho 'just a warning' >&2",
        )]).await;
        let dir = t.node.instance_dir(&id);
        std::fs::create_dir_all(dir.join("logs")).unwrap();
        std::fs::write(dir.join("logs/hook-init.stdout.log"), "an older run\n").unwrap();
        let resp = t.node.run_hook(&id, 1, "init", &argv(&["bin/init.sh", "--first"]), 5000).await;
        let nobody = crate::agent::process::users::resolve("nobody").unwrap();
        let expected = format!("init hello as {} in {} marker=none args=--first", nobody.uid, dir.display());
        assert_eq!(
            resp,
            AgentResponse::HookDone {
                exit_code: 0,
                stdout_tail: expected.clone(),
                stderr_tail: "just a warning".into()
            }
        );
        let log = std::fs::read_to_string(dir.join("logs/hook-init.stdout.log")).unwrap();
        assert_eq!(log, format!("an older run\n{expected}\n"));
        assert!(std::fs::read_to_string(dir.join("logs/hook-init.stderr.log")).unwrap().contains("just a warning"));
        // The service's own logs are untouched.
        assert!(!dir.join("logs/stdout.log").exists());
        // A newer generation is stored; nothing else in the record changes.
        let before = t.record(&id).await;
        let again = t.node.run_hook(&id, 4, "init", &argv(&["bin/init.sh"]), 5000).await;
        assert!(matches!(again, AgentResponse::HookDone { exit_code: 0, .. }), "{again:?}");
        let after = t.record(&id).await;
        assert_eq!(after.generation, 4);
        assert_eq!(after, crate::storage::agent_records::AgentInstanceRecord { generation: 4, ..before });
        assert_eq!(t.persisted(&id).generation, 4);
    }

    #[tokio::test]
    async fn hook_non_zero_exit_reports_code_and_both_tails() {
        let t = TestNode::new();
        let id = t
            .install(
                "hook-fail",
                "root",
                spec(&["bin/run.sh"]),
                &[("bin/leave.sh", "echo 'leaving the ensemble'\necho 'quorum would be lost' >&2\nexit 3")],
            )
            .await;
        let f = failed(t.node.run_hook(&id, 1, "scale_in", &argv(&["bin/leave.sh"]), 5000).await);
        assert_eq!(f.kind, FailureKind::Hook);
        assert_eq!(f.message, format!("hook scale_in of {id} exited with code 3"));
        assert_eq!(f.exit_code, Some(3));
        assert_eq!(f.stderr_tail, "quorum would be lost");
        assert_eq!(f.stdout_tail, "leaving the ensemble");

        // Killed by a signal: the message says which.
        t.script(&id, "bin/die.sh", "echo 'about to die' >&2\nkill -TERM $$\nsleep 5");
        let f = failed(t.node.run_hook(&id, 1, "reload", &argv(&["bin/die.sh"]), 5000).await);
        assert_eq!(f.kind, FailureKind::Hook);
        assert_eq!(f.message, format!("hook reload of {id} was killed by signal 15 (SIGTERM)"));
        assert_eq!((f.exit_code, f.stderr_tail.as_str()), (None, "about to die"));

        // A hook that cannot even start.
        let f = failed(t.node.run_hook(&id, 1, "reload", &argv(&["bin/missing.sh"]), 5000).await);
        assert_eq!(f.kind, FailureKind::Hook);
        assert!(f.message.starts_with(&format!("hook reload of {id} could not run")), "{}", f.message);
    }

    #[tokio::test]
    async fn hook_timeout_kills_its_whole_process_group() {
        let t = TestNode::new();
        let id = t
            .install(
                "hook-slow",
                "root",
                spec(&["bin/run.sh"]),
                &[("bin/slow.sh", "sleep 1000 &\necho \"group $$ background $!\"\nsleep 1000")],
            )
            .await;
        let started = Instant::now();
        let f = failed(t.node.run_hook(&id, 1, "destroy", &argv(&["bin/slow.sh"]), 400).await);
        let took = started.elapsed();
        assert!(took >= Duration::from_millis(400) && took < Duration::from_secs(3), "{took:?}");
        assert_eq!(f.kind, FailureKind::Timeout);
        assert_eq!(
            f.message,
            format!("hook destroy of {id} did not finish within 400ms; its process group was killed")
        );
        assert_eq!(f.exit_code, None);
        // The hook said who it is: its group and its background sleep.
        let words: Vec<&str> = f.stdout_tail.split_whitespace().collect();
        let [_, group, _, background] = words[..] else { panic!("unexpected stdout {:?}", f.stdout_tail) };
        let (group, background): (i32, u32) = (group.parse().unwrap(), background.parse().unwrap());
        assert!(group > 1);
        assert_eq!(group_members(group), Vec::<u32>::new(), "processes of the hook's group survive");
        assert!(!read_stat(background).is_some_and(|s| s.is_running()), "the background sleep survives");
    }

    #[tokio::test]
    async fn hook_leaves_nothing_behind_when_it_exits() {
        let t = TestNode::new();
        let id = t
            .install("hook-stray", "root", spec(&["bin/run.sh"]), &[("bin/init.sh", "sleep 1000 &\necho \"group $$\"")])
            .await;
        let resp = t.node.run_hook(&id, 1, "init", &argv(&["bin/init.sh"]), 5000).await;
        let AgentResponse::HookDone { stdout_tail, .. } = resp else { panic!("{resp:?}") };
        let group: i32 = stdout_tail.trim_start_matches("group ").parse().unwrap();
        assert_eq!(group_members(group), Vec::<u32>::new());
    }

    #[tokio::test]
    async fn unknown_hook_names_and_empty_commands_are_refused() {
        let t = TestNode::new();
        let id = t.install("hook-names", "root", spec(&["bin/run.sh"]), &[("bin/x.sh", "touch ran")]).await;
        for name in ["start", "../../etc/passwd", "init/x", "", "INIT"] {
            let f = failed(t.node.run_hook(&id, 1, name, &argv(&["bin/x.sh"]), 5000).await);
            assert_eq!(f.kind, FailureKind::BadRequest, "{name:?}");
            assert!(f.message.contains("unknown hook"), "{}", f.message);
        }
        let f = failed(t.node.run_hook(&id, 1, "init", &[], 5000).await);
        assert_eq!(f.kind, FailureKind::BadRequest);
        let dir = t.node.instance_dir(&id);
        assert!(!dir.join("ran").exists());
        assert!(!dir.join("logs").exists(), "a refused hook must not create logs");
    }

    #[tokio::test]
    async fn stale_generation_and_unknown_instance_are_refused() {
        let t = TestNode::new();
        let id = t.install("hook-stale", "root", spec(&["bin/run.sh"]), &[("bin/x.sh", "touch ran")]).await;
        t.node.run_hook(&id, 5, "init", &argv(&["bin/x.sh"]), 5000).await;
        std::fs::remove_file(t.node.instance_dir(&id).join("ran")).unwrap();
        let f = failed(t.node.run_hook(&id, 4, "init", &argv(&["bin/x.sh"]), 5000).await);
        assert_eq!(f.kind, FailureKind::StaleGeneration);
        assert!(!t.node.instance_dir(&id).join("ran").exists(), "a stale hook must not run");
        assert_eq!(t.record(&id).await.generation, 5);
        let other = InstanceId::new("not-installed-1");
        let f = failed(t.node.run_hook(&other, 1, "init", &argv(&["bin/x.sh"]), 5000).await);
        assert_eq!(f.kind, FailureKind::UnknownInstance);
    }

    #[tokio::test]
    async fn a_hook_holds_the_instance_lock() {
        let t = TestNode::new();
        let id = t
            .install(
                "hook-lock",
                "root",
                spec(&["bin/run.sh"]),
                &[("bin/run.sh", "exec sleep 1000"), ("bin/slow.sh", "sleep 0.5\necho done > hook-done")],
            )
            .await;
        let node = t.node.clone();
        let hook_id = id.clone();
        let hook = tokio::spawn(async move { node.run_hook(&hook_id, 1, "init", &argv(&["bin/slow.sh"]), 5000).await });
        // Once the hook's log exists the hook holds the lock.
        let log = t.node.instance_dir(&id).join("logs/hook-init.stdout.log");
        let deadline = Instant::now() + Duration::from_secs(5);
        while !log.exists() {
            assert!(Instant::now() < deadline, "the hook did not start");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // The start waits for the hook: it finds the hook's file written.
        let started = t.node.start(&id, 1).await;
        assert!(matches!(started, AgentResponse::Started { .. }), "{started:?}");
        assert!(t.node.instance_dir(&id).join("hook-done").exists());
        assert!(matches!(hook.await.unwrap(), AgentResponse::HookDone { .. }));
    }
}
