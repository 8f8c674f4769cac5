//! Every file operation the agent makes inside an instance directory, in
//! one place, so none of them follows what the instance can change.
//!
//! The agent usually runs as root, and an instance directory belongs to the
//! instance's user, who may at any moment put a symlink, a hard link, a FIFO
//! or a socket where the agent expects its own log, pidfile or rendered
//! file, or swap a directory for a link between a check and a use. A root
//! `open` that followed any of them would read `/etc/shadow` or the master's
//! CA key back to an API caller, write where the instance may not, or hang
//! on a FIFO. So here:
//!
//! - A [`Dir`] is an open directory fd; everything beneath it is reached
//!   relative to that fd, never by a path string the kernel walks again.
//!   The instance directory itself is opened from the agent's own
//!   `<data>/instances/` (root's), without following a final link.
//! - A relative path ([`RelPath`]) is plain: no `..`, no absolute path, no
//!   empty or over-long name. It is resolved with `openat2` and
//!   `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS` (no link anywhere on the path,
//!   magic links included, and nothing outside the directory), or, on a
//!   kernel without `openat2` (before 5.6, or a seccomp filter refusing it),
//!   by a walk that opens one component at a time with `O_NOFOLLOW` from
//!   the directory fd ([`Resolver`]). Either way a link swapped in between
//!   a check and the open is refused, not followed, and so is a mount point
//!   on the way (`RESOLVE_NO_XDEV`; the walk compares `st_dev`): an
//!   instance that can mount (FUSE) could make a read there hang.
//! - Files are opened with `O_NONBLOCK` (a FIFO or a device answers at once
//!   instead of holding a thread) and checked with `fstat` on the open fd:
//!   only a regular file is read or written, optionally one owned by the
//!   instance's user (a hard link to root's file is root's) and with a
//!   single link ([`Expect`]).
//! - Trees are walked (chown, removal) through directory fds as well
//!   ([`tree`]); a chown goes through an `O_PATH` fd of what was checked,
//!   and a hard-linked file is given only when all its links are in the
//!   tree; and rendered files are written through a temp file and
//!   one `renameat` in the same directory ([`write`]).
//!
//! Callers: log reads (`node::logs`), pidfile reads (`process::pidfile`),
//! the log files of spawned commands (`process::spawn`), rendered files
//! (`files`), the upgrade's carry-over of `data/ logs/ run/` and the chown
//! after an install (`installer::tree`), and a delete's removal
//! (`node::stop`). `fuzz/fuzz_targets/beneath.rs` runs the resolver over
//! random trees of links, FIFOs and directories.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU8, Ordering};

use nix::errno::Errno;
use nix::fcntl::{AT_FDCWD, AtFlags, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{FileStat, Mode};

pub mod tree;
pub mod write;

#[cfg(test)]
mod tests;

/// Longest accepted relative path, in bytes.
pub const MAX_PATH_LEN: usize = 4096;

/// Why an operation inside an instance directory was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum BeneathError {
    #[error("invalid path {path:?}: {reason}")]
    BadPath { path: String, reason: &'static str },
    #[error("refusing {path}: {link} is a symbolic link")]
    Symlink { path: PathBuf, link: String },
    #[error("refusing {path}: {part} is not a directory")]
    NotDirectory { path: PathBuf, part: String },
    #[error("refusing {path}: it is {kind}, not a regular file")]
    NotRegular { path: PathBuf, kind: &'static str },
    #[error("refusing {path}: it belongs to uid {uid}, not to the instance's user (uid {want})")]
    ForeignOwner { path: PathBuf, uid: u32, want: u32 },
    #[error("refusing {path}: a mount point is on its path")]
    Mount { path: PathBuf },
    #[error("refusing {path}: it has {links} hard links")]
    HardLinked { path: PathBuf, links: u64 },
    #[error(
        "refusing to chown {path}: it has {links} hard links, {inside} of them in the tree; the others may be files outside the instance"
    )]
    LinkedOutside { path: PathBuf, links: u64, inside: usize },
    #[error("refusing to chown {path}: the tree has more than {max} hard-linked files")]
    TooManyLinked { path: PathBuf, max: usize },
    #[error("cannot {op} {path}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

impl BeneathError {
    /// True when the thing asked for does not exist (a log not written yet).
    pub fn is_not_found(&self) -> bool {
        matches!(self, BeneathError::Io { source, .. } if source.kind() == io::ErrorKind::NotFound)
    }

    /// True when the path met something the instance put there instead of
    /// what the agent expects (a link, a FIFO, another user's file): a
    /// refusal, as opposed to an i/o failure.
    pub fn is_refusal(&self) -> bool {
        !matches!(self, BeneathError::Io { .. })
    }

    fn io(op: &'static str, path: &Path, e: impl Into<io::Error>) -> BeneathError {
        BeneathError::Io { op, path: path.to_path_buf(), source: e.into() }
    }
}

/// How paths beneath a directory are resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolver {
    /// `openat2` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`, falling back
    /// to [`Resolver::Walk`] where the kernel refuses the call.
    Openat2,
    /// One component at a time with `O_NOFOLLOW` (tests and the fuzz target
    /// run it on kernels that have `openat2`, too).
    Walk,
}

