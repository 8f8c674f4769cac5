//! Package tarballs on disk, one file per distinct content, named by its
//! sha256 (lowercase hex) inside one directory.
//!
//! Security (DESIGN.md §14): a path is only ever built from a validated
//! 64-character lowercase hex digest, so no request value can name a file
//! elsewhere. Durability: an upload is streamed into a `.tmp-<uuid>` file,
//! then `persist` fsyncs it, renames it to its digest and fsyncs the
//! directory, so after a crash a digest file is either complete or absent;
//! leftover temp files are removed at open.

use std::io;
use std::path::{Path, PathBuf};

use super::StorageError;

const TEMP_PREFIX: &str = ".tmp-";

/// The blob directory.
#[derive(Debug, Clone)]
pub struct BlobStore {
    dir: PathBuf,
}

/// Checks that `sha256` is 64 lowercase hex characters.
pub fn validate_sha256(sha256: &str) -> Result<(), StorageError> {
    let ok = sha256.len() == 64 && sha256.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    if ok { Ok(()) } else { Err(StorageError::InvalidSha256 { value: sha256.chars().take(16).collect() }) }
}

impl BlobStore {
    /// Opens (creating if needed) the blob directory and removes temp files
    /// a crash left behind.
    pub fn open(dir: &Path) -> Result<BlobStore, StorageError> {
        std::fs::create_dir_all(dir).map_err(|e| StorageError::io(dir, e))?;
        let store = BlobStore { dir: dir.to_path_buf() };
        let removed = store.cleanup_temps()?;
        if removed > 0 {
            tracing::info!(dir = %dir.display(), removed, "removed unfinished uploads");
        }
        Ok(store)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The path of the blob with this digest (which need not exist).
    pub fn path_for(&self, sha256: &str) -> Result<PathBuf, StorageError> {
        validate_sha256(sha256)?;
        Ok(self.dir.join(sha256))
    }

    /// Creates a new, empty temp file in the blob directory for an upload.
    pub async fn create_temp(&self) -> Result<(PathBuf, tokio::fs::File), StorageError> {
        let path = self.dir.join(format!("{TEMP_PREFIX}{}", uuid::Uuid::new_v4().simple()));
        let file = tokio::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .await
            .map_err(|e| StorageError::io(&path, e))?;
        Ok((path, file))
    }

    /// Makes the finished temp file `tmp` the durable blob `sha256` and
    /// returns its path. The caller vouches that `sha256` is the digest of
    /// the content; the same digest persisted twice just replaces identical
    /// bytes.
    pub async fn persist(&self, tmp: impl AsRef<Path>, sha256: &str) -> Result<PathBuf, StorageError> {
        let tmp = tmp.as_ref();
        let dest = self.path_for(sha256)?;
        let ours = tmp.parent() == Some(self.dir.as_path())
            && tmp.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(TEMP_PREFIX));
        if !ours {
            let e = io::Error::new(io::ErrorKind::InvalidInput, "not a temp file of this blob store");
            return Err(StorageError::io(tmp, e));
        }
        let file = tokio::fs::File::open(tmp).await.map_err(|e| StorageError::io(tmp, e))?;
        file.sync_all().await.map_err(|e| StorageError::io(tmp, e))?;
        drop(file);
        tokio::fs::rename(tmp, &dest).await.map_err(|e| StorageError::io(&dest, e))?;
        self.sync_dir().await?;
        Ok(dest)
    }

    /// True when the blob `sha256` exists.
    pub async fn contains(&self, sha256: &str) -> Result<bool, StorageError> {
        let path = self.path_for(sha256)?;
        tokio::fs::try_exists(&path).await.map_err(|e| StorageError::io(&path, e))
    }

    /// Removes the blob `sha256`; removing a missing blob is not an error.
    pub async fn remove(&self, sha256: &str) -> Result<(), StorageError> {
        let path = self.path_for(sha256)?;
        match tokio::fs::remove_file(&path).await {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(StorageError::io(&path, e)),
        }
    }

    /// Every blob held (its digest) with when it was last written (blocking).
    pub fn digests(&self) -> Result<Vec<(String, std::time::SystemTime)>, StorageError> {
        let entries = std::fs::read_dir(&self.dir).map_err(|e| StorageError::io(&self.dir, e))?;
        let mut out = Vec::new();
        for entry in entries.flatten() {
            let Some(name) = entry.file_name().to_str().map(str::to_string) else { continue };
            if validate_sha256(&name).is_err() {
                continue;
            }
            if let Ok(meta) = entry.metadata()
                && meta.is_file()
            {
                out.push((name, meta.modified().unwrap_or(std::time::UNIX_EPOCH)));
            }
        }
        Ok(out)
    }

