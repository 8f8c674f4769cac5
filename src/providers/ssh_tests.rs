//! The `static` driver for real: each "host" is Debian's sshd running in a
//! network namespace the test makes (joined to this one by a veth pair),
//! in a mount namespace of its own where the test's per-host directory is
//! bind-mounted over the pool's remote base (an empty directory of root's
//! under /var/lib: the driver refuses /tmp), so every host has a
//! `remote_dir` of its own although they share this machine's files. The
//! agents are the real debug `flotilla`, never under systemd (the tests
//! turn `use_systemd` off: they write no real unit); no master runs (they
//! keep trying to enroll). Root, iproute2, util-linux and OpenSSH (client
//! and server, installed by scripts/setup.sh) are needed: a missing one
//! fails the test.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

use super::*;
use crate::providers::driver::TAG_NODE;

const BUILT: &str = "/root/.cache/flotilla-target/x86_64-unknown-linux-gnu/debug/flotilla";
const SSHD: &str = "/usr/sbin/sshd";

static NEXT: AtomicU32 = AtomicU32::new(0);
static LABS: AtomicU32 = AtomicU32::new(0);

fn agent_binary() -> PathBuf {
    let p = PathBuf::from(BUILT);
    assert!(p.is_file(), "these tests run a real agent: no flotilla binary at {BUILT}; run `cargo build` first");
    p
}

/// Runs `cmd`; panics with its stderr unless it succeeds.
fn run(cmd: &mut Command) -> String {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?} (installed by scripts/setup.sh; these tests need root): {e}"));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{cmd:?} failed (these tests need root and network namespaces): {err}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn ip(args: &[&str]) {
    run(Command::new("ip").args(args));
}

/// An ed25519 key pair at `path`: its public line, `<type> <base64>`.
fn keygen(path: &Path) -> String {
    run(Command::new("ssh-keygen").args(["-q", "-t", "ed25519", "-N", "", "-C", "flotilla-test", "-f"]).arg(path));
    let public = fs::read_to_string(path.with_extension("pub")).expect("the public key");
    public.split_whitespace().take(2).collect::<Vec<_>>().join(" ")
}

fn net_of(pid: &str) -> Option<(u64, u64)> {
    fs::metadata(format!("/proc/{pid}/ns/net")).ok().map(|m| (m.dev(), m.ino()))
}

fn cmdline(pid: i32) -> Vec<String> {
    let raw = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    raw.split(|b| *b == 0).filter(|a| !a.is_empty()).map(|a| String::from_utf8_lossy(a).into_owned()).collect()
}

fn has_pair(args: &[String], flag: &str, value: &str) -> bool {
    args.windows(2).any(|w| w[0] == flag && w[1] == value)
}

/// One host: a namespace with sshd listening on `ns_ip:port`.
struct Host {
    ns: String,
    host_if: String,
    peer_if: String,
    host_ip: String,
    ns_ip: String,
    port: u16,
    /// What this host sees as the pool's remote base.
    root: PathBuf,
    host_key: String,
    sshd: Option<Child>,
}

