//! A rendered file's `change_mode`, seen on real processes: a reconfigure
//! that changes a file signals (`signal`), leaves (`noop`, and its alias
//! `none`) or restarts (the default without a reload hook) the instance, and
//! the new content is on disk every time. When several files of a role
//! change, the heaviest mode applies.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::common::{PackageBuilder, TestEnv, cmdline, dir_of, eventually, id_of, pid_alive, pid_of, role_instances};

const SPEC: &str = r#"
[component]
name = "cm"
version = "1.0.0"

[config]
greeting = { type = "string", default = "hello" }

[[roles]]
name = "sig"
start = ["bin/start.sh"]
stop_grace = "2s"

[[roles.files]]
path = "conf/app.conf"
template = "greeting={{ cluster.config.greeting }}\n"
change_mode = "signal"
change_signal = "SIGHUP"

[[roles]]
name = "quiet"
start = ["bin/start.sh"]
stop_grace = "2s"

[[roles.files]]
path = "conf/app.conf"
template = "greeting={{ cluster.config.greeting }}\n"
change_mode = "noop"

[[roles]]
name = "none"
start = ["bin/start.sh"]
stop_grace = "2s"

[[roles.files]]
path = "conf/app.conf"
template = "greeting={{ cluster.config.greeting }}\n"
change_mode = "none"

# No change_mode and no reload hook: restart.
[[roles]]
name = "plain"
start = ["bin/start.sh"]
stop_grace = "2s"

[[roles.files]]
path = "conf/app.conf"
template = "greeting={{ cluster.config.greeting }}\n"

# Two files change at once, one noop and one signal: the signal (heavier) wins.
[[roles]]
name = "mixed"
start = ["bin/start.sh"]
stop_grace = "2s"

[[roles.files]]
path = "conf/app.conf"
template = "greeting={{ cluster.config.greeting }}\n"
change_mode = "signal"
change_signal = "SIGHUP"

[[roles.files]]
path = "conf/extra.conf"
template = "extra={{ cluster.config.greeting }}\n"
change_mode = "noop"
"#;

/// Records its pid at each start, once its traps are set (so a recorded
/// start can take a signal); on SIGHUP, appends what `conf/app.conf` says
/// at that moment to `data/hups` and keeps running. The shell itself is
/// the instance's main process: it waits on a background `sleep` so a
/// trapped signal runs at once (a foreground `sleep` would delay it).
const START: &str = r#"set -u
trap 'echo "$(cat conf/app.conf)" >> data/hups' HUP
trap 'exit 0' TERM
echo "$$" >> data/starts
sleep 100000 &
child=$!
while kill -0 "$child" 2>/dev/null; do wait "$child"; done
"#;

const ROLES: [&str; 5] = ["sig", "quiet", "none", "plain", "mixed"];

fn package() -> PackageBuilder {
    PackageBuilder::new("cm", "1.0.0").spec(SPEC).script("bin/start.sh", START)
}

fn read(instance: &Value, rel: &str) -> String {
    std::fs::read_to_string(dir_of(instance).join(rel)).unwrap_or_default()
}

/// The lines of `data/hups`: one per SIGHUP the process handled, with the
/// content of `conf/app.conf` it saw then.
fn hups(instance: &Value) -> Vec<String> {
    read(instance, "data/hups").lines().map(str::to_string).collect()
}

/// The pids the start script recorded, one per start.
fn starts(instance: &Value) -> Vec<u32> {
    read(instance, "data/starts").lines().map(|l| l.trim().parse().expect("a pid in data/starts")).collect()
}

/// The one instance of each role, by role.
fn by_role(cluster: &Value) -> BTreeMap<&'static str, Value> {
    ROLES
        .iter()
        .map(|r| {
            let v = role_instances(cluster, r);
            assert_eq!(v.len(), 1, "role {r}: {cluster:#}");
            (*r, v[0].clone())
        })
        .collect()
}

/// True when `pid` is alive and is the start script (not a reused pid).
fn is_start_script(pid: u32) -> bool {
    pid_alive(pid) && cmdline(pid).iter().any(|a| a.ends_with("bin/start.sh"))
}

/// The per-instance result messages of the operation, by instance id.
fn results(op: &Value) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for step in op["steps"].as_array().expect("steps") {
        for r in step["results"].as_array().into_iter().flatten() {
            let id = r["instance"].as_str().expect("result instance").to_string();
            out.entry(id).or_default().push(r["message"].as_str().unwrap_or_default().to_string());
        }
    }
    out
}

async fn reconfigure(env: &TestEnv, greeting: &str) -> Value {
    let op = env.run_op_patch("/clusters/cm/config", json!({"config": {"greeting": greeting}})).await;
    env.assert_succeeded(&op);
    assert_eq!(op["kind"], "Reconfigure", "{op:#}");
    op
}

