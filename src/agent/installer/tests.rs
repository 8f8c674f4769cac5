//! Installer tests on real temp dirs and real tarballs.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::time::Duration;

use super::*;
use crate::package::RESERVED_DIRS;
use crate::package::testkit::*;

fn good_entries(big: &[u8]) -> Vec<TestEntry> {
    vec![
        file("component.toml", SPEC.as_bytes()),
        dir("bin"),
        with_mode(file("bin/run", b"#!/bin/sh\nexec sleep 100\n"), 0o755),
        symlink("bin/start", "run"),
        hardlink("bin/run2", "bin/run"),
        file("lib/blob", big),
    ]
}

async fn stream_all(ex: &mut StreamingExtractor, bytes: &[u8]) -> Result<(), InstallError> {
    for chunk in bytes.chunks(64 * 1024) {
        ex.push(chunk.to_vec()).await?;
    }
    Ok(())
}

#[tokio::test]
async fn first_file_lands_before_the_last_chunk() {
    let big = noise(3 * 1024 * 1024 + 17, 7);
    let pkg = targz(&good_entries(&big));
    let chunks: Vec<Vec<u8>> = pkg.chunks(crate::protocol::messages::INSTALL_CHUNK_BYTES).map(<[u8]>::to_vec).collect();
    assert!(chunks.len() >= 3, "the test needs several chunks, got {}", chunks.len());

    let tmp = tempfile::tempdir().unwrap();
    let staging = tmp.path().join("staging");
    let tee = tmp.path().join("cache/incoming");
    let mut ex = StreamingExtractor::start(staging.clone(), ExtractLimits::default(), Some(tee.clone())).unwrap();
    let (last, rest) = chunks.split_last().unwrap();
    for c in rest {
        ex.push(c.clone()).await.unwrap();
    }
    // Everything but the last chunk is in: the first file must appear.
    let spec = staging.join("component.toml");
    let mut waited = Duration::ZERO;
    while std::fs::read(&spec).map(|b| b != SPEC.as_bytes()).unwrap_or(true) {
        assert!(waited < Duration::from_secs(10), "component.toml did not land before the last chunk");
        tokio::time::sleep(Duration::from_millis(10)).await;
        waited += Duration::from_millis(10);
    }
    assert!(
        !staging.join("lib/blob").exists()
            || std::fs::metadata(staging.join("lib/blob")).unwrap().len() < big.len() as u64
    );
    ex.push(last.clone()).await.unwrap();
    let summary = ex.finish(&sha256_hex(&pkg), pkg.len() as u64).await.unwrap();

    assert_eq!(summary.sha256, sha256_hex(&pkg));
    assert_eq!(summary.entries, 6);
    assert_eq!(std::fs::read(staging.join("lib/blob")).unwrap(), big);
    assert_eq!(std::fs::metadata(staging.join("bin/run")).unwrap().permissions().mode() & 0o7777, 0o755);
    assert_eq!(std::fs::read_link(staging.join("bin/start")).unwrap(), Path::new("run"));
    assert_eq!(
        std::fs::metadata(staging.join("bin/run2")).unwrap().ino(),
        std::fs::metadata(staging.join("bin/run")).unwrap().ino()
    );
    // The tee holds the exact package, ready to be cached.
    assert_eq!(std::fs::read(&tee).unwrap(), pkg);
}

#[tokio::test]
async fn sha_or_size_mismatch_removes_staging_and_tee() {
    let pkg = targz(&good_entries(b"small"));
    for (sha, size) in [("00".repeat(32), pkg.len() as u64), (sha256_hex(&pkg), pkg.len() as u64 + 1)] {
        let tmp = tempfile::tempdir().unwrap();
        let (staging, tee) = (tmp.path().join("staging"), tmp.path().join("tee"));
        let mut ex = StreamingExtractor::start(staging.clone(), ExtractLimits::default(), Some(tee.clone())).unwrap();
        stream_all(&mut ex, &pkg).await.unwrap();
        let err = ex.finish(&sha, size).await.unwrap_err();
        assert!(matches!(err, InstallError::ShaMismatch { .. } | InstallError::SizeMismatch { .. }), "{err:?}");
        assert!(!staging.exists(), "staging left behind after {err}");
        assert!(!tee.exists(), "tee left behind after {err}");
    }
}

