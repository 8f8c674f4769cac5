//! An agent told to stop (SIGTERM, or Ctrl-C under `flotilla dev`) with
//! `--stop-instances-on-exit` stops every instance and leaves none
//! running: the exits it causes are not crashes, so its restart policy
//! never starts an instance again while it shuts down. A slow instance
//! (it ignores TERM until its stop grace ends) keeps the shutdown going
//! well past the policy's first restart delay (1 s), the window in which
//! the fast ones used to be started again and left behind.

use std::time::Duration;

use nix::sys::signal::Signal;
use serde_json::json;

use crate::common::procfs::pids_by_instance;
use crate::common::{PackageBuilder, TestEnv, all_instances, id_of, pid_alive, pid_of};

const SPEC: &str = r#"
[component]
name = "mixed"
version = "1.0.0"

[[roles]]
name = "fast"
count = { min = 1, max = 10 }
start = ["bin/fast.sh"]
stop_grace = "2s"

[[roles]]
name = "slow"
start = ["bin/slow.sh"]
stop_grace = "3s"
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_agent_restarts_nothing_and_leaves_nothing_running() {
    let mut env = TestEnv::start("agent-shutdown").await;
    let pkg = PackageBuilder::new("mixed", "1.0.0")
        .spec(SPEC)
        .script("bin/fast.sh", "exec sleep 100000\n")
        .script("bin/slow.sh", "trap '' TERM\nwhile true; do sleep 0.2; done\n");
    env.upload(&pkg).await;
    let body = json!({"name": "mx", "package": {"name": "mixed", "version": "1.0.0"},
        "roles": {"fast": {"count": 6, "nodes": ["node-1"]}, "slow": {"count": 1, "nodes": ["node-1"]}}});
    env.create_active(body).await;
    let c = env.cluster("mx").await;
    let instances = all_instances(&c);
    let ids: Vec<String> = instances.iter().map(id_of).collect();
    let first: Vec<u32> = instances.iter().map(pid_of).collect();
    assert!(first.iter().all(|p| pid_alive(*p)), "all 7 running before the agent stops");

    env.signal_agent(1, Signal::SIGTERM);
    let status = env.wait_agent_exit(1, Duration::from_secs(30));
    assert!(status.is_some(), "agent 1 did not exit within 30 s of SIGTERM:\n{}", env.log_tails());
    // Past any restart delay a watcher might still be waiting out.
    tokio::time::sleep(Duration::from_millis(2500)).await;

    let left = pids_by_instance();
    let running: Vec<(&String, &Vec<u32>)> = ids.iter().filter_map(|id| left.get(id).map(|p| (id, p))).collect();
    assert!(running.is_empty(), "instance processes left after the agent exited: {running:?}\n{}", env.agent_log(1));
    let log = env.agent_log(1);
    assert!(
        !log.contains("restarted after an unexpected exit"),
        "the agent restarted instances while stopping them:\n{log}"
    );
    assert!(
        !log.contains("instance process exited unexpectedly"),
        "exits the agent caused were taken for crashes:\n{log}"
    );
    assert!(log.contains("stopping every instance before exit"), "{log}");
}
