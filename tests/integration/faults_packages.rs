//! Hostile tarballs uploaded through the HTTP API to a real master (issue
//! 9): path traversal, absolute paths, symlink and hardlink escapes,
//! symlink-then-write, device files, setuid bits, a gzip bomb, a million
//! entries, a 100 KB path. Each is refused `400 invalid_package` with a
//! message naming what is wrong, and nothing is written outside the
//! package store: a canary directory the hostile entries aim at stays
//! empty, no package is registered and no blob is kept.
//!
//! The same rules are unit-tested entry by entry in `src/package.rs`,
//! `src/package/rules.rs` and `src/agent/installer/tests.rs` (the agent
//! applies them again while extracting).

use std::io::Write;
use std::time::{Duration, Instant};

use flate2::Compression;
use flate2::write::GzEncoder;
use serde_json::json;
use tar::{EntryType, Header};

use crate::common::TestEnv;
use crate::common::http::error_code;

const SPEC: &str =
    "[component]\nname = \"evil\"\nversion = \"1.0.0\"\n\n[[roles]]\nname = \"svc\"\nstart = [\"bin/start.sh\"]\n";

/// One raw tar entry: the name is written as given (so `..` and absolute
/// paths survive; `tar::Builder` itself would refuse them), a name over
/// 100 bytes as a GNU long-name entry.
fn entry(out: &mut impl Write, path: &str, kind: EntryType, mode: u32, data: &[u8], link: Option<&str>) {
    let mut h = Header::new_gnu();
    if path.len() > 99 {
        let mut long = Header::new_gnu();
        long.as_gnu_mut().unwrap().name[..13].copy_from_slice(b"././@LongLink");
        long.set_entry_type(EntryType::GNULongName);
        long.set_mode(0o644);
        long.set_size(path.len() as u64 + 1);
        long.set_cksum();
        out.write_all(long.as_bytes()).unwrap();
        let mut name = path.as_bytes().to_vec();
        name.push(0);
        name.resize(name.len().div_ceil(512) * 512, 0);
        out.write_all(&name).unwrap();
        h.as_gnu_mut().unwrap().name[..99].copy_from_slice(&path.as_bytes()[..99]);
    } else {
        h.as_gnu_mut().unwrap().name[..path.len()].copy_from_slice(path.as_bytes());
    }
    h.set_entry_type(kind);
    h.set_mode(mode);
    h.set_size(data.len() as u64);
    h.set_mtime(1_700_000_000);
    if let Some(l) = link {
        h.set_link_name_literal(l).unwrap();
    }
    h.set_cksum();
    out.write_all(h.as_bytes()).unwrap();
    out.write_all(data).unwrap();
    out.write_all(&vec![0u8; data.len().div_ceil(512) * 512 - data.len()]).unwrap();
}

/// A `.tar.gz` with a valid `component.toml` first, then what `rest` writes.
fn package(rest: impl FnOnce(&mut GzEncoder<Vec<u8>>)) -> Vec<u8> {
    let mut gz = GzEncoder::new(Vec::new(), Compression::fast());
    entry(&mut gz, "component.toml", EntryType::Regular, 0o644, SPEC.as_bytes(), None);
    entry(&mut gz, "bin/start.sh", EntryType::Regular, 0o755, b"#!/bin/sh\nexec sleep 1000\n", None);
    rest(&mut gz);
    gz.write_all(&[0u8; 1024]).unwrap();
    gz.finish().unwrap()
}

