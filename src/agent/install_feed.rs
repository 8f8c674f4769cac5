//! A package streaming in over the link, fed to its extractor by a task of
//! its own: the link's reader hands each `InstallData` chunk over and goes
//! on reading, so a slow extraction (a disk that lags, an archive of many
//! small files) never stops the link (the master would take that for an
//! agent that stopped reading and close it, failing every command on it).
//! The task answers each chunk `InstallReceived` once the extractor has it,
//! and `InstallResult` (or the failure) after `InstallEnd`, in that order.
//! The master sends at most [`INSTALL_WINDOW_CHUNKS`] ahead of those
//! receipts; a chunk past twice that is refused, so memory stays bounded
//! whatever the master sends.
//!
//! The install holds one of the node's request slots from its
//! `InstallBegin` to its end, so a new connection's inventory waits for it
//! like for any other request. It ends, and removes what it extracted,
//! when the master aborts it (`InstallAbort`), when its link goes, or when
//! no chunk has come for [`FEED_IDLE_LIMIT`] (a master that gave up
//! without a word).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, mpsc};
use tokio::task::JoinHandle;

use super::installer::StreamingExtractor;
use super::node::{InstallUser, Node, failure};
use crate::protocol::messages::{AgentFrame, AgentResponse, FailureKind, INSTALL_WINDOW_CHUNKS, InstallBegin};

/// What an install needs once its bytes are in.
pub(super) struct PendingInstall {
    pub begin: InstallBegin,
    pub run_as: InstallUser,
    pub staging: PathBuf,
    pub tee: PathBuf,
    pub extractor: StreamingExtractor,
}

/// How long an install waits for its next chunk (or its end) before it
/// gives up: far beyond the master's wait for a receipt (its reply
/// deadline), so only a master that dropped the install hits it.
pub(super) const FEED_IDLE_LIMIT: Duration = Duration::from_secs(300);

enum Feed {
    Chunk(Vec<u8>),
    End,
}

/// The reader's handle on one install's task.
pub(super) struct InstallFeed {
    tx: mpsc::UnboundedSender<Feed>,
    /// Chunks handed over and not yet taken by the task.
    queued: Arc<AtomicU64>,
    /// Set by [`abort`](Self::abort): chunks still queued are dropped unread.
    aborted: Arc<AtomicBool>,
    /// Whether the install ended unanswered (aborted before any failure).
    task: JoinHandle<bool>,
}

impl InstallFeed {
    /// Starts the task of install `request_id`, holding `slot` (one of the
    /// node's request slots) until it ends; its answers go to `replies`.
    pub fn start(
        node: Arc<Node>,
        replies: mpsc::Sender<AgentFrame>,
        slot: OwnedSemaphorePermit,
        request_id: u64,
        pending: PendingInstall,
    ) -> InstallFeed {
        let (tx, rx) = mpsc::unbounded_channel();
        let queued = Arc::new(AtomicU64::new(0));
        let aborted = Arc::new(AtomicBool::new(false));
        let state = FeedState { node, replies, request_id, queued: queued.clone(), aborted: aborted.clone() };
        let task = tokio::spawn(feed(state, slot, pending, rx));
        InstallFeed { tx, queued, aborted, task }
    }

    /// Hands a chunk over. `Err` when the master sent it further ahead of
    /// the receipts than its window allows (the install is then dropped).
    pub fn chunk(&self, bytes: Vec<u8>) -> Result<(), String> {
        if self.queued.fetch_add(1, Ordering::SeqCst) >= 2 * INSTALL_WINDOW_CHUNKS {
            return Err(format!(
                "the master sent package chunks more than {} ahead of the agent's receipts",
                2 * INSTALL_WINDOW_CHUNKS
            ));
        }
        let _ = self.tx.send(Feed::Chunk(bytes));
        Ok(())
    }

