//! Reconfiguration: new config values re-render every instance's files;
//! instances whose files changed reload (when their role has `reload`) or
//! restart one at a time, each waiting for health before the next stops;
//! instances whose files did not change are not touched.

use serde_json::{Value, json};

use crate::common::{PackageBuilder, TestEnv, dir_of, id_of, pid_alive, pid_of, role_instances};

const SPEC: &str = r#"
[component]
name = "roll"
version = "1.0.0"

[config]
greeting = { type = "string", default = "hello" }

[[roles]]
name = "web"
count = { min = 1, max = 5 }
ports = ["http"]
start = ["bin/web.sh"]
stop_grace = "3s"
start_timeout = "10s"
health = { cmd = ["bin/ready.sh"] }

[[roles.files]]
path = "conf/greeting"
template = "{{ cluster.config.greeting }}\n"

[[roles]]
name = "api"
count = { min = 1, max = 5 }
start = ["bin/api.sh"]
reload = ["bin/reload.sh"]

[[roles.files]]
path = "conf/greeting"
template = "{{ cluster.config.greeting }} from api\n"

# Config that reaches only the environment: a restart, even with `reload`.
[[roles]]
name = "envy"
start = ["bin/api.sh"]
reload = ["bin/reload.sh"]
env = { GREETING = "{{ cluster.config.greeting }}" }

[[roles]]
name = "cache"
ports = ["main"]
start = ["bin/listen.sh"]
health = { tcp = "main" }
env = { HOST = "{{ instance.host }}", PORT = "{{ instance.ports.main }}" }

[[roles.files]]
path = "conf/size"
template = "64\n"
"#;

/// Records start and stop times; ready (healthy) half a second after start.
const WEB: &str = r#"set -eu
rm -f data/ready
echo "start $(date +%s%N)" >> data/events
trap 'rm -f data/ready; echo "stop $(date +%s%N)" >> data/events; exit 0' TERM
(sleep 0.5; touch data/ready) &
sleep 100000 &
wait
"#;

const READY: &str = "test -f data/ready\n";
const API: &str = "exec sleep 100000\n";
/// Listens only after a while: Running must wait for the port (tcp health).
const LISTEN: &str = "sleep 0.5\nexec python3 -m http.server --bind \"$HOST\" \"$PORT\"\n";
const RELOAD: &str = "set -eu\ncat conf/greeting >> data/reloads\n";

/// (start, stop) event times after `since`, in ns.
fn events(instance: &Value, since: u128) -> (Vec<u128>, Vec<u128>) {
    let text = std::fs::read_to_string(dir_of(instance).join("data/events")).unwrap_or_default();
    let (mut starts, mut stops) = (Vec::new(), Vec::new());
    for line in text.lines() {
        let (kind, at) = line.split_once(' ').unwrap();
        let at: u128 = at.parse().unwrap();
        if at > since {
            if kind == "start" { starts.push(at) } else { stops.push(at) }
        }
    }
    (starts, stops)
}

fn now_ns() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos()
}

#[tokio::test]
async fn a_config_change_restarts_one_at_a_time_reloads_where_it_can_and_leaves_the_rest() {
    let env = TestEnv::start("rolling").await;
    let pkg = PackageBuilder::new("roll", "1.0.0")
        .spec(SPEC)
        .script("bin/web.sh", WEB)
        .script("bin/ready.sh", READY)
        .script("bin/api.sh", API)
        .script("bin/listen.sh", LISTEN)
        .script("bin/reload.sh", RELOAD);
    env.upload(&pkg).await;
    let body = json!({"name": "rl", "package": {"name": "roll", "version": "1.0.0"},
        "roles": {"web": {"count": 3}, "api": {"count": 2}}});
    let c = env.create_active(body).await;
    let c_before_envy = c.clone();
    let (web, api, cache) = (role_instances(&c, "web"), role_instances(&c, "api"), role_instances(&c, "cache"));
    for w in &web {
        assert!(dir_of(w).join("data/ready").exists(), "{} is Running before it is healthy", id_of(w));
    }
    let addr = format!("{}:{}", cache[0]["host"].as_str().unwrap(), cache[0]["ports"]["main"]);
    assert!(std::net::TcpStream::connect(&addr).is_ok(), "cache is Running but {addr} does not accept connections");

    let since = now_ns();
    let op = env.run_op_patch("/clusters/rl/config", json!({"config": {"greeting": "bonjour"}})).await;
    env.assert_succeeded(&op);
    assert_eq!(op["kind"], "Reconfigure");
    let c = env.cluster("rl").await;
    assert_eq!(c["status"], "Active");
    assert_eq!(c["config"]["greeting"], "bonjour");

    // Every web instance restarted once, with the new file; one at a time:
    // the next one stopped only after the previous one was up and healthy.
    let mut windows: Vec<(u128, u128)> = Vec::new();
    for w in role_instances(&c, "web") {
        assert_eq!(std::fs::read_to_string(dir_of(&w).join("conf/greeting")).unwrap(), "bonjour\n");
        let (starts, stops) = events(&w, since);
        assert_eq!((starts.len(), stops.len()), (1, 1), "{}: starts {starts:?} stops {stops:?}", id_of(&w));
        assert!(pid_alive(pid_of(&w)));
        windows.push((stops[0], starts[0]));
    }
    windows.sort();
    for pair in windows.windows(2) {
        let ((_, up), (next_down, _)) = (pair[0], pair[1]);
        assert!(next_down > up + 400_000_000, "an instance stopped before the previous one was healthy: {windows:?}");
    }
    assert_eq!(windows.len(), web.len());

    // api instances reloaded in place: same pid, the reload hook saw the new file.
    for (before, after) in api.iter().zip(role_instances(&c, "api")) {
        assert_eq!(pid_of(before), pid_of(&after), "{} was restarted instead of reloaded", id_of(&after));
        let reloads = std::fs::read_to_string(dir_of(&after).join("data/reloads")).unwrap();
        assert_eq!(reloads, "bonjour from api\n");
    }
    // envy's environment changed: restarted (a reload cannot change it).
    let envy_after = &role_instances(&c, "envy")[0];
    assert_ne!(pid_of(&role_instances(&c_before_envy, "envy")[0]), pid_of(envy_after), "envy was not restarted");
    let environ = std::fs::read(format!("/proc/{}/environ", pid_of(envy_after))).unwrap();
    assert!(environ.split(|b| *b == 0).any(|v| v == b"GREETING=bonjour"), "the new environment did not reach envy");
    // cache's files did not change: not touched.
    assert_eq!(pid_of(&cache[0]), pid_of(&role_instances(&c, "cache")[0]), "cache's files did not change");

    // The same values again change no file: nothing restarts.
    let since = now_ns();
    env.assert_succeeded(&env.run_op_patch("/clusters/rl/config", json!({"config": {"greeting": "bonjour"}})).await);
    for w in role_instances(&env.cluster("rl").await, "web") {
        assert_eq!(events(&w, since), (vec![], vec![]), "{} restarted for nothing", id_of(&w));
    }

    // A value of the wrong type is refused up front; nothing changes.
    let (status, body) = env.patch("/clusters/rl/config", json!({"config": {"greeting": 5}})).await;
    assert_eq!(status, 422, "{body:#}");
    assert_eq!(env.cluster("rl").await["config"]["greeting"], "bonjour");
}
