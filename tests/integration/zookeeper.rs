//! The real ensemble: Apache ZooKeeper (Debian's 3.8 jars, packaged by
//! `examples/components/zookeeper/build.sh`) on three agents, driven through
//! the whole cluster lifecycle, with the servers themselves as the judges:
//! `srvr` says who leads and who follows, the CLI reads and writes znodes.
//! Needs Debian's `zookeeper` package and Java (`scripts/setup.sh` installs them).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::{Value, json};

use crate::common::zk::{build_package, cli, modes, one_leader, refusing_ids_above, srvr};
use crate::common::{TestEnv, dir_of, error_code, eventually, id_of, instance_pids, pid_alive, pid_of, role_instances};

fn servers(c: &Value) -> Vec<Value> {
    role_instances(c, "server")
}

fn zoo_cfg(i: &Value) -> String {
    std::fs::read_to_string(dir_of(i).join("conf/zoo.cfg")).unwrap()
}

fn members_listed(i: &Value) -> usize {
    zoo_cfg(i).lines().filter(|l| l.starts_with("server.")).count()
}

async fn ensemble_settles(servers: &[Value]) {
    let ok = eventually(60, || one_leader(servers)).await;
    assert!(ok, "no single leader with followers: {:?}", modes(servers));
}

fn read_znode(via: &Value, target: &Value) -> String {
    let (ok, out) = cli(via, target, &["get", "/flotilla"]);
    assert!(ok, "get /flotilla from {} failed: {out}", id_of(target));
    out.trim().to_string()
}

