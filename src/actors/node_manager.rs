//! `NodeManagerActor`: one per connected agent. It owns the connection's
//! read side, correlates replies with requests by request id, keeps the
//! node's liveness (atomics in the read model, nothing else is touched per
//! frame), and routes the agent's reports of process exits straight to the
//! instance's cluster actor, acknowledging each once it is applied.
//!
//! A report whose cluster's mailbox is full is held here, in arrival
//! order, and offered again every few milliseconds (not only when the agent
//! sends it again, 3 s later: a burst of a thousand crashes would take
//! minutes to show). The reports of one instance are applied in the order
//! the agent made them: one held (or dropped) keeps every later report of
//! its instance behind it. Without that, a restart report could be applied
//! (a no-op: the exit it follows was not seen yet) and acknowledged before
//! its exit report, which then left the instance `Starting` for good.
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
use std::time::Duration;

use actix::prelude::*;
use futures::SinkExt;
use tokio::sync::mpsc;
use tokio_util::codec::FramedWrite;

use super::Shared;
use super::cluster::InstanceObserved;
use super::instance::Observation;
use super::node_link::{NodeLink, Outgoing, lock};
use super::read_model::{ActorStats, NodeEntry, Reservation};
use crate::ids::{InstanceId, NodeId};
use crate::protocol::codec::{MasterCodec, ProtocolError};
use crate::protocol::handshake::LinkWriter;
use crate::protocol::messages::{AgentEvent, AgentFrame, InstanceReport, MasterFrame};

/// Frames waiting for the socket, per link.
const LINK_QUEUE: usize = 64;

/// Reports one connection holds for clusters whose mailbox is full; past
/// it a report is dropped unacknowledged (the agent sends it again).
const HELD_MAX: usize = 4096;

/// How often held reports are offered to their clusters again.
const RETRY_HELD: Duration = Duration::from_millis(20);

/// A report waiting for room in its cluster's mailbox.
struct Held {
    instance: InstanceId,
    observation: Observation,
    ack: Option<Ack>,
}

/// The actor owning one agent connection's read side.
pub struct NodeManagerActor {
    node: NodeId,
    link: NodeLink,
    entry: Arc<NodeEntry>,
    shared: Shared,
    stats: Arc<ActorStats>,
    /// Reports held for room, in arrival order.
    held: VecDeque<Held>,
    /// Held reports per instance: a later report of one waits behind them.
    held_of: HashMap<InstanceId, usize>,
    /// Sequence numbers held (a resend of one is not held twice).
    held_seqs: HashSet<u64>,
    /// Instances with a report dropped (no room to hold it), by the
    /// earliest such sequence number: their later reports are dropped too
    /// until the agent sends that one again (it resends in order).
    dropped: HashMap<InstanceId, u64>,
    retry_scheduled: bool,
    /// Reports routed and not yet acknowledged (see [`Ack`]).
    inflight: Arc<std::sync::Mutex<HashSet<u64>>>,
}

static CONNECTIONS: AtomicU64 = AtomicU64::new(1);

/// An agent's report, to be acknowledged once applied.
pub struct Ack {
    link: NodeLink,
    seq: u64,
    /// The connection's reports routed and not yet acknowledged: one the
    /// agent sends again meanwhile is not routed twice. Left on drop.
    inflight: Arc<std::sync::Mutex<HashSet<u64>>>,
}

impl Ack {
    fn new(link: NodeLink, seq: u64, inflight: Arc<std::sync::Mutex<HashSet<u64>>>) -> Ack {
        lock(&inflight).insert(seq);
        Ack { link, seq, inflight }
    }

    /// Tells the agent the report is applied and durable. When the link's
    /// queue is full the ack waits for room in a task of its own (at most
    /// the link's send deadline): a lost ack would make the agent send the
    /// report again after later ones of the same instance were applied.
    pub fn send(self) {
        let frame = MasterFrame::Ack { seq: self.seq };
        if !self.link.try_send(frame.clone()) {
            let link = self.link.clone();
            actix::spawn(async move {
                let _ = link.send(frame).await;
            });
        }
    }
}

