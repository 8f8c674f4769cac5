//! Create with two roles of different `order`: the lower order runs before
//! the higher one starts; every instance gets its own ports and its files
//! rendered with the whole membership and the cluster's config.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Value, json};

use crate::common::scripts::{RECORD_AND_SLEEP, member_lines, rendered, started_at};
use crate::common::{PackageBuilder, TestEnv, dir_of, dynamic_uid, instance_pids, pid_of, proc_uid, role_instances};

const SPEC: &str = r#"
[component]
name = "kv"
version = "1.0.0"

[config]
greeting = { type = "string", default = "hi" }
limit = { type = "int", default = 10, min = 1, max = 100 }

[[roles]]
name = "store"
order = 0
count = { min = 1, max = 5 }
ports = ["main", "admin"]
start = ["bin/store.sh"]
stop_grace = "2s"

[[roles.files]]
path = "conf/members.txt"
template = """{% for m in cluster.roles.store.members %}{{ m.host }}:{{ m.ports.main }}
{% endfor %}"""

[[roles.files]]
path = "conf/settings.txt"
template = """{{ cluster.config.greeting }} {{ cluster.config.limit }} {{ instance.ordinal }}"""

[[roles]]
name = "front"
order = 1
count = { min = 1, max = 5 }
ports = ["http"]
start = ["bin/front.sh"]
stop_grace = "2s"

[[roles.files]]
path = "conf/members.txt"
template = """{% for m in cluster.roles.store.members %}{{ m.host }}:{{ m.ports.main }}
{% endfor %}"""
"#;

/// `kv` 1.0.0: both roles record each start and sleep.
fn package() -> PackageBuilder {
    PackageBuilder::new("kv", "1.0.0")
        .spec(SPEC)
        .script("bin/store.sh", RECORD_AND_SLEEP)
        .script("bin/front.sh", RECORD_AND_SLEEP)
}

#[tokio::test]
async fn lower_order_runs_first_and_files_list_every_member() {
    let env = TestEnv::start("order").await;
    env.upload(&package()).await;
    let cluster = env
        .create_active(json!({
            "name": "ord",
            "package": {"name": "kv", "version": "1.0.0"},
            "roles": {"store": {"count": 3}, "front": {"count": 2}},
            "config": {"greeting": "hello"},
        }))
        .await;
    let stores = role_instances(&cluster, "store");
    let fronts = role_instances(&cluster, "front");
    assert_eq!(stores.len(), 3, "{cluster:#}");
    assert_eq!(fronts.len(), 2, "{cluster:#}");
    assert_eq!(cluster["roles"]["store"]["count"], 3);
    assert_eq!(cluster["roles"]["front"]["count"], 2);
    let ordinals: Vec<u64> = stores.iter().map(|i| i["ordinal"].as_u64().unwrap()).collect();
    assert_eq!(ordinals, vec![1, 2, 3]);

    // Every instance runs, as the cluster's own user, and its process
    // carries its marker.
    let uid = dynamic_uid(pid_of(&stores[0]));
    for i in stores.iter().chain(&fronts) {
        assert_eq!(i["status"], "Running", "{i:#}");
        let pid = pid_of(i);
        assert!(instance_pids(i["id"].as_str().unwrap()).contains(&pid), "pid {pid} of {i:#} has no marker");
        assert_eq!(proc_uid(pid), Some(uid), "instance {} does not run as its cluster's user", i["id"]);
        assert!(env.agent_ips.contains(&i["host"].as_str().unwrap().to_string()), "host of {i:#}");
    }

    // Order: every store started before any front.
    let last_store = stores.iter().map(|i| *started_at(i).last().expect("store start time")).max().unwrap();
    let first_front = fronts.iter().map(|i| *started_at(i).first().expect("front start time")).min().unwrap();
    assert!(
        last_store < first_front,
        "a front started ({first_front}) before the last store ({last_store}) had started"
    );

    // Every instance's file lists every store member with its real port.
    let expected = member_lines(&stores, "main");
    for i in stores.iter().chain(&fronts) {
        assert_eq!(rendered(i, "conf/members.txt"), expected, "conf/members.txt of {}", i["id"]);
    }
    for s in &stores {
        assert_eq!(rendered(s, "conf/settings.txt"), format!("hello 10 {}", s["ordinal"]), "settings of {}", s["id"]);
    }

    // Ports: every named port is in the node's range, and no two instances
    // on one node share a port (5 instances on 3 nodes: some node has two).
    let mut by_node: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    let mut per_node: BTreeMap<String, usize> = BTreeMap::new();
    for i in stores.iter().chain(&fronts) {
        *per_node.entry(i["node"].as_str().unwrap().to_string()).or_default() += 1;
        let ports = i["ports"].as_object().expect("ports");
        let want: BTreeSet<&str> = if i["role"] == "store" { ["main", "admin"].into() } else { ["http"].into() };
        assert_eq!(ports.keys().map(String::as_str).collect::<BTreeSet<_>>(), want, "{i:#}");
        for p in ports.values() {
            let p = p.as_u64().unwrap();
            assert!((env.port_range.0 as u64..=env.port_range.1 as u64).contains(&p), "port {p} outside the range");
            by_node.entry(i["node"].as_str().unwrap().to_string()).or_default().push(p);
        }
    }
    assert!(per_node.values().any(|n| *n >= 2), "no node holds two instances: {per_node:?}");
    for (node, ports) in &by_node {
        let unique: BTreeSet<_> = ports.iter().collect();
        assert_eq!(unique.len(), ports.len(), "ports repeat on {node}: {ports:?}");
    }
}

