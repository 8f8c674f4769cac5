//! The rules every package entry must pass, in one place: the master applies
//! them when a package is uploaded and the agent again while extracting, so
//! an archive edited between the two is still refused (DESIGN.md §14).

use std::path::{Component, Path, PathBuf};

use tar::EntryType;

use super::{ExtractLimits, PackageError};

/// Top-level directories flotilla owns in every instance directory and keeps
/// across upgrades; a package may not ship them.
pub const RESERVED_DIRS: [&str; 3] = ["data", "logs", "run"];

/// The rule an entry broke.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EntryRule {
    #[error("absolute paths are not allowed")]
    AbsolutePath,
    #[error("`..` is not allowed in paths")]
    ParentDir,
    #[error("path is {len} bytes, over the limit of {max}")]
    PathTooLong { len: usize, max: usize },
    #[error("`{dir}/` is reserved for flotilla (data, logs and run are created per instance)")]
    Reserved { dir: String },
    #[error("{kind} entries are not allowed (only files, directories and links)")]
    SpecialFile { kind: &'static str },
    #[error("setuid/setgid bits are not allowed (mode {mode:o})")]
    SetId { mode: u32 },
    #[error("link target {target:?} is absolute")]
    LinkAbsolute { target: String },
    #[error("link target {target:?} points outside the package")]
    LinkEscapes { target: String },
    #[error("link has no target")]
    LinkWithoutTarget,
    #[error("the path goes through the symlink {link:?} of the same package")]
    ThroughSymlink { link: String },
    #[error("only directories may be the package root")]
    RootNotADirectory,
}

/// Checks one entry with the default path-length limit; see
/// [`check_entry_within`].
pub fn check_entry(
    entry_path: &Path,
    entry_type: EntryType,
    link_target: Option<&Path>,
    mode: u32,
) -> Result<PathBuf, PackageError> {
    check_entry_within(entry_path, entry_type, link_target, mode, ExtractLimits::default().max_path_len)
}

/// Checks one entry and returns its normalized relative path (a leading `./`
/// stripped; empty for the archive root itself).
///
/// Symlink targets resolve relative to the link's directory, hard-link
/// targets relative to the archive root (that is how tar records them);
/// either must stay inside the package.
pub fn check_entry_within(
    entry_path: &Path,
    entry_type: EntryType,
    link_target: Option<&Path>,
    mode: u32,
    max_path_len: usize,
) -> Result<PathBuf, PackageError> {
    let refuse = |rule| PackageError::EntryRefused { entry: entry_path.display().to_string(), rule };
    let len = entry_path.as_os_str().len();
    if len > max_path_len {
        return Err(refuse(EntryRule::PathTooLong { len, max: max_path_len }));
    }
    let path = relative(entry_path).map_err(refuse)?;
    if let Some(Component::Normal(first)) = path.components().next()
        && let Some(dir) = RESERVED_DIRS.iter().find(|d| first == **d)
    {
        return Err(refuse(EntryRule::Reserved { dir: (*dir).to_string() }));
    }
    let kind = match entry_type {
        EntryType::Regular | EntryType::Directory | EntryType::Symlink | EntryType::Link => entry_type,
        EntryType::Char => return Err(refuse(EntryRule::SpecialFile { kind: "character device" })),
        EntryType::Block => return Err(refuse(EntryRule::SpecialFile { kind: "block device" })),
        EntryType::Fifo => return Err(refuse(EntryRule::SpecialFile { kind: "fifo" })),
        EntryType::GNUSparse => return Err(refuse(EntryRule::SpecialFile { kind: "sparse file" })),
        EntryType::Continuous => return Err(refuse(EntryRule::SpecialFile { kind: "contiguous file" })),
        _ => return Err(refuse(EntryRule::SpecialFile { kind: "unknown-type" })),
    };
    if mode & 0o6000 != 0 {
        return Err(refuse(EntryRule::SetId { mode }));
    }
    if path.as_os_str().is_empty() && kind != EntryType::Directory {
        return Err(refuse(EntryRule::RootNotADirectory));
    }
    if matches!(kind, EntryType::Symlink | EntryType::Link) {
        let target =
            link_target.filter(|t| !t.as_os_str().is_empty()).ok_or_else(|| refuse(EntryRule::LinkWithoutTarget))?;
        let tlen = target.as_os_str().len();
        if tlen > max_path_len {
            return Err(refuse(EntryRule::PathTooLong { len: tlen, max: max_path_len }));
        }
        let base = if kind == EntryType::Symlink { path.parent().unwrap_or(Path::new("")) } else { Path::new("") };
        let resolved = resolve(base, target).map_err(refuse)?;
        if kind == EntryType::Link && resolved.as_os_str().is_empty() {
            // A hard link to the root would be a hard link to a directory.
            return Err(refuse(EntryRule::LinkEscapes { target: target.display().to_string() }));
        }
    }
    Ok(path)
}

/// The entry path as a normalized relative path.
fn relative(p: &Path) -> Result<PathBuf, EntryRule> {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::Prefix(_) | Component::RootDir => return Err(EntryRule::AbsolutePath),
            Component::ParentDir => return Err(EntryRule::ParentDir),
            Component::CurDir => {}
            Component::Normal(n) => out.push(n),
        }
    }
    Ok(out)
}

