//! The `local` driver for real: namespaces, veth pairs and `flotilla
//! agent` processes on this host (root, iproute2 and util-linux needed).
//! No master runs: the agents keep trying to enroll, which is all the
//! checks of processes need. Each test has a prefix and a /24 of its own,
//! and a guard that takes down whatever carries its prefix.

use std::collections::BTreeMap;
use std::path::PathBuf;

use std::time::Instant;

use nix::unistd::Pid;

use super::*;

const BUILT: &str = "/root/.cache/flotilla-target/x86_64-unknown-linux-gnu/debug/flotilla";

/// The `flotilla` binary the agents run: the shared target dir's, else
/// the one beside this test binary (`target/debug/deps/..`).
fn agent_binary() -> PathBuf {
    let beside = std::env::current_exe().ok().and_then(|e| Some(e.parent()?.parent()?.join("flotilla")));
    let candidates: Vec<PathBuf> = [Some(PathBuf::from(BUILT)), beside].into_iter().flatten().collect();
    match candidates.iter().find(|c| c.is_file()) {
        Some(c) => c.clone(),
        None => panic!("these tests run a real agent: no flotilla binary at {candidates:?}; run `cargo build` first"),
    }
}

/// A well-formed join token (no master checks it here).
/// One test's pool: its driver, and the guard that takes down everything
/// named with its prefix when dropped, whatever the test did.
struct Pool {
    driver: LocalDriver,
    prefix: String,
    /// The first three octets of its network.
    net: String,
}

impl Pool {
    fn new(letter: char, len: u32, max_nodes: Option<u32>, agent_binary: PathBuf) -> Pool {
        let pid = std::process::id();
        let prefix = format!("t{}{letter}", pid % 10000);
        let idx = u32::from(letter) - u32::from('a');
        let net = format!("10.231.{}", (pid % 40) * 6 + idx);
        let settings = LocalSettings {
            prefix: prefix.clone(),
            data_dir: std::env::temp_dir().join(format!("flotilla-local-{prefix}")),
            agent_binary,
            network: format!("{net}.0/{len}"),
            port_range: "20000-29999".into(),
            max_nodes,
        };
        let pool = Pool { driver: LocalDriver::new(settings).expect("settings"), prefix, net };
        pool.clean();
        pool
    }

    fn inner(&self) -> &Inner {
        &self.driver.inner
    }

    fn node(&self, n: &str) -> String {
        format!("{}-node-{n}", self.prefix)
    }

    fn spec(&self, n: &str, master: &str) -> LaunchSpec {
        LaunchSpec::for_test(&self.node(n), master)
    }

    /// The namespaces in /run/netns with this pool's prefix, any suffix.
    fn namespaces(&self) -> Vec<String> {
        let mut names = self.inner().names().unwrap();
        names.retain(|n| n.starts_with(&format!("{}-", self.prefix)));
        names.sort();
        names
    }

    fn clean(&self) {
        let inner = self.inner();
        for ns in self.namespaces() {
            match inner.slot_of(&ns) {
                Some(_) => inner.teardown(&ns, Duration::ZERO).unwrap(),
                None => {
                    let _ = Command::new("ip").args(["netns", "del", &ns]).output();
                }
            }
        }
        let _ = fs::remove_dir_all(&inner.s.data_dir);
        // The agents' cgroup scopes (named by their node ids), if empty.
        for n in ["a", "b"] {
            for root in ["/sys/fs/cgroup/unified/flotilla", "/sys/fs/cgroup/flotilla"] {
                let _ = fs::remove_dir(Path::new(root).join(self.node(n)));
            }
        }
    }

