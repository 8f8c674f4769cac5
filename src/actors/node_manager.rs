//! `NodeManagerActor`: one per connected agent. It owns the connection's
//! read side, correlates replies with requests by request id, records
//! heartbeats, and forwards process exits to the supervisor.
//!
//! Requests are sent through a [`NodeLink`], a cheap cloneable handle that
//! writes frames to the connection's writer task and waits for the reply
//! itself. So a long install never occupies the actor's mailbox, and many
//! instance actors talk to one agent concurrently. Every wait for a reply
//! has a deadline (the master's `agent_reply_timeout`): that deadline is
//! what turns a silent agent into a failed step.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::prelude::*;
use futures::SinkExt;
use time::OffsetDateTime;
use tokio::io::AsyncReadExt;
use tokio::net::tcp::OwnedWriteHalf;
use tokio::sync::mpsc;
use tokio_util::codec::FramedWrite;

use super::read_model::{ActorStats, ReadModel};
use super::supervisor::{InstanceExited, InstanceRestarted, Supervisor};
use crate::ids::{InstanceId, NodeId};
use crate::protocol::codec::{MasterCodec, ProtocolError};
use crate::protocol::messages::{
    AgentEvent, AgentFrame, AgentRequest, AgentResponse, CommandFailure, INSTALL_CHUNK_BYTES, InstallBegin, MasterFrame,
};

/// Why a command to an agent did not get a good answer.
#[derive(Debug, Clone, thiserror::Error)]
pub enum NodeError {
    #[error("node {0} is not connected")]
    Disconnected(NodeId),
    #[error("node {node} did not answer {what} within {after:?}")]
    Timeout { node: NodeId, what: &'static str, after: Duration },
    #[error("{}", .0.message)]
    Failed(CommandFailure),
    #[error("unexpected answer from node {node}: {detail}")]
    Unexpected { node: NodeId, detail: String },
    #[error("cannot read package for node {node}: {detail}")]
    Package { node: NodeId, detail: String },
}

type Pending = Arc<Mutex<HashMap<u64, mpsc::UnboundedSender<AgentResponse>>>>;

/// The registry of live links, by node. A reconnecting agent replaces its
/// old link; the old actor removes its entry only if it is still its own.
pub type NodeLinks = Arc<Mutex<HashMap<NodeId, NodeLink>>>;

/// A handle for sending requests to one connected agent.
#[derive(Clone)]
pub struct NodeLink {
    pub node: NodeId,
    /// Distinguishes this connection from a later one of the same node.
    pub connection: u64,
    tx: mpsc::Sender<MasterFrame>,
    pending: Pending,
    next_id: Arc<AtomicU64>,
    reply_timeout: Duration,
}

/// Removes a pending entry when the caller stops waiting, whatever the reason.
struct PendingGuard<'a>(&'a Pending, u64);

