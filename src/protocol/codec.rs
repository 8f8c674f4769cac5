//! The wire codec of the master <-> agent link: 4-byte big-endian length
//! prefixed frames whose payload is one bincode 2 (serde) message.
//!
//! This module is the only place bincode touches the wire, so the framing
//! rules live in one spot: a frame may not exceed [`MAX_FRAME_BYTES`]; an
//! oversized length prefix is refused from the 4 header bytes alone, before
//! any buffer grows (`LengthDelimitedCodec` checks the length before it
//! reserves); a payload must decode to exactly one message with no bytes
//! left over.

use std::io;
use std::marker::PhantomData;

use bytes::{Bytes, BytesMut};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio_util::codec::{Decoder, Encoder, LengthDelimitedCodec};

use super::messages::{AgentFrame, MAX_FRAME_BYTES, MasterFrame};

/// Everything that can go wrong on the link.
#[derive(Debug, thiserror::Error)]
pub enum ProtocolError {
    #[error("i/o error on the agent link")]
    Io(#[from] io::Error),
    #[error("frame of {len} bytes is over the limit of {max} bytes")]
    FrameTooLarge { len: u64, max: usize },
    #[error("cannot decode frame: {0}")]
    Decode(String),
    #[error("cannot encode frame: {0}")]
    Encode(String),
    #[error("the peer closed the connection")]
    Closed,
    #[error("protocol version mismatch: we speak {ours}, the peer speaks {theirs}")]
    VersionMismatch { ours: u32, theirs: u32 },
    #[error("the peer refused the connection: {reason}")]
    Refused { reason: String },
    #[error("timed out {0}")]
    Timeout(&'static str),
    #[error("unexpected frame: {0}")]
    Unexpected(String),
}

/// Length-delimited bincode frames: decodes `In`, encodes `Out`.
pub struct FrameCodec<In, Out> {
    inner: LengthDelimitedCodec,
    // `fn` pointers keep the codec Send + Sync whatever In/Out are.
    _types: PhantomData<fn(Out) -> In>,
}

/// The master's side: reads agent frames, writes master frames.
pub type MasterCodec = FrameCodec<AgentFrame, MasterFrame>;
/// The agent's side: reads master frames, writes agent frames.
pub type AgentCodec = FrameCodec<MasterFrame, AgentFrame>;

impl<In, Out> FrameCodec<In, Out> {
    pub fn new() -> Self {
        let inner = LengthDelimitedCodec::builder()
            .length_field_length(4)
            .big_endian()
            .max_frame_length(MAX_FRAME_BYTES)
            .new_codec();
        FrameCodec { inner, _types: PhantomData }
    }
}

impl<In, Out> FrameCodec<In, Out> {
    /// Lowers (or restores) the largest frame this codec reads: a peer not
    /// identified yet gets a small one, so it cannot make the master buffer
    /// megabytes before anyone knows who it is.
    pub fn set_max_frame(&mut self, bytes: usize) {
        self.inner.set_max_frame_length(bytes.min(MAX_FRAME_BYTES));
    }

    /// The largest frame payload this codec reads now: while
    /// [`decode`](Decoder::decode) answers "more", the caller's buffer
    /// holds less than this plus the 4-byte prefix (the fuzz target
    /// `frame_decoder` checks it).
    pub fn max_frame(&self) -> usize {
        self.inner.max_frame_length()
    }
}

impl<In, Out> Default for FrameCodec<In, Out> {
    fn default() -> Self {
        Self::new()
    }
}

impl<In, Out> std::fmt::Debug for FrameCodec<In, Out> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FrameCodec").field("max_frame_bytes", &MAX_FRAME_BYTES).finish()
    }
}

fn bincode_config() -> impl bincode::config::Config {
    bincode::config::standard().with_limit::<{ MAX_FRAME_BYTES }>()
}

/// Decodes one message from a whole payload; leftover bytes are an error
/// (they would mean the peer and we disagree on the message layout).
pub(crate) fn decode_payload<T: DeserializeOwned>(payload: &[u8]) -> Result<T, ProtocolError> {
    let (value, used) = bincode::serde::decode_from_slice::<T, _>(payload, bincode_config())
        .map_err(|e| ProtocolError::Decode(e.to_string()))?;
    if used != payload.len() {
        return Err(ProtocolError::Decode(format!("{} trailing bytes after the message", payload.len() - used)));
    }
    Ok(value)
}

