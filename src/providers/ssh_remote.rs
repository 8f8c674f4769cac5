//! How the `static` driver reaches its hosts: ssh and scp with the host's
//! key pinned, each call killed past its time, its failure told by what
//! ssh said; the hosts it remembers as unreachable or failing; and the
//! per-host log. A host's failure is never `Config` (that would mark the
//! whole pool broken): only a missing local `ssh` or `scp` is.

use std::io::Write;
use std::process::Stdio;
use std::time::{Duration, Instant, SystemTime};

use tokio::io::AsyncWriteExt;

use super::scripts::{LIB, indent, sq};
use super::{BAD_MEMORY, Inner, LOG_MAX, UNREACHABLE_MEMORY};
use crate::providers::driver::DriverError;

/// What ssh answered.
pub(super) struct Out {
    pub(super) code: i32,
    pub(super) stdout: String,
    pub(super) stderr: String,
}

impl Inner {
    pub(super) fn ssh_options(&self, i: usize, port_flag: &str) -> Vec<String> {
        let h = self.host(i);
        let mut v: Vec<String> = vec!["-F".into(), "/dev/null".into()];
        let fixed = [
            "BatchMode=yes",
            "StrictHostKeyChecking=yes",
            "GlobalKnownHostsFile=/dev/null",
            "UpdateHostKeys=no",
            "CheckHostIP=no",
            "IdentitiesOnly=yes",
            "IdentityAgent=none",
            "ServerAliveInterval=5",
            "ServerAliveCountMax=3",
            "LogLevel=ERROR",
        ];
        let known = format!("UserKnownHostsFile=\"{}\"", self.known_hosts[i].display());
        let timeout = format!("ConnectTimeout={}", self.s.connect_timeout.as_secs().max(1));
        for o in fixed.iter().map(|s| s.to_string()).chain([known, timeout]) {
            v.extend(["-o".into(), o]);
        }
        v.extend(["-i".into(), h.key.display().to_string(), port_flag.into(), h.port.to_string()]);
        v
    }

    /// Runs `body` (after [`LIB`] and `d=remote_dir`) on host `i` by `sh
    /// -c` (under `sudo -n` for a user other than root), `$1` being the
    /// host's `$SSH_CONNECTION`. `logged`: into the host's log.
    pub(super) async fn ssh(
        &self,
        i: usize,
        step: &str,
        body: &str,
        stdin: Option<&[u8]>,
        limit: Duration,
        logged: bool,
    ) -> Result<Out, DriverError> {
        let h = self.host(i);
        let script = format!("{LIB}d={}\n{body}", sq(&self.s.remote_dir));
        let sudo = if h.user == "root" { "" } else { "sudo -n " };
        let mut cmd = tokio::process::Command::new("ssh");
        cmd.args(self.ssh_options(i, "-p")).arg(format!("{}@{}", h.user, h.address));
        cmd.arg(format!("{sudo}sh -c {} sh \"$SSH_CONNECTION\"", sq(&script)));
        if logged {
            self.log(i, &format!("$ ssh {}@{} -p {} [{step}]\n{}", h.user, h.address, h.port, indent(body)));
        }
        self.run(i, step, cmd, stdin, limit, logged).await
    }

