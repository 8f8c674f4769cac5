//! One simulated agent: dials the master, speaks the real protocol through
//! `src/protocol/` (handshake, codec, frames) and the real agent's writer
//! loop and outbox (heartbeats, reports resent until acknowledged), and
//! answers every request from a fake process layer ([`super::state`]) after
//! a configured latency. Install bytes are really received and checked
//! (size and sha256) but not kept.
//!
//! Faults for tests and load runs: a crash of an instance (an exit report,
//! then a restart by the "agent", [`SimAgent::crash`]); the link's faults
//! are in [`super::faults`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use sha2::{Digest, Sha256};
use tokio::sync::{mpsc, watch};
use tokio_util::codec::FramedWrite;

use super::faults::{Faults, Gate};
use super::state::SimState;
use crate::agent::connection::{
    MAX_REQUESTS_IN_FLIGHT, REPLY_QUEUE, dial, next_connection, split_after_handshake, write_frames,
};
use crate::agent::masters::Masters;
use crate::agent::node::failure;
use crate::agent::outbox::Outbox;
use crate::ids::{InstanceId, NodeId};
use crate::protocol::codec::{AgentCodec, ProtocolError};
use crate::protocol::handshake::LinkStream;
use crate::protocol::handshake::agent_handshake;
use crate::protocol::messages::{
    AgentEvent, AgentFrame, AgentRequest, AgentResponse, FailureKind, Hello, InstallBegin, MasterFrame,
    PROTOCOL_VERSION,
};

/// How long the fake processes take.
#[derive(Debug, Clone, Copy, Default)]
pub struct Latency {
    pub install: Duration,
    pub start: Duration,
    pub stop: Duration,
    /// Hooks, health checks, file writes, signals, deletes.
    pub other: Duration,
    /// After a crash, the "agent" restarts the instance after this.
    pub restart: Duration,
}

/// An install whose bytes are arriving.
struct Incoming {
    begin: InstallBegin,
    hasher: Sha256,
    size: u64,
}

pub struct SimAgent {
    pub node: NodeId,
    pub address: String,
    pub port_range: (u16, u16),
    pub latency: Latency,
    pub state: Mutex<SimState>,
    pub outbox: Arc<Outbox>,
    pub faults: Faults,
    pub connected: AtomicBool,
    /// Sessions served (connections whose handshake succeeded).
    sessions: std::sync::atomic::AtomicU64,
    /// Its certificate, once enrolled (in memory only).
    tls: std::sync::OnceLock<Arc<rustls::ClientConfig>>,
    /// Requests being worked on, over every connection: as the real
    /// agent, a new connection's inventory waits for the last one's.
    requests: Arc<tokio::sync::Semaphore>,
    /// The runtime it serves on (the fleet's own): its simulated restarts
    /// run there too, not on whichever runtime asked for the crash.
    runtime: std::sync::OnceLock<tokio::runtime::Handle>,
}

