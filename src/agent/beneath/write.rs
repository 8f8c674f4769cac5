//! Writing one file beneath a [`Dir`]: the parents walked (and created)
//! without following a link, the content written to a fresh temp file in
//! the target's own directory, synced, and renamed over the old one, so a
//! reader sees the old or the new content, never half of it, and nothing
//! is ever written through a link the instance planted.

use std::ffi::OsStr;
use std::fs::File;
use std::io::{Read, Write};

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::stat::{FileStat, Mode};
use nix::unistd::UnlinkatFlags;

use super::{BeneathError, Dir, RelPath};

/// Writes `contents` at `rel` beneath `root` with `mode` (its 0o777 bits)
/// and `owner`; returns whether the content or mode changed (an identical
/// file is left alone, its owner put right). Missing parents are created
/// 0o755, given to `owner`.
pub fn write_file(
    root: &Dir,
    rel: &RelPath,
    contents: &[u8],
    mode: u32,
    owner: Option<(u32, u32)>,
) -> Result<bool, BeneathError> {
    let (parents, name) = rel.split_last();
    let walked = root.ensure_dirs(parents, 0o755, owner).map_err(|e| relabel(e, rel, root))?;
    let at = walked.as_ref().unwrap_or(root);
    let full = root.path().join(rel.as_str());
    let io = |op: &'static str| {
        let full = full.clone();
        move |e: Errno| BeneathError::io(op, &full, e)
    };
    let mode = mode & 0o777;

    if let Some(st) = at.stat(name)? {
        match st.st_mode & libc::S_IFMT {
            libc::S_IFREG => {}
            libc::S_IFLNK => {
                return Err(BeneathError::Symlink { path: root.path().join(rel.as_str()), link: rel.as_str().into() });
            }
            _ => {
                return Err(BeneathError::NotRegular {
                    path: root.path().join(rel.as_str()),
                    kind: super::kind_of(st.st_mode),
                });
            }
        }
        let full = root.path().join(rel.as_str());
        if st.st_mode & 0o7777 == mode
            && same_content(at, name, &st, contents).map_err(|e| BeneathError::io("read", &full, e))?
        {
            if let Some((uid, gid)) = owner.filter(|(u, g)| st.st_uid != *u || st.st_gid != *g) {
                super::chown_at(at.fd(), name, uid, gid).map_err(|e| BeneathError::io("chown", &full, e))?;
            }
            return Ok(false);
        }
    }

    // A fresh temp file next to the target, then one rename.
    let mut tmp_name = OsStr::new(".").to_owned();
    tmp_name.push(name);
    tmp_name.push(format!(".flotilla-{}", uuid::Uuid::new_v4().simple()));
    let fd = nix::fcntl::openat(
        at.fd(),
        tmp_name.as_os_str(),
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(0o600),
    )
    .map_err(io("create a temp file for"))?;
    let full = root.path().join(rel.as_str());
    let written = (|| -> Result<(), BeneathError> {
        let mut file = File::from(fd);
        file.write_all(contents).map_err(|e| BeneathError::io("write", &full, e))?;
        nix::sys::stat::fchmod(&file, Mode::from_bits_truncate(mode)).map_err(io("chmod"))?;
        if let Some((uid, gid)) = owner {
            nix::unistd::fchown(&file, Some(nix::unistd::Uid::from_raw(uid)), Some(nix::unistd::Gid::from_raw(gid)))
                .map_err(io("chown"))?;
        }
        file.sync_all().map_err(|e| BeneathError::io("sync", &full, e))?;
        nix::fcntl::renameat(at.fd(), tmp_name.as_os_str(), at.fd(), name).map_err(io("rename into place"))
    })();
    if let Err(e) = written {
        let _ = nix::unistd::unlinkat(at.fd(), tmp_name.as_os_str(), UnlinkatFlags::NoRemoveDir);
        return Err(e);
    }
    // Make the rename itself durable.
    nix::unistd::fsync(at.fd()).map_err(io("sync the directory of"))?;
    Ok(true)
}

/// A refusal met while walking the parents, said of the whole path.
fn relabel(e: BeneathError, rel: &RelPath, root: &Dir) -> BeneathError {
    let path = root.path().join(rel.as_str());
    match e {
        BeneathError::Symlink { link, .. } => BeneathError::Symlink { path, link },
        BeneathError::NotDirectory { part, .. } => BeneathError::NotDirectory { path, part },
        other => other,
    }
}

/// Compares the existing regular file with `want`, byte for byte.
fn same_content(at: &Dir, name: &OsStr, st: &FileStat, want: &[u8]) -> Result<bool, Errno> {
    if u64::try_from(st.st_size).ok() != Some(want.len() as u64) {
        return Ok(false);
    }
    // O_NONBLOCK: if the file was swapped for a FIFO since the stat, the
    // open must not hang; O_NOFOLLOW: nor may it follow a new link.
    let fd = nix::fcntl::openat(
        at.fd(),
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
