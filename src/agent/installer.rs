//! Package extraction on the agent: streaming (while the master's chunks
//! arrive) or from the cached tarball, into a fresh staging directory that
//! [`place_instance_dir`] then moves into place.
//!
//! Every entry goes through the same rules as on upload
//! ([`crate::package::walk`]), so nothing lands outside the staging dir,
//! no device or setuid file is created, and the limits hold. The raw bytes
//! are hashed (and optionally teed into the package cache) as they are read,
//! so the sha256 the master announced is verified without a second pass.
//!
//! Concurrency: the tar reader is blocking, so it runs in `spawn_blocking`
//! and pulls chunks from a bounded channel. A full channel makes `push`
//! wait, which stops the agent's read loop and gives TCP backpressure to the
//! master when the disk is slower than the network. When extraction fails
//! the blocking side drops the receiver, so the next `push` fails at once
//! instead of streaming the rest of a doomed package.

use std::fs::{self, File};
use std::io::{self, BufWriter, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::package::{CheckedEntry, EntryRule, ExtractLimits, PackageEntry, PackageError, walk};

mod tree;

pub use tree::place_instance_dir;

/// Chunks buffered between the network and the extractor (~4 MiB).
const CHANNEL_CHUNKS: usize = 4;

/// Why an install failed on the agent.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    /// An entry broke a rule, a limit was reached, or the data is not a
    /// `.tar.gz`.
    #[error(transparent)]
    Package(#[from] PackageError),
    #[error("the package stream is over the limit of {max} bytes")]
    StreamTooLarge { max: u64 },
    #[error("package sha256 is {actual}, expected {expected}")]
    ShaMismatch { expected: String, actual: String },
    #[error("package is {actual} bytes, expected {expected}")]
    SizeMismatch { expected: u64, actual: u64 },
    #[error("cannot unpack entry {entry:?}")]
    Unpack {
        entry: String,
        #[source]
        source: io::Error,
    },
    #[error("cannot {op} {path}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// Something in the instance directory was not what the agent
    /// expects (a link, a FIFO, a bad path), or a file operation there
    /// failed (`agent::beneath`).
    #[error(transparent)]
    Beneath(#[from] crate::agent::beneath::BeneathError),
    #[error("the extraction already failed")]
    AlreadyFailed,
    #[error("the extraction task died: {0}")]
    Task(String),
}

impl InstallError {
    /// `map_err` helper: an i/o failure of `op` on `path`.
    pub(crate) fn io(op: &'static str, path: &Path) -> impl FnOnce(io::Error) -> InstallError + use<> {
        let path = path.to_path_buf();
        move |source| InstallError::Io { op, path, source }
    }

    /// `map_err` helper for `nix` calls.
    pub(crate) fn errno(op: &'static str, path: &Path) -> impl FnOnce(nix::errno::Errno) -> InstallError + use<> {
        let path = path.to_path_buf();
        move |e| InstallError::Io { op, path, source: e.into() }
    }
}

/// What an extraction produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtractSummary {
    pub entries: u64,
    /// Unpacked bytes (sum of file sizes).
    pub bytes: u64,
    /// sha256 of the raw `.tar.gz` bytes, lowercase hex.
    pub sha256: String,
}

/// Outcome of the blocking side: the summary plus the raw stream size.
struct Extracted {
    summary: ExtractSummary,
    raw_bytes: u64,
}

// ---------------------------------------------------------------- streaming

/// A package being extracted while its bytes arrive. Consume it with
/// [`finish`](Self::finish) or [`abort`](Self::abort); dropping it aborts in
/// the background.
pub struct StreamingExtractor {
    tx: Option<mpsc::Sender<Vec<u8>>>,
    task: Option<JoinHandle<Result<Extracted, InstallError>>>,
    staging: PathBuf,
    tee: Option<PathBuf>,
    pushed: u64,
    max_raw_bytes: u64,
}

impl StreamingExtractor {
    /// Creates `staging_dir` (which must not exist) and starts the blocking
    /// extractor. With `tee_to`, the raw bytes are also written there.
    /// Must be called inside a tokio runtime.
    pub fn start(staging_dir: PathBuf, limits: ExtractLimits, tee_to: Option<PathBuf>) -> Result<Self, InstallError> {
        create_staging(&staging_dir)?;
        let (tx, mut rx) = mpsc::channel::<Vec<u8>>(CHANNEL_CHUNKS);
        let max_raw_bytes = limits.max_total_bytes;
        let (staging, tee) = (staging_dir.clone(), tee_to.clone());
        let task = tokio::task::spawn_blocking(move || {
            let source = ChannelReader { rx: &mut rx, chunk: Vec::new(), pos: 0 };
            extract_blocking(source, &staging, &limits, tee.as_deref())
            // `rx` drops here: a pending or later `push` fails at once.
        });
        Ok(StreamingExtractor {
            tx: Some(tx),
            task: Some(task),
            staging: staging_dir,
            tee: tee_to,
            pushed: 0,
            max_raw_bytes,
        })
    }

    /// Hands one chunk to the extractor; waits while its buffer is full.
    /// Fails as soon as the extraction has failed (with that failure, once).
    pub async fn push(&mut self, chunk: Vec<u8>) -> Result<(), InstallError> {
        let Some(tx) = self.tx.as_ref() else {
            return Err(InstallError::AlreadyFailed);
        };
        self.pushed += chunk.len() as u64;
        if self.pushed > self.max_raw_bytes {
            self.fail().await;
            return Err(InstallError::StreamTooLarge { max: self.max_raw_bytes });
        }
        if tx.send(chunk).await.is_ok() {
            return Ok(());
        }
        // The receiver is gone: the blocking side stopped with an error.
        self.tx = None;
        let err = match self.task.take() {
            Some(task) => match task.await {
                Ok(Err(e)) => e,
                Ok(Ok(_)) => InstallError::Task("the extractor stopped before the end of the package".into()),
                Err(e) => InstallError::Task(e.to_string()),
            },
            None => InstallError::AlreadyFailed,
        };
        self.cleanup().await;
        Err(err)
    }

    /// Ends the stream and waits for the extraction; verifies the raw
    /// stream's sha256 and size. On any failure the staging dir and the tee
    /// file are removed. On success the tee file holds the whole package.
    pub async fn finish(mut self, expected_sha256: &str, expected_size: u64) -> Result<ExtractSummary, InstallError> {
        self.tx = None; // end of stream
        let Some(task) = self.task.take() else {
            self.cleanup().await;
            return Err(InstallError::AlreadyFailed);
        };
        let result = match task.await {
            Ok(Ok(done)) => verify(done, expected_sha256, expected_size),
            Ok(Err(e)) => Err(e),
            Err(e) => Err(InstallError::Task(e.to_string())),
        };
        if result.is_err() {
            self.cleanup().await;
        }
        self.staging = PathBuf::new(); // nothing left for Drop to clean
        result
    }

    /// Stops the extraction and removes the staging dir and the tee file.
    pub async fn abort(mut self) {
        self.fail().await;
    }

    async fn fail(&mut self) {
        self.tx = None;
        if let Some(task) = self.task.take() {
            // Without a sender the blocking side reaches end of input and
            // stops; wait so it is not writing while we remove its dir.
            let _ = task.await;
        }
        self.cleanup().await;
    }

    async fn cleanup(&mut self) {
        if !self.staging.as_os_str().is_empty() {
            let _ = tokio::fs::remove_dir_all(&self.staging).await;
            self.staging = PathBuf::new();
        }
        if let Some(tee) = self.tee.take() {
            let _ = tokio::fs::remove_file(&tee).await;
        }
    }
}

impl Drop for StreamingExtractor {
    fn drop(&mut self) {
        let (task, staging, tee) = (self.task.take(), std::mem::take(&mut self.staging), self.tee.take());
        if task.is_none() && staging.as_os_str().is_empty() {
            return;
        }
        self.tx = None;
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                if let Some(task) = task {
                    let _ = task.await;
                }
                if !staging.as_os_str().is_empty() {
                    let _ = tokio::fs::remove_dir_all(&staging).await;
                }
                if let Some(tee) = tee {
                    let _ = tokio::fs::remove_file(&tee).await;
                }
            });
        }
    }
}

