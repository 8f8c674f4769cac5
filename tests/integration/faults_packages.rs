//! Hostile tarballs (issue 9): path traversal, absolute paths, symlink
//! and hardlink escapes, symlink-then-write, device files, setuid bits, a
//! gzip bomb, a million entries, a 100 KB path.
//!
//! Two ends, each tested for real:
//! - the master's upload check: each is refused `400 invalid_package` with
//!   a message naming what is wrong, no package is registered and no blob
//!   is kept;
//! - the agent's extractor, which the master's check keeps every upload
//!   away from: each archive is planted in the master's package store
//!   (offline, through `MasterStore`, as a store holding it would be) and
//!   a cluster created with it, so the master streams it to a real agent.
//!   The create fails naming the rule, and the agent's filesystem shows
//!   nothing written outside its staging dir: canary directories and a
//!   canary file the entries aim at (through `..`, absolute paths,
//!   symlinks and a hard link) are unchanged, the agent's data dir holds
//!   the same files as before (no staging, no instance dir, no cached
//!   package), and the env's root no new name.
//!
//! The same rules are unit-tested entry by entry in `src/package.rs`,
//! `src/package/rules.rs` and `src/agent/installer/tests.rs`.

use std::io::Write;
use std::time::{Duration, Instant};

use flate2::Compression;
use flate2::write::GzEncoder;
use serde_json::json;
use tar::{EntryType, Header};

use crate::common::http::error_code;
use crate::common::{TestEnv, eventually};

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

type Case = (&'static str, Vec<u8>, &'static str);

