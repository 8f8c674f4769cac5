//! Faults of the master, injected for real (issue 9): SIGKILL (no
//! shutdown at all) while clients write, and a master down for longer
//! than the heartbeat timeout.
//!
//! Invariants checked: every request that got a 2xx is there after the
//! restart; every operation ends (resumed or unwound); at most one live
//! copy of each instance, and no process of an instance the master does
//! not show running; no mass `Down` or `Lost` because the master itself
//! was away.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common::procfs::pids_by_instance;
use crate::common::{PackageBuilder, TestEnv, all_instances, id_of, instance_pids, pid_of};

/// What one client request got: its kind, cluster, HTTP status (0: no
/// answer, the master died first) and operation id.
#[derive(Debug, Clone)]
struct Sent {
    kind: &'static str,
    cluster: String,
    status: u16,
    op: Option<String>,
}

/// Writer `w`: creates cluster `kmw{w}-{n}` (one instance), waits for the
/// create to end, sends a scale-out by one without waiting for it, and
/// goes on with the next cluster, until a request gets no answer.
async fn writer(client: reqwest::Client, api: String, w: usize, log: Arc<Mutex<Vec<Sent>>>) {
    let send = async |kind: &'static str, cluster: &str, url: String, body: Value| -> (u16, Option<String>) {
        let answer = client.post(&url).json(&body).timeout(Duration::from_secs(20)).send().await;
        let (status, op) = match answer {
            Ok(r) => {
                let status = r.status().as_u16();
                let v: Value = r.json().await.unwrap_or(Value::Null);
                (status, v["operation"]["id"].as_str().map(str::to_string))
            }
            Err(_) => (0, None),
        };
        log.lock().unwrap().push(Sent { kind, cluster: cluster.to_string(), status, op: op.clone() });
        (status, op)
    };
    for n in 0.. {
        let cluster = format!("kmw{w}-{n}");
        let body =
            json!({"name": cluster, "package": {"name": "kmw", "version": "1.0.0"}, "roles": {"svc": {"count": 1}}});
        let (status, op) = send("create", &cluster, format!("{api}/clusters"), body).await;
        if status == 0 {
            return;
        }
        if let Some(op) = op {
            let url = format!("{api}/operations/{op}?wait=10");
            if client.get(&url).timeout(Duration::from_secs(20)).send().await.is_err() {
                return;
            }
        }
        let url = format!("{api}/clusters/{cluster}/scale");
        if send("scale", &cluster, url, json!({"role": "svc", "add": 1})).await.0 == 0 {
            return;
        }
    }
}

/// The operation ids the master's log says it resumed ("resuming an
/// operation interrupted by a master restart operation=<id> ...").
pub fn resumed_operations(log: &str) -> BTreeSet<String> {
    log.lines()
        .filter(|l| l.contains("resuming an operation interrupted"))
        .map(|l| {
            let at = l.find("operation=").unwrap_or_else(|| panic!("no operation id in {l:?}"));
            l[at + "operation=".len()..].split_whitespace().next().unwrap_or_default().to_string()
        })
        .collect()
}

