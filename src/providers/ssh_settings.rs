//! A `static` pool's settings (`[node_pools.settings]`), checked at load:
//! an error names the bad key, relative to `settings` (`hosts[2].host_key`).
//!
//! ```toml
//! [node_pools.settings]
//! agent_binary = "/usr/local/bin/flotilla"   # default: the master's own binary
//! remote_dir = "/var/lib/flotilla-node"     # the default
//! port_range = "20000-29999"                # the default
//! max_parallel = 20                         # bootstraps (and listings) at once
//! connect_timeout = "10s"                   # ssh's ConnectTimeout
//! [[node_pools.settings.hosts]]              # one per host
//! address = "10.1.2.3"
//! port = 22                                  # the default
//! user = "root"                              # the default; else `sudo -n`
//! key = "/etc/flotilla/id_ed25519"           # ssh -i
//! host_key = "ssh-ed25519 AAAA..."           # its /etc/ssh/ssh_host_ed25519_key.pub
//! labels = { rack = "r1" }                   # on top of the pool's
//! ```

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::providers::driver::{DriverError, LaunchSpec};

const REMOTE_DIR: &str = "/var/lib/flotilla-node";
const KEY_TYPES: [&str; 7] = [
    "ssh-ed25519",
    "ssh-rsa",
    "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521",
    "sk-ssh-ed25519@openssh.com",
    "sk-ecdsa-sha2-nistp256@openssh.com",
];

/// One host of a `static` pool.
#[derive(Debug, Clone)]
pub struct StaticHost {
    pub address: String,
    pub port: u16,
    pub user: String,
    /// The private key ssh logs in with (`-i`).
    pub key: PathBuf,
    /// `<type> <base64>`, as in the host's `/etc/ssh/ssh_host_*_key.pub`.
    pub host_key: String,
    /// Labels its node gets on top of the pool's.
    pub labels: BTreeMap<String, String>,
}

impl StaticHost {
    /// `<address>:<port>`, which names the host in messages and ids.
    pub fn name(&self) -> String {
        format!("{}:{}", self.address, self.port)
    }
}

/// A `static` pool's settings, checked ([`StaticSettings::from_value`]).
#[derive(Debug, Clone)]
pub struct StaticSettings {
    pub hosts: Vec<StaticHost>,
    pub agent_binary: PathBuf,
    /// Everything of a node on its host; removed whole by `delete`.
    pub remote_dir: String,
    pub port_range: String,
    pub max_parallel: usize,
    pub connect_timeout: Duration,
    /// Whether an agent may run under systemd where PID 1 is systemd (the
    /// tests turn it off: they must never write real units).
    pub use_systemd: bool,
    /// The driver's own directory on the master: one log per host and the
    /// pinned known_hosts files.
    pub dir: PathBuf,
}

