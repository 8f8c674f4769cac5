//! A pool's settings (`[[node_pools]]` in the master's config file),
//! checked at load: every error names the pool and the key.
//!
//! ```toml
//! [[node_pools]]
//! name = "big"
//! driver = "local"
//! labels = { class = "big" }
//! max_nodes = 4
//! min_ready = 1
//! launch_timeout = "60s"
//! [node_pools.settings]        # the driver's own
//! network = "10.213.0.0/16"
//! ```

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Deserializer};

/// The drivers a pool may name.
pub const DRIVERS: [&str; 4] = ["local", "static", "ec2", "sim"];
/// At most this many pools.
pub const MAX_POOLS: usize = 64;
/// At most this many nodes in one pool.
pub const MAX_POOL_NODES: u32 = 10_000;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolConfig {
    pub name: String,
    pub driver: String,
    /// The labels every node of the pool gets; a request is served by the
    /// pools whose labels include all of its own.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    pub max_nodes: u32,
    /// Cores of all its nodes together, at most, each counted at
    /// `node_cpu` (its machine type's), which it needs.
    #[serde(default)]
    pub max_cpu: Option<f64>,
    /// Memory of all its nodes together, at most (`"64G"`), each counted
    /// at `node_memory`, which it needs.
    #[serde(default, deserialize_with = "opt_memory")]
    pub max_memory: Option<u64>,
    /// One node's cores, as the pool makes them.
    #[serde(default)]
    pub node_cpu: Option<f64>,
    /// One node's memory, as the pool makes them (`"8G"`).
    #[serde(default, deserialize_with = "opt_memory")]
    pub node_memory: Option<u64>,
    /// Empty ready nodes kept waiting (one request per missing one).
    #[serde(default)]
    pub min_ready: u32,
    /// An empty node beyond `min_ready` is given back after this long
    /// (off unless set: pools of quorum members keep their machines).
    #[serde(default, deserialize_with = "opt_duration")]
    pub idle_timeout: Option<Duration>,
    /// A spare (empty, ready) node older than this is replaced.
    #[serde(default, deserialize_with = "opt_duration")]
    pub max_ready_age: Option<Duration>,
    /// Lower is tried first.
    #[serde(default = "default_priority")]
    pub priority: u8,
    /// The driver's `create` must answer within this.
    #[serde(default = "two_minutes", deserialize_with = "duration")]
    pub launch_timeout: Duration,
    /// The node's agent must say hello within this of `create`'s answer.
    #[serde(default = "two_minutes", deserialize_with = "duration")]
    pub enroll_timeout: Duration,
    /// Tries after the first before the pool declines the request.
    #[serde(default = "default_retries")]
    pub launch_retries: u32,
    /// Nodes of the pool disrupted (removed, replaced) at once.
    #[serde(default = "one")]
    pub max_disrupting: u32,
    /// A ready node `Down` this long is removed, its members replaced on
    /// other nodes (repair), unless more than a fifth of the pool is
    /// `Down`; `"off"`: never.
    #[serde(default = "fifteen_minutes", deserialize_with = "duration_or_off")]
    pub replace_after: Option<Duration>,
    /// The driver's own settings (checked by the driver).
    #[serde(default)]
    pub settings: serde_json::Value,
}

fn default_priority() -> u8 {
    100
}
fn two_minutes() -> Duration {
    Duration::from_secs(120)
}
fn default_retries() -> u32 {
    3
}
fn one() -> u32 {
    1
}
fn fifteen_minutes() -> Option<Duration> {
    Some(Duration::from_secs(15 * 60))
}

fn duration_or_off<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    let s = String::deserialize(d)?;
    if s == "off" {
        return Ok(None);
    }
    humantime::parse_duration(&s)
        .map(Some)
        .map_err(|e| serde::de::Error::custom(format!("{s:?} is not a duration like \"15m\" (or \"off\"): {e}")))
}

fn duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let s = String::deserialize(d)?;
    humantime::parse_duration(&s)
        .map_err(|e| serde::de::Error::custom(format!("{s:?} is not a duration like \"5s\": {e}")))
}

fn opt_memory<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    let s = String::deserialize(d)?;
    crate::spec::checks::parse_memory(&s).map(Some).map_err(serde::de::Error::custom)
}

fn opt_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    duration(d).map(Some)
}

/// A pool setting that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("node_pools[{pool}].{key}: {message}")]
pub struct PoolConfigError {
    pub pool: String,
    pub key: String,
    pub message: String,
}