/// Whether this kernel answers `openat2`: unknown, yes, no.
static OPENAT2: AtomicU8 = AtomicU8::new(0);
const UNKNOWN: u8 = 0;
const YES: u8 = 1;
const NO: u8 = 2;

/// What an opened file must be, besides a regular file.
#[derive(Debug, Clone, Copy, Default)]
pub struct Expect {
    /// Owned by this uid (the instance's user): a hard link the instance
    /// made to a file of root's, or of another user's, is refused.
    pub owner: Option<u32>,
    /// Exactly one link: the agent is about to write to or chown it, and a
    /// second name would be another file the instance points it at.
    pub single_link: bool,
}

/// A plain relative path: only normal components (`.` is skipped).
#[derive(Debug, Clone)]
pub struct RelPath {
    shown: String,
    parts: Vec<OsString>,
}

impl RelPath {
    /// Parses `path`, refusing `..`, absolute paths, empty paths, a
    /// trailing `/`, NUL bytes and paths over [`MAX_PATH_LEN`].
    pub fn parse(path: &str) -> Result<RelPath, BeneathError> {
        let bad = |reason| BeneathError::BadPath { path: crate::ids::shorten(path, 200), reason };
        if path.len() > MAX_PATH_LEN {
            return Err(bad("the path is too long"));
        }
        if path.contains('\0') {
            return Err(bad("the path holds a NUL byte"));
        }
        let mut parts = Vec::new();
        for c in Path::new(path).components() {
            match c {
                Component::Normal(n) => parts.push(n.to_os_string()),
                Component::CurDir => {}
                Component::ParentDir => return Err(bad("`..` is not allowed")),
                Component::RootDir | Component::Prefix(_) => return Err(bad("absolute paths are not allowed")),
            }
        }
        if parts.is_empty() || path.ends_with('/') {
            return Err(bad("not a file path"));
        }
        Ok(RelPath { shown: path.to_string(), parts })
    }

    /// One plain name (no `/`), e.g. `stdout.log`.
    pub fn name(name: &str) -> Result<RelPath, BeneathError> {
        if name.contains('/') || name == "." || name == ".." {
            return Err(BeneathError::BadPath {
                path: crate::ids::shorten(name, 200),
                reason: "not a plain file name",
            });
        }
        RelPath::parse(name)
    }

    pub fn parts(&self) -> &[OsString] {
        &self.parts
    }

    /// The first component (`logs` of `logs/stdout.log`).
    pub fn first(&self) -> &OsStr {
        &self.parts[0]
    }

    pub fn as_str(&self) -> &str {
        &self.shown
    }

    /// Splits off the last component: (parents, file name).
    fn split_last(&self) -> (&[OsString], &OsStr) {
        let (last, parents) = self.parts.split_last().expect("a RelPath has a component");
        (parents, last)
    }
}

