//! The `local` driver: each node is a network namespace on this host,
//! joined to the root namespace by a veth pair, with a real `flotilla
//! agent` inside. Slot `k` of a pool is the namespace `{prefix}-{k}` (its
//! external id) and the `k`-th /30 of the pool's network: the host end of
//! the pair holds `.1`, the namespace end `.2`, and the agent dials the
//! master at the host end.
//!
//! What a node holds on disk is `{data_dir}/{prefix}-{k}/`: `tags.json`
//! (written before the namespace is made, so a namespace of ours is never
//! untagged after a crash in create), `agent/` (the agent's data dir),
//! `agent.log` and `agent.pid`. A namespace found without its tag file is
//! listed with empty tags, which the launcher never deletes.
//!
//! Every method runs its blocking work (`ip`, `/proc` scans, waits) on
//! tokio's blocking pool: the futures are polled on actor threads. A
//! cancelled future leaves that work to finish (and unwind) on its own.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs;
use std::io::{self, Read, Seek, SeekFrom};
use std::net::Ipv4Addr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Condvar, Mutex, mpsc};
use std::time::Duration;

use futures::future::BoxFuture;

use super::driver::{Driver, DriverError, DriverQuota, ErrorClass, LaunchSpec, Resource, ResourceState};
#[cfg(test)]
use super::netns::pids_in;
use super::netns::{NETNS_DIR, NsInode, fs_error, ns_inode, processes, stop_processes};

/// How long a deleted node's processes get after SIGTERM (its agent stops
/// its instances on exit) before SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(20);
/// A created agent must still live this long after its spawn.
const ALIVE_AFTER: Duration = Duration::from_millis(100);

/// A `local` pool's settings.
#[derive(Debug, Clone)]
pub struct LocalSettings {
    /// Names the pool's namespaces (`{prefix}-{slot}`) and, hashed, their
    /// interfaces.
    pub prefix: String,
    /// Holds one directory per node.
    pub data_dir: PathBuf,
    /// The `flotilla` binary the nodes run.
    pub agent_binary: PathBuf,
    /// An IPv4 CIDR in a private range, cut into one /30 per node.
    pub network: String,
    /// The agents' `--port-range`.
    pub port_range: String,
    pub max_nodes: Option<u32>,
}

impl LocalSettings {
    /// Checks every setting; the error names the bad key.
    pub fn check(&self) -> Result<(), String> {
        let p = &self.prefix;
        if p.is_empty() || p.len() > 24 {
            return Err(format!("prefix: {p:?} must be 1 to 24 characters"));
        }
        if let Some(c) = p.chars().find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-')) {
            return Err(format!("prefix: {p:?} may hold only a-z, 0-9 and '-'; {c:?} is not allowed"));
        }
        Network::parse(&self.network).map_err(|m| format!("network: {:?}: {m}", self.network))?;
        let range = self.port_range.split_once('-').and_then(|(a, b)| Some((a.parse::<u16>().ok()?, b.parse().ok()?)));
        if !matches!(range, Some((lo, hi)) if lo >= 1 && lo <= hi) {
            return Err(format!("port_range: {:?}: expected LOW-HIGH, e.g. 20000-29999", self.port_range));
        }
        match fs::metadata(&self.agent_binary) {
            Ok(m) if m.is_file() => {}
            Ok(_) => return Err(format!("agent_binary: {} is not a file", self.agent_binary.display())),
            Err(e) => return Err(format!("agent_binary: {}: {e}", self.agent_binary.display())),
        }
        if self.max_nodes == Some(0) {
            return Err("max_nodes: must be at least 1".into());
        }
        Ok(())
    }
}

/// An IPv4 network of `2^(30 - len)` slots of 4 addresses.
#[derive(Debug, Clone, Copy)]
struct Network {
    base: u32,
    len: u32,
}

