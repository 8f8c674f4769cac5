//! `NodeManagerActor`: one per connected agent. It owns the connection's
//! read side, correlates replies with requests by request id, keeps the
//! node's liveness (atomics in the read model, nothing else is touched per
//! frame), and routes the agent's reports of process exits straight to the
//! instance's cluster actor, acknowledging each once it is applied.
//!
//! How the inventory and the reports reach the clusters, in order, even
//! through a cluster actor's restart: `routing`. What each event means:
//! `events`. The socket's writer task: `writer`.
//!
//! Requests are sent through a [`NodeLink`] (see `node_link`), so a long
//! install never occupies this actor's mailbox and many instance actors
//! talk to one agent concurrently. The socket's write half belongs to a
//! writer task with a deadline on every write: an agent that stops reading
//! gets its link closed, which stops this actor and fails every waiting
//! request at once.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use actix::prelude::*;
use tokio::sync::mpsc;
use tokio_util::codec::FramedWrite;

use super::Shared;
use super::node_link::{NodeLink, Outgoing, lock};
use super::read_model::{ActorStats, NodeEntry};
use crate::ids::{InstanceId, NodeId};
use crate::protocol::codec::{MasterCodec, ProtocolError};
use crate::protocol::handshake::LinkWriter;
use crate::protocol::messages::{AgentFrame, InstanceReport};

mod ack;
mod events;
mod routing;
mod writer;

pub use ack::Ack;
pub use events::{Restart, exit_description};
use routing::Held;
pub use routing::inventory_lines;
use writer::write_frames;

/// Frames waiting for the socket, per link.
const LINK_QUEUE: usize = 64;

/// The actor owning one agent connection's read side.
pub struct NodeManagerActor {
    node: NodeId,
    link: NodeLink,
    entry: Arc<NodeEntry>,
    shared: Shared,
    stats: Arc<ActorStats>,
    /// Observations held for room (or for a live cluster actor), in
    /// arrival order.
    held: VecDeque<Held>,
    /// Held reports per instance: a later report of one waits behind them.
    held_of: HashMap<InstanceId, usize>,
    /// Sequence numbers held (a resend of one is not held twice).
    held_seqs: HashSet<u64>,
    /// Instances with a report dropped (no room to hold it), by the
    /// earliest such sequence number: their later reports are dropped too
    /// until the agent sends that one again (it resends in order).
    dropped: HashMap<InstanceId, u64>,
    /// When the held observations are next offered again (`None`: not
    /// scheduled).
    retry_due: Option<tokio::time::Instant>,
    /// Reports routed and not yet acknowledged (see [`Ack`]).
    inflight: Arc<std::sync::Mutex<HashSet<u64>>>,
    /// Instances whose inventory line is delivered and not yet confirmed:
    /// their reports wait behind it.
    awaiting: HashSet<InstanceId>,
    /// Counted in `flotilla_live_tasks{kind="node_manager"}` while it lives.
    _live: crate::actors::live_tasks::LiveTask,
}

static CONNECTIONS: AtomicU64 = AtomicU64::new(1);

impl NodeManagerActor {
    /// Starts the actor (on one of the master's link threads) for a connection
    /// whose handshake succeeded and registers its link, replacing (and
    /// closing) a half-open link of the same node. Returns the link.
    pub fn start_for(
        node: NodeId,
        reader: impl futures::Stream<Item = Result<AgentFrame, ProtocolError>> + Send + 'static,
        writer: FramedWrite<LinkWriter, MasterCodec>,
        entry: Arc<NodeEntry>,
        shared: Shared,
        inventory: Vec<InstanceReport>,
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
        )
        .with_role(shared.role.clone());
        if let Some(old) = shared.links.replace(link.clone()) {
            tracing::warn!(%node, "the node connected again; closing its previous (half-open) connection");
            old.close();
        }
        let stats = ActorStats::new("node_manager", node.as_str(), Some("supervisor".into()));
        entry.manager_started(&stats);
        shared.read_model.register_actor(&stats);
        entry.live.connect(connection);
        let arbiter = shared.link_arbiter_for(connection);
        // The writer (and so the master's heartbeats to this agent) runs on
        // the link's own arbiter, not on the system one with the supervisor
        // (a long job there must not starve every agent of heartbeats), nor
        // on the cluster actors' (requests wait for those).
        let writes = write_frames(writer, rx, link.clone(), timing.agent_send_timeout, timing.heartbeat_interval);
        // One group with the node manager (one_for_all): a writer that
        // panics closes the link, which stops the node manager, and the
        // agent reconnects to a new pair.
        let writes = {
            use futures::FutureExt;
            let (link, stats) = (link.clone(), stats.clone());
            async move {
                let _live = crate::actors::live_tasks::LiveTask::new("link_writer");
                if let Err(payload) = std::panic::AssertUnwindSafe(writes).catch_unwind().await {
                    let reason = super::supervised::panic_message(payload.as_ref());
                    tracing::error!(node = %link.node, %reason, "the link's writer failed; closing its link, the agent reconnects");
                    stats.exited(format!("its link writer panicked: {reason}"), true);
                    link.close();
                }
            }
        };
        if !arbiter.spawn(writes) {
            tracing::error!(%node, "the link's arbiter is gone; the link cannot write");
        }
        // A panic closes the link (its writer ends with it: one_for_all);
        // the agent connects again and a new node manager serves it
        // (`supervision::spec("node_manager")`).
        let on_panic = {
            let (link, stats, shared) = (link.clone(), stats.clone(), shared.clone());
            move || -> super::supervised::OnPanic {
                Box::new(move |reason| {
                    tracing::error!(node = %link.node, %reason, "node manager failed; closing its link, the agent reconnects");
                    // Restarted: the agent reconnects to a new one.
                    stats.exited(format!("panicked: {reason}"), true);
                    shared.read_model.unregister_actor(&stats);
                    link.close();
                })
            }
        };
        let l = link.clone();
        super::supervised::start_in_arbiter(
            &arbiter,
            move |ctx| {
                let mut actor = NodeManagerActor {
                    node,
                    link: l,
                    entry,
                    shared,
                    stats,
                    held: VecDeque::new(),
                    held_of: HashMap::new(),
                    held_seqs: HashSet::new(),
                    dropped: HashMap::new(),
                    retry_due: None,
                    inflight: Arc::default(),
                    awaiting: HashSet::new(),
                    _live: crate::actors::live_tasks::LiveTask::new("node_manager"),
                };
                // The inventory reaches each cluster before any report of this
                // connection (read from here on, and routed behind it): a
                // report made after the inventory was taken is never
                // overridden by it.
                actor.reconcile(&inventory, ctx);
                ctx.add_stream(reader);
                actor
            },
            on_panic,
        );
        link
    }
}

