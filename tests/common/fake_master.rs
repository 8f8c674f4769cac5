//! [`FakeMaster`]: the master's side of the agent link, played by a test.
//!
//! It listens on 127.0.0.1 port 0, accepts one agent at a time over TLS
//! (a CA of its own, [`TestAuthority`]: an agent enrolls with
//! [`FakeMaster::join_token`] on its first connection and presents its
//! certificate after), runs the real handshake and then speaks raw frames: the test sends
//! `MasterFrame::Request`s and reads the agent's frames itself, so it sees
//! exactly what the agent sends, in the order it sends it. Heartbeats are
//! skipped; reports are kept aside until the test asks for them. Every read
//! has a deadline, and a failure prints every frame seen so far.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::Duration;

use flotilla::protocol::codec::MasterCodec;
use flotilla::protocol::handshake::{LinkStream, Opening, master_open, welcome};
use flotilla::protocol::messages::{
    AgentEvent, AgentFrame, AgentRequest, AgentResponse, Hello, MasterFrame, PROTOCOL_VERSION, Welcome,
};
use flotilla::protocol::tls::testkit::TestAuthority;
use futures::{SinkExt, StreamExt};
use tokio::net::TcpListener;
use tokio::time::{Instant, timeout_at};
use tokio_util::codec::Framed;

/// How long any one answer may take.
pub const WAIT: Duration = Duration::from_secs(10);

pub struct FakeMaster {
    listener: TcpListener,
    authority: TestAuthority,
    link: Option<Framed<LinkStream, MasterCodec>>,
    next_id: u64,
    /// Reports read while waiting for something else, oldest first.
    reports: VecDeque<(u64, AgentEvent)>,
    /// Every frame sent and received (heartbeats left out), for failures.
    log: Vec<String>,
    /// The term its `Welcome` and requests carry (0, like a single master).
    pub term: i64,
}

impl FakeMaster {
    pub async fn bind() -> FakeMaster {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the fake master");
        let authority = TestAuthority::new().expect("a CA for the fake master");
        FakeMaster { listener, authority, link: None, next_id: 1, reports: VecDeque::new(), log: Vec::new(), term: 0 }
    }

    /// The join token agents of this fake master enroll with.
    pub fn join_token(&self) -> String {
        self.authority.join_token()
    }

    pub fn addr(&self) -> SocketAddr {
        self.listener.local_addr().expect("listener address")
    }

    /// Fails the test with `what` and every frame seen so far.
    #[track_caller]
    pub fn fail(&self, what: impl std::fmt::Display) -> ! {
        let from = self.log.len().saturating_sub(200);
        panic!("{what}\n----- frames so far (oldest first) -----\n{}", self.log[from..].join("\n"))
    }

    /// Accepts the agent's next connection and completes the handshake;
    /// answers its `Hello`. An enrollment on the way is answered with a
    /// certificate, and the agent's next connection is taken.
    pub async fn accept(&mut self) -> Hello {
        self.accept_within(WAIT).await
    }

    /// [`FakeMaster::accept`], waiting up to `wait` for the connection.
    pub async fn accept_within(&mut self, wait: Duration) -> Hello {
        let deadline = Instant::now() + wait;
        loop {
            let stream = match timeout_at(deadline, self.listener.accept()).await {
                Ok(Ok((s, _))) => s,
                Ok(Err(e)) => self.fail(format!("accept failed: {e}")),
                Err(_) => self.fail(format!("the agent did not connect within {wait:?}")),
            };
            stream.set_nodelay(true).expect("nodelay");
            let (stream, certificate) = match timeout_at(deadline, self.authority.accept(stream)).await {
                Ok(Ok(v)) => v,
                Ok(Err(e)) => self.fail(format!("TLS accept failed: {e}")),
                Err(_) => self.fail("the agent's TLS handshake did not finish"),
            };
            let mut framed = Framed::new(stream, MasterCodec::default());
            match master_open(&mut framed, PROTOCOL_VERSION, deadline).await {
                Ok(Opening::Enroll(request)) => {
                    self.log.push(format!("<- Enroll from {}", request.node_id));
                    let enrolled = self.authority.enroll(&request).expect("issue a certificate");
                    if let Err(e) = framed.send(MasterFrame::Enrolled(enrolled)).await {
                        self.fail(format!("sending the certificate failed: {e}"));
                    }
                }
                Ok(Opening::Hello(hello)) => {
                    if certificate.is_none() {
                        self.fail("the agent sent Hello without a certificate");
                    }
                    let w = Welcome { protocol_version: PROTOCOL_VERSION, heartbeat_interval_ms: 200, term: self.term };
                    if let Err(e) = welcome(&mut framed, w, deadline).await {
                        self.fail(format!("handshake failed: {e}"));
                    }
                    self.log.push(format!("<- Hello from {} ({} instances)", hello.node_id, hello.inventory.len()));
                    self.link = Some(framed);
                    return hello;
                }
                Err(e) => self.fail(format!("handshake failed: {e}")),
            }
        }
    }

    /// Whether the agent closes the connection within `wait` (frames it
    /// sends meanwhile are read and logged).
    pub async fn closed_by_agent_within(&mut self, wait: Duration) -> bool {
        let deadline = Instant::now() + wait;
        let Some(link) = self.link.as_mut() else { self.fail("no connection to watch") };
        loop {
            match timeout_at(deadline, link.next()).await {
                Err(_) => return false,
                Ok(None) | Ok(Some(Err(_))) => {
                    self.link = None;
                    return true;
                }
                Ok(Some(Ok(f))) => self.log.push(format!("<- {f:?}")),
            }
        }
    }

