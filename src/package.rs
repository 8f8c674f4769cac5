//! Package tarballs: the one set of entry rules and the walk over a
//! `.tar.gz` that applies them, plus reading `component.toml` out of an
//! upload.
//!
//! A package is a gzip-compressed tar whose root holds `component.toml` and
//! the component's files. The master inspects every upload with
//! [`inspect_package`] and the agent extracts with the same [`walk`] and
//! [`check_entry_within`] (in `agent::installer`), so a package the master
//! accepted is a package every agent accepts, and a hostile archive is
//! refused at upload time already (DESIGN.md §14).

use std::collections::HashSet;
use std::fs::File;
use std::io::{self, BufReader, Read};
use std::path::{Component, Path, PathBuf};

use crate::error::Error;

mod rules;

#[cfg(test)]
pub(crate) mod testkit;

pub use rules::{EntryRule, RESERVED_DIRS, check_entry, check_entry_within};

/// The spec file at the package root.
pub const SPEC_FILE: &str = "component.toml";
/// Largest `component.toml` accepted.
pub const MAX_SPEC_BYTES: u64 = 1024 * 1024;

/// Caps applied while reading a package, on the master and on agents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtractLimits {
    /// Sum of the sizes of all entries once unpacked.
    pub max_total_bytes: u64,
    pub max_entries: u64,
    /// Longest entry path or link target, in bytes.
    pub max_path_len: usize,
}

impl Default for ExtractLimits {
    fn default() -> Self {
        ExtractLimits { max_total_bytes: 2 * 1024 * 1024 * 1024, max_entries: 100_000, max_path_len: 4096 }
    }
}

/// Why a package was refused.
#[derive(Debug, thiserror::Error)]
pub enum PackageError {
    #[error("the package is not a gzip file (it must be a .tar.gz)")]
    NotGzip,
    #[error("the package's gzip data is corrupt: {detail}")]
    CorruptGzip { detail: String },
    #[error("the package is not a valid tar archive: {detail}")]
    NotTar { detail: String },
    #[error("entry {short:?} refused: {rule}", short = crate::ids::shorten(.entry, 200))]
    EntryRefused { entry: String, rule: EntryRule },
    #[error("the package has more than {max} entries")]
    TooManyEntries { max: u64 },
    #[error("the package unpacks to more than {max} bytes (limit reached at entry {short:?})", short = crate::ids::shorten(.entry, 200))]
    TooLarge { entry: String, max: u64 },
    #[error("the package has no {SPEC_FILE} at its root")]
    MissingSpec,
    #[error("{SPEC_FILE} must be a regular file")]
    SpecNotAFile,
    #[error("{SPEC_FILE} is {size} bytes, over the limit of {max} bytes", max = MAX_SPEC_BYTES)]
    SpecTooLarge { size: u64 },
    #[error("{SPEC_FILE} is not valid UTF-8")]
    SpecNotUtf8,
    #[error("cannot read {path}")]
    Io {
        path: String,
        #[source]
        source: io::Error,
    },
}

impl From<PackageError> for Error {
    fn from(e: PackageError) -> Self {
        match e {
            // Our own temp file failing to read is not the client's fault.
            PackageError::Io { .. } => Error::internal(e),
            other => Error::invalid("invalid_package", other.to_string()),
        }
    }
}

/// What an upload inspection found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackageInfo {
    pub spec_toml: String,
    pub entries: u64,
    pub unpacked_bytes: u64,
}

