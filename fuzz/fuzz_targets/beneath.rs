//! The agent's resolver (`agent::beneath`) under random trees of
//! directories, files, links (inside, outside, absolute, to `..`, magic
//! `/proc` links), FIFOs and hard links, built from the input bytes as an
//! instance could build them in its own directory. For every path the input
//! asks for, with both resolvers (`openat2` and the `O_NOFOLLOW` walk):
//! an open that succeeds yields a regular file made inside the tree (never
//! one outside, never through a link), it never blocks (a FIFO held open
//! would trip libFuzzer's timeout), and both resolvers agree on whether the
//! path opens. Then the whole tree is removed by the fd walk, and nothing
//! outside it is gone.
#![no_main]

use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use flotilla::agent::beneath::{Dir, Expect, RelPath, Resolver, tree};
use libfuzzer_sys::fuzz_target;

const NAMES: [&str; 6] = ["a", "b", "logs", "x.log", "..", "."];

/// Reads one byte at a time, 0 past the end.
struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn next(&mut self) -> u8 {
        match self.0.split_first() {
            Some((b, rest)) => {
                self.0 = rest;
                *b
            }
            None => 0,
        }
    }
    fn done(&self) -> bool {
        self.0.is_empty()
    }
    /// A relative path of 1 to 3 components from [`NAMES`].
    fn path(&mut self) -> String {
        let n = 1 + (self.next() % 3) as usize;
        (0..n).map(|_| NAMES[(self.next() % NAMES.len() as u8) as usize]).collect::<Vec<_>>().join("/")
    }
}

fuzz_target!(|data: &[u8]| {
    let tmp = tempfile::tempdir().expect("temp dir");
    // The tree holds links to /proc/self/cwd, and building it with std::fs
    // follows links in the parents: with the cwd inside the temp dir, what
    // that writes stays there (it used to land in fuzz/, as a/x.log and
    // x.log/x.log hard-linked to the "outside" canary). The code under
    // test never follows them; only the harness's own building did.
    let home = std::env::current_dir().ok();
    std::env::set_current_dir(tmp.path()).expect("cwd into the temp dir");
    let inst = tmp.path().join("inst");
    let outside = tmp.path().join("outside");
    std::fs::create_dir_all(&inst).expect("inst");
    std::fs::create_dir_all(outside.join("a")).expect("outside");
    for name in ["x.log", "a/x.log", "secret"] {
        std::fs::write(outside.join(name), "OUTSIDE").expect("outside file");
    }
    let outside_inodes: HashSet<u64> =
        ["x.log", "a/x.log", "secret"].iter().map(|n| std::fs::metadata(outside.join(n)).unwrap().ino()).collect();

    let mut input = Bytes(data);
    // Build: each op makes one entry at a random path (failures ignored:
    // the parent may be missing or a file).
    let ops = input.next() % 24;
    for _ in 0..ops {
        let at = inst.join(input.path());
        match input.next() % 8 {
            0 => drop(std::fs::create_dir_all(&at)),
            // A new file only (O_EXCL): the harness itself must not open a
            // FIFO made earlier at the same path, nor write through a link.
            1 => drop(
                std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(&at)
                    .and_then(|mut f| std::io::Write::write_all(&mut f, b"INSIDE")),
            ),
            2 => drop(std::os::unix::fs::symlink(&outside, &at)),
            3 => drop(std::os::unix::fs::symlink(outside.join("secret"), &at)),
            4 => drop(std::os::unix::fs::symlink(input.path(), &at)),
            5 => drop(std::os::unix::fs::symlink("/proc/self/cwd", &at)),
            6 => drop(nix::unistd::mkfifo(&at, nix::sys::stat::Mode::from_bits_truncate(0o644))),
            _ => drop(std::fs::hard_link(outside.join("secret"), &at)),
        }
    }

    while !input.done() {
        let path = input.path();
        let Ok(rel) = RelPath::parse(&path) else { continue };
        let mut opened = Vec::new();
        for resolver in [Resolver::Openat2, Resolver::Walk] {
            let dir = Dir::open_with(&inst, resolver).expect("the instance dir");
            let owner = Some(nix::unistd::geteuid().as_raw());
            let result = dir.open_read(&rel, Expect { owner, single_link: true });
            if let Ok(f) = &result {
                let m = f.metadata().expect("fstat");
                assert!(m.is_file(), "{path}: opened a non-file with {resolver:?}");
                assert!(!outside_inodes.contains(&m.ino()), "{path}: read a file outside with {resolver:?}");
            }
            opened.push(result.is_ok());
        }
        assert_eq!(opened[0], opened[1], "{path}: openat2 and the walk disagree");
    }

    let before = listing(&outside);
    tree::remove_path(&inst).expect("remove the tree");
    assert!(std::fs::symlink_metadata(&inst).is_err(), "the tree is left");
    assert_eq!(listing(&outside), before, "the removal reached outside");
    if let Some(home) = home {
        let _ = std::env::set_current_dir(home);
    }
});

/// Every path under `dir` (links not followed).
fn listing(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                todo.push(e.path());
            }
            out.push(e.path());
        }
    }
    out.sort();
    out
}