fn verify(done: Extracted, expected_sha256: &str, expected_size: u64) -> Result<ExtractSummary, InstallError> {
    if done.raw_bytes != expected_size {
        return Err(InstallError::SizeMismatch { expected: expected_size, actual: done.raw_bytes });
    }
    if !done.summary.sha256.eq_ignore_ascii_case(expected_sha256) {
        return Err(InstallError::ShaMismatch { expected: expected_sha256.to_string(), actual: done.summary.sha256 });
    }
    Ok(done.summary)
}

/// Extracts the package file `archive` (e.g. the agent's cached copy) into
/// `staging_dir`, which must not exist yet; removes it on failure.
pub async fn extract_file(
    archive: &Path,
    staging_dir: &Path,
    limits: &ExtractLimits,
) -> Result<ExtractSummary, InstallError> {
    let (archive, staging, limits) = (archive.to_path_buf(), staging_dir.to_path_buf(), limits.clone());
    let result = tokio::task::spawn_blocking(move || {
        let file = File::open(&archive).map_err(InstallError::io("open", &archive))?;
        create_staging(&staging)?;
        let done = extract_blocking(io::BufReader::new(file), &staging, &limits, None);
        if done.is_err() {
            let _ = fs::remove_dir_all(&staging);
        }
        done.map(|d| d.summary)
    })
    .await;
    result.map_err(|e| InstallError::Task(e.to_string()))?
}

