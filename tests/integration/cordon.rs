//! Cordoned nodes (issue 24): `POST /nodes/{id}/cordon` takes a node out
//! of placement (creates and scale-outs go elsewhere, a pin to it is
//! refused) while what runs there stays; the cordon is durable across a
//! master restart, and an uncordon takes the node back.

use std::time::Duration;

use serde_json::json;

use crate::common::sse::SseReader;
use crate::common::{PackageBuilder, TestEnv, error_code, pid_alive, pid_of, role_instances};

const SPEC: &str = r#"
[component]
name = "cd"
version = "1.0.0"

[[roles]]
name = "svc"
count = { min = 1, max = 9 }
start = ["bin/start.sh"]
stop_grace = "2s"
"#;

fn nodes_of(c: &serde_json::Value) -> Vec<String> {
    role_instances(c, "svc").iter().map(|i| i["node"].as_str().unwrap_or("?").to_string()).collect()
}

#[tokio::test]
async fn a_cordoned_node_takes_no_new_instance_and_keeps_its_own() {
    let mut env = TestEnv::start("cordon").await;
    env.upload(&PackageBuilder::new("cd", "1.0.0").spec(SPEC).script("bin/start.sh", "exec sleep 100000\n")).await;
    let pinned = json!({"name": "old", "package": {"name": "cd", "version": "1.0.0"},
        "roles": {"svc": {"count": 1, "nodes": ["node-1"]}}});
    let old = env.create_active(pinned).await;

    let (status, v) = env.post("/nodes/node-1/cordon", json!({"reason": "disk errors"})).await;
    assert_eq!(status, 200, "{v:#}");
    assert_eq!((v["changed"].as_bool(), v["cordon"]["reason"].as_str()), (Some(true), Some("disk errors")), "{v:#}");
    let since = v["cordon"]["since"].clone();
    let (_, n) = env.get("/nodes/node-1").await;
    assert_eq!(n["cordon"]["reason"], "disk errors", "{n:#}");

    // New instances go elsewhere; a pin to it is refused, naming why.
    let c = env
        .create_active(json!({"name": "new", "package": {"name": "cd", "version": "1.0.0"},
        "roles": {"svc": {"count": 4}}}))
        .await;
    assert!(!nodes_of(&c).contains(&"node-1".to_string()), "{c:#}");
    let (status, v) = env
        .post(
            "/clusters",
            json!({"name": "pin", "package": {"name": "cd", "version": "1.0.0"},
        "roles": {"svc": {"count": 1, "nodes": ["node-1"]}}}),
        )
        .await;
    assert_eq!((status.as_u16(), error_code(&v)), (409, "node_cordoned"), "{v:#}");
    assert!(v["error"]["message"].as_str().unwrap_or_default().contains("disk errors"), "{v:#}");
    // What runs there stays, and is served: a restart of it works.
    let member = &role_instances(&old, "svc")[0];
    assert!(pid_alive(pid_of(member)));
    env.run_ok("/clusters/old/restart", None).await;
    assert_eq!(nodes_of(&env.cluster("old").await), ["node-1"]);

    // Durable: still cordoned after a master restart, its time kept by a
    // second cordon, which takes the new reason.
    env.restart_master().await;
    let (_, n) = env.get("/nodes/node-1").await;
    assert_eq!(n["cordon"]["since"], since, "{n:#}");
    let (_, v) = env.post("/nodes/node-1/cordon", json!({"reason": "still bad"})).await;
    assert_eq!((v["cordon"]["since"].clone(), v["cordon"]["reason"].clone()), (since, json!("still bad")));

    // Every node cordoned: a create is refused at once, nothing made.
    for n in ["node-2", "node-3"] {
        let (status, v) = env.post(&format!("/nodes/{n}/cordon"), json!({})).await;
        assert_eq!((status.as_u16(), v["cordon"]["reason"].as_str()), (200, Some("")), "{v:#}");
    }
    let (status, v) =
        env.post("/clusters", json!({"name": "none", "package": {"name": "cd", "version": "1.0.0"}})).await;
    assert_eq!((status.as_u16(), error_code(&v)), (409, "no_matching_nodes"), "{v:#}");
    assert!(v["error"]["message"].as_str().unwrap_or_default().contains("cordoned"), "{v:#}");
    let (status, _) = env.get("/clusters/none").await;
    assert_eq!(status, 404);

    // Uncordoned, node-1 takes the next scale-out's instance (the emptiest
    // node of the cluster).
    for n in ["node-1", "node-2", "node-3"] {
        let (_, v) = env.post_empty(&format!("/nodes/{n}/uncordon")).await;
        assert_eq!(v["changed"], true, "{v:#}");
    }
    let (_, v) = env.post_empty("/nodes/node-1/uncordon").await;
    assert_eq!(v["changed"], false, "{v:#}");
    env.run_ok("/clusters/new/scale", Some(json!({"role": "svc", "add": 1}))).await;
    assert!(nodes_of(&env.cluster("new").await).contains(&"node-1".to_string()));

    // Bad input: an unknown node, a reason with a control character.
    let (status, _) = env.post("/nodes/nowhere/cordon", json!({})).await;
    assert_eq!(status, 404);
    let (status, v) = env.post_empty("/nodes/node-2/cordon").await;
    assert_eq!(status, 400, "no body: {v:#}");
    let (status, v) = env.post("/nodes/node-2/cordon", json!({"reason": "a\u{7}b"})).await;
    assert_eq!(status, 400, "{v:#}");
    let (status, v) = env.post("/nodes/node-2/cordon", json!({"reason": "x", "colour": "red"})).await;
    assert_eq!(status, 400, "{v:#}");
    let (_, n) = env.get("/nodes/node-2").await;
    assert!(n["cordon"].is_null(), "a refused cordon changed the node: {n:#}");

    // Each change was one event, in order (replayed from the store, across
    // the master's restart); the refused ones and the idle uncordon none.
    let mut sse = SseReader::open(&env.client, &env.api, "?after=0&kind=node.cordoned,node.uncordoned", None).await;
    let events =
        sse.until(Duration::from_secs(30), |e| e.kind == "node.uncordoned" && e.data["data"]["node"] == "node-3").await;
    let seen: Vec<(String, String, String)> = events
        .iter()
        .map(|e| {
            let d = &e.data["data"];
            (e.kind.clone(), d["node"].as_str().unwrap_or("?").into(), d["reason"].as_str().unwrap_or("-").into())
        })
        .collect();
    let want = |k: &str, n: &str, r: &str| (format!("node.{k}"), n.to_string(), r.to_string());
    assert_eq!(
        seen,
        [
            want("cordoned", "node-1", "disk errors"),
            want("cordoned", "node-1", "still bad"),
            want("cordoned", "node-2", ""),
            want("cordoned", "node-3", ""),
            want("uncordoned", "node-1", "-"),
            want("uncordoned", "node-2", "-"),
            want("uncordoned", "node-3", "-"),
        ]
    );
}
