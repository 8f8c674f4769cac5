//! Property tests of the wire codec: frames made of random contents
//! survive encoding, any split of the byte stream and decoding, in order;
//! and random bytes (hostile frames) never panic either decoder nor make
//! it hold more than one frame's worth of memory.

use std::collections::BTreeMap;

use bytes::BytesMut;
use proptest::prelude::*;
use tokio_util::codec::{Decoder, Encoder};

use super::codec::{AgentCodec, MasterCodec, ProtocolError};
use super::messages::*;
use crate::ids::{InstanceId, NodeId};

fn text() -> impl Strategy<Value = String> {
    proptest::string::string_regex("(?s).{0,40}").expect("regex")
}

fn instance() -> impl Strategy<Value = InstanceId> {
    "[a-z][a-z0-9-]{0,30}".prop_map(InstanceId::new)
}

fn bytes() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(any::<u8>(), 0..300)
}

fn request() -> impl Strategy<Value = AgentRequest> {
    prop_oneof![
        (instance(), any::<u32>(), bytes()).prop_map(|(instance, seq, bytes)| AgentRequest::InstallData {
            instance,
            seq,
            bytes
        }),
        instance().prop_map(|instance| AgentRequest::InstallEnd { instance }),
        (
            instance(),
            any::<u64>(),
            proptest::collection::vec((text(), bytes(), any::<u32>()), 0..4),
            proptest::option::of(proptest::collection::vec((text(), text()), 0..4)),
        )
            .prop_map(|(instance, generation, files, env)| AgentRequest::WriteFiles {
                instance,
                generation,
                files: files.into_iter().map(|(path, contents, mode)| RenderedFile { path, contents, mode }).collect(),
                env,
            }),
        (instance(), any::<u64>(), any::<u64>()).prop_map(|(instance, generation, settle_ms)| AgentRequest::Start {
            instance,
            generation,
            settle_ms
        }),
        (instance(), any::<u64>()).prop_map(|(instance, generation)| AgentRequest::Stop { instance, generation }),
        (instance(), any::<u64>(), text(), proptest::collection::vec(text(), 0..4), any::<u64>()).prop_map(
            |(instance, generation, hook, argv, timeout_ms)| AgentRequest::RunHook {
                instance,
                generation,
                hook,
                argv,
                timeout_ms
            }
        ),
        (instance(), any::<u64>(), any::<i32>()).prop_map(|(instance, generation, signal)| AgentRequest::Signal {
            instance,
            generation,
            signal
        }),
        Just(AgentRequest::Ping),
        instance().prop_map(|instance| AgentRequest::InstallAbort { instance }),
    ]
}

fn master_frame() -> impl Strategy<Value = MasterFrame> {
    prop_oneof![
        (any::<u32>(), any::<u64>(), any::<i64>()).prop_map(|(protocol_version, heartbeat_interval_ms, term)| {
            MasterFrame::Welcome(Welcome { protocol_version, heartbeat_interval_ms, term })
        }),
        text().prop_map(|reason| MasterFrame::Refused { reason }),
        (any::<u64>(), any::<i64>(), request()).prop_map(|(request_id, term, body)| MasterFrame::Request {
            request_id,
            term,
            body
        }),
        any::<u64>().prop_map(|seq| MasterFrame::Ack { seq }),
        (bytes(), bytes())
            .prop_map(|(certificate_der, ca_der)| MasterFrame::Enrolled(Enrolled { certificate_der, ca_der })),
        Just(MasterFrame::Heartbeat),
    ]
}

fn report() -> impl Strategy<Value = InstanceReport> {
    (instance(), any::<u64>(), any::<bool>(), any::<bool>(), any::<Option<u32>>()).prop_map(
        |(instance, generation, desired_running, running, pid)| InstanceReport {
            instance,
            generation,
            desired_running,
            running,
            pid,
        },
    )
}

fn event() -> impl Strategy<Value = AgentEvent> {
    prop_oneof![
        Just(AgentEvent::Heartbeat),
        (
            instance(),
            any::<u32>(),
            any::<Option<i32>>(),
            any::<Option<i32>>(),
            text(),
            any::<Option<u64>>(),
            any::<(u32, u32)>()
        )
            .prop_map(
                |(instance, pid, exit_code, signal, stderr_tail, restart_in_ms, (attempt, max_attempts))| {
                    AgentEvent::ProcessExited {
                        instance,
                        pid,
                        exit_code,
                        signal,
                        stderr_tail,
                        restart_in_ms,
                        attempt,
                        max_attempts,
                    }
                }
            ),
        (instance(), any::<u64>(), any::<u32>()).prop_map(|(instance, generation, pid)| AgentEvent::ProcessSpawned {
            instance,
            generation,
            pid
        }),
        (instance(), any::<Option<u32>>(), proptest::option::of(text()))
            .prop_map(|(instance, pid, error)| AgentEvent::ProcessRestarted { instance, pid, error }),
    ]
}

