//! [`NodeLink`]: a cheap, cloneable handle for sending requests to one
//! connected agent and waiting for the replies, and [`NodeLinks`], the
//! registry of live links by node.
//!
//! Every wait has a deadline, so a silent or stuck agent turns into a
//! failed command instead of a wedged instance actor:
//!
//! - putting a frame on the link's bounded queue waits at most
//!   `send_timeout`; the socket write of each frame too. Past it the agent
//!   is not reading: the link is **closed** (its connection token is
//!   cancelled), every request waiting on it fails at once, and the agent
//!   reconnects when it can;
//! - a reply waits at most `reply_timeout` (plus the work the request may
//!   legitimately take on the agent: a start's health wait, a hook's
//!   timeout);
//! - an install has no fixed deadline: it lasts as long as the agent keeps
//!   taking bytes in. At most [`INSTALL_WINDOW_CHUNKS`] chunks go ahead of
//!   the agent's `InstallReceived` receipts, each awaited at most
//!   `reply_timeout`, and the result is awaited `reply_timeout` from the
//!   last receipt. Each chunk sent and each receipt is progress for the
//!   step's watchdog. An install given up before its end (a failure, a
//!   deadline, a dropped step) is aborted on the agent (`InstallAbort`).
//!
//! Package chunks (1 MiB each) hold a permit of a budget shared by every
//! link until the socket took them, so a thousand agents installing at once
//! cost the budget in memory, not a thousand queues of chunks.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::io::AsyncReadExt;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::ids::{InstanceId, NodeId};
use crate::protocol::messages::{
    AgentRequest, AgentResponse, CommandFailure, INSTALL_CHUNK_BYTES, INSTALL_WINDOW_CHUNKS, InstallBegin, MasterFrame,
};

/// Why a command to an agent did not get a good answer.
#[derive(Debug, Clone, thiserror::Error)]
pub enum NodeError {
    #[error("node {0} is not connected")]
    Disconnected(NodeId),
    #[error("node {node} did not answer {what} within {after:?}")]
    Timeout { node: NodeId, what: &'static str, after: Duration },
    #[error("node {node} stopped reading its connection (nothing could be sent for {after:?}); the link was closed")]
    Stalled { node: NodeId, after: Duration },
    #[error("{}", .0.message)]
    Failed(CommandFailure),
    #[error("unexpected answer from node {node}: {detail}")]
    Unexpected { node: NodeId, detail: String },
    #[error("cannot read package for node {node}: {detail}")]
    Package { node: NodeId, detail: String },
    #[error(
        "no command sent to node {node}: this master's leadership (term {term}) is suspended, its lease could not be renewed"
    )]
    Suspended { node: NodeId, term: i64 },
}

pub(super) type Pending = Arc<Mutex<HashMap<u64, ReplyTx>>>;

/// Where a request's replies go. Not tokio's unbounded channel: that
/// allocates a block of 32 replies (~3 KiB) per channel up front, and the
/// leader holds one per command in flight (100,000 while a restart of
/// 100 clusters of 1,000 settles: a tenth of its memory peak on etcd).
pub(super) type ReplyTx = futures::channel::mpsc::UnboundedSender<AgentResponse>;
type Replies = futures::channel::mpsc::UnboundedReceiver<AgentResponse>;

/// A frame on its way to the socket, with the chunk-budget permit it holds
/// until it is written.
pub(super) type Outgoing = (MasterFrame, Option<ChunkPermit>);

/// Budget permits granted so far (every master in the process): whether
/// the shared budget moves, for [`NodeLink::chunk_permit`]'s watchdog rule.
static CHUNKS_GRANTED: AtomicU64 = AtomicU64::new(0);

/// Package chunks queued for sockets at once, over all links (MiB).
pub const CHUNK_BUDGET: usize = 64;

/// Package chunks queued for one link's socket at once: a slow agent can
/// hold this much of the budget, never all of it.
pub const LINK_CHUNKS: usize = 4;

/// Requests in flight on one link at once, below what an agent takes
/// (`agent::connection::MAX_REQUESTS_IN_FLIGHT`): an agent whose requests
/// are all busy (long starts, hooks) stops reading its socket, and the
/// master would take that for a stall and close the link. Past this,
/// commands wait on the master for their turn.
pub const LINK_REQUESTS: usize = 512;

/// A chunk's place in its link's share and in the budget, given back when
/// the socket took it.
pub struct ChunkPermit {
    _link: tokio::sync::OwnedSemaphorePermit,
    _budget: tokio::sync::OwnedSemaphorePermit,
}