    /// Removes every `.tmp-*` file (blocking); returns how many were removed.
    /// Only safe while no upload is running, i.e. at open.
    pub fn cleanup_temps(&self) -> Result<usize, StorageError> {
        let entries = std::fs::read_dir(&self.dir).map_err(|e| StorageError::io(&self.dir, e))?;
        let mut removed = 0;
        for entry in entries {
            let entry = entry.map_err(|e| StorageError::io(&self.dir, e))?;
            let is_temp = entry.file_name().to_str().is_some_and(|n| n.starts_with(TEMP_PREFIX));
            let is_file = entry.file_type().map_err(|e| StorageError::io(entry.path(), e))?.is_file();
            if is_temp && is_file {
                std::fs::remove_file(entry.path()).map_err(|e| StorageError::io(entry.path(), e))?;
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// Makes the directory entries (renames) durable.
    async fn sync_dir(&self) -> Result<(), StorageError> {
        let dir = tokio::fs::File::open(&self.dir).await.map_err(|e| StorageError::io(&self.dir, e))?;
        dir.sync_all().await.map_err(|e| StorageError::io(&self.dir, e))
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncWriteExt;

    use super::*;

    const SHA: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

    async fn upload(store: &BlobStore, content: &[u8], sha: &str) -> Result<PathBuf, StorageError> {
        let (tmp, mut file) = store.create_temp().await.unwrap();
        assert!(tmp.starts_with(store.dir()));
        file.write_all(content).await.unwrap();
        file.flush().await.unwrap();
        drop(file);
        store.persist(&tmp, sha).await
    }

    #[tokio::test]
    async fn persist_puts_the_file_at_its_digest() {
        let dir = tempfile::tempdir().unwrap();
        let store = BlobStore::open(&dir.path().join("packages")).unwrap();
        assert!(!store.contains(SHA).await.unwrap());
        let path = upload(&store, b"test", SHA).await.unwrap();
        assert_eq!(path, store.path_for(SHA).unwrap());
        assert_eq!(path, dir.path().join("packages").join(SHA));
        assert_eq!(std::fs::read(&path).unwrap(), b"test");
        assert!(store.contains(SHA).await.unwrap());
        // Only the blob is left: the temp file was renamed, not copied.
        let names: Vec<_> = std::fs::read_dir(store.dir()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, vec![std::ffi::OsString::from(SHA)]);

        store.remove(SHA).await.unwrap();
        assert!(!path.exists());
        assert!(!store.contains(SHA).await.unwrap());
        store.remove(SHA).await.unwrap();
    }

    #[tokio::test]
    async fn bad_digests_never_become_paths() {
        let dir = tempfile::tempdir().unwrap();
        let store = BlobStore::open(dir.path()).unwrap();
        let bad = [
            String::new(),
            SHA.to_uppercase(),
            SHA[..63].to_string(),
            format!("{SHA}0"),
            format!("../{}", &SHA[3..]),
            format!("{}g", &SHA[..63]),
            "é".repeat(32),
            format!("/{}", &SHA[1..]),
        ];
        for b in &bad {
            assert!(matches!(store.path_for(b), Err(StorageError::InvalidSha256 { .. })), "{b:?}");
            assert!(store.contains(b).await.is_err(), "{b:?}");
            assert!(store.remove(b).await.is_err(), "{b:?}");
        }
        // A refused persist leaves the temp file where it was.
        let (tmp, _file) = store.create_temp().await.unwrap();
        assert!(store.persist(&tmp, "../../etc/passwd").await.is_err());
        assert!(tmp.exists());
        // The error does not echo a long hostile name whole.
        let long = "x".repeat(10_000);
        assert!(store.path_for(&long).unwrap_err().to_string().len() < 200);
    }

    #[tokio::test]
    async fn persist_only_takes_its_own_temp_files() {
        let dir = tempfile::tempdir().unwrap();
        let store = BlobStore::open(&dir.path().join("blobs")).unwrap();
        let outside = dir.path().join(".tmp-outside");
        std::fs::write(&outside, b"x").unwrap();
        assert!(store.persist(&outside, SHA).await.is_err());
        let not_temp = store.dir().join("other");
        std::fs::write(&not_temp, b"x").unwrap();
        assert!(store.persist(&not_temp, SHA).await.is_err());
        assert!(outside.exists() && not_temp.exists());
        assert!(!store.contains(SHA).await.unwrap());
    }

    #[tokio::test]
    async fn open_removes_leftover_temp_files_only() {
        let dir = tempfile::tempdir().unwrap();
        let store = BlobStore::open(dir.path()).unwrap();
        upload(&store, b"test", SHA).await.unwrap();
        let (t1, _f1) = store.create_temp().await.unwrap();
        let (t2, _f2) = store.create_temp().await.unwrap();
        assert_ne!(t1, t2);
        std::fs::create_dir(dir.path().join(".tmp-a-dir")).unwrap();
        std::fs::write(dir.path().join("notes"), b"keep").unwrap();

        let store = BlobStore::open(dir.path()).unwrap();
        assert!(!t1.exists() && !t2.exists());
        assert!(store.contains(SHA).await.unwrap());
        assert!(dir.path().join(".tmp-a-dir").is_dir());
        assert!(dir.path().join("notes").exists());
        assert_eq!(store.cleanup_temps().unwrap(), 0);
    }
}
