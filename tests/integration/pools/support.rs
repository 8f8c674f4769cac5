//! What the node pool tests share: a namespace space per test, a pool's
//! config, the API and CLI calls they make.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use serde_json::{Value, json};

use crate::common::TestEnv;

static NEXT: AtomicU32 = AtomicU32::new(0);

/// A prefix and a /24 for one test's namespaces, unique in this run; on
/// drop, every namespace with the prefix is taken down (its processes
/// killed, its link deleted), so a failed test leaves nothing.
pub(super) struct Space {
    pub(super) prefix: String,
    pub(super) network: String,
    _changing: crate::common::netns::Changing,
}

impl Space {
    pub(super) fn new() -> Space {
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        let pid = std::process::id();
        Space {
            prefix: format!("tp{}{}", pid % 10_000, (b'a' + n as u8) as char),
            network: format!("10.{}.{}.0/24", 232 + pid % 8, (pid / 8 % 20) * 12 + n),
            _changing: crate::common::netns::changing_interfaces(),
        }
    }

    /// The pool's namespaces now.
    pub(super) fn namespaces(&self) -> BTreeSet<String> {
        let mut out = BTreeSet::new();
        if let Ok(dir) = std::fs::read_dir("/run/netns") {
            for e in dir.flatten() {
                let name = e.file_name().to_string_lossy().to_string();
                let rest = name.strip_prefix(&format!("{}-", self.prefix));
                if rest.and_then(|r| r.split_once('-')).is_some_and(|(slot, _)| slot.parse::<u32>().is_ok()) {
                    out.insert(name);
                }
            }
        }
        out
    }
}

impl Drop for Space {
    /// SIGTERM to everything in the namespaces (the agents stop their
    /// instances), SIGKILL to what is left after 10 s, then the namespaces.
    fn drop(&mut self) {
        use nix::sys::signal::{Signal, kill};
        let inodes: Vec<u64> = self
            .namespaces()
            .iter()
            .filter_map(|ns| std::fs::metadata(format!("/run/netns/{ns}")).ok())
            .map(|m| std::os::unix::fs::MetadataExt::ino(&m))
            .collect();
        let all = || inodes.iter().flat_map(|i| pids_in(*i)).collect::<Vec<i32>>();
        for (sig, wait) in [(Signal::SIGTERM, 100), (Signal::SIGKILL, 20)] {
            for pid in all() {
                let _ = kill(nix::unistd::Pid::from_raw(pid), sig);
            }
            for _ in 0..wait {
                if all().is_empty() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        for ns in self.namespaces() {
            let _ = std::process::Command::new("ip").args(["netns", "del", &ns]).output();
        }
    }
}

/// Processes whose network namespace has inode `inode`.
pub(super) fn pids_in(inode: u64) -> Vec<i32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else { continue };
        if std::fs::metadata(format!("/proc/{pid}/ns/net"))
            .is_ok_and(|m| std::os::unix::fs::MetadataExt::ino(&m) == inode)
        {
            out.push(pid);
        }
    }
    out
}

/// A local pool's `[[node_pools]]` table (`max_nodes = 3` unless `extra`
/// sets it).
pub(super) fn pool(space: &Space, name: &str, extra: &str) -> String {
    let max = if extra.contains("max_nodes") { "" } else { "max_nodes = 3\n" };
    format!(
        "[[node_pools]]\nname = \"{name}\"\ndriver = \"local\"\n{max}{extra}\n\
         [node_pools.settings]\nprefix = \"{}\"\nnetwork = \"{}\"\n",
        space.prefix, space.network
    )
}

pub(super) const FAST: [(&str, &str); 3] = [
    ("FLOTILLA_MASTER_TEST_HOOKS", "true"),
    ("FLOTILLA_MASTER_POOL_CLEANUP_INTERVAL", "1s"),
    ("FLOTILLA_MASTER_POOL_LEAK_GRACE", "2s"),
];

pub(super) async fn request(env: &TestEnv, labels: Value, count: u32) -> String {
    let (status, v) = env.post("/node-requests", json!({"labels": labels, "count": count})).await;
    assert_eq!(status, 201, "{v:#}");
    assert_eq!(v["state"], "requested", "{v:#}");
    v["id"].as_str().expect("request id").to_string()
}

pub(super) async fn request_of(env: &TestEnv, id: &str) -> Value {
    let (_, page) = env.get("/node-requests?limit=1000").await;
    page["node_requests"].as_array().and_then(|a| a.iter().find(|r| r["id"] == id).cloned()).unwrap_or(Value::Null)
}

pub(super) async fn until_request(env: &TestEnv, id: &str, state: &str, secs: u64) -> Value {
    env.until(secs, &format!("request {id} {state}"), async || {
        let r = request_of(env, id).await;
        if r["state"] == state { Ok(r) } else { Err(r.to_string()) }
    })
    .await
}

pub(super) async fn pool_of(env: &TestEnv, name: &str) -> Value {
    let (_, v) = env.get("/pools").await;
    v["pools"].as_array().and_then(|a| a.iter().find(|p| p["name"] == name).cloned()).unwrap_or(Value::Null)
}

pub(super) async fn faults(env: &TestEnv, pool: &str, f: Value) {
    let resp = env
        .client
        .post(format!("{}/../../test-hooks/pools/{pool}/faults", env.api))
        .json(&f)
        .send()
        .await
        .expect("set faults");
    assert_eq!(resp.status(), 204, "{:?}", resp.text().await);
}

/// The agent processes in namespace `ns` (by their cmdline).
pub(super) fn agents_in(ns: &str) -> Vec<i32> {
    let inode = std::fs::metadata(format!("/run/netns/{ns}")).map(|m| std::os::unix::fs::MetadataExt::ino(&m));
    let Ok(inode) = inode else { return vec![] };
    pids_in(inode)
        .into_iter()
        .filter(|p| {
            std::fs::read(format!("/proc/{p}/cmdline")).is_ok_and(|c| String::from_utf8_lossy(&c).contains("\0agent\0"))
        })
        .collect()
}

/// `flotilla ARGS` against the env's master; its stdout (it must succeed).
pub(super) fn cli(env: &TestEnv, args: &[&str]) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args(args)
        .env("FLOTILLA_API", env.api.trim_end_matches("/api/v1"))
        .env("FLOTILLA_TOKEN", &env.token)
        .output()
        .expect("run the CLI");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "flotilla {args:?}: {stdout}{}", String::from_utf8_lossy(&out.stderr));
    stdout
}

pub(super) async fn request_node_ns(env: &TestEnv, node: &str) -> String {
    let (_, n) = env.get(&format!("/nodes/{node}")).await;
    n["origin"]["external_id"].as_str().expect("external id").to_string()
}

/// A namespace `{prefix}-{slot}-00000000` made by hand, with `tags` in its tag file.
pub(super) fn make_ns(space: &Space, slot: u32, dir: &Path, tags: Option<Value>) -> String {
    let name = format!("{}-{slot}-00000000", space.prefix);
    let out = std::process::Command::new("ip").args(["netns", "add", &name]).output().expect("ip netns add");
    assert!(out.status.success(), "{out:?}");
    std::fs::create_dir_all(dir.join(&name)).unwrap();
    if let Some(t) = tags {
        std::fs::write(dir.join(&name).join("tags.json"), t.to_string()).unwrap();
    }
    name
}
