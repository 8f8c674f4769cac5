//! Each cluster its own user: two clusters on one node run as two dynamic
//! users, each owning its instance directory (0750), and from one cluster's
//! user the other's files can be neither written nor listed, nor its
//! processes signalled. The users outlive an agent restart.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::process::Command;

use serde_json::json;

use super::intruder;
use crate::common::{DYNAMIC_UIDS, TestEnv, dir_of, dynamic_uid, pid_of, proc_uid, role_instances};

/// Runs `script` with `sh -c` as `uid:uid` with no supplementary groups:
/// (succeeded, stderr).
fn as_user(uid: u32, script: &str) -> (bool, String) {
    let out = Command::new("setpriv")
        .args(["--reuid", &uid.to_string(), "--regid", &uid.to_string(), "--clear-groups", "--", "sh", "-c", script])
        .output()
        .expect("setpriv (util-linux) runs");
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_cluster_can_neither_write_nor_signal_another() {
    let mut env = TestEnv::start("iso-users").await;
    env.upload(&intruder("1.0.0")).await;
    let on_node_1 = |name: &str| json!({"name": name, "package": {"name": "intruder", "version": "1.0.0"}, "roles": {"svc": {"count": 1, "nodes": ["node-1"]}}});
    let a = role_instances(&env.create_active(on_node_1("alpha")).await, "svc").remove(0);
    let b = role_instances(&env.create_active(on_node_1("beta")).await, "svc").remove(0);
    let (uid_a, uid_b) = (dynamic_uid(pid_of(&a)), dynamic_uid(pid_of(&b)));
    assert_ne!(uid_a, uid_b, "two clusters share a user");
    for (i, uid) in [(&a, uid_a), (&b, uid_b)] {
        let m = std::fs::metadata(dir_of(i)).unwrap();
        assert_eq!((m.uid(), m.gid(), m.permissions().mode() & 0o777), (uid, uid, 0o750), "{}", dir_of(i).display());
    }
    let (b_dir, b_pid) = (dir_of(&b), pid_of(&b));
    let script = b_dir.join("bin/start.sh");
    let before = std::fs::read(&script).unwrap();

    // From alpha's user: beta's start script, directory and process are
    // out of reach.
    let (ok, err) = as_user(uid_a, &format!("echo 'echo pwned' >> {}", script.display()));
    assert!(!ok, "alpha's user appended to beta's start script");
    assert!(err.contains("Permission denied"), "{err}");
    let (ok, err) = as_user(uid_a, &format!("ls {}", b_dir.display()));
    assert!(!ok && err.contains("Permission denied"), "alpha's user listed beta's dir: {err}");
    let (ok, err) = as_user(uid_a, &format!("kill -TERM {b_pid}"));
    assert!(!ok, "alpha's user signalled beta's process");
    assert!(err.contains("not permitted"), "{err}");
    assert_eq!(std::fs::read(&script).unwrap(), before);
    assert_eq!(proc_uid(b_pid), Some(uid_b), "beta's process is gone");
    // The same from beta's own user works: the refusals above are the
    // users', not the commands'.
    let (ok, err) = as_user(uid_b, &format!("test -w {} && kill -0 {b_pid}", script.display()));
    assert!(ok, "beta's user cannot reach its own instance: {err}");

    // An agent restart gives each cluster the same user again.
    env.kill_agent(1);
    env.restart_agent(1).await;
    env.wait_ready().await;
    let c = env.create_active(on_node_1("gamma")).await;
    let uid_c = dynamic_uid(pid_of(&role_instances(&c, "svc")[0]));
    assert!(DYNAMIC_UIDS.contains(&uid_c) && uid_c != uid_a && uid_c != uid_b, "gamma got {uid_c}");
    let op = env.run_op("/clusters/alpha/restart", None).await;
    env.assert_succeeded(&op);
    let a = role_instances(&env.cluster("alpha").await, "svc").remove(0);
    assert_eq!(proc_uid(pid_of(&a)), Some(uid_a), "alpha runs as another user after the agent's restart");
}
