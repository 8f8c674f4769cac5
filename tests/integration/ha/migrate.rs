//! `flotilla store migrate`: a single master's RocksDB state copied into
//! etcd; the master started again on etcd takes its instances over without
//! restarting them, and the agents (enrolled with its CA) come back.

use std::process::Command;

use nix::sys::signal::Signal;
use serde_json::{Value, json};

use super::super::master_restart::SPEC;
use crate::common::env::etcd_config;
use crate::common::etcd::EtcdCluster;
use crate::common::scripts::RECORD_AND_SLEEP;
use crate::common::{PackageBuilder, TestEnv, all_instances, id_of, instance_pids, pid_of};

fn migrate(env: &TestEnv, etcd: &EtcdCluster) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args(["store", "migrate", "--etcd-prefix", "/ha-migrate/", "--etcd-endpoints", &etcd.endpoints.join(",")])
        .arg("--data-dir")
        .arg(env.master_dir())
        .output()
        .expect("run flotilla store migrate");
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

#[tokio::test]
async fn a_single_master_moved_to_etcd_takes_its_instances_over_without_restarting_them() {
    let etcd = EtcdCluster::start(3);
    let mut env = TestEnv::start("ha-migrate").await;
    env.upload(&PackageBuilder::new("mr", "1.0.0").spec(SPEC).script("bin/start.sh", RECORD_AND_SLEEP)).await;
    let body = json!({"name": "mig", "package": {"name": "mr", "version": "1.0.0"}, "roles": {"svc": {"count": 3}}});
    let before = all_instances(&env.create_active(body).await);
    let pids: Vec<(String, u32)> = before.iter().map(|i| (id_of(i), pid_of(i))).collect();
    let (_, ops_before) = env.get("/operations?cluster=mig").await;

    env.signal_master(Signal::SIGTERM);
    assert!(env.wait_master_exit(std::time::Duration::from_secs(30)).await.is_some(), "the master did not stop");
    let (ok, stdout, stderr) = migrate(&env, &etcd);
    assert!(ok, "migrate failed\n{stdout}\n{stderr}");
    assert!(stdout.contains("clusters") && stdout.contains("with the agent link's CA"), "{stdout}");
    // Never over what is there.
    let (ok, _, stderr) = migrate(&env, &etcd);
    assert!(!ok && stderr.contains("already holds keys"), "a second migrate: {stderr}");

    env.use_master_config(&etcd_config("ha-migrate", &etcd));
    env.start_master_again().await;
    env.wait_ready().await;
    let (_, h) = env.get("/health").await;
    assert_eq!(h["store_engine"], "etcd", "{h:#}");
    let after = all_instances(&env.cluster("mig").await);
    let summary = |l: &[Value]| {
        l.iter().map(|i| (id_of(i), i["node"].clone(), i["ports"].clone(), i["status"].clone())).collect::<Vec<_>>()
    };
    assert_eq!(summary(&after), summary(&before), "the instances changed in the move");
    for (id, pid) in &pids {
        assert_eq!(instance_pids(id), vec![*pid], "{id} was restarted by the move");
    }
    let (_, ops_after) = env.get("/operations?cluster=mig").await;
    assert_eq!(ops_after, ops_before, "the operation journal changed in the move");
    // It goes on: a scale-out installs from the package files left in the data dir.
    let op = env.run_ok("/clusters/mig/scale", Some(json!({"role": "svc", "add": 1}))).await;
    env.assert_succeeded(&op);
    assert_eq!(all_instances(&env.cluster("mig").await).len(), 4);
}

/// A prefix a migration did not finish (its mark is still there) is
/// refused by a master, which says what to do.
#[tokio::test]
async fn a_master_refuses_a_prefix_a_migration_did_not_finish() {
    let etcd = EtcdCluster::start(3);
    etcd.ctl(&["put", "/cut/meta/migrating", "1"]);
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("master.toml");
    std::fs::write(&config, etcd_config("cut", &etcd)).unwrap();
    let mut master = Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args(["master", "--http-addr", "127.0.0.1:0", "--agent-addr", "127.0.0.1:0", "--init"])
        .arg("--data-dir")
        .arg(dir.path().join("m"))
        .arg("--config")
        .arg(&config)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start a master");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let status = loop {
        if let Some(s) = master.try_wait().unwrap() {
            break s;
        }
        if std::time::Instant::now() > deadline {
            let _ = master.kill();
            panic!("the master started on a prefix a migration did not finish");
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(master.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert!(!status.success());
    assert!(err.contains("did not finish") && err.contains("etcdctl del --prefix /cut/"), "{err}");
}
