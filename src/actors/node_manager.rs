//! `NodeManagerActor`: one per connected agent. It owns the connection's
//! read side, correlates replies with requests by request id, keeps the
//! node's liveness (atomics in the read model, nothing else is touched per
//! frame), and routes the agent's reports of process exits straight to the
//! instance's cluster actor, acknowledging each once it is applied.
//!
//! Requests are sent through a [`NodeLink`] (see `node_link`), so a long
//! install never occupies this actor's mailbox and many instance actors
//! talk to one agent concurrently. The socket's write half belongs to a
//! writer task with a deadline on every write: an agent that stops reading
//! gets its link closed, which stops this actor and fails every waiting
//! request at once.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use actix::prelude::*;
use futures::SinkExt;
use tokio::net::tcp::OwnedWriteHalf;
use tokio::sync::mpsc;
use tokio_util::codec::FramedWrite;

use super::Shared;
use super::cluster::InstanceObserved;
use super::instance::Observation;
use super::node_link::{NodeLink, Outgoing, lock};
use super::read_model::{ActorStats, NodeEntry};
use crate::ids::{InstanceId, NodeId};
use crate::protocol::codec::{MasterCodec, ProtocolError};
use crate::protocol::messages::{AgentEvent, AgentFrame, MasterFrame};

/// Frames waiting for the socket, per link.
const LINK_QUEUE: usize = 64;

/// The actor owning one agent connection's read side.
pub struct NodeManagerActor {
    node: NodeId,
    link: NodeLink,
    entry: Arc<NodeEntry>,
    shared: Shared,
    stats: Arc<ActorStats>,
}

static CONNECTIONS: AtomicU64 = AtomicU64::new(1);

/// An agent's report, to be acknowledged once applied.
pub struct Ack {
    link: NodeLink,
    seq: u64,
}

impl Ack {
    /// Tells the agent the report is applied and durable. If the link's
    /// queue is full the ack is dropped: the agent sends the report again,
    /// and applying it again changes nothing.
    pub fn send(self) {
        if !self.link.try_send(MasterFrame::Ack { seq: self.seq }) {
            tracing::debug!(node = %self.link.node, seq = self.seq, "ack not sent (queue full); the agent will resend");
        }
    }
}

impl NodeManagerActor {
    /// Starts the actor (on one of the master's arbiters) for a connection
    /// whose handshake succeeded and registers its link, replacing (and
    /// closing) a half-open link of the same node. Returns the link.
    pub fn start_for(
        node: NodeId,
        reader: impl futures::Stream<Item = Result<AgentFrame, ProtocolError>> + Send + 'static,
        writer: FramedWrite<OwnedWriteHalf, MasterCodec>,
        entry: Arc<NodeEntry>,
        shared: Shared,
    ) -> NodeLink {
        let connection = CONNECTIONS.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::channel::<Outgoing>(LINK_QUEUE);
        let timing = shared.timing;
        let link = NodeLink::new(
            node.clone(),
            connection,
            tx,
            shared.chunk_budget.clone(),
            timing.agent_reply_timeout,
            timing.agent_send_timeout,
        );
        if let Some(old) = shared.links.replace(link.clone()) {
            tracing::warn!(%node, "the node connected again; closing its previous (half-open) connection");
            old.close();
        }
        actix::spawn(write_frames(writer, rx, link.clone(), timing.agent_send_timeout));
        let stats = ActorStats::new("node_manager", node.as_str(), Some("supervisor".into()));
        shared.read_model.register_actor(&stats);
        entry.live.set_connected(true);
        let arbiter = shared.arbiter_for(connection);
        let l = link.clone();
        NodeManagerActor::start_in_arbiter(&arbiter, move |ctx| {
            ctx.add_stream(reader);
            NodeManagerActor { node, link: l, entry, shared, stats }
        });
        link
    }

    /// Sends an observation to the instance's cluster actor, with the ack
    /// to send once it is applied. An instance the master does not know is
    /// acknowledged at once (there is nothing to apply); a cluster whose
    /// mailbox is full gets nothing, and the agent sends the report again.
    fn route(&self, instance: InstanceId, observation: Observation, ack: Option<Ack>) {
        let cluster = self.entry.instances().get(&instance).cloned();
        let handle = cluster.and_then(|c| self.shared.registry.get(&c));
        let Some(handle) = handle else {
            tracing::debug!(%instance, node = %self.node, "report about an instance the master does not know");
            if let Some(a) = ack {
                a.send();
            }
            return;
        };
        if !handle.stats.try_enqueue(self.shared.limits.cluster_mailbox) {
            tracing::debug!(%instance, "cluster mailbox full; the agent will send the report again");
            return;
        }
        handle.addr.do_send(InstanceObserved { instance, observation, ack });
    }

