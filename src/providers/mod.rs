//! Where nodes come from: the driver interface ([`driver`]) and the
//! drivers that make machines (`local`: network namespaces on this host),
//! the fault-injecting wrapper the launcher's tests put around a real
//! driver ([`faulty`]), and the pools' settings ([`pool_config`]). The
//! policy (requests, retries, timeouts, quota, leak cleanup) is the
//! launcher's, in `actors::pools`.

pub mod driver;
pub mod faulty;
pub mod local;
pub mod pool_config;

pub use driver::{Driver, DriverError, DriverQuota, ErrorClass, LaunchSpec, Resource, ResourceState};

use std::path::Path;
use std::sync::Arc;

use pool_config::{PoolConfig, PoolConfigError};

/// The `local` driver's keys in a pool's `settings`.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
struct LocalKeys {
    prefix: Option<String>,
    network: Option<String>,
    port_range: Option<String>,
    agent_binary: Option<std::path::PathBuf>,
}

/// Makes pool `config`'s driver. `data_dir`: the master's; a local pool's
/// nodes live beside it, in `<data_dir>-pools/<pool>/` (the master's own
/// directory is private, and the nodes' instances, running as users of
/// their own, must reach their directories). `install`: this
/// installation's id, which names the local pool's namespaces by default.
/// `local`: the `index`-th local pool of the config (its default network
/// is the `index`-th /20 of 10.213.0.0/16).
pub fn build(
    config: &PoolConfig,
    index: usize,
    data_dir: &Path,
    install: &str,
) -> Result<Arc<dyn Driver>, PoolConfigError> {
    match config.driver.as_str() {
        "local" => {
            let settings = local_settings(config, index, data_dir, install)?;
            // Searchable by others (0711), not readable: the nodes'
            // instances run as users of their own and reach their
            // directories through these.
            for dir in [pools_dir(data_dir), settings.data_dir.clone()] {
                use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o711)
                    .create(&dir)
                    .and_then(|()| std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o711)))
                    .map_err(|e| setting_error(config, "", format!("cannot make {}: {e}", dir.display())))?;
            }
            let driver = local::LocalDriver::new(settings).map_err(|m| setting_error(config, "", m))?;
            Ok(Arc::new(driver))
        }
        other => Err(setting_error(config, "", format!("no driver {other:?}"))),
    }
}

fn setting_error(config: &PoolConfig, key: &str, message: String) -> PoolConfigError {
    PoolConfigError {
        pool: config.name.clone(),
        key: format!("settings{}{key}", if key.is_empty() { "" } else { "." }),
        message,
    }
}

/// A local pool's settings, defaults filled in and checked.
pub fn local_settings(
    config: &PoolConfig,
    index: usize,
    data_dir: &Path,
    install: &str,
) -> Result<local::LocalSettings, PoolConfigError> {
    let bad = |key: &str, message: String| setting_error(config, key, message);
    let value = if config.settings.is_null() { serde_json::json!({}) } else { config.settings.clone() };
    let keys: LocalKeys = serde_path_to_error::deserialize(value)
        .map_err(|e| bad(&e.path().to_string().replace('.', ""), e.inner().to_string()))?;
    let short: String = config.name.chars().filter(|c| c.is_ascii_alphanumeric()).take(12).collect();
    let network = match keys.network {
        Some(n) => n,
        None if index < 16 => format!("10.213.{}.0/20", index * 16),
        None => return Err(bad("network", "more than 16 local pools: give each its own network".into())),
    };
    let settings = local::LocalSettings {
        prefix: keys
            .prefix
            .unwrap_or_else(|| format!("f{}{index}-{}", &install[..install.len().min(6)], short.to_ascii_lowercase())),
        data_dir: pools_dir(data_dir).join(&config.name),
        agent_binary: match keys.agent_binary {
            Some(p) => p,
            None => std::env::current_exe().map_err(|e| bad("agent_binary", format!("this binary: {e}")))?,
        },
        network,
        port_range: keys.port_range.unwrap_or_else(|| "20000-29999".into()),
        max_nodes: Some(config.max_nodes),
    };
    settings.check().map_err(|m| match m.split_once(": ") {
        Some((key, rest)) => bad(key, rest.to_string()),
        None => bad("", m),
    })?;
    Ok(settings)
}