impl Drop for PendingGuard<'_> {
    fn drop(&mut self) {
        lock(self.0).remove(&self.1);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl NodeLink {
    fn register(&self) -> (u64, mpsc::UnboundedReceiver<AgentResponse>) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::unbounded_channel();
        lock(&self.pending).insert(id, tx);
        (id, rx)
    }

    async fn send(&self, frame: MasterFrame) -> Result<(), NodeError> {
        self.tx.send(frame).await.map_err(|_| NodeError::Disconnected(self.node.clone()))
    }

    async fn reply(
        &self,
        rx: &mut mpsc::UnboundedReceiver<AgentResponse>,
        what: &'static str,
    ) -> Result<AgentResponse, NodeError> {
        self.reply_within(rx, what, self.reply_timeout).await
    }

    async fn reply_within(
        &self,
        rx: &mut mpsc::UnboundedReceiver<AgentResponse>,
        what: &'static str,
        after: Duration,
    ) -> Result<AgentResponse, NodeError> {
        match tokio::time::timeout(after, rx.recv()).await {
            Ok(Some(AgentResponse::Failed(f))) => Err(NodeError::Failed(f)),
            Ok(Some(r)) => Ok(r),
            Ok(None) => Err(NodeError::Disconnected(self.node.clone())),
            Err(_) => Err(NodeError::Timeout { node: self.node.clone(), what, after }),
        }
    }

    /// Sends one request and waits for its reply (bounded by the reply deadline).
    pub async fn call(&self, body: AgentRequest, what: &'static str) -> Result<AgentResponse, NodeError> {
        let (request_id, mut rx) = self.register();
        let _guard = PendingGuard(&self.pending, request_id);
        self.send(MasterFrame::Request { request_id, body }).await?;
        self.reply(&mut rx, what).await
    }

    /// Like [`call`](Self::call) for a command that may legitimately take
    /// `work` on the agent (a hook, a health-gated start): the deadline is
    /// the agent's own limit plus the usual reply deadline.
    pub async fn call_within(
        &self,
        body: AgentRequest,
        what: &'static str,
        work: Duration,
    ) -> Result<AgentResponse, NodeError> {
        let (request_id, mut rx) = self.register();
        let _guard = PendingGuard(&self.pending, request_id);
        self.send(MasterFrame::Request { request_id, body }).await?;
        self.reply_within(&mut rx, what, self.reply_timeout + work).await
    }

    /// Installs a package: `InstallBegin`, then (unless the agent holds the
    /// package already) the tarball in chunks read from `blob`, `InstallEnd`,
    /// and the agent's `InstallResult`. Chunks are read and sent one at a
    /// time, so memory stays at one chunk whatever the package size, and the
    /// bounded frame channel applies TCP backpressure to the reader.
    pub async fn install(&self, begin: InstallBegin, blob: PathBuf) -> Result<AgentResponse, NodeError> {
        let instance = begin.instance.clone();
        let (request_id, mut rx) = self.register();
        let _guard = PendingGuard(&self.pending, request_id);
        self.send(MasterFrame::Request { request_id, body: AgentRequest::InstallBegin(Box::new(begin)) }).await?;
        match self.reply(&mut rx, "InstallBegin").await? {
            AgentResponse::InstallReady { need_bytes: false } => {}
            AgentResponse::InstallReady { need_bytes: true } => {
                self.stream_package(request_id, &instance, &blob).await?;
            }
            other => {
                return Err(NodeError::Unexpected {
                    node: self.node.clone(),
                    detail: format!("{other:?} to InstallBegin"),
                });
            }
        }
        self.reply(&mut rx, "InstallEnd").await
    }

    async fn stream_package(&self, request_id: u64, instance: &InstanceId, blob: &PathBuf) -> Result<(), NodeError> {
        let pkg_err = |e: std::io::Error| NodeError::Package {
            node: self.node.clone(),
            detail: format!("{}: {e}", blob.display()),
        };
        let mut file = tokio::fs::File::open(blob).await.map_err(pkg_err)?;
        let mut seq = 0u32;
        loop {
            let mut buf = vec![0u8; INSTALL_CHUNK_BYTES];
            let mut filled = 0;
            while filled < buf.len() {
                let n = file.read(&mut buf[filled..]).await.map_err(pkg_err)?;
                if n == 0 {
                    break;
                }
                filled += n;
            }
            if filled == 0 {
                break;
            }
            buf.truncate(filled);
            let body = AgentRequest::InstallData { instance: instance.clone(), seq, bytes: buf };
            self.send(MasterFrame::Request { request_id, body }).await?;
            seq += 1;
        }
        let body = AgentRequest::InstallEnd { instance: instance.clone() };
        self.send(MasterFrame::Request { request_id, body }).await
    }
}

/// The actor owning one agent connection's read side.
pub struct NodeManagerActor {
    node: NodeId,
    connection: u64,
    pending: Pending,
    links: NodeLinks,
    read_model: Arc<ReadModel>,
    supervisor: Addr<Supervisor>,
    stats: Arc<ActorStats>,
}

static CONNECTIONS: AtomicU64 = AtomicU64::new(1);