#[tokio::test]
async fn a_refused_entry_fails_the_stream_early() {
    // The hostile entry comes first, followed by lots of data: `push` must
    // fail long before the whole package is sent.
    let pkg = targz(&[file("../escape", b"x"), file("big", &noise(6 * 1024 * 1024, 3))]);
    let tmp = tempfile::tempdir().unwrap();
    let staging = tmp.path().join("staging");
    let mut ex = StreamingExtractor::start(staging.clone(), ExtractLimits::default(), None).unwrap();
    let mut sent = 0;
    let err = loop {
        let chunk = &pkg[sent..(sent + 64 * 1024).min(pkg.len())];
        assert!(!chunk.is_empty(), "the whole package went through");
        sent += chunk.len();
        if let Err(e) = ex.push(chunk.to_vec()).await {
            break e;
        }
    };
    assert!(sent < pkg.len() / 2, "failed only after {sent} of {} bytes", pkg.len());
    assert!(
        matches!(&err, InstallError::Package(PackageError::EntryRefused { entry, .. }) if entry == "../escape"),
        "{err:?}"
    );
    assert!(!staging.exists());
    assert!(!tmp.path().join("escape").exists());
    assert!(matches!(ex.push(vec![1]).await, Err(InstallError::AlreadyFailed)));
    ex.abort().await;
}

async fn extract_entries(
    entries: &[TestEntry],
    limits: &ExtractLimits,
) -> (tempfile::TempDir, Result<ExtractSummary, InstallError>) {
    let tmp = tempfile::tempdir().unwrap();
    let archive = tmp.path().join("pkg.tar.gz");
    std::fs::write(&archive, targz(entries)).unwrap();
    let result = extract_file(&archive, &tmp.path().join("staging"), limits).await;
    (tmp, result)
}

fn refused_rule(result: Result<ExtractSummary, InstallError>) -> EntryRule {
    match result {
        Err(InstallError::Package(PackageError::EntryRefused { rule, .. })) => rule,
        other => panic!("expected a refused entry, got {other:?}"),
    }
}

#[tokio::test]
async fn every_rule_holds_on_the_agent_too() {
    let limits = ExtractLimits::default();
    type Case = (Vec<TestEntry>, fn(&EntryRule) -> bool);
    let cases: Vec<Case> = vec![
        (vec![file("/tmp/abs", b"x")], |r| *r == EntryRule::AbsolutePath),
        (vec![file("a/../../x", b"x")], |r| *r == EntryRule::ParentDir),
        (vec![symlink("l", "../../etc")], |r| matches!(r, EntryRule::LinkEscapes { .. })),
        (vec![symlink("l", "/etc")], |r| matches!(r, EntryRule::LinkAbsolute { .. })),
        (vec![hardlink("h", "../x")], |r| matches!(r, EntryRule::LinkEscapes { .. })),
        (vec![with_kind(file("dev", b""), tar::EntryType::Char)], |r| matches!(r, EntryRule::SpecialFile { .. })),
        (vec![with_kind(file("fifo", b""), tar::EntryType::Fifo)], |r| matches!(r, EntryRule::SpecialFile { .. })),
        (vec![with_mode(file("su", b"x"), 0o4755)], |r| matches!(r, EntryRule::SetId { .. })),
        (vec![dir("data/"), file("data/db", b"x")], |r| matches!(r, EntryRule::Reserved { .. })),
        (vec![symlink("s", "."), symlink("s/up", "..")], |r| matches!(r, EntryRule::ThroughSymlink { .. })),
        (vec![symlink("d", "."), dir("d")], |r| matches!(r, EntryRule::ThroughSymlink { .. })),
    ];
    for (entries, expect) in cases {
        let (tmp, result) = extract_entries(&entries, &limits).await;
        let rule = refused_rule(result);
        assert!(expect(&rule), "{}: unexpected rule {rule:?}", entries[0].path);
        assert!(!tmp.path().join("staging").exists(), "staging left after refusing {}", entries[0].path);
        let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(left, vec![std::ffi::OsString::from("pkg.tar.gz")], "something escaped");
    }
}

#[tokio::test]
async fn limits_hold_on_the_agent() {
    let entries: Vec<_> = (0..10).map(|i| file(&format!("f{i}"), b"0123456789")).collect();
    let (_t, r) = extract_entries(&entries, &ExtractLimits { max_entries: 9, ..ExtractLimits::default() }).await;
    assert!(matches!(r, Err(InstallError::Package(PackageError::TooManyEntries { max: 9 }))), "{r:?}");
    let (t, r) = extract_entries(&entries, &ExtractLimits { max_total_bytes: 55, ..ExtractLimits::default() }).await;
    assert!(matches!(r, Err(InstallError::Package(PackageError::TooLarge { .. }))), "{r:?}");
    assert!(!t.path().join("staging").exists());

    // The raw stream is capped too.
    let tmp = tempfile::tempdir().unwrap();
    let limits = ExtractLimits { max_total_bytes: 100, ..ExtractLimits::default() };
    let mut ex = StreamingExtractor::start(tmp.path().join("s"), limits, None).unwrap();
    let err = ex.push(vec![0x1f; 101]).await.unwrap_err();
    assert!(matches!(err, InstallError::StreamTooLarge { max: 100 }), "{err:?}");
    assert!(!tmp.path().join("s").exists());
}