    /// Nothing of this pool is left: no namespace, no host interface of
    /// the first slots, no node directory.
    fn assert_empty(&self, what: &str) {
        assert_eq!(self.namespaces(), Vec::<String>::new(), "{what}: namespaces left");
        for slot in 0..4 {
            let link = self.inner().if_name(slot, 'h');
            assert!(!Path::new("/sys/class/net").join(&link).exists(), "{what}: {link} left");
        }
        let dirs: Vec<_> = fs::read_dir(&self.inner().s.data_dir).map(|d| d.flatten().collect()).unwrap_or_default();
        assert!(dirs.is_empty(), "{what}: node directories left: {dirs:?}");
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.clean();
    }
}

fn cmdline(pid: i32) -> Vec<String> {
    let raw = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    raw.split(|b| *b == 0).filter(|a| !a.is_empty()).map(|a| String::from_utf8_lossy(a).into_owned()).collect()
}

fn has_pair(args: &[String], flag: &str, value: &str) -> bool {
    args.windows(2).any(|w| w[0] == flag && w[1] == value)
}

fn ipv4_of(netns: Option<&str>, dev: &str) -> String {
    let mut cmd = Command::new("ip");
    if let Some(ns) = netns {
        cmd.args(["-n", ns]);
    }
    let out = cmd.args(["-o", "-4", "addr", "show", "dev", dev]).output().expect("ip");
    assert!(out.status.success(), "ip addr show {dev}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn agent_pid(pool: &Pool, id: &str) -> i32 {
    let text = fs::read_to_string(pool.inner().node_dir(id).join("agent.pid")).expect("agent.pid");
    text.trim().parse().expect("a pid in agent.pid")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_runs_an_agent_in_its_namespace_and_delete_takes_all_of_it_down() {
    let pool = Pool::new('a', 24, None, agent_binary());
    let (sa, sb) = (pool.spec("a", "0.0.0.0:7700"), pool.spec("b", "0.0.0.0:7700"));
    // Two at once: each gets a slot of its own.
    let (a, b) = tokio::join!(pool.driver.create(&sa), pool.driver.create(&sb));
    let (a, b) = (a.expect("create a"), b.expect("create b"));
    let mut slots = vec![pool.inner().slot_of(&a).unwrap(), pool.inner().slot_of(&b).unwrap()];
    slots.sort();
    assert_eq!(slots, vec![0, 1]);
    assert!(a.starts_with(&format!("{}-", pool.prefix)) && a.len() == pool.prefix.len() + 11, "{a}");

    let mut addresses = Vec::new();
    for (id, spec) in [(&a, &sa), (&b, &sb)] {
        let slot = pool.inner().slot_of(id).unwrap();
        let (host_ip, ns_ip) = (format!("{}.{}", pool.net, 4 * slot + 1), format!("{}.{}", pool.net, 4 * slot + 2));
        let inode = ns_inode(id).unwrap().expect("the namespace exists in /run/netns");
        assert!(ipv4_of(None, &pool.inner().if_name(slot, 'h')).contains(&format!("{host_ip}/30")), "host end");
        assert!(ipv4_of(Some(id), &pool.inner().if_name(slot, 'n')).contains(&format!("{ns_ip}/30")), "ns end");

        let pid = agent_pid(&pool, id);
        assert_eq!(pids_in(inode).unwrap(), vec![pid], "{id}: the agent is the one process in the namespace");
        let args = cmdline(pid);
        assert_eq!(args.get(1).map(String::as_str), Some("agent"), "{args:?}");
        assert!(has_pair(&args, "--node-id", spec.node.as_str()), "{args:?}");
        assert!(has_pair(&args, "--master", &format!("{host_ip}:7700")), "{args:?}");
        assert!(has_pair(&args, "--address", &ns_ip), "{args:?}");
        assert!(has_pair(&args, "--label", "zone=a"), "{args:?}");
        assert!(args.iter().any(|a| a == "--stop-instances-on-exit"), "{args:?}");
        assert!(!args.iter().any(|a| a.contains(&spec.join_token)), "the token on the command line: {args:?}");
        let environ = fs::read(format!("/proc/{pid}/environ")).unwrap();
        let wanted = format!("FLOTILLA_AGENT_JOIN_TOKEN={}", spec.join_token);
        assert!(environ.split(|b| *b == 0).any(|v| v == wanted.as_bytes()), "the token is in the environment");
        let pgid = nix::unistd::getpgid(Some(Pid::from_raw(pid))).unwrap();
        assert_eq!(pgid.as_raw(), pid, "the agent leads a process group of its own");
        assert_eq!(pool.driver.status(id).await.unwrap(), ResourceState::Running);
        addresses.push(ns_ip);
    }
    assert_ne!(addresses[0], addresses[1]);

    let mut listed = pool.driver.list().await.unwrap();
    listed.sort_by(|x, y| x.external_id.cmp(&y.external_id));
    let want = |id: &str, spec: &LaunchSpec| Resource {
        external_id: id.to_string(),
        tags: spec.tags.clone(),
        state: ResourceState::Running,
    };
    let (first, second) = if a < b { ((&a, &sa), (&b, &sb)) } else { ((&b, &sb), (&a, &sa)) };
    assert_eq!(listed, vec![want(first.0, first.1), want(second.0, second.1)]);

    let (id, slot) = (first.0.clone(), pool.inner().slot_of(first.0).unwrap());
    let pid = agent_pid(&pool, &id);
    pool.driver.delete(&id).await.expect("delete");
    // The agent is gone, reaped too (no zombie stays while we live).
    let t = Instant::now();
    while Path::new(&format!("/proc/{pid}")).exists() && t.elapsed() < Duration::from_secs(2) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!Path::new(&format!("/proc/{pid}")).exists(), "the agent {pid} remains: {:?}", cmdline(pid));
    assert_eq!(ns_inode(&id).unwrap(), None, "the namespace is gone");
    assert!(!Path::new("/sys/class/net").join(pool.inner().if_name(slot, 'h')).exists(), "the host link is gone");
    assert!(!pool.inner().node_dir(&id).exists(), "the node's directory is gone");
    assert_eq!(pool.driver.status(&id).await.unwrap(), ResourceState::Gone);
    assert_eq!(pool.driver.list().await.unwrap(), vec![want(second.0, second.1)]);
    pool.driver.delete(&id).await.expect("a second delete is a success");

    for bad in ["other-0".to_string(), format!("{}-x", pool.prefix), format!("{}-01", pool.prefix)] {
        let err = pool.driver.delete(&bad).await.expect_err(&bad);
        assert_eq!(err.class, ErrorClass::Config, "{bad}: {err}");
    }
    pool.driver.delete(second.0).await.expect("delete the second");
    assert_eq!(pool.driver.list().await.unwrap(), vec![]);
    pool.assert_empty("after both deletes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_without_its_tag_file_lists_with_empty_tags_and_a_bad_tag_file_fails_the_listing() {
    let pool = Pool::new('b', 24, None, agent_binary());
    let id = format!("{}-3-00000000", pool.prefix);
    for ns in [id.as_str(), &format!("{}-x", pool.prefix), &format!("{}-03-00000000", pool.prefix)] {
        assert!(Command::new("ip").args(["netns", "add", ns]).status().unwrap().success(), "ip netns add {ns}");
    }
    let listed = pool.driver.list().await.unwrap();
    let untagged = Resource { external_id: id.clone(), tags: BTreeMap::new(), state: ResourceState::Stopping };
    assert_eq!(listed, vec![untagged], "only {{prefix}}-{{digits}} is ours");
    assert_eq!(pool.driver.status(&id).await.unwrap(), ResourceState::Stopping);

    let dir = pool.inner().node_dir(&id);
    fs::create_dir_all(&dir).unwrap();
    fs::write(dir.join("tags.json"), "{not json").unwrap();
    let err = pool.driver.list().await.expect_err("an unparsable tag file");
    assert!(err.message.contains("tags.json"), "{err}");

    pool.driver.delete(&id).await.expect("delete");
    assert_eq!(ns_inode(&id).unwrap(), None);
    assert!(!dir.exists());
    assert_eq!(pool.driver.list().await.unwrap(), vec![]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_the_namespace_cannot_reach_is_refused_and_leaves_nothing() {
    let pool = Pool::new('c', 24, None, agent_binary());
    let err = pool.driver.create(&pool.spec("a", "127.0.0.1:1")).await.expect_err("a loopback master");
    assert_eq!(err.class, ErrorClass::Config, "{err}");
    assert!(err.message.contains("0.0.0.0"), "says where the listener must be: {err}");
    pool.assert_empty("after the refusal");
    assert!(pool.inner().held.lock().unwrap().is_empty(), "the slot is released");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_exits_at_once_is_a_config_error_and_its_node_is_unwound() {
    let pool = Pool::new('d', 24, None, PathBuf::from("/bin/false"));
    let err = pool.driver.create(&pool.spec("a", "0.0.0.0:7700")).await.expect_err("/bin/false as the agent");
    assert_eq!(err.class, ErrorClass::Config, "{err}");
    assert!(err.message.contains("exited at once"), "{err}");
    pool.assert_empty("after the unwind");
    assert_eq!(pool.driver.list().await.unwrap(), vec![]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_network_or_max_nodes_is_a_quota_refusal() {
    // Every /30 of a /24 but one taken by namespaces made by hand: the
    // create takes that one, the next finds none.
    let full = Pool::new('e', 24, None, agent_binary());
    assert_eq!(full.driver.quota().await.unwrap(), DriverQuota { max_nodes: Some(64) });
    for slot in (0..64).filter(|s| *s != 41) {
        let ns = full.inner().ns_name(slot, "00000000");
        assert!(Command::new("ip").args(["netns", "add", &ns]).status().unwrap().success(), "ip netns add {ns}");
    }
    let id = full.driver.create(&full.spec("a", "0.0.0.0:7700")).await.expect("the one free /30");
    assert_eq!(full.inner().slot_of(&id), Some(41), "{id}");
    let err = full.driver.create(&full.spec("b", "0.0.0.0:7700")).await.expect_err("no /30 left");
    assert_eq!(err.class, ErrorClass::Quota, "{err}");
    assert_eq!(full.namespaces().len(), 64, "the refusal made nothing");

    let capped = Pool::new('f', 24, Some(1), agent_binary());
    assert_eq!(capped.driver.quota().await.unwrap(), DriverQuota { max_nodes: Some(1) });
    capped.driver.create(&capped.spec("a", "0.0.0.0:7700")).await.expect("the first node");
    let err = capped.driver.create(&capped.spec("b", "0.0.0.0:7700")).await.expect_err("over max_nodes");
    assert_eq!(err.class, ErrorClass::Quota, "{err}");
    assert!(err.message.contains("max_nodes"), "{err}");
}

#[test]
fn check_names_the_bad_key() {
    let good = LocalSettings {
        prefix: "flt-local".into(),
        data_dir: "/var/lib/flotilla/local".into(),
        agent_binary: "/bin/sh".into(),
        network: "10.213.0.0/16".into(),
        port_range: "20000-29999".into(),
        max_nodes: None,
    };
    good.check().expect("good settings");
    let with = |f: &dyn Fn(&mut LocalSettings)| {
        let mut s = good.clone();
        f(&mut s);
        s.check().expect_err("bad settings")
    };
    for net in ["8.8.0.0/16", "10.0.0.0/7", "10.1.0.0/25", "10.1.0.1/24", "172.32.0.0/16", "10.1.0.0", "x/8"] {
        let err = with(&|s| s.network = net.into());
        assert!(err.starts_with("network:"), "{net}: {err}");
    }
    for ok in ["192.168.4.0/24", "172.16.0.0/12", "10.0.0.0/8"] {
        let mut s = good.clone();
        s.network = ok.into();
        s.check().unwrap_or_else(|e| panic!("{ok}: {e}"));
    }
    for prefix in ["", "Flt", "a_b", "a.b", &"a".repeat(25)] {
        let err = with(&|s| s.prefix = prefix.into());
        assert!(err.starts_with("prefix:"), "{prefix:?}: {err}");
    }
    for bin in ["/nonexistent/flotilla", "/tmp"] {
        let err = with(&|s| s.agent_binary = bin.into());
        assert!(err.starts_with("agent_binary:"), "{bin}: {err}");
    }
    assert!(with(&|s| s.port_range = "3-1".into()).starts_with("port_range:"));
    assert!(with(&|s| s.max_nodes = Some(0)).starts_with("max_nodes:"));
    let err = LocalDriver::new(LocalSettings { prefix: "BAD".into(), ..good.clone() }).err().expect("refused");
    assert!(err.starts_with("prefix:"), "{err}");
}

#[test]
fn names_fit_the_kernel_and_only_canonical_ids_are_ours() {
    let settings = |prefix: &str, network: &str| LocalSettings {
        prefix: prefix.into(),
        data_dir: "/tmp".into(),
        agent_binary: "/bin/sh".into(),
        network: network.into(),
        port_range: "20000-29999".into(),
        max_nodes: None,
    };
    let d = LocalDriver::new(settings(&"p".repeat(24), "10.0.0.0/8")).unwrap();
    let last = d.inner.net.slots() - 1;
    assert_eq!(last, (1 << 22) - 1);
    for end in ['h', 'n'] {
        let name = d.inner.if_name(last, end);
        assert!(name.len() <= 15 && name.starts_with("fl"), "{name}");
    }
    assert_eq!(d.inner.net.ends(last), ("10.255.255.253".parse().unwrap(), "10.255.255.254".parse().unwrap()));
    let other = LocalDriver::new(settings("q", "10.0.0.0/8")).unwrap();
    assert_ne!(d.inner.if_name(0, 'h'), other.inner.if_name(0, 'h'), "another prefix, other interfaces");

    let d = LocalDriver::new(settings("p", "192.168.0.0/24")).unwrap();
    assert_eq!(d.inner.net.slots(), 64);
    assert_eq!(d.inner.slot_of("p-0-ab12cd34"), Some(0));
    assert_eq!(d.inner.slot_of("p-63-00000000"), Some(63));
    for not_ours in [
        "p-",
        "p-0",
        "p-01-ab12cd34",
        "p-+1-ab12cd34",
        "p-1-AB12CD34",
        "p-1-ab12",
        "p-1-ab12cd3",
        "p-1-ab12cd345",
        "px-1-ab12cd34",
        "q-1-ab12cd34",
        "p-99999999999-ab12cd34",
    ] {
        assert_eq!(d.inner.slot_of(not_ours), None, "{not_ours}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_delete_never_takes_down_the_node_that_took_its_slot_since() {
    let pool = Pool::new('g', 24, None, agent_binary());
    let old = pool.driver.create(&pool.spec("a", "0.0.0.0:7700")).await.expect("create a");
    pool.driver.delete(&old).await.expect("delete a");
    let new = pool.driver.create(&pool.spec("b", "0.0.0.0:7700")).await.expect("create b");
    assert_eq!(pool.inner().slot_of(&new), pool.inner().slot_of(&old), "the slot is taken again");
    assert_ne!(new, old, "under an id of its own");
    let pid = agent_pid(&pool, &new);
    // A retry of the first delete (its answer was lost, say).
    pool.driver.delete(&old).await.expect("a stale delete is a success");
    assert_eq!(pool.driver.status(&new).await.unwrap(), ResourceState::Running);
    assert!(Path::new(&format!("/proc/{pid}")).exists(), "the new node's agent lives");
    let slot = pool.inner().slot_of(&new).unwrap();
    assert!(Path::new("/sys/class/net").join(pool.inner().if_name(slot, 'h')).exists(), "its link stays");
    pool.driver.delete(&new).await.expect("delete b");
    pool.assert_empty("after both deletes");
}