    /// Drops the connection (the agent will dial again).
    pub fn disconnect(&mut self) {
        self.log.push("-- connection dropped by the test".into());
        self.link = None;
    }

    /// Sends one frame.
    pub async fn send_frame(&mut self, frame: MasterFrame) {
        self.log.push(format!("-> {}", short(&frame)));
        let Some(link) = self.link.as_mut() else { self.fail("no connection to send on") };
        let sent = tokio::time::timeout(WAIT, link.send(frame)).await;
        match sent {
            Ok(Ok(())) => {}
            Ok(Err(e)) => self.fail(format!("send failed: {e}")),
            Err(_) => self.fail("the agent did not take a frame within the wait"),
        }
    }

    /// Sends `body` as part of request `request_id` (install frames share one).
    pub async fn send(&mut self, request_id: u64, body: AgentRequest) {
        self.send_frame(MasterFrame::Request { request_id, term: self.term, body }).await;
    }

    /// Sends `body` under a new request id, which it returns.
    pub async fn request(&mut self, body: AgentRequest) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.send(id, body).await;
        id
    }

    /// Sends `body` and returns its answer, which must be the next response.
    pub async fn call(&mut self, body: AgentRequest) -> AgentResponse {
        let id = self.request(body).await;
        self.reply(id).await
    }

    /// The next response, which must answer `request_id`.
    pub async fn reply(&mut self, request_id: u64) -> AgentResponse {
        let (id, body) = self.next_response(Instant::now() + WAIT).await;
        if id != request_id {
            self.fail(format!("expected an answer to request {request_id}, got one to request {id}: {body:?}"));
        }
        body
    }

    /// The next response of any request; fails at `deadline`.
    pub async fn next_response(&mut self, deadline: Instant) -> (u64, AgentResponse) {
        loop {
            match self.read(deadline).await {
                Some(AgentFrame::Response { request_id, body }) => return (request_id, body),
                Some(AgentFrame::Report { seq, event }) => self.reports.push_back((seq, event)),
                Some(other) => self.fail(format!("unexpected frame after the handshake: {other:?}")),
                None => self.fail("no response within the wait"),
            }
        }
    }

    /// The first report (already read or still to come) that `wanted`
    /// accepts; no response may arrive meanwhile.
    pub async fn report(&mut self, what: &str, wanted: impl Fn(u64, &AgentEvent) -> bool) -> (u64, AgentEvent) {
        if let Some(i) = self.reports.iter().position(|(s, e)| wanted(*s, e)) {
            return self.reports.remove(i).expect("position is in range");
        }
        let deadline = Instant::now() + WAIT;
        loop {
            match self.read(deadline).await {
                Some(AgentFrame::Report { seq, event }) if wanted(seq, &event) => return (seq, event),
                Some(AgentFrame::Report { seq, event }) => self.reports.push_back((seq, event)),
                Some(other) => self.fail(format!("unexpected frame while waiting for {what}: {other:?}")),
                None => self.fail(format!("no {what} within {WAIT:?}")),
            }
        }
    }

    /// Watches the link for `quiet`: report `seq` must not come (again), and
    /// nothing else but heartbeats may come.
    pub async fn no_report(&mut self, seq: u64, quiet: Duration) {
        if !self.reports.is_empty() {
            self.fail(format!("unexpected reports while watching for report {seq}: {:?}", self.reports));
        }
        let deadline = Instant::now() + quiet;
        match self.read(deadline).await {
            None => {}
            Some(AgentFrame::Report { seq: s, .. }) if s == seq => {
                self.fail(format!("report {seq} was sent again after its Ack"))
            }
            Some(other) => self.fail(format!("unexpected frame while watching for report {seq}: {other:?}")),
        }
    }

    /// The next frame that is not a heartbeat, or `None` at `deadline`.
    async fn read(&mut self, deadline: Instant) -> Option<AgentFrame> {
        loop {
            let Some(link) = self.link.as_mut() else { self.fail("no connection to read from") };
            let frame = match timeout_at(deadline, link.next()).await {
                Err(_) => return None,
                Ok(None) => self.fail("the agent closed the connection"),
                Ok(Some(Err(e))) => self.fail(format!("reading from the agent failed: {e}")),
                Ok(Some(Ok(f))) => f,
            };
            if frame == AgentFrame::Event(AgentEvent::Heartbeat) {
                // Answered as the master's writer would: an agent that
                // hears nothing for its idle limit drops the link.
                let _ = timeout_at(deadline, link.send(MasterFrame::Heartbeat)).await;
                continue;
            }
            self.log.push(format!("<- {frame:?}"));
            return Some(frame);
        }
    }
}

/// A frame for the log, without package bytes or file contents.
fn short(frame: &MasterFrame) -> String {
    match frame {
        MasterFrame::Request { request_id, body: AgentRequest::InstallBegin(b), .. } => {
            format!("#{request_id} InstallBegin {} gen {} sha {:.12}", b.instance, b.generation, b.package_sha256)
        }
        MasterFrame::Request { request_id, body: AgentRequest::InstallData { instance, seq, bytes }, .. } => {
            format!("#{request_id} InstallData {instance} chunk {seq} ({} bytes)", bytes.len())
        }
        MasterFrame::Request {
            request_id,
            body: AgentRequest::WriteFiles { instance, generation, files, env },
            ..
        } => {
            let paths: Vec<&str> = files.iter().map(|f| f.path.as_str()).collect();
            format!("#{request_id} WriteFiles {instance} gen {generation} {paths:?} env {env:?}")
        }
        other => format!("{other:?}"),
    }
}