#[tokio::test]
async fn cached_package_extracts_with_modes_and_read_only_dirs() {
    let entries =
        vec![dir("ro"), file("ro/f", b"x"), with_mode(dir("ro"), 0o555), file("component.toml", SPEC.as_bytes())];
    let (tmp, r) = extract_entries(&entries, &ExtractLimits::default()).await;
    let summary = r.unwrap();
    assert_eq!(summary.entries, 4);
    let staging = tmp.path().join("staging");
    assert_eq!(std::fs::read(staging.join("ro/f")).unwrap(), b"x");
    assert_eq!(std::fs::metadata(staging.join("ro")).unwrap().permissions().mode() & 0o777, 0o555);
    assert_eq!(summary.sha256, sha256_hex(&std::fs::read(tmp.path().join("pkg.tar.gz")).unwrap()));
    std::fs::set_permissions(staging.join("ro"), std::fs::Permissions::from_mode(0o755)).unwrap();
}

#[tokio::test]
async fn abort_removes_everything() {
    let tmp = tempfile::tempdir().unwrap();
    let (staging, tee) = (tmp.path().join("staging"), tmp.path().join("tee"));
    let pkg = targz(&good_entries(&noise(200_000, 1)));
    let mut ex = StreamingExtractor::start(staging.clone(), ExtractLimits::default(), Some(tee.clone())).unwrap();
    ex.push(pkg[..pkg.len() / 2].to_vec()).await.unwrap();
    ex.abort().await;
    assert!(!staging.exists() && !tee.exists());
}

#[test]
fn place_instance_dir_carries_owned_dirs_over() {
    let tmp = tempfile::tempdir().unwrap();
    let final_dir = tmp.path().join("instances/x");
    let stage = |n: &str| {
        let s = tmp.path().join(n);
        std::fs::create_dir_all(s.join("bin")).unwrap();
        std::fs::write(s.join("bin/run"), n).unwrap();
        s
    };
    place_instance_dir(&stage("v1"), &final_dir, None).unwrap();
    for d in RESERVED_DIRS {
        assert!(final_dir.join(d).is_dir(), "{d}/ missing after first install");
    }
    std::fs::write(final_dir.join("data/db"), "precious").unwrap();
    std::fs::write(final_dir.join("logs/out.log"), "old log").unwrap();
    std::fs::remove_dir(final_dir.join("run")).unwrap();
    std::os::unix::fs::symlink("/etc", final_dir.join("run")).unwrap();

    place_instance_dir(&stage("v2"), &final_dir, None).unwrap();
    assert_eq!(std::fs::read_to_string(final_dir.join("bin/run")).unwrap(), "v2");
    assert_eq!(std::fs::read_to_string(final_dir.join("data/db")).unwrap(), "precious");
    assert_eq!(std::fs::read_to_string(final_dir.join("logs/out.log")).unwrap(), "old log");
    // A link planted in place of run/ is not carried over.
    let run = std::fs::symlink_metadata(final_dir.join("run")).unwrap();
    assert!(run.is_dir() && !run.file_type().is_symlink());
    assert!(!tmp.path().join("v1").exists() && !tmp.path().join("v2").exists());
    let siblings: Vec<_> = std::fs::read_dir(tmp.path().join("instances")).unwrap().collect();
    assert_eq!(siblings.len(), 1, "the old tree was left behind");
}

/// No extracted file or directory stays world-writable (issue 9): another
/// user on the node could otherwise change an instance's programs.
#[tokio::test]
async fn extracted_files_and_dirs_lose_the_world_writable_bit() {
    let entries = vec![
        with_mode(dir("open"), 0o777),
        with_mode(file("open/run.sh", b"#!/bin/sh\n"), 0o777),
        with_mode(file("data.txt", b"x"), 0o666),
        with_mode(file("implicit/deep/f", b"x"), 0o646),
        symlink("link", "open/run.sh"),
        file("component.toml", SPEC.as_bytes()),
    ];
    let (tmp, r) = extract_entries(&entries, &ExtractLimits::default()).await;
    r.unwrap();
    let staging = tmp.path().join("staging");
    let mode = |p: &str| std::fs::symlink_metadata(staging.join(p)).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode("open"), 0o775);
    assert_eq!(mode("open/run.sh"), 0o775);
    assert_eq!(mode("data.txt"), 0o664);
    assert_eq!(mode("implicit/deep/f"), 0o644);
    for p in ["", "implicit", "implicit/deep"] {
        assert_eq!(mode(p) & 0o002, 0, "{p:?} (made on the way) is world-writable: {:o}", mode(p));
    }
    assert_eq!(std::fs::read_link(staging.join("link")).unwrap(), Path::new("open/run.sh"));
}