impl Actor for NodeManagerActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        self.stats.set_state("connected");
        tracing::info!(node = %self.node, "agent connected");
        crate::actors::announce::actor(&self.shared, "actor.started", "node_manager", self.node.as_str(), None, None);
        // A closed link (a stalled write, a newer connection) stops the actor.
        let closed = self.link.closed.clone();
        ctx.spawn(async move { closed.cancelled().await }.into_actor(self).map(|(), _, ctx| ctx.stop()));
    }

    fn stopped(&mut self, _ctx: &mut Context<Self>) {
        // How the link ended is noted before anything waiting on it fails,
        // so a command it cut off knows whether to wait for the node
        // (`InstanceActor::reconnected`). Then every waiting request fails
        // at once (their senders drop), instead of running into the reply
        // deadline.
        self.entry.live.disconnect(self.link.connection, self.link.ended_by_agent());
        self.link.close();
        self.shared.links.remove_if(&self.node, self.link.connection);
        self.shared.read_model.unregister_actor(&self.stats);
        tracing::warn!(node = %self.node, "agent disconnected");
        crate::actors::announce::actor(&self.shared, "actor.stopped", "node_manager", self.node.as_str(), None, None);
    }
}

impl StreamHandler<Result<AgentFrame, ProtocolError>> for NodeManagerActor {
    fn handle(&mut self, item: Result<AgentFrame, ProtocolError>, ctx: &mut Context<Self>) {
        // Counted, not timed: a frame is handled in microseconds, and this
        // runs for every frame of every agent.
        self.stats.handled.fetch_add(1, Ordering::Relaxed);
        if self.link.is_closed() {
            // Replaced by a newer connection (or closing): what this one
            // still reads is older than what that one says.
            return;
        }
        self.entry.live.heard();
        if self.link.panic_injected() && self.link.take_injected_panic() {
            panic!("a panic injected by a test hook (node manager of {})", self.node);
        }
        match item {
            Ok(AgentFrame::Response { request_id, body }) => {
                let tx = lock(&self.link.pending).get(&request_id).cloned();
                match tx {
                    Some(tx) => {
                        let _ = tx.unbounded_send(body);
                    }
                    None => tracing::debug!(node = %self.node, request_id, "reply to a request nobody waits for"),
                }
            }
            Ok(AgentFrame::Event(event)) => self.report(event, None, ctx),
            Ok(AgentFrame::Report { seq, event }) => {
                if lock(&self.inflight).contains(&seq) {
                    // Sent again while the first copy is being applied: its
                    // ack is on its way.
                    return;
                }
                let ack = Ack::report(self.link.clone(), seq, self.inflight.clone());
                self.report(event, Some(ack), ctx);
            }
            Ok(AgentFrame::Refused { reason }) => {
                tracing::error!(node = %self.node, %reason, "agent refused the connection");
                self.link.agent_ended();
                ctx.stop();
            }
            Ok(AgentFrame::Hello(_) | AgentFrame::Enroll(_)) => {
                tracing::warn!(node = %self.node, "unexpected Hello or Enroll after the handshake; closing");
                self.link.agent_ended();
                ctx.stop();
            }
            // The agent went away without TLS's goodbye (it exited, or its
            // host did): a disconnect, not a bad frame.
            Err(ProtocolError::Io(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                self.link.agent_ended();
                ctx.stop();
            }
            Err(e) => {
                let msg = crate::error::ErrorChain(&e).to_string();
                tracing::warn!(node = %self.node, error = %msg, "bad frame from agent; closing");
                self.stats.end(Some(msg));
                self.link.agent_ended();
                ctx.stop();
            }
        }
    }

    fn finished(&mut self, ctx: &mut Context<Self>) {
        self.link.agent_ended();
        ctx.stop();
    }
}
