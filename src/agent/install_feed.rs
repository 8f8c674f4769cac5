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

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::mpsc;
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

enum Feed {
    Chunk(Vec<u8>),
    End,
}

/// The reader's handle on one install's task.
pub(super) struct InstallFeed {
    tx: mpsc::UnboundedSender<Feed>,
    /// Chunks handed over and not yet taken by the task.
    queued: Arc<AtomicU64>,
    task: JoinHandle<()>,
}

impl InstallFeed {
    /// Starts the task of install `request_id`; its answers go to `replies`.
    pub fn start(
        node: Arc<Node>,
        replies: mpsc::Sender<AgentFrame>,
        slots: Arc<tokio::sync::Semaphore>,
        request_id: u64,
        pending: PendingInstall,
    ) -> InstallFeed {
        let (tx, rx) = mpsc::unbounded_channel();
        let queued = Arc::new(AtomicU64::new(0));
        let task = tokio::spawn(feed(node, replies, slots, request_id, pending, rx, queued.clone()));
        InstallFeed { tx, queued, task }
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

    /// The link is gone: the task stops and removes what it extracted.
    pub async fn abort(self) {
        drop(self.tx);
        let _ = self.task.await;
    }
}

async fn reply(tx: &mpsc::Sender<AgentFrame>, request_id: u64, body: AgentResponse) {
    let _ = tx.send(AgentFrame::Response { request_id, body }).await;
}

async fn feed(
    node: Arc<Node>,
    replies: mpsc::Sender<AgentFrame>,
    slots: Arc<tokio::sync::Semaphore>,
    request_id: u64,
    pending: PendingInstall,
    mut rx: mpsc::UnboundedReceiver<Feed>,
    queued: Arc<AtomicU64>,
) {
    let mut pending = Some(pending);
    let mut received = 0u64;
    while let Some(next) = rx.recv().await {
        match next {
            Feed::Chunk(bytes) => {
                queued.fetch_sub(1, Ordering::SeqCst);
                // Failed already (and answered): the rest is dropped.
                let Some(p) = pending.as_mut() else { continue };
                let len = bytes.len() as u64;
                match p.extractor.push(bytes).await {
                    Ok(()) => {
                        received += len;
                        reply(&replies, request_id, AgentResponse::InstallReceived { bytes: received }).await;
                    }
                    Err(e) => {
                        if let Some(p) = pending.take() {
                            p.extractor.abort().await;
                        }
                        let m = crate::error::ErrorChain(&e).to_string();
                        reply(&replies, request_id, failure(FailureKind::Install, m)).await;
                    }
                }
            }
            Feed::End => {
                let Some(p) = pending.take() else { return };
                let Ok(_slot) = slots.acquire_owned().await else {
                    p.extractor.abort().await;
                    return;
                };
                let sha = p.begin.package_sha256.clone();
                let resp = match p.extractor.finish(&sha, p.begin.package_size).await {
                    Ok(_) => {
                        // Keep the package so later instances skip the transfer.
                        if let Err(e) =
                            tokio::fs::rename(&p.tee, node.package_cache.join(format!("{sha}.tar.gz"))).await
                        {
                            tracing::warn!(error = %e, "cannot cache package");
                        }
                        node.complete_install(p.begin, p.staging, p.run_as).await
                    }
                    Err(e) => failure(
                        FailureKind::Install,
                        format!("install of {}: {}", p.begin.instance, crate::error::ErrorChain(&e)),
                    ),
                };
                reply(&replies, request_id, resp).await;
                return;
            }
        }
    }
    // The link went away before the end: nothing of it is kept.
    if let Some(p) = pending.take() {
        p.extractor.abort().await;
    }
}