/// An open directory: everything beneath it is reached through its fd.
#[derive(Debug)]
pub struct Dir {
    fd: OwnedFd,
    /// For messages only; never used to reach the directory again.
    shown: PathBuf,
    resolver: Resolver,
}

/// A file type, as said in refusals.
fn kind_of(mode: u32) -> &'static str {
    match mode & libc::S_IFMT {
        libc::S_IFREG => "a regular file",
        libc::S_IFDIR => "a directory",
        libc::S_IFLNK => "a symbolic link",
        libc::S_IFIFO => "a FIFO",
        libc::S_IFSOCK => "a socket",
        libc::S_IFCHR => "a character device",
        libc::S_IFBLK => "a block device",
        _ => "of an unknown type",
    }
}

const DIR_FLAGS: OFlag = OFlag::O_RDONLY.union(OFlag::O_DIRECTORY).union(OFlag::O_NOFOLLOW).union(OFlag::O_CLOEXEC);

impl Dir {
    /// Opens `path`, a directory of the agent's own whose parents only the
    /// agent can change (`<data>/instances/<id>`), without following a
    /// final symlink.
    pub fn open(path: &Path) -> Result<Dir, BeneathError> {
        Dir::open_with(path, Resolver::Openat2)
    }

    /// [`Dir::open`] with a chosen resolver for everything beneath it.
    pub fn open_with(path: &Path, resolver: Resolver) -> Result<Dir, BeneathError> {
        match nix::fcntl::open(path, DIR_FLAGS, Mode::empty()) {
            Ok(fd) => Ok(Dir { fd, shown: path.to_path_buf(), resolver }),
            Err(Errno::ELOOP | Errno::ENOTDIR) => match nix::sys::stat::lstat(path) {
                Ok(st) if st.st_mode & libc::S_IFMT == libc::S_IFLNK => {
                    Err(BeneathError::Symlink { path: path.to_path_buf(), link: path.display().to_string() })
                }
                _ => Err(BeneathError::NotDirectory { path: path.to_path_buf(), part: path.display().to_string() }),
            },
            Err(e) => Err(BeneathError::io("open", path, e)),
        }
    }

    pub fn path(&self) -> &Path {
        &self.shown
    }