// ---------------------------------------------------------------- blocking side

fn create_staging(dir: &Path) -> Result<(), InstallError> {
    if let Some(parent) = dir.parent() {
        fs::create_dir_all(parent).map_err(InstallError::io("create", parent))?;
    }
    fs::create_dir(dir).map_err(InstallError::io("create the staging dir", dir))
}

/// Reads chunks from the channel; end of input when every sender is gone.
struct ChannelReader<'a> {
    rx: &'a mut mpsc::Receiver<Vec<u8>>,
    chunk: Vec<u8>,
    pos: usize,
}

impl Read for ChannelReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.pos >= self.chunk.len() {
            match self.rx.blocking_recv() {
                Some(chunk) => {
                    self.chunk = chunk;
                    self.pos = 0;
                }
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.chunk.len() - self.pos);
        buf[..n].copy_from_slice(&self.chunk[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

/// Hashes and counts the raw bytes as they are read, and copies them to
/// the tee file. A tee failure only loses the cache copy, never the install.
struct Hashing<R> {
    inner: R,
    hasher: Sha256,
    bytes: u64,
    tee: Option<(PathBuf, BufWriter<File>)>,
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        self.bytes += n as u64;
        if let Some((path, w)) = self.tee.as_mut()
            && let Err(e) = w.write_all(&buf[..n])
        {
            tracing::warn!(path = %path.display(), error = %e, "cannot write the package cache copy; installing without it");
            let _ = fs::remove_file(&*path);
            self.tee = None;
        }
        Ok(n)
    }
}

/// Walks and unpacks the package from `raw` into `staging`, then reads the
/// rest of `raw` so the hash covers every byte sent.
fn extract_blocking(
    raw: impl Read,
    staging: &Path,
    limits: &ExtractLimits,
    tee: Option<&Path>,
) -> Result<Extracted, InstallError> {
    let tee = match tee {
        Some(path) => {
            if let Some(parent) = path.parent() {
                fs::create_dir_all(parent).map_err(InstallError::io("create", parent))?;
            }
            let f = File::create(path).map_err(InstallError::io("create", path))?;
            Some((path.to_path_buf(), BufWriter::new(f)))
        }
        None => None,
    };
    let mut source = Hashing { inner: raw, hasher: Sha256::new(), bytes: 0, tee };
    let mut dirs: Vec<(PathBuf, u32)> = Vec::new();
    let tally = walk(&mut source, limits, |checked, entry| unpack(staging, checked, entry, &mut dirs))?;
    // Directory modes last (the last entry of a name wins), deepest first,
    // so a read-only directory does not stop its own contents being written.
    let dirs: std::collections::HashMap<PathBuf, u32> = dirs.into_iter().collect();
    let mut dirs: Vec<_> = dirs.into_iter().collect();
    dirs.sort_by_key(|(d, _)| std::cmp::Reverse(d.components().count()));
    // Directories the archive did not list (parents made on the way) got
    // the agent's umask: first, while every directory is still searchable.
    strip_other_write(staging)?;
    for (dir, mode) in &dirs {
        fs::set_permissions(dir, fs::Permissions::from_mode(*mode & !WORLD_WRITABLE))
            .map_err(InstallError::io("set the mode of", dir))?;
    }
    io::copy(&mut source, &mut io::sink()).map_err(InstallError::io("read the package after", staging))?;
    if let Some((path, w)) = source.tee.take() {
        let synced = w.into_inner().map_err(|e| e.into_error()).and_then(|f| f.sync_all());
        if let Err(e) = synced {
            tracing::warn!(path = %path.display(), error = %e, "cannot write the package cache copy; installing without it");
            let _ = fs::remove_file(&path);
        }
    }
    let sha256 = hex::encode(source.hasher.finalize());
    Ok(Extracted {
        summary: ExtractSummary { entries: tally.entries, bytes: tally.bytes, sha256 },
        raw_bytes: source.bytes,
    })
}

/// The mode bit no extracted file or directory keeps: another user on
/// the node must not be able to change an instance's programs or files.
const WORLD_WRITABLE: u32 = 0o002;

/// Removes the world-writable bit from every directory under `root`
/// (symlinks are neither followed nor changed).
fn strip_other_write(root: &Path) -> Result<(), InstallError> {
    let mut todo = vec![root.to_path_buf()];
    while let Some(dir) = todo.pop() {
        let mode = fs::symlink_metadata(&dir).map_err(InstallError::io("stat", &dir))?.permissions().mode();
        if mode & WORLD_WRITABLE != 0 {
            fs::set_permissions(&dir, fs::Permissions::from_mode(mode & 0o7777 & !WORLD_WRITABLE))
                .map_err(InstallError::io("set the mode of", &dir))?;
        }
        for entry in fs::read_dir(&dir).map_err(InstallError::io("read", &dir))? {
            let entry = entry.map_err(InstallError::io("read", &dir))?;
            if entry.file_type().map_err(InstallError::io("stat", &entry.path()))?.is_dir() {
                todo.push(entry.path());
            }
        }
    }
    Ok(())
}

fn unpack<R: Read>(
    staging: &Path,
    checked: &CheckedEntry,
    entry: &mut PackageEntry<'_, R>,
    dirs: &mut Vec<(PathBuf, u32)>,
) -> Result<(), InstallError> {
    if checked.path.as_os_str().is_empty() {
        return Ok(()); // the archive root: staging itself
    }
    let shown = || checked.path.display().to_string();
    if checked.kind == tar::EntryType::Directory {
        let dst = staging.join(&checked.path);
        fs::create_dir_all(&dst).map_err(|source| InstallError::Unpack { entry: shown(), source })?;
        dirs.push((dst, checked.mode));
        return Ok(());
    }
    // `unpack_in` re-checks that the parent resolves inside `staging`, keeps
    // only the 0o777 bits (preserve_permissions is off), never chowns, and
    // replaces an existing file instead of writing through it.
    entry.set_preserve_permissions(false);
    entry.set_mask(WORLD_WRITABLE);
    entry.set_unpack_xattrs(false);
    match entry.unpack_in(staging) {
        Ok(true) => Ok(()),
        Ok(false) => Err(PackageError::EntryRefused { entry: shown(), rule: EntryRule::ParentDir }.into()),
        Err(source) => Err(InstallError::Unpack { entry: shown(), source }),
    }
}

#[cfg(test)]
mod tests;
