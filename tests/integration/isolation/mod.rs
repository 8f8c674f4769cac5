//! Issue 22: an instance reaches nothing beyond its own sandbox. Each
//! attack found (a package planting links, FIFOs and hard links where the
//! root agent reads and writes, clusters tampering with each other) is
//! made here by a real package on real agents, and what a user would check
//! is checked: the API's answer, the files outside, the processes in
//! `/proc`.

mod logs;
mod secrets;
mod trees;
mod users;

use serde_json::json;

use crate::common::{PackageBuilder, TestEnv, role_instances};

/// One role whose start script makes the attack named by the cluster's
/// `attack` config value (with `target` as its argument), then sleeps.
pub const SPEC: &str = r#"
[component]
name = "intruder"
version = "1.0.0"

[config]
attack = { type = "string", default = "none" }
target = { type = "string", default = "" }

[[roles]]
name = "svc"
count = { min = 1, max = 1 }
start = ["bin/start.sh"]
stop_grace = "2s"

[[roles.files]]
path = "conf/attack"
template = "{{ cluster.config.attack }}"

[[roles.files]]
path = "conf/target"
template = "{{ cluster.config.target }}"
"#;

/// What the instance does to its own directory before it sleeps (as its
/// own user, in its instance directory).
pub const START: &str = r#"set -u
attack=$(cat conf/attack)
target=$(cat conf/target)
case "$attack" in
  stdout-link) rm -f logs/stdout.log; ln -s "$target" logs/stdout.log ;;
  stderr-link) rm -f logs/stderr.log; ln -s "$target" logs/stderr.log ;;
  fifo) rm -f logs/stdout.log; mkfifo logs/stdout.log ;;
  logs-dir-link) mv logs logs.real; ln -s "$target" logs ;;
  swap)
    # A link swapped in and out of stdout.log for as long as it runs.
    ( while true; do
        ln -sf "$target" logs/.x && mv -f logs/.x logs/stdout.log
        echo "a real line" > logs/.y && mv -f logs/.y logs/stdout.log
      done ) &
    ;;
  tree-links)
    # Links where the agent carries over (upgrade) and removes (delete).
    ln -s "$target" data/victim-dir
    ln -s "$target/keep" data/victim-file
    mkfifo data/fifo
    rm -rf run && ln -s "$target" run
    ;;
esac
echo "started as $(id -u)"
touch data/planted
exec sleep 100000
"#;

/// The intruder package at `version`.
pub fn intruder(version: &str) -> PackageBuilder {
    PackageBuilder::new("intruder", version).spec(&SPEC.replace("1.0.0", version)).script("bin/start.sh", START)
}

/// Creates cluster `name` of the intruder making `attack` with `target`,
/// waits until it is Active, and returns its one instance.
pub async fn attack(env: &TestEnv, name: &str, attack: &str, target: &str) -> serde_json::Value {
    let c = env
        .create_active(json!({
            "name": name,
            "package": {"name": "intruder", "version": "1.0.0"},
            "config": {"attack": attack, "target": target},
        }))
        .await;
    let i = role_instances(&c, "svc").remove(0);
    let planted = crate::common::dir_of(&i).join("data/planted");
    let done = crate::common::eventually(20, || planted.exists()).await;
    assert!(done, "the start script of {name} did not make its attack");
    i
}
