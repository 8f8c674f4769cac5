//! Rendered files (config the master renders from templates) written into
//! an instance directory.
//!
//! The agent runs as root and the instance directory belongs to the
//! instance's user, who could swap a directory for a symlink at any moment.
//! So each file goes through [`beneath::write::write_file`]: every step is
//! relative to a directory fd opened with `O_NOFOLLOW`, a symlink anywhere
//! on the path is refused, never written through, even if it appears
//! between our check and our write, and the file is written to a temp file
//! in its own directory, synced, and renamed over the old one, so a reader
//! sees the old or the new content, never half of it. A rendered file may
//! not go into `data/`, `logs/` or `run/`: those are the instance's own.

use std::path::Path;

use sha2::{Digest, Sha256};

use super::beneath::{self, BeneathError, Dir, RelPath};
use super::installer::InstallError;
use crate::package::RESERVED_DIRS;
use crate::protocol::messages::RenderedFile;

/// sha256 of `bytes`, lowercase hex.
pub fn file_sha256(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Writes `files` under `dir` and returns the paths (as given) whose content
/// or mode changed. Missing parent directories are created; with `owner`,
/// new directories and the files are given to that uid/gid. Only the 0o777
/// bits of a file's mode are applied.
pub fn write_rendered_files(
    dir: &Path,
    files: &[RenderedFile],
    owner: Option<(u32, u32)>,
) -> Result<Vec<String>, InstallError> {
    let root = Dir::open(dir)?;
    let mut changed = Vec::new();
    for f in files {
        let rel = RelPath::parse(&f.path)?;
        if let Some(reserved) = RESERVED_DIRS.iter().find(|d| rel.first() == **d) {
            return Err(BeneathError::BadPath {
                path: f.path.clone(),
                reason: match *reserved {
                    "data" => "data/ is the instance's own: a rendered file may not go there",
                    "logs" => "logs/ is the instance's own: a rendered file may not go there",
                    _ => "run/ is the instance's own: a rendered file may not go there",
                },
            }
            .into());
        }
        if beneath::write::write_file(&root, &rel, &f.contents, f.mode, owner)? {
            changed.push(f.path.clone());
        }
    }
    Ok(changed)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    use super::*;

    fn rf(path: &str, contents: &str, mode: u32) -> RenderedFile {
        RenderedFile { path: path.into(), contents: contents.as_bytes().to_vec(), mode }
    }

    #[test]
    fn reports_only_files_that_changed() {
        let dir = tempfile::tempdir().unwrap();
        let files = vec![
            rf("conf/app.conf", "port = 1\n", 0o640),
            rf("env", "A=1\n", 0o600),
            rf("./conf/deep/x.yml", "x: 1\n", 0o644),
        ];
        let changed = write_rendered_files(dir.path(), &files, None).unwrap();
        assert_eq!(changed, vec!["conf/app.conf", "env", "./conf/deep/x.yml"]);
        assert_eq!(std::fs::read_to_string(dir.path().join("conf/app.conf")).unwrap(), "port = 1\n");
        let meta = std::fs::metadata(dir.path().join("conf/app.conf")).unwrap();
        assert_eq!(meta.permissions().mode() & 0o7777, 0o640);

        // Same again: nothing changed.
        assert!(write_rendered_files(dir.path(), &files, None).unwrap().is_empty());

        // One content change, one mode change.
        let next = vec![rf("conf/app.conf", "port = 2\n", 0o640), rf("env", "A=1\n", 0o644), files[2].clone()];
        assert_eq!(write_rendered_files(dir.path(), &next, None).unwrap(), vec!["conf/app.conf", "env"]);
        assert_eq!(std::fs::read_to_string(dir.path().join("conf/app.conf")).unwrap(), "port = 2\n");
        assert_eq!(std::fs::metadata(dir.path().join("env")).unwrap().permissions().mode() & 0o7777, 0o644);
        // Same length, different bytes.
        let next = vec![rf("conf/app.conf", "port = 3\n", 0o640)];
        assert_eq!(write_rendered_files(dir.path(), &next, None).unwrap(), vec!["conf/app.conf"]);
        // No temp files left behind.
        let names: Vec<_> =
            std::fs::read_dir(dir.path().join("conf")).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names.len(), 2, "{names:?}");
    }

    #[test]
    fn never_writes_through_a_symlink() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let inst = dir.path().join("inst");
        std::fs::create_dir(&inst).unwrap();
        std::os::unix::fs::symlink(outside.path(), inst.join("conf")).unwrap();
        std::fs::write(outside.path().join("target"), "keep").unwrap();
        std::os::unix::fs::symlink(outside.path().join("target"), inst.join("app.conf")).unwrap();

        let err = write_rendered_files(&inst, &[rf("conf/app.conf", "x", 0o644)], None).unwrap_err();
        assert!(matches!(&err, InstallError::Beneath(BeneathError::Symlink { link, .. }) if link == "conf"), "{err:?}");
        let err = write_rendered_files(&inst, &[rf("app.conf", "x", 0o644)], None).unwrap_err();
        assert!(
            matches!(&err, InstallError::Beneath(BeneathError::Symlink { link, .. }) if link == "app.conf"),
            "{err:?}"
        );
        assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 1);
        assert_eq!(std::fs::read_to_string(outside.path().join("target")).unwrap(), "keep");
    }

    #[test]
    fn bad_paths_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        for p in ["../x", "a/../../x", "/etc/passwd", "", ".", "dir/"] {
            let err = write_rendered_files(dir.path(), &[rf(p, "x", 0o644)], None).unwrap_err();
            assert!(matches!(err, InstallError::Beneath(BeneathError::BadPath { .. })), "{p}: {err:?}");
        }
        std::fs::write(dir.path().join("file"), "x").unwrap();
        let err = write_rendered_files(dir.path(), &[rf("file/x", "x", 0o644)], None).unwrap_err();
        assert!(matches!(err, InstallError::Beneath(BeneathError::NotDirectory { .. })), "{err:?}");
        for p in ["data/myid", "logs/x", "run/x.pid", "./data/x"] {
            let err = write_rendered_files(dir.path(), &[rf(p, "x", 0o644)], None).unwrap_err();
            assert!(err.to_string().contains("is the instance's own"), "{p}: {err}");
        }
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn setuid_bits_are_not_applied_and_owner_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let me = (nix::unistd::getuid().as_raw(), nix::unistd::getgid().as_raw());
        write_rendered_files(dir.path(), &[rf("bin/x", "#!/bin/sh\n", 0o4755)], Some(me)).unwrap();
        let meta = std::fs::metadata(dir.path().join("bin/x")).unwrap();
        assert_eq!(meta.permissions().mode() & 0o7777, 0o755);
        assert_eq!((meta.uid(), meta.gid()), me);
    }

    #[test]
    fn sha256_is_lowercase_hex() {
        assert_eq!(file_sha256(b"abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    }
}
