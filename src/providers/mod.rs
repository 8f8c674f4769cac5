//! Where nodes come from: the driver interface ([`driver`]) and the
//! drivers that make machines (`local`: network namespaces on this host;
//! `static`: a list of hosts bootstrapped over SSH, [`ssh`]; `ec2`: EC2
//! instances through the Query API, [`ec2`]),
//! the fault-injecting wrapper the launcher's tests put around a real
//! driver ([`faulty`]), and the pools' settings ([`pool_config`]). The
//! policy (requests, retries, timeouts, quota, leak cleanup) is the
//! launcher's, in `actors::pools`.

pub mod driver;
pub mod ec2;
pub mod ec2_api;
pub mod faulty;
pub mod local;
mod netns;
pub mod pool_config;
pub mod sim;
pub mod ssh;

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
pub fn build(config: &PoolConfig, data_dir: &Path, install: &str) -> Result<Arc<dyn Driver>, PoolConfigError> {
    match config.driver.as_str() {
        "local" => {
            let settings = local_settings(config, data_dir, install)?;
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
        "sim" => {
            #[derive(serde::Deserialize)]
            #[serde(deny_unknown_fields)]
            struct Keys {
                spool: std::path::PathBuf,
                #[serde(default)]
                create_ms: Option<String>,
            }
            let keys: Keys = serde_path_to_error::deserialize(config.settings.clone())
                .map_err(|e| setting_error(config, &e.path().to_string(), e.inner().to_string()))?;
            let range = keys.create_ms.as_deref().unwrap_or("1000-5000");
            let create_ms = range
                .split_once('-')
                .and_then(|(a, b)| Some((a.trim().parse().ok()?, b.trim().parse().ok()?)))
                .ok_or_else(|| setting_error(config, "create_ms", format!("{range:?}: expected LOW-HIGH in ms")))?;
            let settings =
                sim::SimSettings { spool: keys.spool, create_ms, max_nodes: config.max_nodes + config.max_disrupting };
            Ok(Arc::new(sim::SimDriver::new(settings).map_err(|m| setting_error(config, "", m))?))
        }
        "static" => {
            let settings = static_settings(config, data_dir)?;
            std::fs::create_dir_all(pools_dir(data_dir))
                .and_then(|()| crate::private_file::private_dir(&settings.dir))
                .map_err(|e| setting_error(config, "", format!("cannot make {}: {e}", settings.dir.display())))?;
            let driver = ssh::StaticDriver::new(settings).map_err(|m| setting_error(config, "", m))?;
            Ok(Arc::new(driver))
        }
        "ec2" => {
            let value = if config.settings.is_null() { serde_json::json!({}) } else { config.settings.clone() };
            let settings = ec2::Ec2Settings::from_value(value, install, &config.name)
                .map_err(|(key, m)| setting_error(config, &key, m))?;
            let creds = ec2_api::Credentials::from_env().map_err(|m| setting_error(config, "", m))?;
            Ok(Arc::new(ec2::Ec2Driver::new(settings, creds).map_err(|m| setting_error(config, "", m))?))
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

/// A local pool's settings, defaults filled in and checked. The defaults
/// come from the pool's name (never its place in the file: reordering the
/// pools must not rename their namespaces): the network is one of the 16
/// /20s of 10.213.0.0/16, picked by a hash of the name, and the prefix
/// carries the installation's id, two hex digits of that hash and the
/// name; two pools that land on the same ones are refused at start
/// ([`check_local_pools`]): give one its own `network` or `prefix`.
pub fn local_settings(
    config: &PoolConfig,
    data_dir: &Path,
    install: &str,
) -> Result<local::LocalSettings, PoolConfigError> {
    let bad = |key: &str, message: String| setting_error(config, key, message);
    let value = if config.settings.is_null() { serde_json::json!({}) } else { config.settings.clone() };
    let keys: LocalKeys = serde_path_to_error::deserialize(value)
        .map_err(|e| bad(&e.path().to_string().replace('.', ""), e.inner().to_string()))?;
    let short: String = config.name.chars().filter(|c| c.is_ascii_alphanumeric()).take(12).collect();
    let hash = {
        use sha2::Digest;
        sha2::Sha256::digest(config.name.as_bytes())[0]
    };
    let network = keys.network.unwrap_or_else(|| format!("10.213.{}.0/20", (hash % 16) as u32 * 16));
    let settings = local::LocalSettings {
        prefix: keys.prefix.unwrap_or_else(|| {
            format!("f{}{hash:02x}-{}", &install[..install.len().min(6)], short.to_ascii_lowercase())
        }),
        data_dir: pools_dir(data_dir).join(&config.name),
        agent_binary: match keys.agent_binary {
            Some(p) => p,
            None => std::env::current_exe().map_err(|e| bad("agent_binary", format!("this binary: {e}")))?,
        },
        network,
        port_range: keys.port_range.unwrap_or_else(|| "20000-29999".into()),
        // Room for the replacements of nodes being removed (see
        // `Launcher::used`): the pool's own capacity is the launcher's.
        max_nodes: Some(config.max_nodes + config.max_disrupting),
    };
    settings.check().map_err(|m| match m.split_once(": ") {
        Some((key, rest)) => bad(key, rest.to_string()),
        None => bad("", m),
    })?;
    Ok(settings)
}

/// A static pool's settings, checked: its per-host logs and pinned
/// known_hosts files go to `<data_dir>-pools/<pool>/`.
pub fn static_settings(config: &PoolConfig, data_dir: &Path) -> Result<ssh::StaticSettings, PoolConfigError> {
    let value = if config.settings.is_null() { serde_json::json!({}) } else { config.settings.clone() };
    ssh::StaticSettings::from_value(value, &config.labels, pools_dir(data_dir).join(&config.name))
        .map_err(|(key, m)| setting_error(config, &key, m))
}

/// Local pools must not share a prefix or a network (their namespaces or
/// addresses would collide).
pub fn check_local_pools(pools: &[PoolConfig], data_dir: &Path, install: &str) -> Result<(), PoolConfigError> {
    let mut seen: Vec<(&PoolConfig, local::LocalSettings)> = Vec::new();
    for p in pools.iter().filter(|p| p.driver == "local") {
        let s = local_settings(p, data_dir, install)?;
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
        check_local_pools(&[a.clone(), b.clone()], dir, "0123456789abcdef").expect("these defaults do not clash");
        let sa = local_settings(&a, dir, "0123456789abcdef").unwrap();
        let sb = local_settings(&b, dir, "0123456789abcdef").unwrap();
        assert_ne!(sa.network, sb.network);
        assert!(sa.network.starts_with("10.213.") && sa.network.ends_with(".0/20"), "{}", sa.network);
        // The same whatever the pool's place in the file.
        assert_eq!(local_settings(&a, dir, "0123456789abcdef").unwrap().prefix, sa.prefix);
        check_local_pools(&[b.clone(), a.clone()], dir, "0123456789abcdef").unwrap();
        assert_eq!(sa.data_dir, Path::new("/var/lib/flotilla/master-pools/a"), "beside the master's private dir");
        let inside = sb.network.replace(".0/20", ".0/24");
        let c = local("c", serde_json::json!({"network": inside}));
        let err = check_local_pools(&[a.clone(), b.clone(), c], dir, "0123456789abcdef").unwrap_err();
        assert_eq!((err.pool.as_str(), err.key.as_str()), ("c", "settings.network"), "{err}");
        let d = local("d", serde_json::json!({"prefix": "same"}));
        let e = local("e", serde_json::json!({"prefix": "same", "network": "10.99.0.0/24"}));
        let err = check_local_pools(&[d, e], dir, "0123456789abcdef").unwrap_err();
        assert_eq!(err.key, "settings.prefix", "{err}");
        let bad = local("f", serde_json::json!({"netwrok": "10.1.0.0/24"}));
        let err = local_settings(&bad, dir, "x").unwrap_err();
        assert!(err.to_string().contains("netwrok"), "an unknown key is named: {err}");
    }
}