/// Encodes one message into a payload, refusing one over the frame limit.
pub(crate) fn encode_payload<T: Serialize>(value: &T) -> Result<Vec<u8>, ProtocolError> {
    let payload =
        bincode::serde::encode_to_vec(value, bincode_config()).map_err(|e| ProtocolError::Encode(e.to_string()))?;
    if payload.len() > MAX_FRAME_BYTES {
        return Err(ProtocolError::FrameTooLarge { len: payload.len() as u64, max: MAX_FRAME_BYTES });
    }
    Ok(payload)
}

/// True when `e` is `LengthDelimitedCodec` refusing a length prefix.
fn is_length_error(e: &io::Error) -> bool {
    e.get_ref().is_some_and(|inner| inner.is::<tokio_util::codec::LengthDelimitedCodecError>())
}

impl<In: DeserializeOwned, Out> Decoder for FrameCodec<In, Out> {
    type Item = In;
    type Error = ProtocolError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<In>, ProtocolError> {
        match self.inner.decode(src) {
            Ok(Some(frame)) => {
                // A no-op unless a recorder is installed (the master's).
                metrics::counter!("flotilla_agent_link_bytes_total", "direction" => "received")
                    .increment(frame.len() as u64 + 4);
                decode_payload(&frame).map(Some)
            }
            Ok(None) => Ok(None),
            Err(e) if is_length_error(&e) => {
                // The inner codec refuses in its header state without
                // consuming, so the prefix is still the first 4 bytes.
                let len = src.get(..4).map_or(0, |h| u64::from(u32::from_be_bytes([h[0], h[1], h[2], h[3]])));
                Err(ProtocolError::FrameTooLarge { len, max: MAX_FRAME_BYTES })
            }
            Err(e) => Err(ProtocolError::Io(e)),
        }
    }

    fn decode_eof(&mut self, buf: &mut BytesMut) -> Result<Option<In>, ProtocolError> {
        match self.decode(buf)? {
            Some(item) => Ok(Some(item)),
            None if buf.is_empty() => Ok(None),
            None => Err(ProtocolError::Decode(format!(
                "the connection closed in the middle of a frame ({} bytes buffered)",
                buf.len()
            ))),
        }
    }
}

impl<In, Out: Serialize> Encoder<Out> for FrameCodec<In, Out> {
    type Error = ProtocolError;