#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
struct Keys {
    hosts: Vec<HostKeys>,
    agent_binary: Option<PathBuf>,
    remote_dir: Option<String>,
    port_range: Option<String>,
    max_parallel: Option<usize>,
    connect_timeout: Option<String>,
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct HostKeys {
    address: String,
    #[serde(default = "ssh_port")]
    port: u16,
    #[serde(default = "root")]
    user: String,
    key: PathBuf,
    host_key: String,
    #[serde(default)]
    labels: BTreeMap<String, String>,
}

fn ssh_port() -> u16 {
    22
}
fn root() -> String {
    "root".into()
}

impl StaticSettings {
    /// Reads and checks a pool's `settings`; an error names the bad key
    /// (relative to `settings`: `hosts[2].host_key`).
    pub fn from_value(
        value: serde_json::Value,
        pool_labels: &BTreeMap<String, String>,
        dir: PathBuf,
    ) -> Result<StaticSettings, (String, String)> {
        let keys: Keys = serde_path_to_error::deserialize(value).map_err(|e| {
            let path = e.path().to_string();
            (if path == "." { String::new() } else { path }, e.inner().to_string())
        })?;
        let bad = |key: String, m: String| (key, m);
        if keys.hosts.is_empty() {
            return Err(bad("hosts".into(), "at least one host: [{ address, port, user, key, host_key }]".into()));
        }
        let mut hosts: Vec<StaticHost> = Vec::new();
        for (i, h) in keys.hosts.into_iter().enumerate() {
            let at = |k: &str| format!("hosts[{i}].{k}");
            check_address(&h.address).map_err(|m| bad(at("address"), m))?;
            if h.port == 0 {
                return Err(bad(at("port"), "must be 1 to 65535".into()));
            }
            let user_ok = !h.user.is_empty()
                && h.user.len() <= 32
                && !h.user.starts_with('-')
                && h.user.chars().all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c));
            if !user_ok {
                return Err(bad(at("user"), format!("{:?} is not a user name", h.user)));
            }
            match std::fs::metadata(&h.key) {
                Ok(m) if m.is_file() && h.key.is_absolute() => {}
                Ok(_) => return Err(bad(at("key"), format!("{} is not an absolute path of a file", h.key.display()))),
                Err(e) => return Err(bad(at("key"), format!("{}: {e}", h.key.display()))),
            }
            let host_key = parse_host_key(&h.host_key).map_err(|m| bad(at("host_key"), m))?;
            crate::ids::validate_labels(h.labels.iter())
                .map_err(|(k, m)| bad(k.map(|k| at(&format!("labels.{k}"))).unwrap_or_else(|| at("labels")), m))?;
            if let Some((k, v)) = h.labels.iter().find(|(k, v)| pool_labels.get(*k).is_some_and(|p| p != *v)) {
                return Err(bad(at(&format!("labels.{k}")), format!("{v:?} differs from the pool's own {k} label")));
            }
            let host =
                StaticHost { address: h.address, port: h.port, user: h.user, key: h.key, host_key, labels: h.labels };
            if let Some(j) = hosts.iter().position(|o| o.name() == host.name()) {
                return Err(bad(at("address"), format!("{} is hosts[{j}] too", host.name())));
            }
            hosts.push(host);
        }
        let agent_binary = match keys.agent_binary {
            Some(p) => p,
            None => std::env::current_exe().map_err(|e| bad("agent_binary".into(), format!("this binary: {e}")))?,
        };
        match std::fs::metadata(&agent_binary) {
            Ok(m) if m.is_file() => {}
            Ok(_) => return Err(bad("agent_binary".into(), format!("{} is not a file", agent_binary.display()))),
            Err(e) => return Err(bad("agent_binary".into(), format!("{}: {e}", agent_binary.display()))),
        }
        let remote_dir = keys.remote_dir.unwrap_or_else(|| REMOTE_DIR.into());
        check_remote_dir(&remote_dir).map_err(|m| bad("remote_dir".into(), format!("{remote_dir:?}: {m}")))?;
        let port_range = keys.port_range.unwrap_or_else(|| "20000-29999".into());
        let range = port_range.split_once('-').and_then(|(a, b)| Some((a.parse::<u16>().ok()?, b.parse().ok()?)));
        if !matches!(range, Some((lo, hi)) if lo >= 1 && lo <= hi) {
            return Err(bad("port_range".into(), format!("{port_range:?}: expected LOW-HIGH, e.g. 20000-29999")));
        }
        let max_parallel = keys.max_parallel.unwrap_or(20);
        if !(1..=1000).contains(&max_parallel) {
            return Err(bad("max_parallel".into(), format!("must be 1 to 1000, got {max_parallel}")));
        }
        let connect_timeout = match keys.connect_timeout {
            None => Duration::from_secs(10),
            Some(s) => humantime::parse_duration(&s)
                .ok()
                .filter(|d| (Duration::from_secs(1)..=Duration::from_secs(300)).contains(d))
                .ok_or_else(|| bad("connect_timeout".into(), format!("{s:?}: expected a duration of 1s to 300s")))?,
        };
        Ok(StaticSettings {
            hosts,
            agent_binary,
            remote_dir,
            port_range,
            max_parallel,
            connect_timeout,
            use_systemd: true,
            dir,
        })
    }
}

