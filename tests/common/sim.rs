//! What the tests with simulated agents share: a small daemonizing package
//! (the sim never runs it, but the master parses its `component.toml`),
//! `GET /nodes` by node, and `/proc/net/tcp` to see a connection's state.

use reqwest::StatusCode;
use serde_json::Value;

use super::env::TestEnv;
use super::package::PackageBuilder;

/// One role `d`, no ports, a pidfile start script that forks a `sleep`.
pub fn package(name: &str, version: &str, max: u32) -> PackageBuilder {
    let spec = format!(
        r#"[component]
name = "{name}"
version = "{version}"

[[roles]]
name = "d"
count = {{ min = 1, max = {max} }}
start = ["bin/run.sh"]
pidfile = "run/d.pid"
stop_grace = "2s"
"#
    );
    PackageBuilder::new(name, version)
        .spec(&spec)
        .script("bin/run.sh", "sleep 100000 >/dev/null 2>&1 &\necho $! > run/d.pid\n")
}

impl TestEnv {
    /// `GET /nodes/{id}`, asserting 200.
    pub async fn node(&self, id: &str) -> Value {
        let (status, body) = self.get(&format!("/nodes/{id}")).await;
        assert_eq!(status, StatusCode::OK, "GET /nodes/{id}: {body:#}");
        body
    }
}

/// TCP states of `/proc/net/tcp` (include/net/tcp_states.h).
pub const ESTABLISHED: u8 = 0x01;
pub const CLOSE_WAIT: u8 = 0x08;

/// `(local port, state)` of every IPv4 socket of this network namespace
/// connected to `127.0.0.1:remote_port`.
pub fn tcp_to(remote_port: u16) -> Vec<(u16, u8)> {
    let text = std::fs::read_to_string("/proc/net/tcp").expect("read /proc/net/tcp");
    let remote = format!("0100007F:{remote_port:04X}");
    text.lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.len() < 4 || f[2] != remote {
                return None;
            }
            let port = u16::from_str_radix(f[1].rsplit_once(':')?.1, 16).ok()?;
            Some((port, u8::from_str_radix(f[3], 16).ok()?))
        })
        .collect()
}
