//! The agent's link to the master: dial (with backoff), handshake, then
//! read requests and answer them, send heartbeats and events.
//!
//! Requests run concurrently as tasks (the instance locks in `node.rs`
//! serialize what must be serialized). Install frames are the exception:
//! `InstallData` chunks are pushed into the extractor in arrival order on
//! the read loop itself, which also gives TCP backpressure when the disk is
//! slower than the network.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::mpsc;
use tokio_util::codec::{FramedRead, FramedWrite};

use super::installer::{self, StreamingExtractor};
use super::node::{Node, failure};
use super::process::users::RunAs;
use crate::protocol::codec::{AgentCodec, ProtocolError};
use crate::protocol::handshake::agent_handshake;
use crate::protocol::messages::{
    AgentEvent, AgentFrame, AgentRequest, AgentResponse, FailureKind, Hello, InstallBegin, MasterFrame,
    PROTOCOL_VERSION,
};

/// Who this agent is, for the handshake.
#[derive(Debug, Clone)]
pub struct Identity {
    pub node_id: crate::ids::NodeId,
    pub address: String,
    pub port_range: (u16, u16),
    pub labels: std::collections::BTreeMap<String, String>,
    pub cgroups: bool,
    /// Whether this agent can enforce `ProcessSpec::limits`.
    pub resource_limits: bool,
}

struct PendingInstall {
    begin: InstallBegin,
    run_as: RunAs,
    staging: PathBuf,
    tee: PathBuf,
    extractor: StreamingExtractor,
}

/// Dials the master until `shutdown` fires; serves each connection until it drops.
pub async fn serve(
    node: Arc<Node>,
    identity: Identity,
    master: SocketAddr,
    handshake_timeout: Duration,
    max_backoff: Duration,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let mut backoff = Duration::from_millis(50);
    loop {
        if *shutdown.borrow() {
            return;
        }
        match dial(master, &identity.address).await {
            Ok(stream) => {
                backoff = Duration::from_millis(50);
                let result = tokio::select! {
                    r = session(&node, &identity, stream, handshake_timeout) => r,
                    _ = shutdown.changed() => return,
                };
                match result {
                    Err(ProtocolError::VersionMismatch { ours, theirs }) => {
                        tracing::error!(
                            ours,
                            theirs,
                            "the master speaks another protocol version; upgrade one of them"
                        );
                    }
                    Err(e) => tracing::warn!(error = %crate::error::ErrorChain(&e), "connection to master ended"),
                    Ok(()) => tracing::warn!("master closed the connection"),
                }
            }
            Err(e) => tracing::debug!(error = %e, %master, "cannot reach master"),
        }
        node.set_events(None);
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = shutdown.changed() => return,
        }
        backoff = (backoff * 2).min(max_backoff);
    }
}

/// Connects from this node's address when it is local (so the master sees
/// the node's own address), else from any.
async fn dial(master: SocketAddr, address: &str) -> std::io::Result<TcpStream> {
    if let Ok(ip) = address.parse::<std::net::IpAddr>()
        && ip.is_ipv4() == master.is_ipv4()
    {
        let socket = if ip.is_ipv4() { TcpSocket::new_v4()? } else { TcpSocket::new_v6()? };
        if socket.bind(SocketAddr::new(ip, 0)).is_ok() {
            return socket.connect(master).await;
        }
    }
    TcpStream::connect(master).await
}

async fn session(
    node: &Arc<Node>,
    identity: &Identity,
    stream: TcpStream,
    handshake_timeout: Duration,
) -> Result<(), ProtocolError> {
    stream.set_nodelay(true).map_err(ProtocolError::Io)?;
    let mut framed = tokio_util::codec::Framed::new(stream, AgentCodec::default());
    let hello = Hello {
        protocol_version: PROTOCOL_VERSION,
        node_id: identity.node_id.clone(),
        address: identity.address.clone(),
        instance_root: node.root.display().to_string(),
        port_range: identity.port_range,
        labels: identity.labels.clone(),
        agent_version: env!("CARGO_PKG_VERSION").to_string(),
        cgroups: identity.cgroups,
        resource_limits: identity.resource_limits,
        inventory: node.inventory().await,
    };
    let welcome = agent_handshake(&mut framed, hello, handshake_timeout).await?;
    tracing::info!(node = %identity.node_id, "connected to master");
    let parts = framed.into_parts();
    let (read_half, write_half) = parts.io.into_split();
    let mut reader = FramedRead::new(read_half, AgentCodec::default());
    reader.read_buffer_mut().extend_from_slice(&parts.read_buf);
    let mut writer = FramedWrite::new(write_half, AgentCodec::default());

    let (tx, mut rx) = mpsc::channel::<AgentFrame>(256);
    node.set_events(Some(tx.clone()));
    let write_task = tokio::spawn(async move {
        while let Some(frame) = rx.recv().await {
            if writer.send(frame).await.is_err() {
                break;
            }
        }
    });
    let beat = Duration::from_millis(welcome.heartbeat_interval_ms.max(100));
    let heartbeat_tx = tx.clone();
    let heartbeat = tokio::spawn(async move {
        let mut tick = tokio::time::interval(beat);
        loop {
            tick.tick().await;
            if heartbeat_tx.send(AgentFrame::Event(AgentEvent::Heartbeat)).await.is_err() {
                break;
            }
        }
    });

    let mut installs: HashMap<u64, PendingInstall> = HashMap::new();
    let result = loop {
        let frame = match reader.next().await {
            None => break Ok(()),
            Some(Err(e)) => break Err(e),
            Some(Ok(f)) => f,
        };
        let MasterFrame::Request { request_id, body } = frame else {
            break Err(ProtocolError::Unexpected("handshake frame after the handshake".into()));
        };
        handle(node, &tx, &mut installs, request_id, body).await;
    };
    heartbeat.abort();
    write_task.abort();
    for (_, p) in installs.drain() {
        p.extractor.abort().await;
    }
    result
}

