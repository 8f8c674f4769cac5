//! The `sim` driver, for load tests only (`flotilla bench pools`): a
//! simulated cloud whose API is a spool directory. A create waits a random
//! time within `create_ms` (a machine booting), then writes
//! `<spool>/<id>.json` (the node id, its join token, the master's address,
//! its tags; mode 0600) and answers; whoever plays the machines (the bench,
//! which starts a simulated agent for each file: the real protocol, no
//! real processes) reads it there. A delete removes the file (the bench
//! stops that agent); `list` reads the directory. Never use it for real
//! nodes: nothing it "makes" runs anything.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};

use super::driver::{Driver, DriverError, DriverQuota, LaunchSpec, Resource, ResourceState};

/// What a simulated machine's file holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SimMachine {
    pub node: String,
    pub join_token: String,
    pub master_addr: std::net::SocketAddr,
    pub labels: BTreeMap<String, String>,
    pub tags: BTreeMap<String, String>,
}

#[derive(Debug, Clone)]
pub struct SimSettings {
    pub spool: PathBuf,
    /// A create takes a uniformly random time in this range, ms.
    pub create_ms: (u64, u64),
    pub max_nodes: u32,
}

pub struct SimDriver {
    s: Arc<SimSettings>,
}

impl SimDriver {
    pub fn new(s: SimSettings) -> Result<SimDriver, String> {
        if s.create_ms.0 > s.create_ms.1 || s.create_ms.1 > 600_000 {
            return Err(format!("create_ms: {:?} must be LOW-HIGH ms, at most 600000", s.create_ms));
        }
        std::fs::create_dir_all(&s.spool).map_err(|e| format!("spool: {}: {e}", s.spool.display()))?;
        Ok(SimDriver { s: Arc::new(s) })
    }

    fn path(&self, id: &str) -> Result<PathBuf, DriverError> {
        let ok = id.len() == 20 && id.starts_with("sim-") && id[4..].bytes().all(|b| b.is_ascii_hexdigit());
        if !ok {
            return Err(DriverError::config(format!("{id:?} is not a simulated machine's id")));
        }
        Ok(self.s.spool.join(format!("{id}.json")))
    }
}

fn random_u64() -> Result<u64, DriverError> {
    let mut b = [0u8; 8];
    getrandom::fill(&mut b).map_err(|e| DriverError::transient(format!("no randomness: {e}")))?;
    Ok(u64::from_le_bytes(b))
}

impl Driver for SimDriver {
    fn kind(&self) -> &'static str {
        "sim"
    }

    fn create<'a>(&'a self, spec: &'a LaunchSpec) -> BoxFuture<'a, Result<String, DriverError>> {
        Box::pin(async move {
            let (lo, hi) = self.s.create_ms;
            let wait = lo + random_u64()? % (hi - lo + 1);
            tokio::time::sleep(Duration::from_millis(wait)).await;
            let id = format!("sim-{:016x}", random_u64()?);
            let mut master_addr = spec.master_addr;
            if master_addr.ip().is_unspecified() {
                master_addr.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
            }
            let machine = SimMachine {
                node: spec.node.to_string(),
                join_token: spec.join_token.clone(),
                master_addr,
                labels: spec.labels.clone(),
                tags: spec.tags.clone(),
            };
            let bytes = serde_json::to_vec(&machine).map_err(|e| DriverError::transient(e.to_string()))?;
            let path = self.path(&id)?;
            tokio::task::spawn_blocking(move || crate::private_file::write_private(&path, &bytes))
                .await
                .map_err(|e| DriverError::transient(e.to_string()))?
                .map_err(|e| DriverError::transient(format!("spool: {e}")))?;
            Ok(id)
        })
    }

    fn status<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<ResourceState, DriverError>> {
        Box::pin(async move {
            let exists = self.path(id)?.exists();
            Ok(if exists { ResourceState::Running } else { ResourceState::Gone })
        })
    }

    fn delete<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), DriverError>> {
        Box::pin(async move {
            match std::fs::remove_file(self.path(id)?) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    Err(DriverError::transient(format!("spool: {e}")))
                }
                _ => Ok(()),
            }
        })
    }

    fn list(&self) -> BoxFuture<'_, Result<Vec<Resource>, DriverError>> {
        let spool = self.s.spool.clone();
        Box::pin(async move {
            tokio::task::spawn_blocking(move || {
                let mut out = Vec::new();
                let dir = std::fs::read_dir(&spool).map_err(|e| DriverError::transient(format!("spool: {e}")))?;
                for entry in dir {
                    let entry = entry.map_err(|e| DriverError::transient(format!("spool: {e}")))?;
                    let name = entry.file_name().to_string_lossy().to_string();
                    let Some(id) = name.strip_suffix(".json") else { continue };
                    let bytes = match std::fs::read(entry.path()) {
                        Ok(b) => b,
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                        Err(e) => return Err(DriverError::transient(format!("spool {name}: {e}"))),
                    };
                    let m: SimMachine = serde_json::from_slice(&bytes)
                        .map_err(|e| DriverError::transient(format!("spool {name}: {e}")))?;
                    out.push(Resource { external_id: id.to_string(), tags: m.tags, state: ResourceState::Running });
                }
                Ok(out)
            })
            .await
            .map_err(|e| DriverError::transient(e.to_string()))?
        })
    }

    fn quota(&self) -> BoxFuture<'_, Result<DriverQuota, DriverError>> {
        let max = self.s.max_nodes;
        Box::pin(async move { Ok(DriverQuota { max_nodes: Some(max) }) })
    }
}
