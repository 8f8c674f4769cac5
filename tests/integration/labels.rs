//! Placement by node labels (issue 24, first part): a role's
//! `node_labels` in `component.toml`, or the create's own for that cluster,
//! sends its instances only to `Ready` nodes carrying each label with its
//! value (agents get theirs from `--label KEY=VALUE` or the config file's
//! `[labels]`); a label no node carries fails the create at once, naming
//! it, with nothing created.

use std::collections::BTreeMap;

use serde_json::json;

use crate::common::{PackageBuilder, TestEnv, pid_alive, pid_of, role_instances};

const SPEC: &str = r#"
[component]
name = "lb"
version = "1.0.0"

[[roles]]
name = "big"
count = { min = 1, max = 9 }
start = ["bin/start.sh"]
stop_grace = "2s"
node_labels = { class = "big" }

[[roles]]
name = "any"
count = { min = 0, max = 9 }
start = ["bin/start.sh"]
stop_grace = "2s"
"#;

/// How many instances of `role` each node holds.
fn per_node(c: &serde_json::Value, role: &str) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for i in role_instances(c, role) {
        *out.entry(i["node"].as_str().unwrap_or("?").to_string()).or_default() += 1;
        assert!(pid_alive(pid_of(&i)), "{i:#}");
    }
    out
}

#[tokio::test]
async fn a_role_goes_only_to_nodes_with_its_labels() {
    let flags = [(1, "--label=class=big"), (2, "--label=class=big"), (2, "--label=zone=a"), (3, "--label=class=small")];
    let mut env = TestEnv::start_with_agent_flags("labels", &flags).await;
    let (_, n2) = env.get("/nodes/node-2").await;
    let labels = n2["node"]["labels"].as_object().or(n2["labels"].as_object()).cloned().unwrap_or_default();
    assert_eq!(json!(labels), json!({"class": "big", "zone": "a"}), "{n2:#}");
    env.upload(&PackageBuilder::new("lb", "1.0.0").spec(SPEC).script("bin/start.sh", "exec sleep 100000\n")).await;

    // Four of the labelled role and three of the other: the first spread
    // over node-1 and node-2 only; the second may go anywhere, node-3
    // (the cluster's emptiest node) included.
    let body = json!({"name": "l1", "package": {"name": "lb", "version": "1.0.0"},
        "roles": {"big": {"count": 4}, "any": {"count": 3}}});
    let c = env.create_active(body).await;
    let want: BTreeMap<String, usize> = [("node-1".into(), 2), ("node-2".into(), 2)].into();
    assert_eq!(per_node(&c, "big"), want, "{c:#}");
    let any = per_node(&c, "any");
    assert_eq!(any.values().sum::<usize>(), 3, "{c:#}");
    assert!(any.get("node-3").is_some_and(|n| *n >= 1), "the unlabelled role avoids node-3: {c:#}");

    // A scale-out keeps to them too.
    env.run_ok("/clusters/l1/scale", Some(json!({"role": "big", "add": 2}))).await;
    let c = env.cluster("l1").await;
    let want: BTreeMap<String, usize> = [("node-1".into(), 3), ("node-2".into(), 3)].into();
    assert_eq!(per_node(&c, "big"), want, "{c:#}");

    // A cluster's own labels for the role, over the spec's: zone=a is
    // node-2 only; kept for its scale-outs, shown on the cluster, and the
    // master restarted in between (they are in its record).
    let body = json!({"name": "l3", "package": {"name": "lb", "version": "1.0.0"},
        "roles": {"big": {"count": 2, "node_labels": {"zone": "a"}}, "any": {"count": 0}}});
    let c = env.create_active(body).await;
    assert_eq!(per_node(&c, "big"), [("node-2".to_string(), 2)].into(), "{c:#}");
    assert_eq!(c["roles"]["big"]["node_labels"], json!({"zone": "a"}), "{c:#}");
    assert!(c["roles"]["any"].get("node_labels").is_none(), "{c:#}");
    env.restart_master().await;
    env.run_ok("/clusters/l3/scale", Some(json!({"role": "big", "add": 1}))).await;
    assert_eq!(per_node(&env.cluster("l3").await, "big"), [("node-2".to_string(), 3)].into());
    // `{}`: any node, node-3 included.
    let body = json!({"name": "l4", "package": {"name": "lb", "version": "1.0.0"},
        "roles": {"big": {"count": 3, "node_labels": {}}, "any": {"count": 0}}});
    assert_eq!(per_node(&env.create_active(body).await, "big").len(), 3);
    // A malformed one is refused, naming it.
    let body = json!({"name": "l5", "package": {"name": "lb", "version": "1.0.0"},
        "roles": {"big": {"count": 1, "node_labels": {"zone": "A"}}}});
    let (status, v) = env.post("/clusters", body).await;
    assert_eq!(status, 422, "{v:#}");
    assert_eq!(v["error"]["field"], "roles.big.node_labels.zone", "{v:#}");

    // Pinned to a node without the label: refused, naming node and label.
    let body = json!({"name": "l2", "package": {"name": "lb", "version": "1.0.0"},
        "roles": {"big": {"count": 1, "nodes": ["node-3"]}}});
    let (status, v) = env.post("/clusters", body).await;
    assert_eq!(status, 422, "{v:#}");
    let m = v["error"]["message"].as_str().unwrap_or_default();
    assert!(m.contains("node node-3") && m.contains("class=big"), "{v:#}");
    let (status, _) = env.get("/clusters/l2").await;
    assert_eq!(status, 404, "a refused create left a cluster");
}

#[tokio::test]
async fn a_label_no_node_carries_fails_the_create_naming_it() {
    let env = TestEnv::start_with_agent_flags("labels-none", &[(1, "--label=class=small")]).await;
    env.upload(&PackageBuilder::new("lb", "1.0.0").spec(SPEC).script("bin/start.sh", "exec sleep 100000\n")).await;
    let body = json!({"name": "nl", "package": {"name": "lb", "version": "1.0.0"}, "roles": {"big": {"count": 1}}});
    let (status, headers, v) = env.post_full("/clusters", body).await;
    assert_eq!((status.as_u16(), v["error"]["code"].as_str()), (409, Some("no_matching_nodes")), "{v:#}");
    assert!(headers.get("retry-after").is_none(), "a retry cannot help: {headers:?}");
    let m = v["error"]["message"].as_str().unwrap_or_default();
    assert!(m.contains("role big") && m.contains("class=big") && m.contains("--label class=big"), "{v:#}");
    let (status, _) = env.get("/clusters/nl").await;
    assert_eq!(status, 404, "a refused create left a cluster");
    let (_, ops) = env.get("/operations?cluster=nl").await;
    assert_eq!(ops["operations"].as_array().map(Vec::len), Some(0), "{ops:#}");

    // A role whose label is malformed is refused at upload, naming the key.
    let bad = SPEC.replace("node_labels = { class = \"big\" }", "node_labels = { Class = \"big\" }");
    let bad = PackageBuilder::new("lb", "1.0.1")
        .spec(&bad.replace("1.0.0", "1.0.1"))
        .script("bin/start.sh", "exec sleep 100000\n");
    let (status, v) = env.put_bytes("/packages/lb/1.0.1", bad.build()).await;
    assert_eq!(status, 422, "{v:#}");
    assert_eq!(v["error"]["field"], "roles.big.node_labels.Class", "{v:#}");
    assert!(v["error"]["message"].as_str().unwrap_or_default().contains("invalid label name"), "{v:#}");
}