/// The node id, labels and token go into file names, command lines and an
/// environment file: plain characters only.
pub(super) fn check_spec(spec: &LaunchSpec) -> Result<(), DriverError> {
    let plain = |s: &str| {
        !s.is_empty() && s.len() <= 1024 && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
    };
    if !plain(spec.node.as_str()) || spec.node.as_str().starts_with(['-', '.']) {
        return Err(DriverError::config(format!("node id {:?}: not a plain name", spec.node.as_str())));
    }
    crate::ids::validate_labels(spec.labels.iter())
        .map_err(|(k, m)| DriverError::config(format!("label {}: {m}", k.unwrap_or_default())))?;
    if !plain(&spec.join_token) {
        return Err(DriverError::config("the join token holds characters an environment file cannot"));
    }
    Ok(())
}

fn check_address(a: &str) -> Result<(), String> {
    if a.parse::<IpAddr>().is_ok() {
        return Ok(());
    }
    let ok = !a.is_empty()
        && a.len() <= 253
        && !a.starts_with(['-', '.'])
        && a.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.');
    if ok { Ok(()) } else { Err(format!("{a:?} is neither an IP address nor a host name")) }
}

/// A directory `rm -rf` may take: absolute, plain characters, two levels
/// deep at least, not a system directory and not under a tree others may
/// write to (the scripts check the host's owners and modes again).
fn check_remote_dir(d: &str) -> Result<(), String> {
    if !d.starts_with('/') || d.len() > 200 {
        return Err("must be an absolute path of at most 200 characters".into());
    }
    if let Some(c) = d.chars().find(|c| !(c.is_ascii_alphanumeric() || "/._-".contains(*c))) {
        return Err(format!("{c:?} is not allowed (only A-Z, a-z, 0-9, '/', '.', '_', '-')"));
    }
    let parts: Vec<&str> = d[1..].split('/').collect();
    if parts.iter().any(|p| p.is_empty() || *p == "." || *p == "..") {
        return Err("no empty, '.' or '..' component, no trailing '/'".into());
    }
    // Anyone may plant a symlink in these (or their owner, in /home): a
    // root shell must never trust what it finds there.
    let shared = ["/tmp", "/var/tmp", "/dev/shm", "/dev", "/run/shm", "/run/lock", "/var/lock", "/home"];
    if let Some(tree) = shared.iter().find(|t| d == **t || d.starts_with(&format!("{t}/"))) {
        return Err(format!(
            "{tree} is writable by others than root: give a directory only root can write to, e.g. \
             /var/lib/flotilla-node"
        ));
    }
    let system = ["/usr/bin", "/usr/lib", "/usr/local", "/usr/sbin", "/usr/share", "/var/lib", "/var/log"];
    if parts.len() < 2 || system.contains(&d) || d.starts_with("/etc/") || d.starts_with("/proc/") {
        return Err("deleting a node removes it whole: give a directory of its own, e.g. /var/lib/flotilla-node".into());
    }
    Ok(())
}

/// `<type> <base64>` of an SSH public key whose data is of that type.
fn parse_host_key(s: &str) -> Result<String, String> {
    let mut parts = s.split_whitespace();
    let (Some(kind), Some(data)) = (parts.next(), parts.next()) else {
        return Err("expected \"<type> <base64>\", the line of the host's /etc/ssh/ssh_host_*_key.pub".into());
    };
    if !KEY_TYPES.contains(&kind) {
        return Err(format!("{kind:?} is not an SSH key type ({})", KEY_TYPES.join(", ")));
    }
    let blob = base64(data).ok_or("the key data is not base64")?;
    let len = blob.get(..4).map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize);
    let inner = len.and_then(|n| blob.get(4..4 + n));
    if inner != Some(kind.as_bytes()) {
        return Err(format!("the key data is not a {kind} key"));
    }
    Ok(format!("{kind} {data}"))
}

