//! Replacing a member (`POST /clusters/{name}/instances/{id}/replace`,
//! `flotilla cluster replace NAME --instance ID`): a replacement is added
//! on another node and the member removed, in one operation; the others
//! learn the new membership; a quorum role is refused while another member
//! is not running; a member whose node is Down is replaced all the same
//! (its stop and delete best effort).

use serde_json::json;

use crate::common::{PackageBuilder, TestEnv, dir_of, error_code, id_of, pid_alive, pid_of, role_instances};

/// A quorum role `q` (odd counts) whose members' files list the membership.
fn quorum(name: &str) -> PackageBuilder {
    let spec = format!(
        r#"[component]
name = "{name}"
version = "1.0.0"

[[roles]]
name = "q"
count = {{ min = 1, max = 5, odd = true }}
start = ["bin/start.sh"]
stop_grace = "2s"

[[roles.files]]
path = "conf/members"
template = "{{% for m in cluster.roles.q.members %}}{{{{ m.ordinal }}}}@{{{{ m.host }}}} {{% endfor %}}\n"
"#
    );
    PackageBuilder::new(name, "1.0.0").spec(&spec).script("bin/start.sh", crate::common::scripts::RECORD_AND_SLEEP)
}

fn members_file(instance: &serde_json::Value) -> String {
    std::fs::read_to_string(dir_of(instance).join("conf/members")).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_moves_to_another_node_and_the_others_learn_the_new_membership() {
    // A short leak grace: the member left on the Down node is removed
    // once its agent is back.
    let mut env = TestEnv::start_with("replace", &[("FLOTILLA_MASTER_LEAKED_GRACE", "2s")]).await;
    env.upload(&quorum("qq")).await;
    let c = env
        .create_active(json!({"name": "z", "package": {"name": "qq", "version": "1.0.0"},
            "roles": {"q": {"count": 3}}}))
        .await;
    let before = role_instances(&c, "q");
    let old = before[0].clone();
    let (old_id, old_pid, old_dir) = (id_of(&old), pid_of(&old), dir_of(&old));
    let old_node = old["node"].as_str().unwrap().to_string();

    // A dry run says what it would do, and changes nothing.
    let (status, preview) = env.post(&format!("/clusters/z/instances/{old_id}/replace?dry_run=true"), json!({})).await;
    assert_eq!(status.as_u16(), 200, "{preview:#}");
    assert_eq!(preview["kind"], "Replace", "{preview:#}");
    let placed = &preview["new_instances"][0];
    assert_ne!(placed["node"], old_node.as_str(), "{preview:#}");

    let op = env.run_ok(&format!("/clusters/z/instances/{old_id}/replace"), None).await;
    assert_eq!(op["kind"], "Replace", "{op:#}");
    let names: Vec<&str> = op["steps"].as_array().unwrap().iter().map(|s| s["name"].as_str().unwrap()).collect();
    assert_eq!(
        (names.first().copied(), names.last().copied()),
        (Some("add-allocate"), Some("remove-configure")),
        "{op:#}"
    );
    let new_id = op["params"]["replacement"].as_str().unwrap().to_string();
    let c = env.cluster("z").await;
    assert_eq!(c["status"], "Active", "{c:#}");
    let after = role_instances(&c, "q");
    assert_eq!(after.len(), 3, "still three members: {c:#}");
    assert!(after.iter().all(|i| id_of(i) != old_id), "the old member is gone: {c:#}");
    let new = after.iter().find(|i| id_of(i) == new_id).cloned().expect("the replacement");
    assert_eq!((new["status"].as_str(), new["ordinal"].as_u64()), (Some("Running"), Some(4)), "{new:#}");
    assert_ne!(new["node"], old_node.as_str(), "on another node: {new:#}");
    assert!(!pid_alive(old_pid), "the old member's process is stopped");
    assert!(!old_dir.exists(), "and its directory removed: {}", old_dir.display());
    // Every member's files list the new membership, without the old one.
    let want: String = after.iter().map(|i| format!("{}@{} ", i["ordinal"], i["host"].as_str().unwrap())).collect();
    for i in &after {
        assert_eq!(members_file(i).trim_end(), want.trim_end(), "{}'s membership", id_of(i));
    }

    // A quorum with a member stopped: refused, nothing changed.
    let stopped = id_of(&after[1]);
    env.run_ok(&format!("/clusters/z/instances/{stopped}/stop"), None).await;
    let target = id_of(&after[0]);
    let (status, v) = env.post(&format!("/clusters/z/instances/{target}/replace"), json!({})).await;
    assert_eq!((status.as_u16(), error_code(&v)), (409, "unsafe_replace"), "{v:#}");
    assert!(v["error"]["message"].as_str().unwrap_or("").contains(&stopped), "names the member: {v:#}");
    assert_eq!(role_instances(&env.cluster("z").await, "q").len(), 3);
    env.run_ok(&format!("/clusters/z/instances/{stopped}/start"), None).await;

    // The CLI names the instance (and refuses without one).
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args(["cluster", "replace", "z", "--instance", &target])
        .env("FLOTILLA_API", env.api.trim_end_matches("/api/v1"))
        .env("FLOTILLA_TOKEN", &env.token)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let c = env.cluster("z").await;
    assert!(role_instances(&c, "q").iter().all(|i| id_of(i) != target), "{c:#}");

    // A member whose node is Down (its agent killed) is replaced all the
    // same: its stop and delete are best effort.
    let c = env.cluster("z").await;
    let victim = role_instances(&c, "q").into_iter().find(|i| i["node"] == "node-1").expect("a member on node-1");
    env.kill_agent(1);
    // Once the master has given it up (Lost) the cluster is in Error:
    // replacing that member is the repair, and leaves it Active.
    env.until(60, "node-1 Down, its member Lost, the cluster in Error", async || {
        let c = env.cluster("z").await;
        let lost = role_instances(&c, "q").iter().any(|i| id_of(i) == id_of(&victim) && i["status"] == "Lost");
        if lost && c["status"] == "Error" { Ok(()) } else { Err(c.to_string()) }
    })
    .await;
    let op = env.run_op(&format!("/clusters/z/instances/{}/replace", id_of(&victim)), None).await;
    assert_eq!(op["status"], "Succeeded", "{op:#}");
    assert_eq!(
        (op["params"]["node_down"].as_bool(), op["params"]["best_effort"].as_bool()),
        (Some(true), Some(true)),
        "{op:#}"
    );
    let c = env.cluster("z").await;
    assert_eq!(c["status"], "Active", "{c:#}");
    let q = role_instances(&c, "q");
    assert_eq!(q.len(), 3, "{c:#}");
    assert!(q.iter().all(|i| i["node"] != "node-1" && i["status"] == "Running"), "{c:#}");
    // Its node back, what was left of it there is a leak, removed.
    env.restart_agent(1).await;
    let left = pid_of(&victim);
    // Its process stopped, then its directory removed (in that order).
    env.until(60, "the replaced member's process on node-1 stopped and its directory removed", async || {
        let dir = dir_of(&victim);
        if pid_alive(left) || dir.exists() {
            Err(format!("{left} runs: {}; {} there", pid_alive(left), dir.display()))
        } else {
            Ok(())
        }
    })
    .await;
}