impl Network {
    fn parse(s: &str) -> Result<Network, String> {
        let (addr, len) = s.split_once('/').ok_or("expected an IPv4 CIDR, e.g. 10.213.0.0/16")?;
        let addr: Ipv4Addr = addr.parse().map_err(|_| format!("{addr:?} is not an IPv4 address"))?;
        let len: u32 = len.parse().map_err(|_| format!("{len:?} is not a prefix length"))?;
        if !(8..=24).contains(&len) {
            return Err("the prefix length must be 8 to 24".into());
        }
        let base = u32::from(addr);
        if base & !mask(len) != 0 {
            return Err(format!("host bits set (the network is {}/{len})", Ipv4Addr::from(base & mask(len))));
        }
        let private = [([10, 0, 0, 0], 8), ([172, 16, 0, 0], 12), ([192, 168, 0, 0], 16)];
        if !private.iter().any(|&(net, l)| len >= l && base & mask(l) == u32::from(Ipv4Addr::from(net))) {
            return Err("not inside a private range (10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16)".into());
        }
        Ok(Network { base, len })
    }

    fn slots(&self) -> u32 {
        1 << (30 - self.len)
    }

    /// The host end and the namespace end of `slot`'s /30.
    fn ends(&self, slot: u32) -> (Ipv4Addr, Ipv4Addr) {
        let at = self.base + 4 * slot;
        (Ipv4Addr::from(at + 1), Ipv4Addr::from(at + 2))
    }
}

fn mask(len: u32) -> u32 {
    u32::MAX << (32 - len)
}

/// What holds a slot in this process: a create (the slot is `Pending`
/// until it answers) or a delete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hold {
    Create,
    Delete,
}

/// Makes nodes as network namespaces on this host (see the module doc).
pub struct LocalDriver {
    inner: Arc<Inner>,
}

/// The driver's state, shared with the blocking tasks that outlive a
/// cancelled future.
struct Inner {
    s: LocalSettings,
    net: Network,
    /// `fl` and 4 hex digits of a hash of the prefix: with `h`/`n` and the
    /// slot it names the pair's ends within the kernel's 15 characters.
    tag: String,
    /// Slots a create or delete of this driver is working on: no two
    /// operations ever touch one slot at once.
    held: Mutex<BTreeMap<u32, Hold>>,
    released: Condvar,
}

/// A held slot, released when dropped (also when the work panics).
struct SlotGuard {
    inner: Arc<Inner>,
    slot: u32,
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        self.inner.held.lock().unwrap_or_else(|e| e.into_inner()).remove(&self.slot);
        self.inner.released.notify_all();
    }
}

impl LocalDriver {
    /// A driver for `settings`, refused as [`LocalSettings::check`] does.
    /// Nothing is made or looked at on the host until a method is called.
    pub fn new(settings: LocalSettings) -> Result<LocalDriver, String> {
        settings.check()?;
        let net = Network::parse(&settings.network)?;
        // FNV-1a: stable across builds, so a restarted master finds the
        // interfaces it made.
        let h = settings.prefix.bytes().fold(0x811c_9dc5_u32, |h, b| (h ^ u32::from(b)).wrapping_mul(0x0100_0193));
        let tag = format!("fl{:04x}", (h ^ (h >> 16)) & 0xffff);
        let inner = Inner { s: settings, net, tag, held: Mutex::new(BTreeMap::new()), released: Condvar::new() };
        Ok(LocalDriver { inner: Arc::new(inner) })
    }
}

/// Runs `f` on tokio's blocking pool.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, DriverError> + Send + 'static,
) -> Result<T, DriverError> {
    tokio::task::spawn_blocking(f).await.map_err(|e| DriverError::transient(format!("local driver task: {e}")))?
}

impl Driver for LocalDriver {
    fn kind(&self) -> &'static str {
        "local"
    }

    fn create<'a>(&'a self, spec: &'a LaunchSpec) -> BoxFuture<'a, Result<String, DriverError>> {
        let (inner, spec) = (self.inner.clone(), spec.clone());
        Box::pin(blocking(move || Inner::create(&inner, &spec)))
    }

    /// `Gone` when the namespace does not exist, `Pending` while a create
    /// of this driver works on it, `Running` when its agent process lives
    /// in it, `Stopping` when it exists without one (being deleted, or its
    /// agent died: either way the node does nothing until it is deleted).
    fn status<'a>(&'a self, external_id: &'a str) -> BoxFuture<'a, Result<ResourceState, DriverError>> {
        let (inner, id) = (self.inner.clone(), external_id.to_string());
        Box::pin(blocking(move || {
            let slot = inner.parse_id(&id)?;
            if inner.held(slot) == Some(Hold::Create) {
                return Ok(ResourceState::Pending);
            }
            let Some(ns) = ns_inode(&id)? else { return Ok(ResourceState::Gone) };
            let agents = inner.agents_in(&[(ns, id)])?;
            Ok(if agents.is_empty() { ResourceState::Stopping } else { ResourceState::Running })
        }))
    }

    fn delete<'a>(&'a self, external_id: &'a str) -> BoxFuture<'a, Result<(), DriverError>> {
        let (inner, id) = (self.inner.clone(), external_id.to_string());
        Box::pin(blocking(move || {
            let slot = inner.parse_id(&id)?;
            let _guard = Inner::hold_for_delete(&inner, slot);
            inner.teardown(&id, STOP_GRACE)
        }))
    }

    fn list(&self) -> BoxFuture<'_, Result<Vec<Resource>, DriverError>> {
        let inner = self.inner.clone();
        Box::pin(blocking(move || inner.list()))
    }

    fn quota(&self) -> BoxFuture<'_, Result<DriverQuota, DriverError>> {
        let max_nodes = self.inner.s.max_nodes.or(Some(self.inner.net.slots()));
        Box::pin(async move { Ok(DriverQuota { max_nodes }) })
    }
}

