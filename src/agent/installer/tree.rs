//! Moving an extracted package into place.
//!
//! This runs as root on a tree whose carried-over `data/ logs/ run/` the
//! instance's user may have filled with links, so it goes through
//! `agent::beneath`: the carried entries are moved by `renameat` between
//! directory fds (a rename moves a link itself, never what it points at),
//! then judged where only root can write (the staging dir): anything but a
//! real directory is removed there instead of becoming part of the new
//! tree. The old tree and every leftover are removed by an fd walk.

use std::ffi::OsStr;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{AT_FDCWD, RenameFlags};

use super::InstallError;
use crate::agent::beneath::{self, BeneathError, Dir};
use crate::package::RESERVED_DIRS;

/// The mode of an instance directory and of its `data/ logs/ run/`: the
/// instance's user and group only (others on the node, other clusters'
/// instances included, may not even list it).
pub const INSTANCE_DIR_MODE: u32 = 0o750;

/// Moves `staging` to `final_dir`. When `final_dir` exists (reinstall,
/// upgrade), its `data/ logs/ run/` are moved into the new tree first, the
/// two trees are swapped atomically, and the old one is removed. Afterwards
/// `data/ logs/ run/` exist in `final_dir`, and it and they are mode 0o750;
/// those it made are `owner`'s (the staging tree is given to its user by
/// the caller before, while only root reaches it; what was carried over is
/// the caller's to give, see `beneath::tree::chown_tree`).
pub fn place_instance_dir(staging: &Path, final_dir: &Path, owner: Option<(u32, u32)>) -> Result<(), InstallError> {
    match fs::symlink_metadata(final_dir) {
        Ok(m) if m.is_dir() => replace(staging, final_dir)?,
        Ok(_) => {
            return Err(BeneathError::NotDirectory {
                path: final_dir.to_path_buf(),
                part: final_dir.display().to_string(),
            }
            .into());
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            if let Some(parent) = final_dir.parent() {
                fs::create_dir_all(parent).map_err(InstallError::io("create", parent))?;
            }
            fs::rename(staging, final_dir).map_err(InstallError::io("move the staging dir to", final_dir))?;
        }
        Err(e) => return Err(InstallError::io("inspect", final_dir)(e)),
    }
    let dir = Dir::open(final_dir)?;
    for d in RESERVED_DIRS {
        let sub = dir.ensure_dir(OsStr::new(d), INSTANCE_DIR_MODE, owner)?;
        set_mode(&sub)?;
    }
    set_mode(&dir)?;
    Ok(())
}

fn set_mode(dir: &Dir) -> Result<(), InstallError> {
    nix::sys::stat::fchmod(dir.fd(), nix::sys::stat::Mode::from_bits_truncate(INSTANCE_DIR_MODE))
        .map_err(InstallError::errno("set the mode of", dir.path()))
}

fn replace(staging: &Path, final_dir: &Path) -> Result<(), InstallError> {
    let old = Dir::open(final_dir)?;
    let new = Dir::open(staging)?;
    let mut carried: Vec<&str> = Vec::new();
    let undo = |carried: &[&str]| {
        for d in carried {
            let _ = nix::fcntl::renameat(new.fd(), *d, old.fd(), *d);
        }
    };
    for d in RESERVED_DIRS {
        // Moved whatever it is right now: the user may swap it at any
        // moment, so the check comes after, in the staging dir.
        match nix::fcntl::renameat(old.fd(), d, new.fd(), d) {
            Ok(()) => {}
            Err(Errno::ENOENT) => continue,
            Err(e) => {
                undo(&carried);
                return Err(InstallError::errno("carry over", &final_dir.join(d))(e));
            }
        }
        match new.stat(OsStr::new(d)) {
            Ok(Some(st)) if st.st_mode & libc::S_IFMT == libc::S_IFDIR => carried.push(d),
            Ok(_) => {
                // Only a real directory is carried: a link (or a FIFO, a
                // file) left here by the instance's user is removed, never
                // followed, and a fresh directory made in its place.
                tracing::warn!(path = %final_dir.join(d).display(), "not a directory; removed instead of carried over");
                beneath::tree::remove_tree(&new, OsStr::new(d))?;
            }
            Err(e) => {
                undo(&carried);
                return Err(e.into());
            }
        }
    }
    let moved = match swap(staging, final_dir) {
        Ok(old) => old,
        Err(e) => {
            undo(&carried);
            return Err(InstallError::io("move the staging dir to", final_dir)(e));
        }
    };
    if let Err(e) = beneath::tree::remove_path(&moved) {
        tracing::warn!(path = %moved.display(), error = %crate::error::ErrorChain(&e), "cannot remove the previous instance dir");
    }
    Ok(())
}

/// Puts `staging` at `final_dir` and returns where the old tree now is.
/// `RENAME_EXCHANGE` swaps both in one step, so `final_dir` never goes
/// missing; file systems without it get two renames. Both paths' parents
/// are the agent's own.
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
