//! Any bytes as an uploaded package, through both ends of the tar policy:
//! the master's `inspect_package` and the agent's extraction. Each answers
//! a package or a typed refusal, never a panic; and whatever the archive,
//! the extraction writes nothing outside its staging directory, leaves no
//! staging directory behind when it refuses, and keeps no setuid, setgid or
//! world-writable bit.
//!
//! "Nothing outside" is checked three ways, links followed where they
//! lead, not only by name:
//! - canaries: `canary/` beside the extraction's parent (reached from the
//!   staging dir by `../../canary`) and `/tmp/flotilla-fuzz-canary/` (an
//!   absolute path the seeds aim links and entries at) must keep exactly
//!   their entries, contents, modes and link counts; nothing new may
//!   appear in the temp dir beside the staging dir;
//! - a kept extraction is walked without following links: every entry's
//!   canonical path is inside the canonical staging dir, every symlink's
//!   target (resolved) stays inside it, and a file with more than one
//!   hard link has all its links inside it (so none is a file outside);
//! - a refused extraction leaves no staging dir (its mess is gone, and so
//!   is any link it made).
#![no_main]

use std::collections::HashMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use flotilla::agent::installer::extract_file;
use flotilla::package::{ExtractLimits, inspect_package};
use libfuzzer_sys::fuzz_target;

/// The canary at a fixed absolute path (the seeds' absolute escapes aim at it).
const ABSOLUTE_CANARY: &str = "/tmp/flotilla-fuzz-canary";

fn limits() -> ExtractLimits {
    ExtractLimits { max_total_bytes: 1 << 20, max_entries: 1000, max_path_len: 4096 }
}

/// Every path under `dir` (symlinks not followed), relative to `root`.
fn tree(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        out.push(path.strip_prefix(root).unwrap().to_path_buf());
        if entry.file_type().map(|t| t.is_dir()).unwrap_or(false) {
            tree(root, &path, out);
        }
    }
}

/// A canary dir's state: each entry (recursively) with its mode, size,
/// link count, mtime and content (a link's target).
fn canary_state(dir: &Path) -> Vec<(PathBuf, u32, u64, u64, i64, Vec<u8>)> {
    let mut paths = Vec::new();
    tree(dir, dir, &mut paths);
    paths.sort();
    paths
        .into_iter()
        .map(|p| {
            let full = dir.join(&p);
            let m = std::fs::symlink_metadata(&full).expect("stat a canary");
            let content = if m.file_type().is_symlink() {
                std::fs::read_link(&full).unwrap().into_os_string().into_encoded_bytes()
            } else if m.is_file() {
                std::fs::read(&full).unwrap()
            } else {
                Vec::new()
            };
            (p, m.mode(), m.size(), m.nlink(), m.mtime(), content)
        })
        .collect()
}

/// Fills a canary dir: a file (a hard link's target) and a directory (a
/// symlink's target to write under).
fn make_canary(dir: &Path) {
    std::fs::create_dir_all(dir.join("sub")).expect("canary dir");
    if !dir.join("keep").exists() {
        std::fs::write(dir.join("keep"), "canary").expect("canary file");
    }
}

/// `link`'s target joined to its directory and normalized without touching
/// the disk: `None` when it climbs above `/`.
fn lexical_target(link: &Path) -> Option<PathBuf> {
    let target = std::fs::read_link(link).ok()?;
    let mut out = PathBuf::new();
    for c in link.parent()?.join(target).components() {
        match c {
            Component::RootDir => out.push("/"),
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            Component::CurDir => {}
            Component::Normal(n) => out.push(n),
            Component::Prefix(_) => return None,
        }
    }
    Some(out)
}

/// The checks on a kept extraction (see the module doc).
fn check_contained(staging: &Path) {
    let real = staging.canonicalize().expect("canonical staging");
    let mut seen = Vec::new();
    tree(staging, staging, &mut seen);
    let mut links: HashMap<(u64, u64), (u64, u64)> = HashMap::new();
    for rel in &seen {
        let full = staging.join(rel);
        let meta = std::fs::symlink_metadata(&full).expect("stat");
        // Its parent is a real directory of the tree (the walk follows no
        // link), so the entry itself is inside.
        let parent = full.parent().unwrap().canonicalize().expect("canonical parent");
        assert!(parent.starts_with(&real), "{rel:?} is under {parent:?}, outside the staging dir");
        if meta.file_type().is_symlink() {
            let lexical = lexical_target(&full);
            assert!(
                lexical.as_ref().is_some_and(|t| t.starts_with(staging)),
                "{rel:?} is a link to {:?}, outside the staging dir",
                std::fs::read_link(&full)
            );
            if let Ok(target) = full.canonicalize() {
                assert!(target.starts_with(&real), "{rel:?} leads to {target:?}, outside the staging dir");
            }
            continue;
        }
        let mode = meta.permissions().mode();
        assert_eq!(mode & 0o6002, 0, "{rel:?} kept mode {mode:o}");
        if meta.is_file() && meta.nlink() > 1 {
            links.entry((meta.dev(), meta.ino())).or_insert((meta.nlink(), 0)).1 += 1;
        }
    }
    for ((_, ino), (nlink, inside)) in links {
        assert_eq!(inside, nlink, "inode {ino} has {nlink} links, only {inside} in the staging dir");
    }
}

fuzz_target!(|data: &[u8]| {
    let absolute = Path::new(ABSOLUTE_CANARY);
    make_canary(absolute);
    let absolute_before = canary_state(absolute);

    let dir = tempfile::tempdir().expect("temp dir");
    let canary = dir.path().join("canary");
    make_canary(&canary);
    let canary_before = canary_state(&canary);
    let archive = dir.path().join("upload.tar.gz");
    std::fs::write(&archive, data).expect("write");
    let _ = inspect_package(&archive, &limits());

    let staging = dir.path().join("box").join("staging");
    let runtime = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
    let extracted = runtime.block_on(extract_file(&archive, &staging, &limits()));

    let mut seen = Vec::new();
    tree(dir.path(), dir.path(), &mut seen);
    for path in &seen {
        let inside = path.starts_with("box/staging");
        let known =
            path.starts_with("canary") || [Path::new("upload.tar.gz"), Path::new("box")].contains(&path.as_path());
        assert!(inside || known, "extraction wrote {path:?} outside its staging dir");
        if inside {
            assert!(extracted.is_ok(), "a refused extraction left {path:?} behind");
        }
    }
    assert_eq!(canary_state(&canary), canary_before, "the extraction changed the canary beside it");
    assert_eq!(canary_state(absolute), absolute_before, "the extraction changed {ABSOLUTE_CANARY}");
    if extracted.is_ok() {
        check_contained(&staging);
    }
    // Directories the archive made read-only must not stop the temp dir's cleanup.
    for path in seen.iter().filter(|p| p.starts_with("box")) {
        let full = dir.path().join(path);
        if std::fs::symlink_metadata(&full).map(|m| m.is_dir()).unwrap_or(false) {
            let _ = std::fs::set_permissions(&full, std::fs::Permissions::from_mode(0o700));
        }
    }
});