impl Inner {
    /// `{prefix}-{slot}-{nonce}`: the nonce (8 random hex digits) makes
    /// each create's id its own, so a stale delete of a node whose slot
    /// was taken again since finds nothing to take down.
    fn ns_name(&self, slot: u32, nonce: &str) -> String {
        format!("{}-{slot}-{nonce}", self.s.prefix)
    }

    /// The host end (`h`) or namespace end (`n`) of `slot`'s pair.
    fn if_name(&self, slot: u32, end: char) -> String {
        format!("{}{end}{slot}", self.tag)
    }

    fn node_dir(&self, ns: &str) -> PathBuf {
        self.s.data_dir.join(ns)
    }

    /// The slot of a namespace name of this pool (`{prefix}-{digits}-{8
    /// hex}`, as create writes it), else `None`.
    fn slot_of(&self, name: &str) -> Option<u32> {
        let rest = name.strip_prefix(&self.s.prefix)?.strip_prefix('-')?;
        let (digits, nonce) = rest.split_once('-')?;
        let slot: u32 = digits.parse().ok()?;
        let canonical = nonce.len() == 8 && nonce.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        (canonical && self.ns_name(slot, nonce) == name).then_some(slot)
    }

    fn parse_id(&self, id: &str) -> Result<u32, DriverError> {
        self.slot_of(id).ok_or_else(|| {
            DriverError::config(format!("{id:?} is not a node of this local pool ({}-<slot>-<nonce>)", self.s.prefix))
        })
    }

    fn held(&self, slot: u32) -> Option<Hold> {
        self.held.lock().unwrap_or_else(|e| e.into_inner()).get(&slot).copied()
    }

    /// Holds `slot` for a delete once no other operation holds it (a delete
    /// of a node being made takes down what the create made).
    fn hold_for_delete(this: &Arc<Inner>, slot: u32) -> SlotGuard {
        let mut held = this.held.lock().unwrap_or_else(|e| e.into_inner());
        while held.contains_key(&slot) {
            held = this.released.wait(held).unwrap_or_else(|e| e.into_inner());
        }
        held.insert(slot, Hold::Delete);
        SlotGuard { inner: this.clone(), slot }
    }

    /// Holds the smallest slot whose namespace and host interface do not
    /// exist and that no operation holds: `Quota` when `max_nodes` of the
    /// pool's namespaces exist (or are being made) or no /30 is free.
    fn hold_for_create(this: &Arc<Inner>) -> Result<SlotGuard, DriverError> {
        let mut held = this.held.lock().unwrap_or_else(|e| e.into_inner());
        let existing: BTreeSet<u32> = this.names()?.iter().filter_map(|n| this.slot_of(n)).collect();
        let making = held.iter().filter(|(s, h)| **h == Hold::Create && !existing.contains(s)).count();
        if let Some(max) = this.s.max_nodes
            && existing.len() + making >= max as usize
        {
            return Err(DriverError::new(ErrorClass::Quota, format!("{max} nodes exist (max_nodes)")));
        }
        let free = (0..this.net.slots()).find(|s| {
            !existing.contains(s)
                && !held.contains_key(s)
                && !Path::new("/sys/class/net").join(this.if_name(*s, 'h')).exists()
        });
        let slot = free.ok_or_else(|| {
            DriverError::new(ErrorClass::Quota, format!("no free /30 in the network {}", this.s.network))
        })?;
        held.insert(slot, Hold::Create);
        Ok(SlotGuard { inner: this.clone(), slot })
    }

