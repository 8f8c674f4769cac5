//! What the dashboard reads for a big cluster without reading all of it:
//! `GET /clusters/{name}/instances` a page at a time (by role and ordinal,
//! filtered by role or status, the cursor surviving the removal of the
//! member it names), `GET /clusters/{name}?instances=false`, and the
//! actor list with and without instance actors.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::common::{TestEnv, error_code, sim};

/// Every page of `path` (which has no `after`), following `next`.
async fn all_pages(env: &TestEnv, path: &str) -> (Vec<Value>, Vec<usize>) {
    let (mut items, mut sizes, mut after) = (Vec::new(), Vec::new(), None::<String>);
    loop {
        let url = match &after {
            Some(a) => format!("{path}&after={a}"),
            None => path.to_string(),
        };
        let (status, body) = env.get(&url).await;
        assert_eq!(status, StatusCode::OK, "GET {url}: {body:#}");
        let page = body["instances"].as_array().expect("instances").clone();
        sizes.push(page.len());
        items.extend(page);
        match body["next"].as_str() {
            Some(n) => after = Some(n.to_string()),
            None => return (items, sizes),
        }
    }
}

fn ordinals(items: &[Value]) -> Vec<u64> {
    items.iter().map(|i| i["ordinal"].as_u64().unwrap()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_big_cluster_is_read_a_page_at_a_time() {
    let env = TestEnv::start_sim("paging", &[], 3).await;
    env.upload(&sim::package("svc", "1.0.0", 100)).await;
    env.create_active(
        json!({"name": "pg", "package": {"name": "svc", "version": "1.0.0"}, "roles": {"d": {"count": 25}}}),
    )
    .await;

    let (items, sizes) = all_pages(&env, "/clusters/pg/instances?limit=10").await;
    assert_eq!(sizes, vec![10, 10, 5], "pages of 10");
    assert_eq!(ordinals(&items), (1..=25).collect::<Vec<u64>>(), "every member once, by ordinal");
    let (status, first) = env.get("/clusters/pg/instances?limit=10").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(first["total"], 25);
    assert_eq!(first["next"], "d/10", "the cursor is ROLE/ORDINAL");

    // Filters: by status, by role; a status that does not exist is refused.
    let (_, running) = env.get("/clusters/pg/instances?status=Running&limit=1000").await;
    assert_eq!(running["total"], 25, "{running:#}");
    let (_, failed) = env.get("/clusters/pg/instances?status=Failed").await;
    assert_eq!((failed["total"].as_u64(), failed["next"].is_null()), (Some(0), true), "{failed:#}");
    let (_, other_role) = env.get("/clusters/pg/instances?role=nope").await;
    assert_eq!(other_role["total"], 0);
    let (status, bad) = env.get("/clusters/pg/instances?status=Sleeping").await;
    assert_eq!((status, error_code(&bad)), (StatusCode::BAD_REQUEST, "invalid_status"), "{bad:#}");
    let (status, bad) = env.get("/clusters/pg/instances?after=tenth").await;
    assert_eq!((status, error_code(&bad)), (StatusCode::BAD_REQUEST, "invalid_cursor"), "{bad:#}");
    let (status, _) = env.get("/clusters/nope/instances").await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // The member at the cursor is removed between two pages: the next page
    // starts right after where it was.
    let tenth = items[9]["id"].as_str().unwrap().to_string();
    env.run_ok("/clusters/pg/scale", Some(json!({"role": "d", "remove": [tenth]}))).await;
    let (status, next) = env.get("/clusters/pg/instances?limit=10&after=d/10").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(ordinals(next["instances"].as_array().unwrap()), (11..=20).collect::<Vec<u64>>(), "{next:#}");
    assert_eq!(next["total"], 24);
    // Exactly two full pages: no empty third one.
    let (items, sizes) = all_pages(&env, "/clusters/pg/instances?limit=12").await;
    assert_eq!((sizes, items.len()), (vec![12, 12], 24));
    // The page size is bounded both ways.
    let (_, one) = env.get("/clusters/pg/instances?limit=0").await;
    assert_eq!(one["instances"].as_array().unwrap().len(), 1, "limit 0 reads as 1");
    let (_, big) = env.get("/clusters/pg/instances?limit=100000").await;
    assert_eq!(big["instances"].as_array().unwrap().len(), 24);

    // The cluster without its instance list, with the counts.
    let (_, head) = env.get("/clusters/pg?instances=false").await;
    assert_eq!(head["instances"], json!([]), "{head:#}");
    assert_eq!(head["instance_counts"], json!({"Running": 24}), "{head:#}");
    assert_eq!(head["roles"]["d"]["count"], 24, "{head:#}");
    let (_, full) = env.get("/clusters/pg").await;
    assert_eq!(full["instances"].as_array().unwrap().len(), 24);

    // Actors: the long-lived ones alone, or a cluster's with a bounded
    // number of its instance actors (and how many there are).
    let (_, top) = env.get("/actors?limit=0").await;
    let kinds: Vec<&str> = top["actors"].as_array().unwrap().iter().map(|a| a["kind"].as_str().unwrap()).collect();
    assert!(!kinds.contains(&"instance"), "{kinds:?}");
    assert_eq!(kinds.iter().filter(|k| **k == "node_manager").count(), 3, "{kinds:?}");
    assert_eq!(top["instance_actors"], 24);
    let (_, some) = env.get("/actors?cluster=pg&limit=5").await;
    let listed = some["actors"].as_array().unwrap();
    assert_eq!(listed.iter().filter(|a| a["kind"] == "instance").count(), 5, "{some:#}");
    assert!(listed.iter().any(|a| a["kind"] == "cluster" && a["id"] == "pg"), "{some:#}");
    assert!(listed.iter().filter(|a| a["kind"] == "instance").all(|a| a["parent"] == "cluster/pg"), "{some:#}");
}
