//! Any bytes as an uploaded package, through both ends of the tar policy:
//! the master's `inspect_package` and the agent's extraction. Each answers
//! a package or a typed refusal, never a panic; and whatever the archive,
//! the extraction writes nothing outside its staging directory, leaves no
//! staging directory behind when it refuses, and keeps no setuid, setgid or
//! world-writable bit.
#![no_main]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use flotilla::agent::installer::extract_file;
use flotilla::package::{ExtractLimits, inspect_package};
use libfuzzer_sys::fuzz_target;

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

fuzz_target!(|data: &[u8]| {
    let dir = tempfile::tempdir().expect("temp dir");
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
        let known = [Path::new("upload.tar.gz"), Path::new("box")].contains(&path.as_path());
        assert!(inside || known, "extraction wrote {path:?} outside its staging dir");
        if inside {
            assert!(extracted.is_ok(), "a refused extraction left {path:?} behind");
            let full = dir.path().join(path);
            let meta = std::fs::symlink_metadata(&full).expect("stat");
            if !meta.file_type().is_symlink() {
                let mode = meta.permissions().mode();
                assert_eq!(mode & 0o6002, 0, "{path:?} kept mode {mode:o}");
            }
        }
    }
    // Directories the archive made read-only must not stop the temp dir's cleanup.
    for path in seen.iter().filter(|p| p.starts_with("box")) {
        let full = dir.path().join(path);
        if std::fs::symlink_metadata(&full).map(|m| m.is_dir()).unwrap_or(false) {
            let _ = std::fs::set_permissions(&full, std::fs::Permissions::from_mode(0o700));
        }
    }
});
