//! Every operation with a failure injected for real at each step in turn
//! (issue 9), on the real system: the `flotilla` binary as master and
//! three agents, the gated package of `common::faulty`, real processes
//! and files.
//!
//! The faults: a script that fails (a hook exiting 1, a process that
//! refuses to start: `scripts`), the agent killed inside the step
//! (`agent`), the master's store refusing the write (its data dir on a
//! full tmpfs: `store`), the master killed inside the step and the
//! operation resumed by the next one, so the step runs twice (`twice`),
//! and an undo that fails (`undo`). A test catches an operation inside a
//! step by holding that step's script in its gate (`hold-*` switches),
//! then injects its fault.
//!
//! 24 steps of the ten plans run a script ([`Kind::script`]); each fault
//! is injected in each of them. A member's replace (`Kind::Replace`, its 7
//! scripted steps) is run twice so far (`twice`); the other faults on it
//! are still to come. Of the steps that run none: `install` is
//! caught in the middle by its size (`install`: the master or the agent
//! killed; create and scale-out), and a delete's `delete-instances` is
//! reached with its agent dead (`agent`). The others (`allocate`,
//! `forget`, `set-config`, `set-version`, `set-limits`, and a create's
//! `configure`, which sends nothing since the install carried the files)
//! touch only the master's store, in a few milliseconds: the store is
//! their only fault, and no test can time it from outside without a
//! switch in the binary; the runner's unit tests fail every journal write
//! in turn (`operations::runner`), and `store` shows what a full disk
//! does to a real master.
//!
//! Each scenario runs on a fresh cluster (`a-1` on node-1, `a-2` on
//! node-2, `b-1` on node-3; `a` starts before `b`) and checks what a
//! user would: the operation's status and failed step, the cluster's
//! status and description, each instance's status, the processes in
//! `/proc` (a `Running` instance has exactly its one process, any other
//! none), the instance directories on the agents; then deletes the
//! cluster and checks nothing of it is left. Scenarios of one env run
//! in turn.

mod agent;
mod install;
mod scripts;
mod store;
mod twice;
mod undo;

use std::collections::BTreeSet;
use std::time::Instant;

use serde_json::{Value, json};

use crate::common::faulty::{self, Ctl, CtlRoot, Seen, dirs_on_agents, operation, settled, step_names};
use crate::common::procfs::instance_pids;
use crate::common::scripts::rendered;
use crate::common::{TestEnv, all_instances};

/// The versions of the package every env uploads.
pub const V1: &str = "1.0.0";
pub const V2: &str = "2.0.0";

/// The operations, each on a cluster in the state it needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Create,
    Start,
    Stop,
    Restart,
    ScaleOut,
    ScaleIn,
    Config,
    Upgrade,
    Resize,
    Delete,
    /// `a-2` replaced (by `a-3`); only `twice` runs it so far.
    Replace,
}

impl Kind {
    pub const ALL: [Kind; 10] = [
        Kind::Create,
        Kind::Start,
        Kind::Stop,
        Kind::Restart,
        Kind::ScaleOut,
        Kind::ScaleIn,
        Kind::Config,
        Kind::Upgrade,
        Kind::Resize,
        Kind::Delete,
    ];

