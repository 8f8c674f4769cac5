//! The resolver and the tree walks on real directories: links (final,
//! intermediate, absolute, relative, swapped in mid-read), hard links,
//! FIFOs, and both resolvers (`openat2` and the walk) judging alike.

use std::io::Read;
use std::os::unix::fs::{MetadataExt, symlink};
use std::path::Path;
use std::time::{Duration, Instant};

use super::*;

const BOTH: [Resolver; 2] = [Resolver::Openat2, Resolver::Walk];

fn rel(p: &str) -> RelPath {
    RelPath::parse(p).unwrap()
}

fn me() -> u32 {
    nix::unistd::geteuid().as_raw()
}

/// Fails (never skips) when not root: giving files away needs it, and CI
/// runs as root.
fn require_root(what: &str) {
    assert!(nix::unistd::geteuid().is_root(), "{what} needs root (CI runs the tests as root)");
}

fn read_all(mut f: File) -> String {
    let mut s = String::new();
    f.read_to_string(&mut s).unwrap();
    s
}

#[test]
fn openat2_is_what_this_kernel_uses() {
    // The fallback must not hide a broken fast path: on this kernel (5.6
    // or later) openat2 answers, and the first open records so.
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("f"), "x").unwrap();
    Dir::open(tmp.path()).unwrap().open_read(&rel("f"), Expect::default()).unwrap();
    assert_eq!(OPENAT2.load(Ordering::Relaxed), YES, "openat2 was refused by this kernel");
}

#[test]
fn reads_plain_files_and_refuses_links_anywhere() {
    let tmp = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret"), "secret").unwrap();
    let inst = tmp.path();
    std::fs::create_dir_all(inst.join("logs/deep")).unwrap();
    std::fs::write(inst.join("logs/deep/ok.log"), "fine").unwrap();
    symlink(outside.path().join("secret"), inst.join("logs/abs.log")).unwrap();
    symlink("deep/ok.log", inst.join("logs/rel.log")).unwrap();
    symlink(outside.path(), inst.join("logs/outdir")).unwrap();
    symlink("deep", inst.join("logs/indir")).unwrap();
    symlink("/proc/self/root/etc/hostname", inst.join("logs/magic.log")).unwrap();
    for resolver in BOTH {
        let dir = Dir::open_with(inst, resolver).unwrap();
        assert_eq!(read_all(dir.open_read(&rel("logs/deep/ok.log"), Expect::default()).unwrap()), "fine");
        for (p, link) in [
            ("logs/abs.log", "logs/abs.log"),
            ("logs/rel.log", "logs/rel.log"),
            ("logs/magic.log", "logs/magic.log"),
            ("logs/outdir/secret", "logs/outdir"),
            ("logs/indir/ok.log", "logs/indir"),
        ] {
            match dir.open_read(&rel(p), Expect::default()) {
                Err(BeneathError::Symlink { link: l, .. }) => assert_eq!(l, link, "{resolver:?} {p}"),
                other => panic!("{resolver:?} {p}: {other:?}"),
            }
        }
        let missing = dir.open_read(&rel("logs/none.log"), Expect::default()).unwrap_err();
        assert!(missing.is_not_found(), "{missing:?}");
        let through_file = dir.open_read(&rel("logs/deep/ok.log/x"), Expect::default()).unwrap_err();
        assert!(matches!(through_file, BeneathError::NotDirectory { .. }), "{resolver:?}: {through_file:?}");
    }
}

#[test]
fn bad_paths_are_refused_before_any_open() {
    for p in ["../x", "a/../../x", "/etc/passwd", "", ".", "dir/", "a\0b"] {
        assert!(matches!(RelPath::parse(p), Err(BeneathError::BadPath { .. })), "{p:?}");
    }
    assert!(matches!(RelPath::parse(&"a/".repeat(3000)), Err(BeneathError::BadPath { .. })));
    assert!(RelPath::name("a/b").is_err() && RelPath::name("..").is_err());
    assert_eq!(rel("./a/./b").parts().len(), 2);
}

