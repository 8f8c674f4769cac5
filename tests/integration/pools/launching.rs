//! Serving node requests: launches, declines, retries, adoption, leaks,
//! holds, min-ready, removal, restarts.

use std::time::Duration;

use serde_json::{Value, json};

use super::support::*;
use crate::common::sse::SseReader;
use crate::common::{PackageBuilder, TestEnv, error_code, id_of, pid_of, role_instances};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_launches_real_agents_that_enroll_and_take_a_cluster_placed_by_label() {
    let space = Space::new();
    // At most 3 nodes by its cores (6, at 2 a node), not by max_nodes.
    let config = pool(&space, "big", "labels = { class = \"big\" }\nmax_nodes = 5\nmax_cpu = 6\nnode_cpu = 2");
    let env = TestEnv::start_with_config("pools-serve", &FAST, &config, 1).await;
    // Rebound: dropped before `env`, so the pool's agents stop first.
    let space = space;

    // Labels no pool offers: refused at once, naming them and what is offered.
    let (status, v) = env.post("/node-requests", json!({"labels": {"class": "huge"}, "count": 1})).await;
    assert_eq!((status.as_u16(), error_code(&v)), (409, "no_pool_offers"), "{v:#}");
    assert!(v["error"]["message"].as_str().unwrap_or("").contains("class=huge"), "{v:#}");

    let id = request(&env, json!({"class": "big"}), 2).await;
    let done = until_request(&env, &id, "fulfilled", 90).await;
    assert_eq!(done["pool"], "big", "{done:#}");
    let nodes: Vec<String> =
        done["nodes"].as_array().unwrap().iter().map(|n| n.as_str().unwrap().to_string()).collect();
    assert_eq!(nodes.len(), 2, "{done:#}");
    assert_eq!(space.namespaces().len(), 2, "one namespace per node");
    for node in &nodes {
        let (_, n) = env.get(&format!("/nodes/{node}")).await;
        assert_eq!(n["status"], "Ready", "{n:#}");
        assert_eq!(n["labels"]["class"], "big", "the pool's labels: {n:#}");
        assert_eq!(
            (n["origin"]["kind"].as_str(), n["origin"]["pool"].as_str()),
            (Some("provider"), Some("big")),
            "{n:#}"
        );
        assert_eq!(n["lifecycle"], "ready", "{n:#}");
        // Enrolled with a token bound to its id, now spent.
        assert_eq!(n["certificate"]["node"], node.as_str(), "{n:#}");
        let ns = n["origin"]["external_id"].as_str().expect("external id").to_string();
        let agents = agents_in(&ns);
        assert_eq!(agents.len(), 1, "one agent in {ns}");
        let cmdline =
            String::from_utf8_lossy(&std::fs::read(format!("/proc/{}/cmdline", agents[0])).unwrap()).replace('\0', " ");
        assert!(cmdline.contains(&format!("--node-id {node}")), "{cmdline}");
        assert!(!cmdline.contains("flj_") && !cmdline.contains("join"), "no token on the command line: {cmdline}");
    }
    let (_, tokens) = env.get("/join-tokens").await;
    let bound: Vec<&Value> =
        tokens["join_tokens"].as_array().unwrap().iter().filter(|t| !t["node"].is_null()).collect();
    assert!(bound.is_empty(), "each launch's token was used up: {tokens:#}");
    let p = pool_of(&env, "big").await;
    assert_eq!((p["nodes_by_state"]["ready"].as_u64(), p["health"].as_str()), (Some(2), Some("ok")), "{p:#}");
    assert!(p["tags"]["flotilla-master"].as_str().is_some_and(|t| t.len() == 16), "{p:#}");

    // A cluster that needs the label lands on the launched nodes and runs
    // inside their namespaces.
    env.upload(&PackageBuilder::sleeper("onbig")).await;
    let c = env
        .create_active(json!({"name": "b", "package": {"name": "onbig", "version": "1.0.0"},
            "roles": {"svc": {"count": 2, "node_labels": {"class": "big"}}}}))
        .await;
    for i in role_instances(&c, "svc") {
        assert!(nodes.contains(&i["node"].as_str().unwrap().to_string()), "{i:#}");
        let ns = request_node_ns(&env, i["node"].as_str().unwrap()).await;
        let inode =
            std::fs::metadata(format!("/run/netns/{ns}")).map(|m| std::os::unix::fs::MetadataExt::ino(&m)).unwrap();
        assert!(pids_in(inode).contains(&(pid_of(&i) as i32)), "{} runs in {ns}", id_of(&i));
    }

    // More than the pool may ever hold: declined, and failed with the reason.
    let id = request(&env, json!({"class": "big"}), 4).await;
    let failed = until_request(&env, &id, "failed", 10).await;
    assert_eq!(failed["declined_by"], json!(["big"]), "{failed:#}");
    assert!(failed["reasons"][0].as_str().unwrap().contains("needs 4 nodes, the pool holds at most 3"), "{failed:#}");
    assert!(failed["reasons"][0].as_str().unwrap().contains("(max_cpu 6 at 2 cores a node)"), "{failed:#}");
    let p = pool_of(&env, "big").await;
    assert_eq!((p["capacity"].as_u64(), p["max_nodes"].as_u64()), (Some(3), Some(5)), "{p:#}");
    // A log per host is the static driver's: a local pool keeps none.
    let (status, v) = env.get("/pools/big/hosts/10.1.2.3:22/log").await;
    assert_eq!((status.as_u16(), error_code(&v)), (409, "no_host_log"), "{v:#}");
    let (status, v) = env.get("/pools/nope/hosts/10.1.2.3:22/log").await;
    assert_eq!((status.as_u16(), error_code(&v)), (404, "not_found"), "{v:#}");

    // SIGUSR2 dumps every pool with the actors.
    env.signal_master(nix::sys::signal::Signal::SIGUSR2);
    env.until(10, "the pools in the dump", async || {
        let log = env.master_log();
        if log.contains("pool big (local): ok, 2 of at most 3 nodes") { Ok(()) } else { Err("not yet".into()) }
    })
    .await;

    // The CLI shows the same.
    let table = cli(&env, &["pool", "ls"]);
    assert!(
        table.starts_with("POOL") && table.contains("big") && table.contains("2 ready") && table.contains("ok"),
        "{table}"
    );
    let table = cli(&env, &["node", "request", "ls"]);
    assert!(table.contains(&id) && table.contains("failed") && table.contains("needs 4 nodes"), "{table}");
    let table = cli(&env, &["node", "ls"]);
    assert!(table.contains("pool big (ready)") && table.contains("manual"), "{table}");
    let out = cli(&env, &["node", "hold", &nodes[0], "--for", "1h"]);
    assert!(out.contains(&format!("node {} held until", nodes[0])), "{out}");
    let out = cli(&env, &["node", "hold", &nodes[0], "--release"]);
    assert!(out.contains("released"), "{out}");
    let (status, v) = env.post("/nodes/node-1/hold", json!({})).await;
    assert_eq!((status.as_u16(), error_code(&v)), (404, "not_found"), "a manual node cannot be held: {v:#}");

    let (_, s) = env.post_empty("/clusters/b/stop").await;
    env.wait_op(s["operation"]["id"].as_str().unwrap()).await;
    let mut sse = SseReader::open(&env.client, &env.api, "?after=0", None).await;
    let seen = sse.until(Duration::from_secs(10), |e| e.kind == "node_request.failed").await;
    let kinds: Vec<&str> = seen.iter().map(|e| e.kind.as_str()).collect();
    for k in [
        "node_request.requested",
        "node_request.pending",
        "node.launching",
        "node.enrolling",
        "node.ready",
        "node_request.fulfilled",
        "node_request.declined",
    ] {
        assert!(kinds.contains(&k), "event {k}: {kinds:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declining_pool_passes_the_request_on_and_it_fails_when_every_pool_declined() {
    let (sa, sb) = (Space::new(), Space::new());
    let config = format!(
        "{}\n{}",
        pool(&sa, "first", "labels = { class = \"x\" }\npriority = 10"),
        pool(&sb, "second", "labels = { class = \"x\" }\npriority = 20")
    );
    let env = TestEnv::start_with_config("pools-decline", &FAST, &config, 0).await;
    let (sa, sb) = (sa, sb);
    // The first pool's provider makes the machine, then says it had no
    // capacity: the launcher finds it by its tag and deletes it.
    faults(&env, "first", json!({"create_errors_after": ["capacity"]})).await;
    let id = request(&env, json!({"class": "x"}), 1).await;
    let done = until_request(&env, &id, "fulfilled", 90).await;
    assert_eq!(done["pool"], "second", "{done:#}");
    assert_eq!(done["declined_by"], json!(["first"]), "{done:#}");
    assert!(done["reasons"][0].as_str().unwrap().contains("capacity"), "{done:#}");
    env.until(30, "the declined try unwound", async || {
        if sa.namespaces().is_empty() { Ok(()) } else { Err(format!("{:?}", sa.namespaces())) }
    })
    .await;
    assert_eq!(sb.namespaces().len(), 1);
    assert_eq!(pool_of(&env, "first").await["health"], "no_capacity");

    // The first pool still remembers its capacity error; the second's
    // settings break: the next request is declined by both and fails.
    faults(&env, "second", json!({"create_errors": ["config"]})).await;
    let id = request(&env, json!({"class": "x"}), 1).await;
    let failed = until_request(&env, &id, "failed", 30).await;
    assert_eq!(failed["declined_by"], json!(["first", "second"]), "{failed:#}");
    assert!(failed["reasons"][1].as_str().unwrap().contains("config"), "{failed:#}");
    assert_eq!(pool_of(&env, "second").await["health"], "broken");
    assert_eq!(sb.namespaces().len(), 1, "the failed try left nothing; the first node stays");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_try_that_fails_is_unwound_and_retried_and_past_its_retries_the_pool_is_unhealthy() {
    let space = Space::new();
    let config = pool(&space, "r", "enroll_timeout = \"4s\"\nlaunch_retries = 1");
    let env = TestEnv::start_with_config("pools-retry", &FAST, &config, 0).await;
    let space = space;

    // One transient error: tried again, served.
    faults(&env, "r", json!({"create_errors": ["transient"]})).await;
    let id = request(&env, json!({}), 1).await;
    let done = until_request(&env, &id, "fulfilled", 90).await;
    let node = done["nodes"][0].as_str().unwrap().to_string();
    let p = pool_of(&env, "r").await;
    let n = p["nodes"].as_array().unwrap().iter().find(|n| n["node"] == node.as_str()).cloned().unwrap();
    assert_eq!(n["attempt"], 2, "its second try: {n:#}");

    // Agents that never enroll (they dial a port nobody listens on): each try times out, is
    // unwound (namespace, agent, token gone), and the second fails the request.
    faults(&env, "r", json!({"unreachable_master": true})).await;
    let id = request(&env, json!({}), 1).await;
    let failed = until_request(&env, &id, "failed", 120).await;
    assert!(failed["reasons"][0].as_str().unwrap().contains("did not say hello within enroll_timeout"), "{failed:#}");
    assert!(failed["reasons"][0].as_str().unwrap().contains("after 2 tries"), "{failed:#}");
    let p = env
        .until(30, "the failed node unwound", async || {
            let p = pool_of(&env, "r").await;
            if p["nodes"].as_array().is_some_and(|a| a.len() == 1) { Ok(p) } else { Err(p.to_string()) }
        })
        .await;
    assert_eq!(p["health"], "unhealthy", "{p:#}");
    assert_eq!(space.namespaces().len(), 1, "only the served node's namespace is left: {:?}", space.namespaces());
    let (_, tokens) = env.get("/join-tokens").await;
    assert!(
        tokens["join_tokens"].as_array().unwrap().iter().all(|t| t["node"].is_null()),
        "no launch token is left: {tokens:#}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_killed_during_a_create_adopts_what_it_made() {
    let space = Space::new();
    let config = pool(&space, "adopt", "");
    let mut env = TestEnv::start_with_config("pools-adopt", &FAST, &config, 0).await;
    let space = space;
    // The driver makes the namespace and its agent, then answers 30 s later.
    faults(&env, "adopt", json!({"create_delay_after": 30_000, "unreachable_master": true})).await;
    let id = request(&env, json!({}), 1).await;
    // The machine made, its agent started (a namespace alone is a create
    // cut half-way: unwound at the restart, not adopted).
    env.until(30, "the namespace made and its agent running", async || {
        let made = space.namespaces();
        if made.len() == 1 && made.iter().all(|ns| !agents_in(ns).is_empty()) {
            Ok(())
        } else {
            Err(format!("{made:?}"))
        }
    })
    .await;
    let made = space.namespaces();
    env.kill_master();
    env.start_master_again().await;
    // Its node is found by its tag and adopted, not launched again. (Its
    // agent dials nowhere, so it is unwound and retried later: what
    // is checked is the adoption itself.)
    let mut sse = SseReader::open(&env.client, &env.api, "?after=0&kind=node.adopted", None).await;
    let adopted = sse.until(Duration::from_secs(20), |e| e.kind == "node.adopted").await;
    let a = adopted.last().expect("a node.adopted event");
    assert_eq!(a.data["data"]["external_id"].as_str(), made.iter().next().map(|s| s.as_str()), "{a:?}");
    let r = request_of(&env, &id).await;
    assert_eq!(r["state"], "pending", "{r:#}");
    assert_eq!(space.namespaces(), made, "no second resource for the node");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leaked_resources_go_after_two_passes_and_the_grace_never_another_installations() {
    let space = Space::new();
    let config = pool(&space, "lk", "");
    let slow_grace = [
        ("FLOTILLA_MASTER_TEST_HOOKS", "true"),
        ("FLOTILLA_MASTER_POOL_CLEANUP_INTERVAL", "1s"),
        ("FLOTILLA_MASTER_POOL_LEAK_GRACE", "3s"),
    ];
    let env = TestEnv::start_with_config("pools-leak", &slow_grace, &config, 0).await;
    let space = space;
    let master = pool_of(&env, "lk").await["tags"]["flotilla-master"].as_str().expect("master tag").to_string();
    let dir = env.master_dir().with_file_name("master-pools").join("lk");
    // Three namespaces of the pool's prefix nobody recorded: one tagged as
    // ours, one tagged by another installation, one without tags.
    let mut sse = SseReader::open(&env.client, &env.api, "?after=0&kind=node.leak_found,node.leak_removed", None).await;
    let ours = make_ns(
        &space,
        50,
        &dir,
        Some(json!({"flotilla-master": master, "flotilla-pool": "lk", "flotilla-node": "ghost"})),
    );
    let theirs = make_ns(
        &space,
        51,
        &dir,
        Some(json!({"flotilla-master": "0000000000000000", "flotilla-pool": "lk", "flotilla-node": "x"})),
    );
    let untagged = make_ns(&space, 52, &dir, None);
    let found = sse.until(Duration::from_secs(10), |e| e.kind == "node.leak_found").await;
    let found_at = std::time::Instant::now();
    assert_eq!(found.last().map(|e| e.data["data"]["external_id"].clone()), Some(json!(ours)), "{found:?}");
    // Listings fail for the next three passes: the run of sightings is
    // broken, so the count starts over (a deletion at the first good pass
    // would trust a sighting from before the failures).
    faults(&env, "lk", json!({"list_errors": 3})).await;
    tokio::time::sleep(Duration::from_millis(4600).saturating_sub(found_at.elapsed())).await;
    assert!(space.namespaces().contains(&ours), "deleted right after failed listings: the sightings were not reset");
    let seen = sse.until(Duration::from_secs(20), |e| e.kind == "node.leak_removed").await;
    assert!(seen.iter().all(|e| e.data["data"]["external_id"] == ours.as_str()), "{seen:?}");
    assert!(found_at.elapsed() >= Duration::from_secs(6), "removed {:?} after it was found", found_at.elapsed());
    env.until(10, "the leaked namespace deleted", async || {
        if space.namespaces().contains(&ours) { Err("still there".into()) } else { Ok(()) }
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let left = space.namespaces();
    assert!(
        left.contains(&theirs) && left.contains(&untagged),
        "never another installation's or an untagged one: {left:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_failed_launch_keeps_its_machine_until_released() {
    let space = Space::new();
    let config = pool(&space, "h", "enroll_timeout = \"3s\"\nlaunch_retries = 0");
    let env = TestEnv::start_with_config("pools-hold", &FAST, &config, 0).await;
    let space = space;
    faults(&env, "h", json!({"unreachable_master": true})).await;
    let id = request(&env, json!({}), 1).await;
    let node = env
        .until(30, "a node enrolling", async || {
            let p = pool_of(&env, "h").await;
            match p["nodes"].as_array().and_then(|a| a.first()) {
                Some(n) if n["state"] == "enrolling" => Ok(n["node"].as_str().unwrap().to_string()),
                _ => Err(p.to_string()),
            }
        })
        .await;
    let (status, held) = env.post(&format!("/nodes/{node}/hold"), json!({"for": "1h"})).await;
    assert_eq!(status, 200, "{held:#}");
    let failed = until_request(&env, &id, "failed", 30).await;
    assert!(failed["reasons"][0].as_str().unwrap().contains("enroll_timeout"), "{failed:#}");
    let p = env
        .until(10, "the node failed and kept", async || {
            let p = pool_of(&env, "h").await;
            if p["nodes"][0]["state"] == "failed" { Ok(p) } else { Err(p.to_string()) }
        })
        .await;
    assert_eq!(p["nodes"][0]["node"], node.as_str(), "{p:#}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(space.namespaces().len(), 1, "a held node's machine stays for debugging");
    let (status, _) = env.post(&format!("/nodes/{node}/hold"), json!({"release": true})).await;
    assert_eq!(status, 200);
    env.until(30, "released: unwound and gone", async || {
        let p = pool_of(&env, "h").await;
        if space.namespaces().is_empty() && p["nodes"].as_array().is_some_and(|a| a.is_empty()) {
            Ok(())
        } else {
            Err(p.to_string())
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_ready_keeps_a_spare_and_a_request_at_quota_waits() {
    let space = Space::new();
    let config = pool(&space, "spare", "min_ready = 1\nmax_nodes = 1\nlabels = { tier = \"s\" }");
    let env = TestEnv::start_with_config("pools-spare", &FAST, &config, 0).await;
    let space = space;
    let p = env
        .until(90, "a spare ready", async || {
            let p = pool_of(&env, "spare").await;
            if p["nodes_by_state"]["ready"] == 1 { Ok(p) } else { Err(p.to_string()) }
        })
        .await;
    let spare = p["nodes"][0]["node"].as_str().unwrap().to_string();
    // A cluster takes the spare: the pool is at max_nodes, so no request
    // for the next spare is filed, and a request waits (not failed).
    env.upload(&PackageBuilder::sleeper("sp")).await;
    let c = env
        .create_active(json!({"name": "s", "package": {"name": "sp", "version": "1.0.0"},
        "roles": {"svc": {"count": 1, "node_labels": {"tier": "s"}}}}))
        .await;
    assert_eq!(role_instances(&c, "svc")[0]["node"], spare.as_str());
    tokio::time::sleep(Duration::from_secs(2)).await;
    let id = request(&env, json!({"tier": "s"}), 1).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let r = request_of(&env, &id).await;
    assert_eq!(
        (r["state"].as_str(), r["declined_by"].as_array().map(|a| a.len())),
        (Some("requested"), Some(0)),
        "{r:#}"
    );
    let (_, page) = env.get("/node-requests").await;
    let open_min_ready = page["node_requests"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["requestor"] == "min-ready:spare" && r["state"] != "fulfilled")
        .count();
    assert_eq!(open_min_ready, 0, "{page:#}");
    assert_eq!(space.namespaces().len(), 1, "nothing launched past max_nodes");
    let (_, s) = env.post_empty("/clusters/s/stop").await;
    env.wait_op(s["operation"]["id"].as_str().unwrap()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removal_drains_the_node_moves_its_members_off_then_deletes_it() {
    let space = Space::new();
    let config = pool(&space, "rm", "labels = { tier = \"r\" }\nmax_disrupting = 1");
    let env = TestEnv::start_with_config("pools-remove", &FAST, &config, 0).await;
    let space = space;
    let id = request(&env, json!({"tier": "r"}), 3).await;
    let done = until_request(&env, &id, "fulfilled", 90).await;
    let nodes: Vec<String> =
        done["nodes"].as_array().unwrap().iter().map(|n| n.as_str().unwrap().to_string()).collect();
    env.upload(&PackageBuilder::sleeper("rmp")).await;
    let c = env
        .create_active(json!({"name": "r", "package": {"name": "rmp", "version": "1.0.0"},
            "roles": {"svc": {"count": 1, "nodes": [nodes[0]]}}}))
        .await;
    let first = role_instances(&c, "svc")[0].clone();

    // An empty one: journaled (draining, cordoned), then deleted and forgotten.
    let out = cli(&env, &["node", "remove", &nodes[1]]);
    assert!(out.contains("draining"), "{out}");
    let (_, n) = env.get(&format!("/nodes/{}", nodes[1])).await;
    assert_eq!(n["lifecycle"], "draining", "{n:#}");
    assert!(n["cordon"]["reason"].as_str().unwrap_or("").contains("being removed"), "{n:#}");
    // A second removal while one is under way: the budget (max_disrupting = 1).
    let (status, v) = env.post_empty(&format!("/nodes/{}/remove", nodes[2])).await;
    assert_eq!((status.as_u16(), error_code(&v)), (409, "disruption_budget"), "{v:#}");
    // Its cordon cannot be lifted while it is removed.
    let (status, v) = env.post_empty(&format!("/nodes/{}/uncordon", nodes[1])).await;
    assert_eq!((status.as_u16(), error_code(&v)), (409, "node_being_removed"), "{v:#}");
    env.until(60, "the removed node gone", async || {
        let (status, n) = env.get(&format!("/nodes/{}", nodes[1])).await;
        if status == 404 && space.namespaces().len() == 2 { Ok(()) } else { Err(n.to_string()) }
    })
    .await;

    // One holding a member: the member is moved (the cluster's replace)
    // to the other node, then the node is deleted.
    let (status, v) = env.post_empty(&format!("/nodes/{}/remove", nodes[0])).await;
    assert_eq!(status.as_u16(), 202, "{v:#}");
    env.until(90, "the member moved and its node gone", async || {
        let (status, _) = env.get(&format!("/nodes/{}", nodes[0])).await;
        let c = env.cluster("r").await;
        let svc = role_instances(&c, "svc");
        let moved = svc.len() == 1 && svc[0]["node"] == nodes[2].as_str() && svc[0]["status"] == "Running";
        if status == 404 && moved && space.namespaces().len() == 1 { Ok(()) } else { Err(format!("{status} {c}")) }
    })
    .await;
    let (_, ops) = env.get("/operations?cluster=r").await;
    let replace = ops["operations"].as_array().unwrap().iter().find(|o| o["kind"] == "Replace").cloned().unwrap();
    assert_eq!(
        (replace["status"].as_str(), replace["params"]["instance"].as_str()),
        (Some("Succeeded"), first["id"].as_str()),
        "{replace:#}"
    );
    let c = env.cluster("r").await;
    let moved = role_instances(&c, "svc")[0].clone();
    let ns = request_node_ns(&env, moved["node"].as_str().unwrap()).await;
    let inode = std::fs::metadata(format!("/run/netns/{ns}")).map(|m| std::os::unix::fs::MetadataExt::ino(&m)).unwrap();
    assert!(pids_in(inode).contains(&(pid_of(&moved) as i32)), "{} runs in {ns}", id_of(&moved));

    // A member that cannot be moved (its cluster stopped): the node is put
    // back, ready and uncordoned, with the reason.
    let (_, s) = env.post_empty("/clusters/r/stop").await;
    env.wait_op(s["operation"]["id"].as_str().unwrap()).await;
    let (status, v) = env.post_empty(&format!("/nodes/{}/remove", nodes[2])).await;
    assert_eq!(status.as_u16(), 202, "{v:#}");
    let back = env
        .until(30, "the node put back", async || {
            let (_, n) = env.get(&format!("/nodes/{}", nodes[2])).await;
            if n["lifecycle"] == "ready" && n["cordon"].is_null() { Ok(n) } else { Err(n.to_string()) }
        })
        .await;
    let p = pool_of(&env, "rm").await;
    let why = p["nodes"].as_array().unwrap().iter().find(|x| x["node"] == nodes[2].as_str()).cloned().unwrap();
    assert!(why["last_error"].as_str().unwrap_or("").contains("moving"), "{why:#}\n{back:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_node_beyond_min_ready_is_given_back_and_an_old_spare_replaced() {
    let (space, aged, keep) = (Space::new(), Space::new(), Space::new());
    let config = format!(
        "{}\n{}\n{}",
        pool(&space, "idle", "labels = { k = \"i\" }\nidle_timeout = \"2s\"\nmin_ready = 1"),
        pool(&aged, "aged", "labels = { k = \"a\" }\nmin_ready = 1\nmax_ready_age = \"4s\""),
        pool(&keep, "keep", "labels = { k = \"d\", do-not-disrupt = \"true\" }\nidle_timeout = \"1s\"")
    );
    let env = TestEnv::start_with_config("pools-idle", &FAST, &config, 0).await;
    let (space, _aged, keep) = (space, aged, keep);
    // One node asked for beyond the pool's min_ready spare: once its
    // request is done and it sits empty past idle_timeout, one of the two
    // is given back, never the last.
    let id = request(&env, json!({"k": "i"}), 1).await;
    until_request(&env, &id, "fulfilled", 90).await;
    let ready = async || pool_of(&env, "idle").await["nodes_by_state"]["ready"].as_u64().unwrap_or(0);
    env.until(60, "two ready, then one given back", async || {
        let (n, ns) = (ready().await, space.namespaces().len());
        if n == 1 && ns == 1 { Ok(()) } else { Err(format!("{n} ready, {ns} namespaces")) }
    })
    .await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!((ready().await, space.namespaces().len()), (1, 1), "min_ready's spare is kept");
    // A node labelled do-not-disrupt is never given back.
    let id = request(&env, json!({"k": "d"}), 1).await;
    until_request(&env, &id, "fulfilled", 90).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let p = pool_of(&env, "keep").await;
    assert_eq!(p["nodes_by_state"]["ready"], 1, "{p:#}");
    assert_eq!(keep.namespaces().len(), 1);
    // The aged pool's spare is replaced once older than max_ready_age.
    let first = env
        .until(60, "a spare", async || {
            let p = pool_of(&env, "aged").await;
            match p["nodes"].as_array().and_then(|a| a.iter().find(|n| n["state"] == "ready")) {
                Some(n) => Ok(n["node"].as_str().unwrap().to_string()),
                None => Err(p.to_string()),
            }
        })
        .await;
    env.until(60, "a fresh spare in its place", async || {
        let p = pool_of(&env, "aged").await;
        let ready: Vec<&str> = p["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|n| n["state"] == "ready")
            .filter_map(|n| n["node"].as_str())
            .collect();
        if ready.len() == 1
            && ready[0] != first
            && !p["nodes"].as_array().unwrap().iter().any(|n| n["node"] == first.as_str())
        {
            Ok(())
        } else {
            Err(p.to_string())
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_in_flight_survive_a_master_restart_and_a_paused_pool_still_declines() {
    let space = Space::new();
    let config = pool(&space, "rs", "");
    let mut env = TestEnv::start_with_config("pools-restart", &FAST, &config, 0).await;
    let space = space;
    // Creates that take 3 s: the master is killed while both are in flight.
    faults(&env, "rs", json!({"create_delay_before": 3000})).await;
    let id = request(&env, json!({}), 2).await;
    env.until(10, "the request pending", async || {
        let r = request_of(&env, &id).await;
        if r["state"] == "pending" { Ok(()) } else { Err(r.to_string()) }
    })
    .await;
    env.kill_master();
    env.start_master_again().await;
    // The next master takes the request up from the store: fulfilled, each
    // node made once (the cut creates unwound and tried again).
    let done = until_request(&env, &id, "fulfilled", 90).await;
    assert_eq!(done["nodes"].as_array().map(|a| a.len()), Some(2), "{done:#}");
    assert_eq!(space.namespaces().len(), 2, "one machine per node: {:?}", space.namespaces());

    // A quota error pauses the pool (its third node refused by the
    // provider); a request it can never serve is still
    // declined at once (and fails, no other pool offering it), one it could
    // serve later waits.
    faults(&env, "rs", json!({"create_errors": ["quota"]})).await;
    let (_, s) = env.post("/node-requests", json!({"labels": {}, "count": 1})).await;
    let waiting = s["id"].as_str().unwrap().to_string();
    env.until(20, "the pool paused", async || {
        let p = pool_of(&env, "rs").await;
        if p["health"] == "paused" || p["health_detail"]["paused_until"].is_string() {
            Ok(())
        } else {
            Err(p.to_string())
        }
    })
    .await;
    let big = request(&env, json!({}), 4).await;
    let failed = until_request(&env, &big, "failed", 10).await;
    assert!(failed["reasons"][0].as_str().unwrap().contains("needs 4 nodes, the pool holds at most 3"), "{failed:#}");
    let r = request_of(&env, &waiting).await;
    assert_eq!(r["state"], "requested", "at quota, it waits: {r:#}");
}