/// Resolves `target` against `base` lexically; refuses anything that leaves
/// the root at any point (`a/../../x` leaves it even if it came back).
fn resolve(base: &Path, target: &Path) -> Result<PathBuf, EntryRule> {
    let shown = || target.display().to_string();
    let mut out = base.to_path_buf();
    for c in target.components() {
        match c {
            Component::Prefix(_) | Component::RootDir => return Err(EntryRule::LinkAbsolute { target: shown() }),
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    return Err(EntryRule::LinkEscapes { target: shown() });
                }
            }
            Component::Normal(n) => out.push(n),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(r: Result<PathBuf, PackageError>) -> EntryRule {
        match r {
            Err(PackageError::EntryRefused { rule, .. }) => rule,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    fn p(s: &str) -> &Path {
        Path::new(s)
    }

    #[test]
    fn plain_entries_are_normalized() {
        assert_eq!(check_entry(p("./bin/run"), EntryType::Regular, None, 0o755).unwrap(), p("bin/run"));
        assert_eq!(check_entry(p("bin//x/./y"), EntryType::Regular, None, 0o644).unwrap(), p("bin/x/y"));
        assert_eq!(check_entry(p("./"), EntryType::Directory, None, 0o755).unwrap(), p(""));
        // Names that merely start like a reserved dir are fine.
        assert_eq!(check_entry(p("database/x"), EntryType::Regular, None, 0o644).unwrap(), p("database/x"));
        assert_eq!(check_entry(p("lib/data/x"), EntryType::Regular, None, 0o644).unwrap(), p("lib/data/x"));
        // Sticky and plain permission bits are allowed.
        check_entry(p("tmp"), EntryType::Directory, None, 0o1777).unwrap();
    }

    #[test]
    fn absolute_and_parent_paths_are_refused() {
        assert_eq!(rule(check_entry(p("/etc/passwd"), EntryType::Regular, None, 0o644)), EntryRule::AbsolutePath);
        assert_eq!(rule(check_entry(p("a/../../x"), EntryType::Regular, None, 0o644)), EntryRule::ParentDir);
        assert_eq!(rule(check_entry(p("./.."), EntryType::Directory, None, 0o755)), EntryRule::ParentDir);
    }

    #[test]
    fn reserved_top_level_dirs_are_refused() {
        for name in ["data", "./logs/x.log", "run/app.pid", "data/"] {
            assert!(
                matches!(rule(check_entry(p(name), EntryType::Regular, None, 0o644)), EntryRule::Reserved { .. }),
                "{name}"
            );
        }
        let err = check_entry(p("data/db"), EntryType::Regular, None, 0o644).unwrap_err();
        assert!(err.to_string().contains("\"data/db\"") && err.to_string().contains("reserved"), "{err}");
    }

    #[test]
    fn special_files_and_set_id_bits_are_refused() {
        for t in [EntryType::Char, EntryType::Block, EntryType::Fifo, EntryType::GNUSparse, EntryType::new(b'Z')] {
            assert!(matches!(rule(check_entry(p("dev"), t, None, 0o644)), EntryRule::SpecialFile { .. }), "{t:?}");
        }
        assert_eq!(rule(check_entry(p("bin/su"), EntryType::Regular, None, 0o4755)), EntryRule::SetId { mode: 0o4755 });
        assert_eq!(
            rule(check_entry(p("shared"), EntryType::Directory, None, 0o2775)),
            EntryRule::SetId { mode: 0o2775 }
        );
        let msg = check_entry(p("bin/su"), EntryType::Regular, None, 0o4755).unwrap_err().to_string();
        assert!(msg.contains("setuid") && msg.contains("4755"), "{msg}");
    }

    #[test]
    fn links_must_stay_inside() {
        let ok = |path, kind, target| check_entry(p(path), kind, Some(p(target)), 0o777);
        // Symlinks resolve from their own directory.
        ok("lib/current", EntryType::Symlink, "v1").unwrap();
        ok("lib/x/up", EntryType::Symlink, "../../bin/run").unwrap();
        ok("top", EntryType::Symlink, ".").unwrap();
        assert!(matches!(rule(ok("lib/up", EntryType::Symlink, "../../etc")), EntryRule::LinkEscapes { .. }));
        assert!(matches!(rule(ok("up", EntryType::Symlink, "..")), EntryRule::LinkEscapes { .. }));
        assert!(matches!(rule(ok("a/b", EntryType::Symlink, "c/../../../x")), EntryRule::LinkEscapes { .. }));
        assert!(matches!(rule(ok("etc", EntryType::Symlink, "/etc")), EntryRule::LinkAbsolute { .. }));
        // Hard links resolve from the archive root.
        ok("lib/x/hard", EntryType::Link, "bin/run").unwrap();
        assert!(matches!(rule(ok("lib/hard", EntryType::Link, "../outside")), EntryRule::LinkEscapes { .. }));
        assert!(matches!(rule(ok("hard", EntryType::Link, "/etc/shadow")), EntryRule::LinkAbsolute { .. }));
        assert!(matches!(rule(ok("hard", EntryType::Link, ".")), EntryRule::LinkEscapes { .. }));
        assert_eq!(rule(check_entry(p("l"), EntryType::Symlink, None, 0o777)), EntryRule::LinkWithoutTarget);
    }

    #[test]
    fn long_paths_are_refused() {
        let long = "a/".repeat(40);
        assert!(matches!(
            rule(check_entry_within(p(&long), EntryType::Regular, None, 0o644, 64)),
            EntryRule::PathTooLong { len: 80, max: 64 }
        ));
        assert!(matches!(
            rule(check_entry_within(p("l"), EntryType::Symlink, Some(p(&long)), 0o777, 64)),
            EntryRule::PathTooLong { .. }
        ));
    }
}
