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
pub fn build(config: &PoolConfig, data_dir: &Path, install: &str) -> Result<Arc<dyn Driver>, PoolConfigError> {
    let bad = |key: &str, message: String| PoolConfigError {
        pool: config.name.clone(),
        key: format!("settings{}{key}", if key.is_empty() { "" } else { "." }),
        message,
    };
    match config.driver.as_str() {
        "local" => {
            let value = if config.settings.is_null() { serde_json::json!({}) } else { config.settings.clone() };
            let keys: LocalKeys = serde_path_to_error::deserialize(value)
                .map_err(|e| bad(&e.path().to_string().replace('.', ""), e.inner().to_string()))?;
            let short: String = config.name.chars().filter(|c| c.is_ascii_alphanumeric()).take(12).collect();
            let settings = local::LocalSettings {
                prefix: keys
                    .prefix
                    .unwrap_or_else(|| format!("f{}-{}", &install[..install.len().min(6)], short.to_ascii_lowercase())),
                data_dir: pools_dir(data_dir).join(&config.name),
                agent_binary: match keys.agent_binary {
                    Some(p) => p,
                    None => std::env::current_exe().map_err(|e| bad("agent_binary", format!("this binary: {e}")))?,
                },
                network: keys.network.unwrap_or_else(|| "10.213.0.0/16".into()),
                port_range: keys.port_range.unwrap_or_else(|| "20000-29999".into()),
                max_nodes: Some(config.max_nodes),
            };
            settings.check().map_err(|m| match m.split_once(": ") {
                Some((key, rest)) => bad(key, rest.to_string()),
                None => bad("", m),
            })?;
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
                    .map_err(|e| bad("", format!("cannot make {}: {e}", dir.display())))?;
            }
            let driver = local::LocalDriver::new(settings).map_err(|m| bad("", m))?;
            Ok(Arc::new(driver))
        }
        other => Err(bad("", format!("no driver {other:?}"))),
    }
}

/// Where local pools keep their nodes: `<master data_dir>-pools`.
pub fn pools_dir(data_dir: &Path) -> std::path::PathBuf {
    let mut name = data_dir.file_name().map(|n| n.to_os_string()).unwrap_or_else(|| "master".into());
    name.push("-pools");
    data_dir.with_file_name(name)
}
