//! An undo that fails: the operation ends `Failed`, the cluster `Error`,
//! and the description says what was not put back.

use std::time::Instant;

use super::{Bench, Kind, V1, V2, dirs_match, failed_at, ids};
use crate::common::all_instances;
use crate::common::faulty::{settled, wait_held};
use crate::common::scripts::rendered;

/// An upgrade whose new version does not start on the second instance,
/// and whose undo (the old version back on every replaced instance) fails
/// too: the old version's start is made to fail while the forward step is
/// held, before the undo runs. The undo stops at the first instance it
/// cannot put back (a-1), so a-2 stays on the new version: the
/// description names both, not b-1 (never touched). The operator's start,
/// once the fault is gone, installs the cluster's version again on each
/// instance out of line before starting it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_whose_undo_fails_says_what_was_not_put_back() {
    let mut b = Bench::start("faults-steps-undo", "uf").await;
    let began = Instant::now();
    let (name, ctl) = b.next();
    let before = b.prepare(Kind::Upgrade, &name, &ctl).await.expect("a cluster");
    ctl.hold("start", "a-2");
    let id = b.request(Kind::Upgrade, &name, &ctl, Some(&before)).await;
    wait_held(&b.env, &ctl, &id, "upgrade", "start", "a-2").await;
    let (new_fails, old_fails) = (format!("fail-start-a-2@{V2}"), format!("fail-start@{V1}"));
    ctl.set(&new_fails);
    ctl.set(&old_fails);
    ctl.release("start", "a-2");
    let op = b.wait(&id).await;
    let s = settled(&b.env, &name, 20).await;
    let (a1, a2, b1) = (&s.tag("a-1").id, &s.tag("a-2").id, &s.tag("b-1").id);

    assert_eq!(op["status"], "Failed", "{op:#}");
    failed_at(&op, "upgrade").unwrap_or_else(|e| panic!("{e}: {op:#}"));
    let undo = op["steps"][0].clone();
    assert_eq!((undo["name"].as_str(), undo["status"].as_str()), (Some("set-version"), Some("UndoFailed")), "{op:#}");
    assert_eq!(s.status, "Error", "{s:#?}");
    // The definition is back; the instances named are those not put back.
    assert_eq!(s.version, V1, "{s:#?}");
    let error = op["error"].as_str().unwrap_or_default();
    for text in [error, s.description.as_str()] {
        let (_, left) =
            text.split_once("not put back: ").unwrap_or_else(|| panic!("says nothing of what is left: {text}"));
        let named = left.split(" (undo of step set-version: ").next().unwrap_or_default();
        assert_eq!(named, format!("{a1}, {a2}"), "{text}");
        assert!(left.contains("injected failure: start of a-1 (1.0.0)"), "{text}");
        assert!(!text.contains(b1.as_str()), "b-1 was never touched: {text}");
    }
    // As described: a-1 and a-2 down, a-2 on the new version; b-1 untouched.
    for tag in ["a-1", "a-2"] {
        assert_eq!(s.tag(tag).status, "Failed", "{tag}: {s:#?}");
    }
    assert_eq!((s.tag("b-1").status.as_str(), s.tag("b-1").pid), ("Running", before.tag("b-1").pid), "{s:#?}");
    assert_eq!(installed(&s.tag("a-2").dir), V2, "a-2 was left on the new version");
    assert_eq!(installed(&s.tag("a-1").dir), V1, "a-1 was put back on the old version");
    dirs_match(&b.env, &name, &s).unwrap_or_else(|e| panic!("{e}"));

    // The fault gone, nothing starts behind the master's back (a start
    // that failed is not a crash for the agents' restart policy, 1 s)...
    ctl.clear(&new_fails);
    ctl.clear(&old_fails);
    let starts = ctl.runs_by_tag("start");
    tokio::time::sleep(std::time::Duration::from_millis(2500)).await;
    assert_eq!(ctl.runs_by_tag("start"), starts, "a failed start was started again");
    let s = settled(&b.env, &name, 20).await;
    assert_eq!((s.tag("a-1").status.as_str(), s.tag("a-2").status.as_str()), ("Failed", "Failed"), "{s:#?}");
    // ...and the operator's start brings every instance back on the
    // cluster's version (the instances out of line installed again).
    let start = b.env.run_ok(&format!("/clusters/{name}/start"), None).await;
    let s = settled(&b.env, &name, 20).await;
    assert_eq!(s.status, "Active", "{s:#?}");
    let c = b.env.cluster(&name).await;
    for i in all_instances(&c) {
        assert_eq!(i["status"], "Running", "{i:#}");
        assert_eq!(rendered(&i, "data/version").trim(), V1, "{} runs another version: {start:#}", i["id"]);
        assert_eq!(installed(&crate::common::dir_of(&i)), V1, "{}", i["id"]);
    }
    // a-1 holds the old version (its undo installed it, then its start
    // failed): only started; a-2 is installed again first.
    let steps = start["steps"].as_array().expect("steps");
    let step = steps.iter().find(|s| s["name"] == "start-order-0").unwrap_or_else(|| panic!("{start:#}"));
    let results = step["results"].as_array().expect("results").clone();
    let message = |id: &str| {
        let r = results.iter().find(|r| r["instance"] == id).unwrap_or_else(|| panic!("no result for {id}: {start:#}"));
        r["message"].as_str().unwrap_or_default().to_string()
    };
    assert!(message(a1).starts_with("started as pid"), "{start:#}");
    let m = message(a2);
    assert!(m.starts_with("installed (") && m.contains("then started as pid"), "{start:#}");
    b.clean(&name, &ids(&s)).await;
    b.took("upgrade whose undo fails".into(), began);
}

/// The version of the package installed in an instance directory.
fn installed(dir: &std::path::Path) -> String {
    let gate = std::fs::read_to_string(dir.join("bin/gate.sh")).unwrap_or_default();
    gate.lines().find_map(|l| l.strip_prefix("v=")).unwrap_or_default().to_string()
}