/// Local pools must not share a prefix or a network (their namespaces or
/// addresses would collide).
pub fn check_local_pools(pools: &[PoolConfig], data_dir: &Path, install: &str) -> Result<(), PoolConfigError> {
    let mut seen: Vec<(&PoolConfig, local::LocalSettings)> = Vec::new();
    for (index, p) in pools.iter().filter(|p| p.driver == "local").enumerate() {
        let s = local_settings(p, index, data_dir, install)?;
        for (other, o) in &seen {
            let clash = |key: &str, what: &str| PoolConfigError {
                pool: p.name.clone(),
                key: format!("settings.{key}"),
                message: format!("{what} pool {}'s", other.name),
            };
            if s.prefix.starts_with(&o.prefix) || o.prefix.starts_with(&s.prefix) {
                return Err(clash("prefix", &format!("{:?} overlaps", s.prefix)));
            }
            if overlap(&s.network, &o.network) {
                return Err(clash("network", &format!("{} overlaps", s.network)));
            }
        }
        seen.push((p, s));
    }
    Ok(())
}

/// Whether two IPv4 CIDRs (checked already) share an address.
fn overlap(a: &str, b: &str) -> bool {
    let parse = |c: &str| -> Option<(u32, u32)> {
        let (ip, len) = c.split_once('/')?;
        let ip: std::net::Ipv4Addr = ip.parse().ok()?;
        let len: u32 = len.parse().ok()?;
        let mask = if len == 0 { 0 } else { u32::MAX << (32 - len.min(32)) };
        Some((u32::from(ip) & mask, mask))
    };
    match (parse(a), parse(b)) {
        (Some((na, ma)), Some((nb, mb))) => {
            let m = ma & mb;
            na & m == nb & m
        }
        _ => true,
    }
}

/// Where local pools keep their nodes: `<master data_dir>-pools`.
pub fn pools_dir(data_dir: &Path) -> std::path::PathBuf {
    let mut name = data_dir.file_name().map(|n| n.to_os_string()).unwrap_or_else(|| "master".into());
    name.push("-pools");
    data_dir.with_file_name(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn local(name: &str, settings: serde_json::Value) -> PoolConfig {
        let text = format!("name = \"{name}\"\ndriver = \"local\"\nmax_nodes = 2\n");
        let mut c: PoolConfig = toml::from_str(&text).unwrap();
        c.settings = settings;
        c
    }

    #[test]
    fn local_pools_get_networks_of_their_own_and_a_clash_is_named() {
        let dir = Path::new("/var/lib/flotilla/master");
        let (a, b) = (local("a", serde_json::Value::Null), local("b", serde_json::Value::Null));
        check_local_pools(&[a.clone(), b.clone()], dir, "0123456789abcdef").expect("defaults never clash");
        let sa = local_settings(&a, 0, dir, "0123456789abcdef").unwrap();
        let sb = local_settings(&b, 1, dir, "0123456789abcdef").unwrap();
        assert_eq!((sa.network.as_str(), sb.network.as_str()), ("10.213.0.0/20", "10.213.16.0/20"));
        assert_eq!(sa.data_dir, Path::new("/var/lib/flotilla/master-pools/a"), "beside the master's private dir");
        let c = local("c", serde_json::json!({"network": "10.213.20.0/24"}));
        let err = check_local_pools(&[a.clone(), b.clone(), c], dir, "0123456789abcdef").unwrap_err();
        assert_eq!((err.pool.as_str(), err.key.as_str()), ("c", "settings.network"), "{err}");
        let d = local("d", serde_json::json!({"prefix": "same"}));
        let e = local("e", serde_json::json!({"prefix": "same", "network": "10.99.0.0/24"}));
        let err = check_local_pools(&[d, e], dir, "0123456789abcdef").unwrap_err();
        assert_eq!(err.key, "settings.prefix", "{err}");
        let bad = local("f", serde_json::json!({"netwrok": "10.1.0.0/24"}));
        let err = local_settings(&bad, 0, dir, "x").unwrap_err();
        assert!(err.to_string().contains("netwrok"), "an unknown key is named: {err}");
    }
}