    /// The names in `/run/netns` (none when it does not exist yet).
    fn names(&self) -> Result<Vec<String>, DriverError> {
        let entries = match fs::read_dir(NETNS_DIR) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(DriverError::transient(format!("cannot read {NETNS_DIR}: {e}"))),
        };
        let mut names = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| DriverError::transient(format!("cannot read {NETNS_DIR}: {e}")))?;
            names.extend(entry.file_name().to_str().map(str::to_string));
        }
        Ok(names)
    }

    fn create(this: &Arc<Inner>, spec: &LaunchSpec) -> Result<String, DriverError> {
        let guard = Inner::hold_for_create(this)?;
        let mut nonce = [0u8; 4];
        getrandom::fill(&mut nonce).map_err(|e| DriverError::transient(format!("no randomness: {e}")))?;
        let ns = this.ns_name(guard.slot, &hex::encode(nonce));
        let master = spec.master_addr.ip();
        if !master.is_unspecified() && master != this.net.ends(guard.slot).0 {
            return Err(DriverError::config(format!(
                "the master's agent listener is on {}, which the node's namespace cannot reach: the local \
                 driver needs it on every interface (agent_addr = \"0.0.0.0:{}\")",
                spec.master_addr,
                spec.master_addr.port()
            )));
        }
        if let Err(e) = this.make(guard.slot, &ns, spec) {
            return Err(match this.teardown(&ns, Duration::ZERO) {
                Ok(()) => e,
                Err(u) => DriverError::new(e.class, format!("{}; unwinding it failed: {}", e.message, u.message)),
            });
        }
        Ok(ns)
    }

    /// Everything of a node, in the order a crash leaves tagged: its tag
    /// file, the namespace, the pair, the agent.
    fn make(&self, slot: u32, ns: &str, spec: &LaunchSpec) -> Result<(), DriverError> {
        let (host_ip, ns_ip) = self.net.ends(slot);
        let dir = self.node_dir(ns);
        // What an earlier try left for this slot (its namespace is gone):
        // nothing of it is reused.
        remove_dir(&dir)?;
        // Searchable by others (not readable): the agent's instances run as
        // users of their own and must reach their directories under it.
        searchable_dir(&dir).map_err(|e| fs_error("create", &dir, e))?;
        let tags = serde_json::to_vec(&spec.tags).map_err(|e| DriverError::transient(format!("tags: {e}")))?;
        let tag_file = dir.join("tags.json");
        crate::private_file::write_private(&tag_file, &tags).map_err(|e| fs_error("write", &tag_file, e))?;
        let (host_if, ns_if) = (self.if_name(slot, 'h'), self.if_name(slot, 'n'));
        ip(&["netns", "add", ns])?;
        ip(&["link", "add", &host_if, "type", "veth", "peer", "name", &ns_if, "netns", ns])?;
        ip(&["addr", "add", &format!("{host_ip}/30"), "dev", &host_if])?;
        ip(&["link", "set", &host_if, "up"])?;
        ip(&["-n", ns, "addr", "add", &format!("{ns_ip}/30"), "dev", &ns_if])?;
        ip(&["-n", ns, "link", "set", &ns_if, "up"])?;
        ip(&["-n", ns, "link", "set", "lo", "up"])?;
        self.start_agent(slot, ns, &dir, spec)
    }

    /// Starts the agent in the namespace by `nsenter --net`, which switches
    /// only the network namespace (`ip netns exec` also mounts a sysfs of
    /// its own, hiding the cgroup tree the agent runs instances in), in a
    /// process group of its own (a Ctrl-C at the master's terminal does not
    /// reach it), reaped by a thread of its own while the master lives.
    fn start_agent(&self, slot: u32, ns: &str, dir: &Path, spec: &LaunchSpec) -> Result<(), DriverError> {
        let (host_ip, ns_ip) = self.net.ends(slot);
        let log_path = dir.join("agent.log");
        let log = fs::OpenOptions::new().create(true).append(true).open(&log_path);
        let log = log.map_err(|e| fs_error("open", &log_path, e))?;
        let log2 = log.try_clone().map_err(|e| fs_error("open", &log_path, e))?;
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net={NETNS_DIR}/{ns}")).arg(&self.s.agent_binary).arg("agent");
        let master = format!("{host_ip}:{}", spec.master_addr.port());
        cmd.args(["--node-id", spec.node.as_str(), "--master", &master, "--address", &ns_ip.to_string()]);
        cmd.arg("--data-dir").arg(dir.join("agent"));
        cmd.args(["--port-range", &self.s.port_range, "--stop-instances-on-exit"]);
        for (k, v) in &spec.labels {
            cmd.arg("--label").arg(format!("{k}={v}"));
        }
        // The token in the environment: `ps` shows command lines to all.
        cmd.env("FLOTILLA_AGENT_JOIN_TOKEN", &spec.join_token).stdin(Stdio::null()).stdout(log).stderr(log2);
        cmd.process_group(0);

        // The reaper first: a child is never spawned that nothing waits for.
        let (child_tx, child_rx) = mpsc::channel::<Child>();
        let (exit_tx, exit_rx) = mpsc::channel::<io::Result<ExitStatus>>();
        std::thread::Builder::new()
            .name(format!("reap-{ns}"))
            .stack_size(64 * 1024)
            .spawn(move || {
                if let Ok(mut child) = child_rx.recv() {
                    let _ = exit_tx.send(child.wait());
                }
            })
            .map_err(|e| DriverError::transient(format!("cannot start the agent's reaper thread: {e}")))?;
        let child = cmd.spawn().map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => {
                DriverError::config(format!("cannot run nsenter (util-linux, installed by scripts/setup.sh): {e}"))
            }
            _ => DriverError::transient(format!("cannot start the agent: {e}")),
        })?;
        let pid = child.id();
        if let Err(mpsc::SendError(mut child)) = child_tx.send(child) {
            let _ = child.kill();
            let _ = child.wait();
            return Err(DriverError::transient("the agent's reaper thread is gone"));
        }
        let pid_file = dir.join("agent.pid");
        fs::write(&pid_file, format!("{pid}\n")).map_err(|e| fs_error("write", &pid_file, e))?;
        match exit_rx.recv_timeout(ALIVE_AFTER) {
            Err(mpsc::RecvTimeoutError::Timeout) => Ok(()),
            Ok(status) => Err(DriverError::config(format!(
                "the agent exited at once ({}); the end of {}:\n{}",
                status.map_or_else(|e| e.to_string(), |s| s.to_string()),
                log_path.display(),
                log_tail(&log_path)
            ))),
            Err(mpsc::RecvTimeoutError::Disconnected) => Err(DriverError::transient("the agent's reaper thread died")),
        }
    }

    /// Takes down everything of `slot` that exists: its processes (SIGTERM,
    /// `grace` to exit, then SIGKILL), the namespace, the host end of the
    /// pair (gone with its peer, unless that never reached the namespace),
    /// the node's directory last, so a namespace never loses its tags.
    ///
    /// The host end of the pair goes with the namespace (the kernel
    /// deletes a veth pair with either end); it is deleted by name only
    /// when this call took the namespace down, never for a namespace that
    /// was already gone (its slot, and so its interface name, may belong to
    /// a newer node).
    fn teardown(&self, ns: &str, grace: Duration) -> Result<(), DriverError> {
        let slot = self.slot_of(ns).ok_or_else(|| DriverError::config(format!("{ns:?} is not a node of this pool")))?;
        if let Some(inode) = ns_inode(ns)? {
            stop_processes(inode, grace)?;
            if let Err(e) = ip(&["netns", "del", ns]) {
                // Taken down meanwhile by someone else is a success too.
                if ns_inode(ns)?.is_some() {
                    return Err(e);
                }
            }
            let host_if = self.if_name(slot, 'h');
            let exists = |i: &str| Path::new("/sys/class/net").join(i).exists();
            if exists(&host_if)
                && let Err(e) = ip(&["link", "del", &host_if])
                && exists(&host_if)
            {
                return Err(e);
            }
        }
        remove_dir(&self.node_dir(ns))
    }

    fn list(&self) -> Result<Vec<Resource>, DriverError> {
        let mut found = Vec::new();
        for name in self.names()? {
            let Some(slot) = self.slot_of(&name) else { continue };
            let Some(inode) = ns_inode(&name)? else { continue };
            let tag_file = self.node_dir(&name).join("tags.json");
            let tags = match fs::read(&tag_file) {
                Ok(bytes) => serde_json::from_slice::<BTreeMap<String, String>>(&bytes)
                    .map_err(|e| DriverError::transient(format!("cannot parse {}: {e}", tag_file.display())))?,
                // A delete removes the directory after the namespace: a
                // namespace gone meanwhile is not listed at all.
                Err(e) if e.kind() == io::ErrorKind::NotFound => match ns_inode(&name)? {
                    Some(_) => BTreeMap::new(),
                    None => continue,
                },
                Err(e) => return Err(fs_error("read", &tag_file, e)),
            };
            found.push((slot, inode, name, tags));
        }
        let with_agent = self.agents_in(&found.iter().map(|f| (f.1, f.2.clone())).collect::<Vec<_>>())?;
        Ok(found
            .into_iter()
            .map(|(slot, inode, external_id, tags)| {
                let state = if self.held(slot) == Some(Hold::Create) {
                    ResourceState::Pending
                } else if with_agent.contains(&inode) {
                    ResourceState::Running
                } else {
                    ResourceState::Stopping
                };
                Resource { external_id, tags, state }
            })
            .collect())
    }

    /// Which of `namespaces` hold their node's agent: a process in the
    /// namespace whose command line is `… agent … --data-dir {dir}/agent`.
    fn agents_in(&self, namespaces: &[(NsInode, String)]) -> Result<BTreeSet<NsInode>, DriverError> {
        let wanted: HashMap<NsInode, PathBuf> =
            namespaces.iter().map(|(i, ns)| (*i, self.node_dir(ns).join("agent"))).collect();
        let mut found = BTreeSet::new();
        for (pid, inode) in processes()? {
            let Some(data_dir) = wanted.get(&inode) else { continue };
            let Ok(cmdline) = fs::read(format!("/proc/{pid}/cmdline")) else { continue };
            let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
            let data_dir = data_dir.as_os_str().as_encoded_bytes();
            if args.get(1) == Some(&&b"agent"[..]) && args.windows(2).any(|w| w[0] == b"--data-dir" && w[1] == data_dir)
            {
                found.insert(inode);
            }
        }
        Ok(found)
    }
}