    /// The uid owning this directory. For an instance directory that is the
    /// instance's user: the agent gave it to them, and only root can give
    /// it to anyone else, so it says whose files inside count as theirs.
    pub fn owner(&self) -> Result<u32, BeneathError> {
        nix::sys::stat::fstat(&self.fd).map(|st| st.st_uid).map_err(|e| BeneathError::io("inspect", &self.shown, e))
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    fn shown(&self, rel: &RelPath) -> PathBuf {
        self.shown.join(&rel.shown)
    }

    /// Opens the directory `rel` beneath this one.
    pub fn dir(&self, rel: &RelPath) -> Result<Dir, BeneathError> {
        let fd = self.resolve(rel, DIR_FLAGS, Mode::empty())?;
        Ok(Dir { fd, shown: self.shown(rel), resolver: self.resolver })
    }

    /// Opens the directory `name` (one component) beneath this one,
    /// creating it with `mode` (and giving it to `owner`) when missing.
    pub fn ensure_dir(&self, name: &OsStr, mode: u32, owner: Option<(u32, u32)>) -> Result<Dir, BeneathError> {
        let shown = self.shown.join(name);
        let created = match nix::sys::stat::mkdirat(&self.fd, name, Mode::from_bits_truncate(mode)) {
            Ok(()) => true,
            Err(Errno::EEXIST) => false,
            Err(e) => return Err(BeneathError::io("create the directory", &shown, e)),
        };
        let fd = match nix::fcntl::openat(&self.fd, name, DIR_FLAGS, Mode::empty()) {
            Ok(fd) => fd,
            Err(e) => return Err(self.classify(&[name.to_os_string()], 0, e)),
        };
        // Through the directory opened, not its name: the name may have
        // been swapped for something else since the mkdir.
        if let Some((uid, gid)) = owner.filter(|_| created) {
            chown_fd(fd.as_fd(), uid, gid).map_err(|e| BeneathError::io("chown", &shown, e))?;
        }
        Ok(Dir { fd, shown, resolver: self.resolver })
    }

    /// Walks `parents` down from here, creating what is missing with `mode`
    /// and `owner`; returns the last directory (this one when empty).
    pub fn ensure_dirs(
        &self,
        parents: &[OsString],
        mode: u32,
        owner: Option<(u32, u32)>,
    ) -> Result<Option<Dir>, BeneathError> {
        let mut current: Option<Dir> = None;
        for (i, part) in parents.iter().enumerate() {
            let at = current.as_ref().unwrap_or(self);
            // A refusal names the path from here, not only the one name.
            let prefix = || parents[..=i].iter().map(|p| p.to_string_lossy()).collect::<Vec<_>>().join("/");
            current = Some(at.ensure_dir(part, mode, owner).map_err(|e| match e {
                BeneathError::Symlink { .. } => {
                    BeneathError::Symlink { path: self.shown.join(prefix()), link: prefix() }
                }
                BeneathError::NotDirectory { .. } => {
                    BeneathError::NotDirectory { path: self.shown.join(prefix()), part: prefix() }
                }
                other => other,
            })?);
        }
        Ok(current)
    }

    /// Opens the regular file `rel` for reading, as [`Expect`] says.
    pub fn open_read(&self, rel: &RelPath, expect: Expect) -> Result<File, BeneathError> {
        let fd = self.resolve(rel, OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC, Mode::empty())?;
        self.checked(fd, rel, expect)
    }

    /// Opens (creating with `mode`) the regular file `rel` for reading and
    /// appending, as [`Expect`] says.
    pub fn open_append(&self, rel: &RelPath, mode: u32, expect: Expect) -> Result<File, BeneathError> {
        let flags = OFlag::O_RDWR | OFlag::O_APPEND | OFlag::O_CREAT | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC;
        let fd = self.resolve(rel, flags, Mode::from_bits_truncate(mode))?;
        self.checked(fd, rel, expect)
    }

    fn checked(&self, fd: OwnedFd, rel: &RelPath, expect: Expect) -> Result<File, BeneathError> {
        let st = nix::sys::stat::fstat(&fd).map_err(|e| BeneathError::io("inspect", &self.shown(rel), e))?;
        check_file(&st, &self.shown(rel), expect)?;
        Ok(File::from(fd))
    }

    /// The entry `name` of this directory, not following a link; `None`
    /// when there is none.
    pub fn stat(&self, name: &OsStr) -> Result<Option<FileStat>, BeneathError> {
        match nix::sys::stat::fstatat(&self.fd, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) => Ok(Some(st)),
            Err(Errno::ENOENT) => Ok(None),
            Err(e) => Err(BeneathError::io("inspect", &self.shown.join(name), e)),
        }
    }