impl Host {
    /// sshd on `port`, the remote base mounted with `options` on top of
    /// `bind` (e.g. `noexec`) unless empty.
    fn start(lab_dir: &Path, base: &Path, authorized: &Path, port: u16, options: &str) -> Host {
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        let pid = std::process::id();
        let tag = format!("{}{n}", pid % 100_000);
        let net = format!("172.29.{}.{}", pid % 250, 4 * (n % 64));
        let last = |k: u32| format!("{}.{}", net.rsplit_once('.').unwrap().0, 4 * (n % 64) + k);
        let dir = lab_dir.join(format!("host{n}"));
        fs::create_dir_all(dir.join("root")).unwrap();
        fs::set_permissions(dir.join("root"), fs::Permissions::from_mode(0o755)).unwrap();
        let mut host = Host {
            ns: format!("fss-{tag}"),
            host_if: format!("fsh{tag}"),
            peer_if: format!("fsn{tag}"),
            host_ip: last(1),
            ns_ip: last(2),
            port,
            root: dir.join("root"),
            host_key: keygen(&dir.join("host_key")),
            sshd: None,
        };
        ip(&["netns", "add", &host.ns]);
        ip(&["link", "add", &host.host_if, "type", "veth", "peer", "name", &host.peer_if]);
        ip(&["link", "set", &host.peer_if, "netns", &host.ns]);
        ip(&["addr", "add", &format!("{}/30", host.host_ip), "dev", &host.host_if]);
        ip(&["link", "set", &host.host_if, "up"]);
        ip(&["-n", &host.ns, "addr", "add", &format!("{}/30", host.ns_ip), "dev", &host.peer_if]);
        ip(&["-n", &host.ns, "link", "set", &host.peer_if, "up"]);
        ip(&["-n", &host.ns, "link", "set", "lo", "up"]);
        let config = dir.join("sshd_config");
        let text = format!(
            "Port {}\nListenAddress {}\nHostKey {}\nPermitRootLogin prohibit-password\nAuthorizedKeysFile {}\n\
             PidFile {}\nUsePAM no\nStrictModes no\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n\
             Subsystem sftp internal-sftp\nPrintMotd no\nMaxStartups 100\nLogLevel VERBOSE\n",
            host.port,
            host.ns_ip,
            dir.join("host_key").display(),
            authorized.display(),
            dir.join("sshd.pid").display()
        );
        fs::write(&config, text).unwrap();
        fs::create_dir_all("/run/sshd").unwrap();
        let log = fs::File::create(dir.join("sshd.log")).unwrap();
        // In the namespace, in a mount namespace of its own where this
        // host's directory is the pool's remote base.
        let child = Command::new("nsenter")
            .arg(format!("--net=/run/netns/{}", host.ns))
            .args(["unshare", "--mount", "--propagation", "private", "sh", "-c"])
            .arg(format!(
                "mount --bind \"$0\" \"$1\" && {{ [ -z \"$3\" ] || mount -o \"remount,bind,$3\" \"$1\"; }} && \
                 exec {SSHD} -D -e -f \"$2\""
            ))
            .args([&host.root, base, &config, Path::new(options)])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("nsenter (util-linux, installed by scripts/setup.sh)");
        host.sshd = Some(child);
        let addr: SocketAddr = format!("{}:{}", host.ns_ip, host.port).parse().unwrap();
        let t = Instant::now();
        while std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
            let exited = host.sshd.as_mut().unwrap().try_wait().unwrap();
            if exited.is_some() || t.elapsed() > Duration::from_secs(10) {
                let said = fs::read_to_string(dir.join("sshd.log")).unwrap_or_default();
                panic!("sshd did not listen on {addr} ({exited:?}): {said}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        host
    }

    fn name(&self) -> String {
        format!("{}:{}", self.ns_ip, self.port)
    }

    fn inode(&self) -> (u64, u64) {
        let m = fs::metadata(format!("/run/netns/{}", self.ns)).expect("the namespace");
        (m.dev(), m.ino())
    }

    /// The node's directory on this host, as this machine sees it.
    fn node_dir(&self) -> PathBuf {
        self.root.join("flotilla-node")
    }

    /// Every process in the namespace.
    fn pids(&self) -> Vec<i32> {
        let ns = self.inode();
        let entries = fs::read_dir("/proc").unwrap().flatten();
        let pids = entries.filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()));
        pids.filter(|p| net_of(&p.to_string()) == Some(ns)).collect()
    }

    /// The agent of `node` in this namespace.
    fn agent(&self, node: &str) -> Option<i32> {
        self.pids().into_iter().find(|p| {
            let args = cmdline(*p);
            args.get(1).map(String::as_str) == Some("agent") && has_pair(&args, "--node-id", node)
        })
    }

    /// sshd gone and every packet to the host lost: the address leaves the
    /// namespace, and a permanent neighbour entry keeps this side sending.
    fn vanish(&mut self) {
        if let Some(mut c) = self.sshd.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let link = run(Command::new("ip").args(["-n", &self.ns, "-o", "link", "show", &self.peer_if]));
        let mac =
            link.split_whitespace().skip_while(|w| *w != "link/ether").nth(1).expect("the peer's MAC").to_string();
        ip(&["-n", &self.ns, "addr", "del", &format!("{}/30", self.ns_ip), "dev", &self.peer_if]);
        ip(&["neigh", "replace", &self.ns_ip, "lladdr", &mac, "dev", &self.host_if, "nud", "permanent"]);
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        if let Some(mut c) = self.sshd.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if fs::metadata(format!("/run/netns/{}", self.ns)).is_ok() {
            for _ in 0..50 {
                let left = self.pids();
                if left.is_empty() {
                    break;
                }
                left.iter().for_each(|p| {
                    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(*p), nix::sys::signal::Signal::SIGKILL);
                });
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        let _ = Command::new("ip").args(["link", "del", &self.host_if]).output();
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).output();
    }
}