fn agent_frame() -> impl Strategy<Value = AgentFrame> {
    prop_oneof![
        (
            any::<u32>(),
            "[a-z0-9-]{1,20}",
            text(),
            text(),
            any::<(u16, u16)>(),
            proptest::collection::btree_map(text(), text(), 0..4),
            proptest::collection::vec(report(), 0..5),
            (any::<(bool, bool, bool)>(), proptest::collection::vec("[a-z0-9-]{1,20}", 0..3)),
        )
            .prop_map(
                |(v, node, address, root, ports, labels, inventory, ((cgroups, limits, simulated), unrecorded))| {
                    AgentFrame::Hello(Hello {
                        protocol_version: v,
                        node_id: NodeId::new(node),
                        address,
                        instance_root: root,
                        port_range: ports,
                        labels: labels.into_iter().collect::<BTreeMap<_, _>>(),
                        agent_version: "x".into(),
                        cgroups,
                        resource_limits: limits,
                        inventory,
                        unrecorded: unrecorded.into_iter().map(InstanceId::new).collect(),
                        simulated,
                    })
                }
            ),
        text().prop_map(|reason| AgentFrame::Refused { reason }),
        event().prop_map(AgentFrame::Event),
        (any::<u64>(), event()).prop_map(|(seq, event)| AgentFrame::Report { seq, event }),
        (any::<u64>(), prop_oneof![Just(AgentResponse::Pong), Just(AgentResponse::Healthy)])
            .prop_map(|(request_id, body)| AgentFrame::Response { request_id, body }),
        (any::<u32>(), "[a-z0-9-]{1,20}", text(), text(), bytes()).prop_map(|(v, node, id, secret, key)| {
            AgentFrame::Enroll(EnrollRequest {
                protocol_version: v,
                node_id: NodeId::new(node),
                token_id: id,
                token_secret: secret,
                public_key: key,
            })
        }),
    ]
}

/// Encodes `frames` with `enc`, feeds the bytes to `dec` in pieces cut at
/// `cuts`, and returns what came out.
fn through<F: Clone, E: Encoder<F, Error = ProtocolError>, D: Decoder<Item = F, Error = ProtocolError>>(
    frames: &[F],
    mut enc: E,
    mut dec: D,
    cuts: &[usize],
) -> Vec<F> {
    let mut wire = BytesMut::new();
    for f in frames {
        enc.encode(f.clone(), &mut wire).expect("encode");
    }
    let wire = wire.freeze();
    let mut points: Vec<usize> = cuts.iter().map(|c| c % (wire.len() + 1)).collect();
    points.push(wire.len());
    points.sort_unstable();
    let (mut buf, mut out, mut from) = (BytesMut::new(), Vec::new(), 0);
    for to in points {
        buf.extend_from_slice(&wire[from..to]);
        from = to;
        while let Some(f) = dec.decode(&mut buf).expect("decode") {
            out.push(f);
        }
    }
    assert!(buf.is_empty(), "{} bytes left undecoded", buf.len());
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn master_frames_survive_any_split(frames in proptest::collection::vec(master_frame(), 1..6),
                                       cuts in proptest::collection::vec(any::<usize>(), 0..8)) {
        prop_assert_eq!(through(&frames, MasterCodec::new(), AgentCodec::new(), &cuts), frames);
    }

    #[test]
    fn agent_frames_survive_any_split(frames in proptest::collection::vec(agent_frame(), 1..6),
                                      cuts in proptest::collection::vec(any::<usize>(), 0..8)) {
        prop_assert_eq!(through(&frames, AgentCodec::new(), MasterCodec::new(), &cuts), frames);
    }

    /// Hostile bytes: a plausible length prefix, then anything. Each
    /// decoder answers a frame, "more", or an error, never panics, and never
    /// holds more than the bytes it was given (no allocation from a length).
    #[test]
    fn random_bytes_never_panic_a_decoder(len in 0u32..2000, body in proptest::collection::vec(any::<u8>(), 0..2000)) {
        for master in [true, false] {
            let mut buf = BytesMut::new();
            buf.extend_from_slice(&len.to_be_bytes());
            buf.extend_from_slice(&body);
            let given = buf.len();
            let result = if master {
                MasterCodec::new().decode(&mut buf).map(|f| f.is_some())
            } else {
                AgentCodec::new().decode(&mut buf).map(|f| f.is_some())
            };
            prop_assert!(buf.capacity() <= given.max(64) + MAX_FRAME_BYTES.min(len as usize + 4));
            if let Ok(false) = result {
                prop_assert!((len as usize) > body.len(), "a whole frame was there and nothing came out");
            }
        }
    }
}