fn lock(m: &Mutex<SimState>) -> std::sync::MutexGuard<'_, SimState> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl SimAgent {
    pub fn new(node: NodeId, address: String, port_range: (u16, u16), latency: Latency) -> Arc<SimAgent> {
        Arc::new(SimAgent {
            node,
            address,
            port_range,
            latency,
            state: Mutex::default(),
            outbox: Arc::default(),
            faults: Faults::default(),
            requests: Arc::new(tokio::sync::Semaphore::new(MAX_REQUESTS_IN_FLIGHT)),
            runtime: std::sync::OnceLock::new(),
            connected: AtomicBool::new(false),
            sessions: Default::default(),
            tls: std::sync::OnceLock::new(),
        })
    }

    /// Connects with `other`'s certificate from now on (the same node
    /// dialling again from a new process, in tests), instead of enrolling.
    pub fn adopt_credentials(&self, other: &SimAgent) {
        if let Some(tls) = other.tls.get() {
            let _ = self.tls.set(tls.clone());
        }
    }

    async fn enroll(
        &self,
        masters: Masters,
        join_token: &str,
        max_backoff: Duration,
    ) -> Option<Arc<rustls::ClientConfig>> {
        if let Some(tls) = self.tls.get() {
            return Some(tls.clone());
        }
        let enrolled = match crate::protocol::tls::credentials::NewKey::generate() {
            Ok(key) => {
                let timeout = Duration::from_secs(30);
                crate::agent::enroll::request(&self.node, join_token, key, masters, &self.address, timeout, max_backoff)
                    .await
            }
            Err(e) => Err(e.into()),
        };
        match enrolled.and_then(|c| c.client_config().map_err(Into::into)) {
            Ok(tls) => Some(self.tls.get_or_init(|| tls).clone()),
            Err(e) => {
                tracing::error!(node = %self.node, error = %crate::error::ErrorChain(&e), "simulated agent cannot enroll");
                None
            }
        }
    }

    /// Enrolls with `join_token` (once; the credentials stay in memory),
    /// then dials the masters until `shutdown`, serving each connection:
    /// as the real agent, the next master at once when one cannot be
    /// reached, refuses or ends the session, a jittered pause after a
    /// whole round.
    pub async fn serve(self: Arc<Self>, masters: Masters, join_token: Arc<str>, mut shutdown: watch::Receiver<bool>) {
        let _ = self.runtime.set(tokio::runtime::Handle::current());
        let max_backoff = Duration::from_secs(2);
        let mut masters = masters;
        let tls = tokio::select! {
            tls = self.enroll(masters.clone(), &join_token, max_backoff) => match tls {
                Some(tls) => tls,
                None => return,
            },
            _ = shutdown.changed() => return,
        };
        let mut backoff = Duration::from_millis(50);
        loop {
            if *shutdown.borrow() {
                return;
            }
            let connected = match dial(masters.current(), &self.address).await {
                Ok(tcp) => crate::protocol::tls::connect(tls.clone(), tcp, Duration::from_secs(30)).await,
                Err(e) => Err(e),
            };
            if let Ok(stream) = connected {
                backoff = Duration::from_millis(50);
                let r = tokio::select! {
                    r = self.session(stream) => r,
                    _ = shutdown.changed() => return,
                };
                self.connected.store(false, Ordering::Relaxed);
                if let Err(e) = r {
                    tracing::debug!(node = %self.node, error = %e, "simulated agent's connection ended");
                }
            }
            if masters.len() > 1 && !masters.advance() {
                continue;
            }
            tokio::select! {
                _ = tokio::time::sleep(crate::agent::connection::jittered(backoff)) => {}
                _ = shutdown.changed() => return,
            }
            backoff = (backoff * 2).min(max_backoff);
        }
    }

    async fn session(self: &Arc<Self>, stream: LinkStream) -> Result<(), ProtocolError> {
        // Kicks from here on end this connection (see `Faults::kicks`).
        let kicks = self.faults.kicks.load(Ordering::SeqCst);
        let mut framed = tokio_util::codec::Framed::new(stream, AgentCodec::default());
        let settled = self.requests.acquire_many(MAX_REQUESTS_IN_FLIGHT as u32);
        drop(tokio::time::timeout(crate::agent::connection::SETTLE_MAX, settled).await);
        let hello = Hello {
            protocol_version: PROTOCOL_VERSION,
            node_id: self.node.clone(),
            address: self.address.clone(),
            instance_root: format!("/sim/{}/instances", self.node),
            port_range: self.port_range,
            labels: [("simulated".to_string(), "true".to_string())].into_iter().collect(),
            agent_version: format!("{}-sim", env!("CARGO_PKG_VERSION")),
            cgroups: false,
            resource_limits: true,
            inventory: lock(&self.state).inventory(),
            // A simulated node has no directories: nothing unrecorded.
            unrecorded: vec![],
            simulated: true,
        };
        let welcome = agent_handshake(&mut framed, hello, Duration::from_secs(30)).await?;
        self.connected.store(true, Ordering::Relaxed);
        let (mut reader, write_half) = split_after_handshake(framed);
        let (tx, rx) = mpsc::channel::<AgentFrame>(REPLY_QUEUE);
        let beat = Duration::from_millis(welcome.heartbeat_interval_ms.max(100));
        let writer = FramedWrite::new(Gate { inner: write_half, agent: self.clone() }, AgentCodec::default());
        self.sessions.fetch_add(1, Ordering::SeqCst);
        let mut write_task = tokio::spawn(write_frames(writer, rx, self.outbox.clone(), next_connection(), beat));
        let slots = self.requests.clone();
        let mut incoming: HashMap<u64, Incoming> = HashMap::new();
        let idle = crate::protocol::messages::idle_limit(beat);
        let result = loop {
            // Registered for the wake-ups before the switches are looked
            // at: a flip or a kick between the look and the wait would
            // otherwise be missed, and the session would sleep through it.
            let resumed = self.faults.resumed.notified();
            let kicked = self.faults.kick.notified();
            tokio::pin!(resumed, kicked);
            resumed.as_mut().enable();
            kicked.as_mut().enable();
            if self.faults.kicks.load(Ordering::SeqCst) != kicks {
                break Ok(());
            }
            if self.faults.stalled.load(Ordering::SeqCst) || self.faults.frozen.load(Ordering::SeqCst) {
                tokio::select! {
                    _ = resumed => {}
                    _ = kicked => {}
                }
                continue;
            }
            let frame = tokio::select! {
                f = tokio::time::timeout(idle, reader.next()) => match f {
                    Ok(f) => f,
                    Err(_) => break Err(ProtocolError::Timeout("hearing from the master")),
                },
                w = &mut write_task => break match w {
                    Ok(r) => r,
                    Err(e) => Err(ProtocolError::Unexpected(format!("writer task: {e}"))),
                },
                _ = kicked => continue,
                // A switch flipped (stalled, frozen): it applies at once, not
                // after one more frame (reading is cancel-safe: a frame
                // half-read stays in the reader's buffer). Without this an
                // idle agent frozen while waiting would still read the
                // master's close and dial again: no half-open link at all.
                _ = resumed => continue,
            };
            let frame = match frame {
                None => break Ok(()),
                Some(Err(e)) => break Err(e),
                Some(Ok(f)) => f,
            };
            match frame {
                MasterFrame::Request { request_id, body, .. } => {
                    self.handle(&tx, &slots, &mut incoming, request_id, body).await;
                    // A package chunk leaves a large buffer behind; with a
                    // thousand agents in one process, give it back.
                    if reader.read_buffer().is_empty() && reader.read_buffer().capacity() > 64 * 1024 {
                        *reader.read_buffer_mut() = bytes::BytesMut::new();
                    }
                }
                MasterFrame::Ack { seq } => self.outbox.ack(seq),
                MasterFrame::Heartbeat => {}
                MasterFrame::Welcome(_) | MasterFrame::Refused { .. } | MasterFrame::Enrolled(_) => {
                    break Err(ProtocolError::Unexpected("handshake frame after the handshake".into()));
                }
            }
        };
        write_task.abort();
        result
    }

    /// Replies after `delay`, in a task (bounded by `slots`), with what
    /// `work` does to the state then.
    async fn later(
        self: &Arc<Self>,
        tx: &mpsc::Sender<AgentFrame>,
        slots: &Arc<tokio::sync::Semaphore>,
        request_id: u64,
        delay: Duration,
        work: impl FnOnce(&mut SimState) -> AgentResponse + Send + 'static,
    ) {
        let Ok(slot) = slots.clone().acquire_owned().await else { return };
        let me = self.clone();
        let tx = tx.clone();
        tokio::spawn(async move {
            let _slot = slot;
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            let body = work(&mut lock(&me.state));
            let _ = tx.send(AgentFrame::Response { request_id, body }).await;
        });
    }

    async fn reply(tx: &mpsc::Sender<AgentFrame>, request_id: u64, body: AgentResponse) {
        let _ = tx.send(AgentFrame::Response { request_id, body }).await;
    }

    async fn handle(
        self: &Arc<Self>,
        tx: &mpsc::Sender<AgentFrame>,
        slots: &Arc<tokio::sync::Semaphore>,
        incoming: &mut HashMap<u64, Incoming>,
        request_id: u64,
        body: AgentRequest,
    ) {
        let l = self.latency;
        match body {
            AgentRequest::InstallBegin(begin) => {
                let begin = *begin;
                let need = lock(&self.state).install_begin(&begin);
                match need {
                    Err(resp) => Self::reply(tx, request_id, resp).await,
                    Ok(true) => {
                        incoming.insert(request_id, Incoming { begin, hasher: Sha256::new(), size: 0 });
                        Self::reply(tx, request_id, AgentResponse::InstallReady { need_bytes: true }).await;
                        if self.faults.stall_on_install.swap(false, Ordering::Relaxed) {
                            self.faults.stalled.store(true, Ordering::Relaxed);
                        }
                    }
                    Ok(false) => {
                        // Queued before the completion task exists: the
                        // order of one request's replies is kept.
                        Self::reply(tx, request_id, AgentResponse::InstallReady { need_bytes: false }).await;
                        self.later(tx, slots, request_id, l.install, move |s| s.install_complete(&begin)).await;
                    }
                }
            }
            AgentRequest::InstallData { bytes, .. } => {
                let Some(inc) = incoming.get_mut(&request_id) else {
                    return Self::reply(
                        tx,
                        request_id,
                        failure(FailureKind::BadRequest, "InstallData without InstallBegin"),
                    )
                    .await;
                };
                inc.size += bytes.len() as u64;
                inc.hasher.update(&bytes);
                if inc.size > inc.begin.package_size {
                    incoming.remove(&request_id);
                    Self::reply(tx, request_id, failure(FailureKind::Install, "more package bytes than announced"))
                        .await;
                } else {
                    let received = AgentResponse::InstallReceived { bytes: inc.size };
                    Self::reply(tx, request_id, received).await;
                }
            }
            AgentRequest::InstallEnd { .. } => {
                let Some(inc) = incoming.remove(&request_id) else { return };
                let sha = hex::encode(inc.hasher.finalize());
                if sha != inc.begin.package_sha256 || inc.size != inc.begin.package_size {
                    let m = format!(
                        "package is {} bytes with sha256 {sha}; announced {} bytes with {}",
                        inc.size, inc.begin.package_size, inc.begin.package_sha256
                    );
                    return Self::reply(tx, request_id, failure(FailureKind::Install, m)).await;
                }
                let begin = inc.begin;
                self.later(tx, slots, request_id, l.install, move |s| s.install_complete(&begin)).await;
            }
            AgentRequest::WriteFiles { instance, generation, files, env } => {
                let work = move |s: &mut SimState| {
                    s.once(&instance.clone(), generation, "write-files", |s| {
                        s.write_files(&instance, generation, &files, env)
                    })
                };
                self.later(tx, slots, request_id, l.other, work).await
            }
            AgentRequest::Start { instance, generation, .. } => {
                let work =
                    move |s: &mut SimState| s.once(&instance, generation, "start", |s| s.start(&instance, generation));
                self.later(tx, slots, request_id, l.start, work).await
            }
            AgentRequest::Stop { instance, generation } => {
                let work =
                    move |s: &mut SimState| s.once(&instance, generation, "stop", |s| s.stop(&instance, generation));
                self.later(tx, slots, request_id, l.stop, work).await
            }
            AgentRequest::Delete { instance, generation } => {
                let work = move |s: &mut SimState| {
                    s.once(&instance, generation, "delete", |s| s.delete(&instance, generation))
                };
                self.later(tx, slots, request_id, l.other, work).await
            }
            AgentRequest::RunHook { instance, generation, hook, argv, .. } => {
                match crate::agent::hooks::check_hook_request(&instance, &hook, &argv) {
                    Err(refused) => Self::reply(tx, request_id, refused).await,
                    Ok(()) => {
                        let check = move |s: &mut SimState| {
                            // As the real agent: nothing to destroy where nothing
                            // was installed, so a failed create can be deleted.
                            if hook == "destroy" && !s.instances.contains_key(&instance) {
                                return AgentResponse::HookDone {
                                    exit_code: 0,
                                    stdout_tail: String::new(),
                                    stderr_tail: String::new(),
                                };
                            }
                            s.check(&instance, Some(generation), true)
                        };
                        self.later(tx, slots, request_id, l.other, check).await
                    }
                }
            }
            AgentRequest::CheckHealth { instance, .. } => {
                self.later(tx, slots, request_id, l.other, move |s| s.check(&instance, None, false)).await
            }
            AgentRequest::Signal { instance, generation, .. } => {
                self.later(tx, slots, request_id, l.other, move |s| s.signal(&instance, generation)).await
            }
            // Simulated processes write no logs.
            AgentRequest::ReadLog { .. } => {
                Self::reply(tx, request_id, AgentResponse::LogChunk { data: Vec::new(), next_offset: 0 }).await
            }
            AgentRequest::Ping => Self::reply(tx, request_id, AgentResponse::Pong).await,
            AgentRequest::InstallAbort { .. } => {
                incoming.remove(&request_id);
            }
        }
    }

    /// Kills an instance's fake process: reports the exit (kept until
    /// acknowledged), and, with `restart`, starts it again after the
    /// restart latency and reports that. False when it was not running.
    pub fn crash(self: &Arc<Self>, instance: &InstanceId, restart: bool) -> bool {
        let Some(pid) = lock(&self.state).crash(instance) else { return false };
        let delay = self.latency.restart.max(Duration::from_millis(1));
        self.outbox.push(AgentEvent::ProcessExited {
            instance: instance.clone(),
            pid,
            exit_code: None,
            signal: Some(9),
            stderr_tail: "killed by the simulator".into(),
            restart_in_ms: restart.then_some(delay.as_millis() as u64),
            attempt: 1,
            max_attempts: 1,
        });
        if restart {
            let me = self.clone();
            let id = instance.clone();
            let runtime = self.runtime.get().cloned().unwrap_or_else(tokio::runtime::Handle::current);
            runtime.spawn(async move {
                tokio::time::sleep(delay).await;
                let started = {
                    let mut s = lock(&me.state);
                    let generation =
                        s.instances.get(&id).filter(|i| i.desired_running && i.pid.is_none()).map(|i| i.generation);
                    generation.map(|g| s.start(&id, g))
                };
                if let Some(AgentResponse::Started { pid, .. }) = started {
                    me.outbox.push(AgentEvent::ProcessRestarted { instance: id, pid: Some(pid), error: None });
                }
            });
        }
        true
    }

    /// How many sessions it has served (one per successful connection).
    pub fn connections(&self) -> u64 {
        self.sessions.load(Ordering::SeqCst)
    }

    pub fn running(&self) -> usize {
        lock(&self.state).running()
    }
}