/// A test's hosts, its client key and its pool's directory; everything
/// taken down when dropped (the hosts first).
struct Lab {
    hosts: Vec<Host>,
    nodes: Mutex<Vec<String>>,
    dir: tempfile::TempDir,
    /// The pool's remote base, as the hosts see it.
    base: PathBuf,
    client_key: PathBuf,
}

impl Lab {
    fn new(count: usize) -> Lab {
        Lab::with(&vec![(2222, ""); count])
    }

    /// A host per `(sshd's port, mount options of its remote base)`.
    fn with(hosts: &[(u16, &str)]) -> Lab {
        for (tool, hint) in [(SSHD, "openssh-server"), ("/usr/bin/ssh-keygen", "openssh-client")] {
            assert!(Path::new(tool).is_file(), "{tool} is missing: install {hint} (scripts/setup.sh does)");
        }
        agent_binary();
        let dir = tempfile::Builder::new().prefix("flotilla-ssh-").tempdir().unwrap();
        let client_key = dir.path().join("client_key");
        let public = keygen(&client_key);
        let authorized = dir.path().join("authorized_keys");
        fs::write(&authorized, format!("{public}\n")).unwrap();
        let n = LABS.fetch_add(1, Ordering::SeqCst);
        let base = PathBuf::from(format!("/var/lib/flotilla-ssh-test-{}-{n}", std::process::id()));
        fs::create_dir_all(&base).unwrap();
        fs::set_permissions(&base, fs::Permissions::from_mode(0o755)).unwrap();
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
        let hosts = hosts.iter().map(|(port, o)| Host::start(dir.path(), &base, &authorized, *port, o)).collect();
        Lab { hosts, nodes: Mutex::new(Vec::new()), dir, base, client_key }
    }

    fn remote_dir(&self) -> PathBuf {
        self.base.join("flotilla-node")
    }

    fn settings(&self, hosts: &[&Host]) -> serde_json::Value {
        let list: Vec<serde_json::Value> = hosts
            .iter()
            .enumerate()
            .map(|(k, h)| {
                serde_json::json!({
                    "address": h.ns_ip, "port": h.port, "user": "root", "key": self.client_key,
                    "host_key": h.host_key, "labels": {"rack": format!("r{k}")},
                })
            })
            .collect();
        serde_json::json!({
            "hosts": list,
            "agent_binary": BUILT,
            "remote_dir": self.remote_dir(),
            "port_range": "21000-21999",
            "connect_timeout": "3s",
        })
    }

    fn driver(&self, settings: serde_json::Value) -> StaticDriver {
        let labels = BTreeMap::from([("zone".to_string(), "a".to_string())]);
        let mut s =
            StaticSettings::from_value(settings, &labels, self.dir.path().join("master-pools/p")).expect("settings");
        s.use_systemd = false;
        StaticDriver::new(s).expect("driver")
    }

    fn log(&self, host: &Host) -> String {
        fs::read_to_string(self.dir.path().join(format!("master-pools/p/{}_{}.log", host.ns_ip, host.port)))
            .unwrap_or_default()
    }

    fn spec(&self, n: &str) -> LaunchSpec {
        let node = format!("s{}-{n}", std::process::id() % 100_000);
        self.nodes.lock().unwrap().push(node.clone());
        LaunchSpec::for_test(&node, "0.0.0.0:7700")
    }

    /// The host an id names.
    fn host_of(&self, id: &str) -> &Host {
        self.hosts.iter().find(|h| id.starts_with(&format!("{}/", h.name()))).unwrap_or_else(|| panic!("{id}"))
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        self.hosts.clear();
        let _ = fs::remove_dir(&self.base);
        // The agents' cgroup scopes (named by their node ids), if empty.
        for node in self.nodes.lock().unwrap().iter() {
            for root in ["/sys/fs/cgroup/unified/flotilla", "/sys/fs/cgroup/flotilla"] {
                let _ = fs::remove_dir(Path::new(root).join(node));
            }
        }
    }
}