    /// Opens `rel` beneath this directory with `flags` (`O_NOFOLLOW` and
    /// `O_CLOEXEC` are always added): no link anywhere, nothing outside.
    fn resolve(&self, rel: &RelPath, flags: OFlag, mode: Mode) -> Result<OwnedFd, BeneathError> {
        let flags = flags | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        if self.resolver == Resolver::Openat2 && OPENAT2.load(Ordering::Relaxed) != NO {
            let how = OpenHow::new().flags(flags).mode(mode).resolve(
                ResolveFlag::RESOLVE_BENEATH
                    | ResolveFlag::RESOLVE_NO_SYMLINKS
                    | ResolveFlag::RESOLVE_NO_MAGICLINKS
                    | ResolveFlag::RESOLVE_NO_XDEV,
            );
            let path = rel.parts.iter().map(|p| p.as_bytes()).collect::<Vec<_>>().join(&b'/');
            let mut tries = 0;
            loop {
                match nix::fcntl::openat2(&self.fd, OsStr::from_bytes(&path), how) {
                    Ok(fd) => {
                        OPENAT2.store(YES, Ordering::Relaxed);
                        return Ok(fd);
                    }
                    // No openat2 here (old kernel, or a filter refusing it).
                    Err(Errno::ENOSYS | Errno::EPERM) if OPENAT2.load(Ordering::Relaxed) == UNKNOWN => {
                        OPENAT2.store(NO, Ordering::Relaxed);
                        break;
                    }
                    // A rename elsewhere raced the lookup; the kernel asks
                    // to try again.
                    Err(Errno::EAGAIN) if tries < 8 => tries += 1,
                    // A mount point on the way (`..` never is one: a
                    // `RelPath` has none): an instance that can mount (FUSE)
                    // could make a read hang there. Refused without a walk,
                    // which would enter the mount.
                    Err(Errno::EXDEV) => return Err(BeneathError::Mount { path: self.shown(rel) }),
                    // A link, a non-directory parent, a socket or a FIFO
                    // without a reader: the walk below says which component
                    // and what it is (and refuses it again).
                    Err(Errno::ELOOP | Errno::ENOTDIR | Errno::EAGAIN | Errno::ENXIO | Errno::EOPNOTSUPP) => {
                        break;
                    }
                    Err(e) => return Err(BeneathError::io("open", &self.shown(rel), e)),
                }
            }
        }
        self.walk(rel, flags, mode)
    }

    /// The fallback resolution: each parent opened as a directory with
    /// `O_NOFOLLOW` from the one before, the last name with `flags`.
    /// Each directory opened on the way must be on this directory's
    /// filesystem (as `RESOLVE_NO_XDEV`; unlike it, the open has entered
    /// the mount). Not the last component: overlayfs may give a file the
    /// `st_dev` of its layer rather than the mount's, and a file mounted
    /// over (FUSE on a file) on a kernel without `openat2` is not caught.
    fn walk(&self, rel: &RelPath, flags: OFlag, mode: Mode) -> Result<OwnedFd, BeneathError> {
        let (parents, last) = rel.split_last();
        let dev = nix::sys::stat::fstat(&self.fd).map_err(|e| BeneathError::io("inspect", &self.shown, e))?.st_dev;
        let same_dev = |fd: OwnedFd| -> Result<OwnedFd, BeneathError> {
            match nix::sys::stat::fstat(&fd) {
                Ok(st) if st.st_dev == dev => Ok(fd),
                Ok(_) => Err(BeneathError::Mount { path: self.shown(rel) }),
                Err(e) => Err(BeneathError::io("inspect", &self.shown(rel), e)),
            }
        };
        let mut current: Option<OwnedFd> = None;
        for (i, part) in parents.iter().enumerate() {
            let at = current.as_ref().map_or(self.fd(), |fd| fd.as_fd());
            match nix::fcntl::openat(at, part.as_os_str(), DIR_FLAGS, Mode::empty()) {
                Ok(fd) => current = Some(same_dev(fd)?),
                Err(e) => return Err(self.classify_at(at, rel, i, e)),
            }
        }
        let at = current.as_ref().map_or(self.fd(), |fd| fd.as_fd());
        nix::fcntl::openat(at, last, flags, mode).map_err(|e| self.classify_at(at, rel, rel.parts.len() - 1, e))
    }

    /// Why opening component `i` of `parts` (from this directory) failed.
    fn classify(&self, parts: &[OsString], i: usize, e: Errno) -> BeneathError {
        let shown = parts.iter().map(|p| p.to_string_lossy()).collect::<Vec<_>>().join("/");
        let rel = RelPath { shown, parts: parts.to_vec() };
        self.classify_at(self.fd(), &rel, i, e)
    }