/// Every file under `dir` (recursively), sorted.
fn files_under(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(dir) else { return out };
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() && !p.is_symlink() {
            out.extend(files_under(&p));
        } else {
            out.push(p);
        }
    }
    out.sort();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_tarballs_are_refused_and_write_nothing_outside_the_store() {
    let env = TestEnv::start("faults-tarballs").await;
    // What the hostile entries aim at: it must stay empty.
    let canary = tempfile::Builder::new().prefix("flotilla-canary-").tempdir().expect("canary dir");
    let c = canary.path().to_str().unwrap().to_string();
    let store_before = files_under(&env.master_dir().join("packages"));
    let long_path = format!("{}/x", "d".repeat(100 * 1024));

    type Case = (&'static str, Vec<u8>, &'static str);
    let mut cases: Vec<Case> = vec![
        (
            "path traversal",
            package(|t| {
                entry(t, "../../../../../../../../../../etc/flotilla-pwned", EntryType::Regular, 0o644, b"x", None)
            }),
            "`..` is not allowed",
        ),
        (
            "traversal after a directory",
            package(|t| entry(t, "bin/../../escape", EntryType::Regular, 0o644, b"x", None)),
            "`..` is not allowed",
        ),
        (
            "absolute path",
            package(|t| entry(t, &format!("{c}/absolute"), EntryType::Regular, 0o644, b"x", None)),
            "absolute paths are not allowed",
        ),
        ("symlink escape", package(|t| entry(t, "lib", EntryType::Symlink, 0o777, b"", Some(&c))), "is absolute"),
        (
            "relative symlink escape",
            package(|t| entry(t, "lib", EntryType::Symlink, 0o777, b"", Some("../../../../../../../../tmp"))),
            "points outside the package",
        ),
        (
            "hardlink escape",
            package(|t| entry(t, "shadow", EntryType::Link, 0o644, b"", Some("../../../../../../../etc/shadow"))),
            "outside the package",
        ),
        (
            "symlink then write through it (escaping)",
            package(|t| {
                entry(t, "out", EntryType::Symlink, 0o777, b"", Some(&c));
                entry(t, "out/pwned", EntryType::Regular, 0o644, b"x", None);
            }),
            "is absolute",
        ),
        (
            "symlink then write through it (inside)",
            package(|t| {
                entry(t, "lib", EntryType::Directory, 0o755, b"", None);
                entry(t, "alias", EntryType::Symlink, 0o777, b"", Some("lib"));
                entry(t, "alias/pwned", EntryType::Regular, 0o644, b"x", None);
            }),
            "goes through the symlink",
        ),
        (
            "character device",
            package(|t| entry(t, "tty", EntryType::Char, 0o666, b"", None)),
            "entries are not allowed",
        ),
        ("block device", package(|t| entry(t, "disk", EntryType::Block, 0o666, b"", None)), "entries are not allowed"),
        ("fifo", package(|t| entry(t, "pipe", EntryType::Fifo, 0o666, b"", None)), "entries are not allowed"),
        (
            "setuid",
            package(|t| entry(t, "bin/su", EntryType::Regular, 0o4755, b"#!/bin/sh\n", None)),
            "setuid/setgid bits are not allowed",
        ),
        (
            "setgid",
            package(|t| entry(t, "bin/sg", EntryType::Regular, 0o2755, b"#!/bin/sh\n", None)),
            "setuid/setgid bits are not allowed",
        ),
        (
            "100 KB path",
            package(|t| entry(t, &long_path, EntryType::Regular, 0o644, b"x", None)),
            "over the limit of 4096",
        ),
    ];
    // A gzip bomb: 9 entries of 256 MiB of zeros (2.25 GiB unpacked, over
    // the 2 GiB limit) in a few MB of gzip.
    let built = Instant::now();
    let bomb = package(|t| {
        let zeros = vec![0u8; 1 << 20];
        for i in 0..9 {
            let mut h = Header::new_gnu();
            let name = format!("zeros-{i}");
            h.as_gnu_mut().unwrap().name[..name.len()].copy_from_slice(name.as_bytes());
            h.set_entry_type(EntryType::Regular);
            h.set_mode(0o644);
            h.set_size(256 << 20);
            h.set_cksum();
            t.write_all(h.as_bytes()).unwrap();
            for _ in 0..256 {
                t.write_all(&zeros).unwrap();
            }
        }
    });
    // A million entries (empty files): over the limit of 100,000.
    let million = package(|t| {
        for i in 0..1_000_000u32 {
            let mut h = Header::new_gnu();
            let name = format!("f/{i:07}");
            h.as_gnu_mut().unwrap().name[..name.len()].copy_from_slice(name.as_bytes());
            h.set_entry_type(EntryType::Regular);
            h.set_mode(0o644);
            h.set_size(0);
            h.set_cksum();
            t.write_all(h.as_bytes()).unwrap();
        }
    });
    eprintln!(
        "faults-tarballs: bomb {} bytes, million entries {} bytes, built in {:?}",
        bomb.len(),
        million.len(),
        built.elapsed()
    );
    cases.push(("gzip bomb", bomb, "unpacks to more than 2147483648 bytes"));
    cases.push(("a million entries", million, "more than 100000 entries"));

    let mut took = Vec::new();
    for (i, (what, bytes, says)) in cases.into_iter().enumerate() {
        let started = Instant::now();
        let (status, body) = env.put_bytes(&format!("/packages/evil{i}/1.0.0"), bytes).await;
        let t = started.elapsed();
        took.push((what, t));
        assert_eq!((status.as_u16(), error_code(&body)), (400, "invalid_package"), "{what}: {body:#}");
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(says), "{what}: the message {message:?} does not say {says:?}");
        assert!(t < Duration::from_secs(30), "{what}: refused only after {t:?}");
    }

    let (_, list) = env.get("/packages").await;
    assert_eq!(list["packages"], json!([]), "a hostile package was registered: {list:#}");
    assert_eq!(files_under(canary.path()), Vec::<std::path::PathBuf>::new(), "written outside the store");
    assert!(!std::path::Path::new("/etc/flotilla-pwned").exists(), "/etc/flotilla-pwned was written");
    let store_after = files_under(&env.master_dir().join("packages"));
    assert_eq!(store_after, store_before, "a refused upload left files in the package store");
    // The master is fine: a good package still uploads.
    env.upload(&crate::common::PackageBuilder::sleeper("good")).await;
    eprintln!("faults-tarballs: refused in {took:?}");
}