#[tokio::test]
async fn a_zookeeper_ensemble_through_its_whole_lifecycle() {
    let env = TestEnv::start("zookeeper").await;
    let work = tempfile::tempdir().unwrap();
    let v1 = build_package("3.8.0", work.path());
    let v2 = refusing_ids_above(&build_package("3.8.0-2", work.path()), 5, work.path());
    for (version, bytes) in [("3.8.0", v1), ("3.8.0-2", v2)] {
        let (status, body) = env.put_bytes(&format!("/packages/zookeeper/{version}"), bytes).await;
        assert!(status.is_success(), "upload {version}: {body:#}");
    }

    // Create three servers: Active, one leader and two followers, by their own word.
    let body =
        json!({"name": "zk", "package": {"name": "zookeeper", "version": "3.8.0"}, "roles": {"server": {"count": 3}}});
    let three = servers(&env.create_active(body).await);
    assert_eq!(three.len(), 3);
    ensemble_settles(&three).await;
    let (ok, out) = cli(&three[0], &three[0], &["create", "/flotilla", "hello"]);
    assert!(ok, "create /flotilla: {out}");

    // Adding as many as there are would let the new servers form a quorum of
    // their own, without the data: refused up front.
    let (status, resp) = env.post("/clusters/zk/scale", json!({"role": "server", "add": 4})).await;
    assert_eq!((status.as_u16(), error_code(&resp)), (422, "spec_violation"), "{resp:#}");
    assert!(resp["error"]["message"].as_str().unwrap().contains("quorum role"), "{resp:#}");

    // Scale to five: every config lists five, one leader, the znode is
    // readable from a new member.
    env.run_ok("/clusters/zk/scale", Some(json!({"role": "server", "add": 2}))).await;
    let five = servers(&env.cluster("zk").await);
    assert_eq!(five.len(), 5);
    for s in &five {
        assert_eq!(members_listed(s), 5, "{}:\n{}", id_of(s), zoo_cfg(s));
    }
    ensemble_settles(&five).await;
    assert_eq!(read_znode(&five[4], &five[4]), "hello");

    // Four is an even quorum: refused before anything happens.
    let victim = id_of(&five[4]);
    let (status, resp) = env.post("/clusters/zk/scale", json!({"role": "server", "remove": [victim]})).await;
    assert_eq!((status.as_u16(), error_code(&resp)), (422, "spec_violation"), "{resp:#}");
    assert!(resp["error"]["message"].as_str().unwrap().contains("odd"), "{resp:#}");
    let c = env.cluster("zk").await;
    assert_eq!(c["status"], "Active");
    for (a, b) in servers(&c).iter().zip(&five) {
        assert_eq!(pid_of(a), pid_of(b), "a refused scale touched {}", id_of(a));
    }

    // Back to three: the removed servers are gone, the rest serve the znode.
    let removed: Vec<String> = five[3..].iter().map(id_of).collect();
    env.run_ok("/clusters/zk/scale", Some(json!({"role": "server", "remove": removed}))).await;
    let three = servers(&env.cluster("zk").await);
    assert_eq!(three.iter().map(id_of).collect::<Vec<_>>(), five[..3].iter().map(id_of).collect::<Vec<_>>());
    for gone in &five[3..] {
        assert!(!dir_of(gone).exists(), "{} left its directory", id_of(gone));
        assert!(instance_pids(&id_of(gone)).is_empty(), "{} left processes", id_of(gone));
    }
    for s in &three {
        assert_eq!(members_listed(s), 3, "{}:\n{}", id_of(s), zoo_cfg(s));
    }
    ensemble_settles(&three).await;
    assert_eq!(read_znode(&three[0], &three[2]), "hello");

    // A config change restarts one server at a time (never two down at
    // once), and a quorum answers throughout, but for the election a
    // leader's restart costs (polled while the operation runs).
    let stop = Arc::new(AtomicBool::new(false));
    let polls = Arc::new(AtomicUsize::new(0));
    let gaps = Arc::new(AtomicUsize::new(0));
    let most_down = Arc::new(AtomicUsize::new(0));
    let watcher = {
        let (stop, polls, gaps, most_down) = (stop.clone(), polls.clone(), gaps.clone(), most_down.clone());
        let watched = three.clone();
        std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                let replies: Vec<Option<String>> = watched.iter().map(srvr).collect();
                let down = replies.iter().filter(|r| r.is_none()).count();
                let serving =
                    replies.iter().flatten().filter(|r| r.contains("Mode: leader") || r.contains("Mode: follower"));
                polls.fetch_add(1, Ordering::SeqCst);
                most_down.fetch_max(down, Ordering::SeqCst);
                if serving.count() < 2 {
                    gaps.fetch_add(1, Ordering::SeqCst);
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    let op = env.run_op_patch("/clusters/zk/config", json!({"config": {"tick_time": 2500}})).await;
    stop.store(true, Ordering::SeqCst);
    watcher.join().unwrap();
    env.assert_succeeded(&op);
    let restarted = servers(&env.cluster("zk").await);
    for (a, b) in restarted.iter().zip(&three) {
        assert!(zoo_cfg(a).contains("tickTime=2500"), "{}", id_of(a));
        assert_ne!(pid_of(a), pid_of(b), "{} was not restarted with its new config", id_of(a));
    }
    let (polls, gaps) = (polls.load(Ordering::SeqCst), gaps.load(Ordering::SeqCst));
    assert!(polls > 10, "the ensemble was polled only {polls} times");
    assert_eq!(most_down.load(Ordering::SeqCst), 1, "servers were down together, or none was restarted");
    // A leader's restart costs one election (a second or so): at most a few.
    assert!(gaps * 100 <= 5000, "no quorum for {gaps} of {polls} polls (100 ms apart)");
    ensemble_settles(&restarted).await;

    // Upgrade to the second version, keeping the data.
    env.run_ok("/clusters/zk/upgrade", Some(json!({"version": "3.8.0-2"}))).await;
    let upgraded = servers(&env.cluster("zk").await);
    for s in &upgraded {
        let v = std::fs::read_to_string(dir_of(s).join("PACKAGE_VERSION")).unwrap();
        assert_eq!(v.trim(), "3.8.0-2", "{}", id_of(s));
    }
    ensemble_settles(&upgraded).await;
    assert_eq!(read_znode(&upgraded[1], &upgraded[1]), "hello");

    // 3.8.0-2 refuses server ids above 5: a scale-out to five fails at the
    // new members' start and is rolled back; the cluster is Active as before.
    let op = env.run_op("/clusters/zk/scale", Some(json!({"role": "server", "add": 2}))).await;
    assert_eq!(op["status"], "RolledBack", "{op:#}");
    let c = env.cluster("zk").await;
    assert_eq!(c["status"], "Active", "{c:#}");
    let why = c["status_description"].as_str().unwrap();
    assert!(why.contains("rolled back") && why.contains("refuses to join"), "{why}");
    let after = servers(&c);
    assert_eq!(after.iter().map(id_of).collect::<Vec<_>>(), upgraded.iter().map(id_of).collect::<Vec<_>>());
    for s in &after {
        assert_eq!(members_listed(s), 3, "{} kept the failed members in its config", id_of(s));
        assert!(pid_alive(pid_of(s)));
    }
    ensemble_settles(&after).await;

    // And back to the first version.
    env.run_ok("/clusters/zk/upgrade", Some(json!({"version": "3.8.0"}))).await;
    let back = servers(&env.cluster("zk").await);
    for s in &back {
        let v = std::fs::read_to_string(dir_of(s).join("PACKAGE_VERSION")).unwrap();
        assert_eq!(v.trim(), "3.8.0", "{}", id_of(s));
    }
    ensemble_settles(&back).await;
    assert_eq!(read_znode(&back[2], &back[0]), "hello");

    // Delete: no process, directory or record left.
    let (status, resp) = env.delete("/clusters/zk").await;
    assert_eq!(status, 202, "{resp:#}");
    env.assert_succeeded(&env.wait_op(resp["operation"]["id"].as_str().unwrap()).await);
    for s in &back {
        assert!(instance_pids(&id_of(s)).is_empty(), "{} left processes", id_of(s));
        assert!(!dir_of(s).exists(), "{} left its directory", id_of(s));
    }
    assert!(env.agent_instance_dirs().is_empty(), "{:?}", env.agent_instance_dirs());
    let (status, _) = env.get("/clusters/zk").await;
    assert_eq!(status, 404);
}