/// Runs `ip args`: a failure is transient, except a missing `ip` or a
/// missing privilege, which no retry mends.
fn ip(args: &[&str]) -> Result<(), DriverError> {
    let out = Command::new("ip").args(args).stdin(Stdio::null()).output().map_err(|e| match e.kind() {
        io::ErrorKind::NotFound => {
            DriverError::config(format!("cannot run `ip` (iproute2, installed by scripts/setup.sh): {e}"))
        }
        _ => DriverError::transient(format!("cannot run `ip {}`: {e}", args.join(" "))),
    })?;
    if out.status.success() {
        return Ok(());
    }
    let err = String::from_utf8_lossy(&out.stderr);
    let class = if err.contains("Operation not permitted") { ErrorClass::Config } else { ErrorClass::Transient };
    let hint = if class == ErrorClass::Config { " (the local driver needs root)" } else { "" };
    Err(DriverError::new(class, format!("`ip {}` failed{hint}: {}", args.join(" "), err.trim())))
}

/// Removes `dir` with everything in it (symlinks themselves, never what
/// they point to); a missing one is fine.
fn remove_dir(dir: &Path) -> Result<(), DriverError> {
    match fs::remove_dir_all(dir) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(fs_error("remove", dir, e)),
        _ => Ok(()),
    }
}

/// `dir` and its parents up to the driver's data dir made, each mode 0711.
fn searchable_dir(dir: &Path) -> io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    fs::DirBuilder::new().recursive(true).mode(0o711).create(dir)?;
    for d in [Some(dir), dir.parent()].into_iter().flatten() {
        fs::set_permissions(d, fs::Permissions::from_mode(0o711))?;
    }
    Ok(())
}

/// The last lines of a log, for an error message.
fn log_tail(path: &Path) -> String {
    let mut text = Vec::new();
    if let Ok(mut f) = fs::File::open(path) {
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        let _ = f.seek(SeekFrom::Start(len.saturating_sub(4096)));
        let _ = f.take(4096).read_to_end(&mut text);
    }
    let text = String::from_utf8_lossy(&text);
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(10)..].join("\n")
}

#[cfg(test)]
#[path = "local_tests.rs"]
mod tests;