    /// The steps of its plan, as the operation record must name them.
    pub fn steps(self) -> &'static [&'static str] {
        match self {
            Kind::Create => &["allocate", "install", "configure", "init", "start-order-0", "start-order-1"],
            Kind::Start => &["refresh-files", "start-order-0", "start-order-1"],
            Kind::Stop => &["stop-order-1", "stop-order-0"],
            Kind::Restart => &["stop-order-1", "stop-order-0", "start-order-0", "start-order-1"],
            Kind::ScaleOut => &["allocate", "install", "init", "start-order-0", "configure", "scale-out-hook"],
            Kind::ScaleIn => &["scale-in-hook", "decommission-order-0", "delete-instances", "forget", "configure"],
            Kind::Config => &["set-config", "reconfigure"],
            Kind::Upgrade => &["set-version", "upgrade"],
            Kind::Resize => &["set-limits", "resize"],
            Kind::Delete => &["stop-order-1", "stop-order-0", "destroy", "delete-instances", "forget"],
            Kind::Replace => &[
                "add-allocate",
                "add-install",
                "add-init",
                "add-start-order-0",
                "add-configure",
                "add-scale-out-hook",
                "remove-scale-in-hook",
                "remove-decommission-order-0",
                "remove-delete-instances",
                "remove-forget",
                "remove-configure",
            ],
        }
    }

    /// The script a step runs and the instance (tag) a test aims at;
    /// `None` for a step that runs no script (the master's own records,
    /// an install, rendered files, a removal).
    pub fn script(self, step: &str) -> Option<(&'static str, &'static str)> {
        let s = match (self, step) {
            (Kind::Create | Kind::Start | Kind::Restart, "start-order-0") => ("start", "a-2"),
            (Kind::Create | Kind::Start | Kind::Restart, "start-order-1") => ("start", "b-1"),
            (Kind::Create, "init") => ("init", "a-2"),
            (Kind::Stop | Kind::Restart | Kind::Delete, "stop-order-1") => ("stop", "b-1"),
            (Kind::Stop | Kind::Restart | Kind::Delete, "stop-order-0") => ("stop", "a-2"),
            (Kind::ScaleOut, "init") => ("init", "a-3"),
            (Kind::ScaleOut, "start-order-0") => ("start", "a-3"),
            (Kind::ScaleOut, "configure") => ("reload", "a-2"),
            (Kind::ScaleOut, "scale-out-hook") => ("scale_out", "a-2"),
            (Kind::ScaleIn, "scale-in-hook") => ("scale_in", "a-1"),
            (Kind::ScaleIn, "decommission-order-0") => ("stop", "a-2"),
            (Kind::ScaleIn, "configure") => ("reload", "a-1"),
            (Kind::Config, "reconfigure") => ("reload", "a-2"),
            // The new version's (or the new limits') start of the second
            // instance replaced: the first one is replaced already.
            (Kind::Upgrade, "upgrade") | (Kind::Resize, "resize") => ("start", "a-2"),
            (Kind::Delete, "destroy") => ("destroy", "a-2"),
            (Kind::Replace, "add-init") => ("init", "a-3"),
            (Kind::Replace, "add-start-order-0") => ("start", "a-3"),
            (Kind::Replace, "add-configure") => ("reload", "a-1"),
            (Kind::Replace, "add-scale-out-hook") => ("scale_out", "a-1"),
            (Kind::Replace, "remove-scale-in-hook") => ("scale_in", "a-1"),
            (Kind::Replace, "remove-decommission-order-0") => ("stop", "a-2"),
            // a-3: reloaded only when shrinking (a-1 is in both configures).
            (Kind::Replace, "remove-configure") => ("reload", "a-3"),
            _ => return None,
        };
        Some(s)
    }

    /// Steps that run a script, with it.
    pub fn scripted(self) -> Vec<(&'static str, &'static str, &'static str)> {
        self.steps().iter().filter_map(|s| self.script(s).map(|(w, t)| (*s, w, t))).collect()
    }

    /// The version the instances run after the operation succeeded.
    pub fn version_after(self) -> &'static str {
        if self == Kind::Upgrade { V2 } else { V1 }
    }

    /// What an uninterrupted run leaves.
    pub fn after(self) -> After {
        const ALL: &[&str] = &["a-1", "a-2", "b-1"];
        const FOUR: &[&str] = &["a-1", "a-2", "a-3", "b-1"];
        const ONCE: &[(&str, usize)] = &[("a-1", 1), ("a-2", 1), ("b-1", 1)];
        const TWICE: &[(&str, usize)] = &[("a-1", 2), ("a-2", 2), ("b-1", 2)];
        let a = |status, members, running, starts, conf| After { status, members, running, starts, conf };
        match self {
            Kind::Create => a(Some("Active"), ALL, ALL, ONCE, "1 2 tick=1"),
            Kind::Start | Kind::Restart | Kind::Upgrade => a(Some("Active"), ALL, ALL, TWICE, "1 2 tick=1"),
            Kind::Stop => a(Some("Stopped"), ALL, &[], ONCE, "1 2 tick=1"),
            Kind::ScaleOut => {
                a(Some("Active"), FOUR, FOUR, &[("a-1", 1), ("a-2", 1), ("a-3", 1), ("b-1", 1)], "1 2 3 tick=1")
            }
            Kind::ScaleIn => a(Some("Active"), &["a-1", "b-1"], &["a-1", "b-1"], ONCE, "1 tick=1"),
            Kind::Config => a(Some("Active"), ALL, ALL, ONCE, "1 2 tick=2"),
            Kind::Resize => a(Some("Active"), ALL, ALL, &[("a-1", 2), ("a-2", 2), ("b-1", 1)], "1 2 tick=1"),
            Kind::Delete => a(None, &[], &[], ONCE, ""),
            Kind::Replace => {
                const AFTER: &[&str] = &["a-1", "a-3", "b-1"];
                a(Some("Active"), AFTER, AFTER, &[("a-1", 1), ("a-2", 1), ("a-3", 1), ("b-1", 1)], "1 3 tick=1")
            }
        }
    }
}