#[test]
fn fifos_and_sockets_are_refused_without_blocking() {
    let tmp = tempfile::tempdir().unwrap();
    nix::unistd::mkfifo(&tmp.path().join("fifo"), Mode::from_bits_truncate(0o666)).unwrap();
    let _sock = std::os::unix::net::UnixListener::bind(tmp.path().join("sock")).unwrap();
    for resolver in BOTH {
        let dir = Dir::open_with(tmp.path(), resolver).unwrap();
        let started = Instant::now();
        let err = dir.open_read(&rel("fifo"), Expect::default()).unwrap_err();
        assert!(matches!(err, BeneathError::NotRegular { kind: "a FIFO", .. }), "{err:?}");
        let err = dir.open_append(&rel("fifo"), 0o600, Expect::default()).unwrap_err();
        assert!(matches!(err, BeneathError::NotRegular { kind: "a FIFO", .. }), "{err:?}");
        let err = dir.open_read(&rel("sock"), Expect::default()).unwrap_err();
        assert!(matches!(err, BeneathError::NotRegular { .. }), "{err:?}");
        assert!(started.elapsed() < Duration::from_secs(1), "a FIFO held the open");
    }
}

#[test]
fn owner_and_link_count_are_checked_on_the_open_file() {
    require_root("giving a file to another user");
    let tmp = tempfile::tempdir().unwrap();
    let secret = tmp.path().join("root-secret");
    std::fs::write(&secret, "root only").unwrap();
    let inst = tmp.path().join("inst");
    std::fs::create_dir(&inst).unwrap();
    std::fs::write(inst.join("mine.log"), "mine").unwrap();
    std::os::unix::fs::chown(inst.join("mine.log"), Some(4242), Some(4242)).unwrap();
    // A hard link of root's file, as an instance could make where
    // protected_hardlinks is off: the same inode, root's.
    std::fs::hard_link(&secret, inst.join("hard.log")).unwrap();
    for resolver in BOTH {
        let dir = Dir::open_with(&inst, resolver).unwrap();
        let theirs = Expect { owner: Some(4242), single_link: false };
        assert_eq!(read_all(dir.open_read(&rel("mine.log"), theirs).unwrap()), "mine");
        let err = dir.open_read(&rel("hard.log"), theirs).unwrap_err();
        assert!(matches!(err, BeneathError::ForeignOwner { uid: 0, want: 4242, .. }), "{err:?}");
        let err = dir.open_append(&rel("hard.log"), 0o600, Expect { owner: None, single_link: true }).unwrap_err();
        assert!(matches!(err, BeneathError::HardLinked { links: 2, .. }), "{err:?}");
    }
    assert_eq!(std::fs::read_to_string(&secret).unwrap(), "root only");
}

/// A link swapped in and out while the agent reads: every open either
/// reads the real log or is refused; none ever reads the target.
#[test]
fn a_link_swapped_in_between_check_and_open_is_never_followed() {
    let tmp = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret"), "SECRET").unwrap();
    std::fs::write(outside.path().join("x.log"), "SECRET").unwrap();
    let logs = tmp.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    std::fs::write(logs.join("real"), "real log").unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let swapper = {
        let (logs, outside, stop) = (logs.clone(), outside.path().to_path_buf(), stop.clone());
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                // The file, then a link in its place, then the file again.
                let _ = std::fs::remove_file(logs.join("x.log"));
                let _ = symlink(outside.join("secret"), logs.join("x.log"));
                let _ = std::fs::remove_file(logs.join("x.log"));
                let _ = std::fs::hard_link(logs.join("real"), logs.join("x.log"));
                // And the directory itself swapped for a link.
                let _ = std::fs::rename(&logs, logs.with_extension("away"));
                let _ = symlink(&outside, &logs);
                let _ = std::fs::remove_file(&logs);
                let _ = std::fs::rename(logs.with_extension("away"), &logs);
                n += 1;
            }
            n
        })
    };
    let (mut read, mut refused) = (0, 0);
    let deadline = Instant::now() + Duration::from_secs(2);
    for resolver in BOTH.iter().cycle() {
        if Instant::now() > deadline {
            break;
        }
        let dir = Dir::open_with(tmp.path(), *resolver).unwrap();
        match dir.open_read(&rel("logs/x.log"), Expect::default()) {
            Ok(f) => {
                assert_eq!(read_all(f), "real log", "{resolver:?} read through a link");
                read += 1;
            }
            Err(_) => refused += 1,
        }
    }
    stop.store(true, Ordering::Relaxed);
    let swaps = swapper.join().unwrap();
    assert!(
        swaps > 100 && read > 0 && refused > 0,
        "the race did not run: {swaps} swaps, {read} reads, {refused} refusals"
    );
}

