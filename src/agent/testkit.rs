//! Test helpers for the node-level handlers (hooks, health, start): a real
//! [`Node`] on a temp dir (its own RocksDB, process groups rather than
//! cgroups unless asked) with instances recorded directly instead of installed from a
//! package, and every process they left killed on drop.

use std::os::unix::fs::PermissionsExt;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use nix::sys::signal::Signal;

use super::node::{Node, RunAsPolicy};
use super::process::{ProcessController, tree};
use crate::ids::InstanceId;
use crate::protocol::messages::ProcessSpec;
use crate::storage::agent_records::AgentInstanceRecord;
use crate::storage::records::RECORD_VERSION;
use crate::storage::{AgentStore, WriteOp};

static SEQ: AtomicU32 = AtomicU32::new(0);

pub fn argv(parts: &[&str]) -> Vec<String> {
    parts.iter().map(|s| s.to_string()).collect()
}

/// Every live process on the machine carrying `id`'s marker, read from
/// `/proc` here rather than through the agent's own scan.
pub fn marked(id: &InstanceId) -> Vec<u32> {
    let marker = tree::marker(id);
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| super::process::identity::read_stat(*pid).is_some_and(|s| s.is_running()))
        .filter(|pid| tree::has_marker(*pid, &marker))
        .collect()
}

/// A foreground spec with `GREETING=hello` in its env.
pub fn spec(start: &[&str]) -> ProcessSpec {
    ProcessSpec {
        start: argv(start),
        stop: None,
        pidfile: None,
        stop_grace_ms: 500,
        start_timeout_ms: 3000,
        env: vec![("GREETING".into(), "hello".into())],
        health: None,
        limits: None,
    }
}

pub struct TestNode {
    pub node: Arc<Node>,
    ids: Mutex<Vec<InstanceId>>,
    _tmp: tempfile::TempDir,
}

impl TestNode {
    /// A node announcing 127.0.0.1, allowing root.
    pub fn new() -> TestNode {
        TestNode::with_policy(RunAsPolicy { allow_root: true, ..RunAsPolicy::default() })
    }

    /// A node announcing 127.0.0.1, with this run-as and env policy.
    pub fn with_policy(policy: RunAsPolicy) -> TestNode {
        TestNode::build(policy, false)
    }

    /// A node allowing root whose instances run in their own cgroup v2,
    /// as a root agent's do; fails when this machine cannot give it one.
    pub fn with_cgroups() -> TestNode {
        assert!(nix::unistd::geteuid().is_root(), "this test needs root (run it as root, as .ci/run does)");
        let t = TestNode::build(RunAsPolicy { allow_root: true, ..RunAsPolicy::default() }, true);
        assert!(t.node.processes.cgroups_enabled(), "root on a machine with cgroup2 must get cgroups");
        t
    }

    fn build(policy: RunAsPolicy, cgroups: bool) -> TestNode {
        let tmp = tempfile::tempdir().unwrap();
        // Instances may run as `nobody`: the path to them must be searchable.
        std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let store = AgentStore::open(&tmp.path().join("db")).unwrap();
        let scope = format!("testkit-{}-{}", std::process::id(), SEQ.fetch_add(1, Ordering::Relaxed));
        let processes = ProcessController::new(&scope, cgroups);
        let node = Node::new(store, processes, tmp.path(), policy, "127.0.0.1".into()).unwrap();
        TestNode { node, ids: Mutex::default(), _tmp: tmp }
    }

    /// Records an installed instance `<name>-<unique>` (generation 1,
    /// stopped) running as `run_as`, with these executable scripts.
    pub async fn install(&self, name: &str, run_as: &str, spec: ProcessSpec, scripts: &[(&str, &str)]) -> InstanceId {
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let id = InstanceId::new(format!("{name}-{}-{n}", std::process::id()));
        std::fs::create_dir_all(self.node.instance_dir(&id)).unwrap();
        for (rel, body) in scripts {
            self.script(&id, rel, body);
        }
        let rec = AgentInstanceRecord {
            version: RECORD_VERSION,
            id: id.clone(),
            generation: 1,
            desired_running: false,
            run_as: run_as.into(),
            process: spec,
            package_sha256: "00".repeat(32),
            file_hashes: Default::default(),
            pid: None,
        };
        self.node.store.writer().commit(vec![WriteOp::put_agent_instance(&rec).unwrap()]).await.unwrap();
        *self.node.slot(&id).record.lock().await = Some(rec);
        self.ids.lock().unwrap().push(id.clone());
        id
    }

    /// Writes an executable `#!/bin/sh` script into the instance dir.
    pub fn script(&self, id: &InstanceId, rel: &str, body: &str) {
        let path = self.node.instance_dir(id).join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    /// The record as the node holds it.
    pub async fn record(&self, id: &InstanceId) -> AgentInstanceRecord {
        self.node.slot(id).record.lock().await.clone().unwrap()
    }

    /// The record as persisted.
    pub fn persisted(&self, id: &InstanceId) -> AgentInstanceRecord {
        self.node.store.load_all().unwrap().instances.into_iter().find(|r| r.id == *id).unwrap()
    }
}

impl Drop for TestNode {
    fn drop(&mut self) {
        for id in self.ids.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            let cg = self.node.processes.cgroup_of(id);
            tree::signal(&tree::collect(id, &[], cg.as_deref()).unwrap_or_default(), Signal::SIGKILL);
            if let Some(cg) = cg {
                let _ = std::fs::remove_dir(cg);
            }
        }
        self.node.processes.remove_empty_bases();
    }
}
