//! The event stream on a real master and real agents: every change of a
//! scripted sequence (create, scale out, stop, delete) arrives in order
//! with consecutive ids; a client that reconnects with `Last-Event-ID` gets
//! exactly the events it missed; filters keep what they name; a master
//! restart keeps the ids increasing.

use std::time::Duration;

use serde_json::json;

use crate::common::sse::{Sse, SseReader};
use crate::common::{PackageBuilder, TestEnv, id_of, role_instances};

const WAIT: Duration = Duration::from_secs(60);

fn kinds(events: &[Sse]) -> Vec<&str> {
    events.iter().map(|e| e.kind.as_str()).collect()
}

/// Index of the first event after `from` matching `f`, or a panic naming `what`.
fn find(events: &[Sse], from: usize, what: &str, f: impl Fn(&Sse) -> bool) -> usize {
    events[from..]
        .iter()
        .position(f)
        .map(|i| i + from)
        .unwrap_or_else(|| panic!("no {what} after event #{from}; kinds: {:?}", kinds(events)))
}

fn op_ended(op: &str) -> impl Fn(&Sse) -> bool + '_ {
    move |e| e.kind == "operation.ended" && e.data["data"]["operation"] == op
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scripted_sequence_arrives_in_order_and_a_reconnect_gets_exactly_what_it_missed() {
    let mut env = TestEnv::start("events").await;
    let mut all = SseReader::open(&env.client, &env.api, "?after=0", None).await;
    let mut ops_only = SseReader::open(&env.client, &env.api, "?cluster=ev&kind=operation.", None).await;
    env.upload(&PackageBuilder::sleeper("ev")).await;

    // Create with 2, scale out by 1, stop, delete.
    let body = json!({"name": "ev", "package": {"name": "ev", "version": "1.0.0"}, "roles": {"svc": {"count": 2}}});
    let cluster = env.create_active(body).await;
    let created: Vec<String> = role_instances(&cluster, "svc").iter().map(id_of).collect();
    let scale = env.run_ok("/clusters/ev/scale", Some(json!({"role": "svc", "add": 1}))).await;
    let stop = env.run_ok("/clusters/ev/stop", None).await;
    let (status, del) = env.delete("/clusters/ev").await;
    assert_eq!(status, reqwest::StatusCode::ACCEPTED, "{del:#}");
    let delete = env.wait_op(del["operation"]["id"].as_str().expect("delete op id")).await;
    assert_eq!(delete["status"], "Succeeded", "{delete:#}");

    let events = all.until(WAIT, |e| e.kind == "cluster.deleted").await;
    // Consecutive ids: nothing skipped, nothing repeated, in commit order.
    let ids: Vec<u64> = events.iter().map(|e| e.id.expect("every event has an id")).collect();
    assert!(ids.windows(2).all(|w| w[1] == w[0] + 1), "ids not consecutive: {ids:?}");
    for e in &events {
        assert_eq!(e.data["id"], e.id.unwrap(), "data carries the id");
        assert_eq!(e.data["kind"], e.kind.as_str());
        assert!(e.data["at"].is_string() && e.data["data"].is_object(), "{e:?}");
    }

    // The create: cluster created and its operation created in one batch,
    // steps started and ended, both instances added then Running with a
    // pid, the cluster Active, the operation ended.
    let c = find(&events, 0, "cluster.created", |e| e.kind == "cluster.created" && e.data["cluster"] == "ev");
    let create_op = events[c + 1].data["data"]["operation"].as_str().expect("op id").to_string();
    assert_eq!(events[c + 1].kind, "operation.created", "{:?}", kinds(&events));
    let first_step = find(&events, c, "a step start", |e| e.kind == "operation.step_started");
    let create_end = find(&events, c, "the create's end", op_ended(&create_op));
    assert!(first_step < create_end);
    for id in &created {
        let added =
            find(&events, c, "instance.added", |e| e.kind == "instance.added" && e.data["data"]["instance"] == *id);
        let running = find(&events, added, "Running", |e| {
            e.kind == "instance.status" && e.data["data"]["instance"] == *id && e.data["data"]["status"] == "Running"
        });
        assert!(events[running].data["data"]["pid"].as_u64().is_some(), "Running with a pid: {:?}", events[running]);
        assert!(running < create_end, "{id} Running before the create ended");
    }
    let active =
        find(&events, c, "cluster Active", |e| e.kind == "cluster.status" && e.data["data"]["status"] == "Active");
    assert!(active <= create_end + 1, "Active in the batch that ends the create");
    assert!(events[create_end].data["data"]["status"] == "Succeeded");

    // The scale-out adds one instance; the stop takes every instance to
    // Stopped; the delete removes all three and the cluster.
    let scale_id = scale["id"].as_str().unwrap();
    let scale_end = find(&events, create_end, "the scale's end", op_ended(scale_id));
    let added: Vec<&Sse> = events[create_end..scale_end].iter().filter(|e| e.kind == "instance.added").collect();
    assert_eq!(added.len(), 1, "{:?}", kinds(&events[create_end..scale_end]));
    let stop_end = find(&events, scale_end, "the stop's end", op_ended(stop["id"].as_str().unwrap()));
    let stopped = events[scale_end..stop_end]
        .iter()
        .filter(|e| e.kind == "instance.status" && e.data["data"]["status"] == "Stopped");
    assert_eq!(stopped.count(), 3, "three instances Stopped");
    let removed = events[stop_end..].iter().filter(|e| e.kind == "instance.removed").count();
    assert_eq!(removed, 3);
    assert!(events.iter().any(|e| e.kind == "actor.started" && e.data["data"]["id"] == "ev"));

    // The filtered stream: only ev's operation events, in the same order.
    let mut want: Vec<Sse> =
        events.iter().filter(|e| e.kind.starts_with("operation.") && e.data["cluster"] == "ev").cloned().collect();
    let got = ops_only.until(WAIT, |e| Some(e) == want.last()).await;
    assert_eq!(got, want, "the filtered stream");

    // A reconnect with Last-Event-ID gets exactly what came after it.
    let mid = events[events.len() / 2].id.unwrap();
    let mut again = SseReader::open(&env.client, &env.api, "", Some(mid)).await;
    let last = events.last().cloned().unwrap();
    let replayed = again.until(WAIT, |e| e.id == last.id).await;
    assert_eq!(replayed, events[events.len() / 2 + 1..], "replay after {mid}");

    // After a restart the ids go on from where they were.
    let before = last.id.unwrap();
    drop((all, ops_only, again));
    env.restart_master().await;
    let mut after = SseReader::open(&env.client, &env.api, "", Some(before)).await;
    env.create_active(
        json!({"name": "ev2", "package": {"name": "ev", "version": "1.0.0"}, "roles": {"svc": {"count": 1}}}),
    )
    .await;
    want = after.until(WAIT, |e| e.kind == "cluster.created").await;
    let new_ids: Vec<u64> = want.iter().map(|e| e.id.unwrap()).collect();
    assert_eq!(new_ids[0], before + 1, "the first event after the restart follows the last before it: {new_ids:?}");
    assert!(new_ids.windows(2).all(|w| w[1] == w[0] + 1), "{new_ids:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_ids_are_refused_or_dropped_and_a_revoked_token_ends_its_stream() {
    let env = TestEnv::start_sim("events-bad", &[], 1).await;
    let resp = env.client.get(format!("{}/events", env.api)).header("last-event-id", "x").send().await.unwrap();
    assert_eq!(resp.status(), reqwest::StatusCode::BAD_REQUEST);
    let resp = reqwest::Client::new().get(format!("{}/events", env.api)).send().await.unwrap();
    assert_eq!(resp.status(), reqwest::StatusCode::UNAUTHORIZED);

    // An id past the newest (a client of another master, a wiped store):
    // told at once, with an id-less final event, and the stream ends.
    let mut ahead = SseReader::open(&env.client, &env.api, "", Some(1_000_000)).await;
    let e = ahead.next(WAIT).await.expect("a dropped event");
    assert_eq!((e.kind.as_str(), e.id), ("dropped", None), "{e:?}");
    assert!(e.data["reason"].as_str().unwrap().contains("1000000"), "{e:?}");
    assert!(ahead.next(Duration::from_secs(2)).await.is_none(), "the stream ended");

    // A stream opened with a token that is then revoked ends, saying so.
    let (_, made) = env.post("/tokens", json!({"name": "watcher"})).await;
    let watcher = crate::common::env::client_with_token(made["secret"].as_str().unwrap());
    let mut stream = SseReader::open(&watcher, &env.api, "?after=0", None).await;
    let seen = stream.until(WAIT, |e| e.kind == "node.status").await;
    assert!(!seen.is_empty());
    let (status, _) = env.delete(&format!("/tokens/{}", made["token"]["id"].as_str().unwrap())).await;
    assert_eq!(status, reqwest::StatusCode::OK);
    // Any event wakes the stream; a new token makes none, so create a package.
    env.upload(&PackageBuilder::sleeper("ev")).await;
    env.create_active(
        json!({"name": "wake", "package": {"name": "ev", "version": "1.0.0"}, "roles": {"svc": {"count": 1}}}),
    )
    .await;
    let last = stream.until(WAIT, |e| e.kind == "dropped").await;
    assert!(last.last().unwrap().data["reason"].as_str().unwrap().contains("revoked"), "{last:?}");
    assert!(stream.next(Duration::from_secs(2)).await.is_none(), "the stream ended");
}