/// The live links, by node. Read on every command without a lock; written
/// when an agent connects or goes.
#[derive(Clone, Default)]
pub struct NodeLinks(Arc<ArcSwap<imbl::HashMap<NodeId, NodeLink>>>);

impl NodeLinks {
    pub fn get(&self, node: &NodeId) -> Option<NodeLink> {
        self.0.load().get(node).cloned()
    }

    /// How many agents are connected.
    pub fn len(&self) -> usize {
        self.0.load().len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.load().is_empty()
    }

    /// Registers `link`, returning the one it replaces (a half-open
    /// connection of the same node, which the caller closes).
    pub fn replace(&self, link: NodeLink) -> Option<NodeLink> {
        let mut old = None;
        self.0.rcu(|cur| {
            let mut next = imbl::HashMap::clone(cur);
            old = next.insert(link.node.clone(), link.clone());
            next
        });
        old
    }

    /// Closes every link (a leadership suspended: the agents dial again,
    /// and reach whichever master leads); how many.
    pub fn close_all(&self) -> usize {
        let links = self.0.load();
        for link in links.values() {
            link.close();
        }
        links.len()
    }

    /// Removes the link of `node` if it is still connection `connection`.
    pub fn remove_if(&self, node: &NodeId, connection: u64) -> bool {
        let mut removed = false;
        self.0.rcu(|cur| {
            let mut next = imbl::HashMap::clone(cur);
            removed = next.get(node).is_some_and(|l| l.connection == connection);
            if removed {
                next.remove(node);
            }
            next
        });
        removed
    }
}

/// A handle for sending requests to one connected agent.
#[derive(Clone)]
pub struct NodeLink {
    pub node: NodeId,
    /// Distinguishes this connection from a later one of the same node.
    pub connection: u64,
    pub(super) tx: mpsc::Sender<Outgoing>,
    /// Shared by every link: see [`CHUNK_BUDGET`].
    chunks: Arc<tokio::sync::Semaphore>,
    /// This link's share of it: see [`LINK_CHUNKS`].
    link_chunks: Arc<tokio::sync::Semaphore>,
    /// Requests in flight on this link: see [`LINK_REQUESTS`].
    requests: Arc<tokio::sync::Semaphore>,
    pub(super) pending: Pending,
    next_id: Arc<AtomicU64>,
    reply_timeout: Duration,
    send_timeout: Duration,
    /// Cancelled when the link is closed (by either side, or a stall).
    pub(super) closed: CancellationToken,
    /// Set when the link was closed because the agent stopped reading, so
    /// every request the close fails says so (and names the node) instead
    /// of a bare "not connected", which hid why an install failed.
    stalled: Arc<AtomicBool>,
    /// Set when the agent's side ended the link (it hung up, stalled or
    /// broke the protocol), or the node cannot come back (its certificate
    /// was revoked): what the link cut off is not sent again on a later
    /// connection (see `NodeLive::agent_ended`). Set before the close.
    agent_ended: Arc<AtomicBool>,
    /// Test hooks: the node manager ([`MANAGER_PANIC`]) or the link
    /// writer ([`WRITER_PANIC`]) panics at its next frame.
    panic_injected: Arc<AtomicU8>,
    /// The master's role: its term rides on every request, and no request
    /// leaves while its leadership is suspended.
    role: Arc<super::role::Role>,
}

/// How long a request waits for a suspended leadership to be renewed
/// before it fails (a lost one ends the master meanwhile).
pub(crate) const SUSPENDED_WAIT: Duration = Duration::from_secs(10);

const MANAGER_PANIC: u8 = 1;
const WRITER_PANIC: u8 = 2;

/// Removes a pending entry when the caller stops waiting, whatever the reason.
struct PendingGuard<'a>(&'a Pending, u64);

impl Drop for PendingGuard<'_> {
    fn drop(&mut self) {
        lock(self.0).remove(&self.1);
    }
}

/// An install whose bytes are streaming: unless its `InstallEnd` went out,
/// dropping it (a failure, a deadline, a cancelled step) tells the agent
/// to drop the install (`InstallAbort`), so it does not hold the extraction
/// and a request slot until the link ends. Sent by a task of its own
/// behind the chunks already queued, within the link's send deadline; if
/// even that fails, the link is closed and the agent drops every install
/// with it.
struct StreamGuard {
    link: NodeLink,
    request_id: u64,
    instance: InstanceId,
    ended: bool,
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        if self.ended || self.link.is_closed() {
            return;
        }
        let body = AgentRequest::InstallAbort { instance: self.instance.clone() };
        let frame = self.link.request(self.request_id, body);
        let link = self.link.clone();
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move { link.send(frame).await });
        }
    }
}

pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl NodeLink {
    pub(super) fn new(
        node: NodeId,
        connection: u64,
        tx: mpsc::Sender<Outgoing>,
        chunks: Arc<tokio::sync::Semaphore>,
        reply_timeout: Duration,
        send_timeout: Duration,
    ) -> NodeLink {
        NodeLink {
            node,
            connection,
            tx,
            chunks,
            link_chunks: Arc::new(tokio::sync::Semaphore::new(LINK_CHUNKS)),
            requests: Arc::new(tokio::sync::Semaphore::new(LINK_REQUESTS)),
            pending: Pending::default(),
            next_id: Arc::new(AtomicU64::new(1)),
            reply_timeout,
            send_timeout,
            closed: CancellationToken::new(),
            stalled: Arc::default(),
            agent_ended: Arc::default(),
            panic_injected: Arc::default(),
            role: Arc::new(super::role::Role::single(String::new(), String::new())),
        }
    }

    /// The link of a master in `role` (its term, its leadership).
    pub(super) fn with_role(mut self, role: Arc<super::role::Role>) -> NodeLink {
        self.role = role;
        self
    }

    /// Whether this master may send requests now (its leadership holds).
    pub fn may_act(&self) -> bool {
        self.role.may_act()
    }

    /// A request frame of this master's term.
    fn request(&self, request_id: u64, body: AgentRequest) -> MasterFrame {
        MasterFrame::Request { request_id, term: self.role.term(), body }
    }

    /// Test hooks: makes this link's node manager panic at its next frame.
    pub fn inject_panic(&self) {
        self.panic_injected.fetch_or(MANAGER_PANIC, Ordering::SeqCst);
    }

    /// Test hooks: makes this link's writer panic at its next frame (a
    /// heartbeat at the latest).
    pub fn inject_writer_panic(&self) {
        self.panic_injected.fetch_or(WRITER_PANIC, Ordering::SeqCst);
    }

    /// Whether a panic is injected (a plain load: checked at every frame).
    pub(super) fn panic_injected(&self) -> bool {
        self.panic_injected.load(Ordering::Relaxed) != 0
    }

    /// Whether a panic was injected into the node manager (once).
    pub(super) fn take_injected_panic(&self) -> bool {
        self.panic_injected.fetch_and(!MANAGER_PANIC, Ordering::SeqCst) & MANAGER_PANIC != 0
    }

    /// Whether a panic was injected into the writer (once).
    pub(super) fn take_injected_writer_panic(&self) -> bool {
        self.panic_injected.fetch_and(!WRITER_PANIC, Ordering::SeqCst) & WRITER_PANIC != 0
    }

    /// Closes the link: the connection ends and every waiting request fails.
    pub fn close(&self) {
        self.closed.cancel();
        lock(&self.pending).clear();
    }

    /// Closes the link because the agent stopped reading it.
    pub(super) fn close_stalled(&self) {
        self.stalled.store(true, Ordering::SeqCst);
        self.agent_ended();
        self.close();
    }

    /// Closes the link of a node that will not be back (revoked).
    pub fn close_for_good(&self) {
        self.agent_ended();
        self.close();
    }

    /// Notes that the agent's side ended the link (before it is closed).
    pub(super) fn agent_ended(&self) {
        self.agent_ended.store(true, Ordering::SeqCst);
    }

    /// Whether the agent's side ended the link.
    pub fn ended_by_agent(&self) -> bool {
        self.agent_ended.load(Ordering::SeqCst)
    }

    /// The error of a request the link's close failed.
    fn closed_error(&self) -> NodeError {
        if self.stalled.load(Ordering::SeqCst) {
            NodeError::Stalled { node: self.node.clone(), after: self.send_timeout }
        } else {
            NodeError::Disconnected(self.node.clone())
        }
    }

    pub fn is_closed(&self) -> bool {
        self.closed.is_cancelled()
    }

    fn register(&self) -> (u64, Replies) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = futures::channel::mpsc::unbounded();
        lock(&self.pending).insert(id, tx);
        (id, rx)
    }

    /// A place for one package chunk: this link's share first (a slow
    /// agent waits on its own), then the budget shared by all links. A wait
    /// for the budget counts as progress for the step watchdog only while
    /// the budget moves (other links' chunks are granted): a turn behind a
    /// thousand other agents' installs is progress, a budget held by links
    /// that never drain is not, and the step ends at its deadline instead
    /// of waiting for good.
    async fn chunk_permit(&self, progress: &AtomicU64) -> Result<ChunkPermit, NodeError> {
        let gone = |_| self.closed_error();
        let link = self.link_chunks.clone().acquire_owned().await.map_err(gone)?;
        let mut granted = CHUNKS_GRANTED.load(Ordering::Relaxed);
        let budget = loop {
            match tokio::time::timeout(Duration::from_secs(1), self.chunks.clone().acquire_owned()).await {
                Ok(p) => break p.map_err(gone)?,
                Err(_) if self.is_closed() => return Err(self.closed_error()),
                Err(_) => {
                    let now = CHUNKS_GRANTED.load(Ordering::Relaxed);
                    if now != granted {
                        progress.fetch_add(1, Ordering::Relaxed);
                        granted = now;
                    }
                }
            }
        };
        CHUNKS_GRANTED.fetch_add(1, Ordering::Relaxed);
        Ok(ChunkPermit { _link: link, _budget: budget })
    }

    /// Queues a frame for the socket, waiting at most the send deadline.
    pub async fn send(&self, frame: MasterFrame) -> Result<(), NodeError> {
        self.send_with(frame, None).await
    }

    async fn send_with(&self, frame: MasterFrame, permit: Option<ChunkPermit>) -> Result<(), NodeError> {
        if self.is_closed() {
            return Err(self.closed_error());
        }
        if matches!(frame, MasterFrame::Request { .. }) && !self.role.may_act() {
            self.wait_to_act().await?;
        }
        match self.tx.send_timeout((frame, permit), self.send_timeout).await {
            Ok(()) => Ok(()),
            Err(mpsc::error::SendTimeoutError::Closed(_)) => Err(self.closed_error()),
            Err(mpsc::error::SendTimeoutError::Timeout(_)) => {
                tracing::warn!(node = %self.node, after = ?self.send_timeout, "agent is not reading; closing its link");
                self.close_stalled();
                Err(self.closed_error())
            }
        }
    }

    /// Waits (at most [`SUSPENDED_WAIT`]) while this master's leadership is
    /// suspended: its lease could not be renewed in time, so another master
    /// may lead by now, and nothing is commanded until it is renewed.
    async fn wait_to_act(&self) -> Result<(), NodeError> {
        let deadline = tokio::time::Instant::now() + SUSPENDED_WAIT;
        while !self.role.may_act() {
            if tokio::time::Instant::now() >= deadline || self.is_closed() {
                return Err(NodeError::Suspended { node: self.node.clone(), term: self.role.term() });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }

    /// Queues a frame only if there is room now (acknowledgements: one
    /// that cannot be sent is made again when the agent sends the report again).
    pub fn try_send(&self, frame: MasterFrame) -> bool {
        self.tx.try_send((frame, None)).is_ok()
    }

    async fn reply_within(
        &self,
        rx: &mut Replies,
        what: &'static str,
        after: Duration,
    ) -> Result<AgentResponse, NodeError> {
        let closed = self.closed.cancelled();
        tokio::select! {
            r = tokio::time::timeout(after, futures::StreamExt::next(rx)) => match r {
                Ok(Some(AgentResponse::Failed(f))) => Err(NodeError::Failed(f)),
                Ok(Some(r)) => Ok(r),
                Ok(None) => Err(self.closed_error()),
                Err(_) => Err(NodeError::Timeout { node: self.node.clone(), what, after }),
            },
            _ = closed => Err(self.closed_error()),
        }
    }

    /// Sends one request and waits for its reply (bounded by the reply deadline).
    pub async fn call(&self, body: AgentRequest, what: &'static str) -> Result<AgentResponse, NodeError> {
        self.call_within(body, what, Duration::ZERO).await
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
        let _turn = self.turn().await?;
        let (request_id, mut rx) = self.register();
        let _guard = PendingGuard(&self.pending, request_id);
        self.send(self.request(request_id, body)).await?;
        self.reply_within(&mut rx, what, self.reply_timeout + work).await
    }

    /// A place among the link's requests in flight (see [`LINK_REQUESTS`]).
    async fn turn(&self) -> Result<tokio::sync::OwnedSemaphorePermit, NodeError> {
        self.requests.clone().acquire_owned().await.map_err(|_| self.closed_error())
    }

    /// Installs a package: `InstallBegin`, then (unless the agent holds the
    /// package already) the tarball in chunks read from `blob`, `InstallEnd`,
    /// and the agent's `InstallResult`. Chunks are read and sent one at a
    /// time, so memory stays at one chunk whatever the package size, and the
    /// bounded frame queue applies TCP backpressure to the reader. Each chunk
    /// sent, and each the agent says it took in, adds one to `progress`.
    pub async fn install(
        &self,
        begin: InstallBegin,
        blob: PathBuf,
        progress: &AtomicU64,
    ) -> Result<AgentResponse, NodeError> {
        let instance = begin.instance.clone();
        let _turn = self.turn().await?;
        let (request_id, mut rx) = self.register();
        let _guard = PendingGuard(&self.pending, request_id);
        self.send(self.request(request_id, AgentRequest::InstallBegin(Box::new(begin)))).await?;
        // From here: the agent may be about to take the bytes (its answer
        // late because it waits for a request slot).
        let mut guard = StreamGuard { link: self.clone(), request_id, instance: instance.clone(), ended: false };
        match self.reply_within(&mut rx, "InstallBegin", self.reply_timeout).await? {
            AgentResponse::InstallReady { need_bytes: false } => guard.ended = true,
            AgentResponse::InstallReady { need_bytes: true } => {
                self.stream_package(request_id, &instance, &blob, progress, &mut rx).await?;
                guard.ended = true;
            }
            other => {
                return Err(NodeError::Unexpected {
                    node: self.node.clone(),
                    detail: format!("{other:?} to InstallBegin"),
                });
            }
        }
        // The deadline counts from the agent's last proof of progress: it
        // may still be reading megabytes out of the socket buffers.
        loop {
            match self.reply_within(&mut rx, "InstallEnd", self.reply_timeout).await? {
                AgentResponse::InstallReceived { .. } => {
                    progress.fetch_add(1, Ordering::Relaxed);
                }
                other => return Ok(other),
            }
        }
    }

    async fn stream_package(
        &self,
        request_id: u64,
        instance: &InstanceId,
        blob: &PathBuf,
        progress: &AtomicU64,
        rx: &mut Replies,
    ) -> Result<(), NodeError> {
        let pkg_err = |e: std::io::Error| NodeError::Package {
            node: self.node.clone(),
            detail: format!("{}: {e}", blob.display()),
        };
        let mut file = tokio::fs::File::open(blob).await.map_err(pkg_err)?;
        let mut left = file.metadata().await.map_err(pkg_err)?.len();
        let mut seq = 0u32;
        // Bytes sent, and bytes the agent says it took in: at most
        // `INSTALL_WINDOW_CHUNKS` chunks apart.
        let (mut sent, mut taken) = (0u64, 0u64);
        let window = INSTALL_WINDOW_CHUNKS * INSTALL_CHUNK_BYTES as u64;
        while left > 0 {
            // The agent answers mid-stream with its receipts, or to fail
            // the install (a broken package, a full disk): stop there,
            // instead of sending every remaining chunk for it to refuse.
            let answer = if sent.saturating_sub(taken) >= window {
                // The window is full: wait for the agent's next receipt
                // (it may be slow to extract; each receipt is progress).
                Some(self.reply_within(rx, "InstallReceived", self.reply_timeout).await?)
            } else {
                match rx.try_recv() {
                    Ok(r) => Some(r),
                    Err(futures::channel::mpsc::TryRecvError::Closed) => return Err(self.closed_error()),
                    Err(futures::channel::mpsc::TryRecvError::Empty) => None,
                }
            };
            match answer {
                Some(AgentResponse::Failed(f)) => return Err(NodeError::Failed(f)),
                Some(AgentResponse::InstallReceived { bytes }) => {
                    taken = taken.max(bytes);
                    progress.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                Some(other) => {
                    return Err(NodeError::Unexpected {
                        node: self.node.clone(),
                        detail: format!("{other:?} while the package was streaming"),
                    });
                }
                None => {}
            }
            // The budget first, then the buffer: memory is held only for
            // chunks that may be queued.
            let permit = self.chunk_permit(progress).await?;
            // Sized to what is left: a 4 KiB package costs 4 KiB, not a MiB.
            let mut buf = vec![0u8; INSTALL_CHUNK_BYTES.min(usize::try_from(left).unwrap_or(usize::MAX))];
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
            left = left.saturating_sub(filled as u64);
            sent += filled as u64;
            let body = AgentRequest::InstallData { instance: instance.clone(), seq, bytes: buf };
            self.send_with(self.request(request_id, body), Some(permit)).await?;
            progress.fetch_add(1, Ordering::Relaxed);
            seq += 1;
        }
        let body = AgentRequest::InstallEnd { instance: instance.clone() };
        self.send(self.request(request_id, body)).await
    }
}