#[test]
fn ensure_dir_creates_and_refuses_links() {
    let tmp = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    symlink(outside.path(), tmp.path().join("logs")).unwrap();
    let dir = Dir::open(tmp.path()).unwrap();
    let err = dir.ensure_dir(OsStr::new("logs"), 0o750, None).unwrap_err();
    assert!(matches!(err, BeneathError::Symlink { .. }), "{err:?}");
    let made = dir.ensure_dirs(&[OsString::from("run"), OsString::from("sub")], 0o750, None).unwrap().unwrap();
    assert_eq!(made.path(), tmp.path().join("run/sub"));
    assert_eq!(std::fs::metadata(tmp.path().join("run/sub")).unwrap().mode() & 0o777, 0o750);
    std::fs::remove_dir(tmp.path().join("run/sub")).unwrap();
    symlink(outside.path(), tmp.path().join("run/sub")).unwrap();
    let err = dir.ensure_dirs(&[OsString::from("run"), OsString::from("sub"), OsString::from("x")], 0o750, None);
    assert!(matches!(err, Err(BeneathError::Symlink { ref link, .. }) if link == "run/sub"), "{err:?}");
    assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0, "created something through a link");
}

/// Builds, under `inst`, a tree an instance could leave: links to outside
/// (a file, a directory, `/`), a FIFO, a socket, nested directories, a
/// directory without any permission.
fn hostile_tree(inst: &Path, outside: &Path) -> std::os::unix::net::UnixListener {
    std::fs::create_dir_all(inst.join("data/a/b")).unwrap();
    std::fs::write(inst.join("data/a/b/f"), "x").unwrap();
    symlink(outside, inst.join("data/out")).unwrap();
    symlink(outside.join("victim"), inst.join("data/a/victim")).unwrap();
    symlink("/", inst.join("run")).unwrap();
    nix::unistd::mkfifo(&inst.join("data/fifo"), Mode::from_bits_truncate(0o644)).unwrap();
    std::fs::create_dir(inst.join("data/closed")).unwrap();
    std::fs::write(inst.join("data/closed/f"), "x").unwrap();
    std::fs::set_permissions(inst.join("data/closed"), std::os::unix::fs::PermissionsExt::from_mode(0o000)).unwrap();
    std::os::unix::net::UnixListener::bind(inst.join("data/sock")).unwrap()
}

#[test]
fn remove_tree_unlinks_links_and_leaves_their_targets() {
    let tmp = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("victim"), "keep").unwrap();
    std::fs::create_dir(outside.path().join("sub")).unwrap();
    let inst = tmp.path().join("inst");
    let _sock = hostile_tree(&inst, outside.path());
    assert!(tree::remove_path(&inst).unwrap());
    assert!(!inst.exists());
    assert_eq!(std::fs::read_to_string(outside.path().join("victim")).unwrap(), "keep");
    assert!(outside.path().join("sub").is_dir());
    assert!(!tree::remove_path(&inst).unwrap(), "a second removal finds nothing");
    // A link in the directory's own place is removed itself.
    symlink(outside.path(), &inst).unwrap();
    assert!(tree::remove_path(&inst).unwrap());
    assert!(outside.path().join("victim").exists() && std::fs::symlink_metadata(&inst).is_err());
}

#[test]
fn chown_tree_does_not_follow_links() {
    require_root("giving files to another user");
    let tmp = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("victim"), "x").unwrap();
    let inst = tmp.path().join("inst");
    let _sock = hostile_tree(&inst, outside.path());
    let (uid, gid) = (4242, 4343);
    tree::chown_tree(&inst, uid, gid, None).unwrap();
    for p in
        ["", "data", "data/a", "data/a/b", "data/a/b/f", "data/out", "data/a/victim", "run", "data/fifo", "data/sock"]
    {
        let m = std::fs::symlink_metadata(inst.join(p)).unwrap();
        assert_eq!((m.uid(), m.gid()), (uid, gid), "{p}");
    }
    for p in [outside.path().to_path_buf(), outside.path().join("victim"), "/".into()] {
        assert_eq!(std::fs::metadata(&p).unwrap().uid(), me(), "followed a link to {}", p.display());
    }
    assert!(tree::chown_tree(&inst.join("run"), uid, gid, None).is_err(), "the root itself must not be a link");
}