impl PoolConfig {
    fn bad(&self, key: &str, message: impl Into<String>) -> PoolConfigError {
        PoolConfigError { pool: self.name.clone(), key: key.into(), message: message.into() }
    }

    /// What the core checks (the driver checks `settings` when it is made).
    pub fn check(&self) -> Result<(), PoolConfigError> {
        crate::ids::validate_name(&self.name).map_err(|m| self.bad("name", m))?;
        if !DRIVERS.contains(&self.driver.as_str()) {
            return Err(
                self.bad("driver", format!("{:?} is not a driver (drivers: {})", self.driver, DRIVERS.join(", ")))
            );
        }
        crate::ids::validate_labels(self.labels.iter())
            .map_err(|(k, m)| self.bad(&k.map(|k| format!("labels.{k}")).unwrap_or_else(|| "labels".into()), m))?;
        if self.max_nodes == 0 || self.max_nodes > MAX_POOL_NODES {
            return Err(self.bad("max_nodes", format!("must be 1..={MAX_POOL_NODES}, got {}", self.max_nodes)));
        }
        for (max, each, key, what) in [
            (self.max_cpu, self.node_cpu, "max_cpu", "node_cpu"),
            (self.max_memory.map(|m| m as f64), self.node_memory.map(|m| m as f64), "max_memory", "node_memory"),
        ] {
            for (v, k) in [(max, key), (each, what)] {
                if v.is_some_and(|v| !(v.is_finite() && v > 0.0)) {
                    return Err(self.bad(k, "must be more than 0"));
                }
            }
            match (max, each) {
                (Some(_), None) => {
                    return Err(self.bad(what, format!("needed with {key}: what one node of the pool counts for")));
                }
                (Some(m), Some(e)) if m < e => {
                    return Err(self.bad(key, format!("holds not even one node ({what} is {e})")));
                }
                _ => {}
            }
        }
        if self.min_ready > self.capacity().0 {
            return Err(
                self.bad("min_ready", format!("{} is more than max_nodes ({})", self.min_ready, self.max_nodes))
            );
        }
        for (key, d) in [("launch_timeout", self.launch_timeout), ("enroll_timeout", self.enroll_timeout)] {
            if d < Duration::from_millis(100) || d > Duration::from_secs(24 * 3600) {
                return Err(self.bad(key, "must be between 100ms and 24h"));
            }
        }
        for (key, d) in [
            ("idle_timeout", self.idle_timeout),
            ("max_ready_age", self.max_ready_age),
            ("replace_after", self.replace_after),
        ] {
            if d.is_some_and(|d| d < Duration::from_secs(1)) {
                let off = if key == "replace_after" { "\"off\" turns it off" } else { "leave it out to turn it off" };
                return Err(self.bad(key, format!("must be at least 1s ({off})")));
            }
        }
        if self.launch_retries > 100 {
            return Err(self.bad("launch_retries", "at most 100"));
        }
        if self.max_disrupting == 0 {
            return Err(self.bad("max_disrupting", "must be at least 1"));
        }
        if !(self.settings.is_null() || self.settings.is_object()) {
            return Err(self.bad("settings", "must be a table"));
        }
        Ok(())
    }

    /// The most nodes the pool may hold: `max_nodes`, and as many as fit in
    /// `max_cpu` and `max_memory` (each node counted at `node_cpu`,
    /// `node_memory`); with what limits it, for a message.
    pub fn capacity(&self) -> (u32, String) {
        let mut cap = (self.max_nodes, "max_nodes".to_string());
        if let (Some(max), Some(each)) = (self.max_cpu, self.node_cpu) {
            // A hair over: 1.2 / 0.4 is 2.999... in floating point.
            let n = (max / each + 1e-9).floor().min(u32::MAX as f64) as u32;
            if n < cap.0 {
                cap = (n, format!("max_cpu {max} at {each} cores a node"));
            }
        }
        if let (Some(max), Some(each)) = (self.max_memory, self.node_memory) {
            let n = u32::try_from(max / each).unwrap_or(u32::MAX);
            if n < cap.0 {
                cap = (n, format!("max_memory {max} bytes at {each} a node"));
            }
        }
        cap
    }

    /// Whether a node of this pool carries every one of `wanted`.
    pub fn offers(&self, wanted: &BTreeMap<String, String>) -> bool {
        wanted.iter().all(|(k, v)| self.labels.get(k) == Some(v))
    }
}