impl NodeManagerActor {
    /// Starts the actor for a connection whose handshake succeeded, and
    /// registers its link. Returns the link.
    pub fn start_for(
        node: NodeId,
        reader: impl futures::Stream<Item = Result<AgentFrame, ProtocolError>> + 'static,
        writer: FramedWrite<OwnedWriteHalf, MasterCodec>,
        reply_timeout: Duration,
        links: NodeLinks,
        read_model: Arc<ReadModel>,
        supervisor: Addr<Supervisor>,
    ) -> NodeLink {
        let connection = CONNECTIONS.fetch_add(1, Ordering::Relaxed);
        // The writer task owns the socket's write half. A bounded queue: a
        // slow agent slows its senders instead of growing memory.
        let (tx, rx) = mpsc::channel::<MasterFrame>(64);
        actix::spawn(write_frames(writer, rx));
        let pending: Pending = Arc::default();
        let link = NodeLink {
            node: node.clone(),
            connection,
            tx,
            pending: pending.clone(),
            next_id: Arc::new(AtomicU64::new(1)),
            reply_timeout,
        };
        lock(&links).insert(node.clone(), link.clone());
        let stats = ActorStats::new("node_manager", node.as_str(), Some("supervisor".into()));
        read_model.register_actor(&stats);
        NodeManagerActor::create(move |ctx| {
            ctx.add_stream(reader);
            NodeManagerActor { node, connection, pending, links, read_model, supervisor, stats }
        });
        link
    }

    fn touch(&self) {
        if let Some(n) = self.read_model.write().nodes.get_mut(&self.node) {
            n.last_heartbeat = Some(OffsetDateTime::now_utc());
            n.connected = true;
        }
    }
}

async fn write_frames(mut writer: FramedWrite<OwnedWriteHalf, MasterCodec>, mut rx: mpsc::Receiver<MasterFrame>) {
    while let Some(frame) = rx.recv().await {
        if let Err(e) = writer.send(frame).await {
            tracing::warn!(error = %e, "agent connection write failed");
            break;
        }
    }
}

impl Actor for NodeManagerActor {
    type Context = Context<Self>;

    fn started(&mut self, _ctx: &mut Context<Self>) {
        self.stats.set_state("connected");
        self.touch();
        tracing::info!(node = %self.node, "agent connected");
    }

    fn stopped(&mut self, _ctx: &mut Context<Self>) {
        // Fail every waiting request at once (their senders drop), instead of
        // letting them run into the reply deadline.
        lock(&self.pending).clear();
        let mut links = lock(&self.links);
        if links.get(&self.node).is_some_and(|l| l.connection == self.connection) {
            links.remove(&self.node);
            drop(links);
            if let Some(n) = self.read_model.write().nodes.get_mut(&self.node) {
                n.connected = false;
            }
        }
        self.read_model.unregister_actor(&self.stats);
        tracing::warn!(node = %self.node, "agent disconnected");
    }
}

impl StreamHandler<Result<AgentFrame, ProtocolError>> for NodeManagerActor {
    fn handle(&mut self, item: Result<AgentFrame, ProtocolError>, ctx: &mut Context<Self>) {
        self.stats.enqueue();
        self.stats.begin("frame");
        match item {
            Ok(AgentFrame::Response { request_id, body }) => {
                self.touch();
                let tx = lock(&self.pending).get(&request_id).cloned();
                match tx {
                    Some(tx) => {
                        let _ = tx.send(body);
                    }
                    None => tracing::debug!(node = %self.node, request_id, "reply to a request nobody waits for"),
                }
            }
            Ok(AgentFrame::Event(AgentEvent::Heartbeat)) => self.touch(),
            Ok(AgentFrame::Event(AgentEvent::ProcessExited {
                instance,
                pid,
                exit_code,
                signal,
                stderr_tail,
                restart_in_ms,
            })) => {
                self.touch();
                self.supervisor.do_send(InstanceExited {
                    node: self.node.clone(),
                    instance,
                    pid,
                    exit_code,
                    signal,
                    stderr_tail,
                    restart_in: restart_in_ms.map(Duration::from_millis),
                });
            }
            Ok(AgentFrame::Event(AgentEvent::ProcessRestarted { instance, pid, error })) => {
                self.touch();
                self.supervisor.do_send(InstanceRestarted { node: self.node.clone(), instance, pid, error });
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
                return;
            }
        }
        self.stats.end(None);
    }

    fn finished(&mut self, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}