fn reply(tx: &mpsc::Sender<AgentFrame>, request_id: u64, body: AgentResponse) {
    let tx = tx.clone();
    tokio::spawn(async move {
        let _ = tx.send(AgentFrame::Response { request_id, body }).await;
    });
}

async fn handle(
    node: &Arc<Node>,
    tx: &mpsc::Sender<AgentFrame>,
    installs: &mut HashMap<u64, PendingInstall>,
    request_id: u64,
    body: AgentRequest,
) {
    match body {
        AgentRequest::InstallBegin(begin) => {
            let begin = *begin;
            let run_as = match node.check_install(&begin).await {
                Ok(u) => u,
                Err(resp) => return reply(tx, request_id, resp),
            };
            let tag = uuid::Uuid::new_v4().simple().to_string();
            let staging = node.root.join(format!(".staging-{}-{tag}", begin.instance));
            if let Some(cached) = node.cached_package(&begin.package_sha256) {
                reply(tx, request_id, AgentResponse::InstallReady { need_bytes: false });
                let node = node.clone();
                let tx = tx.clone();
                tokio::spawn(async move {
                    let resp =
                        match installer::extract_file(&cached, &staging, &crate::package::ExtractLimits::default())
                            .await
                        {
                            Ok(_) => node.complete_install(begin, staging, run_as).await,
                            Err(e) => {
                                let _ = tokio::fs::remove_dir_all(&staging).await;
                                failure(
                                    FailureKind::Install,
                                    format!("extracting the cached package: {}", crate::error::ErrorChain(&e)),
                                )
                            }
                        };
                    let _ = tx.send(AgentFrame::Response { request_id, body: resp }).await;
                });
                return;
            }
            let tee = node.package_cache.join(format!(".incoming-{tag}"));
            match StreamingExtractor::start(
                staging.clone(),
                crate::package::ExtractLimits::default(),
                Some(tee.clone()),
            ) {
                Ok(extractor) => {
                    installs.insert(request_id, PendingInstall { begin, run_as, staging, tee, extractor });
                    reply(tx, request_id, AgentResponse::InstallReady { need_bytes: true });
                }
                Err(e) => {
                    reply(tx, request_id, failure(FailureKind::Install, crate::error::ErrorChain(&e).to_string()))
                }
            }
        }
        AgentRequest::InstallData { bytes, .. } => {
            let Some(p) = installs.get_mut(&request_id) else {
                return reply(tx, request_id, failure(FailureKind::BadRequest, "InstallData without InstallBegin"));
            };
            if let Err(e) = p.extractor.push(bytes).await {
                if let Some(p) = installs.remove(&request_id) {
                    p.extractor.abort().await;
                }
                reply(tx, request_id, failure(FailureKind::Install, crate::error::ErrorChain(&e).to_string()));
            }
        }
        AgentRequest::InstallEnd { .. } => {
            let Some(p) = installs.remove(&request_id) else {
                // Already failed (and answered) during InstallData.
                return;
            };
            let node = node.clone();
            let tx = tx.clone();
            tokio::spawn(async move {
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
                let _ = tx.send(AgentFrame::Response { request_id, body: resp }).await;
            });
        }
        other => {
            let node = node.clone();
            let tx = tx.clone();
            let span = tracing::info_span!("request", id = request_id, kind = request_kind(&other));
            let work = tracing::Instrument::instrument(
                async move {
                    let resp = match other {
                        AgentRequest::WriteFiles { instance, generation, files, env } => {
                            node.write_files(&instance, generation, files, env).await
                        }
                        AgentRequest::Start { instance, generation } => node.start(&instance, generation).await,
                        AgentRequest::Stop { instance, generation } => node.stop(&instance, generation).await,
                        AgentRequest::Delete { instance, generation } => node.delete(&instance, generation).await,
                        AgentRequest::CheckHealth { instance, timeout_ms } => {
                            node.check_health(&instance, timeout_ms).await
                        }
                        AgentRequest::RunHook { instance, generation, hook, argv, timeout_ms } => {
                            node.run_hook(&instance, generation, &hook, &argv, timeout_ms).await
                        }
                        AgentRequest::Ping => AgentResponse::Pong,
                        _ => failure(FailureKind::BadRequest, "unexpected request"),
                    };
                    let _ = tx.send(AgentFrame::Response { request_id, body: resp }).await;
                },
                span,
            );
            tokio::spawn(work);
        }
    }
}

fn request_kind(r: &AgentRequest) -> &'static str {
    match r {
        AgentRequest::InstallBegin(_) => "install-begin",
        AgentRequest::InstallData { .. } => "install-data",
        AgentRequest::InstallEnd { .. } => "install-end",
        AgentRequest::WriteFiles { .. } => "write-files",
        AgentRequest::Start { .. } => "start",
        AgentRequest::Stop { .. } => "stop",
        AgentRequest::Delete { .. } => "delete",
        AgentRequest::RunHook { .. } => "run-hook",
        AgentRequest::CheckHealth { .. } => "check-health",
        AgentRequest::Ping => "ping",
    }
}