#[tokio::test]
async fn a_changed_file_signals_leaves_or_restarts_its_instance_as_its_change_mode_says() {
    let env = TestEnv::start("change-modes").await;
    env.upload(&package()).await;
    let body = json!({"name": "cm", "package": {"name": "cm", "version": "1.0.0"}});
    let before = by_role(&env.create_active(body).await);
    for (role, i) in &before {
        let pid = pid_of(i);
        assert!(is_start_script(pid), "{role}: pid {pid} is not the start script: {:?}", cmdline(pid));
        // A foreground start is Running once spawned; the script records
        // itself a moment later.
        assert!(eventually(5, || !starts(i).is_empty()).await, "{role}: the start script never recorded itself");
        assert_eq!(starts(i), [pid], "{role}: the API's pid is the start script's own");
        assert_eq!(read(i, "conf/app.conf"), "greeting=hello\n", "{role}");
        assert!(hups(i).is_empty(), "{role} got a SIGHUP before any change");
    }

    let op = reconfigure(&env, "bonjour").await;
    let c = env.cluster("cm").await;
    assert_eq!(c["status"], "Active", "{c:#}");
    let after = by_role(&c);
    let messages = results(&op);
    let said = |i: &Value| messages.get(&id_of(i)).cloned().unwrap_or_default().join(" | ");

    // Every file on disk has the new content, whatever its mode.
    for (role, i) in &after {
        assert_eq!(read(i, "conf/app.conf"), "greeting=bonjour\n", "{role}: conf/app.conf on disk");
    }
    assert_eq!(read(&after["mixed"], "conf/extra.conf"), "extra=bonjour\n", "mixed: conf/extra.conf on disk");

    // signal: the same process, which got SIGHUP once and, when it did, the
    // file already said the new value.
    for role in ["sig", "mixed"] {
        let (b, a) = (&before[role], &after[role]);
        assert_eq!(pid_of(a), pid_of(b), "{role}: the API shows another pid after a signal change");
        assert!(is_start_script(pid_of(b)), "{role}: pid {} is gone after a signal change", pid_of(b));
        assert_eq!(starts(a), [pid_of(b)], "{role}: the start script ran again");
        let got = eventually(5, || !hups(a).is_empty()).await;
        assert!(got, "{role}: no SIGHUP reached pid {}", pid_of(b));
        assert_eq!(hups(a), ["greeting=bonjour"], "{role}: one SIGHUP, sent after the new file was written");
        assert!(said(a).contains("signalled"), "{role}: the operation says {:?}", said(a));
    }

    // noop and none: the same process, no signal at all.
    for role in ["quiet", "none"] {
        let (b, a) = (&before[role], &after[role]);
        assert_eq!(pid_of(a), pid_of(b), "{role}: the API shows another pid after a noop change");
        assert!(is_start_script(pid_of(b)), "{role}: pid {} is gone after a noop change", pid_of(b));
        assert_eq!(starts(a), [pid_of(b)], "{role}: the start script ran again");
        assert!(hups(a).is_empty(), "{role}: got a SIGHUP: {:?}", hups(a));
        let s = said(a);
        let only_written = s.contains("changed: conf/app.conf") && !s.contains("signalled") && !s.contains("restarted");
        assert!(only_written, "{role}: the operation says {s:?}");
    }

    // The default without a reload hook: restarted, a new process.
    let (b, a) = (&before["plain"], &after["plain"]);
    assert_ne!(pid_of(a), pid_of(b), "plain: the same pid after a restart change");
    assert!(!pid_alive(pid_of(b)), "plain: the old pid {} still runs", pid_of(b));
    assert!(is_start_script(pid_of(a)), "plain: the new pid {} is not the start script", pid_of(a));
    assert!(eventually(5, || starts(a).len() == 2).await, "plain: the new start never recorded itself");
    assert_eq!(starts(a), [pid_of(b), pid_of(a)], "plain: started once more");
    assert!(hups(a).is_empty(), "plain: got a SIGHUP: {:?}", hups(a));
    assert!(said(a).contains("restarted"), "plain: the operation says {:?}", said(a));

    // A second change signals again; the noop instances still get nothing.
    reconfigure(&env, "salut").await;
    let again = by_role(&env.cluster("cm").await);
    for role in ["sig", "mixed"] {
        let a = &again[role];
        assert_eq!(pid_of(a), pid_of(&before[role]), "{role}: another pid after the second change");
        let got = eventually(5, || hups(a).len() == 2).await;
        assert!(got, "{role}: the second change sent no SIGHUP: {:?}", hups(a));
        assert_eq!(hups(a), ["greeting=bonjour", "greeting=salut"], "{role}");
    }
    for role in ["quiet", "none"] {
        let a = &again[role];
        assert_eq!(pid_of(a), pid_of(&before[role]), "{role}: another pid after the second change");
        assert!(is_start_script(pid_of(a)), "{role}: pid {} is gone", pid_of(a));
        assert_eq!(read(a, "conf/app.conf"), "greeting=salut\n", "{role}");
        assert!(hups(a).is_empty(), "{role}: got a SIGHUP: {:?}", hups(a));
    }
    let third = eventually(5, || starts(&again["plain"]).len() == 3).await;
    assert!(third, "plain: not restarted for the second change: {:?}", starts(&again["plain"]));

    // The same value again changes no file: nothing is signalled or restarted.
    reconfigure(&env, "salut").await;
    let same = by_role(&env.cluster("cm").await);
    // A signal would have been sent before the operation ended; give a trap
    // that would record it time to run.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    for (role, i) in &same {
        assert_eq!(pid_of(i), pid_of(&again[role]), "{role}: another pid though no file changed");
    }
    for role in ["sig", "mixed"] {
        assert_eq!(hups(&same[role]).len(), 2, "{role}: signalled though no file changed");
    }
    assert_eq!(starts(&same["plain"]).len(), 3, "plain: restarted though no file changed");
}
