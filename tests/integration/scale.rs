//! Scale out and in: new instances get new ordinals, their own ports and
//! their files; every member's file follows the membership; a removed
//! instance leaves no process and no directory.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Value, json};

use crate::common::scripts::{RECORD_AND_SLEEP, member_lines, rendered};
use crate::common::{PackageBuilder, TestEnv, dir_of, id_of, instance_pids, pid_alive, pid_of, role_instances};

const SPEC: &str = r#"
[component]
name = "kv"
version = "1.0.0"

[[roles]]
name = "store"
count = { min = 1, max = 7 }
ports = ["main", "admin"]
start = ["bin/store.sh"]
stop_grace = "2s"

[[roles.files]]
path = "conf/members.txt"
template = """{% for m in cluster.roles.store.members %}{{ m.host }}:{{ m.ports.main }}
{% endfor %}"""
"#;

fn ordinals(stores: &[Value]) -> Vec<u64> {
    stores.iter().map(|i| i["ordinal"].as_u64().unwrap()).collect()
}

/// Every store runs, no port repeats on a node, and every member's file
/// lists exactly the current members.
fn check_members(stores: &[Value]) {
    let expected = member_lines(stores, "main");
    let mut by_node: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    for s in stores {
        assert_eq!(s["status"], "Running", "{s:#}");
        assert!(pid_alive(pid_of(s)), "{} reports a dead pid", s["id"]);
        assert_eq!(rendered(s, "conf/members.txt"), expected, "conf/members.txt of {}", s["id"]);
        let ports = by_node.entry(s["node"].as_str().unwrap()).or_default();
        ports.extend(s["ports"].as_object().unwrap().values().map(|p| p.as_u64().unwrap()));
    }
    for (node, ports) in by_node {
        assert_eq!(ports.iter().collect::<BTreeSet<_>>().len(), ports.len(), "ports repeat on {node}: {ports:?}");
    }
}

#[tokio::test]
async fn scale_out_then_in() {
    let env = TestEnv::start("scale").await;
    env.upload(&PackageBuilder::new("kv", "1.0.0").spec(SPEC).script("bin/store.sh", RECORD_AND_SLEEP)).await;
    let body = json!({"name": "sc", "package": {"name": "kv", "version": "1.0.0"}, "roles": {"store": {"count": 3}}});
    let first = role_instances(&env.create_active(body).await, "store");
    check_members(&first);

    let op = env.run_ok("/clusters/sc/scale", Some(json!({"role": "store", "add": 2}))).await;
    assert_eq!(op["kind"], "ScaleOut", "{op:#}");
    let c = env.cluster("sc").await;
    assert_eq!(c["status"], "Active", "{c:#}");
    assert_eq!(c["roles"]["store"]["count"], 5, "{c:#}");
    let stores = role_instances(&c, "store");
    assert_eq!(ordinals(&stores), [1, 2, 3, 4, 5]);
    let old_ids: Vec<String> = first.iter().map(id_of).collect();
    assert_eq!(stores[..3].iter().map(id_of).collect::<Vec<_>>(), old_ids, "existing instances kept their ids");
    check_members(&stores);

    // Scale in: remove ordinal 2.
    let gone = stores[1].clone();
    let gone_id = id_of(&gone);
    let op = env.run_ok("/clusters/sc/scale", Some(json!({"role": "store", "remove": [gone_id]}))).await;
    assert_eq!(op["kind"], "ScaleIn", "{op:#}");
    let c = env.cluster("sc").await;
    assert_eq!(c["status"], "Active", "{c:#}");
    assert_eq!(c["roles"]["store"]["count"], 4, "{c:#}");
    let stores = role_instances(&c, "store");
    assert_eq!(ordinals(&stores), [1, 3, 4, 5]);
    assert_eq!(instance_pids(&gone_id), Vec::<u32>::new(), "processes of the removed instance still run");
    assert!(!pid_alive(pid_of(&gone)));
    assert!(!dir_of(&gone).exists(), "{} still exists", dir_of(&gone).display());
    check_members(&stores);

    // Ordinals are never reused.
    env.run_ok("/clusters/sc/scale", Some(json!({"role": "store", "add": 1}))).await;
    let stores = role_instances(&env.cluster("sc").await, "store");
    assert_eq!(ordinals(&stores), [1, 3, 4, 5, 6]);
    check_members(&stores);
}

/// A role whose files read only the instance and the cluster's config.
const OWN_FILES_SPEC: &str = r#"
[component]
name = "own"
version = "1.0.0"

[config]
greeting = { type = "string", default = "hello" }

[[roles]]
name = "store"
count = { min = 1, max = 7 }
ports = ["main"]
start = ["bin/store.sh"]
stop_grace = "2s"

[[roles.files]]
path = "conf/own.txt"
template = """{{ instance.ports.main }} {{ cluster.config.greeting }}"""
"#;

/// When no template reads the membership, a scale-out or a scale-in
/// cannot change an existing member's files: the configure step leaves
/// the members alone (rendering each of them again for every scale-out
/// was most of the master's rendering under load), and every member's
/// file is still its own.
#[tokio::test]
async fn members_whose_files_ignore_the_membership_are_not_re_rendered() {
    let env = TestEnv::start("scale-own").await;
    env.upload(&PackageBuilder::new("own", "1.0.0").spec(OWN_FILES_SPEC).script("bin/store.sh", RECORD_AND_SLEEP))
        .await;
    let body = json!({"name": "so", "package": {"name": "own", "version": "1.0.0"}, "roles": {"store": {"count": 3}}});
    let first = role_instances(&env.create_active(body).await, "store");
    // The instances the configure step touched (a step with nothing to
    // do is not shown).
    let configure = |op: &Value| -> Vec<String> {
        let steps = op["steps"].as_array().expect("steps");
        let results = steps.iter().filter(|s| s["name"] == "configure").flat_map(|s| s["results"].as_array().cloned());
        results.flatten().map(|r| r["instance"].as_str().unwrap_or("").into()).collect()
    };

    let op = env.run_ok("/clusters/so/scale", Some(json!({"role": "store", "add": 2}))).await;
    assert_eq!(configure(&op), Vec::<String>::new(), "the existing members were re-rendered: {op:#}");
    let stores = role_instances(&env.cluster("so").await, "store");
    assert_eq!(stores.len(), 5);
    for s in &stores {
        assert_eq!(s["status"], "Running", "{s:#}");
        assert_eq!(rendered(s, "conf/own.txt"), format!("{} hello", s["ports"]["main"]), "{s:#}");
    }

    let gone = id_of(&first[1]);
    let op = env.run_ok("/clusters/so/scale", Some(json!({"role": "store", "remove": [gone]}))).await;
    assert_eq!(configure(&op), Vec::<String>::new(), "the remaining members were re-rendered: {op:#}");
    let stores = role_instances(&env.cluster("so").await, "store");
    assert_eq!(stores.len(), 4);
    assert!(stores.iter().all(|s| s["status"] == "Running"), "{stores:#?}");
}