    fn encode(&mut self, item: Out, dst: &mut BytesMut) -> Result<(), ProtocolError> {
        let payload = encode_payload(&item)?;
        metrics::counter!("flotilla_agent_link_bytes_total", "direction" => "sent").increment(payload.len() as u64 + 4);
        self.inner.encode(Bytes::from(payload), dst).map_err(ProtocolError::Io)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::ids::{InstanceId, NodeId};
    use crate::protocol::messages::*;

    fn inst() -> InstanceId {
        InstanceId::new("shop-db-0")
    }

    fn failure() -> CommandFailure {
        CommandFailure {
            kind: FailureKind::Start,
            message: "boom".into(),
            exit_code: Some(3),
            stderr_tail: "oops\n".into(),
            stdout_tail: "said\n".into(),
        }
    }

    fn requests() -> Vec<AgentRequest> {
        let file = RenderedFile { path: "conf/app.conf".into(), contents: b"port = 1\n".to_vec(), mode: 0o640 };
        vec![
            AgentRequest::InstallBegin(Box::new(InstallBegin {
                instance: inst(),
                cluster: crate::ids::ClusterId(uuid::Uuid::from_u128(7)),
                generation: 7,
                run_as: Some("app".into()),
                process: ProcessSpec {
                    start: vec!["bin/run".into(), "--fg".into()],
                    stop: Some(vec!["bin/stop".into()]),
                    pidfile: Some("run/app.pid".into()),
                    stop_grace_ms: 5000,
                    start_timeout_ms: 10_000,
                    env: vec![("A".into(), "b".into())],
                    health: Some(HealthProbe::Cmd { argv: vec!["bin/check".into()] }),
                    limits: Some(ResourceLimits { memory_bytes: Some(64 << 20), cpu: Some(0.5) }),
                },
                files: vec![file.clone()],
                package_sha256: "ab".repeat(32),
                package_size: 12345,
            })),
            AgentRequest::InstallData { instance: inst(), seq: 3, bytes: vec![0, 1, 2, 255] },
            AgentRequest::InstallEnd { instance: inst() },
            AgentRequest::WriteFiles {
                instance: inst(),
                generation: 8,
                files: vec![file],
                env: Some(vec![("JAVA_OPTS".into(), "-Xmx1g".into())]),
            },
            AgentRequest::Start { instance: inst(), generation: 9, settle_ms: 200 },
            AgentRequest::Stop { instance: inst(), generation: 10 },
            AgentRequest::Delete { instance: inst(), generation: 11 },
            AgentRequest::RunHook {
                instance: inst(),
                generation: 12,
                hook: "scale_in".into(),
                argv: vec!["bin/leave".into(), "--now".into()],
                timeout_ms: 30_000,
            },
            AgentRequest::CheckHealth { instance: inst(), timeout_ms: 5000 },
            AgentRequest::Signal { instance: inst(), generation: 13, signal: 1 },
            AgentRequest::Ping,
            AgentRequest::InstallAbort { instance: inst() },
        ]
    }

    fn responses() -> Vec<AgentResponse> {
        vec![
            AgentResponse::InstallReady { need_bytes: true },
            AgentResponse::InstallResult { files_written: 2 },
            AgentResponse::FilesWritten { changed: vec!["a".into(), "b/c".into()] },
            AgentResponse::Started { pid: 4242, already_running: false },
            AgentResponse::Stopped { was_running: true },
            AgentResponse::Deleted { existed: false },
            AgentResponse::HookDone { exit_code: 0, stdout_tail: "joined".into(), stderr_tail: String::new() },
            AgentResponse::Healthy,
            AgentResponse::Signalled { delivered: true },
            AgentResponse::Pong,
            AgentResponse::Failed(failure()),
            AgentResponse::InstallReceived { bytes: 1 << 20 },
        ]
    }

    fn events() -> Vec<AgentEvent> {
        vec![
            AgentEvent::Heartbeat,
            AgentEvent::ProcessRestarted { instance: inst(), pid: Some(43), error: None },
            AgentEvent::ProcessRestarted { instance: inst(), pid: None, error: Some("exit 1".into()) },
            AgentEvent::ProcessExited {
                instance: inst(),
                pid: 77,
                exit_code: None,
                signal: Some(9),
                stderr_tail: "killed".into(),
                restart_in_ms: Some(1000),
                attempt: 2,
                max_attempts: 3,
            },
            AgentEvent::ProcessSpawned { instance: inst(), generation: 4, pid: 99 },
        ]
    }

    pub(crate) fn hello(version: u32) -> Hello {
        Hello {
            protocol_version: version,
            node_id: NodeId::new("node-1"),
            address: "127.0.0.11".into(),
            instance_root: "/var/lib/flotilla/instances".into(),
            port_range: (20000, 20999),
            labels: BTreeMap::from([("zone".to_string(), "a".to_string())]),
            agent_version: "0.1.0".into(),
            cgroups: true,
            resource_limits: true,
            inventory: vec![InstanceReport {
                instance: inst(),
                generation: 4,
                desired_running: true,
                running: true,
                pid: Some(99),
            }],
            unrecorded: vec![InstanceId::new("web-db-2-abcdef")],
            simulated: false,
        }
    }

    fn master_frames() -> Vec<MasterFrame> {
        let mut frames = vec![
            MasterFrame::Welcome(Welcome { protocol_version: PROTOCOL_VERSION, heartbeat_interval_ms: 1000, term: 7 }),
            MasterFrame::Refused { reason: "no".into() },
            MasterFrame::Ack { seq: u64::MAX },
            MasterFrame::Enrolled(Enrolled { certificate_der: vec![0x30, 0x82, 1, 2], ca_der: vec![0x30; 40] }),
            MasterFrame::Heartbeat,
        ];
        frames.extend(requests().into_iter().enumerate().map(|(i, body)| MasterFrame::Request {
            request_id: i as u64,
            term: i as i64,
            body,
        }));
        frames
    }

    fn agent_frames() -> Vec<AgentFrame> {
        let mut frames = vec![
            AgentFrame::Hello(hello(PROTOCOL_VERSION)),
            AgentFrame::Refused { reason: "old master".into() },
            AgentFrame::Enroll(EnrollRequest {
                protocol_version: PROTOCOL_VERSION,
                node_id: NodeId::new("node-1"),
                token_id: "0123456789ab".into(),
                token_secret: "00112233445566778899aabbccddeeff".into(),
                public_key: vec![4; 65],
            }),
        ];
        frames.extend(
            responses()
                .into_iter()
                .enumerate()
                .map(|(i, body)| AgentFrame::Response { request_id: 100 + i as u64, body }),
        );
        frames.extend(events().into_iter().map(AgentFrame::Event));
        frames.extend(events().into_iter().enumerate().map(|(i, event)| AgentFrame::Report { seq: i as u64, event }));
        frames
    }

    #[test]
    fn every_frame_round_trips_both_ways() {
        let (mut master, mut agent) = (MasterCodec::new(), AgentCodec::new());
        for frame in master_frames() {
            let mut buf = BytesMut::new();
            master.encode(frame.clone(), &mut buf).unwrap();
            assert_eq!(agent.decode(&mut buf).unwrap(), Some(frame));
            assert!(buf.is_empty());
        }
        for frame in agent_frames() {
            let mut buf = BytesMut::new();
            agent.encode(frame.clone(), &mut buf).unwrap();
            assert_eq!(master.decode(&mut buf).unwrap(), Some(frame));
            assert!(buf.is_empty());
        }
    }

    #[test]
    fn every_inner_message_round_trips_on_its_own() {
        for r in requests() {
            assert_eq!(decode_payload::<AgentRequest>(&encode_payload(&r).unwrap()).unwrap(), r);
        }
        for r in responses() {
            assert_eq!(decode_payload::<AgentResponse>(&encode_payload(&r).unwrap()).unwrap(), r);
        }
        for e in events() {
            assert_eq!(decode_payload::<AgentEvent>(&encode_payload(&e).unwrap()).unwrap(), e);
        }
    }

    #[test]
    fn several_frames_in_one_buffer_decode_in_order() {
        let mut agent = AgentCodec::new();
        let mut buf = BytesMut::new();
        for f in agent_frames() {
            agent.encode(f, &mut buf).unwrap();
        }
        let mut master = MasterCodec::new();
        let mut got = Vec::new();
        while let Some(f) = master.decode(&mut buf).unwrap() {
            got.push(f);
        }
        assert_eq!(got, agent_frames());
    }

    #[test]
    fn truncated_frame_waits_then_fails_at_eof() {
        let mut buf = BytesMut::new();
        MasterCodec::new().encode(master_frames().remove(2), &mut buf).unwrap();
        let whole = buf.freeze();
        let mut codec = AgentCodec::new();
        let mut partial = BytesMut::new();
        for (i, byte) in whole.iter().enumerate() {
            assert!(codec.decode(&mut partial).unwrap().is_none(), "decoded before byte {i}");
            partial.extend_from_slice(&[*byte]);
        }
        assert_eq!(codec.decode(&mut partial).unwrap(), Some(master_frames().remove(2)));

        let mut cut = BytesMut::from(&whole[..whole.len() - 1]);
        let mut codec = AgentCodec::new();
        assert!(codec.decode(&mut cut).unwrap().is_none());
        assert!(matches!(codec.decode_eof(&mut cut), Err(ProtocolError::Decode(m)) if m.contains("middle of a frame")));
        // A clean end of stream is not an error.
        assert!(codec.decode_eof(&mut BytesMut::new()).unwrap().is_none());
    }

    #[test]
    fn oversized_length_prefix_is_refused_without_allocating() {
        let mut buf = BytesMut::from(&[0xFF, 0xFF, 0xFF, 0xFF, 1, 2][..]);
        let before = buf.capacity();
        let err = MasterCodec::new().decode(&mut buf).unwrap_err();
        assert!(matches!(err, ProtocolError::FrameTooLarge { len: 0xFFFF_FFFF, max: MAX_FRAME_BYTES }), "{err:?}");
        assert_eq!(buf.capacity(), before, "the buffer grew for a refused frame");

        let just_over = (MAX_FRAME_BYTES as u32 + 1).to_be_bytes();
        let mut buf = BytesMut::from(&just_over[..]);
        assert!(matches!(MasterCodec::new().decode(&mut buf), Err(ProtocolError::FrameTooLarge { .. })));
    }

    #[test]
    fn oversized_message_is_refused_on_encode() {
        let body = AgentRequest::InstallData { instance: inst(), seq: 0, bytes: vec![7; MAX_FRAME_BYTES + 1] };
        let err = MasterCodec::new()
            .encode(MasterFrame::Request { request_id: 1, term: 0, body }, &mut BytesMut::new())
            .unwrap_err();
        assert!(matches!(err, ProtocolError::FrameTooLarge { .. }), "{err:?}");
    }

    #[test]
    fn garbage_and_trailing_bytes_are_decode_errors() {
        let mut buf = BytesMut::from(&[0, 0, 0, 4, 0xFE, 0xFE, 0xFE, 0xFE][..]);
        assert!(matches!(MasterCodec::new().decode(&mut buf), Err(ProtocolError::Decode(_))));

        let mut payload = encode_payload(&AgentFrame::Event(AgentEvent::Heartbeat)).unwrap();
        payload.push(0);
        let mut buf = BytesMut::new();
        buf.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        buf.extend_from_slice(&payload);
        let err = MasterCodec::new().decode(&mut buf).unwrap_err();
        assert!(matches!(err, ProtocolError::Decode(ref m) if m.contains("trailing")), "{err:?}");
    }
}
