//! Leaked instances (issue 9), on the real system: an instance an agent
//! holds that the master does not know is listed in `GET /nodes/{id}`
//! (`leaked`), announced (`instance.leaked`), and removed from its node
//! after `leaked_grace` (`instance.leak_removed`); and the instances of a
//! create in flight are never taken for leaked.

use std::collections::BTreeSet;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use flotilla::ids::{ClusterId, InstanceId};
use flotilla::storage::{MasterStore, WriteOp};
use serde_json::{Value, json};

use crate::common::sse::SseReader;
use crate::common::{PackageBuilder, TestEnv, all_instances, dir_of, eventually, id_of, instance_pids, pid_of};

const GRACE: &str = "2s";

/// `GET /nodes/{node}`'s `leaked` list.
async fn leaked(env: &TestEnv, node: &str) -> Vec<Value> {
    let (status, n) = env.get(&format!("/nodes/{node}")).await;
    assert_eq!(status, 200, "GET /nodes/{node}: {n:#}");
    n["leaked"].as_array().cloned().unwrap_or_else(|| panic!("GET /nodes/{node} has no `leaked` list: {n:#}"))
}

fn unix(v: &Value) -> i64 {
    let s = v.as_str().unwrap_or_else(|| panic!("{v} is not a time"));
    time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|e| panic!("{s}: {e}"))
        .unix_timestamp()
}

/// Two leaks on node-1: an instance whose record the master lost (its
/// record deleted from the master's store, through flotilla's storage
/// API, with the master stopped: the agent still runs it), and an
/// instance directory the agent holds no record of either, with a process
/// carrying the instance's marker (what a lost agent store leaves). Both
/// are listed with the event at once; after the 2 s grace their processes
/// and directories are gone and the event says so; the cluster's other
/// instance is untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leaked_instance_is_listed_then_removed_after_the_grace() {
    let mut env = TestEnv::start_with("leaked", &[("FLOTILLA_MASTER_LEAKED_GRACE", GRACE)]).await;
    env.upload(&PackageBuilder::sleeper("lk")).await;
    let body = json!({"name": "lk", "package": {"name": "lk", "version": "1.0.0"},
        "roles": {"svc": {"count": 2, "nodes": ["node-1"]}}});
    let cluster = env.create_active(body).await;
    let cid: ClusterId = cluster["id"].as_str().expect("cluster id").parse().expect("a cluster id");
    let instances = all_instances(&cluster);
    let (victim, kept) = (&instances[0], &instances[1]);
    let (victim_id, victim_pid, victim_dir) = (id_of(victim), pid_of(victim), dir_of(victim));
    let (kept_id, kept_pid) = (id_of(kept), pid_of(kept));
    assert_eq!(instance_pids(&victim_id), vec![victim_pid]);

    // A directory with no record anywhere, and a process of it that left
    // its parent (reparented away from the test, as a daemon would be).
    let ghost = "lk-ghost-0-abcdef";
    let ghost_dir = env.agent_dir(1).join("instances").join(ghost);
    std::fs::create_dir_all(ghost_dir.join("data")).unwrap();
    std::fs::write(ghost_dir.join("data/note"), "left behind").unwrap();
    let status = Command::new("sh")
        .args(["-c", "sleep 100013 </dev/null >/dev/null 2>&1 &"])
        .current_dir(&ghost_dir)
        .env("FLOTILLA_INSTANCE", ghost)
        .stdin(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    assert!(eventually(5, || instance_pids(ghost).len() == 1).await, "the ghost's process runs");
    let ghost_pid = instance_pids(ghost)[0];

    // The master forgets the victim: its record deleted offline.
    env.kill_master();
    {
        let store = MasterStore::open(&env.master_dir().join("db")).expect("open the master's store");
        let op = WriteOp::delete_instance(&cid, &InstanceId::new(victim_id.clone()));
        store.writer().commit(vec![op]).await.expect("delete the victim's record");
    }
    env.start_master_again().await;
    let mut events = SseReader::open(&env.client, &env.api, "?after=0&kind=instance.leak*", None).await;

    // Listed, with when it was first seen and when it will be removed.
    let listed = env
        .until(10, "node-1 lists both leaks", async || {
            let l = leaked(&env, "node-1").await;
            let ids: BTreeSet<&str> = l.iter().filter_map(|e| e["instance"].as_str()).collect();
            if ids == BTreeSet::from([victim_id.as_str(), ghost]) { Ok(l) } else { Err(format!("{l:#?}")) }
        })
        .await;
    let seen_at = Instant::now();
    for e in &listed {
        let (first, remove) = (unix(&e["first_seen"]), unix(&e["remove_at"]));
        assert!((1..=3).contains(&(remove - first)), "removed 2 s after it was first seen: {e:#}");
        if e["instance"] == victim_id.as_str() {
            assert_eq!(e["running"], true, "{e:#}");
            assert_eq!(e["pid"], victim_pid, "{e:#}");
            assert_eq!(e["unrecorded"], false, "{e:#}");
        } else {
            assert_eq!(e["unrecorded"], true, "{e:#}");
        }
    }
    for n in ["node-2", "node-3"] {
        assert!(leaked(&env, n).await.is_empty(), "{n} holds nothing leaked");
    }
    let c = env.cluster("lk").await;
    assert_eq!(all_instances(&c).len(), 1, "the master knows only the kept instance: {c:#}");

    // After the grace: gone from the list, the node and /proc.
    env.until(10, "the leaks are removed", async || {
        let l = leaked(&env, "node-1").await;
        if l.is_empty() { Ok(()) } else { Err(format!("{l:#?}")) }
    })
    .await;
    assert!(seen_at.elapsed() >= Duration::from_millis(1000), "not removed before its grace");
    assert!(eventually(5, || instance_pids(&victim_id).is_empty()).await, "the victim's process is gone");
    assert!(eventually(5, || instance_pids(ghost).is_empty()).await, "the ghost's process {ghost_pid} is gone");
    assert!(!victim_dir.exists(), "{} is removed", victim_dir.display());
    assert!(!ghost_dir.exists(), "{} is removed", ghost_dir.display());

    let mut got = Vec::new();
    while got.len() < 4 {
        match events.next(Duration::from_secs(10)).await {
            Some(e) => got.push(e),
            None => panic!("4 leak events expected, got {got:#?}"),
        }
    }
    for id in [victim_id.as_str(), ghost] {
        let of = |kind: &str| got.iter().position(|e| e.kind == kind && e.data["data"]["instance"] == id);
        let leaked_at = of("instance.leaked").unwrap_or_else(|| panic!("no instance.leaked for {id}: {got:#?}"));
        let removed_at =
            of("instance.leak_removed").unwrap_or_else(|| panic!("no instance.leak_removed for {id}: {got:#?}"));
        assert!(leaked_at < removed_at, "{got:#?}");
        assert_eq!(got[removed_at].data["data"]["deleted"], true, "{got:#?}");
        assert_eq!(got[removed_at].data["data"]["node"], "node-1", "{got:#?}");
    }

    // The known instance is untouched.
    assert_eq!(instance_pids(&kept_id), vec![kept_pid], "the kept instance still runs, once");
    let c = env.cluster("lk").await;
    assert_eq!(c["status"], "Active", "{c:#}");
    assert_eq!(all_instances(&c)[0]["status"], "Running", "{c:#}");
}

