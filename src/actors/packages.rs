//! Uploaded packages: streamed to a temp file while hashing, size-capped,
//! inspected (every tar entry checked, `component.toml` parsed and
//! validated), then stored as a file named by its sha256 and recorded.
//!
//! Deleting a package goes through the supervisor, so it is serialized with
//! cluster creates and a package in use can never disappear under one.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use actix::prelude::*;
use bytes::Bytes;
use futures::{Stream, StreamExt};
use sha2::{Digest, Sha256};
use time::OffsetDateTime;
use tokio::io::AsyncWriteExt;

use super::Shared;
use super::read_model::PackageView;
use super::supervisor::Supervisor;
use crate::error::Error;
use crate::ids::{validate_name, validate_version};
use crate::package::{ExtractLimits, inspect_package};
use crate::spec::ComponentSpec;
use crate::storage::WriteOp;
use crate::storage::records::{PackageRecord, RECORD_VERSION};

/// How an upload's body must keep coming: a client that sends nothing for
/// `idle`, or has sent less than `min_rate` bytes for each second past the
/// first `idle`, is refused, and the version's upload slot is free again
/// at once.
#[derive(Debug, Clone, Copy)]
pub struct UploadLimits {
    pub max_bytes: u64,
    pub idle: std::time::Duration,
    pub min_rate: u64,
}

impl UploadLimits {
    /// From the master's settings.
    pub fn of(cfg: &crate::config::MasterConfig) -> UploadLimits {
        UploadLimits { max_bytes: cfg.max_upload_bytes, idle: cfg.upload_idle_timeout, min_rate: cfg.upload_min_rate }
    }
}

pub struct Packages {
    shared: Shared,
    limits: UploadLimits,
    /// Uploads in progress, so two uploads of one version don't race.
    uploading: Mutex<HashSet<(String, String)>>,
}

/// Removes the in-progress mark whatever way the upload ends.
struct UploadGuard<'a>(&'a Packages, (String, String));

impl Drop for UploadGuard<'_> {
    fn drop(&mut self) {
        self.0.uploading.lock().unwrap_or_else(|p| p.into_inner()).remove(&self.1);
    }
}

/// Whether the upload created the package or found the same bytes there.
pub enum Uploaded {
    Created(PackageRecord),
    Unchanged(PackageRecord),
    /// A dry run: the package passed every check and would be created.
    WouldCreate(PackageRecord, Arc<ComponentSpec>),
}

impl Packages {
    pub fn new(shared: Shared, limits: UploadLimits) -> Arc<Self> {
        Arc::new(Packages { shared, limits, uploading: Mutex::default() })
    }

    pub fn check_names(name: &str, version: &str) -> Result<(), Error> {
        validate_name(name).map_err(|m| Error::invalid("invalid_name", format!("package name: {m}")))?;
        validate_version(version).map_err(|m| Error::invalid("invalid_version", format!("package version: {m}")))
    }

    /// Stores an upload. The body is streamed to disk; nothing is recorded
    /// unless the whole package is good.
    /// With `dry_run`, every check runs and nothing is kept.
    pub async fn upload<S, E>(&self, name: &str, version: &str, body: S, dry_run: bool) -> Result<Uploaded, Error>
    where
        S: Stream<Item = Result<Bytes, E>> + Unpin,
        E: std::fmt::Display,
    {
        Self::check_names(name, version)?;
        let key = (name.to_string(), version.to_string());
        if !self.uploading.lock().unwrap_or_else(|p| p.into_inner()).insert(key.clone()) {
            return Err(Error::conflict(
                "upload_in_progress",
                format!("package {name}/{version} is being uploaded right now"),
            ));
        }
        let _guard = UploadGuard(self, key.clone());
        let blobs = self.shared.blobs.clone();
        let (tmp, mut file) = blobs.create_temp().await.map_err(Error::from)?;
        let streamed = self.stream_to(&mut file, body).await;
        let (sha256, size) = match streamed {
            Ok(v) => v,
            Err(e) => {
                drop(file);
                let _ = tokio::fs::remove_file(&tmp).await;
                return Err(e);
            }
        };
        drop(file);
        let result = self.register(name, version, &tmp, sha256, size, dry_run).await;
        // On success the temp file was renamed away; on failure it goes.
        let _ = tokio::fs::remove_file(&tmp).await;
        result
    }

    async fn stream_to<S, E>(&self, file: &mut tokio::fs::File, mut body: S) -> Result<(String, u64), Error>
    where
        S: Stream<Item = Result<Bytes, E>> + Unpin,
        E: std::fmt::Display,
    {
        let mut hasher = Sha256::new();
        let mut size: u64 = 0;
        let UploadLimits { max_bytes, idle, min_rate } = self.limits;
        let started = tokio::time::Instant::now();
        loop {
            let Ok(next) = tokio::time::timeout(idle, body.next()).await else {
                return Err(Error::invalid(
                    "upload_stalled",
                    format!("no bytes of the upload for {} s (after {size} bytes); send it again", idle.as_secs_f64()),
                ));
            };
            let Some(chunk) = next else { break };
            let chunk =
                chunk.map_err(|e| Error::invalid("upload_failed", format!("reading the upload failed: {e}")))?;
            size += chunk.len() as u64;
            if size > max_bytes {
                return Err(Error::TooLarge {
                    message: format!("package is larger than the limit of {max_bytes} bytes"),
                });
            }
            // The rate is owed only for the time past the silence `idle`
            // allows (a pipe that starts late is not held against it).
            let elapsed = started.elapsed();
            if elapsed > idle && (size as f64) < min_rate as f64 * (elapsed - idle).as_secs_f64() {
                return Err(Error::invalid(
                    "upload_too_slow",
                    format!(
                        "the upload came at {:.0} bytes/s over {:.1} s; at least {min_rate} bytes/s are needed",
                        size as f64 / elapsed.as_secs_f64(),
                        elapsed.as_secs_f64()
                    ),
                ));
            }
            hasher.update(&chunk);
            file.write_all(&chunk).await.map_err(Error::internal)?;
        }
        if size == 0 {
            return Err(Error::invalid(
                "invalid_package",
                "the upload is empty; send the package tarball (.tar.gz) as the body",
            ));
        }
        file.sync_all().await.map_err(Error::internal)?;
        Ok((hex::encode(hasher.finalize()), size))
    }