#[cfg(test)]
mod tests {
    use futures::SinkExt;
    use tokio_util::codec::Framed;

    use super::*;
    use crate::protocol::codec::MasterCodec;
    use crate::protocol::messages::Welcome;

    /// A kick while the session is not waiting for one (here: in the
    /// handshake) still drops that connection; it used to be lost, and the
    /// session went on as if no kick had come.
    #[tokio::test]
    async fn a_kick_during_the_handshake_is_not_lost() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let authority = crate::protocol::tls::testkit::TestAuthority::new().unwrap();
        let agent = SimAgent::new(NodeId::new("kick"), "127.0.0.1".into(), (20000, 20010), Latency::default());
        let (stop, rx) = watch::channel(false);
        let token: Arc<str> = authority.join_token().into();
        let task = tokio::spawn(agent.clone().serve(Masters::one(listener.local_addr().unwrap()), token, rx));
        let wait = Duration::from_secs(5);
        // It enrolls first, then dials again with its certificate.
        let (stream, _) = tokio::time::timeout(wait, listener.accept()).await.unwrap().unwrap();
        let (stream, _) = authority.accept(stream).await.unwrap();
        let mut framed = Framed::new(stream, MasterCodec::new());
        let Some(Ok(AgentFrame::Enroll(request))) = tokio::time::timeout(wait, framed.next()).await.unwrap() else {
            panic!("the agent did not enroll first")
        };
        framed.send(MasterFrame::Enrolled(authority.enroll(&request).unwrap())).await.unwrap();
        let (stream, _) = tokio::time::timeout(wait, listener.accept()).await.unwrap().unwrap();
        let (stream, peer) = authority.accept(stream).await.unwrap();
        assert!(peer.is_some(), "the enrolled agent presented no certificate");
        let mut framed = Framed::new(stream, MasterCodec::new());
        let hello = tokio::time::timeout(wait, framed.next()).await.unwrap().unwrap().unwrap();
        assert!(matches!(hello, AgentFrame::Hello(_)), "{hello:?}");
        agent.disconnect();
        let welcome = Welcome { protocol_version: PROTOCOL_VERSION, heartbeat_interval_ms: 100, term: 0 };
        framed.send(MasterFrame::Welcome(welcome)).await.unwrap();
        // The connection ends (heartbeats may come first), and the agent dials again.
        let ended = tokio::time::timeout(wait, async { while let Some(Ok(_)) = framed.next().await {} }).await;
        assert!(ended.is_ok(), "the kicked connection is still open after {wait:?}");
        assert!(tokio::time::timeout(wait, listener.accept()).await.is_ok(), "the agent did not dial again");
        let _ = stop.send(true);
        task.await.unwrap();
    }
}
