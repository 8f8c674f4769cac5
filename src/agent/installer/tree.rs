//! Moving an extracted package into place and handing it to the run-as user.
//!
//! Both run as root on a tree that an instance's user may write to (the
//! carried-over `data/ logs/ run/`), so neither follows a symlink: carried
//! dirs must be real directories, and ownership is changed through
//! directory file descriptors (`fstatat`/`fchownat` with
//! `AT_SYMLINK_NOFOLLOW`, `openat` with `O_NOFOLLOW`), so swapping a
//! directory for a link mid-walk cannot redirect a chown outside the tree.

use std::ffi::OsString;
use std::fs;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::rc::Rc;

use nix::errno::Errno;
use nix::fcntl::{AT_FDCWD, AtFlags, OFlag, RenameFlags};
use nix::sys::stat::Mode;
use nix::unistd::{Gid, Uid};

use super::InstallError;
use crate::package::RESERVED_DIRS;

/// Moves `staging` to `final_dir`. When `final_dir` exists (reinstall,
/// upgrade), its `data/ logs/ run/` are moved into the new tree first, the
/// two trees are swapped atomically, and the old one is removed. Afterwards
/// `data/ logs/ run/` exist in `final_dir`.
pub fn place_instance_dir(staging: &Path, final_dir: &Path) -> Result<(), InstallError> {
    match fs::symlink_metadata(final_dir) {
        Ok(m) if m.is_dir() => replace(staging, final_dir)?,
        Ok(_) => {
            return Err(InstallError::BadPath {
                path: final_dir.display().to_string(),
                reason: "exists and is not a directory",
            });
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            if let Some(parent) = final_dir.parent() {
                fs::create_dir_all(parent).map_err(InstallError::io("create", parent))?;
            }
            fs::rename(staging, final_dir).map_err(InstallError::io("move the staging dir to", final_dir))?;
        }
        Err(e) => return Err(InstallError::io("inspect", final_dir)(e)),
    }
    for d in RESERVED_DIRS {
        let p = final_dir.join(d);
        match fs::create_dir(&p) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(InstallError::io("create", &p)(e)),
        }
    }
    Ok(())
}

fn replace(staging: &Path, final_dir: &Path) -> Result<(), InstallError> {
    let mut carried: Vec<&str> = Vec::new();
    let undo = |carried: &[&str]| {
        for d in carried {
            let _ = fs::rename(staging.join(d), final_dir.join(d));
        }
    };
    for d in RESERVED_DIRS {
        let from = final_dir.join(d);
        match fs::symlink_metadata(&from) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                // Only a real directory is carried: a link left here by the
                // instance's user must not become part of the new tree.
                tracing::warn!(path = %from.display(), "not a directory; dropped with the old instance dir");
                continue;
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => {
                undo(&carried);
                return Err(InstallError::io("inspect", &from)(e));
            }
        }
        if let Err(e) = fs::rename(&from, staging.join(d)) {
            undo(&carried);
            return Err(InstallError::io("carry over", &from)(e));
        }
        carried.push(d);
    }
    let old = match swap(staging, final_dir) {
        Ok(old) => old,
        Err(e) => {
            undo(&carried);
            return Err(InstallError::io("move the staging dir to", final_dir)(e));
        }
    };
    if let Err(e) = fs::remove_dir_all(&old) {
        tracing::warn!(path = %old.display(), error = %e, "cannot remove the previous instance dir");
    }
    Ok(())
}

/// Puts `staging` at `final_dir` and returns where the old tree now is.
/// `RENAME_EXCHANGE` swaps both in one step, so `final_dir` never goes
/// missing; file systems without it get two renames.
fn swap(staging: &Path, final_dir: &Path) -> io::Result<PathBuf> {
    match nix::fcntl::renameat2(AT_FDCWD, staging, AT_FDCWD, final_dir, RenameFlags::RENAME_EXCHANGE) {
        Ok(()) => return Ok(staging.to_path_buf()),
        Err(Errno::EINVAL | Errno::ENOSYS | Errno::EOPNOTSUPP) => {}
        Err(e) => return Err(e.into()),
    }
    let mut aside = final_dir.as_os_str().to_owned();
    aside.push(format!(".old-{}", uuid::Uuid::new_v4().simple()));
    let aside = PathBuf::from(aside);
    fs::rename(final_dir, &aside)?;
    if let Err(e) = fs::rename(staging, final_dir) {
        let _ = fs::rename(&aside, final_dir);
        return Err(e);
    }
    Ok(aside)
}

/// Gives `dir` and everything under it to `uid:gid` without following any
/// symlink (links themselves are chowned). Entries already owned right are
/// left alone.
pub fn chown_tree_nofollow(dir: &Path, uid: u32, gid: u32) -> Result<(), InstallError> {
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let root = nix::fcntl::openat(AT_FDCWD, dir, flags, Mode::empty()).map_err(InstallError::errno("open", dir))?;
    let st = nix::sys::stat::fstat(&root).map_err(InstallError::errno("stat", dir))?;
    if st.st_uid != uid || st.st_gid != gid {
        nix::unistd::fchown(&root, Some(Uid::from_raw(uid)), Some(Gid::from_raw(gid)))
            .map_err(InstallError::errno("chown", dir))?;
    }
    // Pending directories as (parent fd, name): a directory is opened only
    // when it is walked, so open fds stay around the tree's depth.
    let mut pending: Vec<(Rc<OwnedFd>, OsString, PathBuf)> = Vec::new();
    let mut current = Some((Rc::new(root), dir.to_path_buf()));
    while let Some((fd, path)) = current.take() {
        // The listing goes through the fd, not the path, so it is this
        // very directory even if the path was swapped meanwhile.
        let listing =
            fs::read_dir(format!("/proc/self/fd/{}", fd.as_raw_fd())).map_err(InstallError::io("list", &path))?;
        for entry in listing {
            let name = entry.map_err(InstallError::io("list", &path))?.file_name();
            let child = path.join(&name);
            let st = match nix::sys::stat::fstatat(&*fd, name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW) {
                Ok(st) => st,
                Err(Errno::ENOENT) => continue, // removed meanwhile
                Err(e) => return Err(InstallError::errno("stat", &child)(e)),
            };
            if st.st_uid != uid || st.st_gid != gid {
                nix::unistd::fchownat(
                    &*fd,
                    name.as_os_str(),
                    Some(Uid::from_raw(uid)),
                    Some(Gid::from_raw(gid)),
                    AtFlags::AT_SYMLINK_NOFOLLOW,
                )
                .map_err(InstallError::errno("chown", &child))?;
            }
            if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
                pending.push((Rc::clone(&fd), name, child));
            }
        }
        drop(fd);
        while let Some((parent, name, child)) = pending.pop() {
            match nix::fcntl::openat(&*parent, name.as_os_str(), flags, Mode::empty()) {
                Ok(fd) => {
                    current = Some((Rc::new(fd), child));
                    break;
                }
                // Gone, or replaced by a link since the stat: nothing to walk.
                Err(Errno::ENOENT | Errno::ELOOP | Errno::ENOTDIR) => continue,
                Err(e) => return Err(InstallError::errno("open", &child)(e)),
            }
        }
    }
    Ok(())
}