/// The master SIGKILLed while four clients create and scale clusters:
/// after its restart every 2xx is there (each acknowledged create's
/// cluster, each acknowledged operation), every operation ends, and the
/// processes on the agents match what the master says: exactly one per
/// running instance, none for any other, none unknown to the master.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn master_sigkilled_under_writes_loses_no_acknowledged_write() {
    let mut env = TestEnv::start("faults-master-kill9").await;
    env.upload(&PackageBuilder::sleeper("kmw")).await;

    let log = Arc::new(Mutex::new(Vec::new()));
    let writers: Vec<_> =
        (1..=4).map(|w| tokio::spawn(writer(env.client.clone(), env.api.clone(), w, log.clone()))).collect();
    // Let the load build up: some operations ended, some running.
    let loaded = crate::common::eventually(30, || {
        let log = log.lock().unwrap();
        let acked = |kind: &str| log.iter().filter(|s| s.kind == kind && (200..300).contains(&s.status)).count();
        acked("create") >= 8 && acked("scale") >= 6
    })
    .await;
    assert!(loaded, "fewer than 8 creates and 6 scales acknowledged in 30 s: {:?}", log.lock().unwrap());
    env.kill_master();
    let killed = Instant::now();
    for w in writers {
        w.await.expect("writer task");
    }
    env.start_master_again().await;
    let listening = killed.elapsed();
    env.wait_ready().await;

    let sent = log.lock().unwrap().clone();
    let acked: Vec<&Sent> = sent.iter().filter(|s| (200..300).contains(&s.status)).collect();
    let cut: Vec<&Sent> = sent.iter().filter(|s| s.status == 0).collect();
    let refused: Vec<&Sent> = sent.iter().filter(|s| s.status >= 300).collect();
    // Only a full queue may refuse (503 overloaded).
    assert!(refused.iter().all(|s| s.status == 503), "unexpected refusals: {refused:?}");
    let mut ended: BTreeMap<String, Value> = BTreeMap::new();
    for s in &acked {
        let op = s.op.as_deref().unwrap_or_else(|| panic!("a 2xx without an operation: {s:?}"));
        let (status, c) = env.get(&format!("/clusters/{}", s.cluster)).await;
        assert_eq!(status, 200, "{s:?} was acknowledged, its cluster is gone: {c:#}");
        let got = env.wait_op(op).await;
        assert_eq!(got["cluster"], s.cluster.as_str(), "{got:#}");
        ended.insert(op.to_string(), got);
    }
    let mut by_status: BTreeMap<String, usize> = BTreeMap::new();
    for op in ended.values() {
        *by_status.entry(op["status"].as_str().unwrap_or("?").to_string()).or_default() += 1;
    }

    // Every cluster of the load, acknowledged or not: settled, and its
    // processes are what the master says.
    let (_, list) = env.get("/clusters?limit=1000").await;
    let names: BTreeSet<String> = list["clusters"]
        .as_array()
        .expect("clusters")
        .iter()
        .filter_map(|c| c["name"].as_str().filter(|n| n.starts_with("kmw")).map(str::to_string))
        .collect();
    let mut known: BTreeSet<String> = BTreeSet::new();
    for name in &names {
        let c = env.cluster(name).await;
        assert!(c["operation"].is_null(), "{name} is still busy: {c:#}");
        if c["status"] == "Active" {
            assert!(all_instances(&c).iter().all(|i| i["status"] == "Running"), "{c:#}");
        } else {
            let why = c["status_description"].as_str().unwrap_or_default();
            assert!(!why.is_empty(), "{name} is {} without a reason: {c:#}", c["status"]);
        }
        for i in all_instances(&c) {
            let id = id_of(&i);
            let pids = instance_pids(&id);
            if i["status"] == "Running" {
                assert_eq!(pids, vec![pid_of(&i)], "{id}: exactly its one process: {i:#}");
            } else {
                assert!(pids.is_empty(), "{id} is {} yet runs {pids:?}", i["status"]);
            }
            known.insert(id);
        }
    }
    let strays: Vec<(String, Vec<u32>)> =
        pids_by_instance().into_iter().filter(|(id, _)| id.starts_with("kmw") && !known.contains(id)).collect();
    assert!(strays.is_empty(), "processes of instances the master does not know: {strays:?}");
    for s in &cut {
        // No answer: it may or may not have happened, but it is whole.
        let (status, _) = env.get(&format!("/clusters/{}", s.cluster)).await;
        assert!(status == 200 || status == 404, "{s:?}: {status}");
    }
    // The operations the kill interrupted were resumed by the next master
    // (four writers always have one in flight), each named in its log, and
    // each ended: none left running, each its cluster's.
    let resumed = resumed_operations(&env.master_log());
    assert!(!resumed.is_empty(), "no operation was resumed by the next master:\n{}", env.master_log());
    for id in &resumed {
        let op = env.wait_op(id).await;
        assert_ne!(op["status"], "Running", "{op:#}");
        let cluster = op["cluster"].as_str().unwrap_or_default();
        assert!(names.contains(cluster), "resumed {id} of an unknown cluster: {op:#}");
        if let Some(acked) = ended.get(id) {
            assert_eq!(acked["status"], op["status"], "{id}");
        }
    }
    eprintln!(
        "faults-master-kill9: {} acknowledged ({} creates), {} cut by the kill, {} refused overloaded; \
         operations ended {by_status:?} ({} resumed by the new master); {} clusters; \
         master listening again {listening:?} after the kill",
        acked.len(),
        acked.iter().filter(|s| s.kind == "create").count(),
        cut.len(),
        refused.len(),
        resumed.len(),
        names.len()
    );
}