/// Every hostile archive, with the words its refusal must say. `c` is the
/// canary directory (absolute): the escapes aim at it, by absolute path
/// and by enough `..` to reach `/` from wherever the archive is unpacked.
fn hostile_cases(c: &str) -> Vec<Case> {
    let c_rel = c.trim_start_matches('/');
    // Deeper than any staging dir here (the tar header holds 100 bytes of link name).
    let up = "../".repeat(10);
    let long_path = format!("{}/x", "d".repeat(100 * 1024));
    let mut cases: Vec<Case> = vec![
        (
            "path traversal",
            package(|t| entry(t, &format!("{up}{c_rel}/traversal"), EntryType::Regular, 0o644, b"x", None)),
            "`..` is not allowed",
        ),
        (
            "traversal after a directory",
            package(|t| entry(t, &format!("bin/../{up}{c_rel}/escape"), EntryType::Regular, 0o644, b"x", None)),
            "`..` is not allowed",
        ),
        (
            "absolute path",
            package(|t| entry(t, &format!("{c}/absolute"), EntryType::Regular, 0o644, b"x", None)),
            "absolute paths are not allowed",
        ),
        ("symlink escape", package(|t| entry(t, "lib", EntryType::Symlink, 0o777, b"", Some(c))), "is absolute"),
        (
            "relative symlink escape",
            package(|t| {
                entry(t, "lib", EntryType::Symlink, 0o777, b"", Some(&format!("{up}{c_rel}")));
                entry(t, "lib/pwned", EntryType::Regular, 0o644, b"x", None);
            }),
            "points outside the package",
        ),
        (
            "hardlink escape",
            package(|t| {
                entry(t, "keep", EntryType::Link, 0o644, b"", Some(&format!("{up}{c_rel}/keep")));
                entry(t, "keep", EntryType::Regular, 0o644, b"overwritten through a hard link", None);
            }),
            "outside the package",
        ),
        (
            "symlink then write through it (escaping)",
            package(|t| {
                entry(t, "out", EntryType::Symlink, 0o777, b"", Some(c));
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

    cases
}

/// The canary directory's state: each entry's name, content (a link's
/// target), and link count.
fn canary_state(dir: &std::path::Path) -> Vec<(String, Vec<u8>, u64)> {
    use std::os::unix::fs::MetadataExt;
    let mut out: Vec<_> = std::fs::read_dir(dir)
        .expect("read the canary dir")
        .flatten()
        .map(|e| {
            let meta = std::fs::symlink_metadata(e.path()).expect("stat a canary entry");
            let content = if meta.file_type().is_symlink() {
                std::fs::read_link(e.path()).unwrap().into_os_string().into_encoded_bytes()
            } else if meta.is_file() {
                std::fs::read(e.path()).unwrap()
            } else {
                b"(a directory)".to_vec()
            };
            (e.file_name().to_string_lossy().into_owned(), content, meta.nlink())
        })
        .collect();
    out.sort();
    out
}

/// A canary directory the hostile entries aim at, holding one file
/// (`keep`, the hard link's target).
fn canary_dir() -> tempfile::TempDir {
    let canary = tempfile::Builder::new().prefix("flotilla-canary-").tempdir().expect("canary dir");
    std::fs::write(canary.path().join("keep"), "canary").expect("canary file");
    canary
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_tarballs_are_refused_and_write_nothing_outside_the_store() {
    let env = TestEnv::start("faults-tarballs").await;
    let canary = canary_dir();
    let canary_before = canary_state(canary.path());
    let store_before = files_under(&env.master_dir().join("packages"));
    let cases = hostile_cases(canary.path().to_str().unwrap());

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
    assert_eq!(canary_state(canary.path()), canary_before, "written outside the store");
    let store_after = files_under(&env.master_dir().join("packages"));
    assert_eq!(store_after, store_before, "a refused upload left files in the package store");
    // The master is fine: a good package still uploads.
    env.upload(&crate::common::PackageBuilder::sleeper("good")).await;
    eprintln!("faults-tarballs: refused in {took:?}");
}

/// Every path under `dir` (recursively, links not followed) but those
/// under `skip` (names of its direct children), sorted.
fn paths_under(dir: &std::path::Path, skip: &[&str]) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(dir) else { return out };
    for e in rd.flatten() {
        if skip.iter().any(|s| e.file_name() == *s) {
            continue;
        }
        let p = e.path();
        out.push(p.clone());
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            out.extend(paths_under(&p, &[]));
        }
    }
    out.sort();
    out
}

/// The hostile archives reach a real agent's extractor: each is planted in
/// the master's package store (its blob and record written offline, as if
/// the upload check had let it through), then a cluster of one instance on
/// node-1 is created with it. Each create ends `Failed` with an error
/// naming the rule the agent applied; the agent's filesystem shows nothing
/// written outside its staging dir (the canary unchanged, the agent's data
/// dir as before: no staging, no instance dir, no cached package; no new
/// name beside the env's dirs); and a good package installs and runs on
/// that agent afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_tarballs_reaching_the_agent_are_refused_and_write_nothing_outside_staging() {
    use flotilla::storage::records::{PackageRecord, RECORD_VERSION};
    use flotilla::storage::{MasterStore, WriteOp};
    use sha2::Digest;

    // The million-entry archive keeps the agent's extractor busy for many
    // seconds per chunk on a loaded machine (100,000 files written before
    // the limit refuses the rest): with the default send deadline (10 s),
    // the link must hold while it does (the agent's reader hands chunks to
    // the install's own task and goes on reading), and the create must
    // fail on the rule this test checks, not on the link.
    let mut env = TestEnv::start("faults-tarballs-agent").await;
    let canary = canary_dir();
    let canary_before = canary_state(canary.path());
    let cases = hostile_cases(canary.path().to_str().unwrap());
    let root = env.agent_dir(1).parent().unwrap().to_path_buf();
    let agent_dir = env.agent_dir(1);
    // The agent's data dir but its database (RocksDB writes there all along).
    let agent_before = paths_under(&agent_dir, &["db"]);
    let root_before = paths_under(&root, &["master", "agent-1", "agent-2", "agent-3"]);

    env.kill_master();
    {
        let store = MasterStore::open(&env.master_dir().join("db")).expect("open the master's store");
        let mut ops = Vec::new();
        for (i, (_, bytes, _)) in cases.iter().enumerate() {
            let sha256 = hex::encode(sha2::Sha256::digest(bytes));
            std::fs::write(env.master_dir().join("packages").join(&sha256), bytes).expect("plant the blob");
            let record = PackageRecord {
                version: RECORD_VERSION,
                name: format!("evil{i}"),
                package_version: "1.0.0".into(),
                sha256,
                size: bytes.len() as u64,
                spec_toml: SPEC.replace("name = \"evil\"", &format!("name = \"evil{i}\"")),
                uploaded_at: time::OffsetDateTime::now_utc(),
            };
            ops.push(WriteOp::put_package(&record).expect("encode the package record"));
        }
        store.writer().commit(ops).await.expect("record the planted packages");
    }
    env.start_master_again().await;
    env.wait_ready().await;
    let (_, list) = env.get("/packages").await;
    assert_eq!(list["packages"].as_array().map(Vec::len), Some(cases.len()), "planted packages: {list:#}");

    // Every case is checked, and every problem reported at the end.
    let mut problems: Vec<String> = Vec::new();
    let mut canary_before = canary_before;
    let mut agent_before = agent_before;
    let mut took = Vec::new();
    for (i, (what, _, says)) in cases.iter().enumerate() {
        let started = Instant::now();
        let body = json!({"name": format!("e{i}"), "package": {"name": format!("evil{i}"), "version": "1.0.0"},
            "roles": {"svc": {"count": 1, "nodes": ["node-1"]}}});
        let op = env.create_cluster(body).await;
        let op = env.wait_op(op["id"].as_str().unwrap()).await;
        took.push((*what, started.elapsed(), op["error"].as_str().unwrap_or_default().to_string()));
        let canary_now = canary_state(canary.path());
        if canary_now != canary_before {
            problems.push(format!("{what}: written outside the agent's staging dir: the canary went from {canary_before:?} to {canary_now:?}"));
            canary_before = canary_now;
        }
        // The agent removes a refused staging dir and its package copy
        // (the extraction's failure path); give it a moment.
        eventually(10, || paths_under(&agent_dir, &["db"]) == agent_before).await;
        let now = paths_under(&agent_dir, &["db"]);
        let new: Vec<_> = now.iter().filter(|p| !agent_before.contains(p)).collect();
        if !new.is_empty() {
            problems.push(format!("{what}: the agent's data dir holds new paths: {new:?}"));
            agent_before = now.clone();
        }
        let beside = paths_under(&root, &["master", "agent-1", "agent-2", "agent-3"]);
        if beside != root_before {
            problems.push(format!("{what}: written beside the env's dirs: {beside:?}"));
        }
        if op["status"] != "Failed" {
            problems.push(format!("{what}: the create of a hostile package ended {}: {op:#}", op["status"]));
            continue;
        }
        let error = op["error"].as_str().unwrap_or_default();
        if !error.contains(says) {
            problems.push(format!("{what}: the create's error {error:?} does not say {says:?}"));
        }
        let c = env.cluster(&format!("e{i}")).await;
        let why = c["status_description"].as_str().unwrap_or_default();
        if !why.contains(says) {
            problems.push(format!("{what}: the cluster's description {why:?} does not say {says:?}"));
        }
    }
    assert!(problems.is_empty(), "{} problems:\n{}", problems.len(), problems.join("\n"));

    // The agent is fine: a good package installs and runs there.
    env.upload(&crate::common::PackageBuilder::sleeper("good")).await;
    let body = json!({"name": "good", "package": {"name": "good", "version": "1.0.0"},
        "roles": {"svc": {"count": 1, "nodes": ["node-1"]}}});
    let c = env.create_active(body).await;
    let i = crate::common::all_instances(&c).remove(0);
    assert_eq!(crate::common::instance_pids(&crate::common::id_of(&i)), vec![crate::common::pid_of(&i)]);
    for (what, t, error) in &took {
        eprintln!("faults-tarballs-agent: {what}: refused in {t:?}: {error}");
    }
}
