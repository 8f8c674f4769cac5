//! The `static` driver (Juju's manual provider, Nodepool's static driver):
//! a fixed list of hosts reached over SSH with the system's OpenSSH client,
//! each holding at most one node. A host is ours while `remote_dir/tags.json`
//! exists on it; `create` picks a host without one, claims it by making
//! that file (an exclusive `ln`, so two masters never take one host), copies
//! the agent binary and checks its sha256, writes the join token to a file
//! of mode 0600 (through ssh's stdin, never a command line) and starts the
//! agent under systemd where PID 1 is systemd, else under a small
//! supervisor script (`setsid nohup`, with a pidfile). `delete` stops it and
//! removes `remote_dir`, `tags.json` last.
//!
//! Every host's key is pinned: ssh runs with a known_hosts file of the
//! driver's own holding that one key and `StrictHostKeyChecking=yes`, so an
//! unknown or changed key is refused. `remote_dir` and its parents must be
//! root's and writable by no one else, on every host, each time.
//!
//! A host that refuses (its key, its login, a foreign agent, an unsafe
//! `remote_dir`) or fails its bootstrap is skipped, its reason logged, and
//! tried after the others for a while; `create` goes on with the next free
//! host. With none left it answers `Quota` when every host was merely in
//! use, else `Transient` naming each host's reason (the launcher retries);
//! `Config` (the whole pool broken) only for what no host can help: no
//! local `ssh` or `scp`, no readable agent binary, a listener the hosts
//! cannot reach.
//!
//! Every ssh call is bounded in time (the child is killed past it); at most
//! `max_parallel` bootstraps run at once and no lock is held across an ssh
//! call, so a dead host costs its own create one connect timeout and
//! nothing else. `create` and `delete` run as tasks of their own: a
//! cancelled delete finishes on its own; a cancelled create stops before it
//! claims a host or starts an agent and unwinds what it made.
//!
//! The external id is `<address>:<port>/<nonce>`: the nonce (written to
//! `remote_dir/id`) makes a stale delete of a node whose host was taken
//! again since find nothing to take down.
//!
//! Beside this file: the settings (`ssh_settings.rs`), the shell scripts run
//! on the hosts (`ssh_scripts.rs`), ssh/scp and the per-host log
//! (`ssh_remote.rs`), the tests against real sshds (`ssh_tests.rs`).

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use futures::StreamExt;
use futures::future::BoxFuture;
use tokio::sync::{Notify, Semaphore};

use super::driver::{Driver, DriverError, DriverQuota, ErrorClass, LaunchSpec, Resource, ResourceState};

/// A step's own time, on top of the connect timeout.
const QUICK: Duration = Duration::from_secs(30);
const COPY: Duration = Duration::from_secs(600);
/// Stopping the agent takes up to 20 s of grace, then SIGKILL.
const SLOW: Duration = Duration::from_secs(90);
/// A host that did not answer is tried after the others for this long.
const UNREACHABLE_MEMORY: Duration = Duration::from_secs(60);
/// A host that refused or failed a bootstrap, for this long.
const BAD_MEMORY: Duration = Duration::from_secs(300);
/// A host's log is rotated (to `.log.1`) past this size.
const LOG_MAX: u64 = 4 << 20;

#[path = "ssh_remote.rs"]
mod remote;
#[path = "ssh_scripts.rs"]
pub(super) mod scripts;
#[path = "ssh_settings.rs"]
mod settings;

use scripts::*;
use settings::check_spec;
pub use settings::{StaticHost, StaticSettings};

/// What holds a host in this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hold {
    Create,
    Delete,
}

/// Makes nodes on a fixed list of hosts over SSH (see the module doc).
pub struct StaticDriver {
    inner: Arc<Inner>,
}

struct Inner {
    s: StaticSettings,
    known_hosts: Vec<PathBuf>,
    held: Mutex<HashMap<usize, Hold>>,
    released: Notify,
    bootstraps: Semaphore,
    /// Until when each host that failed to answer, refused or failed a
    /// bootstrap is tried after the others.
    avoided: Mutex<HashMap<usize, Instant>>,
    /// The agent binary's length, mtime and sha256.
    binary_sum: Mutex<Option<(u64, Option<SystemTime>, String)>>,
}

/// A held host, released when dropped.
struct HostGuard {
    inner: Arc<Inner>,
    host: usize,
}

