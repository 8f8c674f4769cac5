//! The operation journal keeps `operations_retained` ended operations per
//! cluster, newest first; older ones are gone (404), and `GET /operations`
//! pages through what is kept without repeats or gaps; a cursor deleted
//! since its page is a 404, not a silent end. Deleted clusters together
//! keep `operations_retained` operations, also across a restart.

use std::collections::BTreeSet;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::common::{TestEnv, sim};

/// `GET /operations?{query}`: (ids, next cursor).
async fn page(env: &TestEnv, query: &str) -> (Vec<Value>, Option<String>) {
    let (status, body) = env.get(&format!("/operations?{query}")).await;
    assert_eq!(status, StatusCode::OK, "GET /operations?{query}: {body:#}");
    let ops = body["operations"].as_array().unwrap_or_else(|| panic!("no operations array: {body:#}")).clone();
    (ops, body["next"].as_str().map(String::from))
}

fn ids(ops: &[Value]) -> Vec<String> {
    ops.iter().map(|o| o["id"].as_str().expect("op id").to_string()).collect()
}

fn assert_newest_first(ops: &[Value], what: &str) {
    let rfc3339 = &time::format_description::well_known::Rfc3339;
    let times: Vec<time::OffsetDateTime> = ops
        .iter()
        .map(|o| time::OffsetDateTime::parse(o["created_at"].as_str().expect("created_at"), rfc3339).expect("a time"))
        .collect();
    assert!(times.windows(2).all(|w| w[0] >= w[1]), "{what} is not newest first: {times:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ended_operations_past_the_retention_are_gone_and_the_rest_pages_cleanly() {
    let env = TestEnv::start_sim("retention", &[("FLOTILLA_MASTER_OPERATIONS_RETAINED", "3")], 1).await;
    env.upload(&sim::package("svc", "1.0.0", 3)).await;
    let pkg = json!({"name": "svc", "version": "1.0.0"});

    // Six operations on "ra" (create, five restarts), four on "rb".
    let mut ra = Vec::new();
    let op = env.create_cluster(json!({"name": "ra", "package": pkg})).await;
    ra.push(env.wait_op(op["id"].as_str().unwrap()).await);
    for _ in 0..5 {
        ra.push(env.run_ok("/clusters/ra/restart", None).await);
    }
    let op = env.create_cluster(json!({"name": "rb", "package": pkg})).await;
    env.wait_op(op["id"].as_str().unwrap()).await;
    for _ in 0..3 {
        env.run_ok("/clusters/rb/restart", None).await;
    }
    assert!(ra.iter().all(|o| o["status"] == "Succeeded"), "{ra:#?}");

    // Exactly the three newest of "ra", newest first.
    let (kept, next) = page(&env, "cluster=ra").await;
    let newest: Vec<String> = ids(&ra).into_iter().rev().take(3).collect();
    assert_eq!(ids(&kept), newest, "GET /operations?cluster=ra: {kept:#?}");
    assert_eq!(next, None);
    assert_newest_first(&kept, "GET /operations?cluster=ra");
    for old in &ids(&ra)[..3] {
        let (status, body) = env.get(&format!("/operations/{old}")).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "operation {old} is past the retention, yet: {body:#}");
    }
    for id in &newest {
        let (status, body) = env.get(&format!("/operations/{id}")).await;
        assert_eq!((status, &body["operation"]["status"]), (StatusCode::OK, &json!("Succeeded")), "{body:#}");
    }

    // Every kept operation (3 of each cluster), two at a time.
    let (all, next) = page(&env, "limit=100").await;
    assert_eq!(next, None);
    assert_eq!(all.len(), 6, "three kept per cluster: {all:#?}");
    assert_newest_first(&all, "GET /operations");
    let mut paged = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..10 {
        let query = match &cursor {
            Some(after) => format!("limit=2&after={after}"),
            None => "limit=2".into(),
        };
        let (ops, next) = page(&env, &query).await;
        assert!(ops.len() <= 2, "a page of {} with limit=2", ops.len());
        paged.extend(ids(&ops));
        cursor = next;
        if cursor.is_none() {
            break;
        }
    }
    assert_eq!(cursor, None, "paging did not end");
    assert_eq!(paged, ids(&all), "pages of two differ from the whole list");
    assert_eq!(paged.iter().collect::<BTreeSet<_>>().len(), paged.len(), "a page repeats an operation");

    // A cursor whose operation retention deleted since its page is an
    // explicit 404 naming it, not an empty page that reads as the end.
    let (first, next) = page(&env, "cluster=ra&limit=2").await;
    let cursor = next.expect("three kept, two a page: there is a next page");
    assert_eq!(cursor, ids(&first)[1]);
    for _ in 0..2 {
        env.run_ok("/clusters/ra/restart", None).await;
    }
    for query in [format!("cluster=ra&limit=2&after={cursor}"), format!("limit=2&after={cursor}")] {
        let (status, body) = env.get(&format!("/operations?{query}")).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "GET /operations?{query} after its cursor was deleted: {body:#}");
        assert_eq!(body["error"]["code"], "not_found", "{body:#}");
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(&cursor), "the error names the cursor {cursor}: {body:#}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_clusters_together_keep_a_bounded_number_of_operations() {
    let mut env = TestEnv::start_sim("retention-gone", &[("FLOTILLA_MASTER_OPERATIONS_RETAINED", "3")], 1).await;
    env.upload(&sim::package("svc", "1.0.0", 3)).await;
    let pkg = json!({"name": "svc", "version": "1.0.0"});

    // Three lives of "gz" (the name is free again after each delete): a
    // create and a delete each, six operations of clusters that are gone.
    let mut gone = Vec::new();
    for _ in 0..3 {
        let op = env.create_cluster(json!({"name": "gz", "package": pkg})).await;
        gone.push(env.wait_op(op["id"].as_str().unwrap()).await);
        let (status, resp) = env.delete("/clusters/gz").await;
        assert_eq!(status, StatusCode::ACCEPTED, "DELETE /clusters/gz: {resp:#}");
        gone.push(env.wait_op(resp["operation"]["id"].as_str().unwrap()).await);
    }
    assert!(gone.iter().all(|o| o["status"] == "Succeeded"), "{gone:#?}");
    let newest: Vec<String> = ids(&gone).into_iter().rev().take(3).collect();
    let (all, _) = page(&env, "limit=100").await;
    assert_eq!(ids(&all), newest, "the three newest operations of deleted clusters: {all:#?}");
    for old in &ids(&gone)[..3] {
        let (status, body) = env.get(&format!("/operations/{old}")).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "operation {old} of a deleted cluster is past the bound: {body:#}");
    }

    // A master restarted with a smaller bound trims what is stored.
    env.set_master_env("FLOTILLA_MASTER_OPERATIONS_RETAINED", "1");
    env.restart_master().await;
    let (all, _) = page(&env, "limit=100").await;
    assert_eq!(ids(&all), newest[..1], "after the restart only the last delete is kept: {all:#?}");
    let (status, body) = env.get(&format!("/operations/{}", newest[0])).await;
    assert_eq!((status, &body["operation"]["kind"]), (StatusCode::OK, &json!("Delete")), "{body:#}");
}
