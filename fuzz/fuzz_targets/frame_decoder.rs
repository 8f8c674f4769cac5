//! Hostile bytes on the agent link, fed to both decoders in pieces: a
//! frame, "more", or an error; never a panic, never a buffer past one frame.
#![no_main]

use bytes::BytesMut;
use flotilla::protocol::codec::{AgentCodec, MasterCodec};
use libfuzzer_sys::fuzz_target;
use tokio_util::codec::Decoder;

fn feed<D: Decoder>(mut dec: D, data: &[u8], step: usize) {
    let mut buf = BytesMut::new();
    for piece in data.chunks(step.max(1)) {
        buf.extend_from_slice(piece);
        loop {
            match dec.decode(&mut buf) {
                Ok(Some(_)) => continue,
                Ok(None) => break,
                Err(_) => return,
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let step = data.first().map_or(1, |b| *b as usize + 1);
    feed(MasterCodec::new(), data, step);
    feed(AgentCodec::new(), data, step);
});