    fn report(&self, event: AgentEvent, ack: Option<Ack>) {
        match event {
            AgentEvent::Heartbeat => {
                if let Some(a) = ack {
                    a.send();
                }
            }
            AgentEvent::ProcessExited { instance, pid, exit_code, signal, stderr_tail, restart_in_ms } => {
                let description = exit_description(
                    &instance,
                    &self.node,
                    exit_code,
                    signal,
                    &stderr_tail,
                    restart_in_ms.map(Duration::from_millis),
                );
                let observation = Observation::Exited { pid, description, restarting: restart_in_ms.is_some() };
                self.route(instance, observation, ack);
            }
            AgentEvent::ProcessRestarted { instance, pid, error } => {
                let error =
                    error.map(|e| format!("instance {instance} on node {} could not be restarted: {e}", self.node));
                self.route(instance, Observation::Restarted { pid, error }, ack);
            }
        }
    }
}

/// What an operator reads about an unexpected exit.
pub fn exit_description(
    instance: &InstanceId,
    node: &NodeId,
    exit_code: Option<i32>,
    signal: Option<i32>,
    stderr_tail: &str,
    restart_in: Option<Duration>,
) -> String {
    let how = match (exit_code, signal) {
        (Some(c), _) => format!("exit code {c}"),
        (None, Some(s)) => format!("signal {s}"),
        _ => "unknown status".into(),
    };
    let mut description = format!("instance {instance} on node {node} exited unexpectedly ({how})");
    if !stderr_tail.trim().is_empty() {
        description.push_str(&format!("; stderr: {}", stderr_tail.trim()));
    }
    match restart_in {
        Some(d) => description.push_str(&format!("; its agent restarts it in {}", humantime::format_duration(d))),
        None => description.push_str("; its agent's restart policy gave up (or is off)"),
    }
    description
}

/// Owns the socket's write half. A write that takes longer than the send
/// deadline means the agent stopped reading: the link is closed.
async fn write_frames(
    mut writer: FramedWrite<OwnedWriteHalf, MasterCodec>,
    mut rx: mpsc::Receiver<Outgoing>,
    link: NodeLink,
    deadline: Duration,
) {
    loop {
        let (frame, _permit) = tokio::select! {
            f = rx.recv() => match f {
                Some(f) => f,
                None => break,
            },
            _ = link.closed.cancelled() => break,
        };
        match tokio::time::timeout(deadline, writer.send(frame)).await {
            Ok(Ok(())) => {
                // A package chunk leaves a 1 MiB buffer behind: with a
                // thousand links, give it back.
                if writer.write_buffer().capacity() > 64 * 1024 {
                    *writer.write_buffer_mut() = bytes::BytesMut::new();
                }
            }
            Ok(Err(e)) => {
                tracing::warn!(node = %link.node, error = %e, "agent connection write failed");
                break;
            }
            Err(_) => {
                tracing::warn!(node = %link.node, after = ?deadline, "agent is not reading (a write timed out); closing its link");
                break;
            }
        }
    }
    link.close();
}

impl Actor for NodeManagerActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        self.stats.set_state("connected");
        tracing::info!(node = %self.node, "agent connected");
        // A closed link (a stalled write, a newer connection) stops the actor.
        let closed = self.link.closed.clone();
        ctx.spawn(async move { closed.cancelled().await }.into_actor(self).map(|(), _, ctx| ctx.stop()));
    }

    fn stopped(&mut self, _ctx: &mut Context<Self>) {
        // Fail every waiting request at once (their senders drop), instead of
        // letting them run into the reply deadline.
        self.link.close();
        if self.shared.links.remove_if(&self.node, self.link.connection) {
            self.entry.live.set_connected(false);
        }
        self.shared.read_model.unregister_actor(&self.stats);
        tracing::warn!(node = %self.node, "agent disconnected");
    }
}

impl StreamHandler<Result<AgentFrame, ProtocolError>> for NodeManagerActor {
    fn handle(&mut self, item: Result<AgentFrame, ProtocolError>, ctx: &mut Context<Self>) {
        // Counted, not timed: a frame is handled in microseconds, and this
        // runs for every frame of every agent.
        self.stats.handled.fetch_add(1, Ordering::Relaxed);
        self.entry.live.heard();
        match item {
            Ok(AgentFrame::Response { request_id, body }) => {
                let tx = lock(&self.link.pending).get(&request_id).cloned();
                match tx {
                    Some(tx) => {
                        let _ = tx.send(body);
                    }
                    None => tracing::debug!(node = %self.node, request_id, "reply to a request nobody waits for"),
                }
            }
            Ok(AgentFrame::Event(event)) => self.report(event, None),
            Ok(AgentFrame::Report { seq, event }) => {
                let ack = Ack { link: self.link.clone(), seq };
                self.report(event, Some(ack));
            }
            Ok(AgentFrame::Refused { reason }) => {
                tracing::error!(node = %self.node, %reason, "agent refused the connection");
                ctx.stop();
            }
            Ok(AgentFrame::Hello(_)) => {
                tracing::warn!(node = %self.node, "unexpected Hello after the handshake; closing");
                ctx.stop();
            }
            Err(e) => {
                let msg = crate::error::ErrorChain(&e).to_string();
                tracing::warn!(node = %self.node, error = %msg, "bad frame from agent; closing");
                self.stats.end(Some(msg));
                ctx.stop();
            }
        }
    }

    fn finished(&mut self, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}