impl Drop for Ack {
    fn drop(&mut self) {
        lock(&self.inflight).remove(&self.seq);
    }
}

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
        );
        if let Some(old) = shared.links.replace(link.clone()) {
            tracing::warn!(%node, "the node connected again; closing its previous (half-open) connection");
            old.close();
        }
        let stats = ActorStats::new("node_manager", node.as_str(), Some("supervisor".into()));
        shared.read_model.register_actor(&stats);
        entry.live.connect(connection);
        let arbiter = shared.link_arbiter_for(connection);
        // The writer (and so the master's heartbeats to this agent) runs on
        // the link's own arbiter, not on the system one with the supervisor
        // (a long job there must not starve every agent of heartbeats), nor
        // on the cluster actors' (requests wait for those).
        let writes = write_frames(writer, rx, link.clone(), timing.agent_send_timeout, timing.heartbeat_interval);
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
                    stats.exited(format!("panicked: {reason}"), false);
                    shared.read_model.unregister_actor(&stats);
                    link.close();
                })
            }
        };
        let l = link.clone();
        super::supervised::start_in_arbiter(
            &arbiter,
            move |ctx| {
                // The inventory reaches each cluster before any report of this
                // connection (sent from here on, in order, to the same
                // mailboxes): a report made after the inventory was taken is
                // never overridden by it.
                reconcile(&shared, &node, &entry, connection, &inventory);
                ctx.add_stream(reader);
                NodeManagerActor {
                    node,
                    link: l,
                    entry,
                    shared,
                    stats,
                    held: VecDeque::new(),
                    held_of: HashMap::new(),
                    held_seqs: HashSet::new(),
                    dropped: HashMap::new(),
                    retry_scheduled: false,
                    inflight: Arc::default(),
                }
            },
            on_panic,
        );
        link
    }

    /// Sends an observation to the instance's cluster actor, with the ack
    /// to send once it is applied. An instance the master does not know is
    /// acknowledged at once (there is nothing to apply); a cluster whose
    /// mailbox is full gives it back, to hold.
    fn deliver(&self, held: Held) -> Option<Held> {
        let cluster = self.entry.instances().get(&held.instance).cloned();
        let handle = cluster.and_then(|c| self.shared.registry.get(&c));
        let Some(handle) = handle else {
            tracing::debug!(instance = %held.instance, node = %self.node, "report about an instance the master does not know");
            if let Some(a) = held.ack {
                a.send();
            }
            return None;
        };
        let Some(slot) = Reservation::within(&handle.stats, self.shared.limits.cluster_mailbox) else {
            return Some(held);
        };
        handle.addr.do_send(InstanceObserved {
            instance: held.instance,
            observation: held.observation,
            ack: held.ack,
            slot,
        });
        None
    }

    /// Routes a report in order with the other reports of its instance:
    /// delivered now when nothing of its instance waits and its cluster
    /// has room, else held (or, past [`HELD_MAX`], dropped unacknowledged).
    fn route(&mut self, instance: InstanceId, observation: Observation, ack: Option<Ack>, ctx: &mut Context<Self>) {
        let seq = ack.as_ref().map(|a| a.seq);
        if let (Some(s), Some(&first)) = (seq, self.dropped.get(&instance)) {
            if s > first {
                // An earlier report of this instance was dropped: this one
                // comes again after it.
                return;
            }
            if s == first {
                self.dropped.remove(&instance);
            }
        }
        if seq.is_some_and(|s| self.held_seqs.contains(&s)) {
            return;
        }
        let report = Held { instance, observation, ack };
        let report = if self.held_of.contains_key(&report.instance) {
            report
        } else {
            match self.deliver(report) {
                None => return,
                Some(r) => r,
            }
        };
        self.hold(report, ctx);
    }

    fn hold(&mut self, report: Held, ctx: &mut Context<Self>) {
        let seq = report.ack.as_ref().map(|a| a.seq);
        if self.held.len() >= HELD_MAX {
            tracing::debug!(instance = %report.instance, "cluster mailbox full and too many reports held; the agent will send it again");
            if let Some(s) = seq {
                self.dropped.entry(report.instance).or_insert(s);
            }
            return;
        }
        if let Some(s) = seq {
            self.held_seqs.insert(s);
        }
        *self.held_of.entry(report.instance.clone()).or_default() += 1;
        self.held.push_back(report);
        if !self.retry_scheduled {
            self.retry_scheduled = true;
            ctx.run_later(RETRY_HELD, |act, ctx| act.retry_held(ctx));
        }
    }

    /// Offers every held report to its cluster again, in order; one that
    /// still finds no room keeps its instance's later reports held.
    fn retry_held(&mut self, ctx: &mut Context<Self>) {
        self.retry_scheduled = false;
        let mut stuck: HashSet<InstanceId> = HashSet::new();
        for _ in 0..self.held.len() {
            let Some(report) = self.held.pop_front() else { break };
            if stuck.contains(&report.instance) {
                self.held.push_back(report);
                continue;
            }
            let instance = report.instance.clone();
            let seq = report.ack.as_ref().map(|a| a.seq);
            match self.deliver(report) {
                None => {
                    if let Some(s) = seq {
                        self.held_seqs.remove(&s);
                    }
                    if let Some(n) = self.held_of.get_mut(&instance) {
                        *n -= 1;
                        if *n == 0 {
                            self.held_of.remove(&instance);
                        }
                    }
                }
                Some(report) => {
                    stuck.insert(instance);
                    self.held.push_back(report);
                }
            }
        }
        if !self.held.is_empty() {
            self.retry_scheduled = true;
            ctx.run_later(RETRY_HELD, |act, ctx| act.retry_held(ctx));
        }
    }

    fn report(&mut self, event: AgentEvent, ack: Option<Ack>, ctx: &mut Context<Self>) {
        match event {
            AgentEvent::Heartbeat => {
                if let Some(a) = ack {
                    a.send();
                }
            }
            AgentEvent::ProcessExited {
                instance,
                pid,
                exit_code,
                signal,
                stderr_tail,
                restart_in_ms,
                attempt,
                max_attempts,
            } => {
                let restart =
                    restart_in_ms.map(|ms| Restart { delay: Duration::from_millis(ms), attempt, max_attempts });
                let description = exit_description(&instance, &self.node, exit_code, signal, &stderr_tail, restart);
                let observation = Observation::Exited { pid, description, restarting: restart_in_ms.is_some() };
                self.route(instance, observation, ack, ctx);
            }
            AgentEvent::ProcessRestarted { instance, pid, error } => {
                let error =
                    error.map(|e| format!("instance {instance} on node {} could not be restarted: {e}", self.node));
                self.route(instance, Observation::Restarted { pid, error }, ack, ctx);
            }
            AgentEvent::ProcessSpawned { instance, generation, pid } => {
                self.route(instance, Observation::Spawned { generation, pid }, ack, ctx);
            }
        }
    }
}