#[test]
fn chown_tree_gives_a_tree_its_own_hard_links_and_refuses_one_from_outside() {
    require_root("giving files to another user");
    let tmp = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let victim = outside.path().join("shadow");
    std::fs::write(&victim, "root's").unwrap();
    let inst = tmp.path().join("inst");
    std::fs::create_dir_all(inst.join("bin")).unwrap();
    std::fs::create_dir_all(inst.join("data")).unwrap();
    // A package's own hard link: both names in the tree.
    std::fs::write(inst.join("bin/run"), "#!/bin/sh\n").unwrap();
    std::fs::hard_link(inst.join("bin/run"), inst.join("bin/run2")).unwrap();
    let (uid, gid) = (4242, 4343);
    tree::chown_tree(&inst, uid, gid, None).unwrap();
    for p in ["bin/run", "bin/run2"] {
        let m = std::fs::symlink_metadata(inst.join(p)).unwrap();
        assert_eq!((m.uid(), m.gid()), (uid, gid), "{p}");
    }
    // What an instance can leave where protected_hardlinks is 0: a hard
    // link to root's file. Refused, and root's file stays root's.
    std::fs::hard_link(&victim, inst.join("data/x")).unwrap();
    let err = tree::chown_tree(&inst, 5151, 5151, None).unwrap_err();
    assert!(matches!(err, BeneathError::LinkedOutside { links: 2, inside: 1, .. }), "{err}");
    assert!(err.to_string().contains("data/x"), "{err}");
    assert_eq!(std::fs::metadata(&victim).unwrap().uid(), me(), "root's file was given away");
    // Given on from the previous user (an upgrade's carried dirs): what
    // that user owns moves on, the link to root's file stays root's.
    std::fs::write(inst.join("data/mine"), "mine").unwrap();
    std::os::unix::fs::chown(inst.join("data/mine"), Some(uid), Some(gid)).unwrap();
    tree::chown_tree(&inst.join("data"), 5151, 5151, Some(uid)).unwrap();
    assert_eq!(std::fs::metadata(inst.join("data/mine")).unwrap().uid(), 5151);
    assert_eq!(std::fs::metadata(inst.join("data")).unwrap().uid(), 5151);
    assert_eq!(std::fs::metadata(&victim).unwrap().uid(), me(), "root's file was given on");
    // One file alone is refused the same way.
    let root = Dir::open(&inst).unwrap();
    let err = chown_at(root.dir(&rel("data")).unwrap().fd(), OsStr::new("x"), 5151, 5151);
    assert_eq!(err, Err(Errno::EMLINK));
    assert_eq!(std::fs::metadata(&victim).unwrap().uid(), me());
}

#[test]
fn a_mount_inside_is_never_entered() {
    require_root("mounting a tmpfs");
    let tmp = tempfile::tempdir().unwrap();
    let logs = tmp.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    // What a FUSE mount of the instance's would be: another filesystem
    // where the agent reads (here one that answers; FUSE's could hang).
    let mounted =
        std::process::Command::new("mount").args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"]).arg(&logs).status();
    assert!(mounted.as_ref().is_ok_and(|s| s.success()), "mount a tmpfs (root, CAP_SYS_ADMIN): {mounted:?}");
    struct Unmount<'a>(&'a Path);
    impl Drop for Unmount<'_> {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg("-l").arg(self.0).status();
        }
    }
    let _unmount = Unmount(&logs);
    std::fs::write(logs.join("stdout.log"), "ON THE MOUNT\n").unwrap();
    for resolver in BOTH {
        let dir = Dir::open_with(tmp.path(), resolver).unwrap();
        let err = dir.open_read(&rel("logs/stdout.log"), Expect::default()).unwrap_err();
        assert!(matches!(err, BeneathError::Mount { .. }), "{resolver:?}: {err:?}");
        assert!(err.is_refusal() && err.to_string().contains("mount point"), "{err}");
    }
}