impl Drop for HostGuard {
    fn drop(&mut self) {
        self.inner.held.lock().unwrap_or_else(|e| e.into_inner()).remove(&self.host);
        self.inner.released.notify_waiters();
    }
}

/// What a host holds before a create, from the probe script.
#[derive(Debug)]
struct Probe {
    client: IpAddr,
    server: IpAddr,
    cores: u32,
    memory_bytes: u64,
    vars: Vec<(String, String)>,
}

impl Probe {
    fn has(&self, key: &str) -> Vec<&str> {
        self.vars.iter().filter(|(k, _)| k == key).map(|(_, v)| v.as_str()).collect()
    }
}

impl StaticDriver {
    /// A driver for `settings`; writes each host's pinned known_hosts file
    /// under `settings.dir`. Nothing on a host is touched until a call.
    pub fn new(settings: StaticSettings) -> Result<StaticDriver, String> {
        let ssh_dir = settings.dir.join("ssh");
        crate::private_file::private_dir(&ssh_dir).map_err(|e| format!("cannot make {}: {e}", ssh_dir.display()))?;
        let mut known_hosts = Vec::new();
        for h in &settings.hosts {
            // ssh looks a host up as `[address]:port` unless the port is 22.
            let pattern = if h.port == 22 { h.address.clone() } else { format!("[{}]:{}", h.address, h.port) };
            let path = ssh_dir.join(format!("{}_{}.known_hosts", h.address, h.port));
            crate::private_file::write_private(&path, format!("{pattern} {}\n", h.host_key).as_bytes())
                .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
            known_hosts.push(path);
        }
        let inner = Inner {
            bootstraps: Semaphore::new(settings.max_parallel),
            s: settings,
            known_hosts,
            held: Mutex::new(HashMap::new()),
            released: Notify::new(),
            avoided: Mutex::new(HashMap::new()),
            binary_sum: Mutex::new(None),
        };
        Ok(StaticDriver { inner: Arc::new(inner) })
    }
}

/// Set when the caller's future is dropped: a create checks it before it
/// claims a host and before it starts the agent.
struct Cancel(Arc<AtomicBool>);

impl Drop for Cancel {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// An error when the caller of a create gave up.
fn check_cancel(cancelled: &AtomicBool) -> Result<(), DriverError> {
    if cancelled.load(Ordering::SeqCst) {
        return Err(DriverError::transient("the create was cancelled (its caller gave up)"));
    }
    Ok(())
}

/// Runs `f` as a task of its own, so a cancelled caller does not cut it short.
async fn detached<T: Send + 'static>(
    f: impl Future<Output = Result<T, DriverError>> + Send + 'static,
) -> Result<T, DriverError> {
    tokio::spawn(f).await.map_err(|e| DriverError::transient(format!("static driver task: {e}")))?
}