fn base64(s: &str) -> Option<Vec<u8>> {
    let (mut out, mut acc, mut bits) = (Vec::new(), 0u32, 0u32);
    for c in s.trim_end_matches('=').bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::fs;
    use std::time::Duration;

    use crate::providers::pool_config::PoolConfig;
    use serde_json::json as j;

    /// A well-formed ed25519 public key (no sshd holds it).
    const SOME_KEY: &str = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIJFJ0Ikt/Ktq5u9iJCqPUDVv2E2k/Z86qp6d3A1tMGBG";

    #[test]
    fn settings_are_checked_and_each_bad_key_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("id");
        fs::write(&key, "a key").unwrap();
        let host = |extra: serde_json::Value| {
            let mut h = j!({"address": "10.1.2.3", "key": key, "host_key": SOME_KEY});
            h.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            h
        };
        let labels = BTreeMap::from([("zone".to_string(), "a".to_string())]);
        let parse = |v: serde_json::Value| super::StaticSettings::from_value(v, &labels, dir.path().to_path_buf());
        let good = parse(j!({"hosts": [host(j!({}))], "agent_binary": "/bin/sh"})).unwrap();
        let h = &good.hosts[0];
        assert_eq!((h.port, h.user.as_str(), h.host_key.as_str()), (22, "root", SOME_KEY));
        assert_eq!((good.remote_dir.as_str(), good.port_range.as_str()), ("/var/lib/flotilla-node", "20000-29999"));
        assert_eq!((good.max_parallel, good.connect_timeout), (20, Duration::from_secs(10)));

        let other_type = SOME_KEY.replace("ssh-ed25519", "ssh-rsa");
        // (the host's keys, the top keys over them (`hosts` too), the key named)
        let mut cases = vec![
            (j!({}), j!({"hosts": []}), "hosts"),
            (j!({"address": "-oProxyCommand=x"}), j!({}), "hosts[0].address"),
            (j!({"port": 0}), j!({}), "hosts[0].port"),
            (j!({"port": 70000}), j!({}), "hosts[0].port"),
            (j!({"user": "root;id"}), j!({}), "hosts[0].user"),
            (j!({"key": "/nonexistent/id"}), j!({}), "hosts[0].key"),
            (j!({"labels": {"zone": "b"}}), j!({}), "hosts[0].labels.zone"),
            (j!({"labels": {"Bad": "x"}}), j!({}), "hosts[0].labels.Bad"),
            (j!({}), j!({"hosts": [host(j!({})), host(j!({}))]}), "hosts[1].address"),
            (
                j!({}),
                j!({"hosts": [host(j!({"address": "10.0.0.1"})), host(j!({"host_key": other_type}))]}),
                "hosts[1].host_key",
            ),
            (j!({"host_key": "ssh-ed25519 !!!"}), j!({}), "hosts[0].host_key"),
            (j!({"host_key": "10.1.2.3 ssh-ed25519 AAAA"}), j!({}), "hosts[0].host_key"),
            (j!({"adress": "x"}), j!({}), "hosts[0].adress"),
            (j!({}), j!({"port_range": "9-1"}), "port_range"),
            (j!({}), j!({"max_parallel": 0}), "max_parallel"),
            (j!({}), j!({"connect_timeout": "0s"}), "connect_timeout"),
            (j!({}), j!({"agent_binary": "/nonexistent"}), "agent_binary"),
            (j!({}), j!({"hostz": []}), "hostz"),
        ];
        for d in [
            "/var/lib",
            "/opt",
            "/opt/../etc",
            "/opt/a b",
            "opt/fl",
            "/tmp/fl",
            "/var/tmp/x",
            "/dev/shm/x",
            "/home/u/x",
        ] {
            cases.push((j!({}), j!({"remote_dir": d}), "remote_dir"));
        }
        for (one, top, named) in cases {
            let mut v = j!({"hosts": [host(one)], "agent_binary": "/bin/sh"});
            v.as_object_mut().unwrap().extend(top.as_object().unwrap().clone());
            let (key, message) = parse(v.clone()).expect_err(named);
            assert_eq!(key, named, "{v}: {message}");
        }

        // Through the pool's config, as the master loads it: the whole key.
        let text = "name = \"p\"\ndriver = \"static\"\nmax_nodes = 2\n";
        let mut config: PoolConfig = toml::from_str(text).unwrap();
        config.check().expect("static is a driver");
        let bad_key = j!({"address": "10.0.0.9", "key": key, "host_key": "ssh-ed25519 AAAA"});
        config.settings = j!({"hosts": [host(j!({})), host(j!({"address": "10.0.0.8"})), bad_key]});
        let err = crate::providers::static_settings(&config, dir.path()).unwrap_err().to_string();
        assert!(err.starts_with("node_pools[p].settings.hosts[2].host_key: "), "{err}");
    }
}
