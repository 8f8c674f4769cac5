//! A start script that launches a grandchild escaping its process group
//! (`setsid`): stop still leaves no process of the instance behind.

use serde_json::json;

use crate::common::{
    PackageBuilder, TestEnv, cmdline, eventually, id_of, instance_pids, pid_alive, pid_of, role_instances,
};

const SPEC: &str = r#"
[component]
name = "gc"
version = "1.0.0"

[[roles]]
name = "main"
count = { min = 1, max = 3 }
start = ["bin/start.sh"]
stop_grace = "2s"
"#;

const START: &str = "setsid sleep 200003 </dev/null >/dev/null 2>&1 &\nexec sleep 100000\n";

#[tokio::test]
async fn stop_kills_a_grandchild_that_escaped_the_group() {
    let env = TestEnv::start("grandchild").await;
    env.upload(&PackageBuilder::new("gc", "1.0.0").spec(SPEC).script("bin/start.sh", START)).await;
    let cluster = env.create_active(json!({"name": "gc", "package": {"name": "gc", "version": "1.0.0"}})).await;
    let inst = &role_instances(&cluster, "main")[0];
    let id = id_of(inst);

    // Before stop: the server and the escaped grandchild both carry the marker.
    // A foreground start answers at once: the script may still be forking.
    let escaped_of =
        |pids: &[u32]| -> Vec<u32> { pids.iter().copied().filter(|p| cmdline(*p) == ["sleep", "200003"]).collect() };
    eventually(5, || escaped_of(&instance_pids(&id)).len() == 1).await;
    let pids = instance_pids(&id);
    let escaped = escaped_of(&pids);
    assert_eq!(escaped.len(), 1, "the escaped grandchild is not found by its marker: {pids:?}");
    let sid = |p: u32| nix::unistd::getsid(Some(nix::unistd::Pid::from_raw(p as i32))).ok();
    assert_ne!(sid(escaped[0]), sid(pid_of(inst)), "the grandchild did not leave the server's session");

    let op = env.run_ok("/clusters/gc/stop", None).await;
    assert_eq!(op["kind"], "Stop", "{op:#}");
    let left: Vec<(u32, Vec<String>)> = instance_pids(&id).into_iter().map(|p| (p, cmdline(p))).collect();
    assert!(left.is_empty(), "processes of {id} left after stop: {left:?}");
    assert!(!pid_alive(escaped[0]));
    let cluster = env.cluster("gc").await;
    let inst = &role_instances(&cluster, "main")[0];
    assert_eq!(inst["status"], "Stopped", "{inst:#}");
    assert!(inst["pid"].is_null(), "a stopped instance has no pid: {inst:#}");
}