impl Driver for StaticDriver {
    fn kind(&self) -> &'static str {
        "static"
    }

    fn host_log(&self, host: &str, max_bytes: u64) -> Option<Result<String, DriverError>> {
        Some(self.inner.host_log(host, max_bytes))
    }

    fn create<'a>(&'a self, spec: &'a LaunchSpec) -> BoxFuture<'a, Result<String, DriverError>> {
        let cancelled = Arc::new(AtomicBool::new(false));
        let (cancel, task) = (Cancel(cancelled.clone()), detached(self.inner.clone().create(spec.clone(), cancelled)));
        Box::pin(async move {
            let _cancel = cancel;
            task.await
        })
    }

    /// `Gone` when the host holds no node of this id, `Pending` while a
    /// create works on it, `Running` while its agent runs, else `Stopping`.
    fn status<'a>(&'a self, external_id: &'a str) -> BoxFuture<'a, Result<ResourceState, DriverError>> {
        let inner = self.inner.clone();
        Box::pin(async move {
            let (i, nonce) = inner.parse_id(external_id)?;
            let body = "[ -e \"$d/tags.json\" ] && [ \"$(cat \"$d/id\" 2>/dev/null)\" = \"$n\" ] || { echo gone; exit 0; }\nstate\n";
            let out = inner.ssh(i, "status", &format!("n={}\n{body}", sq(&nonce)), None, QUICK, false).await?;
            let out = inner.ok(i, "status", out)?;
            Ok(match out.trim() {
                "gone" => ResourceState::Gone,
                _ if inner.held(i) == Some(Hold::Create) => ResourceState::Pending,
                "running" => ResourceState::Running,
                _ => ResourceState::Stopping,
            })
        })
    }

    fn delete<'a>(&'a self, external_id: &'a str) -> BoxFuture<'a, Result<(), DriverError>> {
        let (inner, id) = (self.inner.clone(), external_id.to_string());
        Box::pin(detached(async move {
            let (i, nonce) = inner.parse_id(&id)?;
            let _guard = Inner::hold_for_delete(&inner, i).await;
            inner.remove(i, &nonce, "delete").await
        }))
    }

    fn list(&self) -> BoxFuture<'_, Result<Vec<Resource>, DriverError>> {
        let inner = self.inner.clone();
        Box::pin(async move {
            let found: Vec<Result<Option<Resource>, DriverError>> = futures::stream::iter(0..inner.s.hosts.len())
                .map(|i| inner.list_host(i))
                .buffer_unordered(inner.s.max_parallel)
                .collect()
                .await;
            let (mut listed, mut errors) = (Vec::new(), Vec::new());
            for r in found {
                match r {
                    Ok(r) => listed.extend(r),
                    Err(e) => errors.push(e),
                }
            }
            if let Some(first) = errors.first() {
                let all: Vec<&str> = errors.iter().map(|e| e.message.as_str()).collect();
                return Err(DriverError::new(first.class, format!("cannot list every host: {}", all.join("; "))));
            }
            listed.sort_by(|a: &Resource, b| a.external_id.cmp(&b.external_id));
            Ok(listed)
        })
    }

    fn quota(&self) -> BoxFuture<'_, Result<DriverQuota, DriverError>> {
        let max_nodes = u32::try_from(self.inner.s.hosts.len()).ok();
        Box::pin(async move { Ok(DriverQuota { max_nodes }) })
    }
}

impl Inner {
    fn host(&self, i: usize) -> &StaticHost {
        &self.s.hosts[i]
    }

