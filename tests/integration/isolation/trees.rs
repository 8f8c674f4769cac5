//! What the root agent does to a whole instance tree: an upgrade carries
//! `data/ logs/ run/` over and chowns the new tree, a delete removes it.
//! With links in `data/` and `run/` pointing at a directory of root's, a
//! FIFO in `data/`, and `run/` itself a link, neither follows any of them:
//! the directory outside keeps its files, owner and mode.

use std::os::unix::fs::{FileTypeExt, MetadataExt};

use reqwest::StatusCode;
use serde_json::json;

use super::{attack, intruder};
use crate::common::{PackageBuilder, TestEnv, dir_of, eventually, id_of, role_instances};

/// A directory of root's that the instance's links point at.
fn victim(env: &TestEnv, name: &str) -> std::path::PathBuf {
    let dir = env.master_dir().parent().unwrap().join(name);
    std::fs::create_dir_all(dir.join("sub")).unwrap();
    std::fs::write(dir.join("keep"), "KEEP\n").unwrap();
    std::fs::write(dir.join("sub/deep"), "DEEP\n").unwrap();
    std::fs::write(dir.join("d.pid"), "1\n").unwrap();
    dir
}

/// Checks `dir` is as [`victim`] made it: files, owner (root) and modes.
fn intact(dir: &std::path::Path, when: &str) {
    for (p, content) in [("keep", "KEEP\n"), ("sub/deep", "DEEP\n"), ("d.pid", "1\n")] {
        let path = dir.join(p);
        assert_eq!(std::fs::read_to_string(&path).ok().as_deref(), Some(content), "{when}: {} changed", path.display());
    }
    for p in ["", "sub", "keep", "sub/deep"] {
        let m = std::fs::symlink_metadata(dir.join(p)).unwrap();
        assert_eq!((m.uid(), m.gid()), (0, 0), "{when}: {p:?} of the victim was given away");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_and_a_delete_follow_no_link_of_the_instance() {
    let env = TestEnv::start("iso-trees").await;
    env.upload(&intruder("1.0.0")).await;
    env.upload(&intruder("1.0.1")).await;
    let target = victim(&env, "victim");
    let i = attack(&env, "tree", "tree-links", &target.display().to_string()).await;
    let dir = dir_of(&i);
    assert!(std::fs::symlink_metadata(dir.join("run")).unwrap().file_type().is_symlink(), "the attack did not run");

    let op = env.run_op("/clusters/tree/upgrade", Some(json!({"version": "1.0.1"}))).await;
    env.assert_succeeded(&op);
    intact(&target, "after the upgrade");
    // data/ was carried with its links as links; run/ (a link) was not.
    let data = dir.join("data");
    assert!(std::fs::symlink_metadata(data.join("victim-dir")).unwrap().file_type().is_symlink());
    assert!(std::fs::symlink_metadata(data.join("fifo")).unwrap().file_type().is_fifo());
    let c = env.cluster("tree").await;
    let upgraded = role_instances(&c, "svc").remove(0);
    assert_eq!(upgraded["status"], "Running", "{c:#}");

    let (status, body) = env.delete("/clusters/tree").await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body:#}");
    let gone = eventually(30, || !dir.exists()).await;
    assert!(gone, "the instance dir is left: {}", dir.display());
    intact(&target, "after the delete");
}

/// A daemon whose `run/` is swapped for a link to a directory holding a
/// file named like its pidfile: the next start refuses the link, and the
/// file there is neither removed nor read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pidfile_directory_swapped_for_a_link_is_refused() {
    let env = TestEnv::start("iso-pidfile").await;
    let spec = r#"
[component]
name = "daemon"
version = "1.0.0"

[[roles]]
name = "d"
count = { min = 1, max = 1 }
start = ["bin/start.sh"]
pidfile = "run/d.pid"
stop_grace = "2s"
"#;
    let start = "sleep 100000 &\necho $! > run/d.pid\n";
    env.upload(&PackageBuilder::new("daemon", "1.0.0").spec(spec).script("bin/start.sh", start)).await;
    let target = victim(&env, "pid-victim");
    let c = env.create_active(json!({"name": "d", "package": {"name": "daemon", "version": "1.0.0"}})).await;
    let i = role_instances(&c, "d").remove(0);
    let dir = dir_of(&i);
    // As the instance could: `run/` swapped for a link.
    std::fs::rename(dir.join("run"), dir.join("run.old")).unwrap();
    std::os::unix::fs::symlink(&target, dir.join("run")).unwrap();

    let op = env.run_op(&format!("/clusters/d/instances/{}/restart", id_of(&i)), None).await;
    assert_ne!(op["status"], "Succeeded", "a start through a planted link: {op:#}");
    let text = op.to_string();
    assert!(text.contains("run is a symbolic link"), "the failure does not say why: {op:#}");
    intact(&target, "after the refused start");
}

/// A hard link in `data/` to a file of root's outside: an instance can
/// make one where `fs.protected_hardlinks` is 0 (the kernel's default; most
/// distributions set 1), or to any file it may read and write, so the test
/// makes it for it. Root's file is never given to the instance: not by the
/// upgrade (it carries `data/` over, giving on only what the instance's
/// previous user owned), nor by a reinstall under another user (the
/// cluster's `run_as` changed by an upgrade); the delete unlinks the link
/// and leaves the file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hard_link_to_a_file_outside_is_never_given_to_the_instance() {
    let env = TestEnv::start("iso-hardlink").await;
    env.upload(&intruder("1.0.0")).await;
    env.upload(&intruder("1.0.1")).await;
    let as_nobody = PackageBuilder::new("intruder", "1.0.2")
        .spec(&super::SPEC.replace("1.0.0", "1.0.2").replace("stop_grace", "run_as = \"nobody\"\nstop_grace"))
        .script("bin/start.sh", super::START);
    env.upload(&as_nobody).await;
    let target = victim(&env, "hl-victim");
    let i = attack(&env, "hl", "none", "").await;
    let dir = dir_of(&i);
    std::fs::hard_link(target.join("keep"), dir.join("data/hl")).unwrap();
    let mine = dir.join("data/planted");
    let uid = std::fs::metadata(&dir).unwrap().uid();

    let op = env.run_op("/clusters/hl/upgrade", Some(json!({"version": "1.0.1"}))).await;
    env.assert_succeeded(&op);
    intact(&target, "after the upgrade");
    assert_eq!(std::fs::metadata(&mine).unwrap().uid(), uid, "the instance's own file");

    // Another user: what the previous one owned is given on, root's file not.
    let op = env.run_op("/clusters/hl/upgrade", Some(json!({"version": "1.0.2"}))).await;
    env.assert_succeeded(&op);
    intact(&target, "after the upgrade to another user");
    let nobody = std::fs::metadata(&dir).unwrap().uid();
    assert_ne!(nobody, uid, "the upgrade did not change the user");
    assert_eq!(std::fs::metadata(&mine).unwrap().uid(), nobody, "the previous user's file was not given on");
    assert_eq!(std::fs::metadata(target.join("keep")).unwrap().nlink(), 2, "the link is gone");

    let (status, body) = env.delete("/clusters/hl").await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body:#}");
    let gone = eventually(30, || !dir.exists()).await;
    assert!(gone, "the instance dir is left: {}", dir.display());
    intact(&target, "after the delete");
    assert_eq!(std::fs::metadata(target.join("keep")).unwrap().nlink(), 1, "the link was not removed");
}