/// The master down (SIGKILL) for longer than `node_down_after`: when it
/// comes back, the nodes it has not heard from yet are `Unknown`, not
/// `Down`, until they reconnect (the reconnect grace: `down_after` from
/// the master's start), and no instance changes status or process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn master_down_longer_than_the_heartbeat_timeout_marks_nothing_down_or_lost() {
    // Down after 8 s: longer than an agent's longest reconnect delay (5 s).
    let mut env = TestEnv::start_with(
        "faults-master-away",
        &[
            ("FLOTILLA_MASTER_HEARTBEAT_INTERVAL", "500ms"),
            ("FLOTILLA_MASTER_NODE_UNKNOWN_AFTER", "1500ms"),
            ("FLOTILLA_MASTER_NODE_DOWN_AFTER", "8s"),
        ],
    )
    .await;
    env.upload(&PackageBuilder::sleeper("away")).await;
    let body = json!({"name": "aw", "package": {"name": "away", "version": "1.0.0"}, "roles": {"svc": {"count": 3}}});
    let before = all_instances(&env.create_active(body).await);
    assert_eq!(before.iter().map(|i| i["node"].to_string()).collect::<BTreeSet<_>>().len(), 3, "{before:#?}");

    env.kill_master();
    // Longer than node_down_after.
    tokio::time::sleep(Duration::from_secs(9)).await;
    env.start_master_again().await;
    let back = Instant::now();
    let mut seen: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let ready_after = loop {
        let (_, nodes) = env.get("/nodes").await;
        let nodes = nodes["nodes"].as_array().cloned().unwrap_or_default();
        for n in &nodes {
            seen.entry(n["id"].as_str().unwrap_or("?").into())
                .or_default()
                .insert(n["status"].as_str().unwrap_or("?").into());
        }
        let c = env.cluster("aw").await;
        for i in all_instances(&c) {
            assert_eq!(i["status"], "Running", "{:?} after the master came back: {i:#}", back.elapsed());
        }
        if nodes.len() == 3 && nodes.iter().all(|n| n["status"] == "Ready" && n["connected"] == true) {
            break back.elapsed();
        }
        assert!(
            back.elapsed() < Duration::from_secs(20),
            "nodes not Ready 20 s after the master came back: {nodes:#?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(seen.values().all(|s| !s.contains("Down")), "a node was shown Down on the master's return: {seen:?}");
    // Past the agents' inventories: still the same processes.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let c = env.cluster("aw").await;
    assert_eq!(c["status"], "Active", "{c:#}");
    for (b, a) in before.iter().zip(all_instances(&c)) {
        assert_eq!((a["status"].as_str(), a["pid"].as_u64()), (Some("Running"), b["pid"].as_u64()), "{a:#}");
        assert_eq!(instance_pids(&id_of(&a)), vec![pid_of(b)], "{}", id_of(&a));
    }
    let (_, ops) = env.get("/operations?cluster=aw").await;
    assert_eq!(ops["operations"].as_array().map(Vec::len), Some(1), "only the create ran: {ops:#}");
    eprintln!("faults-master-away: nodes Ready {ready_after:?} after the master came back; statuses seen {seen:?}");
}
