//! `flotilla dev` keeps its environment whole: an agent killed with
//! SIGKILL is started again and re-adopts its running instances (same
//! pids, no second copy), and Ctrl-C leaves no process behind, even one an
//! agent killed a moment before could not stop.

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::common::dev::Dev;
use crate::common::procfs::{eventually, pid_alive, pids_with_cwd_under};

fn sigkill(pid: u32) {
    kill(Pid::from_raw(pid as i32), Signal::SIGKILL).expect("kill -9");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dev_restarts_a_killed_agent_and_ctrl_c_leaves_nothing_running() {
    let mut dev = Dev::start();
    dev.ok(&["cluster", "create", "site", "--package", "web:1.0.0", "--role", "server=3"]);
    let cluster = dev.cluster("site");
    let instances = cluster["instances"].as_array().expect("instances").clone();
    let on = |node: &str| instances.iter().find(|i| i["node"] == node).cloned().expect("an instance on the node");
    let first = on("node-1");
    let pid = first["pid"].as_u64().expect("pid") as u32;

    // kill -9 agent 1: dev mode starts it again, and it re-adopts.
    let agent = dev.agent_pid(1).expect("agent 1 runs");
    sigkill(agent);
    assert!(
        eventually(30, || dev.agent_pid(1).is_some_and(|p| p != agent)).await,
        "agent 1 was not started again:\n{}",
        dev.log()
    );
    assert!(dev.log().contains("agent-1 exited"), "{}", dev.log());
    assert!(
        eventually(30, || dev.json(&["node", "get", "node-1"])["connected"] == true).await,
        "node-1 did not come back:\n{}",
        dev.log()
    );
    let again = dev.cluster("site");
    let same = again["instances"].as_array().unwrap().iter().find(|i| i["id"] == first["id"]).cloned().unwrap();
    assert_eq!(same["pid"].as_u64(), Some(pid as u64), "the instance was not re-adopted: {same:#}");
    assert_eq!(same["status"], "Running", "{same:#}");
    assert!(pid_alive(pid), "the instance's process died with its agent");
    let dir = dev.dir.path().join("agent-1/instances").join(first["id"].as_str().unwrap());
    assert_eq!(pids_with_cwd_under(&dir), vec![pid], "a second copy of {} runs", first["id"]);

    // kill -9 agent 2 and Ctrl-C at once: nobody is left to stop node-2's
    // instance, so dev mode kills it itself.
    let orphan = on("node-2")["pid"].as_u64().unwrap() as u32;
    sigkill(dev.agent_pid(2).expect("agent 2 runs"));
    let status = dev.interrupt();
    assert!(status.success(), "flotilla dev exited {status}:\n{}", dev.log());
    assert!(!pid_alive(orphan), "node-2's instance (pid {orphan}) outlived dev mode:\n{}", dev.log());
    let left = pids_with_cwd_under(dev.dir.path());
    assert!(left.is_empty(), "processes left running under the dev dir: {left:?}\n{}", dev.log());
    for i in 1..=3 {
        assert!(dev.agent_pid(i).is_none(), "agent {i} still runs");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dev_with_a_local_pool_runs_its_spare_node_and_ctrl_c_deletes_it() {
    // Its local pool adds and removes namespaces and veths.
    let _changing = crate::common::netns::changing_interfaces();
    let prefix = format!("dv{}", std::process::id() % 100_000);
    let config = format!(
        "[[node_pools]]\nname = \"spare\"\ndriver = \"local\"\nmax_nodes = 2\nmin_ready = 1\nlabels = {{ kind = \"ns\" }}\n\
         [node_pools.settings]\nprefix = \"{prefix}\"\nnetwork = \"10.245.{}.0/24\"\n",
        std::process::id() % 250
    );
    let mut dev = Dev::start_with(1, Some(&config));
    let namespaces = || -> Vec<String> {
        std::fs::read_dir("/run/netns")
            .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().to_string()).collect::<Vec<String>>())
            .unwrap_or_default()
            .into_iter()
            .filter(|n: &String| n.starts_with(&format!("{prefix}-")))
            .collect()
    };
    assert!(
        eventually(60, || dev.json(&["pool", "ls"])["pools"][0]["nodes_by_state"]["ready"] == 1).await,
        "the pool's spare did not become ready:\n{}",
        dev.log()
    );
    let nodes = dev.json(&["node", "ls"]);
    let spare = nodes["nodes"].as_array().unwrap().iter().find(|n| n["origin"]["kind"] == "provider").cloned();
    let spare = spare.unwrap_or_else(|| panic!("no provider node: {nodes:#}"));
    assert_eq!((spare["status"].as_str(), spare["labels"]["kind"].as_str()), (Some("Ready"), Some("ns")), "{spare:#}");
    assert_eq!(namespaces().len(), 1);

    let status = dev.interrupt();
    assert!(status.success(), "flotilla dev exited {status}:\n{}", dev.log());
    assert!(dev.log().contains("deleted 1 node(s) of pool spare"), "{}", dev.log());
    assert!(namespaces().is_empty(), "the pool's namespace outlived dev mode: {:?}", namespaces());
    let left = pids_with_cwd_under(dev.dir.path());
    assert!(left.is_empty(), "processes left running under the dev dir: {left:?}\n{}", dev.log());
}
