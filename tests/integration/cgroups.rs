//! Each instance runs in a cgroup v2 of its own (DESIGN.md §12): a root
//! agent creates `<cgroup2 mount>/flotilla/<node>/<instance>` and moves
//! the spawned process in before it execs. Checked from outside the agent:
//! the running process's `/proc/<pid>/cgroup` names exactly its instance's
//! cgroup, and that cgroup's `cgroup.procs` holds its whole tree (a child
//! the start script forks too), nothing else. A machine without root or
//! without a cgroup2 mount fails the test, saying which.

use std::path::PathBuf;

use serde_json::json;

use crate::common::{PackageBuilder, TestEnv, all_instances, id_of, instance_pids, pid_of};

/// The cgroup2 mount point, from `/proc/self/mountinfo` (field 5, after
/// the optional fields and the `-` separator comes the type).
fn cgroup2_mount() -> Option<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    info.lines().find_map(|l| {
        let (before, after) = l.split_once(" - ")?;
        let point = before.split_whitespace().nth(4)?;
        (after.split_whitespace().next() == Some("cgroup2")).then(|| PathBuf::from(point.replace("\\040", " ")))
    })
}

/// The cgroup v2 path (`0::<path>`) of a process.
fn cgroup_of(pid: u32) -> String {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_else(|e| panic!("pid {pid}: {e}"));
    text.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .unwrap_or_else(|| panic!("pid {pid} has no cgroup v2 line: {text}"))
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_instance_runs_in_its_own_cgroup() {
    assert!(nix::unistd::geteuid().is_root(), "this test needs root: agents make cgroups only as root");
    let mount = cgroup2_mount().expect("this test needs a cgroup2 mount (none in /proc/self/mountinfo)");
    let env = TestEnv::start("cgroups").await;
    // The start script leaves a child behind it, then becomes the process.
    let start = "set -eu\nsleep 100000 &\necho $! > data/child\nexec sleep 100000\n";
    env.upload(&PackageBuilder::sleeper("cg").script("bin/start.sh", start)).await;
    let body = json!({"name": "cg", "package": {"name": "cg", "version": "1.0.0"}, "roles": {"svc": {"count": 3}}});
    let c = env.create_active(body).await;
    let instances = all_instances(&c);
    assert_eq!(instances.len(), 3);
    let mut seen = std::collections::BTreeSet::new();
    for i in &instances {
        let (id, node, pid) = (id_of(i), i["node"].as_str().unwrap().to_string(), pid_of(i));
        let want = format!("/flotilla/{node}/{id}");
        assert_eq!(cgroup_of(pid), want, "{id}'s process {pid} is not in its instance's cgroup");
        let child: u32 = crate::common::scripts::rendered(i, "data/child").trim().parse().expect("the child's pid");
        assert_eq!(cgroup_of(child), want, "{id}'s child {child} is not in its instance's cgroup");
        let procs = std::fs::read_to_string(mount.join(want.trim_start_matches('/')).join("cgroup.procs"))
            .unwrap_or_else(|e| panic!("{id}: cannot read its cgroup.procs: {e}"));
        let mut procs: Vec<u32> = procs.lines().map(|l| l.parse().unwrap()).collect();
        procs.sort();
        let mut tree = instance_pids(&id);
        tree.sort();
        assert_eq!(procs, tree, "{id}'s cgroup holds exactly its processes (those with its marker)");
        assert!(procs.contains(&pid) && procs.contains(&child), "{id}: {procs:?}");
        seen.insert(want);
    }
    assert_eq!(seen.len(), 3, "one cgroup per instance");

    // A delete removes the cgroups.
    let (status, resp) = env.delete("/clusters/cg").await;
    assert_eq!(status, 202, "{resp:#}");
    env.assert_succeeded(&env.wait_op(resp["operation"]["id"].as_str().unwrap()).await);
    for want in &seen {
        let dir = mount.join(want.trim_start_matches('/'));
        assert!(!dir.exists(), "{} is left after the delete", dir.display());
    }
}
