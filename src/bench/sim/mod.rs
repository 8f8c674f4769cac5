//! Simulated agents, **for load tests only**: many agents in one process,
//! each a real TCP connection speaking the real protocol (the same
//! `src/protocol/` code, the same writer loop and report outbox as the real
//! agent), with a fake process layer instead of real processes. Each says
//! `simulated: true` in its `Hello`, and `GET /nodes` shows it.
//!
//! - [`state`]: what an agent holds and how each request changes it
//! - [`agent`]: one agent's connection and latencies
//! - [`faults`]: its fault switches
//!
//! The protocol battery (`tests/integration/protocol_battery.rs`) runs the
//! same checks against a real agent and a simulated one, so they cannot drift.

pub mod agent;
pub mod faults;
pub mod state;

use std::sync::Arc;

use tokio::sync::watch;

pub use agent::{Latency, SimAgent};

use crate::agent::masters::Masters;
use crate::ids::{InstanceId, NodeId};

/// How to build a fleet.
#[derive(Debug, Clone)]
pub struct FleetConfig {
    /// The masters' agent listeners (several on etcd: the sims find the
    /// leader as real agents do).
    pub masters: Masters,
    pub agents: usize,
    /// Node ids are `<prefix><n>`, n from 1.
    pub prefix: String,
    pub port_range: (u16, u16),
    pub latency: Latency,
    /// A join token good for `agents` enrollments; each agent enrolls at
    /// its start and keeps its certificate in memory.
    pub join_token: String,
}

/// Many simulated agents in this process.
pub struct Fleet {
    pub agents: Vec<Arc<SimAgent>>,
    stop: watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    /// The fleet's own threads ([`Fleet::start_apart`]); dropped last.
    _apart: Option<Apart>,
}

/// A runtime of the fleet's own, shut down without blocking when dropped
/// (a fleet is dropped inside the caller's runtime).
struct Apart(Option<tokio::runtime::Runtime>);

impl Drop for Apart {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

/// The loopback address of simulated agent `i` (0-based): 127.100.x.y, so
/// every agent dials from its own address (ephemeral ports are per address).
pub fn address(i: usize) -> String {
    format!("127.{}.{}.{}", 100 + i / 62_500, (i / 250) % 250, i % 250 + 1)
}

impl Fleet {
    /// Starts the agents on the caller's runtime; each dials the master and
    /// keeps reconnecting.
    pub fn start(cfg: &FleetConfig) -> Fleet {
        Fleet::start_on(cfg, &tokio::runtime::Handle::current())
    }

    /// Starts the agents on `threads` threads of their own, as they would
    /// run on machines of their own: the load driver's API clients then
    /// measure the master, not their place in a queue behind a thousand
    /// agents' work (the two still share the machine's cores). The
    /// threads run `nice` steps below the caller's priority.
    pub fn start_apart(cfg: &FleetConfig, threads: usize, nice: u8) -> std::io::Result<Fleet> {
        // One value for every thread, also those a lowered thread starts.
        let nice = crate::thread_nice::current_lowered(nice)?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads.max(1))
            .thread_name("sim-agents")
            .on_thread_start(move || {
                if let Err(e) = crate::thread_nice::set_current_for_good(nice) {
                    tracing::warn!(error = %e, "a simulated agents' thread keeps the bench's priority");
                }
            })
            .enable_all()
            .build()?;
        let mut fleet = Fleet::start_on(cfg, rt.handle());
        fleet._apart = Some(Apart(Some(rt)));
        Ok(fleet)
    }

    fn start_on(cfg: &FleetConfig, rt: &tokio::runtime::Handle) -> Fleet {
        let (stop, rx) = watch::channel(false);
        let token: Arc<str> = cfg.join_token.as_str().into();
        let mut agents = Vec::with_capacity(cfg.agents);
        let mut tasks = Vec::with_capacity(cfg.agents);
        for i in 0..cfg.agents {
            let node = NodeId::new(format!("{}{}", cfg.prefix, i + 1));
            let agent = SimAgent::new(node, address(i), cfg.port_range, cfg.latency);
            tasks.push(rt.spawn(agent.clone().serve(cfg.masters.clone(), token.clone(), rx.clone())));
            agents.push(agent);
        }
        Fleet { agents, stop, tasks, _apart: None }
    }

    /// How many are connected now.
    pub fn connected(&self) -> usize {
        self.agents.iter().filter(|a| a.connected.load(std::sync::atomic::Ordering::Relaxed)).count()
    }

    /// How many fake processes run, over all agents.
    pub fn running(&self) -> usize {
        self.agents.iter().map(|a| a.running()).sum()
    }

    pub fn agent(&self, node: &str) -> Option<&Arc<SimAgent>> {
        self.agents.iter().find(|a| a.node.as_str() == node)
    }

    /// Crashes `instance` wherever it runs; see [`SimAgent::crash`].
    pub fn crash(&self, instance: &InstanceId, restart: bool) -> bool {
        self.agents.iter().any(|a| a.crash(instance, restart))
    }

    /// Disconnects every agent and waits for their tasks.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        for t in self.tasks {
            let _ = t.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_distinct_loopback_ips() {
        let all: std::collections::HashSet<String> = (0..20_000).map(address).collect();
        assert_eq!(all.len(), 20_000);
        assert!(all.iter().all(|a| a.parse::<std::net::Ipv4Addr>().is_ok_and(|ip| ip.is_loopback())));
    }
}