/// What an uninterrupted run of a [`Kind`] leaves.
pub struct After {
    /// The cluster's status; `None`: deleted.
    pub status: Option<&'static str>,
    /// Its instances (tags), and those of them that run.
    pub members: &'static [&'static str],
    pub running: &'static [&'static str],
    /// How often each start script ran in all (the create's included).
    pub starts: &'static [(&'static str, usize)],
    /// The first line of every member's `conf/members`.
    pub conf: &'static str,
}

/// The cluster `name` is as an uninterrupted run of `kind` leaves it (see
/// [`Kind::after`]): status, members, one process each for those that
/// run and none for the others, directories, files, version, and each
/// start script run as often as it would have been. Answers every
/// instance id it saw.
pub async fn as_uninterrupted(b: &Bench, kind: Kind, name: &str, ctl: &Ctl, at: &str) -> BTreeSet<String> {
    let want = kind.after();
    let env = &b.env;
    let starts: std::collections::BTreeMap<String, usize> =
        want.starts.iter().map(|(t, n)| (t.to_string(), *n)).collect();
    assert_eq!(ctl.runs_by_tag("start"), starts, "{at}: start scripts run");
    let Some(status) = want.status else {
        let (code, body) = env.get(&format!("/clusters/{name}")).await;
        assert_eq!(code, 404, "{at}: the cluster is still there: {body:#}");
        return BTreeSet::new();
    };
    let s = settled(env, name, 20).await;
    assert_eq!(s.status, status, "{at}: {s:#?}");
    let tags: BTreeSet<&str> = s.instances.keys().map(String::as_str).collect();
    assert_eq!(tags, want.members.iter().copied().collect(), "{at}: the members: {s:#?}");
    for (tag, i) in &s.instances {
        assert_eq!(i.status == "Running", want.running.contains(&tag.as_str()), "{at}: {tag}: {s:#?}");
    }
    dirs_match(env, name, &s).unwrap_or_else(|e| panic!("{at}: {e}"));
    assert_eq!(s.version, kind.version_after(), "{at}");
    for i in all_instances(&env.cluster(name).await) {
        let conf = rendered(&i, "conf/members");
        assert_eq!(conf.lines().next(), Some(want.conf), "{at}: {}", i["id"]);
        if i["status"] == "Running" {
            assert_eq!(rendered(&i, "data/version").trim(), kind.version_after(), "{at}: {}", i["id"]);
        }
    }
    ids(&s)
}

/// One env's clusters: names, control dirs, and the time each scenario took.
pub struct Bench {
    pub env: TestEnv,
    pub ctls: CtlRoot,
    prefix: &'static str,
    n: usize,
    pub times: Vec<(String, f64)>,
}

impl Bench {
    /// An env with both versions of the package uploaded.
    pub async fn start(name: &str, prefix: &'static str) -> Bench {
        let env = TestEnv::start(name).await;
        Bench::with(env, prefix).await
    }

    pub async fn with(env: TestEnv, prefix: &'static str) -> Bench {
        Bench::with_v1(env, prefix, faulty::package(V1)).await
    }

    /// With `v1` as the package's version 1.0.0.
    pub async fn with_v1(env: TestEnv, prefix: &'static str, v1: faulty::PackageBuilder) -> Bench {
        env.upload(&v1).await;
        env.upload(&faulty::package(V2)).await;
        Bench { env, ctls: CtlRoot::new(), prefix, n: 0, times: Vec::new() }
    }

    /// A fresh cluster name and its control dir.
    pub fn next(&mut self) -> (String, Ctl) {
        self.n += 1;
        let name = format!("{}{}", self.prefix, self.n);
        let ctl = self.ctls.cluster(&name);
        (name, ctl)
    }

    /// Creates `name` and waits for it to be `Active`.
    pub async fn create(&self, name: &str, ctl: &Ctl) -> Seen {
        self.env.create_active(faulty::create_body(name, V1, ctl)).await;
        settled(&self.env, name, 20).await
    }

    /// A cluster in the state `kind` needs (`None` for a create: there is
    /// none yet).
    pub async fn prepare(&self, kind: Kind, name: &str, ctl: &Ctl) -> Option<Seen> {
        if kind == Kind::Create {
            return None;
        }
        let s = self.create(name, ctl).await;
        if kind == Kind::Start {
            self.env.run_ok(&format!("/clusters/{name}/stop"), None).await;
            return Some(settled(&self.env, name, 20).await);
        }
        Some(s)
    }

