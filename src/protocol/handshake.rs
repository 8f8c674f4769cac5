//! The handshake that opens every agent link: the agent sends `Hello`, the
//! master answers `Welcome` or `Refused`.
//!
//! Both sides check the protocol version and refuse a peer speaking another
//! one with a message naming both versions, so an operator mixing releases
//! sees at once which side to upgrade. Every step runs under one deadline:
//! a peer that connects and says nothing must not hold a task forever.

use std::time::Duration;

use futures::{SinkExt, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::time::{Instant, timeout_at};
use tokio_util::codec::Framed;

use super::codec::{AgentCodec, MasterCodec, ProtocolError};

/// Anything a link runs over: a TLS stream in production, a plain one in
/// some tests.
pub trait LinkIo: AsyncRead + AsyncWrite + Send + Unpin + 'static {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> LinkIo for T {}

/// A link's connection, whatever it runs over.
pub type LinkStream = Box<dyn LinkIo>;

/// The read side of a link after the handshake: the bytes the handshake
/// already read, then the connection.
pub type LinkReader<C> = tokio_util::codec::FramedRead<
    tokio::io::Chain<std::io::Cursor<bytes::BytesMut>, tokio::io::ReadHalf<LinkStream>>,
    C,
>;

/// The write side of a link after the handshake.
pub type LinkWriter = tokio::io::WriteHalf<LinkStream>;

/// Splits a connection whose handshake is done into a frame reader and the
/// raw write half. Whatever the handshake read past its last frame (the
/// peer may send its next frame right behind it, in the same segment) is
/// replayed in front of the connection. Not pushed into a new `FramedRead`'s
/// buffer: `FramedRead` reads its socket before decoding bytes it did not
/// read itself, so such a frame would sit undecoded until the peer sent
/// something else, while the peer waits for an answer.
pub fn split_after_handshake<C: Default>(framed: Framed<LinkStream, C>) -> (LinkReader<C>, LinkWriter) {
    let parts = framed.into_parts();
    let (read_half, write_half) = tokio::io::split(parts.io);
    let early = std::io::Cursor::new(parts.read_buf);
    (tokio_util::codec::FramedRead::new(tokio::io::AsyncReadExt::chain(early, read_half), C::default()), write_half)
}
use super::messages::{AgentFrame, EnrollRequest, Enrolled, Hello, MasterFrame, Welcome};

/// Agent side: sends `hello`, waits for the master's answer within `timeout`.
/// A `Welcome` with another protocol version is answered with
/// `AgentFrame::Refused` and returns [`ProtocolError::VersionMismatch`].
pub async fn agent_handshake<T: AsyncRead + AsyncWrite + Unpin>(
    framed: &mut Framed<T, AgentCodec>,
    hello: Hello,
    timeout: Duration,
) -> Result<Welcome, ProtocolError> {
    let deadline = Instant::now() + timeout;
    let ours = hello.protocol_version;
    timeout_at(deadline, framed.send(AgentFrame::Hello(hello)))
        .await
        .map_err(|_| ProtocolError::Timeout("sending Hello to the master"))??;
    let frame = timeout_at(deadline, framed.next())
        .await
        .map_err(|_| ProtocolError::Timeout("waiting for the master's Welcome"))?
        .ok_or(ProtocolError::Closed)??;
    match frame {
        MasterFrame::Welcome(welcome) if welcome.protocol_version == ours => Ok(welcome),
        MasterFrame::Welcome(welcome) => {
            let theirs = welcome.protocol_version;
            let reason = format!("protocol version mismatch: agent speaks {ours}, master speaks {theirs}");
            // Best effort: the master may already be gone; the mismatch is the
            // error worth reporting either way.
            let _ = timeout_at(deadline, framed.send(AgentFrame::Refused { reason })).await;
            Err(ProtocolError::VersionMismatch { ours, theirs })
        }
        MasterFrame::Refused { reason } => Err(ProtocolError::Refused { reason }),
        MasterFrame::Request { request_id, .. } => {
            Err(ProtocolError::Unexpected(format!("request {request_id} before the handshake finished")))
        }
        MasterFrame::Ack { seq } => Err(ProtocolError::Unexpected(format!("ack {seq} before the handshake finished"))),
        MasterFrame::Enrolled(_) => Err(ProtocolError::Unexpected("a certificate, unasked".into())),
        MasterFrame::Heartbeat => Err(ProtocolError::Unexpected("a heartbeat before the handshake finished".into())),
    }
}

/// Agent side of an enrollment: sends `request`, waits for the certificate.
pub async fn agent_enroll<T: AsyncRead + AsyncWrite + Unpin>(
    framed: &mut Framed<T, AgentCodec>,
    request: EnrollRequest,
    timeout: Duration,
) -> Result<Enrolled, ProtocolError> {
    let deadline = Instant::now() + timeout;
    timeout_at(deadline, framed.send(AgentFrame::Enroll(request)))
        .await
        .map_err(|_| ProtocolError::Timeout("sending the enrollment to the master"))??;
    let frame = timeout_at(deadline, framed.next())
        .await
        .map_err(|_| ProtocolError::Timeout("waiting for the master's certificate"))?
        .ok_or(ProtocolError::Closed)??;
    match frame {
        MasterFrame::Enrolled(enrolled) => Ok(enrolled),
        MasterFrame::Refused { reason } => Err(ProtocolError::Refused { reason }),
        other => Err(ProtocolError::Unexpected(format!("expected a certificate, got {other:?}"))),
    }
}

/// How an agent opens a connection: with its `Hello`, or (without a
/// certificate yet) asking for one.
#[derive(Debug)]
pub enum Opening {
    Hello(Hello),
    Enroll(EnrollRequest),
}

/// Master side, first half: waits for the agent's first frame until
/// `deadline` and checks its protocol version, answering
/// `MasterFrame::Refused` (and [`ProtocolError::VersionMismatch`]) when the
/// agent speaks another one. The caller answers the opening: [`welcome`],
/// `Refused`, or `Enrolled`.
pub async fn master_open<T: AsyncRead + AsyncWrite + Unpin>(
    framed: &mut Framed<T, MasterCodec>,
    ours: u32,
    deadline: Instant,
) -> Result<Opening, ProtocolError> {
    let frame = timeout_at(deadline, framed.next())
        .await
        .map_err(|_| ProtocolError::Timeout("waiting for the agent's Hello"))?
        .ok_or(ProtocolError::Closed)??;
    let (theirs, opening) = match frame {
        AgentFrame::Hello(hello) => (hello.protocol_version, Opening::Hello(hello)),
        AgentFrame::Enroll(request) => (request.protocol_version, Opening::Enroll(request)),
        AgentFrame::Refused { reason } => return Err(ProtocolError::Refused { reason }),
        other => {
            let what = match other {
                AgentFrame::Response { .. } => "a response",
                AgentFrame::Report { .. } => "a report",
                _ => "an event",
            };
            let reason = format!("expected Hello as the first frame, got {what}");
            refuse(framed, reason.clone(), deadline).await;
            return Err(ProtocolError::Unexpected(reason));
        }
    };
    if theirs != ours {
        let reason = format!("protocol version mismatch: master speaks {ours}, agent speaks {theirs}");
        refuse(framed, reason, deadline).await;
        return Err(ProtocolError::VersionMismatch { ours, theirs });
    }
    Ok(opening)
}

/// Master side: answers `Refused { reason }`, best effort (the agent may
/// be gone; the refusal is logged by the caller either way).
pub async fn refuse<T: AsyncRead + AsyncWrite + Unpin>(
    framed: &mut Framed<T, MasterCodec>,
    reason: String,
    deadline: Instant,
) {
    let _ = timeout_at(deadline, framed.send(MasterFrame::Refused { reason })).await;
}

/// Master side, second half: welcomes an agent whose `Hello` was accepted.
pub async fn welcome<T: AsyncRead + AsyncWrite + Unpin>(
    framed: &mut Framed<T, MasterCodec>,
    welcome: Welcome,
    deadline: Instant,
) -> Result<(), ProtocolError> {
    timeout_at(deadline, framed.send(MasterFrame::Welcome(welcome)))
        .await
        .map_err(|_| ProtocolError::Timeout("sending Welcome to the agent"))?
}

/// Master side, whole: waits for the agent's `Hello` within `timeout`, then
/// answers `welcome`, or `MasterFrame::Refused` (and
/// [`ProtocolError::VersionMismatch`]) when the agent speaks another
/// protocol version. An enrollment is refused: this is for masters (and
/// tests playing one) that check nobody's certificate.
pub async fn master_handshake<T: AsyncRead + AsyncWrite + Unpin>(
    framed: &mut Framed<T, MasterCodec>,
    welcome_frame: Welcome,
    timeout: Duration,
) -> Result<Hello, ProtocolError> {
    let deadline = Instant::now() + timeout;
    match master_open(framed, welcome_frame.protocol_version, deadline).await? {
        Opening::Hello(hello) => {
            welcome(framed, welcome_frame, deadline).await?;
            Ok(hello)
        }
        Opening::Enroll(_) => {
            let reason = "this master does not enroll agents".to_string();
            refuse(framed, reason.clone(), deadline).await;
            Err(ProtocolError::Unexpected(reason))
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::ids::NodeId;
    use crate::protocol::messages::PROTOCOL_VERSION;

    fn hello(version: u32) -> Hello {
        Hello {
            protocol_version: version,
            node_id: NodeId::new("node-1"),
            address: "127.0.0.1".into(),
            instance_root: "/tmp/x".into(),
            port_range: (1000, 2000),
            labels: BTreeMap::new(),
            agent_version: "test".into(),
            cgroups: false,
            resource_limits: false,
            inventory: vec![],
            unrecorded: vec![],
            simulated: false,
        }
    }

    fn welcome(version: u32) -> Welcome {
        Welcome { protocol_version: version, heartbeat_interval_ms: 250, term: 0 }
    }

    fn pair() -> (Framed<tokio::io::DuplexStream, MasterCodec>, Framed<tokio::io::DuplexStream, AgentCodec>) {
        let (m, a) = tokio::io::duplex(64 * 1024);
        (Framed::new(m, MasterCodec::new()), Framed::new(a, AgentCodec::new()))
    }

    const T: Duration = Duration::from_secs(5);

    #[tokio::test]
    async fn matching_versions_complete_the_handshake() {
        let (mut m, mut a) = pair();
        let (got_hello, got_welcome) = tokio::join!(
            master_handshake(&mut m, welcome(PROTOCOL_VERSION), T),
            agent_handshake(&mut a, hello(PROTOCOL_VERSION), T)
        );
        assert_eq!(got_hello.unwrap(), hello(PROTOCOL_VERSION));
        assert_eq!(got_welcome.unwrap(), welcome(PROTOCOL_VERSION));
    }

    #[tokio::test]
    async fn master_refuses_an_agent_with_another_version() {
        let (mut m, mut a) = pair();
        let (master, agent) =
            tokio::join!(master_handshake(&mut m, welcome(1), T), agent_handshake(&mut a, hello(2), T));
        assert!(matches!(master, Err(ProtocolError::VersionMismatch { ours: 1, theirs: 2 })), "{master:?}");
        match agent {
            Err(ProtocolError::Refused { reason }) => {
                assert_eq!(reason, "protocol version mismatch: master speaks 1, agent speaks 2")
            }
            other => panic!("agent got {other:?}"),
        }
    }

    #[tokio::test]
    async fn agent_refuses_a_master_with_another_version() {
        // A master that skips its own check (e.g. an older release) and
        // welcomes with version 3: the agent must refuse on its side.
        let (mut m, mut a) = pair();
        let master = async {
            let first = m.next().await.unwrap().unwrap();
            assert!(matches!(first, AgentFrame::Hello(_)));
            m.send(MasterFrame::Welcome(welcome(3))).await.unwrap();
            m.next().await.unwrap().unwrap()
        };
        let (agent, refusal) = tokio::join!(agent_handshake(&mut a, hello(1), T), master);
        assert!(matches!(agent, Err(ProtocolError::VersionMismatch { ours: 1, theirs: 3 })), "{agent:?}");
        match refusal {
            AgentFrame::Refused { reason } => {
                assert_eq!(reason, "protocol version mismatch: agent speaks 1, master speaks 3")
            }
            other => panic!("master got {other:?}"),
        }
    }

    #[tokio::test]
    async fn silent_peers_time_out() {
        let (mut m, mut a) = pair();
        let short = Duration::from_millis(100);
        let started = Instant::now();
        let master = master_handshake(&mut m, welcome(1), short).await;
        assert!(matches!(master, Err(ProtocolError::Timeout(_))), "{master:?}");
        // The agent's Hello goes out but nobody answers.
        let agent = agent_handshake(&mut a, hello(1), short).await;
        assert!(matches!(agent, Err(ProtocolError::Timeout(_))), "{agent:?}");
        assert!(started.elapsed() < Duration::from_secs(2));
    }

    #[tokio::test]
    async fn a_closed_connection_is_reported_as_closed() {
        let (m, mut a) = pair();
        drop(m);
        let agent = agent_handshake(&mut a, hello(1), T).await;
        // Sending may fail (broken pipe) or the read sees the end: both are
        // a dead peer, never a hang.
        assert!(matches!(agent, Err(ProtocolError::Closed) | Err(ProtocolError::Io(_))), "{agent:?}");
    }

    #[tokio::test]
    async fn master_refuses_a_first_frame_that_is_not_hello() {
        let (mut m, mut a) = pair();
        a.send(AgentFrame::Event(crate::protocol::messages::AgentEvent::Heartbeat)).await.unwrap();
        let master = master_handshake(&mut m, welcome(1), T).await;
        assert!(matches!(master, Err(ProtocolError::Unexpected(_))), "{master:?}");
        assert!(matches!(a.next().await, Some(Ok(MasterFrame::Refused { .. }))));
    }
}