    /// The last chunk was handed over: the task finishes the install.
    pub fn end(self) {
        let _ = self.tx.send(Feed::End);
    }

    /// The master gave up on it, or the link is gone: the task drops what
    /// is queued, removes what it extracted, and answers nothing. True when
    /// nothing had answered it yet (no failure was sent).
    pub fn abort(self) -> impl Future<Output = bool> + Send + 'static {
        // At once, not when the returned future first runs (it may be
        // spawned): no queued chunk is extracted after this.
        self.aborted.store(true, Ordering::SeqCst);
        drop(self.tx);
        async move { self.task.await.unwrap_or(false) }
    }
}

/// What the feed's task works with, besides the install itself.
struct FeedState {
    node: Arc<Node>,
    replies: mpsc::Sender<AgentFrame>,
    request_id: u64,
    queued: Arc<AtomicU64>,
    aborted: Arc<AtomicBool>,
}

async fn reply(tx: &mpsc::Sender<AgentFrame>, request_id: u64, body: AgentResponse) {
    let _ = tx.send(AgentFrame::Response { request_id, body }).await;
}

async fn feed(
    st: FeedState,
    _slot: OwnedSemaphorePermit,
    pending: PendingInstall,
    mut rx: mpsc::UnboundedReceiver<Feed>,
) -> bool {
    let (replies, request_id) = (&st.replies, st.request_id);
    let mut pending = Some(pending);
    let mut received = 0u64;
    loop {
        let next = match tokio::time::timeout(FEED_IDLE_LIMIT, rx.recv()).await {
            Ok(Some(next)) if !st.aborted.load(Ordering::SeqCst) => next,
            Ok(_) => break,
            Err(_) => {
                if let Some(p) = &pending {
                    tracing::warn!(instance = %p.begin.instance, idle = ?FEED_IDLE_LIMIT, "no package chunk from the master for too long: the install is dropped");
                    let m = format!("no package chunk came for {}s: the install is dropped", FEED_IDLE_LIMIT.as_secs());
                    reply(replies, request_id, failure(FailureKind::Timeout, m)).await;
                    pending.take().expect("checked above").extractor.abort().await;
                }
                return false;
            }
        };
        match next {
            Feed::Chunk(bytes) => {
                st.queued.fetch_sub(1, Ordering::SeqCst);
                // Failed already (and answered): the rest is dropped.
                let Some(p) = pending.as_mut() else { continue };
                let len = bytes.len() as u64;
                match p.extractor.push(bytes).await {
                    Ok(()) => {
                        received += len;
                        reply(replies, request_id, AgentResponse::InstallReceived { bytes: received }).await;
                    }
                    Err(e) => {
                        if let Some(p) = pending.take() {
                            p.extractor.abort().await;
                        }
                        let m = crate::error::ErrorChain(&e).to_string();
                        reply(replies, request_id, failure(FailureKind::Install, m)).await;
                    }
                }
            }
            Feed::End => {
                let Some(p) = pending.take() else { return false };
                let sha = p.begin.package_sha256.clone();
                let resp = match p.extractor.finish(&sha, p.begin.package_size).await {
                    Ok(_) => {
                        // Keep the package so later instances skip the transfer.
                        if let Err(e) =
                            tokio::fs::rename(&p.tee, st.node.package_cache.join(format!("{sha}.tar.gz"))).await
                        {
                            tracing::warn!(error = %e, "cannot cache package");
                        }
                        st.node.complete_install(p.begin, p.staging, p.run_as).await
                    }
                    Err(e) => failure(
                        FailureKind::Install,
                        format!("install of {}: {}", p.begin.instance, crate::error::ErrorChain(&e)),
                    ),
                };
                reply(replies, request_id, resp).await;
                return false;
            }
        }
    }
    // Aborted, or its link gone: nothing of it is kept.
    match pending.take() {
        Some(p) => {
            p.extractor.abort().await;
            true
        }
        None => false,
    }
}
