//! Starting an instance: foreground (the child is the process) or
//! daemonizing (the start command exits and leaves a pidfile).
//!
//! A start either returns a running, identified process or leaves nothing of
//! the instance behind: on any failure the instance's tree is killed and its
//! cgroups (its own and its limit cgroups) removed. Limits the spec asks for
//! are applied before the child runs, or the start fails before any side
//! effect.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::identity::{self, read_stat};
use super::limits::{LimitsError, Values};
use super::pidfile::{self, Outcome};
use super::spawn::{self, Launch, Logs, tail};
use super::watch::{ExitWatch, StderrLog};
use super::{ProcessController, ProcessError, StartRequest, Started, Tracked, cgroup, tree};
use crate::storage::agent_records::PidIdentity;

impl ProcessController {
    /// Starts the instance unless it runs already (`current` alive ->
    /// `already_running: true`). Processes of the instance found running
    /// without being `current` (e.g. left over from a crash) are killed first.
    pub async fn start(&self, req: &StartRequest<'_>) -> Result<Started, ProcessError> {
        // Whatever follows may leave a process of the instance running: a
        // delete must look for it again (see `confirmed_stopped`).
        let confirmed = self.confirmed().remove(req.instance);
        if let Some(cur) = req.current.filter(|c| identity::is_alive(c)) {
            let exit = self.exit_watch_for(req.instance, cur);
            return Ok(Started { identity: cur.clone(), already_running: true, exit });
        }
        if req.spec.start.is_empty() {
            return Err(ProcessError::Spawn {
                argv: Vec::new(),
                source: io::Error::new(io::ErrorKind::InvalidInput, "the start command is empty"),
            });
        }
        if !req.instance.is_safe_path_component() {
            return Err(ProcessError::io(
                format!("instance id {:?} is not a safe name", req.instance.as_str()),
                io::Error::new(io::ErrorKind::InvalidInput, "unsafe instance id"),
            ));
        }
        let limits = self.check_limits(req)?;
        let began = Instant::now();
        // A stop in this agent's life confirmed nothing of it runs, and its
        // cgroup is still empty (or gone): nothing can have started since
        // (only a start makes the cgroup again, and its processes' children
        // are born inside it), so no pass over `/proc` is needed, as for a
        // delete (`confirmed_stopped`). A whole cluster's start after its
        // stop spared each agent a pass per burst of starts.
        let cg_empty = self.cgroup_of(req.instance).as_deref().is_some_and(cgroup::is_empty);
        if !(confirmed && cg_empty) {
            self.kill_leftovers(req).await?;
        }
        tracing::trace!(instance = %req.instance, leftovers_ms = began.elapsed().as_secs_f64() * 1000.0, "looked for leftovers");
        let cg = match &self.cgroups {
            Some(root) => Some(
                root.create(req.instance)
                    .map_err(|e| ProcessError::io(format!("creating the cgroup of {}", req.instance), e))?,
            ),
            None => None,
        };
        let result = self.spawn_main(req, cg.as_deref(), limits.as_ref()).await;
        match result {
            Ok(started) => {
                self.tracked().insert(
                    req.instance.clone(),
                    Tracked { identity: started.identity.clone(), exit: started.exit.clone() },
                );
                Ok(started)
            }
            Err(e) => {
                match self.kill_tree(req.instance, &[], cg.as_deref()).await {
                    Ok(remaining) if remaining.is_empty() => {}
                    Ok(remaining) => {
                        tracing::error!(instance = %req.instance, ?remaining, "processes of a failed start survive SIGKILL")
                    }
                    Err(err) => {
                        tracing::error!(instance = %req.instance, error = %err, "cannot clean up after a failed start")
                    }
                }
                if let Some(cg) = &cg
                    && let Err(err) = cgroup::remove(cg).await
                {
                    tracing::warn!(cgroup = %cg.display(), error = %err, "cannot remove the cgroup of a failed start");
                }
                self.remove_limit_cgroups(req.instance).await;
                Err(e)
            }
        }
    }

    /// The validated limits of the spec (`None`: nothing to limit), refused
    /// when this agent cannot enforce them.
    fn check_limits(&self, req: &StartRequest<'_>) -> Result<Option<Values>, ProcessError> {
        let limits_err = |source| ProcessError::Limits { instance: req.instance.to_string(), source };
        let Some(values) = req.spec.limits.as_ref().map(Values::from_limits).transpose().map_err(limits_err)?.flatten()
        else {
            return Ok(None);
        };
        match &self.limits {
            Ok(_) => Ok(Some(values)),
            Err(reason) => Err(limits_err(LimitsError::Unavailable { reason: reason.clone() })),
        }
    }

