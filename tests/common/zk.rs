//! Talking to the real ZooKeeper servers of the ensemble test: the `srvr`
//! four-letter word over TCP (what each server says it is), the package's
//! own CLI (`bin/zk-cli.sh`, ZooKeeperMain) for znodes, and building the
//! package from Debian's `zookeeper` with `examples/components/zookeeper/build.sh`.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use super::http::dir_of;

/// What a server answers to `srvr`; `None` when its process does not
/// answer at all (down, or restarting).
pub fn srvr(instance: &Value) -> Option<String> {
    let host = instance["host"].as_str()?;
    let port = instance["ports"]["client"].as_u64()?;
    let addr = format!("{host}:{port}").parse().ok()?;
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(3))).ok()?;
    s.write_all(b"srvr").ok()?;
    let mut reply = String::new();
    s.read_to_string(&mut reply).ok()?;
    Some(reply)
}

/// The `Mode:` a server reports (`leader`, `follower`, `standalone`), or
/// `None` when it does not answer or is not serving (e.g. electing).
pub fn mode(instance: &Value) -> Option<String> {
    srvr(instance)?.lines().find_map(|l| l.strip_prefix("Mode: ").map(|m| m.trim().to_string()))
}

/// Every server's mode, in order.
pub fn modes(servers: &[Value]) -> Vec<Option<String>> {
    servers.iter().map(mode).collect()
}

/// Exactly one leader and the rest followers.
pub fn one_leader(servers: &[Value]) -> bool {
    let m = modes(servers);
    m.iter().filter(|x| x.as_deref() == Some("leader")).count() == 1
        && m.iter().filter(|x| x.as_deref() == Some("follower")).count() == servers.len() - 1
}

/// Runs one ZooKeeperMain command from `via`'s directory against `target`'s
/// client address; (success, stdout).
pub fn cli(via: &Value, target: &Value, args: &[&str]) -> (bool, String) {
    let server = format!("{}:{}", target["host"].as_str().unwrap(), target["ports"]["client"]);
    let out = Command::new("bin/zk-cli.sh")
        .current_dir(dir_of(via))
        .args(["-server", &server])
        .args(args)
        .output()
        .expect("run zk-cli.sh");
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Builds the ZooKeeper package of `version` into `out_dir`; returns its bytes.
pub fn build_package(version: &str, out_dir: &Path) -> Vec<u8> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/components/zookeeper/build.sh");
    let out = out_dir.join(format!("zookeeper-{version}.tar.gz"));
    let status = Command::new("bash").arg(&script).arg(version).arg(&out).status().expect("run build.sh");
    assert!(
        status.success(),
        "build.sh {version} failed (is Debian's zookeeper installed? scripts/setup.sh installs it)"
    );
    std::fs::read(&out).expect("read the built package")
}

/// Rebuilds `package` with a start script that refuses server ids above
/// `max_id`: the injected failure of the scale-out rollback test.
pub fn refusing_ids_above(package: &[u8], max_id: u32, work: &Path) -> Vec<u8> {
    let tree = work.join("picky");
    std::fs::create_dir_all(&tree).unwrap();
    std::fs::write(work.join("in.tar.gz"), package).unwrap();
    assert!(
        Command::new("tar").arg("-xzf").arg(work.join("in.tar.gz")).arg("-C").arg(&tree).status().unwrap().success()
    );
    let start = tree.join("bin/zk-start.sh");
    let text = std::fs::read_to_string(&start).unwrap();
    let guard = format!(
        "if [[ $(cat data/myid) -gt {max_id} ]]; then echo \"injected failure: server $(cat data/myid) refuses to join\" >&2; exit 1; fi\nexec "
    );
    let patched = text.replacen("exec ", &guard, 1);
    assert_ne!(patched, text, "zk-start.sh has no exec line to guard");
    std::fs::write(&start, patched).unwrap();
    let out = work.join("picky.tar.gz");
    let entries = ["component.toml", "PACKAGE_VERSION", "bin", "conf", "lib"];
    assert!(Command::new("tar").arg("-czf").arg(&out).arg("-C").arg(&tree).args(entries).status().unwrap().success());
    std::fs::read(out).unwrap()
}
