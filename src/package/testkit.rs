//! Test helper: builds real `.tar.gz` packages, including hostile entries
//! that `tar::Builder` itself would refuse to write.

use std::io::Write;

use flate2::Compression;
use flate2::write::GzEncoder;
use tar::{EntryType, Header};

/// One entry to put in a test archive.
pub struct TestEntry {
    pub path: String,
    pub kind: EntryType,
    pub mode: u32,
    pub data: Vec<u8>,
    pub link: Option<String>,
}

pub fn file(path: &str, data: &[u8]) -> TestEntry {
    TestEntry { path: path.into(), kind: EntryType::Regular, mode: 0o644, data: data.to_vec(), link: None }
}

pub fn dir(path: &str) -> TestEntry {
    TestEntry { path: path.into(), kind: EntryType::Directory, mode: 0o755, data: vec![], link: None }
}

pub fn symlink(path: &str, target: &str) -> TestEntry {
    TestEntry { path: path.into(), kind: EntryType::Symlink, mode: 0o777, data: vec![], link: Some(target.into()) }
}

pub fn hardlink(path: &str, target: &str) -> TestEntry {
    TestEntry { path: path.into(), kind: EntryType::Link, mode: 0o644, data: vec![], link: Some(target.into()) }
}

pub fn with_mode(mut e: TestEntry, mode: u32) -> TestEntry {
    e.mode = mode;
    e
}

pub fn with_kind(mut e: TestEntry, kind: EntryType) -> TestEntry {
    e.kind = kind;
    e
}

pub const SPEC: &str = "[component]\nname = \"demo\"\nversion = \"1.0.0\"\n";

/// The uncompressed tar bytes of `entries`, names written raw (so `..` and
/// absolute paths survive).
pub fn tar_bytes(entries: &[TestEntry]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for e in entries {
        let mut h = Header::new_gnu();
        let name = &mut h.as_gnu_mut().unwrap().name;
        name[..e.path.len()].copy_from_slice(e.path.as_bytes());
        h.set_entry_type(e.kind);
        h.set_mode(e.mode);
        h.set_size(e.data.len() as u64);
        h.set_mtime(1_700_000_000);
        if let Some(l) = &e.link {
            h.set_link_name_literal(l).unwrap();
        }
        h.set_cksum();
        builder.append(&h, e.data.as_slice()).unwrap();
    }
    builder.into_inner().unwrap()
}

/// The `.tar.gz` bytes of `entries`.
pub fn targz(entries: &[TestEntry]) -> Vec<u8> {
    let mut gz = GzEncoder::new(Vec::new(), Compression::fast());
    gz.write_all(&tar_bytes(entries)).unwrap();
    gz.finish().unwrap()
}

/// Bytes that do not compress (a fixed xorshift stream, no rand crate).
pub fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(bytes))
}