    /// Removes the instance's limit cgroups (after its processes are gone).
    pub(super) async fn remove_limit_cgroups(&self, instance: &crate::ids::InstanceId) {
        if let Ok(root) = &self.limits
            && let Err(e) = root.remove(instance).await
        {
            tracing::warn!(%instance, error = %crate::error::ErrorChain(&e), "cannot remove the limit cgroups");
        }
    }

    async fn spawn_main(
        &self,
        req: &StartRequest<'_>,
        cg: Option<&Path>,
        limits: Option<&Values>,
    ) -> Result<Started, ProcessError> {
        // Every cgroup the child joins before exec: its own, then the limit
        // cgroups (on a pure v2 host the same directory, joined once).
        let mut join: Vec<PathBuf> = cg.map(Path::to_path_buf).into_iter().collect();
        if let (Some(values), Ok(root)) = (limits, &self.limits) {
            let dirs = root
                .prepare(req.instance, values)
                .map_err(|source| ProcessError::Limits { instance: req.instance.to_string(), source })?;
            join.extend(dirs.into_iter().filter(|d| Some(d.as_path()) != cg));
        }
        let procs = join
            .iter()
            .map(|dir| {
                OpenOptions::new()
                    .write(true)
                    .open(dir.join("cgroup.procs"))
                    .map_err(|e| ProcessError::io(format!("opening {}/cgroup.procs", dir.display()), e))
            })
            .collect::<Result<Vec<File>, _>>()?;
        let logs = spawn::open_logs(req.dir, req.run_as)?;
        match &req.spec.pidfile {
            None => self.start_foreground(req, &procs, logs).await,
            Some(rel) => self.start_daemon(req, rel, cg, &procs, logs).await,
        }
    }

    fn launch<'a>(req: &'a StartRequest<'a>, procs: &'a [File], logs: &'a Logs) -> Launch<'a> {
        Launch {
            argv: &req.spec.start,
            dir: req.dir,
            env: &req.spec.env,
            marker: Some(req.instance),
            run_as: req.run_as,
            cgroup_procs: procs,
            stdout: &logs.stdout,
            stderr: &logs.stderr,
        }
    }

    async fn start_foreground(
        &self,
        req: &StartRequest<'_>,
        procs: &[File],
        logs: Logs,
    ) -> Result<Started, ProcessError> {
        let child = spawn::spawn(&Self::launch(req, procs, &logs))?;
        let Some(pid) = child.id() else {
            return Err(ProcessError::io("the spawned process has no pid", io::Error::other("already reaped")));
        };
        // Not reaped before `reap` below: readable even if it exited already.
        let identity = identity::read_identity(pid).ok_or_else(|| {
            ProcessError::io(format!("reading /proc/{pid}/stat"), io::Error::other("no such process"))
        })?;
        let stderr = StderrLog { file: Arc::new(logs.stderr), from: logs.stderr_start };
        let exit = ExitWatch::reap(child, pid, stderr);
        // No fixed wait: the start answers at once unless the role asks for
        // a settle window; an exit after the answer is a crash, reported by
        // the exit watcher (and handled by the restart policy).
        let settle = req.settle.min(Duration::from_millis(req.spec.start_timeout_ms.max(1)));
        let early = if settle.is_zero() {
            exit.try_exited()
        } else {
            tokio::time::timeout(settle, exit.clone().wait()).await.ok()
        };
        if let Some(info) = early {
            return Err(ProcessError::StartFailed {
                exit_code: info.exit_code,
                signal: info.signal,
                stderr_tail: info.stderr_tail,
            });
        }
        Ok(Started { identity, already_running: false, exit })
    }

