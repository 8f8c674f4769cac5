//! The writer task of a node manager: it owns the socket's write half.

use std::time::Duration;

use futures::SinkExt;
use tokio::sync::mpsc;
use tokio_util::codec::FramedWrite;

use crate::actors::node_link::{NodeLink, Outgoing};
use crate::protocol::codec::MasterCodec;
use crate::protocol::handshake::LinkWriter;
use crate::protocol::messages::MasterFrame;

/// Owns the socket's write half. A write that takes longer than the send
/// deadline means the agent stopped reading: the link is closed.
pub(super) async fn write_frames(
    mut writer: FramedWrite<LinkWriter, MasterCodec>,
    mut rx: mpsc::Receiver<Outgoing>,
    link: NodeLink,
    deadline: Duration,
    beat: Duration,
) {
    let mut permits = Vec::new();
    // The agent takes a link it hears nothing on for dead: a heartbeat
    // goes out whenever nothing else did for a beat.
    let mut tick = tokio::time::interval(beat);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_write = tokio::time::Instant::now();
    loop {
        let (frame, permit) = tokio::select! {
            f = rx.recv() => match f {
                Some(f) => f,
                None => break,
            },
            _ = link.closed.cancelled() => break,
            _ = tick.tick() => {
                if last_write.elapsed() < beat {
                    continue;
                }
                (MasterFrame::Heartbeat, None)
            }
        };
        if link.panic_injected() && link.take_injected_writer_panic() {
            panic!("a panic injected by a test hook (link writer of {})", link.node);
        }
        last_write = tokio::time::Instant::now();
        permits.extend(permit);
        // Every frame already queued goes out in the same write: under load
        // one syscall carries many commands, not one each.
        let mut batch = vec![frame];
        while batch.len() < 64 {
            match rx.try_recv() {
                Ok((f, p)) => {
                    permits.extend(p);
                    batch.push(f);
                }
                Err(_) => break,
            }
        }
        // Checked again at the socket: a request queued while this master
        // could act must not leave once it cannot (its lease may have
        // expired, another master may lead). The link is closed instead:
        // its requests fail at once, and the agent dials again (another
        // master, or this one once it acts again).
        if !link.may_act() && batch.iter().any(|f| matches!(f, MasterFrame::Request { .. })) {
            tracing::error!(node = %link.node, "this master's leadership is suspended: closing the link rather than sending its requests");
            link.close();
            break;
        }
        let write = async {
            for f in batch {
                // And before each request of the batch (the write of the
                // ones before it may have taken a while).
                if matches!(f, MasterFrame::Request { .. }) && !link.may_act() {
                    return Err(crate::protocol::codec::ProtocolError::Unexpected(
                        "this master's leadership lapsed while its requests were being written".into(),
                    ));
                }
                writer.feed(f).await?;
            }
            writer.flush().await
        };
        let written = tokio::time::timeout(deadline, write).await;
        // The chunks are in the socket (or the link is going): their
        // budget goes back.
        permits.clear();
        match written {
            Ok(Ok(())) => {
                // A package chunk leaves a 1 MiB buffer behind: with a
                // thousand links, give it back.
                if writer.write_buffer().capacity() > 64 * 1024 {
                    *writer.write_buffer_mut() = bytes::BytesMut::new();
                }
            }
            Ok(Err(e)) => {
                tracing::warn!(node = %link.node, error = %e, "agent connection write failed");
                link.agent_ended();
                break;
            }
            Err(_) => {
                tracing::warn!(node = %link.node, after = ?deadline, "agent is not reading (a write timed out); closing its link");
                link.close_stalled();
                break;
            }
        }
    }
    link.close();
}