    /// Runs ssh or scp, killed past `limit` plus the connect timeout; an
    /// ssh failure (ssh's 255, any scp failure) is classed by what it said.
    pub(super) async fn run(
        &self,
        i: usize,
        step: &str,
        mut cmd: tokio::process::Command,
        stdin: Option<&[u8]>,
        limit: Duration,
        logged: bool,
    ) -> Result<Out, DriverError> {
        let name = self.host(i).name();
        let program = cmd.as_std().get_program().to_string_lossy().into_owned();
        cmd.stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() });
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).kill_on_drop(true);
        let mut child = cmd.spawn().map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => DriverError::config(format!(
                "cannot run {program} (openssh-client, installed by scripts/setup.sh): {e}"
            )),
            _ => DriverError::transient(format!("cannot run {program}: {e}")),
        })?;
        let (pipe, input) = (child.stdin.take(), stdin.map(<[u8]>::to_vec));
        let work = async move {
            if let (Some(mut pipe), Some(input)) = (pipe, input) {
                // A host that stops reading shows in the exit status.
                let _ = pipe.write_all(&input).await;
            }
            child.wait_with_output().await
        };
        let (limit, started) = (limit + self.s.connect_timeout, Instant::now());
        let result = tokio::time::timeout(limit, work).await;
        let output = match result {
            Err(_) => {
                let e = format!("host {name}: {step}: no answer within {}", humantime::format_duration(limit));
                if logged {
                    self.log(i, &format!("  {e} (killed)"));
                }
                self.remember(i, UNREACHABLE_MEMORY);
                return Err(DriverError::transient(e));
            }
            Ok(Err(e)) => return Err(DriverError::transient(format!("host {name}: {step}: {e}"))),
            Ok(Ok(o)) => o,
        };
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        let out = Out {
            code: output.status.code().unwrap_or(-1),
            stdout: text(&output.stdout),
            stderr: text(&output.stderr),
        };
        if logged {
            let took = started.elapsed().as_secs_f64();
            let mut line = format!("  exit {} after {took:.1}s", out.code);
            for (what, s) in [("stdout", &out.stdout), ("stderr", &out.stderr)] {
                if !s.trim().is_empty() {
                    line.push_str(&format!("\n  {what}:\n{}", indent(s)));
                }
            }
            self.log(i, &line);
        }
        if out.code == 255 || (program == "scp" && out.code != 0) {
            return Err(self.ssh_failure(i, step, out.code, &out.stderr));
        }
        Ok(out)
    }

    /// What an ssh (255) or scp failure means, the host remembered as
    /// failing (its key, the login, a remote write) or unreachable.
    fn ssh_failure(&self, i: usize, step: &str, code: i32, stderr: &str) -> DriverError {
        let h = self.host(i);
        // scp's own remote errors start with "scp: " (e.g. "scp: dest open
        // ...: Permission denied"); ssh's login failure names the methods.
        let ssh_lines: Vec<&str> = stderr.lines().map(str::trim).filter(|l| !l.starts_with("scp:")).collect();
        let has = |words: &[&str]| ssh_lines.iter().any(|l| words.iter().any(|w| l.contains(w)));
        fn last<'a>(lines: &[&'a str]) -> &'a str {
            lines.iter().rfind(|l| !l.is_empty() && !l.starts_with('@')).copied().unwrap_or("(nothing on stderr)")
        }
        let said = last(&stderr.lines().map(str::trim).collect::<Vec<_>>());
        let ssh_said = last(&ssh_lines);
        let (why, memory) =
            if has(&["Host key verification failed", "IDENTIFICATION HAS CHANGED", "host key is known for"]) {
                let why = format!("its SSH host key is not the pinned one (hosts[{i}].host_key), refused: {ssh_said}");
                (why, BAD_MEMORY)
            } else if has(&["Permission denied (", "Too many authentication failures", "Load key", "UNPROTECTED"]) {
                (format!("ssh cannot log in as {} with {}: {ssh_said}", h.user, h.key.display()), BAD_MEMORY)
            } else if code == 255 {
                (format!("unreachable ({step}): {said}"), UNREACHABLE_MEMORY)
            } else {
                (format!("{step} failed (scp's exit {code}): {said}"), BAD_MEMORY)
            };
        self.remember(i, memory);
        DriverError::transient(format!("host {}: {why}", h.name()))
    }

    /// `out`'s stdout when the script succeeded.
    pub(super) fn ok(&self, i: usize, step: &str, out: Out) -> Result<String, DriverError> {
        if out.code == 0 {
            return Ok(out.stdout);
        }
        let name = self.host(i).name();
        let said = out.stderr.trim();
        if said.contains("sudo:") && said.contains("password") {
            self.remember(i, BAD_MEMORY);
            return Err(DriverError::transient(format!(
                "host {name}: user {} needs sudo without a password: {said}",
                self.host(i).user
            )));
        }
        Err(DriverError::transient(format!("host {name}: {step} failed (exit {}): {said}", out.code)))
    }

    /// Host `i` is tried after the others for `memory` (or longer, if it
    /// is remembered longer already).
    pub(super) fn remember(&self, i: usize, memory: Duration) {
        let until = Instant::now() + memory;
        let mut avoided = self.avoided.lock().unwrap_or_else(|e| e.into_inner());
        avoided.entry(i).and_modify(|t| *t = (*t).max(until)).or_insert(until);
    }

    pub(super) fn forgive(&self, i: usize) {
        self.avoided.lock().unwrap_or_else(|e| e.into_inner()).remove(&i);
    }

    /// Host indices, the hosts remembered as unreachable or failing last.
    pub(super) fn order(&self) -> Vec<usize> {
        let now = Instant::now();
        let avoided = self.avoided.lock().unwrap_or_else(|e| e.into_inner());
        let mut order: Vec<usize> = (0..self.s.hosts.len()).collect();
        order.sort_by_key(|i| avoided.get(i).is_some_and(|t| *t > now));
        order
    }

    fn log_path(&self, i: usize) -> std::path::PathBuf {
        let h = self.host(i);
        self.s.dir.join(format!("{}_{}.log", h.address, h.port))
    }

    /// The end of the log of host `host` (`address:port`); a host the pool
    /// does not have is a config error.
    pub(super) fn host_log(&self, host: &str, max_bytes: u64) -> Result<String, DriverError> {
        let Some(i) = (0..self.s.hosts.len()).find(|i| self.host(*i).name() == host) else {
            let known: Vec<String> = self.s.hosts.iter().map(|h| h.name()).collect();
            return Err(DriverError::config(format!("no host {host:?} in this pool (hosts: {})", known.join(", "))));
        };
        self.log_tail(i, max_bytes).map_err(|e| DriverError::transient(format!("the log of {host}: {e}")))
    }

    /// The last `max_bytes` of the host's log (empty before its first
    /// bootstrap), from a line's start.
    pub(super) fn log_tail(&self, i: usize, max_bytes: u64) -> std::io::Result<String> {
        use std::io::{Read, Seek, SeekFrom};
        let mut f = match std::fs::File::open(self.log_path(i)) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(String::new()),
            Err(e) => return Err(e),
        };
        let len = f.metadata()?.len();
        let from = len.saturating_sub(max_bytes);
        // One byte more, before it: whether `from` starts a line.
        let before = from.saturating_sub(1);
        f.seek(SeekFrom::Start(before))?;
        let mut buf = Vec::with_capacity((len - before) as usize);
        f.take(max_bytes + 1).read_to_end(&mut buf)?;
        let text = String::from_utf8_lossy(&buf).into_owned();
        Ok(if from == 0 {
            text
        } else {
            // From the first line that starts at or after `from` (none:
            // nothing whole fits).
            text.find('\n').map(|nl| text[nl + 1..].to_string()).unwrap_or_default()
        })
    }

    /// Appends to the host's log (`<address>_<port>.log` in the driver's
    /// directory); never holds the token (it only travels on ssh's stdin).
    pub(super) fn log(&self, i: usize, text: &str) {
        use std::os::unix::fs::OpenOptionsExt;
        let path = self.log_path(i);
        if std::fs::metadata(&path).is_ok_and(|m| m.len() > LOG_MAX) {
            let _ = std::fs::rename(&path, path.with_extension("log.1"));
        }
        let line = format!("{} {}\n", humantime::format_rfc3339_millis(SystemTime::now()), text.trim_end());
        let file = std::fs::OpenOptions::new().create(true).append(true).mode(0o600).open(&path);
        if let Err(e) = file.and_then(|mut f| f.write_all(line.as_bytes())) {
            tracing::warn!(path = %path.display(), error = %e, "cannot write a static host's log");
        }
    }
}
