//! Sending one command to the instance's agent over its node's link, and
//! waiting for the node to come back when its link was cut under it.

use std::time::{Duration, Instant};

use super::*;
use crate::actors::node_link::NodeLink;

/// How long a command cut off by its link's end waits for the node to
/// connect again before it fails: a killed node manager's agent dials
/// again within a second or two.
pub(super) const RESEND_WAIT: Duration = Duration::from_secs(10);

/// A node silent longer than this is away, not reconnecting: nothing waits.
const RECENTLY_HEARD: Duration = Duration::from_secs(5);

/// The agent's answer to a command, with what it will have applied.
pub(super) struct Sent {
    pub reply: Result<AgentResponse, NodeError>,
    pub applied: Option<Arc<Applied>>,
    pub rule: Option<ChangeRule>,
}

impl Sent {
    pub fn not_connected(node: &NodeId) -> Sent {
        Sent { reply: Err(NodeError::Disconnected(node.clone())), applied: None, rule: None }
    }
}

impl InstanceActor {
    /// Sends `cmd` on `link` and waits for its answer (each kind of
    /// command with its own deadline: see `NodeLink`).
    pub(super) async fn send(&self, link: &NodeLink, cmd: InstanceCmd, generation: u64, changes_state: bool) -> Sent {
        let instance = self.id();
        if changes_state && let Some(entry) = self.env.shared.read_model.node(&link.node) {
            entry.commanded(&instance, link.connection);
        }
        let (mut applied, mut rule) = (None, None);
        let reply = match cmd {
            InstanceCmd::Install(p) => {
                applied = Some(p.applied.clone());
                let begin = InstallBegin {
                    instance,
                    cluster: self.record.borrow().cluster_id,
                    generation,
                    run_as: p.run_as,
                    process: p.process,
                    files: p.files,
                    package_sha256: p.package_sha256,
                    package_size: p.package_size,
                };
                link.install(begin, p.blob, &self.env.progress).await
            }
            InstanceCmd::Start { wait, settle, window, .. } => {
                let settle_ms = settle.as_millis() as u64;
                let req = AgentRequest::Start { instance, generation, settle_ms };
                let call = link.call_within(req, "Start", wait);
                if settle.is_zero() { call.await } else { self.settling(call, generation, &window).await }
            }
            InstanceCmd::Stop => link.call(AgentRequest::Stop { instance, generation }, "Stop").await,
            InstanceCmd::WriteFiles { files, env, rule: r } => {
                rule = Some(r);
                let req = AgentRequest::WriteFiles { instance, generation, files, env: Some(env) };
                link.call(req, "WriteFiles").await
            }
            InstanceCmd::Delete => link.call(AgentRequest::Delete { instance, generation }, "Delete").await,
            InstanceCmd::RunHook { hook, argv, timeout } => {
                let timeout_ms = timeout.as_millis() as u64;
                let req = AgentRequest::RunHook { instance, generation, hook: hook.into(), argv, timeout_ms };
                link.call_within(req, "RunHook", timeout).await
            }
            InstanceCmd::CheckHealth { timeout } => {
                let req = AgentRequest::CheckHealth { instance, timeout_ms: timeout.as_millis() as u64 };
                link.call_within(req, "CheckHealth", timeout).await
            }
            InstanceCmd::Signal { signal } => {
                link.call(AgentRequest::Signal { instance, generation, signal }, "Signal").await
            }
        };
        Sent { reply, applied, rule }
    }

    /// The node's link once it connects again after `cut` (the link that
    /// cut the command off; `None`: it had none), within [`RESEND_WAIT`];
    /// `None` at once when the agent ended that link (it went away: a
    /// crash, a stall, a shutdown; or the node was revoked), for a node not
    /// heard from lately, or when the wait ends. Only a link this master
    /// ended (its node manager killed) is waited for. Judged on the cut
    /// link itself, set before it closed: the node's own record of its last
    /// link may already be the next connection's.
    pub(super) async fn reconnected(&self, node: &NodeId, cut: Option<&NodeLink>) -> Option<NodeLink> {
        let shared = &self.env.shared;
        let entry = shared.read_model.node(node)?;
        let agent_ended = || match cut {
            Some(link) => link.ended_by_agent(),
            None => entry.live.agent_ended(),
        };
        let heard = entry.live.silence(Instant::now());
        if agent_ended() || heard.is_none_or(|silent| silent > RECENTLY_HEARD) {
            return None;
        }
        let cut_from = cut.map(|l| l.connection).unwrap_or(0);
        let deadline = tokio::time::Instant::now() + RESEND_WAIT;
        loop {
            if let Some(link) = shared.links.get(node)
                && link.connection != cut_from
                && !link.is_closed()
            {
                return Some(link);
            }
            if agent_ended() || tokio::time::Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}