/// A start puts every member's files in line first, but restarts a member
/// whose files were stale only in its role's turn: a front (order 1) still
/// running with a stale file is restarted after the stores (order 0) it
/// depends on have started, not before.
#[tokio::test]
async fn a_start_restarts_a_stale_member_in_its_role_order() {
    let mut env = TestEnv::start("order-stale").await;
    env.upload(&package()).await;
    let cluster = env
        .create_active(json!({
            "name": "ords",
            "package": {"name": "kv", "version": "1.0.0"},
            "roles": {"store": {"count": 1}, "front": {"count": 1}},
        }))
        .await;
    let store = role_instances(&cluster, "store").remove(0);
    let front = role_instances(&cluster, "front").remove(0);
    let store_id = store["id"].as_str().unwrap();
    env.run_ok(&format!("/clusters/ords/instances/{store_id}/stop"), None).await;
    // The front keeps running with a file that no longer matches what the
    // master renders (as an undo that could not reach its node leaves it);
    // a restarted master knows nothing of what its nodes hold, so the
    // start's refresh sends every file.
    let front_pid = pid_of(&front);
    let members = dir_of(&front).join("conf/members.txt");
    std::fs::write(&members, "stale\n").unwrap();
    env.restart_master().await;

    let op = env.run_ok("/clusters/ords/start", None).await;
    let after = env.cluster("ords").await;
    let (store, front) = (role_instances(&after, "store").remove(0), role_instances(&after, "front").remove(0));
    assert_eq!(
        rendered(&front, "conf/members.txt"),
        member_lines(std::slice::from_ref(&store), "main"),
        "front file: {op:#}"
    );
    assert_ne!(pid_of(&front), front_pid, "the stale front was not restarted: {op:#}");
    let store_started = *started_at(&store).last().expect("store start time");
    let front_restarted = *started_at(&front).last().expect("front start time");
    assert_eq!(started_at(&front).len(), 2, "front started once by the create, once by the start");
    assert!(
        store_started < front_restarted,
        "the front was restarted ({front_restarted}) before the store it depends on started ({store_started}): {op:#}"
    );
    // Which step did what, as the operator reads it.
    let result = |step: &str| -> Value {
        let s = op["steps"].as_array().unwrap().iter().find(|s| s["name"] == step).unwrap_or_else(|| panic!("{op:#}"));
        s["results"].as_array().unwrap().iter().find(|r| r["instance"] == front["id"]).cloned().unwrap_or_default()
    };
    let refreshed = result("refresh-files");
    assert!(refreshed["message"].as_str().is_some_and(|m| m.contains("changed: conf/members.txt")), "{op:#}");
    let started = result("start-order-1");
    assert!(started["message"].as_str().is_some_and(|m| m.contains("restarted with its new files")), "{op:#}");
}