    /// The host and nonce of `<address>:<port>/<nonce>`.
    fn parse_id(&self, id: &str) -> Result<(usize, String), DriverError> {
        let not_ours = || DriverError::config(format!("{id:?} is not a node of this static pool"));
        let (name, nonce) = id.rsplit_once('/').ok_or_else(not_ours)?;
        let canonical = nonce.is_empty()
            || (nonce.len() == 8 && nonce.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
        let i = self.s.hosts.iter().position(|h| h.name() == name).filter(|_| canonical).ok_or_else(not_ours)?;
        Ok((i, nonce.to_string()))
    }

    fn held(&self, i: usize) -> Option<Hold> {
        self.held.lock().unwrap_or_else(|e| e.into_inner()).get(&i).copied()
    }

    fn try_hold(this: &Arc<Inner>, i: usize, hold: Hold) -> Option<HostGuard> {
        let mut held = this.held.lock().unwrap_or_else(|e| e.into_inner());
        if held.contains_key(&i) {
            return None;
        }
        held.insert(i, hold);
        Some(HostGuard { inner: this.clone(), host: i })
    }

    /// Holds host `i` for a delete once no create or delete holds it.
    async fn hold_for_delete(this: &Arc<Inner>, i: usize) -> HostGuard {
        loop {
            let notified = this.released.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            if let Some(guard) = Inner::try_hold(this, i, Hold::Delete) {
                return guard;
            }
            notified.await;
        }
    }

    /// The agent binary's sha256, computed again when its length or mtime
    /// changed.
    async fn binary_sum(&self) -> Result<String, DriverError> {
        let path = self.s.agent_binary.clone();
        let bad = |e: std::io::Error| DriverError::config(format!("agent_binary {}: {e}", path.display()));
        let meta = std::fs::metadata(&path).map_err(bad)?;
        let key = (meta.len(), meta.modified().ok());
        let cached = self.binary_sum.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some((len, mtime, sum)) = cached
            && (len, mtime) == key
        {
            return Ok(sum);
        }
        let p = path.clone();
        let sum = tokio::task::spawn_blocking(move || -> std::io::Result<String> {
            use sha2::Digest;
            let mut hasher = sha2::Sha256::new();
            std::io::copy(&mut std::fs::File::open(&p)?, &mut hasher)?;
            Ok(hex::encode(hasher.finalize()))
        })
        .await
        .map_err(|e| DriverError::transient(format!("hashing the agent binary: {e}")))?
        .map_err(bad)?;
        *self.binary_sum.lock().unwrap_or_else(|e| e.into_inner()) = Some((key.0, key.1, sum.clone()));
        Ok(sum)
    }

    async fn create(self: Arc<Self>, spec: LaunchSpec, cancelled: Arc<AtomicBool>) -> Result<String, DriverError> {
        check_spec(&spec)?;
        let _permit = self.bootstraps.acquire().await.map_err(|e| DriverError::transient(e.to_string()))?;
        check_cancel(&cancelled)?;
        let sum = self.binary_sum().await?;
        let (mut in_use, mut failed) = (0, Vec::new());
        for i in self.order() {
            check_cancel(&cancelled)?;
            if self.held(i).is_some() {
                in_use += 1;
                continue;
            }
            let p = match self.probe(i).await {
                Ok(p) => p,
                Err(e) if e.class == ErrorClass::Config => return Err(e),
                Err(e) => {
                    failed.push(self.skipped(i, e.message));
                    continue;
                }
            };
            if !p.has("tags").is_empty() {
                in_use += 1;
                continue;
            }
            if let Some(why) = self.foreign(&p) {
                self.remember(i, BAD_MEMORY);
                failed.push(self.skipped(i, format!("host {}: {why}", self.host(i).name())));
                continue;
            }
            // Held only once found free: a node running there stays
            // `Running` to status() and list() meanwhile.
            let Some(_guard) = Inner::try_hold(&self, i, Hold::Create) else {
                in_use += 1;
                continue;
            };
            match self.bootstrap(i, &spec, &p, &sum, &cancelled).await {
                Ok(Some(id)) => {
                    self.forgive(i);
                    return Ok(id);
                }
                Ok(None) => in_use += 1,
                Err(e) if e.class == ErrorClass::Config || cancelled.load(Ordering::SeqCst) => return Err(e),
                Err(e) => {
                    self.remember(i, BAD_MEMORY);
                    failed.push(self.skipped(i, e.message));
                }
            }
        }
        let n = self.s.hosts.len();
        Err(if failed.is_empty() {
            DriverError::new(ErrorClass::Quota, format!("every host of the pool is in use ({n} hosts)"))
        } else {
            let failed = failed.join("; ");
            DriverError::transient(format!("no host could take the node ({in_use} of {n} in use): {failed}"))
        })
    }

    /// Logs why host `i` was skipped; `why`.
    fn skipped(&self, i: usize, why: String) -> String {
        tracing::warn!(host = %self.host(i).name(), error = %why, "static host skipped");
        self.log(i, &format!("skipped: {why}"));
        why
    }

    async fn probe(&self, i: usize) -> Result<Probe, DriverError> {
        let out = self.ssh(i, "probe", PROBE, None, QUICK, true).await?;
        let stdout = self.ok(i, "probe", out)?;
        let vars: Vec<(String, String)> =
            stdout.lines().filter_map(|l| l.split_once('=')).map(|(k, v)| (k.into(), v.trim().into())).collect();
        let get = |k: &str| vars.iter().find(|(x, _)| x == k).map(|(_, v)| v.as_str()).unwrap_or("");
        let name = self.host(i).name();
        let bad = |what: &str| {
            self.remember(i, BAD_MEMORY);
            DriverError::transient(format!("host {name}: the probe found no {what}: {stdout:?}"))
        };
        let conn: Vec<&str> = get("conn").split_whitespace().collect();
        let (client, server) = match conn.as_slice() {
            [c, _, s, _] => (c.parse().ok(), s.parse().ok()),
            _ => (None, None),
        };
        let (Some(client), Some(server)) = (client, server) else { return Err(bad("$SSH_CONNECTION")) };
        let cores = get("cores").parse().map_err(|_| bad("core count (nproc)"))?;
        let mem_kb: u64 = get("mem_kb").parse().map_err(|_| bad("MemTotal in /proc/meminfo"))?;
        Ok(Probe { client, server, cores, memory_bytes: mem_kb * 1024, vars })
    }

    /// Why a host without our tag file must not be taken, if it must not.
    fn foreign(&self, p: &Probe) -> Option<String> {
        let d = &self.s.remote_dir;
        if !p.has("tags").is_empty() {
            return None;
        }
        if let Some(why) = p.has("unsafe").first() {
            return Some(format!("{d} is not safe to use: {}", why.trim_start_matches("refused: ")));
        }
        let agents = p.has("agent");
        if !agents.is_empty() {
            return Some(format!(
                "a flotilla agent runs there (pid {}) that no pool started: stop it or take the host out of the pool",
                agents.join(", ")
            ));
        }
        let units = p.has("unit");
        if !units.is_empty() {
            return Some(format!("systemd unit {} exists but {d}/tags.json does not", units.join(", ")));
        }
        (!p.has("files").is_empty()).then(|| format!("{d} holds files but no tags.json (not a node of flotilla)"))
    }

    /// Claims host `i` and starts the node's agent there: its id, or
    /// `None` when another master claimed the host meanwhile. Whatever a
    /// failed or cancelled try made on the host is removed before the
    /// answer.
    async fn bootstrap(
        &self,
        i: usize,
        spec: &LaunchSpec,
        probe: &Probe,
        sum: &str,
        cancelled: &AtomicBool,
    ) -> Result<Option<String>, DriverError> {
        let h = self.host(i);
        let master_ip = if spec.master_addr.ip().is_unspecified() { probe.client } else { spec.master_addr.ip() };
        if master_ip.is_loopback() && !probe.server.is_loopback() {
            return Err(DriverError::config(format!(
                "the master's agent listener is on {}, which host {} cannot reach: put it on an address the hosts \
                 reach, or on every interface (agent_addr = \"0.0.0.0:{}\")",
                spec.master_addr,
                h.name(),
                spec.master_addr.port()
            )));
        }
        let master = SocketAddr::new(master_ip, spec.master_addr.port());
        let mut tags = spec.tags.clone();
        tags.insert("cores".into(), probe.cores.to_string());
        tags.insert("memory_bytes".into(), probe.memory_bytes.to_string());
        let json = serde_json::to_vec(&tags).map_err(|e| DriverError::transient(format!("tags: {e}")))?;
        let mut nonce = [0u8; 4];
        getrandom::fill(&mut nonce).map_err(|e| DriverError::transient(format!("no randomness: {e}")))?;
        let nonce = hex::encode(nonce);
        check_cancel(cancelled)?;
        self.log(i, &format!("bootstrap of node {} as {}/{nonce}, master {master}", spec.node.as_str(), h.name()));
        let made = async {
            let out = self.ssh(i, "claim", &format!("n={}\n{CLAIM}", sq(&nonce)), Some(&json), QUICK, true).await?;
            if out.code == 7 {
                // Refused before anything was made: nothing to unwind.
                return Ok(Err(DriverError::transient(format!("host {}: {}", h.name(), out.stderr.trim()))));
            }
            if self.ok(i, "claim", out)?.trim() == "taken" {
                return Ok(Ok(false));
            }
            self.install(i, spec, sum, &nonce).await?;
            check_cancel(cancelled)?;
            self.start(i, spec, probe, master).await?;
            // The caller gone, nobody would learn the id: take it down.
            check_cancel(cancelled).map(|()| Ok(true))
        };
        let e = match made.await {
            Ok(Ok(true)) => {
                self.log(i, "bootstrap done");
                return Ok(Some(format!("{}/{nonce}", h.name())));
            }
            Ok(Ok(false)) => {
                self.log(i, "taken by another master meanwhile");
                return Ok(None);
            }
            Ok(Err(refused)) => return Err(refused),
            Err(e) => e,
        };
        self.log(i, &format!("bootstrap failed, unwinding: {e}"));
        match self.remove(i, &nonce, "unwind").await {
            Ok(()) => Err(e),
            Err(u) => Err(DriverError::new(e.class, format!("{}; unwinding it failed: {}", e.message, u.message))),
        }
    }

    /// Copies and checks the binary, writes the token.
    async fn install(&self, i: usize, spec: &LaunchSpec, sum: &str, nonce: &str) -> Result<(), DriverError> {
        let (h, d) = (self.host(i), &self.s.remote_dir);
        let src = if h.user == "root" { format!("{d}/bin/flotilla.part") } else { self.part(i, nonce) };
        let target = if h.address.contains(':') { format!("[{}]", h.address) } else { h.address.clone() };
        let mut scp = tokio::process::Command::new("scp");
        scp.arg("-q").args(self.ssh_options(i, "-P")).arg(&self.s.agent_binary);
        scp.arg(format!("{}@{target}:{src}", h.user));
        self.log(i, &format!("$ scp {} {}@{target}:{src} (port {})", self.s.agent_binary.display(), h.user, h.port));
        self.run(i, "copy", scp, None, COPY, true).await?;
        let out =
            self.ssh(i, "install", &format!("src={}\nwant={sum}\n{INSTALL}", sq(&src)), None, QUICK, true).await?;
        self.ok(i, "install", out)?;
        let env = format!("FLOTILLA_AGENT_JOIN_TOKEN={}\n", spec.join_token);
        let out = self.ssh(i, "token", ENV, Some(env.as_bytes()), QUICK, true).await?;
        self.ok(i, "token", out).map(drop)
    }

    /// Starts the agent, under systemd where PID 1 is systemd.
    async fn start(&self, i: usize, spec: &LaunchSpec, probe: &Probe, master: SocketAddr) -> Result<(), DriverError> {
        let (h, d) = (self.host(i), &self.s.remote_dir);
        let mut labels = spec.labels.clone();
        for (k, v) in &h.labels {
            labels.entry(k.clone()).or_insert_with(|| v.clone());
        }
        let mut args: Vec<String> = ["agent", "--node-id", spec.node.as_str(), "--master", &master.to_string()]
            .into_iter()
            .map(String::from)
            .collect();
        args.extend(["--address".into(), probe.server.to_string(), "--data-dir".into(), format!("{d}/agent")]);
        args.extend(["--port-range".into(), self.s.port_range.clone(), "--stop-instances-on-exit".into()]);
        for (k, v) in &labels {
            args.extend(["--label".into(), format!("{k}={v}")]);
        }
        let node = spec.node.as_str();
        let (body, file) = if probe.has("systemd").is_empty() || !self.s.use_systemd {
            let quoted: Vec<String> = args.iter().map(|a| sq(a)).collect();
            (START_PROCESS.to_string(), supervisor(node, d, &quoted.join(" ")))
        } else {
            // Every argument is plain (checked): none needs systemd quoting.
            let unit = format!("flotilla-agent-{node}.service");
            (format!("u={}\n{START_SYSTEMD}", sq(&unit)), unit_file(node, d, &args.join(" ")))
        };
        let out = self.ssh(i, "start", &body, Some(file.as_bytes()), QUICK, true).await?;
        self.ok(i, "start", out).map(drop)
    }

    /// Where a non-root user's copy of the binary goes (in its home).
    fn part(&self, i: usize, nonce: &str) -> String {
        if self.host(i).user == "root" { String::new() } else { format!(".flotilla-agent-{nonce}.part") }
    }

    /// Stops node `nonce`'s agent on host `i` and removes what it had;
    /// a host holding no such node is a success.
    async fn remove(&self, i: usize, nonce: &str, step: &str) -> Result<(), DriverError> {
        let body = format!("n={}\npart={}\n{REMOVE}", sq(nonce), sq(&self.part(i, nonce)));
        let out = self.ssh(i, step, &body, None, SLOW, true).await?;
        let said = self.ok(i, step, out)?;
        match said.lines().last().unwrap_or("").trim() {
            "removed" | "gone" | "other" => Ok(()),
            other => Err(DriverError::transient(format!(
                "host {}: {step}: unexpected answer {other:?}",
                self.host(i).name()
            ))),
        }
    }

    /// Host `i`'s node as `list()` shows it, `None` when it holds none;
    /// an error when what it holds cannot be read whole.
    async fn list_host(self: &Arc<Self>, i: usize) -> Result<Option<Resource>, DriverError> {
        let out = self.ssh(i, "list", LIST, None, QUICK, false).await?;
        let out = self.ok(i, "list", out)?;
        if out.trim() == "absent" {
            return Ok(None);
        }
        let get = |k: &str| out.lines().find_map(|l| l.strip_prefix(k)?.strip_prefix('=')).unwrap_or("").trim();
        let (name, d) = (self.host(i).name(), &self.s.remote_dir);
        let tags: BTreeMap<String, String> = serde_json::from_str(get("tags"))
            .map_err(|e| DriverError::transient(format!("host {name}: cannot parse {d}/tags.json: {e}")))?;
        let id = get("id");
        if id.len() != 8 || !id.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
            return Err(DriverError::transient(format!("host {name}: {d}/id holds {id:?}, not a node's id")));
        }
        let state = match get("state") {
            _ if self.held(i) == Some(Hold::Create) => ResourceState::Pending,
            "running" => ResourceState::Running,
            _ => ResourceState::Stopping,
        };
        Ok(Some(Resource { external_id: format!("{name}/{id}"), tags, state }))
    }
}

#[cfg(test)]
#[path = "ssh_tests.rs"]
mod tests;
