//! The one place storage values are turned into bytes and back (bincode 2
//! through serde, standard config, varint integers).
//!
//! Decoding is defensive: a value read from disk may be truncated or
//! corrupted, so every failure is a `StorageError::Codec`, never a panic; a
//! size limit stops a corrupted length prefix from allocating gigabytes, and
//! trailing bytes are refused so a half-overwritten value is not silently
//! accepted.

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::StorageError;

/// The largest value the codec encodes or decodes.
pub const MAX_VALUE_BYTES: usize = 64 * 1024 * 1024;

fn config() -> impl bincode::config::Config {
    bincode::config::standard().with_limit::<MAX_VALUE_BYTES>()
}

/// The scratch buffer [`encode`] keeps per thread is given back above this.
const SCRATCH_KEPT: usize = 64 * 1024;

thread_local! {
    static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Encodes `v`; values over [`MAX_VALUE_BYTES`] are refused (they could not
/// be decoded again).
///
/// Encoded into a per-thread scratch buffer, then copied out at its exact
/// size: one allocation per value, where growing a fresh `Vec` took five or
/// six on every state change (and left up to half of it unused while the
/// value waited for its batch).
pub fn encode<T: Serialize>(v: &T) -> Result<Vec<u8>, StorageError> {
    SCRATCH
        .try_with(|scratch| match scratch.try_borrow_mut() {
            Ok(mut buf) => {
                let out = encode_into(v, &mut buf);
                if buf.capacity() > SCRATCH_KEPT {
                    *buf = Vec::new();
                }
                out
            }
            // A value that encodes a value (never done) finds it borrowed.
            Err(_) => encode_into(v, &mut Vec::new()),
        })
        // During the thread's teardown the scratch may be gone.
        .unwrap_or_else(|_| encode_into(v, &mut Vec::new()))
}

/// Encodes `v` into `buf` (cleared first) and copies it out.
fn encode_into<T: Serialize>(v: &T, buf: &mut Vec<u8>) -> Result<Vec<u8>, StorageError> {
    buf.clear();
    bincode::serde::encode_into_std_write(v, &mut *buf, config())
        .map_err(|e| StorageError::Codec(format!("encode: {e}")))?;
    if buf.len() > MAX_VALUE_BYTES {
        return Err(StorageError::Codec(format!(
            "encode: value of {} bytes is over the {MAX_VALUE_BYTES} byte limit",
            buf.len()
        )));
    }
    Ok(buf.as_slice().to_vec())
}

/// Decodes a whole value from `bytes`; leftover bytes are an error.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, StorageError> {
    let (value, used) =
        bincode::serde::decode_from_slice(bytes, config()).map_err(|e| StorageError::Codec(format!("decode: {e}")))?;
    if used != bytes.len() {
        return Err(StorageError::Codec(format!("decode: {} trailing bytes after the value", bytes.len() - used)));
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use std::fmt::Debug;

    use super::*;
    use crate::storage::records::ClusterRecord;
    use crate::storage::testdata as td;

    /// Through the per-thread scratch buffer, values encode exactly as a
    /// fresh encoding does, whatever came before: a value larger than the
    /// scratch keeps, then a small one, and each comes out at its size.
    #[test]
    fn encodings_through_the_scratch_buffer_are_exact() {
        let fresh = |v: &Vec<u8>| bincode::serde::encode_to_vec(v, config()).unwrap();
        for v in [vec![1u8; 3 * SCRATCH_KEPT], vec![2u8; 10], Vec::new(), vec![3u8; 300]] {
            let out = encode(&v).unwrap();
            assert_eq!(out, fresh(&v));
            assert_eq!(out.capacity(), out.len(), "a value of {} bytes kept spare room", out.len());
        }
        SCRATCH.with(|s| assert!(s.borrow().capacity() <= SCRATCH_KEPT, "the scratch kept a large buffer"));
    }

    fn round_trip<T: Serialize + DeserializeOwned + PartialEq + Debug>(v: T) {
        let bytes = encode(&v).unwrap();
        let back: T = decode(&bytes).unwrap();
        assert_eq!(back, v);
    }

    /// An operation's header, as stored: its step results and plan live
    /// under their own keys.
    fn header(mut op: crate::storage::records::OperationRecord) -> crate::storage::records::OperationRecord {
        for s in &mut op.steps {
            s.results.clear();
        }
        op.resume = None;
        op
    }

    #[test]
    fn an_operation_header_carries_neither_results_nor_plan() {
        let c = td::cluster("web");
        let op = td::operation(&c, td::T0);
        assert!(!op.steps[0].results.is_empty() && op.resume.is_some());
        let back: crate::storage::records::OperationRecord = decode(&encode(&op).unwrap()).unwrap();
        assert_eq!(back, header(op.clone()));
    }

    #[test]
    fn every_record_type_round_trips() {
        let c = td::cluster("web");
        round_trip(td::instance(&c, 1));
        round_trip(header(td::operation(&c, td::T0)));
        round_trip(c);
        round_trip(td::node("node-1"));
        round_trip(td::package("zk", "3.8.0"));
        // An event's number is its key, not part of the value.
        round_trip(td::event(0));
        let back: crate::storage::records::EventRecord = decode(&encode(&td::event(42)).unwrap()).unwrap();
        assert_eq!(back, crate::storage::records::EventRecord { seq: 0, ..td::event(42) });
        round_trip(td::agent_instance("web-server-1-abcdef"));
        round_trip(td::tombstone("web-server-1-abcdef"));
    }

    #[test]
    fn optional_fields_round_trip_when_absent() {
        let mut c = td::cluster("web");
        c.operation = None;
        let mut op = td::operation(&c, td::T0);
        op.ended_at = None;
        op.error = None;
        let mut a = td::agent_instance("x-y-1-abcdef");
        a.pid = None;
        a.process.stop = None;
        round_trip(c);
        round_trip(header(op));
        round_trip(a);
    }

    fn assert_codec_err<T: DeserializeOwned + Debug>(bytes: &[u8]) {
        match decode::<T>(bytes) {
            Err(StorageError::Codec(_)) => {}
            other => panic!("expected a codec error for {} bytes, got {other:?}", bytes.len()),
        }
    }

    #[test]
    fn garbage_and_truncated_bytes_are_codec_errors() {
        assert_codec_err::<ClusterRecord>(&[]);
        assert_codec_err::<ClusterRecord>(&[0xff; 64]);
        let bytes = encode(&td::cluster("web")).unwrap();
        for len in 0..bytes.len() {
            assert_codec_err::<ClusterRecord>(&bytes[..len]);
        }
    }

    #[test]
    fn trailing_bytes_are_refused() {
        let mut bytes = encode(&td::node("n")).unwrap();
        bytes.push(0);
        assert_codec_err::<crate::storage::records::NodeRecord>(&bytes);
    }

    #[test]
    fn a_huge_length_prefix_does_not_allocate() {
        // varint marker 253 = a u64 follows: a string claiming u64::MAX bytes.
        let mut bytes = vec![253u8];
        bytes.extend_from_slice(&u64::MAX.to_le_bytes());
        assert_codec_err::<String>(&bytes);
    }

    #[test]
    fn values_over_the_limit_are_not_encoded() {
        let big = "x".repeat(MAX_VALUE_BYTES + 1);
        assert!(matches!(encode(&big), Err(StorageError::Codec(_))));
    }
}