    /// Why opening component `i` of `rel` in the directory `at` failed:
    /// a link, something that is not a directory, or an i/o error.
    fn classify_at(&self, at: BorrowedFd<'_>, rel: &RelPath, i: usize, e: Errno) -> BeneathError {
        let path = self.shown(rel);
        let part = || rel.parts[..=i].iter().map(|p| p.to_string_lossy()).collect::<Vec<_>>().join("/");
        match e {
            // ELOOP: O_NOFOLLOW met a link. ENOTDIR: O_DIRECTORY met a
            // non-directory (or, on some kernels, a link). ENXIO: a FIFO
            // with no reader, or a socket, opened for writing.
            Errno::ELOOP | Errno::ENOTDIR | Errno::ENXIO | Errno::EOPNOTSUPP => {
                match nix::sys::stat::fstatat(at, rel.parts[i].as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW) {
                    Ok(st) if st.st_mode & libc::S_IFMT == libc::S_IFLNK => {
                        BeneathError::Symlink { path, link: part() }
                    }
                    Ok(st) if i + 1 < rel.parts.len() || e == Errno::ENOTDIR => {
                        let _ = st;
                        BeneathError::NotDirectory { path, part: part() }
                    }
                    Ok(st) => BeneathError::NotRegular { path, kind: kind_of(st.st_mode) },
                    Err(_) => BeneathError::io("open", &path, e),
                }
            }
            e => BeneathError::io("open", &path, e),
        }
    }
}

/// Checks an open file's `fstat` against a regular file and `expect`.
pub fn check_file(st: &FileStat, path: &Path, expect: Expect) -> Result<(), BeneathError> {
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(BeneathError::NotRegular { path: path.to_path_buf(), kind: kind_of(st.st_mode) });
    }
    if let Some(want) = expect.owner
        && st.st_uid != want
    {
        return Err(BeneathError::ForeignOwner { path: path.to_path_buf(), uid: st.st_uid, want });
    }
    let links = st.st_nlink;
    if expect.single_link && links != 1 {
        return Err(BeneathError::HardLinked { path: path.to_path_buf(), links });
    }
    Ok(())
}

/// `fchownat` without following a link.
/// Gives the entry `name` of `at` to `uid:gid` through an `O_PATH` fd of
/// it, never by its name a second time: a link is chowned itself, and what
/// is checked is what is chowned, whatever is swapped in meanwhile. A
/// non-directory with other hard links is refused (`EMLINK`): one of them
/// may be a file outside the instance (an instance may link a file it does
/// not own where `fs.protected_hardlinks` is 0), which root's chown would
/// give away. [`tree::chown_tree`] gives a tree's own hard links.
pub(crate) fn chown_at(at: BorrowedFd<'_>, name: &OsStr, uid: u32, gid: u32) -> nix::Result<()> {
    let fd = open_path(at, name)?;
    let st = nix::sys::stat::fstat(&fd)?;
    if st.st_mode & libc::S_IFMT != libc::S_IFDIR && st.st_nlink > 1 {
        return Err(Errno::EMLINK);
    }
    chown_fd(fd.as_fd(), uid, gid)
}

/// `name` in `at` itself (no link followed), for inspecting and chowning.
pub(crate) fn open_path(at: BorrowedFd<'_>, name: &OsStr) -> nix::Result<OwnedFd> {
    nix::fcntl::openat(at, name, OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC, Mode::empty())
}

/// Chowns what `fd` is (an `O_PATH` fd of a link: the link).
pub(crate) fn chown_fd(fd: BorrowedFd<'_>, uid: u32, gid: u32) -> nix::Result<()> {
    nix::unistd::fchownat(
        fd,
        "",
        Some(nix::unistd::Uid::from_raw(uid)),
        Some(nix::unistd::Gid::from_raw(gid)),
        AtFlags::AT_EMPTY_PATH | AtFlags::AT_SYMLINK_NOFOLLOW,
    )
}

/// Opens the directory `path` itself (no final link followed) from the
/// current directory: for trees the agent owns the parents of.
pub(crate) fn open_dir_fd(path: &Path) -> nix::Result<OwnedFd> {
    nix::fcntl::openat(AT_FDCWD, path, DIR_FLAGS, Mode::empty())
}
