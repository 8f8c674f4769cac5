//! The agent's link to the master: dial (with backoff), handshake, then
//! read requests and answer them, send heartbeats and events.
//!
//! Requests run concurrently as tasks (the instance locks in `node.rs`
//! serialize what must be serialized), at most `MAX_REQUESTS_IN_FLIGHT` at
//! once. Install frames go to their install's own task
//! ([`install_feed`](super::install_feed)), in arrival order: the read
//! loop never waits for an extraction, and the master's window of
//! `InstallReceived` receipts bounds what waits.
//! Nothing on the read loop waits for an instance's lock (a start waiting
//! for health or a hook holds it for long): a loop that stops reading gets
//! its link closed by the master's write deadline.
//!
//! Nothing reorders the frames of one request: a reply is queued (awaited)
//! by whoever makes it, and a request's later replies come from a task
//! spawned only after its earlier ones were queued. Reports of process
//! exits go through the node's [`Outbox`](super::outbox::Outbox), never
//! through the reply queue, and are sent again until acknowledged.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::mpsc;
use tokio_util::codec::{Framed, FramedWrite};

use super::install_feed::{InstallFeed, PendingInstall};
use super::installer::{self, StreamingExtractor};
use super::node::{Node, failure};
use super::outbox::Outbox;
use crate::protocol::codec::{AgentCodec, ProtocolError};
use crate::protocol::handshake::{LinkStream, LinkWriter, agent_handshake};
use crate::protocol::messages::{
    AgentEvent, AgentFrame, AgentRequest, AgentResponse, FailureKind, Hello, MasterFrame, PROTOCOL_VERSION, idle_limit,
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

/// Dials the master until `shutdown` fires; serves each connection until
/// it drops. `tls` holds this node's certificate (see [`super::enroll`]).
pub async fn serve(
    node: Arc<Node>,
    identity: Identity,
    mut masters: super::masters::Masters,
    tls: Arc<rustls::ClientConfig>,
    handshake_timeout: Duration,
    max_backoff: Duration,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let mut backoff = Duration::from_millis(50);
    loop {
        if *shutdown.borrow() {
            return;
        }
        // Before dialling, so a long request never holds the master's
        // handshake (and its deadline) open.
        tokio::select! {
            _ = settle_requests(&node) => {}
            _ = shutdown.changed() => return,
        }
        let master = masters.current();
        let connected = match dial(master, &identity.address).await {
            Ok(tcp) => crate::protocol::tls::connect(tls.clone(), tcp, handshake_timeout).await,
            Err(e) => Err(e),
        };
        match connected {
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
                    Err(ProtocolError::Refused { reason }) => {
                        tracing::error!(%reason, %master, "the connection to this master was refused");
                        // Asking again at once changes nothing: wait the
                        // longest before this one again, try the others first.
                        backoff = max_backoff;
                    }
                    Err(e) => tracing::warn!(error = %crate::error::ErrorChain(&e), "connection to master ended"),
                    Ok(()) => tracing::warn!("master closed the connection"),
                }
            }
            Err(e) => tracing::warn!(error = %crate::error::ErrorChain(&e), %master, "cannot connect to the master"),
        }
        // With several masters, the next one at once; after a whole round
        // (or with one master) a jittered pause.
        if masters.len() > 1 && !masters.advance() {
            continue;
        }
        tokio::select! {
            _ = tokio::time::sleep(jittered(backoff)) => {}
            _ = shutdown.changed() => return,
        }
        backoff = (backoff * 2).min(max_backoff);
    }
}

/// `d` spread over 50-150 %: a fleet that lost its master at the same
/// moment does not dial back in lockstep (each retry a thundering herd
/// on the listener's backlog).
pub(crate) fn jittered(d: Duration) -> Duration {
    let mut b = [0u8; 2];
    if getrandom::fill(&mut b).is_err() {
        return d;
    }
    let permille = 500 + u64::from(u16::from_le_bytes(b)) % 1001;
    d.mul_f64(permille as f64 / 1000.0)
}

/// Connects from this node's address when it is local (so the master sees
/// the node's own address), else from any.
pub(crate) async fn dial(master: SocketAddr, address: &str) -> std::io::Result<TcpStream> {
    let stream = match address.parse::<std::net::IpAddr>() {
        Ok(ip) if ip.is_ipv4() == master.is_ipv4() => {
            let socket = if ip.is_ipv4() { TcpSocket::new_v4()? } else { TcpSocket::new_v6()? };
            match socket.bind(SocketAddr::new(ip, 0)) {
                Ok(()) => socket.connect(master).await?,
                Err(_) => TcpStream::connect(master).await?,
            }
        }
        _ => TcpStream::connect(master).await?,
    };
    crate::protocol::socket::prepare(&stream)?;
    Ok(stream)
}