    async fn start_daemon(
        &self,
        req: &StartRequest<'_>,
        rel: &str,
        cg: Option<&Path>,
        procs: &[File],
        logs: Logs,
    ) -> Result<Started, ProcessError> {
        pidfile::check_relative(rel).map_err(|reason| ProcessError::PidfileInvalid { path: rel.into(), reason })?;
        let pidfile = pidfile::Pidfile::open(req.dir, rel, req.run_as)?;
        let path = pidfile.path.clone();
        // A pidfile left from an earlier run must not be mistaken for this one.
        pidfile.remove_stale()?;
        let timeout_ms = req.spec.start_timeout_ms;
        let deadline = Instant::now() + Duration::from_millis(timeout_ms);
        let spawned = Instant::now();
        let mut child = spawn::spawn(&Self::launch(req, procs, &logs))?;
        let pgid = child.id();
        let status = match tokio::time::timeout_at(deadline, child.wait()).await {
            Ok(Ok(status)) => status,
            Ok(Err(e)) => return Err(ProcessError::io("waiting for the start command", e)),
            Err(_) => {
                let _ = child.start_kill();
                let _ = child.wait().await;
                return Err(ProcessError::StartTimeout {
                    argv: req.spec.start.clone(),
                    waited_ms: timeout_ms,
                    stderr_tail: tail(&logs.stderr, logs.stderr_start),
                });
            }
        };
        if !status.success() {
            return Err(ProcessError::StartFailed {
                exit_code: status.code(),
                signal: status.signal(),
                stderr_tail: tail(&logs.stderr, logs.stderr_start),
            });
        }
        tracing::trace!(instance = %req.instance, script_ms = (Instant::now() - spawned).as_secs_f64() * 1000.0, "start script exited");
        let is_running = |pid: u32| read_stat(pid).is_some_and(|s| s.is_running());
        // An unreadable /proc is not "nothing runs": keep waiting.
        let nothing_runs = || tree::collect(req.instance, &[], cg).is_ok_and(|m| m.is_empty());
        // A daemonizing script has usually written its pidfile before it
        // exits: then no watch is needed. Otherwise inotify watches for it
        // (set up after this first look, but the waiter looks again before
        // it waits, so a pidfile written in between is not missed). Closing
        // an inotify instance waits for an RCU grace period (milliseconds),
        // so a needed waiter is dropped off the start's path.
        let outcome = match pidfile.read() {
            Ok(Some(pid)) if is_running(pid) => Outcome::Pid(pid),
            _ => {
                let mut waiter = pidfile::Waiter::new(&pidfile);
                let outcome = waiter.wait(&pidfile, deadline, is_running, nothing_runs).await;
                tokio::task::spawn_blocking(move || drop(waiter));
                outcome
            }
        };
        let pid = match outcome {
            Outcome::Pid(pid) => pid,
            Outcome::Missing => {
                return Err(ProcessError::PidfileTimeout {
                    path,
                    waited_ms: timeout_ms,
                    stderr_tail: tail(&logs.stderr, logs.stderr_start),
                });
            }
            Outcome::Invalid(reason) => return Err(ProcessError::PidfileInvalid { path, reason }),
        };
        if !tree::belongs(req.instance, pid, cg, pgid) {
            return Err(ProcessError::PidNotInTree { pid });
        }
        let Some(identity) = identity::read_identity(pid) else {
            return Err(ProcessError::PidfileInvalid {
                path,
                reason: format!("process {pid} exited right after starting"),
            });
        };
        let stderr = StderrLog { file: Arc::new(logs.stderr), from: logs.stderr_start };
        let exit = ExitWatch::poll(identity.clone(), Some(stderr));
        Ok(Started { identity, already_running: false, exit })
    }

    /// The exit watch of a tracked process, or a polling one.
    pub(super) fn exit_watch_for(&self, instance: &crate::ids::InstanceId, id: &PidIdentity) -> ExitWatch {
        match self.tracked().get(instance) {
            Some(t) if t.identity == *id => t.exit.clone(),
            _ => ExitWatch::poll(id.clone(), None),
        }
    }

    /// Kills processes of the instance that run although no recorded main
    /// process does (left over from a crash of the agent or of the process).
    async fn kill_leftovers(&self, req: &StartRequest<'_>) -> Result<(), ProcessError> {
        let cg = self.cgroup_of(req.instance);
        let left = self.members(req.instance, &[], cg.as_deref()).await?;
        if left.is_empty() {
            return Ok(());
        }
        let pids: Vec<u32> = left.iter().map(|m| m.pid).collect();
        tracing::warn!(instance = %req.instance, ?pids, "killing leftover processes of the instance before starting it");
        self.kill_all_of(req.instance, cg.as_deref()).await
    }
}
