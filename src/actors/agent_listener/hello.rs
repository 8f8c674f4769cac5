//! What the master checks in an agent's `Hello` before it registers the
//! node: every field is the agent's word, and a hostile one must not
//! reach placement, templates or the store.

use std::net::{IpAddr, SocketAddr};
use std::path::{Component, Path};

use crate::protocol::messages::Hello;

/// The longest instance root and agent version accepted.
const MAX_ROOT: usize = 1024;
const MAX_VERSION: usize = 64;

/// Why `hello` is refused, if it is; `master` are the master's own
/// listening addresses, whose ports a node on the same host must not hand
/// out to instances.
pub fn check(hello: &Hello, master: &[SocketAddr]) -> Result<(), String> {
    let ip: IpAddr =
        hello.address.parse().map_err(|_| format!("address {:?} is not an IP address", truncate(&hello.address)))?;
    let (lo, hi) = hello.port_range;
    if lo < 1024 || lo > hi {
        return Err(format!("port range {lo}-{hi}: need 1024 <= LOW <= HIGH <= 65535"));
    }
    for m in master {
        let same_host = m.ip() == ip || (m.ip().is_unspecified() && ip.is_loopback());
        if same_host && (lo..=hi).contains(&m.port()) {
            return Err(format!("port range {lo}-{hi} holds the master's own port {} on {ip}", m.port()));
        }
    }
    let root = &hello.instance_root;
    if root.len() > MAX_ROOT || root.contains('\0') {
        return Err(format!("instance root must be a path of at most {MAX_ROOT} bytes"));
    }
    let path = Path::new(root);
    if !path.is_absolute() || path.components().any(|c| matches!(c, Component::ParentDir | Component::CurDir)) {
        return Err(format!("instance root {:?} must be absolute, without . or ..", truncate(root)));
    }
    crate::ids::validate_labels(hello.labels.iter()).map_err(|(key, m)| match key {
        Some(k) => format!("label {k:?}: {m}"),
        None => m,
    })?;
    if hello.unrecorded.len() > crate::protocol::messages::MAX_UNRECORDED {
        return Err(format!(
            "{} unrecorded instance directories; at most {}",
            hello.unrecorded.len(),
            crate::protocol::messages::MAX_UNRECORDED
        ));
    }
    if let Some(bad) = hello.unrecorded.iter().find(|i| !i.is_safe_path_component()) {
        return Err(format!("unrecorded instance id {:?} is not a safe name", truncate(bad.as_str())));
    }
    let version = &hello.agent_version;
    if version.is_empty() || version.len() > MAX_VERSION || !version.chars().all(|c| c.is_ascii_graphic()) {
        return Err(format!("agent version must be 1 to {MAX_VERSION} printable ASCII characters"));
    }
    Ok(())
}

/// At most 64 characters of `s`, for a message.
fn truncate(s: &str) -> String {
    s.chars().take(64).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::NodeId;
    use crate::protocol::messages::PROTOCOL_VERSION;

    fn hello() -> Hello {
        Hello {
            protocol_version: PROTOCOL_VERSION,
            node_id: NodeId::new("n1"),
            address: "10.0.0.5".into(),
            instance_root: "/var/lib/flotilla/instances".into(),
            port_range: (20000, 29999),
            labels: [("zone".to_string(), "a".to_string())].into_iter().collect(),
            agent_version: "0.1.0".into(),
            cgroups: false,
            resource_limits: false,
            inventory: vec![],
            unrecorded: vec![],
            simulated: false,
        }
    }

    #[test]
    fn a_sane_hello_passes_and_each_bad_field_is_named() {
        let master: Vec<SocketAddr> = vec!["10.0.0.1:7071".parse().unwrap(), "0.0.0.0:7070".parse().unwrap()];
        assert_eq!(check(&hello(), &master), Ok(()));
        type Spoil = Box<dyn Fn(&mut Hello)>;
        let cases: Vec<(Spoil, &str)> = vec![
            (Box::new(|h| h.address = "node-1.example.com".into()), "not an IP address"),
            (Box::new(|h| h.address = "10.0.0.5; rm -rf /".into()), "not an IP address"),
            (Box::new(|h| h.port_range = (80, 90)), "1024 <= LOW"),
            (Box::new(|h| h.port_range = (3000, 2000)), "1024 <= LOW"),
            (
                Box::new(|h| {
                    h.address = "10.0.0.1".into();
                    h.port_range = (7000, 8000)
                }),
                "master's own port 7071",
            ),
            (
                Box::new(|h| {
                    h.address = "127.0.0.1".into();
                    h.port_range = (7000, 7070)
                }),
                "master's own port 7070",
            ),
            (Box::new(|h| h.instance_root = "instances".into()), "must be absolute"),
            (Box::new(|h| h.instance_root = "/var/../etc".into()), "must be absolute"),
            (Box::new(|h| h.instance_root = "/a\0b".into()), "at most 1024 bytes"),
            (Box::new(|h| h.instance_root = format!("/{}", "a".repeat(2000))), "at most 1024 bytes"),
            (
                Box::new(|h| {
                    h.labels.insert("Zone".into(), "a".into());
                }),
                "label \"Zone\": invalid label name",
            ),
            (
                Box::new(|h| {
                    h.labels.insert("rack".into(), "r 1".into());
                }),
                "label \"rack\": invalid label value",
            ),
            (Box::new(|h| h.labels = (0..65).map(|i| (format!("l{i}"), "v".into())).collect()), "at most 64"),
            (Box::new(|h| h.agent_version = "1.0\n".into()), "agent version"),
            (Box::new(|h| h.unrecorded = vec![crate::ids::InstanceId::new("../etc")]), "not a safe name"),
        ];
        for (make, want) in cases {
            let mut h = hello();
            make(&mut h);
            let err = check(&h, &master).expect_err(want);
            assert!(err.contains(want), "{err:?} does not say {want:?}");
        }
        // Another host may use the master's port numbers.
        let mut h = hello();
        h.port_range = (7000, 8000);
        assert_eq!(check(&h, &master), Ok(()));
    }
}