/// Checks every pool and that names are unique.
pub fn check_all(pools: &[PoolConfig]) -> Result<(), PoolConfigError> {
    if pools.len() > MAX_POOLS {
        return Err(PoolConfigError {
            pool: "*".into(),
            key: "".into(),
            message: format!("at most {MAX_POOLS} pools, got {}", pools.len()),
        });
    }
    for (i, p) in pools.iter().enumerate() {
        p.check()?;
        if pools[..i].iter().any(|o| o.name == p.name) {
            return Err(p.bad("name", "two pools have this name"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Vec<PoolConfig>, String> {
        #[derive(Deserialize)]
        struct File {
            node_pools: Vec<PoolConfig>,
        }
        let f: File = toml::from_str(text).map_err(|e| e.to_string())?;
        check_all(&f.node_pools).map_err(|e| e.to_string())?;
        Ok(f.node_pools)
    }

    #[test]
    fn a_pool_loads_with_its_defaults_and_each_bad_key_is_named() {
        let ok = parse(
            "[[node_pools]]\nname = \"big\"\ndriver = \"local\"\nmax_nodes = 4\nlabels = { class = \"big\" }\n\
             [node_pools.settings]\nnetwork = \"10.213.0.0/16\"\n",
        )
        .unwrap();
        assert_eq!(ok[0].priority, 100);
        assert_eq!(ok[0].launch_timeout, Duration::from_secs(120));
        assert_eq!(ok[0].idle_timeout, None, "idle give-back is off unless set");
        assert_eq!(ok[0].replace_after, Some(Duration::from_secs(900)), "repair is on: 15 minutes");
        assert!(ok[0].offers(&BTreeMap::from([("class".into(), "big".into())])));
        assert!(!ok[0].offers(&BTreeMap::from([("class".into(), "small".into())])));
        let base = "[[node_pools]]\nname = \"p\"\ndriver = \"local\"\nmax_nodes = 2\n";
        for (extra, named) in [
            ("min_ready = 3\n", "node_pools[p].min_ready: 3 is more than max_nodes (2)"),
            ("launch_timeout = \"1ms\"\n", "node_pools[p].launch_timeout"),
            ("labels = { \"bad key\" = \"x\" }\n", "node_pools[p].labels"),
            ("max_disrupting = 0\n", "node_pools[p].max_disrupting"),
            ("idle_timeout = \"0s\"\n", "node_pools[p].idle_timeout"),
            ("replace_after = \"0s\"\n", "node_pools[p].replace_after: must be at least 1s (\"off\" turns it off)"),
            ("replace_after = \"soon\"\n", "(or \"off\")"),
        ] {
            let err = parse(&format!("{base}{extra}")).unwrap_err();
            assert!(err.contains(named), "{extra}: {err}");
        }
        // The cores and memory of all its nodes: each node counted at its size.
        let sized = parse(
            &format!("{base}max_nodes = 10\nmax_cpu = 10\nnode_cpu = 4\nmax_memory = \"64G\"\nnode_memory = \"8G\"\n")
                .replace("max_nodes = 2\n", ""),
        );
        let sized = sized.unwrap();
        assert_eq!(sized[0].capacity(), (2, "max_cpu 10 at 4 cores a node".to_string()));
        for (extra, named) in [
            ("max_cpu = 8\n", "node_pools[p].node_cpu: needed with max_cpu"),
            ("max_memory = \"1G\"\nnode_memory = \"2G\"\n", "node_pools[p].max_memory: holds not even one node"),
            ("max_cpu = 0\nnode_cpu = 1\n", "node_pools[p].max_cpu: must be more than 0"),
            ("max_memory = \"lots\"\n", "memory"),
        ] {
            let err = parse(&format!("{base}{extra}")).unwrap_err();
            assert!(err.contains(named), "{extra}: {err}");
        }
        let off = parse(&format!("{base}replace_after = \"off\"\n")).unwrap();
        assert_eq!(off[0].replace_after, None);
        let err = parse("[[node_pools]]\nname = \"p\"\ndriver = \"gce\"\nmax_nodes = 2\n").unwrap_err();
        assert!(err.contains("node_pools[p].driver: \"gce\" is not a driver"), "{err}");
        let err = parse(&format!("{base}{base}")).unwrap_err();
        assert!(err.contains("two pools have this name"), "{err}");
        let err = parse(&format!("{base}colour = \"red\"\n")).unwrap_err();
        assert!(err.contains("colour"), "an unknown key is named: {err}");
    }
}