    /// Sends the request of `kind` on `name`; the operation's id. Asserts
    /// 202 and the plan's step names.
    pub async fn request(&self, kind: Kind, name: &str, ctl: &Ctl, before: Option<&Seen>) -> String {
        let env = &self.env;
        let path = format!("/clusters/{name}");
        let (status, body) = match kind {
            Kind::Create => env.post("/clusters", faulty::create_body(name, V1, ctl)).await,
            Kind::Start => env.post_empty(&format!("{path}/start")).await,
            Kind::Stop => env.post_empty(&format!("{path}/stop")).await,
            Kind::Restart => env.post_empty(&format!("{path}/restart")).await,
            Kind::ScaleOut => {
                env.post(&format!("{path}/scale"), json!({"role": "a", "add": 1, "nodes": ["node-3"]})).await
            }
            Kind::ScaleIn => {
                let victim = &before.expect("a cluster").tag("a-2").id;
                env.post(&format!("{path}/scale"), json!({"role": "a", "remove": [victim]})).await
            }
            Kind::Config => env.patch(&format!("{path}/config"), json!({"config": {"tick": 2}})).await,
            Kind::Upgrade => env.post(&format!("{path}/upgrade"), json!({"version": V2})).await,
            Kind::Resize => env.patch(&format!("{path}/roles/a"), json!({"resources": {"memory": "256M"}})).await,
            Kind::Delete => env.delete(&path).await,
            Kind::Replace => {
                let victim = &before.expect("a cluster").tag("a-2").id;
                env.post_empty(&format!("{path}/instances/{victim}/replace")).await
            }
        };
        assert_eq!(status, 202, "{kind:?} of {name}: {body:#}");
        let id = body["operation"]["id"].as_str().expect("operation id").to_string();
        let op = operation(env, &id).await;
        assert_eq!(step_names(&op), kind.steps(), "the plan of {kind:?}: {op:#}");
        id
    }

    /// Waits for the operation to end (also checks that the cluster then no
    /// longer shows it running).
    pub async fn wait(&self, op: &str) -> Value {
        self.env.wait_op(op).await
    }

    /// The end of a scenario: deletes `name` (if it is still there) and
    /// checks nothing of any of `ids` is left: no process, no directory.
    pub async fn clean(&self, name: &str, ids: &BTreeSet<String>) {
        let env = &self.env;
        let (status, _) = env.get(&format!("/clusters/{name}")).await;
        if status == 200 {
            let (status, body) = env.delete(&format!("/clusters/{name}")).await;
            assert_eq!(status, 202, "delete {name}: {body:#}");
            let op = self.wait(body["operation"]["id"].as_str().expect("op id")).await;
            env.assert_succeeded(&op);
        }
        // An instance the master no longer knows (an undo that could not
        // reach its node) is a leak of its node, removed after the
        // master's `leaked_grace` (1 s where a test makes leaks).
        let left = || {
            let dirs = dirs_on_agents(env);
            ids.iter()
                .filter(|id| !instance_pids(id).is_empty() || dirs.contains(*id))
                .map(|id| format!("{id}: processes {:?}, directory {}", instance_pids(id), dirs.contains(id)))
                .collect::<Vec<_>>()
        };
        if !crate::common::eventually(15, || left().is_empty()).await {
            panic!("left after cluster {name} was deleted: {:?}\n{}", left(), env.log_tails());
        }
    }

    pub fn took(&mut self, what: String, since: Instant) {
        let s = since.elapsed().as_secs_f64();
        eprintln!("{}: {what}: {s:.1} s", self.env.name);
        self.times.push((what, s));
    }

    pub fn summary(&self) {
        let total: f64 = self.times.iter().map(|(_, s)| s).sum();
        eprintln!("{}: {} scenarios in {total:.1} s", self.env.name, self.times.len());
    }
}

/// Every instance id `s` shows.
pub fn ids(s: &Seen) -> BTreeSet<String> {
    s.instances.values().map(|i| i.id.clone()).collect()
}

/// Every instance id an operation's results name (a member it added and
/// then removed again too).
pub fn named(op: &Value) -> BTreeSet<String> {
    op["steps"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|s| s["results"].as_array().cloned().unwrap_or_default())
        .filter_map(|r| r["instance"].as_str().map(str::to_string))
        .collect()
}

/// The instance directories on the agents are exactly those of the
/// instances the master shows for the cluster (by id prefix `name-`).
pub fn dirs_match(env: &TestEnv, name: &str, s: &Seen) -> Result<(), String> {
    let on_disk: BTreeSet<String> =
        dirs_on_agents(env).into_iter().filter(|d| d.starts_with(&format!("{name}-"))).collect();
    let known = ids(s);
    if on_disk == known { Ok(()) } else { Err(format!("directories {on_disk:?}, instances {known:?}")) }
}

/// The step `step` of `op` failed (or was undone after failing), and the
/// operation's error names it.
pub fn failed_at(op: &Value, step: &str) -> Result<(), String> {
    let status = faulty::step_status(op, step);
    let error = op["error"].as_str().unwrap_or_default();
    if matches!(status.as_str(), "Failed" | "Undone" | "UndoFailed") && error.contains(step) {
        Ok(())
    } else {
        Err(format!("step {step} is {status}, the operation's error {error:?}"))
    }
}