/// Reads the whole package at `path` (blocking), applies every entry rule
/// and limit, and returns its `component.toml`.
pub fn inspect_package(path: &Path, limits: &ExtractLimits) -> Result<PackageInfo, PackageError> {
    let io_err = |source| PackageError::Io { path: path.display().to_string(), source };
    let file = File::open(path).map_err(io_err)?;
    let mut spec: Option<Result<String, PackageError>> = None;
    let tally = walk(BufReader::new(file), limits, |checked, entry| {
        if checked.path != Path::new(SPEC_FILE) {
            return Ok(());
        }
        // The last entry of a name wins, as it does when extracting.
        spec = Some(read_spec(checked, entry));
        Ok::<(), PackageError>(())
    })?;
    let spec_toml = spec.ok_or(PackageError::MissingSpec)??;
    Ok(PackageInfo { spec_toml, entries: tally.entries, unpacked_bytes: tally.bytes })
}

fn read_spec(checked: &CheckedEntry, entry: &mut impl Read) -> Result<String, PackageError> {
    if checked.kind != tar::EntryType::Regular {
        return Err(PackageError::SpecNotAFile);
    }
    if checked.size > MAX_SPEC_BYTES {
        return Err(PackageError::SpecTooLarge { size: checked.size });
    }
    let mut bytes = Vec::with_capacity(checked.size as usize);
    entry
        .take(MAX_SPEC_BYTES)
        .read_to_end(&mut bytes)
        .map_err(|e| PackageError::NotTar { detail: format!("reading {SPEC_FILE}: {e}") })?;
    String::from_utf8(bytes).map_err(|_| PackageError::SpecNotUtf8)
}

// ---------------------------------------------------------------- the walk

/// An entry that passed every rule, as handed to a [`walk`] visitor.
#[derive(Debug, Clone)]
pub struct CheckedEntry {
    /// Normalized relative path; empty for the archive root (`./`).
    pub path: PathBuf,
    /// `Regular`, `Directory`, `Symlink` or `Link`.
    pub kind: tar::EntryType,
    /// Permission bits only (`& 0o777`).
    pub mode: u32,
    /// Unpacked size from the header.
    pub size: u64,
}

/// What a [`walk`] saw.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    pub entries: u64,
    pub bytes: u64,
}

/// The gzip layer under the tar reader, remembering whether it failed so a
/// tar error can be told apart from corrupt compressed data.
pub struct Gunzip<R: Read> {
    inner: flate2::read::GzDecoder<io::Chain<io::Cursor<[u8; 2]>, R>>,
    failure: std::rc::Rc<std::cell::RefCell<Option<String>>>,
}

impl<R: Read> Read for Gunzip<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.inner.read(buf).inspect_err(|e| {
            self.failure.borrow_mut().get_or_insert_with(|| e.to_string());
        })
    }
}

/// One entry of the archive being walked, for the visitor to read or unpack.
pub type PackageEntry<'a, R> = tar::Entry<'a, Gunzip<R>>;

