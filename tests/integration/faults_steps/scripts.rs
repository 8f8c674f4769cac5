//! A script that fails at each step that runs one: a hook exiting 1, a
//! process refusing to start, a stop command failing. The switch is
//! `failonce-*`: the script fails the first time only, so an undo that
//! runs it again can put things back (an undo that fails is `undo`'s).

use std::collections::BTreeSet;
use std::time::Instant;

use super::{Bench, Kind, V2, dirs_match, failed_at, ids, named};
use crate::common::faulty::settled;
use crate::common::scripts::rendered;

/// What a scenario must end with.
struct Expect {
    op: &'static str,
    /// The cluster's status; `None`: deleted.
    cluster: Option<&'static str>,
    /// The instances (tags) that run; every other one must not.
    running: &'static [&'static str],
    /// Instances that must be gone (from the master and the disk).
    gone: &'static [&'static str],
}

const ALL: &[&str] = &["a-1", "a-2", "b-1"];

fn expect(kind: Kind, step: &str) -> Expect {
    let e = |op, cluster, running, gone| Expect { op, cluster, running, gone };
    match (kind, step) {
        // A failed create keeps its instances for the operator, none running.
        (Kind::Create, _) => e("Failed", Some("Error"), &[], &[]),
        // A stop command that fails does not stop the stop: TERM follows.
        (Kind::Stop, _) => e("Succeeded", Some("Stopped"), &[], &[]),
        (Kind::Restart, "stop-order-1" | "stop-order-0") => e("Succeeded", Some("Active"), ALL, &[]),
        (Kind::Delete, "stop-order-1" | "stop-order-0") => e("Succeeded", None, &[], ALL),
        // Lifecycle steps have no undo: what started runs on.
        (Kind::Start | Kind::Restart, "start-order-0") => e("Failed", Some("Error"), &["a-1"], &[]),
        (Kind::Start | Kind::Restart, "start-order-1") => e("Failed", Some("Error"), &["a-1", "a-2"], &[]),
        // What the hook did on the members cannot be undone: Failed, yet
        // the new member is removed.
        (Kind::ScaleOut, "scale-out-hook") => e("Failed", Some("Error"), ALL, &["a-3"]),
        (Kind::ScaleOut, _) => e("RolledBack", Some("Active"), ALL, &["a-3"]),
        (Kind::ScaleIn, "scale-in-hook") => e("RolledBack", Some("Active"), ALL, &[]),
        (Kind::ScaleIn, "decommission-order-0") => e("Succeeded", Some("Active"), &["a-1", "b-1"], &["a-2"]),
        // Its data is deleted by then: no rollback.
        (Kind::ScaleIn, "configure") => e("Failed", Some("Error"), &["a-1", "b-1"], &["a-2"]),
        (Kind::Config | Kind::Upgrade | Kind::Resize, _) => e("RolledBack", Some("Active"), ALL, &[]),
        // A destroy hook that fails vetoes the delete.
        (Kind::Delete, "destroy") => e("Failed", Some("Error"), &[], &[]),
        other => panic!("no expectation for {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_script_failing_at_each_step_of_each_operation() {
    let mut b = Bench::start("faults-steps-scripts", "sf").await;
    let mut count = 0;
    for kind in Kind::ALL {
        for (step, what, tag) in kind.scripted() {
            let began = Instant::now();
            let (name, ctl) = b.next();
            let before = b.prepare(kind, &name, &ctl).await;
            let switch = if kind == Kind::Upgrade {
                format!("failonce-{what}-{tag}@{V2}")
            } else {
                format!("failonce-{what}-{tag}")
            };
            ctl.set(&switch);
            let id = b.request(kind, &name, &ctl, before.as_ref()).await;
            let op = b.wait(&id).await;
            let want = expect(kind, step);
            let at = format!("{kind:?}, {what} of {tag} failing at step {step}");
            assert_eq!(op["status"], want.op, "{at}: {op:#}");
            assert!(!ctl.dir.join(&switch).exists(), "{at}: the failing script never ran");
            if want.op != "Succeeded" {
                failed_at(&op, step).unwrap_or_else(|e| panic!("{at}: {e}: {op:#}"));
            }
            let mut all = before.as_ref().map(ids).unwrap_or_default();
            all.extend(named(&op));
            match want.cluster {
                None => {
                    let (status, _) = b.env.get(&format!("/clusters/{name}")).await;
                    assert_eq!(status, 404, "{at}: the cluster is still there");
                }
                Some(status) => {
                    let s = settled(&b.env, &name, 20).await;
                    all.extend(ids(&s));
                    assert_eq!(s.status, status, "{at}: {s:#?}\n{op:#}");
                    if want.op != "Succeeded" {
                        // Honest: it names the step, the instance and what it said.
                        let id = &op_instance(&op, step, tag);
                        let d = &s.description;
                        assert!(d.contains(step) && d.contains(id) && d.contains("injected failure"), "{at}: {d}");
                    }
                    let running: BTreeSet<&str> =
                        s.instances.iter().filter(|(_, i)| i.status == "Running").map(|(t, _)| t.as_str()).collect();
                    let want_running: BTreeSet<&str> = want.running.iter().copied().collect();
                    assert_eq!(running, want_running, "{at}: {s:#?}");
                    for g in want.gone {
                        assert!(!s.instances.contains_key(*g), "{at}: {g} is still there: {s:#?}");
                    }
                    dirs_match(&b.env, &name, &s).unwrap_or_else(|e| panic!("{at}: {e}"));
                    if want.op == "RolledBack" {
                        put_back(&b, &name, &at).await;
                    }
                }
            }
            b.clean(&name, &all).await;
            b.took(format!("{kind:?} {step}"), began);
            count += 1;
        }
    }
    assert_eq!(count, 24, "every step that runs a script");
    b.summary();
}

/// The id of the instance `tag` as the operation's results name it.
fn op_instance(op: &serde_json::Value, step: &str, tag: &str) -> String {
    let (role, ordinal) = tag.split_once('-').expect("tag");
    let needle = format!("-{role}-{ordinal}-");
    let steps = op["steps"].as_array().expect("steps");
    let s = steps.iter().find(|s| s["name"] == step).expect("step");
    s["results"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| r["instance"].as_str())
        .find(|i| i.contains(&needle))
        .unwrap_or_else(|| panic!("no result of {tag} in step {step}: {s:#}"))
        .to_string()
}

/// A rolled-back change left every instance as it was: the old
/// membership and config in its files, the old version running.
async fn put_back(b: &Bench, name: &str, at: &str) {
    let c = b.env.cluster(name).await;
    assert_eq!(c["package"]["version"], super::V1, "{at}");
    for i in crate::common::all_instances(&c) {
        assert_eq!(rendered(&i, "conf/members"), "1 2 tick=1\n", "{at}: {}", i["id"]);
        assert_eq!(rendered(&i, "data/version").trim(), super::V1, "{at}: {}", i["id"]);
    }
}