/// How many requests one connection runs at once. The read loop waits for
/// a slot before taking the next request, so a master that sends faster
/// than the node can work is slowed by TCP instead of growing tasks.
pub(crate) const MAX_REQUESTS_IN_FLIGHT: usize = 1024;

/// Replies waiting for the socket. Replies of one request are queued in
/// the order they are made (the read loop awaits each), so they keep it.
pub(crate) const REPLY_QUEUE: usize = 256;

/// Waits until every request of the previous connection has finished, so
/// the inventory of the next `Hello` reflects each command this agent
/// received: the master may then take it as the truth for every command
/// it sent on an earlier connection (one not reflected never arrived, and
/// never will, since that connection is gone).
///
/// For at most [`SETTLE_MAX`]: a node must not stay away from its master
/// (and be judged `Down`) for a long hook. Past it the agent connects with
/// those requests still running; a process one of them starts or that
/// dies is reported as usual, but a stop, install or delete that ends
/// later is seen by the master only at the agent's next connection.
async fn settle_requests(node: &Node) {
    let all = MAX_REQUESTS_IN_FLIGHT as u32;
    let busy = MAX_REQUESTS_IN_FLIGHT - node.requests.available_permits();
    if busy == 0 {
        return;
    }
    tracing::info!(
        requests = busy,
        "waiting for the last connection's requests to finish before reporting the inventory"
    );
    match tokio::time::timeout(SETTLE_MAX, node.requests.acquire_many(all)).await {
        Ok(permits) => drop(permits),
        Err(_) => {
            let busy = MAX_REQUESTS_IN_FLIGHT - node.requests.available_permits();
            tracing::warn!(
                requests = busy,
                waited_s = SETTLE_MAX.as_secs(),
                "connecting with the last connection's requests still running: what they change after the inventory reaches the master at the next connection"
            );
        }
    }
}

/// The longest [`settle_requests`] waits: under the master's default
/// `node_down_after` (30 s), with room for the dial.
pub(crate) const SETTLE_MAX: Duration = Duration::from_secs(20);

static CONNECTIONS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

async fn session(
    node: &Arc<Node>,
    identity: &Identity,
    stream: LinkStream,
    handshake_timeout: Duration,
) -> Result<(), ProtocolError> {
    let mut framed = Framed::new(stream, AgentCodec::default());
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
        unrecorded: node.unrecorded().await,
        simulated: false,
    };
    let welcome = agent_handshake(&mut framed, hello, handshake_timeout).await?;
    node.master_term.admit(&node.store, welcome.term).await.map_err(|reason| ProtocolError::Refused { reason })?;
    tracing::info!(node = %identity.node_id, term = welcome.term, "connected to master");
    let (mut reader, write_half) = split_after_handshake(framed);
    let writer = FramedWrite::new(write_half, AgentCodec::default());

    let (tx, rx) = mpsc::channel::<AgentFrame>(REPLY_QUEUE);
    let beat = Duration::from_millis(welcome.heartbeat_interval_ms.max(100));
    let connection = next_connection();
    let mut write_task = tokio::spawn(write_frames(writer, rx, node.outbox.clone(), connection, beat));

    let slots = node.requests.clone();
    let mut installs: HashMap<u64, InstallFeed> = HashMap::new();
    let idle = idle_limit(beat);
    let result = loop {
        let frame = tokio::select! {
            f = tokio::time::timeout(idle, reader.next()) => match f {
                Ok(f) => f,
                Err(_) => break Err(ProtocolError::Timeout("hearing from the master (no frame, not even a heartbeat)")),
            },
            // The writer ended: the socket broke, or reports overflowed and
            // a resync (a new Hello with the inventory) is due.
            w = &mut write_task => break match w {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(e),
                Err(e) => Err(ProtocolError::Unexpected(format!("writer task: {e}"))),
            },
        };
        let frame = match frame {
            None => break Ok(()),
            Some(Err(e)) => break Err(e),
            Some(Ok(f)) => f,
        };
        match frame {
            MasterFrame::Request { request_id, term, body } => {
                if let Some(body) = node.master_term.refusal(term) {
                    if tx.send(AgentFrame::Response { request_id, body }).await.is_err() {
                        break Ok(());
                    }
                    continue;
                }
                handle(node, &tx, &slots, &mut installs, request_id, body).await;
                // A package chunk leaves a 1 MiB buffer behind; give it back.
                if reader.read_buffer().is_empty() && reader.read_buffer().capacity() > 64 * 1024 {
                    *reader.read_buffer_mut() = bytes::BytesMut::new();
                }
            }
            MasterFrame::Ack { seq } => node.outbox.ack(seq),
            MasterFrame::Heartbeat => {}
            MasterFrame::Welcome(_) | MasterFrame::Refused { .. } | MasterFrame::Enrolled(_) => {
                break Err(ProtocolError::Unexpected("handshake frame after the handshake".into()));
            }
        }
    };
    write_task.abort();
    futures::future::join_all(installs.drain().map(|(_, feed)| feed.abort())).await;
    result
}