/// Walks the gzip-compressed tar read from `raw`: checks each entry against
/// the rules ([`check_entry_within`], plus "no path through a symlink of the
/// same archive") and the limits, then hands it to `visit`. The limits are
/// checked from headers, before the visitor unpacks anything.
///
/// Reading stops at the tar end-of-archive marker; bytes after it are left
/// in `raw` (pass `&mut reader` to get it back).
pub fn walk<R: Read, E: From<PackageError>>(
    mut raw: R,
    limits: &ExtractLimits,
    mut visit: impl FnMut(&CheckedEntry, &mut PackageEntry<'_, R>) -> Result<(), E>,
) -> Result<Tally, E> {
    let mut magic = [0u8; 2];
    raw.read_exact(&mut magic).map_err(|_| PackageError::NotGzip)?;
    if magic != [0x1f, 0x8b] {
        return Err(PackageError::NotGzip.into());
    }
    let failure = std::rc::Rc::default();
    let gz = Gunzip {
        inner: flate2::read::GzDecoder::new(io::Cursor::new(magic).chain(raw)),
        failure: std::rc::Rc::clone(&failure),
    };
    let bad_stream = |e: io::Error| match failure.borrow().clone() {
        Some(detail) => PackageError::CorruptGzip { detail },
        None => PackageError::NotTar { detail: e.to_string() },
    };
    let mut archive = tar::Archive::new(gz);
    let mut tally = Tally::default();
    let mut symlinks: HashSet<PathBuf> = HashSet::new();
    for entry in archive.entries().map_err(bad_stream)? {
        let mut entry = entry.map_err(bad_stream)?;
        tally.entries += 1;
        if tally.entries > limits.max_entries {
            return Err(PackageError::TooManyEntries { max: limits.max_entries }.into());
        }
        let kind = entry.header().entry_type();
        if kind == tar::EntryType::XGlobalHeader {
            // `git archive` metadata; nothing to unpack.
            continue;
        }
        let raw_path = entry.path().map_err(bad_stream)?.into_owned();
        let link = entry.link_name().map_err(bad_stream)?.map(|l| l.into_owned());
        let mode = entry.header().mode().map_err(bad_stream)?;
        let path = check_entry_within(&raw_path, kind, link.as_deref(), mode, limits.max_path_len)?;
        let refused = |rule| PackageError::EntryRefused { entry: raw_path.display().to_string(), rule };
        if let Some(via) = through_symlink(&path, &symlinks) {
            return Err(refused(EntryRule::ThroughSymlink { link: via }).into());
        }
        // A file or symlink replaces an earlier symlink of the same name; a
        // directory or hard link would go through it.
        if matches!(kind, tar::EntryType::Directory | tar::EntryType::Link) && symlinks.contains(&path) {
            return Err(refused(EntryRule::ThroughSymlink { link: path.display().to_string() }).into());
        }
        if kind == tar::EntryType::Link {
            let target = normalize(link.as_deref().unwrap_or(Path::new("")));
            if let Some(via) = through_symlink(&target, &symlinks) {
                return Err(refused(EntryRule::ThroughSymlink { link: via }).into());
            }
            if symlinks.contains(&target) {
                // A hard link to a symlink is another symlink.
                symlinks.insert(path.clone());
            }
        } else if kind == tar::EntryType::Symlink {
            symlinks.insert(path.clone());
        }
        // Never forget a symlink: staying suspicious of its name costs nothing.
        // `Entry::size` honours a pax `size` override; the raw header may not.
        let size = if kind == tar::EntryType::Regular { entry.size() } else { 0 };
        tally.bytes = tally.bytes.saturating_add(size);
        if tally.bytes > limits.max_total_bytes {
            return Err(
                PackageError::TooLarge { entry: raw_path.display().to_string(), max: limits.max_total_bytes }.into()
            );
        }
        let checked = CheckedEntry { path, kind, mode: mode & 0o777, size };
        visit(&checked, &mut entry)?;
    }
    Ok(tally)
}

/// The first proper ancestor of `path` that is a symlink of this archive.
fn through_symlink(path: &Path, symlinks: &HashSet<PathBuf>) -> Option<String> {
    path.ancestors().skip(1).find(|a| symlinks.contains(*a)).map(|a| a.display().to_string())
}

/// Lexical normalization of an already-checked relative path.
fn normalize(p: &Path) -> PathBuf {
    p.components().filter(|c| matches!(c, Component::Normal(_))).collect()
}

/// Packs a component folder (with `component.toml` at its root) into a
/// `.tar.gz`; returns the component's name, version and the bytes.
/// File modes are kept (scripts stay executable); ownership is not.
pub fn pack_dir(dir: &Path) -> Result<(String, String, Vec<u8>), String> {
    #[derive(serde::Deserialize)]
    struct Head {
        component: HeadComponent,
    }
    #[derive(serde::Deserialize)]
    struct HeadComponent {
        name: String,
        version: String,
    }
    let text = std::fs::read_to_string(dir.join("component.toml")).map_err(|e| format!("component.toml: {e}"))?;
    let head: Head = toml::from_str::<toml::Table>(&text)
        .map_err(|e| format!("component.toml: {e}"))
        .and_then(|t| toml::Value::Table(t).try_into().map_err(|e: toml::de::Error| format!("component.toml: {e}")))?;
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    let mut tar = tar::Builder::new(gz);
    tar.mode(tar::HeaderMode::Deterministic);
    tar.follow_symlinks(false);
    let mut entries: Vec<PathBuf> = files_under(dir).map_err(|e| format!("reading {}: {e}", dir.display()))?;
    entries.sort();
    for path in entries {
        let rel = path.strip_prefix(dir).map_err(|e| e.to_string())?;
        if rel.as_os_str().is_empty() || rel.starts_with("build.sh") {
            continue;
        }
        tar.append_path_with_name(&path, rel).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    let gz = tar.into_inner().map_err(|e| e.to_string())?;
    let bytes = gz.finish().map_err(|e| e.to_string())?;
    Ok((head.component.name, head.component.version, bytes))
}

fn files_under(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let p = e?.path();
        let meta = std::fs::symlink_metadata(&p)?;
        out.push(p.clone());
        if meta.is_dir() {
            out.extend(files_under(&p)?);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::testkit::*;
    use super::*;

    fn inspect(entries: &[TestEntry], limits: &ExtractLimits) -> Result<PackageInfo, PackageError> {
        inspect_bytes(&targz(entries), limits)
    }

    fn inspect_bytes(bytes: &[u8], limits: &ExtractLimits) -> Result<PackageInfo, PackageError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pkg.tar.gz");
        std::fs::write(&path, bytes).unwrap();
        inspect_package(&path, limits)
    }

    fn refused(entries: &[TestEntry]) -> EntryRule {
        match inspect(entries, &ExtractLimits::default()) {
            Err(PackageError::EntryRefused { rule, .. }) => rule,
            other => panic!("expected a refused entry, got {other:?}"),
        }
    }

    #[test]
    fn a_good_package_is_inspected() {
        let entries = [
            dir("./"),
            file("./component.toml", SPEC.as_bytes()),
            dir("./bin"),
            with_mode(file("./bin/run", b"#!/bin/sh\nexec sleep 100\n"), 0o755),
            symlink("./bin/start", "run"),
            hardlink("./bin/run2", "bin/run"),
        ];
        let info = inspect(&entries, &ExtractLimits::default()).unwrap();
        assert_eq!(info.spec_toml, SPEC);
        assert_eq!(info.entries, 6);
        assert_eq!(info.unpacked_bytes, (SPEC.len() + b"#!/bin/sh\nexec sleep 100\n".len()) as u64);
    }

    #[test]
    fn each_rule_is_applied_to_uploads() {
        let spec = || file("component.toml", SPEC.as_bytes());
        assert_eq!(refused(&[spec(), file("/etc/cron.d/x", b"x")]), EntryRule::AbsolutePath);
        assert_eq!(refused(&[spec(), file("../x", b"x")]), EntryRule::ParentDir);
        assert!(matches!(refused(&[spec(), symlink("lib/l", "../../etc")]), EntryRule::LinkEscapes { .. }));
        assert!(matches!(refused(&[spec(), hardlink("h", "../etc/shadow")]), EntryRule::LinkEscapes { .. }));
        assert!(matches!(
            refused(&[spec(), with_kind(file("tty", b""), tar::EntryType::Char)]),
            EntryRule::SpecialFile { .. }
        ));
        assert!(matches!(refused(&[spec(), with_mode(file("su", b"x"), 0o4755)]), EntryRule::SetId { .. }));
        assert!(matches!(refused(&[spec(), dir("data/"), file("data/x", b"x")]), EntryRule::Reserved { .. }));
    }

    #[test]
    fn paths_through_an_inner_symlink_are_refused() {
        // `s -> .` is inside; `s/up -> ..` looks inside lexically but would
        // land in the parent of the root once `s` is followed on disk.
        let rule = refused(&[file("component.toml", SPEC.as_bytes()), symlink("s", "."), symlink("s/up", "..")]);
        assert_eq!(rule, EntryRule::ThroughSymlink { link: "s".into() });
        let rule = refused(&[dir("d"), symlink("d/l", "."), hardlink("h", "d/l/x")]);
        assert!(matches!(rule, EntryRule::ThroughSymlink { .. }), "{rule:?}");
    }

    #[test]
    fn limits_are_enforced() {
        let entries: Vec<_> = (0..5).map(|i| file(&format!("f{i}"), b"12345")).collect();
        let few = ExtractLimits { max_entries: 4, ..ExtractLimits::default() };
        assert!(matches!(inspect(&entries, &few), Err(PackageError::TooManyEntries { max: 4 })));
        let small = ExtractLimits { max_total_bytes: 12, ..ExtractLimits::default() };
        match inspect(&entries, &small) {
            Err(PackageError::TooLarge { entry, max: 12 }) => assert_eq!(entry, "f2"),
            other => panic!("{other:?}"),
        }
        let short = ExtractLimits { max_path_len: 3, ..ExtractLimits::default() };
        assert!(matches!(
            inspect(&[file("component.toml", b"")], &short),
            Err(PackageError::EntryRefused { rule: EntryRule::PathTooLong { .. }, .. })
        ));
    }

    #[test]
    fn spec_problems_are_reported() {
        assert!(matches!(inspect(&[file("bin/run", b"x")], &ExtractLimits::default()), Err(PackageError::MissingSpec)));
        // Not at the root.
        assert!(matches!(
            inspect(&[file("sub/component.toml", SPEC.as_bytes())], &ExtractLimits::default()),
            Err(PackageError::MissingSpec)
        ));
        let big = vec![b'#'; MAX_SPEC_BYTES as usize + 1];
        assert!(matches!(
            inspect(&[file("component.toml", &big)], &ExtractLimits::default()),
            Err(PackageError::SpecTooLarge { .. })
        ));
        assert!(matches!(
            inspect(&[dir("component.toml")], &ExtractLimits::default()),
            Err(PackageError::SpecNotAFile)
        ));
        assert!(matches!(
            inspect(&[file("component.toml", &[0xff, 0xfe])], &ExtractLimits::default()),
            Err(PackageError::SpecNotUtf8)
        ));
    }

    #[test]
    fn non_gzip_and_non_tar_are_told_apart() {
        let limits = ExtractLimits::default();
        assert!(matches!(inspect_bytes(b"", &limits), Err(PackageError::NotGzip)));
        assert!(matches!(inspect_bytes(b"PK\x03\x04 a zip file", &limits), Err(PackageError::NotGzip)));
        // Plain tar, not compressed.
        let plain = tar_bytes(&[file("component.toml", SPEC.as_bytes())]);
        assert!(matches!(inspect_bytes(&plain, &limits), Err(PackageError::NotGzip)));
        // Gzip of something that is not a tar.
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut gz, &[7u8; 2000]).unwrap();
        let err = inspect_bytes(&gz.finish().unwrap(), &limits).unwrap_err();
        assert!(matches!(err, PackageError::NotTar { .. }), "{err:?}");
        // Gzip header then garbage deflate data.
        let mut bad = targz(&[file("component.toml", SPEC.as_bytes())]);
        for b in bad.iter_mut().skip(12) {
            *b ^= 0x5a;
        }
        let err = inspect_bytes(&bad, &limits).unwrap_err();
        assert!(matches!(err, PackageError::CorruptGzip { .. }), "{err:?}");
    }

    #[test]
    fn package_errors_become_invalid_package() {
        let e: Error = PackageError::EntryRefused { entry: "x/../y".into(), rule: EntryRule::ParentDir }.into();
        match e {
            Error::Invalid { code, message } => {
                assert_eq!(code, "invalid_package");
                assert!(message.contains("x/../y") && message.contains(".."), "{message}");
            }
            other => panic!("{other:?}"),
        }
    }
}