    async fn register(
        &self,
        name: &str,
        version: &str,
        tmp: &std::path::Path,
        sha256: String,
        size: u64,
        dry_run: bool,
    ) -> Result<Uploaded, Error> {
        let existing = self.shared.read_model.package(name, version).map(|p| p.record);
        if let Some(existing) = existing {
            if existing.sha256 == sha256 {
                return Ok(Uploaded::Unchanged((*existing).clone()));
            }
            return Err(Error::AlreadyExists { kind: "package", id: format!("{name}/{version}") });
        }
        let path = tmp.to_path_buf();
        let info = tokio::task::spawn_blocking(move || inspect_package(&path, &ExtractLimits::default()))
            .await
            .map_err(Error::internal)??;
        let spec = ComponentSpec::parse(&info.spec_toml)?;
        if spec.component.name != name || spec.component.version != version {
            return Err(Error::spec(
                "component",
                format!(
                    "the package is uploaded as {name}/{version} but its component.toml says {}/{}",
                    spec.component.name, spec.component.version
                ),
            ));
        }
        let record = PackageRecord {
            version: RECORD_VERSION,
            name: name.to_string(),
            package_version: version.to_string(),
            sha256,
            size,
            spec_toml: info.spec_toml,
            uploaded_at: OffsetDateTime::now_utc(),
        };
        if dry_run {
            return Ok(Uploaded::WouldCreate(record, Arc::new(spec)));
        }
        self.shared.blobs.persist(tmp, &record.sha256).await.map_err(Error::from)?;
        // With several masters, on a majority of their disks before the
        // package exists for anyone.
        if let Some(peers) = &self.shared.peers {
            super::peer_blobs::replicate(peers, &self.shared.blobs, &record.sha256, record.size).await?;
        }
        self.shared.store.try_commit(vec![WriteOp::put_package(&record)?]).await?;
        self.shared.read_model.put_package(PackageView { record: Arc::new(record.clone()), spec: Arc::new(spec) });
        Ok(Uploaded::Created(record))
    }
}

/// Deletes a package unless a cluster uses it.
#[derive(Message)]
#[rtype(result = "Result<(), Error>")]
pub struct DeletePackage {
    pub name: String,
    pub version: String,
    pub slot: super::read_model::Reservation,
    /// Check only: in use, or missing, refuses as the real delete does.
    pub dry_run: bool,
}

impl Handler<DeletePackage> for Supervisor {
    type Result = ResponseFuture<Result<(), Error>>;

    fn handle(&mut self, msg: DeletePackage, _ctx: &mut Context<Self>) -> Self::Result {
        let shared = self.shared().clone();
        let DeletePackage { name, version, slot, dry_run } = msg;
        if let Err(e) = slot.take("delete package") {
            return Box::pin(async move { Err(e) });
        }
        self.stats().end(None);
        let msg = (name, version);
        // A cluster uses its package; a running upgrade of a cluster of
        // this component may switch to, or back to (its undo), any version
        // of it, so none goes while one runs.
        let is_it = |p: &crate::storage::records::PackageRef| p.name == msg.0 && p.version == msg.1;
        let running = shared.read_model.running_operations();
        let users: Vec<String> = shared
            .read_model
            .clusters()
            .values()
            .map(|c| c.load())
            .filter(|c| {
                is_it(&c.record.package)
                    || (c.record.package.name == msg.0
                        && c.record
                            .operation
                            .and_then(|id| running.get(&id))
                            .is_some_and(|o| o.kind == crate::storage::records::OperationKind::Upgrade))
            })
            .map(|c| c.record.name.clone())
            .collect();
        if !users.is_empty() {
            return Box::pin(futures::future::ready(Err(Error::conflict(
                "package_in_use",
                format!("package {}/{} is used by clusters: {}", msg.0, msg.1, users.join(", ")),
            ))));
        }
        if dry_run {
            let found = shared.read_model.package(&msg.0, &msg.1).is_some();
            return Box::pin(futures::future::ready(if found {
                Ok(())
            } else {
                Err(Error::not_found("package", format!("{}/{}", msg.0, msg.1)))
            }));
        }
        // Removed from the read model first: a create that runs after this
        // handler no longer finds the package.
        let Some(pkg) = shared.read_model.remove_package(&msg.0, &msg.1) else {
            return Box::pin(futures::future::ready(Err(Error::not_found("package", format!("{}/{}", msg.0, msg.1)))));
        };
        let blob_in_use = shared.read_model.packages().values().any(|o| o.record.sha256 == pkg.record.sha256);
        Box::pin(async move {
            let op = WriteOp::delete_package(&msg.0, &msg.1);
            if let Err(e) = shared.store.commit(vec![op]).await {
                shared.read_model.put_package(pkg);
                return Err(Error::from(e));
            }
            if !blob_in_use && let Err(e) = shared.blobs.remove(&pkg.record.sha256).await {
                tracing::warn!(error = %e, "cannot remove package file");
            }
            Ok(())
        })
    }
}
