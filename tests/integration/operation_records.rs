//! What an operation keeps in the master's store, read from the store
//! itself with the master stopped: its plan beside it while it runs (a
//! restarted master resumes it from there), no plan once it has ended, and
//! its steps' results under keys of their own, never inside the record a
//! journal write rewrites.

use std::time::Duration;

use flotilla::bench::sim::Latency;
use flotilla::ids::OperationId;
use flotilla::storage::keys::{master_cf, operation_key};
use flotilla::storage::meta::{self, MetaStore};
use flotilla::storage::records::{OperationRecord, OperationStatus};
use flotilla::storage::{MasterStore, db};
use serde_json::json;

use crate::common::{TestEnv, sim};

/// The operation `id` as the store holds it: the record alone (as each
/// journal write puts it), the record with its steps' results, its plan.
fn stored(env: &TestEnv, id: &str) -> (OperationRecord, OperationRecord, bool) {
    let store = MasterStore::open(&env.master_dir().join("db")).expect("open the master's store");
    let id: OperationId = id.parse().expect("operation id");
    let key = operation_key(&id);
    let raw = store.get(master_cf::OPERATIONS, &key).expect("read").expect("the operation is stored");
    let alone: OperationRecord = db::decode_value(master_cf::OPERATIONS, &key, &raw).expect("decode");
    let whole = meta::operation(&store, &id).expect("read").expect("stored");
    let plan = meta::plan(&store, &id).expect("read plan").is_some();
    (alone, whole, plan)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_operation_keeps_its_plan_and_an_ended_one_keeps_none() {
    let latency = Latency { start: Duration::from_secs(3), ..Latency::default() };
    let mut env = TestEnv::start_sim_with("oprec", &[], 2, latency).await;
    env.upload(&sim::package("svc", "1.0.0", 20)).await;
    let pkg = json!({"name": "svc", "version": "1.0.0"});
    let created = env.create_cluster(json!({"name": "r", "package": pkg, "roles": {"d": {"count": 2}}})).await;
    let create_id = created["id"].as_str().expect("id").to_string();
    env.assert_succeeded(&env.wait_op(&create_id).await);

    // A scale-out caught in its start step (3 s per simulated start).
    let (status, body) = env.post("/clusters/r/scale", json!({"role": "d", "add": 3})).await;
    assert_eq!(status, reqwest::StatusCode::ACCEPTED, "{body:#}");
    let scale_id = body["operation"]["id"].as_str().expect("id").to_string();
    env.until(10, "the scale-out is starting its instances", async || {
        let (_, o) = env.get(&format!("/operations/{scale_id}")).await;
        let steps = o["operation"]["steps"].as_array().cloned().unwrap_or_default();
        let starting =
            steps.iter().any(|s| s["status"] == "Running" && s["name"].as_str().unwrap_or("").contains("start"));
        if starting { Ok(()) } else { Err(format!("{o:#}")) }
    })
    .await;
    env.kill_master();

    let (alone, whole, plan) = stored(&env, &create_id);
    assert_eq!(whole.status, OperationStatus::Succeeded);
    assert!(!plan, "an ended operation kept its plan");
    assert!(whole.resume.is_none());
    assert!(
        whole.steps.iter().any(|s| !s.results.is_empty()),
        "the create's steps have their instances' results: {whole:#?}"
    );
    assert!(alone.steps.iter().all(|s| s.results.is_empty()), "results inside the journaled record: {alone:#?}");

    let (_, running, plan) = stored(&env, &scale_id);
    assert_eq!(running.status, OperationStatus::Running, "{running:#?}");
    assert!(plan, "a running operation has no plan to be resumed from");

    // The next master resumes it from that plan and, once it has ended,
    // the plan is gone.
    env.start_master_again().await;
    env.wait_ready().await;
    env.assert_succeeded(&env.wait_op(&scale_id).await);
    let c = env.cluster("r").await;
    assert_eq!(c["instances"].as_array().map(|a| a.len()), Some(5), "{c:#}");
    env.kill_master();
    let (alone, ended, plan) = stored(&env, &scale_id);
    assert_eq!(ended.status, OperationStatus::Succeeded);
    assert!(!plan, "the resumed operation kept its plan after it ended");
    assert!(alone.steps.iter().all(|s| s.results.is_empty()), "results inside the journaled record: {alone:#?}");
    env.start_master_again().await;
}