/// Reconciles what the master believes of a node with what its agent holds
/// (its `Hello`'s inventory, on connection `connection`): a running process
/// updates its instance; a missing or dead one marks it `Lost` or `Failed`
/// (and its `Active` cluster `Error`). Not bounded by the mailboxes: one
/// message per instance of a node that just connected, and they must all
/// arrive. (What the agent holds that the master does not know is the
/// supervisor's: `NodeInventory`.)
pub fn reconcile(shared: &Shared, node: &NodeId, entry: &NodeEntry, connection: u64, inventory: &[InstanceReport]) {
    let ours = entry.instances();
    let reports: HashMap<&InstanceId, &InstanceReport> = inventory.iter().map(|r| (&r.instance, r)).collect();
    tracing::debug!(%node, connection, instances = ours.len(), held = reports.len(), "reconciling an inventory");
    for (id, cluster) in ours.iter() {
        let report = reports.get(id);
        let observation = Observation::Inventory {
            present: report.is_some(),
            running: report.is_some_and(|r| r.running),
            pid: report.and_then(|r| r.pid),
            generation: report.map(|r| r.generation),
            connection: Some(connection),
        };
        if let Some(h) = shared.registry.get(cluster) {
            let slot = Reservation::counted(&h.stats);
            h.addr.do_send(InstanceObserved { instance: id.clone(), observation, ack: None, slot });
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
    restart: Option<Restart>,
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
    match restart {
        Some(Restart { delay, attempt, max_attempts }) => description.push_str(&format!(
            "; its agent restarts it in {} (restart {attempt} of at most {max_attempts})",
            humantime::format_duration(delay)
        )),
        None => description.push_str("; its agent's restart policy gave up (or is off)"),
    }
    description
}

/// A restart the agent's policy announced with an exit.
#[derive(Debug, Clone, Copy)]
pub struct Restart {
    pub delay: Duration,
    /// Which restart in the policy's window, and the most it allows there.
    pub attempt: u32,
    pub max_attempts: u32,
}

/// Owns the socket's write half. A write that takes longer than the send
/// deadline means the agent stopped reading: the link is closed.
async fn write_frames(
    mut writer: FramedWrite<LinkWriter, MasterCodec>,
    mut rx: mpsc::Receiver<Outgoing>,
    link: NodeLink,
    deadline: Duration,
    beat: Duration,
) {
    let mut permits = Vec::new();
    // The agent takes a link it hears nothing on for dead: a heartbeat
    // goes out whenever nothing else did for a beat.
    let mut tick = tokio::time::interval(beat);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_write = tokio::time::Instant::now();
    loop {
        let (frame, permit) = tokio::select! {
            f = rx.recv() => match f {
                Some(f) => f,
                None => break,
            },
            _ = link.closed.cancelled() => break,
            _ = tick.tick() => {
                if last_write.elapsed() < beat {
                    continue;
                }
                (MasterFrame::Heartbeat, None)
            }
        };
        last_write = tokio::time::Instant::now();
        permits.extend(permit);
        // Every frame already queued goes out in the same write: under load
        // one syscall carries many commands, not one each.
        let mut batch = vec![frame];
        while batch.len() < 64 {
            match rx.try_recv() {
                Ok((f, p)) => {
                    permits.extend(p);
                    batch.push(f);
                }
                Err(_) => break,
            }
        }
        let write = async {
            for f in batch {
                writer.feed(f).await?;
            }
            writer.flush().await
        };
        let written = tokio::time::timeout(deadline, write).await;
        // The chunks are in the socket (or the link is going): their
        // budget goes back.
        permits.clear();
        match written {
            Ok(Ok(())) => {
                // A package chunk leaves a 1 MiB buffer behind: with a
                // thousand links, give it back.
                if writer.write_buffer().capacity() > 64 * 1024 {
                    *writer.write_buffer_mut() = bytes::BytesMut::new();
                }
            }
            Ok(Err(e)) => {
                tracing::warn!(node = %link.node, error = %e, "agent connection write failed");
                link.agent_ended();
                break;
            }
            Err(_) => {
                tracing::warn!(node = %link.node, after = ?deadline, "agent is not reading (a write timed out); closing its link");
                link.close_stalled();
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
        self.entry.live.heard();
        if self.link.panic_injected() && self.link.take_injected_panic() {
            panic!("a panic injected by a test hook (node manager of {})", self.node);
        }
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
            Ok(AgentFrame::Event(event)) => self.report(event, None, ctx),
            Ok(AgentFrame::Report { seq, event }) => {
                if lock(&self.inflight).contains(&seq) {
                    // Sent again while the first copy is being applied: its
                    // ack is on its way.
                    return;
                }
                let ack = Ack::new(self.link.clone(), seq, self.inflight.clone());
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
