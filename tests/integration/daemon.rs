//! A daemonizing component (pidfile) and a foreground one both reach
//! `Running`, and the pid the API reports is the real server process: for
//! the daemon, the pid it wrote, not the start script (which has exited).

use serde_json::json;

use crate::common::scripts::rendered;
use crate::common::{
    PackageBuilder, TestEnv, cmdline, dynamic_uid, eventually, id_of, instance_pids, pid_alive, pid_of, proc_uid,
    role_instances,
};

const SPEC: &str = r#"
[component]
name = "dm"
version = "1.0.0"

[[roles]]
name = "fg"
count = { min = 1, max = 3 }
start = ["bin/fg.sh"]
stop_grace = "2s"

[[roles]]
name = "daemon"
count = { min = 1, max = 3 }
start = ["bin/daemon.sh"]
pidfile = "run/daemon.pid"
stop_grace = "2s"
"#;

/// Backgrounds the server, writes its pid, exits 0: a classic daemon start.
const DAEMON: &str = "sleep 200001 </dev/null >/dev/null 2>&1 &\necho $! > run/daemon.pid\nexit 0\n";

#[tokio::test]
async fn daemonizing_and_foreground_components_run_with_their_real_pids() {
    let env = TestEnv::start("daemon").await;
    let pkg = PackageBuilder::new("dm", "1.0.0")
        .spec(SPEC)
        .script("bin/fg.sh", "exec sleep 200002\n")
        .script("bin/daemon.sh", DAEMON);
    env.upload(&pkg).await;
    let cluster = env.create_active(json!({"name": "dm", "package": {"name": "dm", "version": "1.0.0"}})).await;

    // A role left out of the request gets its count.min.
    let fg = role_instances(&cluster, "fg");
    let daemon = role_instances(&cluster, "daemon");
    assert_eq!((fg.len(), daemon.len()), (1, 1), "{cluster:#}");
    let (fg, daemon) = (&fg[0], &daemon[0]);

    assert_eq!(fg["status"], "Running", "{fg:#}");
    let fg_pid = pid_of(fg);
    assert!(pid_alive(fg_pid), "foreground pid {fg_pid} is not alive");
    assert_eq!(cmdline(fg_pid), ["sleep", "200002"], "the foreground pid is the server");
    let uid = dynamic_uid(fg_pid);

    assert_eq!(daemon["status"], "Running", "{daemon:#}");
    let d_pid = pid_of(daemon);
    assert!(pid_alive(d_pid), "daemon pid {d_pid} is not alive");
    // The pidfile can name the forked child before it has exec'd `sleep`
    // (same process, same identity): its command line follows shortly.
    let is_daemon = eventually(5, || cmdline(d_pid) == ["sleep", "200001"]).await;
    assert!(is_daemon, "the daemon's pid is the daemon's, not the start script's: {:?}", cmdline(d_pid));
    assert_eq!(rendered(daemon, "run/daemon.pid").trim(), d_pid.to_string(), "the pid is the one in the pidfile");
    assert_eq!(proc_uid(d_pid), Some(uid), "one cluster, one user");
    let d_id = id_of(daemon);
    assert!(instance_pids(&d_id).contains(&d_pid), "the daemon does not carry its instance marker");
    let script_gone =
        eventually(5, || instance_pids(&d_id).iter().all(|p| !cmdline(*p).iter().any(|a| a.contains("daemon.sh"))))
            .await;
    assert!(
        script_gone,
        "the start script still runs: {:?}",
        instance_pids(&d_id).iter().map(|p| cmdline(*p)).collect::<Vec<_>>()
    );

    // Stopping kills the daemon too, though the agent is not its parent.
    env.run_ok("/clusters/dm/stop", None).await;
    assert!(!pid_alive(d_pid), "daemon {d_pid} survived stop");
    assert!(!pid_alive(fg_pid), "foreground {fg_pid} survived stop");
    assert_eq!(instance_pids(&d_id), Vec::<u32>::new());
    assert_eq!(instance_pids(&id_of(fg)), Vec::<u32>::new());
    let cluster = env.cluster("dm").await;
    assert_eq!(cluster["status"], "Stopped", "{cluster:#}");
}
