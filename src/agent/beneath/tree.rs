//! Whole trees inside an instance directory, walked through directory fds:
//! giving a tree to the run-as user, and removing one. Every entry is
//! reached from its parent's fd and inspected without following it, so a
//! link anywhere (or a directory swapped for one mid-walk) is chowned or
//! unlinked itself, never what it points at.

use std::collections::HashMap;
use std::ffi::OsString;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::rc::Rc;

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::Mode;
use nix::unistd::UnlinkatFlags;

use super::{BeneathError, Dir, chown_fd, open_dir_fd, open_path};

const DIR_FLAGS: OFlag = OFlag::O_RDONLY.union(OFlag::O_DIRECTORY).union(OFlag::O_NOFOLLOW).union(OFlag::O_CLOEXEC);

/// The names in the directory `fd` (not `.` and `..`). The listing goes
/// through the fd, not a path, so it is this very directory even if its
/// path was swapped meanwhile.
fn names(fd: &OwnedFd, shown: &Path) -> Result<Vec<OsString>, BeneathError> {
    let listing = std::fs::read_dir(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .map_err(|e| BeneathError::io("list", shown, e))?;
    listing.map(|e| e.map(|e| e.file_name()).map_err(|e| BeneathError::io("list", shown, e))).collect()
}

/// The most hard-linked files [`chown_tree`] holds (an fd each) to check
/// that all their links are inside the tree.
const MAX_LINKED: usize = 4096;

/// A file by (device, inode): hard-linked files seen in a tree are kept by
/// it, with their link count and the entries (fd, path) naming them.
type Inode = (u64, u64);

/// Gives `dir` and everything under it to `uid:gid` without following any
/// symlink (links themselves are chowned). Each entry is opened (`O_PATH`),
/// inspected and chowned through that fd, so what was checked is what is
/// chowned.
///
/// `from: None` gives everything not owned right: only for a tree no one
/// else can reach (a staging dir of root's), since a file with several hard
/// links is given only when all of them were seen in the tree (a package's
/// own hard links), which a tree its user can rename in cannot prove.
/// `from: Some(uid)` gives only what `uid` owns (the instance's previous
/// user, in the `data/ logs/ run/` an upgrade carried over): whatever else
/// is there, such as a hard link to a file of root's, stays as it is.
pub fn chown_tree(dir: &Path, uid: u32, gid: u32, from: Option<u32>) -> Result<(), BeneathError> {
    let root = open_dir_fd(dir).map_err(|e| BeneathError::io("open", dir, e))?;
    let st = nix::sys::stat::fstat(&root).map_err(|e| BeneathError::io("inspect", dir, e))?;
    if (st.st_uid != uid || st.st_gid != gid) && from.is_none_or(|f| st.st_uid == f) {
        nix::unistd::fchown(&root, Some(nix::unistd::Uid::from_raw(uid)), Some(nix::unistd::Gid::from_raw(gid)))
            .map_err(|e| BeneathError::io("chown", dir, e))?;
    }
    let give = |fd: &OwnedFd, st: &nix::sys::stat::FileStat, path: &Path| -> Result<(), BeneathError> {
        if (st.st_uid == uid && st.st_gid == gid) || from.is_some_and(|f| st.st_uid != f) {
            return Ok(());
        }
        match chown_fd(fd.as_fd(), uid, gid) {
            Ok(()) | Err(Errno::ENOENT) => Ok(()),
            Err(e) => Err(BeneathError::io("chown", path, e)),
        }
    };
    let mut linked: HashMap<Inode, (u64, Vec<(OwnedFd, PathBuf)>)> = HashMap::new();
    let mut linked_seen = 0;
    // Pending directories as (parent fd, name): a directory is opened only
    // when it is walked, so open fds stay around the tree's depth.
    let mut pending: Vec<(Rc<OwnedFd>, OsString, PathBuf)> = Vec::new();
    let mut current = Some((Rc::new(root), dir.to_path_buf()));
    while let Some((fd, path)) = current.take() {
        for name in names(&fd, &path)? {
            let child = path.join(&name);
            let entry = match open_path(fd.as_fd(), &name) {
                Ok(entry) => entry,
                Err(Errno::ENOENT) => continue, // removed meanwhile
                Err(e) => return Err(BeneathError::io("open", &child, e)),
            };
            let st = nix::sys::stat::fstat(&entry).map_err(|e| BeneathError::io("inspect", &child, e))?;
            let is_dir = st.st_mode & libc::S_IFMT == libc::S_IFDIR;
            if !is_dir && st.st_nlink > 1 && from.is_none() && (st.st_uid != uid || st.st_gid != gid) {
                linked_seen += 1;
                if linked_seen > MAX_LINKED {
                    return Err(BeneathError::TooManyLinked { path: dir.to_path_buf(), max: MAX_LINKED });
                }
                linked
                    .entry((st.st_dev, st.st_ino))
                    .or_insert_with(|| (st.st_nlink, Vec::new()))
                    .1
                    .push((entry, child));
                continue;
            }
            give(&entry, &st, &child)?;
            if is_dir {
                pending.push((Rc::clone(&fd), name, child));
            }
        }
        drop(fd);
        while let Some((parent, name, child)) = pending.pop() {
            match nix::fcntl::openat(&*parent, name.as_os_str(), DIR_FLAGS, Mode::empty()) {
                Ok(fd) => {
                    current = Some((Rc::new(fd), child));
                    break;
                }
                // Gone, or replaced by a link since the stat: nothing to walk.
                Err(Errno::ENOENT | Errno::ELOOP | Errno::ENOTDIR) => continue,
                Err(e) => return Err(BeneathError::io("open", &child, e)),
            }
        }
    }
    for (links, entries) in linked.into_values() {
        if entries.len() as u64 != links {
            let path = entries[0].1.clone();
            return Err(BeneathError::LinkedOutside { path, links, inside: entries.len() });
        }
        for (fd, path) in &entries {
            let st = nix::sys::stat::fstat(fd).map_err(|e| BeneathError::io("inspect", path, e))?;
            give(fd, &st, path)?;
        }
    }
    Ok(())
}

/// Removes the entry `name` of `parent` and, when it is a directory,
/// everything under it, never following a link: a link is unlinked, a
/// FIFO or socket removed without being opened. Returns whether anything
/// was there.
pub fn remove_tree(parent: &Dir, name: &std::ffi::OsStr) -> Result<bool, BeneathError> {
    let Some(st) = parent.stat(name)? else { return Ok(false) };
    if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
        return unlink(parent.fd.as_fd(), name, false, &parent.path().join(name)).map(|_| true);
    }
    // Depth first with an explicit stack of open directories: (fd, its
    // path for messages, names still to visit).
    let top = parent.path().join(name);
    let fd = match nix::fcntl::openat(parent.fd(), name, DIR_FLAGS, Mode::empty()) {
        Ok(fd) => fd,
        // Swapped for a link or a file since the stat: remove that instead.
        Err(Errno::ELOOP | Errno::ENOTDIR) => return unlink(parent.fd(), name, false, &top).map(|_| true),
        Err(Errno::ENOENT) => return Ok(false),
        Err(e) => return Err(BeneathError::io("open", &top, e)),
    };
    let first = names(&fd, &top)?;
    let mut stack: Vec<(OwnedFd, PathBuf, Vec<OsString>)> = vec![(fd, top.clone(), first)];
    while let Some((fd, path, mut todo)) = stack.pop() {
        let Some(entry) = todo.pop() else {
            // Empty now: remove it from its parent.
            drop(fd);
            let (at, leaf) = match stack.last() {
                Some((parent_fd, _, _)) => (parent_fd.as_fd(), path.file_name().map(|n| n.to_os_string())),
                None => (parent.fd(), Some(name.to_os_string())),
            };
            if let Some(leaf) = leaf {
                unlink(at, &leaf, true, &path)?;
            }
            continue;
        };
        let child = path.join(&entry);
        let st = match nix::sys::stat::fstatat(&fd, entry.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(Errno::ENOENT) => {
                stack.push((fd, path, todo));
                continue;
            }
            Err(e) => return Err(BeneathError::io("inspect", &child, e)),
        };
        if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
            match nix::fcntl::openat(&fd, entry.as_os_str(), DIR_FLAGS, Mode::empty()) {
                Ok(sub) => {
                    let listing = names(&sub, &child)?;
                    stack.push((fd, path, todo));
                    stack.push((sub, child, listing));
                }
                Err(Errno::ELOOP | Errno::ENOTDIR) => {
                    unlink(fd.as_fd(), &entry, false, &child)?;
                    stack.push((fd, path, todo));
                }
                Err(Errno::ENOENT) => stack.push((fd, path, todo)),
                Err(e) => return Err(BeneathError::io("open", &child, e)),
            }
        } else {
            unlink(fd.as_fd(), &entry, false, &child)?;
            stack.push((fd, path, todo));
        }
    }
    Ok(true)
}

/// Removes the directory `path` (whose parents are the agent's own) and
/// everything under it, as [`remove_tree`] does; `false` when it was not
/// there.
pub fn remove_path(path: &Path) -> Result<bool, BeneathError> {
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(BeneathError::BadPath { path: path.display().to_string(), reason: "no parent directory" });
    };
    let parent = match Dir::open(parent) {
        Ok(dir) => dir,
        Err(e) if e.is_not_found() => return Ok(false),
        Err(e) => return Err(e),
    };
    remove_tree(&parent, name)
}

/// `unlinkat`, a directory (`rmdir`) or anything else; gone is fine.
fn unlink(
    at: std::os::fd::BorrowedFd<'_>,
    name: &std::ffi::OsStr,
    dir: bool,
    shown: &Path,
) -> Result<(), BeneathError> {
    let how = if dir { UnlinkatFlags::RemoveDir } else { UnlinkatFlags::NoRemoveDir };
    match nix::unistd::unlinkat(at, name, how) {
        Ok(()) | Err(Errno::ENOENT) => Ok(()),
        Err(e) => Err(BeneathError::io("remove", shown, e)),
    }
}
