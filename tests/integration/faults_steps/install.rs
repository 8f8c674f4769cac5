//! The install step runs no script: it is caught in the middle by its
//! size (version 1.0.0 carries 24 MiB of random bytes in this env, so
//! each install streams for a while into the agent's staging dir), then
//! the master or the agent is SIGKILLed. Create and scale-out.

use std::time::Instant;

use super::{Bench, Kind, V1, as_uninterrupted, failed_at, ids};
use crate::common::TestEnv;
use crate::common::faulty::{big_package, install_leftovers, operation, settled, step_status};

/// Waits until the operation's install step runs and agent `i` has
/// begun receiving it.
async fn mid_install(b: &Bench, op: &str, i: usize, at: &str) {
    let env = &b.env;
    let began = crate::common::eventually(30, || !install_leftovers(env, i).is_empty()).await;
    assert!(began, "{at}: the install never began on node-{i}");
    let o = operation(env, op).await;
    assert_eq!(step_status(&o, "install"), "Running", "{at}: caught too late: {o:#}");
}

/// Removes the packages agent `i` keeps, so the next install streams
/// the package (one taken from the cache is extracted in a moment, too
/// quick to be caught in the middle: node-3 holds the package from b-1).
fn drop_package_cache(env: &TestEnv, i: usize) {
    if let Ok(rd) = std::fs::read_dir(env.agent_dir(i).join("packages")) {
        for e in rd.flatten().filter(|e| e.file_name().to_string_lossy().ends_with(".tar.gz")) {
            std::fs::remove_file(e.path()).expect("remove a cached package");
        }
    }
}

/// The node (agent index) the instance `tag` of the operation goes to.
fn node_of(kind: Kind, tag: &str) -> usize {
    match (kind, tag) {
        (Kind::Create, "a-1") => 1,
        (Kind::ScaleOut, "a-3") => 3,
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_install_cut_short_by_the_master_or_the_agent() {
    let env = TestEnv::start("faults-steps-install").await;
    let mut b = Bench::with_v1(env, "si", big_package(V1, 24)).await;
    // What an uninterrupted create leaves: each instance's generation
    // (one per command that may change what its agent holds).
    let (name, ctl) = b.next();
    let reference = b.create(&name, &ctl).await;
    let g0 = generations(&b.env, &name).await;
    b.clean(&name, &ids(&reference)).await;

    for (kind, tag) in [(Kind::Create, "a-1"), (Kind::ScaleOut, "a-3")] {
        let node = node_of(kind, tag);
        // The master killed mid-install: the next one runs the install
        // again, and the end is that of an uninterrupted run.
        let began = Instant::now();
        let (name, ctl) = b.next();
        let before = b.prepare(kind, &name, &ctl).await;
        drop_package_cache(&b.env, node);
        let id = b.request(kind, &name, &ctl, before.as_ref()).await;
        let at = format!("{kind:?}, master killed while {tag} installs");
        mid_install(&b, &id, node, &at).await;
        b.env.kill_master();
        b.env.start_master_again().await;
        b.env.wait_ready().await;
        let op = b.wait(&id).await;
        assert_eq!(op["status"], "Succeeded", "{at}: {op:#}");
        let mut all = before.as_ref().map(ids).unwrap_or_default();
        all.extend(as_uninterrupted(&b, kind, &name, &ctl, &at).await);
        if kind == Kind::Create {
            // The install was sent again: one generation more than an
            // uninterrupted create gave it.
            let g = generations(&b.env, &name).await;
            assert_eq!(g[tag], g0[tag] + 1, "{at}: the install did not run again: {g:?} against {g0:?}");
        }
        assert!(install_leftovers(&b.env, node).is_empty(), "{at}: {:?}", install_leftovers(&b.env, node));
        b.clean(&name, &all).await;
        b.took(format!("{kind:?} install, master killed"), began);

        // The agent killed mid-install: the step fails on the lost link.
        let began = Instant::now();
        let (name, ctl) = b.next();
        let before = b.prepare(kind, &name, &ctl).await;
        drop_package_cache(&b.env, node);
        let id = b.request(kind, &name, &ctl, before.as_ref()).await;
        let at = format!("{kind:?}, agent of {tag} killed while it installs");
        mid_install(&b, &id, node, &at).await;
        b.env.kill_agent(node);
        let op = b.wait(&id).await;
        b.env.restart_agent(node).await;
        assert_eq!(op["status"], "Failed", "{at}: {op:#}");
        failed_at(&op, "install").unwrap_or_else(|e| panic!("{at}: {e}: {op:#}"));
        let swept = crate::common::eventually(5, || install_leftovers(&b.env, node).is_empty()).await;
        assert!(swept, "{at}: left by the install: {:?}", install_leftovers(&b.env, node));
        let s = settled(&b.env, &name, 20).await;
        assert_eq!(s.status, "Error", "{at}: {s:#?}");
        let victim = crate::common::faulty::dirs_on_agents(&b.env);
        let mut all = before.as_ref().map(ids).unwrap_or_default();
        all.extend(ids(&s));
        if kind == Kind::Create {
            let v = &s.tag(tag).id;
            assert!(s.description.contains("install") && s.description.contains(v.as_str()), "{at}: {s:#?}");
            assert!(!victim.contains(v), "{at}: {v} has a directory although its install never ended");
            assert!(s.instances.values().all(|i| i.status != "Running"), "{at}: {s:#?}");
        } else {
            // The new member is forgotten, its node never got it.
            assert!(!s.instances.contains_key(tag), "{at}: {s:#?}");
            assert!(!victim.iter().any(|d| d.starts_with(&format!("{name}-a-3-"))), "{at}: {victim:?}");
            assert!(s.description.contains("install"), "{at}: {s:#?}");
            // The operator's start brings the cluster back.
            b.env.run_ok(&format!("/clusters/{name}/start"), None).await;
            let s = settled(&b.env, &name, 20).await;
            assert_eq!(s.status, "Active", "{at}: {s:#?}");
            assert!(s.instances.values().all(|i| i.status == "Running"), "{at}: {s:#?}");
        }
        b.clean(&name, &all).await;
        b.took(format!("{kind:?} install, agent killed"), began);
    }
    b.summary();
}

/// Every instance's generation, by tag.
async fn generations(env: &TestEnv, name: &str) -> std::collections::BTreeMap<String, u64> {
    let c = env.cluster(name).await;
    crate::common::all_instances(&c)
        .iter()
        .map(|i| {
            (format!("{}-{}", i["role"].as_str().unwrap_or("?"), i["ordinal"]), i["generation"].as_u64().unwrap_or(0))
        })
        .collect()
}
