//! Vertical scale: `PATCH /clusters/{name}/roles/{role}` sets memory and CPU
//! limits, applied through each instance's cgroup by a rolling restart; a
//! node whose agent cannot enforce limits makes the request fail up front,
//! with nothing changed.

use serde_json::{Value, json};

use crate::common::{PackageBuilder, TestEnv, error_code, id_of, pid_alive, pid_of, role_instances};

const SPEC: &str = r#"
[component]
name = "rs"
version = "1.0.0"

[[roles]]
name = "svc"
count = { min = 1, max = 5 }
start = ["bin/start.sh"]
stop_grace = "2s"
"#;

/// The v1 cgroup directory of `pid` for `controller` (this machine has
/// memory and cpu as cgroup v1 hierarchies).
fn v1_cgroup(pid: u32, controller: &str) -> std::path::PathBuf {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next(), parts.next().unwrap_or(""), parts.next().unwrap_or(""));
        if controllers.split(',').any(|c| c == controller) {
            let mount = if controller == "cpu" { "cpu" } else { controller };
            return std::path::Path::new("/sys/fs/cgroup").join(mount).join(path.trim_start_matches('/'));
        }
    }
    panic!("pid {pid} has no {controller} cgroup: {text}");
}

fn limit(i: &Value, controller: &str, file: &str) -> String {
    let path = v1_cgroup(pid_of(i), controller).join(file);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())).trim().to_string()
}

#[tokio::test]
async fn resize_applies_limits_by_rolling_restart() {
    let env = TestEnv::start("resize").await;
    env.upload(&PackageBuilder::new("rs", "1.0.0").spec(SPEC).script("bin/start.sh", "exec sleep 100000\n")).await;
    let body = json!({"name": "rz", "package": {"name": "rs", "version": "1.0.0"}, "roles": {"svc": {"count": 2}}});
    let before = role_instances(&env.create_active(body).await, "svc");

    let op = env.run_op_patch("/clusters/rz/roles/svc", json!({"resources": {"memory": "64M", "cpu": 0.5}})).await;
    env.assert_succeeded(&op);
    assert_eq!(op["kind"], "Resize");
    let after = role_instances(&env.cluster("rz").await, "svc");
    for (a, b) in after.iter().zip(&before) {
        assert_ne!(pid_of(a), pid_of(b), "{} was not restarted", id_of(a));
        assert!(pid_alive(pid_of(a)));
        assert_eq!(limit(a, "memory", "memory.limit_in_bytes"), (64u64 << 20).to_string(), "{}", id_of(a));
        assert_eq!(limit(a, "cpu", "cpu.cfs_quota_us"), "50000", "{}", id_of(a));
        assert_eq!(limit(a, "cpu", "cpu.cfs_period_us"), "100000", "{}", id_of(a));
    }

    // The same limits again: every instance already has them, nothing restarts.
    env.assert_succeeded(
        &env.run_op_patch("/clusters/rz/roles/svc", json!({"resources": {"memory": "64M", "cpu": 0.5}})).await,
    );
    for (a, b) in role_instances(&env.cluster("rz").await, "svc").iter().zip(&after) {
        assert_eq!(pid_of(a), pid_of(b));
    }

    let (status, body) = env.patch("/clusters/rz/roles/svc", json!({"resources": {"memory": "1K"}})).await;
    assert_eq!(status, 400, "{body:#}");
    let (status, body) = env.patch("/clusters/rz/roles/nope", json!({"resources": {"cpu": 1.0}})).await;
    assert_eq!(status, 422, "{body:#}");
}

#[tokio::test]
async fn resize_is_refused_up_front_where_an_agent_cannot_limit() {
    let env = TestEnv::start_with_agent_flag("resize-refused", 3, "--no-cgroups").await;
    env.upload(&PackageBuilder::new("rs", "1.0.0").spec(SPEC).script("bin/start.sh", "exec sleep 100000\n")).await;
    let body = json!({"name": "rr", "package": {"name": "rs", "version": "1.0.0"}, "roles": {"svc": {"count": 3}}});
    let before = role_instances(&env.create_active(body).await, "svc");
    assert!(before.iter().any(|i| i["node"] == "node-3"), "spread placement puts one on node-3");

    let (status, body) = env.patch("/clusters/rr/roles/svc", json!({"resources": {"memory": "64M"}})).await;
    assert_eq!((status.as_u16(), error_code(&body)), (409, "limits_unsupported"), "{body:#}");
    assert!(body["error"]["message"].as_str().unwrap().contains("node-3"), "{body:#}");
    let c = env.cluster("rr").await;
    assert_eq!(c["status"], "Active");
    for (a, b) in role_instances(&c, "svc").iter().zip(&before) {
        assert_eq!(pid_of(a), pid_of(b), "a refused resize restarted {}", id_of(a));
    }
}
