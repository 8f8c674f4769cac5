//! An instance whose process dies without being asked to: the master hears
//! of it at once, its agent restarts it with growing delays (the instance
//! is `Starting`, then `Running` with its new pid, the cluster stays
//! Active), and once the restart policy gives up (3 restarts in 5 minutes)
//! the instance is `Failed` and the cluster `Error`, saying which instance,
//! where, and how it died.

use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::{Value, json};

use crate::common::scripts::{RECORD_AND_SLEEP, started_at};
use crate::common::{PackageBuilder, TestEnv, id_of, pid_alive, pid_of, role_instances};

const SPEC: &str = r#"
[component]
name = "crashy"
version = "1.0.0"

[[roles]]
name = "svc"
start = ["bin/start.sh"]
stop_grace = "2s"
"#;

async fn instance(env: &TestEnv) -> Value {
    role_instances(&env.cluster("cr").await, "svc").remove(0)
}

/// Now on the wall clock, in ns (the unit of `data/started_at`).
fn now_ns() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos()
}

/// Kills the instance's process and waits until its agent has restarted it;
/// answers the instance and how long after the kill its start script ran
/// again (by the time it recorded).
async fn crash_and_wait_for_restart(env: &TestEnv, within: Duration) -> (Value, Duration) {
    let before = instance(env).await;
    let old = pid_of(&before);
    let starts = started_at(&before).len();
    let killed_at = now_ns();
    kill(Pid::from_raw(old as i32), Signal::SIGKILL).unwrap();
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let now = instance(env).await;
        if now["status"] == "Running" && now["pid"].as_u64().is_some_and(|p| p as u32 != old) {
            let times = started_at(&now);
            assert_eq!(times.len(), starts + 1, "one start per restart: {times:?}");
            let after = Duration::from_nanos((times[starts].saturating_sub(killed_at)) as u64);
            return (now, after);
        }
        assert!(tokio::time::Instant::now() < deadline, "not restarted within {within:?}: {now:#}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_crashed_instance_is_restarted_until_the_policy_gives_up() {
    let env = TestEnv::start("crash").await;
    env.upload(&PackageBuilder::new("crashy", "1.0.0").spec(SPEC).script("bin/start.sh", RECORD_AND_SLEEP)).await;
    let body = json!({"name": "cr", "package": {"name": "crashy", "version": "1.0.0"}, "roles": {"svc": {"count": 1}}});
    env.create_active(body).await;

    // Three restarts, 1 s, 2 s and 4 s after each crash: never sooner (by
    // the time the start script recorded), and within 4 s more (2 s was
    // exceeded once in a loaded CI run: the third restart not in by 6 s).
    for (delay, within) in [(1, 5), (2, 6), (4, 8)] {
        let (i, after) = crash_and_wait_for_restart(&env, Duration::from_secs(within)).await;
        let delay = Duration::from_secs(delay);
        assert!(after >= delay, "restarted {after:?} after the crash, before its backoff of {delay:?}");
        assert!(pid_alive(pid_of(&i)));
        let why = i["last_error"].as_str().unwrap_or_default();
        assert!(why.contains("signal 9") && why.contains("restarts it in"), "{i:#}");
        let c = env.cluster("cr").await;
        assert_eq!(c["status"], "Active", "a restarted instance keeps its cluster Active: {c:#}");
    }

    // The fourth crash in the window: no more restarts.
    let i = instance(&env).await;
    kill(Pid::from_raw(pid_of(&i) as i32), Signal::SIGKILL).unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let c = loop {
        let c = env.cluster("cr").await;
        if c["status"] == "Error" {
            break c;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the cluster did not go Error once the restarts were used up: {c:#}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let why = c["status_description"].as_str().unwrap();
    assert!(why.contains(&id_of(&i)) && why.contains("node-") && why.contains("signal 9"), "{why}");
    assert!(why.contains("gave up"), "{why}");
    let i = instance(&env).await;
    assert_eq!(i["status"], "Failed", "{i:#}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(crate::common::instance_pids(&id_of(&i)).is_empty(), "restarted although the policy gave up");

    // The operator takes over: a start brings it back.
    env.run_ok("/clusters/cr/start", None).await;
    assert_eq!(env.cluster("cr").await["status"], "Active");
}