/// A create of 60 instances over three nodes, with the master SIGKILLed
/// while it runs: the next master resumes the create while every agent
/// reconnects and sends its inventory (instances the create installed
/// moments before). No node ever lists one of them as leaked, no leak
/// event is written, and after more than the grace every instance still
/// has its one process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_in_flight_is_never_taken_for_leaked() {
    let mut env = TestEnv::start_with("leaked-create", &[("FLOTILLA_MASTER_LEAKED_GRACE", GRACE)]).await;
    let spec = "[component]\nname = \"lc\"\nversion = \"1.0.0\"\n\n[[roles]]\nname = \"svc\"\n\
        count = { min = 1, max = 100 }\nstart = [\"bin/start.sh\"]\nstop_grace = \"2s\"\n";
    let pkg =
        PackageBuilder::new("lc", "1.0.0").spec(spec).script("bin/start.sh", crate::common::scripts::RECORD_AND_SLEEP);
    env.upload(&pkg).await;
    let body = json!({"name": "lc", "package": {"name": "lc", "version": "1.0.0"}, "roles": {"svc": {"count": 60}}});
    let op = env.create_cluster(body).await;
    let op_id = op["id"].as_str().expect("op id").to_string();
    let nodes = ["node-1", "node-2", "node-3"];
    let mut looks = 0;

    // Let the create get under way (some instances installed), then kill.
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let installed = env.agent_instance_dirs().len();
        if installed >= 10 || Instant::now() > until {
            break;
        }
        for n in nodes {
            assert!(leaked(&env, n).await.is_empty(), "{n} lists a leak during the create");
            looks += 1;
        }
    }
    let (_, o) = env.get(&format!("/operations/{op_id}")).await;
    assert!(o["operation"]["ended_at"].is_null(), "the kill must come while the create runs: {o:#}");
    env.kill_master();
    env.start_master_again().await;

    // Until the create ends and a grace and a half after: never a leak.
    let mut ended_at: Option<Instant> = None;
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        for n in nodes {
            let (status, node) = env.get(&format!("/nodes/{n}")).await;
            if status == 200 {
                let l = node["leaked"].as_array().cloned().unwrap_or_default();
                assert!(l.is_empty(), "{n} lists instances of the create as leaked: {l:#?}");
                looks += 1;
            }
        }
        let (_, o) = env.get(&format!("/operations/{op_id}")).await;
        if ended_at.is_none() && o["operation"]["ended_at"].is_string() {
            ended_at = Some(Instant::now());
        }
        if ended_at.is_some_and(|t| t.elapsed() > Duration::from_secs(3)) {
            break;
        }
        assert!(Instant::now() < deadline, "the create did not end: {o:#}\n{}", env.log_tails());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(looks > 20, "looked {looks} times");
    let (_, o) = env.get(&format!("/operations/{op_id}")).await;
    env.assert_succeeded(&o["operation"]);

    let c = env.cluster("lc").await;
    assert_eq!(c["status"], "Active", "{c:#}");
    let all = all_instances(&c);
    assert_eq!(all.len(), 60);
    for i in &all {
        assert_eq!(i["status"], "Running", "{i:#}");
        assert_eq!(instance_pids(&id_of(i)), vec![pid_of(i)], "{}: exactly its one process", id_of(i));
        assert!(dir_of(i).exists(), "{}", dir_of(i).display());
    }
    assert_eq!(env.agent_instance_dirs().len(), 60, "no directory removed or left over");
    let mut events = SseReader::open(&env.client, &env.api, "?after=0&kind=instance.leak*", None).await;
    if let Some(e) = events.next(Duration::from_millis(500)).await {
        panic!("a leak event during a create: {e:#?}");
    }
}
