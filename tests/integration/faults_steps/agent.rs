//! The agent SIGKILLed inside each step that runs a script: the step's
//! script is held on one instance, that instance's agent is killed, and
//! it stays dead until the operation has ended (so every command of the
//! step and of its undo on that node fails on the lost link). Then the
//! held script is let go (a start goes on to run its process, orphaned),
//! the agent is started again and re-adopts what runs.

use std::collections::BTreeSet;
use std::time::Instant;

use super::{Bench, Kind, dirs_match, failed_at, ids, named};
use crate::common::TestEnv;
use crate::common::faulty::{Seen, settled, wait_held};

/// The leaked instances `GET /nodes/{node}` lists.
async fn leaked(env: &TestEnv, node: &str) -> BTreeSet<String> {
    let (_, n) = env.get(&format!("/nodes/{node}")).await;
    n["node"]["leaked"]
        .as_array()
        .or_else(|| n["leaked"].as_array())
        .into_iter()
        .flatten()
        .filter_map(|l| l["instance"].as_str().map(str::to_string))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_killed_inside_each_step_of_each_operation() {
    let env = TestEnv::start_with("faults-steps-agent", &[("FLOTILLA_MASTER_LEAKED_GRACE", "1s")]).await;
    let mut b = Bench::with(env, "sa").await;
    let mut count = 0;
    for kind in Kind::ALL {
        for (step, what, tag) in kind.scripted() {
            let began = Instant::now();
            let (name, ctl) = b.next();
            let before = b.prepare(kind, &name, &ctl).await;
            ctl.hold(what, tag);
            let id = b.request(kind, &name, &ctl, before.as_ref()).await;
            let at = format!("{kind:?}, agent of {tag} killed in step {step} ({what})");
            wait_held(&b.env, &ctl, &id, step, what, tag).await;
            let during = b.env.cluster(&name).await;
            let victim = Seen::from(&during).agent_of(tag);
            b.env.kill_agent(victim);
            let op = b.wait(&id).await;
            ctl.release(what, tag);
            b.env.restart_agent(victim).await;

            let mut all: BTreeSet<String> = before.as_ref().map(ids).unwrap_or_default();
            all.extend(named(&op));
            assert!(matches!(op["status"].as_str(), Some("Failed" | "RolledBack")), "{at}: {op:#}");
            failed_at(&op, step).unwrap_or_else(|e| panic!("{at}: {e}: {op:#}"));
            let (status, _) = b.env.get(&format!("/clusters/{name}")).await;
            assert_eq!(status, 200, "{at}: the cluster is gone");
            let s = settled(&b.env, &name, 20).await;
            all.extend(ids(&s));
            // Honest: the step, the instance on the lost node, and why.
            let killed = Seen::from(&during).tag(tag).id.clone();
            let error = op["error"].as_str().unwrap_or_default();
            assert!(error.contains(&killed) && error.contains("is not connected"), "{at}: {error}");
            if op["status"] == "RolledBack" {
                assert_eq!(s.status, "Active", "{at}: {s:#?}");
                assert!(s.description.contains("rolled back"), "{at}: {}", s.description);
            } else {
                assert_eq!(s.status, "Error", "{at}: {s:#?}");
                assert!(s.description.contains(step) && s.description.contains(&killed), "{at}: {}", s.description);
            }
            // Directories: those of the instances the master shows, and any
            // other is a leak its node reports (an undo that could not
            // reach it), removed after the grace (checked by `clean`).
            if let Err(e) = dirs_match(&b.env, &name, &s) {
                let l = leaked(&b.env, &format!("node-{victim}")).await;
                let on_disk = crate::common::faulty::dirs_on_agents(&b.env);
                let extra: BTreeSet<String> =
                    on_disk.into_iter().filter(|d| d.starts_with(&format!("{name}-")) && !all.contains(d)).collect();
                assert!(extra.is_empty(), "{at}: directories of no instance ever seen: {extra:?}");
                let unknown: Vec<&String> = all.iter().filter(|i| !ids(&s).contains(*i)).collect();
                assert!(unknown.iter().all(|i| l.contains(*i) || !dirs_on(&b.env, i)), "{at}: {e}; leaked {l:?}");
            }
            // The operator's way back: a start (a failed create or delete is
            // deleted by `clean`).
            if s.status == "Error" && !matches!(kind, Kind::Create | Kind::Delete) {
                b.env.run_ok(&format!("/clusters/{name}/start"), None).await;
                let s = settled(&b.env, &name, 20).await;
                assert_eq!(s.status, "Active", "{at}: after a start: {s:#?}");
                assert!(s.instances.values().all(|i| i.status == "Running"), "{at}: after a start: {s:#?}");
                // Every member's files render the cluster as it is, also
                // where an undo could not rewrite them (its agent was dead):
                // the start puts them in line first (`refresh-files`).
                let ordinals: Vec<&str> = s.instances.keys().filter_map(|t| t.strip_prefix("a-")).collect();
                let want = format!("{} tick=1", ordinals.join(" "));
                for i in crate::common::all_instances(&b.env.cluster(&name).await) {
                    let conf = crate::common::scripts::rendered(&i, "conf/members");
                    assert_eq!(conf.lines().next(), Some(want.as_str()), "{at}: {}", i["id"]);
                }
            }
            b.clean(&name, &all).await;
            b.took(format!("{kind:?} {step}"), began);
            count += 1;
        }
    }
    assert_eq!(count, 24);
    delete_instances_on_a_dead_node(&mut b).await;
    b.summary();
}

fn dirs_on(env: &TestEnv, id: &str) -> bool {
    crate::common::faulty::dirs_on_agents(env).iter().any(|d| d == id)
}

/// A step that runs no script, reached with its agent dead: a delete's
/// `delete-instances`, node-1's agent killed once its instance's destroy
/// hook ran (order 0) while b-1's (order 1) is held, so the step before
/// ends well. The delete fails there, naming the instance; the others
/// are removed; once the agent is back, a delete finishes the job.
async fn delete_instances_on_a_dead_node(b: &mut Bench) {
    let began = Instant::now();
    let (name, ctl) = b.next();
    let before = b.create(&name, &ctl).await;
    ctl.hold("destroy", "b-1");
    let id = b.request(Kind::Delete, &name, &ctl, Some(&before)).await;
    let at = "Delete, agent of a-1 dead when delete-instances reaches it";
    wait_held(&b.env, &ctl, &id, "destroy", "destroy", "b-1").await;
    assert_eq!(ctl.runs("destroy", "a-1"), 1, "{at}: a-1's destroy has not run");
    let victim = before.agent_of("a-1");
    b.env.kill_agent(victim);
    ctl.release("destroy", "b-1");
    let op = b.wait(&id).await;
    b.env.restart_agent(victim).await;
    assert_eq!(op["status"], "Failed", "{at}: {op:#}");
    failed_at(&op, "delete-instances").unwrap_or_else(|e| panic!("{at}: {e}: {op:#}"));
    let s = settled(&b.env, &name, 20).await;
    let a1 = &before.tag("a-1").id;
    assert_eq!(s.status, "Error", "{at}: {s:#?}");
    assert!(s.description.contains("delete-instances") && s.description.contains(a1.as_str()), "{at}: {s:#?}");
    assert!(s.instances.values().all(|i| i.status != "Running"), "{at}: {s:#?}");
    assert!(dirs_on(&b.env, a1), "{at}: a-1 was on a dead node, yet its directory is gone");
    for tag in ["a-2", "b-1"] {
        assert!(!dirs_on(&b.env, &before.tag(tag).id), "{at}: {tag} was not removed");
    }
    b.clean(&name, &ids(&before)).await;
    b.took("Delete delete-instances".into(), began);
}