/// The agent's read side of a link (see [`split_after_handshake`]).
pub(crate) type LinkReader = crate::protocol::handshake::LinkReader<AgentCodec>;

/// [`crate::protocol::handshake::split_after_handshake`] for the agent's
/// codec; shared with the simulated agent.
pub(crate) fn split_after_handshake(framed: Framed<LinkStream, AgentCodec>) -> (LinkReader, LinkWriter) {
    crate::protocol::handshake::split_after_handshake(framed)
}

/// Owns the socket's write half: heartbeats, then reports (their own
/// queue: the outbox), then replies. Ends with an error when the socket
/// breaks, and with `Ok` when reports overflowed and a resync is due.
/// Shared with the simulated agent, so both send the same way.
pub(crate) async fn write_frames<W: tokio::io::AsyncWrite + Unpin>(
    mut writer: FramedWrite<W, AgentCodec>,
    mut replies: mpsc::Receiver<AgentFrame>,
    outbox: Arc<Outbox>,
    connection: u64,
    beat: Duration,
) -> Result<(), ProtocolError> {
    let mut tick = tokio::time::interval(beat);
    let mut resend = tokio::time::interval(super::outbox::RESEND_AFTER);
    loop {
        let frames: Vec<AgentFrame> = tokio::select! {
            biased;
            _ = tick.tick() => vec![AgentFrame::Event(AgentEvent::Heartbeat)],
            _ = outbox.added.notified() => reports(&outbox, connection),
            _ = resend.tick() => reports(&outbox, connection),
            r = replies.recv() => match r {
                Some(f) => {
                    // Every reply already queued goes out in the same write.
                    let mut v = vec![f];
                    while v.len() < 64 {
                        match replies.try_recv() {
                            Ok(f) => v.push(f),
                            Err(_) => break,
                        }
                    }
                    v
                }
                None => return Ok(()),
            },
        };
        if outbox.take_overflow() {
            tracing::warn!("reports overflowed the outbox; reconnecting so the master gets the full inventory");
            return Ok(());
        }
        for f in frames {
            writer.feed(f).await?;
        }
        writer.flush().await?;
        // A large frame leaves a large buffer behind; give it back.
        if writer.write_buffer().capacity() > 64 * 1024 {
            *writer.write_buffer_mut() = bytes::BytesMut::new();
        }
    }
}

fn reports(outbox: &Outbox, connection: u64) -> Vec<AgentFrame> {
    outbox
        .due(connection, tokio::time::Instant::now())
        .into_iter()
        .map(|(seq, event)| AgentFrame::Report { seq, event })
        .collect()
}

