//! Rendered files (config the master renders from templates) written into
//! an instance directory.
//!
//! The agent runs as root and the instance directory belongs to the
//! instance's user, who could swap a directory for a symlink at any moment.
//! So every step is relative to a directory fd opened with `O_NOFOLLOW`:
//! a symlink anywhere on the path is refused, never written through, even
//! if it appears between our check and our write. Each file is written to a
//! temp file in its own directory, synced, and renamed over the old one, so
//! a reader sees the old or the new content, never half of it.

use std::ffi::OsStr;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::path::{Component, Path};

use nix::errno::Errno;
use nix::fcntl::{AT_FDCWD, AtFlags, OFlag};
use nix::sys::stat::{FileStat, Mode};
use nix::unistd::{Gid, Uid, UnlinkatFlags};
use sha2::{Digest, Sha256};

use super::installer::InstallError;
use crate::protocol::messages::RenderedFile;

/// Longest accepted rendered-file path, in bytes.
const MAX_PATH_LEN: usize = 4096;

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
    let root = open_dir(AT_FDCWD, dir.as_os_str()).map_err(|e| InstallError::io("open", dir)(e.into()))?;
    let mut changed = Vec::new();
    for f in files {
        if write_one(&root, dir, f, owner)? {
            changed.push(f.path.clone());
        }
    }
    Ok(changed)
}

