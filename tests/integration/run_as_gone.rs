//! An instance whose `run_as` user is removed from the node while it runs
//! (issue 9): a stop never runs the package's stop command as the agent's
//! own user (root). The stop fails, saying why, and the instance's
//! processes are still stopped, with TERM and then KILL.

use std::process::Command;

use serde_json::json;

use crate::common::{PackageBuilder, TestEnv, eventually, id_of, pid_alive, pid_of, proc_uid, role_instances};

/// `useradd` a system user; removed (`userdel`) by the test itself.
fn add_user(name: &str) -> u32 {
    let out =
        Command::new("useradd").args(["--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name]).output();
    let out = out.expect("useradd (the test runs as root, as CI does)");
    assert!(out.status.success(), "useradd {name}: {}", String::from_utf8_lossy(&out.stderr));
    nix::unistd::User::from_name(name).expect("getpwnam").expect("the new user").uid.as_raw()
}

fn remove_user(name: &str) {
    let _ = Command::new("userdel").arg(name).output();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_never_runs_as_root_when_the_instance_user_is_gone() {
    assert!(nix::unistd::geteuid().is_root(), "this test needs root (useradd, and an agent that switches users)");
    let user = format!("fltgone{}", std::process::id() % 100_000);
    remove_user(&user);
    let uid = add_user(&user);
    let marker = std::env::temp_dir().join(format!("flotilla-stop-ran-{}", std::process::id()));
    let _ = std::fs::remove_file(&marker);

    let env = TestEnv::start("run-as-gone").await;
    let spec = format!(
        r#"
[component]
name = "gone"
version = "1.0.0"

[[roles]]
name = "svc"
run_as = "{user}"
start = ["bin/start.sh"]
stop = ["bin/stop.sh"]
stop_grace = "2s"
"#
    );
    let pkg = PackageBuilder::new("gone", "1.0.0")
        .spec(&spec)
        .script("bin/start.sh", "exec sleep 100000\n")
        .script("bin/stop.sh", &format!("id -u > {}\n", marker.display()));
    env.upload(&pkg).await;
    env.create_active(
        json!({"name": "rg", "package": {"name": "gone", "version": "1.0.0"}, "roles": {"svc": {"count": 1}}}),
    )
    .await;
    let c = env.cluster("rg").await;
    let inst = role_instances(&c, "svc").remove(0);
    let pid = pid_of(&inst);
    assert_eq!(proc_uid(pid), Some(uid), "the instance runs as {user}");

    // The user goes away (userdel refuses while it has processes: -f).
    let out = Command::new("userdel").args(["--force", &user]).output().expect("userdel");
    assert!(out.status.success(), "userdel {user}: {}", String::from_utf8_lossy(&out.stderr));

    let op = env.run_op("/clusters/rg/stop", None).await;
    let text = op.to_string();
    assert_ne!(op["status"], "Succeeded", "a stop that skipped the package's stop command is not a success: {op:#}");
    assert!(text.contains("its stop command was not run"), "the reason is given: {op:#}");
    assert!(text.contains(&id_of(&inst)), "{op:#}");
    eprintln!("run_as_gone: the stop said {}", op["error"]);
    // The process is gone all the same, and the stop command never ran
    // (as root or anyone).
    assert!(eventually(10, || !pid_alive(pid)).await, "the instance's process {pid} is still alive");
    assert!(!marker.exists(), "the stop command ran as uid {:?}", std::fs::read_to_string(&marker).ok());
}