/// A wrong host key, an unsafe remote_dir (a symlink; a parent not
/// root's) and a failed bootstrap (a noexec remote_dir: the agent cannot
/// start) each skip their host, leave nothing there and mark no pool broken.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn failing_hosts_are_skipped_for_the_next_and_are_no_config_error() {
    let lab = Lab::with(&[(2222, ""), (2222, ""), (2222, ""), (2222, "noexec"), (2222, "")]);
    let [wrong_key, linked, not_roots, noexec, good] = [0, 1, 2, 3, 4].map(|k| &lab.hosts[k]);
    let mut settings = lab.settings(&lab.hosts.iter().collect::<Vec<_>>());
    settings["hosts"][0]["host_key"] = keygen(&lab.dir.path().join("other_key")).into();
    fs::create_dir(linked.root.join("elsewhere")).unwrap();
    std::os::unix::fs::symlink(linked.root.join("elsewhere"), linked.node_dir()).unwrap();
    std::os::unix::fs::chown(&not_roots.root, Some(1000), None).unwrap();
    let driver = lab.driver(settings);
    let spec = lab.spec("a");
    let id = driver.create(&spec).await.expect("the one good host");
    assert_eq!(lab.host_of(&id).name(), good.name(), "{id}");
    for (h, dir) in
        [(wrong_key, &wrong_key.root), (linked, &linked.root.join("elsewhere")), (not_roots, &not_roots.root)]
    {
        assert_eq!(fs::read_dir(dir).unwrap().count(), 0, "nothing is made on {}", h.name());
    }
    assert_eq!(fs::read_dir(&noexec.root).unwrap().count(), 0, "the failed bootstrap is unwound");
    assert!(lab.log(wrong_key).contains("Host key verification failed"), "{}", lab.log(wrong_key));
    let log = lab.log(noexec);
    assert!(log.contains("bootstrap failed, unwinding") && log.contains("skipped: "), "{log}");
    assert!(lab.hosts[..4].iter().all(|h| h.agent(spec.node.as_str()).is_none()));

    let err = driver.create(&lab.spec("b")).await.expect_err("no host left");
    assert_eq!(err.class, ErrorClass::Transient, "one host's fault breaks no pool: {err}");
    for (h, why) in [
        (wrong_key, "host key"),
        (linked, "is a symbolic link"),
        (not_roots, "owned by uid 1000"),
        (noexec, "does not run a second after its start"),
    ] {
        let part = err.message.split("; ").find(|p| p.contains(&h.name())).unwrap_or_else(|| panic!("{err}"));
        assert!(part.contains(why), "{}: {why:?} in {err}", h.name());
    }
    assert!(err.message.contains("(1 of 5 in use)") && !err.message.contains(&good.name()), "{err}");
    let err = driver.list().await.expect_err("the host of the wrong key cannot be listed");
    assert!(err.class != ErrorClass::Config && err.message.contains(&wrong_key.name()), "{err}");
    driver.delete(&id).await.expect("delete");
    assert!(!good.node_dir().exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn create_runs_the_agent_on_its_host_and_delete_gives_the_host_back() {
    let lab = Lab::new(1);
    let host = &lab.hosts[0];
    let driver = lab.driver(lab.settings(&[host]));
    assert_eq!(driver.quota().await.unwrap(), DriverQuota { max_nodes: Some(1) });
    let spec = lab.spec("a");
    let id = driver.create(&spec).await.expect("create");
    assert!(id.starts_with(&format!("{}/", host.name())) && id.len() == host.name().len() + 9, "{id}");

    let pid = host.agent(spec.node.as_str()).expect("the agent runs in the host's namespace");
    let args = cmdline(pid);
    let remote = lab.remote_dir();
    assert_eq!(args[0], remote.join("bin/flotilla").display().to_string(), "{args:?}");
    assert!(
        has_pair(&args, "--master", &format!("{}:7700", host.host_ip)),
        "the master as the host reaches it: {args:?}"
    );
    assert!(has_pair(&args, "--address", &host.ns_ip), "{args:?}");
    assert!(has_pair(&args, "--data-dir", &remote.join("agent").display().to_string()), "{args:?}");
    assert!(has_pair(&args, "--port-range", "21000-21999"), "{args:?}");
    assert!(has_pair(&args, "--label", "zone=a") && has_pair(&args, "--label", "rack=r0"), "{args:?}");
    assert!(!args.iter().any(|a| a.contains(&spec.join_token)), "the token on the command line: {args:?}");
    let environ = fs::read(format!("/proc/{pid}/environ")).unwrap();
    let wanted = format!("FLOTILLA_AGENT_JOIN_TOKEN={}", spec.join_token);
    assert!(environ.split(|b| *b == 0).any(|v| v == wanted.as_bytes()), "the token is in the agent's environment");
    let env_file = host.node_dir().join("agent.env");
    assert_eq!(fs::metadata(&env_file).unwrap().permissions().mode() & 0o777, 0o600, "the token file is private");
    assert_eq!(fs::read_to_string(&env_file).unwrap(), format!("{wanted}\n"));
    assert_eq!(driver.status(&id).await.unwrap(), ResourceState::Running);

    let listed = driver.list().await.unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    let (r, mut tags) = (&listed[0], spec.tags.clone());
    assert_eq!((r.external_id.as_str(), r.state), (id.as_str(), ResourceState::Running));
    let cores: u32 = r.tag("cores").expect("cores").parse().unwrap();
    let memory: u64 = r.tag("memory_bytes").expect("memory_bytes").parse().unwrap();
    assert!(cores >= 1 && memory > 64 << 20, "{r:?}");
    tags.extend([("cores".to_string(), cores.to_string()), ("memory_bytes".to_string(), memory.to_string())]);
    assert_eq!(r.tags, tags);

    let err = driver.create(&lab.spec("b")).await.expect_err("the one host is in use");
    assert_eq!(err.class, ErrorClass::Quota, "{err}");
    assert!(err.message.contains("every host of the pool is in use"), "{err}");

    driver.delete(&id).await.expect("delete");
    assert!(!Path::new(&format!("/proc/{pid}")).exists(), "the agent {pid} remains: {:?}", cmdline(pid));
    assert_eq!(host.agent(spec.node.as_str()), None);
    assert!(!host.node_dir().exists(), "the remote dir is gone");
    assert_eq!(driver.status(&id).await.unwrap(), ResourceState::Gone);
    assert_eq!(driver.list().await.unwrap(), vec![]);
    driver.delete(&id).await.expect("a second delete is a success");
    let err = driver.delete("10.9.9.9:22/00000000").await.expect_err("not a host of the pool");
    assert_eq!(err.class, ErrorClass::Config, "{err}");

    let log = lab.log(host);
    assert!(log.contains("bootstrap done") && log.contains("[delete]"), "{log}");
    assert!(!log.contains(&spec.join_token), "the token is never logged");
    // The same through the driver (`GET /pools/{name}/hosts/{host}/log`):
    // whole, or its last bytes from a line's start.
    let whole = driver.host_log(&host.name(), 1 << 20).expect("a static pool keeps a log").unwrap();
    assert_eq!(whole, log);
    let tail = driver.host_log(&host.name(), 200).unwrap().unwrap();
    assert!(tail.len() <= 200 && log.ends_with(&tail) && !tail.is_empty(), "{tail:?}");
    assert!(log[..log.len() - tail.len()].ends_with('\n'), "the tail starts a line: {tail:?}");
    let unknown = driver.host_log("10.9.9.9:22", 100).unwrap().unwrap_err();
    assert_eq!(unknown.class, ErrorClass::Config, "{unknown}");

    // The host is the pool's again; a stale delete of the old id leaves
    // the new node alone.
    let again = driver.create(&lab.spec("c")).await.expect("the host is free again");
    assert_ne!(again, id);
    driver.delete(&id).await.expect("a stale delete is a success");
    assert_eq!(driver.status(&again).await.unwrap(), ResourceState::Running);
    driver.delete(&again).await.expect("delete");
    assert!(!host.node_dir().exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_host_with_a_foreign_tag_file_is_skipped_and_one_with_a_foreign_agent_refused() {
    let lab = Lab::new(2);
    let (tagged, busy) = (&lab.hosts[0], &lab.hosts[1]);
    let foreign_tags = r#"{"flotilla-master":"ffffffffffffffff","flotilla-node":"theirs","flotilla-pool":"q"}"#;
    fs::create_dir_all(tagged.node_dir()).unwrap();
    fs::write(tagged.node_dir().join("tags.json"), foreign_tags).unwrap();
    fs::write(tagged.node_dir().join("id"), "0badc0de\n").unwrap();
    let theirs = lab.spec("theirs");
    let mut agent = Command::new("nsenter")
        .arg(format!("--net=/run/netns/{}", busy.ns))
        .args([BUILT, "agent", "--node-id", theirs.node.as_str(), "--master", "127.0.0.1:1", "--address", &busy.ns_ip])
        .arg("--data-dir")
        .arg(lab.dir.path().join("foreign"))
        .args(["--port-range", "22000-22010"])
        .env("FLOTILLA_AGENT_JOIN_TOKEN", &theirs.join_token)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let t = Instant::now();
    while busy.agent(theirs.node.as_str()).is_none() {
        assert!(t.elapsed() < Duration::from_secs(10), "the foreign agent did not start");
        std::thread::sleep(Duration::from_millis(50));
    }

    let driver = lab.driver(lab.settings(&[tagged, busy]));
    let err = driver.create(&lab.spec("a")).await.expect_err("no host to take");
    let _ = (agent.kill(), agent.wait());
    assert_eq!(err.class, ErrorClass::Transient, "one host's fault breaks no pool: {err}");
    assert!(err.message.contains(&busy.name()) && err.message.contains("agent runs there"), "{err}");
    assert!(!err.message.contains(&tagged.name()), "the tagged host is in use, not refused: {err}");
    assert_eq!(fs::read_to_string(tagged.node_dir().join("tags.json")).unwrap(), foreign_tags, "left alone");
    assert!(!busy.node_dir().exists(), "nothing made on the refused host");
    let listed = driver.list().await.unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].external_id, format!("{}/0badc0de", tagged.name()));
    assert_eq!((listed[0].tag(TAG_NODE), listed[0].state), (Some("theirs"), ResourceState::Stopping));

    // Its agent gone, the host is free; the tagged one still is not.
    let spec = lab.spec("b");
    let id = driver.create(&spec).await.expect("the freed host");
    assert!(id.starts_with(&format!("{}/", busy.name())), "{id}");
    driver.delete(&id).await.expect("delete");
    assert!(tagged.node_dir().join("tags.json").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_hosts_are_bootstrapped_in_parallel() {
    // One sshd on port 22 (its known_hosts line has no `[address]:port`).
    let lab = Lab::with(&[(22, ""), (2222, ""), (2222, "")]);
    let driver = lab.driver(lab.settings(&lab.hosts.iter().collect::<Vec<_>>()));
    let specs = [lab.spec("a"), lab.spec("b"), lab.spec("c")];
    let t = Instant::now();
    let (a, b, c) = tokio::join!(driver.create(&specs[0]), driver.create(&specs[1]), driver.create(&specs[2]));
    let ids = [a.expect("create a"), b.expect("create b"), c.expect("create c")];
    // Each host's log: when its bootstrap began and ended (ms).
    let at = |h: &Host, what: &str| {
        let log = lab.log(h);
        let line = log.lines().find(|l| l.contains(what)).unwrap_or_else(|| panic!("{what:?} in {log}"));
        humantime::parse_rfc3339(line.split(' ').next().unwrap()).unwrap()
    };
    let spans: Vec<_> = lab.hosts.iter().map(|h| (at(h, "bootstrap of node"), at(h, "bootstrap done"))).collect();
    let took: Vec<_> = spans.iter().map(|(a, b)| b.duration_since(*a).unwrap()).collect();
    eprintln!("three bootstraps at once: {:?}, each {took:?}", t.elapsed());
    let (last_start, first_end) = (spans.iter().map(|s| s.0).max(), spans.iter().map(|s| s.1).min());
    assert!(last_start < first_end, "the three bootstraps ran at once: {spans:?}");
    let mut names: Vec<String> = ids.iter().map(|id| lab.host_of(id).name()).collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), 3, "three distinct hosts: {ids:?}");
    for (id, spec) in ids.iter().zip(&specs) {
        let host = lab.host_of(id);
        assert!(host.agent(spec.node.as_str()).is_some(), "{id}: the agent runs in its host's namespace");
        for other in lab.hosts.iter().filter(|h| h.ns != host.ns) {
            assert_eq!(other.agent(spec.node.as_str()), None);
        }
    }
    let listed = driver.list().await.unwrap();
    assert_eq!(listed.iter().filter(|r| r.state == ResourceState::Running).count(), 3, "{listed:?}");
    let (a, b, c) = tokio::join!(driver.delete(&ids[0]), driver.delete(&ids[1]), driver.delete(&ids[2]));
    a.unwrap();
    b.unwrap();
    c.unwrap();
    assert!(lab.hosts.iter().all(|h| !h.node_dir().exists()));
    assert_eq!(driver.list().await.unwrap(), vec![]);
}

/// A create dropped by its caller (the launcher's launch_timeout) while it
/// copies the binary starts no agent and leaves nothing on the host.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cancelled_create_starts_no_agent_and_unwinds() {
    let lab = Lab::new(1);
    let host = &lab.hosts[0];
    let driver = lab.driver(lab.settings(&[host]));
    let spec = lab.spec("a");
    let copying = async {
        while !lab.log(host).contains("$ scp") {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::select! {
        r = driver.create(&spec) => panic!("the create ended before the copy began: {r:?}"),
        () = copying => {}
    }
    let t = Instant::now();
    while !lab.log(host).contains("[unwind]") || host.node_dir().exists() {
        assert!(t.elapsed() < Duration::from_secs(60), "not unwound: {}", lab.log(host));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let log = lab.log(host);
    assert!(log.contains("the create was cancelled") && !log.contains("[start]"), "{log}");
    assert_eq!(host.agent(spec.node.as_str()), None);
}

async fn timed(driver: &StaticDriver, spec: &LaunchSpec) -> (Result<String, DriverError>, Duration) {
    let t = Instant::now();
    (driver.create(spec).await, t.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dead_host_fails_its_own_create_within_the_connect_timeout_and_stalls_no_other() {
    let mut lab = Lab::new(3);
    lab.hosts[2].vanish();
    let driver = lab.driver(lab.settings(&lab.hosts.iter().collect::<Vec<_>>()));
    let specs = [lab.spec("a"), lab.spec("b"), lab.spec("c")];
    let (a, b, c) = tokio::join!(timed(&driver, &specs[0]), timed(&driver, &specs[1]), timed(&driver, &specs[2]));
    let results = [a, b, c];
    eprintln!("{:?}", results.iter().map(|(r, t)| (r.as_ref().map_err(|e| e.to_string()), t)).collect::<Vec<_>>());
    let dead = lab.hosts[2].name();
    let failed: Vec<_> = results.iter().filter(|(r, _)| r.is_err()).collect();
    assert_eq!(failed.len(), 1, "only the create that met the dead host fails");
    let (err, took) = (failed[0].0.as_ref().unwrap_err(), failed[0].1);
    assert_eq!(err.class, ErrorClass::Transient, "{err}");
    assert!(err.message.contains(&dead), "names the dead host: {err}");
    assert!(took >= Duration::from_millis(2500) && took < Duration::from_secs(3 + 10), "{took:?}");
    for (r, _) in results.iter().filter(|(r, _)| r.is_ok()) {
        assert_ne!(lab.host_of(r.as_ref().unwrap()).name(), dead);
    }
    // A listing costs one connect timeout however many hosts are dead,
    // and is no listing at all.
    let t = Instant::now();
    let err = driver.list().await.expect_err("a host could not be listed");
    assert!(err.message.contains(&dead) && t.elapsed() < Duration::from_secs(3 + 5), "{err} after {:?}", t.elapsed());
    for (r, _) in &results {
        if let Ok(id) = r {
            driver.delete(id).await.expect("delete");
        }
    }
    assert!(lab.hosts.iter().all(|h| !h.node_dir().exists()));
    lab.hosts.clear();
}