fn open_dir<Fd: std::os::fd::AsFd>(at: Fd, name: &OsStr) -> nix::Result<OwnedFd> {
    nix::fcntl::openat(
        at,
        name,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
}

fn bad(path: &str, reason: &'static str) -> InstallError {
    InstallError::BadPath { path: path.to_string(), reason }
}

/// The path's components, refusing anything that is not a plain relative path.
fn components(path: &str) -> Result<Vec<&OsStr>, InstallError> {
    if path.len() > MAX_PATH_LEN {
        return Err(bad(path, "path is too long"));
    }
    let mut parts = Vec::new();
    for c in Path::new(path).components() {
        match c {
            Component::Normal(n) => parts.push(n),
            Component::CurDir => {}
            Component::ParentDir => return Err(bad(path, "`..` is not allowed")),
            Component::RootDir | Component::Prefix(_) => return Err(bad(path, "absolute paths are not allowed")),
        }
    }
    if parts.is_empty() || path.ends_with('/') {
        return Err(bad(path, "not a file path"));
    }
    Ok(parts)
}

fn write_one(root: &OwnedFd, dir: &Path, f: &RenderedFile, owner: Option<(u32, u32)>) -> Result<bool, InstallError> {
    let parts = components(&f.path)?;
    let (name, parents) = parts.split_last().ok_or_else(|| bad(&f.path, "not a file path"))?;
    let full = dir.join(&f.path);
    let err = |op: &'static str| InstallError::errno(op, &full);
    let through = |upto: usize| InstallError::ThroughSymlink {
        path: f.path.clone(),
        link: parts[..=upto].iter().map(|p| p.to_string_lossy()).collect::<Vec<_>>().join("/"),
    };

    // Walk down, creating what is missing, never following a link.
    let mut current: Option<OwnedFd> = None;
    for (i, part) in parents.iter().enumerate() {
        let at = current.as_ref().unwrap_or(root);
        let next = match open_dir(at, part) {
            Ok(fd) => fd,
            Err(Errno::ENOENT) => {
                match nix::sys::stat::mkdirat(at, *part, Mode::from_bits_truncate(0o755)) {
                    Ok(()) | Err(Errno::EEXIST) => {}
                    Err(e) => return Err(err("create a directory for")(e)),
                }
                if let Some((uid, gid)) = owner {
                    chown_at(at, part, uid, gid).map_err(err("chown a directory for"))?;
                }
                open_dir(at, part).map_err(|e| open_failure(at, part, e, &full).unwrap_or_else(|| through(i)))?
            }
            Err(e) => return Err(open_failure(at, part, e, &full).unwrap_or_else(|| through(i))),
        };
        current = Some(next);
    }
    let at = current.as_ref().unwrap_or(root);
    let mode = f.mode & 0o777;

    let existing = match nix::sys::stat::fstatat(at, *name, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(st) => Some(st),
        Err(Errno::ENOENT) => None,
        Err(e) => return Err(err("inspect")(e)),
    };
    if let Some(st) = &existing {
        match st.st_mode & libc::S_IFMT {
            libc::S_IFREG => {}
            libc::S_IFLNK => return Err(through(parts.len() - 1)),
            _ => return Err(bad(&f.path, "exists and is not a regular file")),
        }
        if st.st_mode & 0o7777 == mode && same_content(at, name, st, &f.contents).map_err(err("read"))? {
            if let Some((uid, gid)) = owner.filter(|(u, g)| st.st_uid != *u || st.st_gid != *g) {
                chown_at(at, name, uid, gid).map_err(err("chown"))?;
            }
            return Ok(false);
        }
    }

    // A fresh temp file next to the target, then one rename.
    let mut tmp_name = OsStr::new(".").to_owned();
    tmp_name.push(name);
    tmp_name.push(format!(".flotilla-{}", uuid::Uuid::new_v4().simple()));
    let fd = nix::fcntl::openat(
        at,
        tmp_name.as_os_str(),
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(0o600),
    )
    .map_err(err("create a temp file for"))?;
    let written = (|| -> Result<(), InstallError> {
        let mut file = File::from(fd);
        file.write_all(&f.contents).map_err(InstallError::io("write", &full))?;
        nix::sys::stat::fchmod(&file, Mode::from_bits_truncate(mode)).map_err(err("chmod"))?;
        if let Some((uid, gid)) = owner {
            nix::unistd::fchown(&file, Some(Uid::from_raw(uid)), Some(Gid::from_raw(gid))).map_err(err("chown"))?;
        }
        file.sync_all().map_err(InstallError::io("sync", &full))?;
        nix::fcntl::renameat(at, tmp_name.as_os_str(), at, *name).map_err(err("rename into place"))
    })();
    if let Err(e) = written {
        let _ = nix::unistd::unlinkat(at, tmp_name.as_os_str(), UnlinkatFlags::NoRemoveDir);
        return Err(e);
    }
    // Make the rename itself durable.
    nix::unistd::fsync(at).map_err(err("sync the directory of"))?;
    Ok(true)
}

/// Why opening the parent `part` as a directory failed; `None` when it is
/// a symlink (`O_NOFOLLOW | O_DIRECTORY` on a link gives ELOOP or ENOTDIR).
fn open_failure(at: &OwnedFd, part: &OsStr, e: Errno, full: &Path) -> Option<InstallError> {
    if !matches!(e, Errno::ELOOP | Errno::ENOTDIR) {
        return Some(InstallError::errno("open a directory for", full)(e));
    }
    match nix::sys::stat::fstatat(at, part, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(st) if st.st_mode & libc::S_IFMT == libc::S_IFLNK => None,
        _ => Some(bad(&full.display().to_string(), "a parent is not a directory")),
    }
}

fn chown_at<Fd: std::os::fd::AsFd>(at: Fd, name: &OsStr, uid: u32, gid: u32) -> nix::Result<()> {
    nix::unistd::fchownat(at, name, Some(Uid::from_raw(uid)), Some(Gid::from_raw(gid)), AtFlags::AT_SYMLINK_NOFOLLOW)
}

/// Compares the existing regular file with `want`, byte for byte.
fn same_content<Fd: std::os::fd::AsFd>(at: Fd, name: &OsStr, st: &FileStat, want: &[u8]) -> nix::Result<bool> {
    if u64::try_from(st.st_size).ok() != Some(want.len() as u64) {
        return Ok(false);
    }
    // O_NONBLOCK: if the file was swapped for a fifo since the stat, the
    // open must not hang; O_NOFOLLOW: nor may it follow a new link.
    let fd = nix::fcntl::openat(
        at,
        name,
        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    if nix::sys::stat::fstat(&fd)?.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Ok(false);
    }
    let mut have = Vec::with_capacity(want.len());
    File::from(fd)
        .take(want.len() as u64 + 1)
        .read_to_end(&mut have)
        .map_err(|e| Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)))?;
    Ok(have == want)
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
        assert!(matches!(&err, InstallError::ThroughSymlink { link, .. } if link == "conf"), "{err:?}");
        let err = write_rendered_files(&inst, &[rf("app.conf", "x", 0o644)], None).unwrap_err();
        assert!(matches!(&err, InstallError::ThroughSymlink { link, .. } if link == "app.conf"), "{err:?}");
        assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 1);
        assert_eq!(std::fs::read_to_string(outside.path().join("target")).unwrap(), "keep");
    }

    #[test]
    fn bad_paths_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        for p in ["../x", "a/../../x", "/etc/passwd", "", ".", "dir/"] {
            let err = write_rendered_files(dir.path(), &[rf(p, "x", 0o644)], None).unwrap_err();
            assert!(matches!(err, InstallError::BadPath { .. }), "{p}: {err:?}");
        }
        std::fs::write(dir.path().join("file"), "x").unwrap();
        let err = write_rendered_files(dir.path(), &[rf("file/x", "x", 0o644)], None).unwrap_err();
        assert!(matches!(err, InstallError::BadPath { .. }), "{err:?}");
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