/// A new connection number (the outbox resends everything on a new one).
pub(crate) fn next_connection() -> u64 {
    CONNECTIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// Queues a reply; awaited in the read loop, so the replies of one request
/// leave in the order they were made.
async fn reply(tx: &mpsc::Sender<AgentFrame>, request_id: u64, body: AgentResponse) {
    let _ = tx.send(AgentFrame::Response { request_id, body }).await;
}

async fn handle(
    node: &Arc<Node>,
    tx: &mpsc::Sender<AgentFrame>,
    slots: &Arc<tokio::sync::Semaphore>,
    installs: &mut HashMap<u64, InstallFeed>,
    request_id: u64,
    body: AgentRequest,
) {
    match body {
        AgentRequest::InstallBegin(begin) => {
            let begin = *begin;
            // Never waits for the instance's lock: see `check_install`.
            let run_as = match node.check_install(&begin) {
                Ok(u) => u,
                Err(resp) => return reply(tx, request_id, resp).await,
            };
            let tag = uuid::Uuid::new_v4().simple().to_string();
            let staging = node.root.join(format!(".staging-{}-{tag}", begin.instance));
            if let Some(cached) = node.cached_package(&begin.package_sha256) {
                // Queued before the extraction task exists: `InstallReady`
                // always precedes this request's `InstallResult`.
                reply(tx, request_id, AgentResponse::InstallReady { need_bytes: false }).await;
                let Ok(slot) = slots.clone().acquire_owned().await else { return };
                let node = node.clone();
                let tx = tx.clone();
                tokio::spawn(async move {
                    let _slot = slot;
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
                    reply(&tx, request_id, resp).await;
                });
                return;
            }
            let tee = node.package_cache.join(format!(".incoming-{tag}"));
            // Held from here to the install's end: an inventory taken for
            // the next connection waits for it like for any request.
            let Ok(slot) = slots.clone().acquire_owned().await else { return };
            match StreamingExtractor::start(
                staging.clone(),
                crate::package::ExtractLimits::default(),
                Some(tee.clone()),
            ) {
                Ok(extractor) => {
                    // Ready is queued before the feed's task exists: it
                    // precedes every answer the task gives.
                    reply(tx, request_id, AgentResponse::InstallReady { need_bytes: true }).await;
                    let pending = PendingInstall { begin, run_as, staging, tee, extractor };
                    let feed = InstallFeed::start(node.clone(), tx.clone(), slot, request_id, pending);
                    installs.insert(request_id, feed);
                }
                Err(e) => {
                    let m = crate::error::ErrorChain(&e).to_string();
                    reply(tx, request_id, failure(FailureKind::Install, m)).await
                }
            }
        }
        AgentRequest::InstallData { bytes, .. } => {
            let Some(feed) = installs.get(&request_id) else {
                return reply(tx, request_id, failure(FailureKind::BadRequest, "InstallData without InstallBegin"))
                    .await;
            };
            if let Err(m) = feed.chunk(bytes)
                && let Some(feed) = installs.remove(&request_id)
            {
                // Off the read loop: removing an extraction takes a while.
                let tx = tx.clone();
                tokio::spawn(async move {
                    if feed.abort().await {
                        reply(&tx, request_id, failure(FailureKind::BadRequest, m)).await;
                    }
                });
            }
        }
        AgentRequest::InstallEnd { .. } => {
            // None: it failed already (and was answered), or never began.
            if let Some(feed) = installs.remove(&request_id) {
                feed.end();
            }
        }
        AgentRequest::InstallAbort { .. } => {
            // None: it ended or failed already; the master expects nothing.
            if let Some(feed) = installs.remove(&request_id) {
                tokio::spawn(feed.abort());
            }
        }
        other => {
            let Ok(slot) = slots.clone().acquire_owned().await else { return };
            let node = node.clone();
            let tx = tx.clone();
            let span = tracing::info_span!("request", id = request_id, kind = request_kind(&other));
            let work = tracing::Instrument::instrument(
                async move {
                    let _slot = slot;
                    // A command sent again after its link closed: see `Node::replay`.
                    let again = resent_key(&other);
                    if let Some((id, generation, kind)) = &again
                        && let Some(resp) = node.replay(id, *generation, kind)
                    {
                        tracing::info!(instance = %id, generation, "a command sent again: its first answer is given again");
                        return reply(&tx, request_id, resp).await;
                    }
                    let resp = match other {
                        AgentRequest::WriteFiles { instance, generation, files, env } => {
                            node.write_files(&instance, generation, files, env).await
                        }
                        AgentRequest::Start { instance, generation, settle_ms } => {
                            node.start_settled(&instance, generation, Duration::from_millis(settle_ms)).await
                        }
                        AgentRequest::Stop { instance, generation } => node.stop(&instance, generation).await,
                        AgentRequest::Delete { instance, generation } => node.delete(&instance, generation).await,
                        AgentRequest::CheckHealth { instance, timeout_ms } => {
                            node.check_health(&instance, timeout_ms).await
                        }
                        AgentRequest::RunHook { instance, generation, hook, argv, timeout_ms } => {
                            node.run_hook(&instance, generation, &hook, &argv, timeout_ms).await
                        }
                        AgentRequest::Signal { instance, generation, signal } => {
                            node.signal(&instance, generation, signal).await
                        }
                        AgentRequest::ReadLog { instance, stream, from, max_bytes } => {
                            node.read_log(&instance, stream, from, max_bytes).await
                        }
                        AgentRequest::Ping => AgentResponse::Pong,
                        _ => failure(FailureKind::BadRequest, "unexpected request"),
                    };
                    if let Some((id, generation, kind)) = &again {
                        node.answered(id, *generation, kind, &resp);
                    }
                    reply(&tx, request_id, resp).await;
                },
                span,
            );
            tokio::spawn(work);
        }
    }
}

/// The instance and generation of a command the master may send again
/// after its link closed (see `Node::replay`): those that change the
/// instance and carry a generation of their own.
fn resent_key(r: &AgentRequest) -> Option<(crate::ids::InstanceId, u64, &'static str)> {
    match r {
        AgentRequest::WriteFiles { instance, generation, .. }
        | AgentRequest::Start { instance, generation, .. }
        | AgentRequest::Stop { instance, generation }
        | AgentRequest::Delete { instance, generation } => Some((instance.clone(), *generation, request_kind(r))),
        _ => None,
    }
}

fn request_kind(r: &AgentRequest) -> &'static str {
    match r {
        AgentRequest::InstallBegin(_) => "install-begin",
        AgentRequest::InstallData { .. } => "install-data",
        AgentRequest::InstallEnd { .. } => "install-end",
        AgentRequest::InstallAbort { .. } => "install-abort",
        AgentRequest::WriteFiles { .. } => "write-files",
        AgentRequest::Start { .. } => "start",
        AgentRequest::Stop { .. } => "stop",
        AgentRequest::Delete { .. } => "delete",
        AgentRequest::RunHook { .. } => "run-hook",
        AgentRequest::CheckHealth { .. } => "check-health",
        AgentRequest::Signal { .. } => "signal",
        AgentRequest::ReadLog { .. } => "read-log",
        AgentRequest::Ping => "ping",
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use tokio::io::AsyncWriteExt;
    use tokio_util::codec::Encoder;

    use super::*;
    use crate::protocol::codec::MasterCodec;
    use crate::protocol::messages::Welcome;

    /// A request the master sends right behind `Welcome`, in the same
    /// segment, is read although the master sends nothing after it.
    #[tokio::test]
    async fn a_request_sent_with_the_welcome_is_not_left_in_the_buffer() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let master = tokio::spawn(async move {
            let (stream, _) = listener.accept().await.unwrap();
            let mut framed = Framed::new(stream, MasterCodec::new());
            assert!(matches!(framed.next().await, Some(Ok(AgentFrame::Hello(_)))));
            let mut bytes = bytes::BytesMut::new();
            let welcome = Welcome { protocol_version: PROTOCOL_VERSION, heartbeat_interval_ms: 1000, term: 0 };
            let mut codec = MasterCodec::new();
            codec.encode(MasterFrame::Welcome(welcome), &mut bytes).unwrap();
            codec
                .encode(MasterFrame::Request { request_id: 7, term: 0, body: AgentRequest::Ping }, &mut bytes)
                .unwrap();
            framed.get_mut().write_all(&bytes).await.unwrap();
            framed // kept open, silent
        });
        let stream: LinkStream = Box::new(TcpStream::connect(addr).await.unwrap());
        let mut framed = Framed::new(stream, AgentCodec::default());
        let hello = Hello {
            protocol_version: PROTOCOL_VERSION,
            node_id: crate::ids::NodeId::new("n1"),
            address: "127.0.0.1".into(),
            instance_root: "/tmp/x".into(),
            port_range: (20000, 20010),
            labels: BTreeMap::new(),
            agent_version: "test".into(),
            cgroups: false,
            resource_limits: false,
            inventory: vec![],
            unrecorded: vec![],
            simulated: false,
        };
        agent_handshake(&mut framed, hello, Duration::from_secs(5)).await.unwrap();
        let _master = master.await.unwrap();
        let (mut reader, _writer) = split_after_handshake(framed);
        let first = tokio::time::timeout(Duration::from_secs(2), reader.next()).await;
        let first = first.expect("the request that came with the Welcome was not decoded");
        assert_eq!(first.unwrap().unwrap(), MasterFrame::Request { request_id: 7, term: 0, body: AgentRequest::Ping });
    }

    #[test]
    fn a_retry_delay_is_spread_over_half_to_one_and_a_half_times() {
        let d = Duration::from_millis(1000);
        let delays: Vec<Duration> = (0..200).map(|_| super::jittered(d)).collect();
        assert!(delays.iter().all(|j| *j >= Duration::from_millis(500) && *j <= Duration::from_millis(1500)));
        let distinct: std::collections::BTreeSet<Duration> = delays.into_iter().collect();
        assert!(distinct.len() > 50, "spread, not one value: {}", distinct.len());
    }
}
