//! Hostile bytes on the agent link, fed to both decoders in pieces: a
//! frame, "more", or an error; never a panic, and never a buffer past one
//! frame: whenever a decoder answers "more", what it left buffered is
//! less than its frame cap plus the 4-byte prefix (RELIABILITY.md). The
//! cap is lowered to 1-4096 bytes (as for a peer not identified yet), so
//! inputs of a few KB can cross it.
#![no_main]

use bytes::BytesMut;
use flotilla::protocol::codec::{AgentCodec, FrameCodec, MasterCodec};
use libfuzzer_sys::fuzz_target;
use tokio_util::codec::Decoder;

fn feed<In, Out>(mut dec: FrameCodec<In, Out>, data: &[u8], step: usize, cap: usize)
where
    FrameCodec<In, Out>: Decoder,
{
    dec.set_max_frame(cap);
    assert_eq!(dec.max_frame(), cap);
    let mut buf = BytesMut::new();
    for piece in data.chunks(step.max(1)) {
        buf.extend_from_slice(piece);
        loop {
            match dec.decode(&mut buf) {
                Ok(Some(_)) => continue,
                Ok(None) => {
                    assert!(
                        buf.len() < 4 + cap,
                        "the decoder holds {} bytes, past one frame of at most {cap} bytes",
                        buf.len()
                    );
                    break;
                }
                Err(_) => return,
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let step = data.first().map_or(1, |b| *b as usize + 1);
    let cap = data.get(1..3).map_or(4096, |b| usize::from(u16::from_le_bytes([b[0], b[1]])) % 4096 + 1);
    feed(MasterCodec::new(), data, step, cap);
    feed(AgentCodec::new(), data, step, cap);
});
