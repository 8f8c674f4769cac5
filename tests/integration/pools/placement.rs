//! Placement that waits for nodes: a role short of `Ready` nodes with its
//! labels, when a pool offers them, files a node request and its operation
//! waits for it (its `await-nodes-<role>` step, the request on the
//! operation), then places on the nodes the pool launched; a label no pool
//! offers is refused at once, naming it; a request every pool declines
//! fails the operation with the pools' reasons; a master restarted while
//! an operation waits finishes it without filing a second request.

use std::collections::BTreeSet;

use serde_json::{Value, json};

use super::support::*;
use crate::common::{PackageBuilder, TestEnv, error_code, id_of, pid_of, role_instances};

/// The operation as `GET /operations/{id}` answers it now.
async fn op_now(env: &TestEnv, id: &str) -> Value {
    let (_, v) = env.get(&format!("/operations/{id}")).await;
    v["operation"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_short_of_labelled_nodes_waits_for_its_node_request_then_lands_on_the_new_nodes() {
    let (big, small) = (Space::new(), Space::new());
    let config = format!(
        "{}{}",
        pool(&big, "big", "labels = { class = \"big\" }"),
        pool(&small, "small", "labels = { class = \"small\" }\nmax_nodes = 1")
    );
    // One manual agent without labels: it never takes these roles.
    let env = TestEnv::start_with_config("pools-place", &FAST, &config, 1).await;
    let (big, _small) = (big, small);
    env.upload(&PackageBuilder::sleeper("onbig")).await;

    // A label no pool offers (and no node carries): refused at once, naming it.
    let (status, v) = env
        .post(
            "/clusters",
            json!({"name": "h", "package": {"name": "onbig", "version": "1.0.0"},
            "roles": {"svc": {"count": 1, "node_labels": {"class": "huge"}}}}),
        )
        .await;
    assert_eq!((status.as_u16(), error_code(&v)), (409, "no_matching_nodes"), "{v:#}");
    let message = v["error"]["message"].as_str().unwrap_or("");
    assert!(message.contains("class=huge") && message.contains("no node pool offers them"), "{v:#}");
    assert!(message.contains("big offers {class=big}"), "what the pools offer: {v:#}");

    // Two instances wanting class=big, no such node yet: accepted, and the
    // operation waits for a request for two nodes.
    let op = env
        .create_cluster(json!({"name": "w", "package": {"name": "onbig", "version": "1.0.0"},
            "roles": {"svc": {"count": 2, "node_labels": {"class": "big"}}}}))
        .await;
    let id = op["id"].as_str().unwrap().to_string();
    assert_eq!(op["steps"][0]["name"], "await-nodes-svc", "{op:#}");
    let waiting = env
        .until(30, "the operation showing its request", async || {
            let op = op_now(&env, &id).await;
            let r = &op["node_requests"][0];
            if op["steps"][0]["status"] == "Running" && r["count"] == 2 { Ok(op) } else { Err(op.to_string()) }
        })
        .await;
    let request = &waiting["node_requests"][0];
    assert_eq!(request["requestor"], format!("operation:{id}/svc"), "{waiting:#}");
    assert_eq!(request["labels"], json!({"class": "big"}), "{waiting:#}");
    assert!(["requested", "pending"].contains(&request["state"].as_str().unwrap()), "{waiting:#}");
    assert_eq!(env.cluster("w").await["status"], "Validating", "a create waiting for nodes");

    let done = env.wait_op(&id).await;
    env.assert_succeeded(&done);
    let served = &done["node_requests"][0];
    assert_eq!((served["state"].as_str(), served["pool"].as_str()), (Some("fulfilled"), Some("big")), "{done:#}");
    let launched: BTreeSet<String> =
        served["nodes"].as_array().unwrap().iter().map(|n| n.as_str().unwrap().to_string()).collect();
    assert_eq!(launched.len(), 2, "{done:#}");
    let placed = done["steps"][0]["results"].as_array().unwrap();
    assert!(
        placed.len() == 2 && placed.iter().all(|r| r["message"].as_str().unwrap().contains("node request")),
        "the step says where each went and why: {done:#}"
    );
    let c = env.cluster("w").await;
    let svc = role_instances(&c, "svc");
    let on: BTreeSet<String> = svc.iter().map(|i| i["node"].as_str().unwrap().to_string()).collect();
    assert_eq!(on, launched, "one instance on each launched node: {c:#}");
    for i in &svc {
        let ns = request_node_ns(&env, i["node"].as_str().unwrap()).await;
        let inode =
            std::fs::metadata(format!("/run/netns/{ns}")).map(|m| std::os::unix::fs::MetadataExt::ino(&m)).unwrap();
        assert!(pids_in(inode).contains(&(pid_of(i) as i32)), "{} runs in {ns}", id_of(i));
    }
    assert_eq!(big.namespaces().len(), 2);

    // Scaling out by one: every class=big node holds a member, so one more
    // node is asked for, and the new member lands on it.
    let (status, s) = env.post("/clusters/w/scale", json!({"role": "svc", "add": 1})).await;
    assert_eq!(status.as_u16(), 202, "{s:#}");
    let sid = s["operation"]["id"].as_str().unwrap().to_string();
    let scaled = env.wait_op(&sid).await;
    env.assert_succeeded(&scaled);
    assert_eq!(scaled["node_requests"].as_array().map(|a| a.len()), Some(1), "{scaled:#}");
    assert_eq!(scaled["node_requests"][0]["count"], 1, "{scaled:#}");
    let third = scaled["node_requests"][0]["nodes"][0].as_str().unwrap().to_string();
    assert!(!launched.contains(&third), "{scaled:#}");
    let c = env.cluster("w").await;
    let on: Vec<String> = role_instances(&c, "svc").iter().map(|i| i["node"].as_str().unwrap().to_string()).collect();
    assert_eq!(on.len(), 3, "{c:#}");
    assert!(on.contains(&third), "the new member is on the new node: {c:#}");
    assert!(!on.contains(&"node-1".to_string()), "never on the unlabelled node: {c:#}");
    // The operations list shows the same requests.
    let (_, page) = env.get("/operations?cluster=w").await;
    let listed = page["operations"].as_array().unwrap().iter().find(|o| o["id"] == sid.as_str()).cloned().unwrap();
    assert_eq!(listed["node_requests"][0]["id"], scaled["node_requests"][0]["id"], "{listed:#}");

    // A request every pool declines (two nodes from a pool of at most one):
    // the operation fails with the pool's reason, the cluster is in Error.
    let op = env
        .create_cluster(json!({"name": "s", "package": {"name": "onbig", "version": "1.0.0"},
            "roles": {"svc": {"count": 2, "node_labels": {"class": "small"}}}}))
        .await;
    let failed = env.wait_op(op["id"].as_str().unwrap()).await;
    assert_eq!(failed["status"], "Failed", "{failed:#}");
    let error = failed["error"].as_str().unwrap_or("");
    assert!(
        error.contains("every pool declined it") && error.contains("needs 2 nodes, the pool holds at most 1"),
        "the pools' reasons in the operation's error: {failed:#}"
    );
    assert_eq!(failed["node_requests"][0]["state"], "failed", "{failed:#}");
    let c = env.cluster("s").await;
    assert_eq!(c["status"], "Error", "{c:#}");
    assert!(c["status_description"].as_str().unwrap_or("").contains("needs 2 nodes"), "{c:#}");

    let (_, s) = env.post_empty("/clusters/w/stop").await;
    env.wait_op(s["operation"]["id"].as_str().unwrap()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_restarted_while_an_operation_waits_for_nodes_finishes_it_with_one_request() {
    let space = Space::new();
    let config = pool(&space, "rw", "");
    let mut env = TestEnv::start_with_config("pools-place-restart", &FAST, &config, 0).await;
    let space = space;
    env.upload(&PackageBuilder::sleeper("rw")).await;
    // Creates that take 3 s: the master is killed while the request is served.
    faults(&env, "rw", json!({"create_delay_before": 3000})).await;
    let op = env
        .create_cluster(json!({"name": "r", "package": {"name": "rw", "version": "1.0.0"},
            "roles": {"svc": {"count": 1}}}))
        .await;
    let id = op["id"].as_str().unwrap().to_string();
    env.until(20, "the request pending", async || {
        let op = op_now(&env, &id).await;
        if op["node_requests"][0]["state"] == "pending" { Ok(()) } else { Err(op.to_string()) }
    })
    .await;
    env.kill_master();
    env.start_master_again().await;
    let done = env.wait_op(&id).await;
    env.assert_succeeded(&done);
    let (_, page) = env.get("/node-requests?limit=1000").await;
    let mine: Vec<&Value> = page["node_requests"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["requestor"].as_str().is_some_and(|q| q.starts_with(&format!("operation:{id}/"))))
        .collect();
    assert_eq!(mine.len(), 1, "one request, found again after the restart: {page:#}");
    assert_eq!(mine[0]["state"], "fulfilled", "{page:#}");
    let c = env.cluster("r").await;
    let svc = role_instances(&c, "svc");
    assert_eq!((svc.len(), svc[0]["status"].as_str()), (1, Some("Running")), "{c:#}");
    assert_eq!(svc[0]["node"], mine[0]["nodes"][0], "on the node its request got: {c:#}");
    assert_eq!(space.namespaces().len(), 1, "one machine made: {:?}", space.namespaces());
    let (_, s) = env.post_empty("/clusters/r/stop").await;
    env.wait_op(s["operation"]["id"].as_str().unwrap()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_down_past_replace_after_is_repaired_unless_too_much_of_the_pool_is_down() {
    let space = Space::new();
    let config = pool(&space, "rp", "labels = { tier = \"p\" }\nmax_nodes = 6\nreplace_after = \"2s\"");
    let mut envs: Vec<(&str, &str)> = FAST.to_vec();
    envs.extend([("FLOTILLA_MASTER_NODE_UNKNOWN_AFTER", "3s"), ("FLOTILLA_MASTER_NODE_DOWN_AFTER", "4s")]);
    let env = TestEnv::start_with_config("pools-repair", &envs, &config, 0).await;
    let space = space;
    let id = request(&env, json!({"tier": "p"}), 5).await;
    let done = until_request(&env, &id, "fulfilled", 90).await;
    let nodes: Vec<String> =
        done["nodes"].as_array().unwrap().iter().map(|n| n.as_str().unwrap().to_string()).collect();
    env.upload(&PackageBuilder::sleeper("rpp")).await;
    let c = env
        .create_active(json!({"name": "r", "package": {"name": "rpp", "version": "1.0.0"},
            "roles": {"svc": {"count": 1, "nodes": [nodes[0]]}}}))
        .await;
    let member = role_instances(&c, "svc")[0].clone();

    // The machine's agent dies (the member's process lives on): the node
    // goes Down, and 2 s later (1 of 5 Down: a fifth, not more) it is
    // repaired: its member replaced elsewhere, the machine deleted.
    let kill = |node: &str| {
        let ns = std::fs::read_dir("/run/netns")
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().to_string())
            .find(|ns| {
                space.namespaces().contains(ns)
                    && agents_in(ns).iter().any(|p| {
                        std::fs::read(format!("/proc/{p}/cmdline"))
                            .is_ok_and(|c| String::from_utf8_lossy(&c).contains(node))
                    })
            })
            .unwrap_or_else(|| panic!("the namespace of {node}"));
        for p in agents_in(&ns) {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(p), nix::sys::signal::Signal::SIGKILL);
        }
    };
    kill(&nodes[0]);
    env.until(90, "the Down node repaired", async || {
        let (status, _) = env.get(&format!("/nodes/{}", nodes[0])).await;
        let svc = role_instances(&env.cluster("r").await, "svc");
        let moved = svc.len() == 1 && svc[0]["node"] != nodes[0].as_str() && svc[0]["status"] == "Running";
        if status == 404 && moved && space.namespaces().len() == 4 { Ok(()) } else { Err(format!("{status} {svc:?}")) }
    })
    .await;
    let (_, ops) = env.get("/operations?cluster=r").await;
    let replace = ops["operations"].as_array().unwrap().iter().find(|o| o["kind"] == "Replace").cloned().unwrap();
    assert_eq!(replace["status"], "Succeeded", "{replace:#}");
    assert_eq!(
        (replace["params"]["instance"].as_str(), replace["params"]["node_down"].as_bool()),
        (member["id"].as_str(), Some(true)),
        "{replace:#}"
    );
    let old_pid = pid_of(&member);
    env.until(10, "the old member gone with its machine", async || {
        if crate::common::pid_alive(old_pid) { Err(format!("{old_pid} runs")) } else { Ok(()) }
    })
    .await;
    let mut sse = crate::common::sse::SseReader::open(&env.client, &env.api, "?after=0&kind=node.draining", None).await;
    let seen = sse.until(std::time::Duration::from_secs(5), |e| e.kind == "node.draining").await;
    let draining = seen.iter().find(|e| e.kind == "node.draining").expect("a node.draining event");
    assert!(draining.data["data"]["reason"].as_str().unwrap_or("").contains("replace_after"), "{:?}", draining.data);

    // Two of the four left Down (more than a fifth): nothing is replaced,
    // and the pool says why.
    kill(&nodes[1]);
    kill(&nodes[2]);
    env.until(30, "the repair held", async || {
        let p = pool_of(&env, "rp").await;
        if p["health_detail"]["last_error"].as_str().unwrap_or("").contains("repair held") {
            Ok(p)
        } else {
            Err(p.to_string())
        }
    })
    .await;
    tokio::time::sleep(std::time::Duration::from_secs(4)).await;
    for node in &nodes[1..3] {
        let (status, n) = env.get(&format!("/nodes/{node}")).await;
        assert_eq!(
            (status.as_u16(), n["lifecycle"].as_str(), n["status"].as_str()),
            (200, Some("ready"), Some("Down")),
            "{n:#}"
        );
    }
    let (_, s) = env.post_empty("/clusters/r/stop").await;
    env.wait_op(s["operation"]["id"].as_str().unwrap()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operation_that_gives_up_waiting_for_nodes_cancels_its_request() {
    let space = Space::new();
    let config =
        pool(&space, "full", "max_nodes = 1\nlaunch_timeout = \"1s\"\nenroll_timeout = \"1s\"\nlaunch_retries = 0");
    // The step's allowance: 3 s + 30 s, plus the pool's 2 s of tries.
    let mut envs: Vec<(&str, &str)> = FAST.to_vec();
    envs.push(("FLOTILLA_MASTER_AGENT_REPLY_TIMEOUT", "3s"));
    let env = TestEnv::start_with_config("pools-cancel", &envs, &config, 0).await;
    let _space = space;
    // The pool's one node, taken out of placement: a new instance needs
    // another, which the pool has no room for: its request waits, and
    // nothing of it changes.
    let first = request(&env, json!({}), 1).await;
    let served = until_request(&env, &first, "fulfilled", 60).await;
    let node = served["nodes"][0].as_str().unwrap().to_string();
    let (status, v) = env.post(&format!("/nodes/{node}/cordon"), json!({"reason": "kept out"})).await;
    assert_eq!(status.as_u16(), 200, "{v:#}");
    env.upload(&PackageBuilder::sleeper("cc")).await;
    let op = env
        .create_cluster(
            json!({"name": "c", "package": {"name": "cc", "version": "1.0.0"}, "roles": {"svc": {"count": 1}}}),
        )
        .await;
    let id = op["id"].as_str().unwrap().to_string();
    let done = env.wait_op(&id).await;
    assert_eq!(done["status"], "Failed", "{done:#}");
    let error = done["error"].as_str().unwrap_or("");
    assert!(error.contains("await-nodes-svc") && error.contains("no progress"), "the watchdog named: {done:#}");
    // Its request is cancelled: the pool launches nothing for it later.
    let request = done["node_requests"][0]["id"].as_str().expect("the request it filed").to_string();
    let r = until_request(&env, &request, "failed", 10).await;
    let reasons = r["reasons"].as_array().unwrap();
    assert!(
        reasons.iter().any(|x| x.as_str().unwrap_or("").contains(&format!("cancelled: operation {id} ended Failed"))),
        "{r:#}"
    );
    assert_eq!(env.cluster("c").await["status"], "Error");
}
