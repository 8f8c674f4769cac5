//! Package blobs on several masters (a store on etcd): the store holds a
//! package's record, each master's disk its tarball. An upload is accepted
//! once a majority of the installation's masters hold the tarball
//! ([`replicate`]: pushed to the others, sha256 checked on arrival), so the
//! loss of a minority of machines loses no package; and every master
//! fetches what it lacks from another ([`keep_complete`]), before a cluster
//! needs it from it. Masters reach each other on `/internal/v1/blobs/`
//! (`http::peer_blobs`) with the installation's peer secret.

use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

use crate::error::Error;
use crate::storage::BlobStore;
use crate::storage::etcd::peers::{Directory, Peer};

/// How often every package's tarball is looked for on this master's disk.
const LOOK_EVERY: Duration = Duration::from_secs(2);

/// A transfer's deadline: a minute, plus a second per 8 MiB.
fn deadline(size: u64) -> Duration {
    Duration::from_secs(60 + size / (8 << 20))
}

/// The headers naming the master a transfer is meant for and the one
/// sending it: a master refuses a transfer meant for another, so a push
/// that lands on the wrong master (a URL shared behind a load balancer)
/// never counts toward the majority.
pub const TO_HEADER: &str = "x-flotilla-peer-to";
pub const FROM_HEADER: &str = "x-flotilla-peer-from";

fn client() -> Result<reqwest::Client, Error> {
    reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .connect_timeout(Duration::from_secs(2))
        .build()
        .map_err(|e| Error::unavailable(format!("cannot make the client to other masters: {e}")))
}

fn blob_url(peer: &Peer, sha256: &str) -> String {
    format!("{}/internal/v1/blobs/{sha256}", peer.api_url.trim_end_matches('/'))
}

/// Pushes the tarball `sha256` (on this master's disk) to the other
/// masters until a majority of all of them hold it; `503` naming each
/// failure when they cannot. The pushes still under way go on.
pub async fn replicate(dir: &Arc<Directory>, blobs: &BlobStore, sha256: &str, size: u64) -> Result<(), Error> {
    let d = dir.clone();
    let peers = tokio::task::spawn_blocking(move || d.all())
        .await
        .map_err(Error::internal)?
        .map_err(|e| Error::unavailable(format!("cannot list the masters: {e}")))?;
    // One push per address, never to this master's own; the majority is
    // of the distinct addresses (an entry left by a master renamed since
    // counts once).
    let mut others: Vec<Peer> =
        peers.into_iter().filter(|p| p.name != dir.me().name && !same_url(&p.api_url, &dir.me().api_url)).collect();
    others.sort_by(|a, b| a.api_url.cmp(&b.api_url));
    others.dedup_by(|a, b| same_url(&a.api_url, &b.api_url));
    let total = others.len() + 1;
    let need = total / 2 + 1;
    if need <= 1 {
        return Ok(());
    }
    let client = client()?;
    let path = blobs.path_for(sha256).map_err(Error::from)?;
    let (tx, mut rx) = tokio::sync::mpsc::channel(others.len().max(1));
    for peer in others {
        let (client, path, tx, dir) = (client.clone(), path.clone(), tx.clone(), dir.clone());
        let url = blob_url(&peer, sha256);
        tokio::spawn(async move {
            let sent = push(&client, &url, &dir, &peer.name, &path, size).await;
            let _ = tx.send(sent.map_err(|e| format!("{}: {e}", peer.name))).await;
        });
    }
    drop(tx);
    let (mut held, mut failures) = (1, Vec::new());
    while let Some(sent) = rx.recv().await {
        match sent {
            Ok(()) => held += 1,
            Err(e) => failures.push(e),
        }
        if held >= need {
            return Ok(());
        }
    }
    Err(Error::unavailable(format!(
        "the package is on {held} of {total} masters; a majority ({need}) must hold it before it is accepted: {}",
        failures.join("; ")
    )))
}

fn same_url(a: &str, b: &str) -> bool {
    a.trim_end_matches('/') == b.trim_end_matches('/')
}

async fn push(
    client: &reqwest::Client,
    url: &str,
    dir: &Directory,
    to: &str,
    path: &std::path::Path,
    size: u64,
) -> Result<(), String> {
    let file = tokio::fs::File::open(path).await.map_err(|e| format!("reading {}: {e}", path.display()))?;
    let body = reqwest::Body::wrap_stream(tokio_util::io::ReaderStream::new(file));
    let r = client
        .put(url)
        .header("authorization", format!("Peer {}", dir.secret()))
        .header(TO_HEADER, to)
        .header(FROM_HEADER, &dir.me().name)
        .header("content-length", size)
        .timeout(deadline(size))
        .body(body)
        .send()
        .await
        .map_err(|e| e.to_string())?;
    if r.status().is_success() { Ok(()) } else { Err(format!("{} {}", r.status(), r.text().await.unwrap_or_default())) }
}

/// Fetches the tarball `sha256` from `peer` into this master's disk,
/// checking its digest and size before it is kept.
pub async fn fetch(
    client: &reqwest::Client,
    dir: &Directory,
    blobs: &BlobStore,
    peer: &Peer,
    sha256: &str,
    size: u64,
) -> Result<(), String> {
    let mut r = client
        .get(blob_url(peer, sha256))
        .header("authorization", format!("Peer {}", dir.secret()))
        .header(TO_HEADER, &peer.name)
        .header(FROM_HEADER, &dir.me().name)
        .timeout(deadline(size))
        .send()
        .await
        .map_err(|e| e.to_string())?;
    if !r.status().is_success() {
        return Err(format!("{}", r.status()));
    }
    let (tmp, mut file) = blobs.create_temp().await.map_err(|e| e.to_string())?;
    let kept = async {
        let (mut hasher, mut got) = (Sha256::new(), 0u64);
        while let Some(chunk) = r.chunk().await.map_err(|e| e.to_string())? {
            got += chunk.len() as u64;
            if got > size {
                return Err(format!("more than the package's {size} bytes"));
            }
            hasher.update(&chunk);
            file.write_all(&chunk).await.map_err(|e| e.to_string())?;
        }
        file.sync_all().await.map_err(|e| e.to_string())?;
        let digest = hex::encode(hasher.finalize());
        if digest != sha256 || got != size {
            return Err(format!("the tarball came with sha256 {digest} and {got} bytes"));
        }
        blobs.persist(&tmp, sha256).await.map_err(|e| e.to_string())?;
        Ok(())
    }
    .await;
    drop(file);
    let _ = tokio::fs::remove_file(&tmp).await;
    kept
}

/// A tarball no package names (its package deleted on the leader, or an
/// upload refused) is removed once it has been left this long (an upload
/// in flight has its tarball on a follower before its record).
const UNNAMED_GRACE: Duration = Duration::from_secs(600);

/// The longest pause before fetching again a tarball no master gave.
const MAX_RETRY: Duration = Duration::from_secs(300);

/// Runs forever: every [`LOOK_EVERY`], each package whose tarball is not on
/// this master's disk is fetched from another master (the leader first,
/// when `leader` names one), again after a growing pause for one that no
/// master gave; tarballs no package names are removed after
/// [`UNNAMED_GRACE`].
pub async fn keep_complete(
    dir: Arc<Directory>,
    blobs: Arc<BlobStore>,
    read_model: Arc<super::read_model::ReadModel>,
    leader: impl Fn() -> Option<String>,
) {
    let Ok(client) = client() else { return };
    // Digests no master gave: when to try again, and the pause after that.
    let mut retry: std::collections::HashMap<String, (tokio::time::Instant, Duration)> = Default::default();
    loop {
        tokio::time::sleep(LOOK_EVERY).await;
        let packages = read_model.packages();
        let mut missing = Vec::new();
        for p in packages.values() {
            let sha = &p.record.sha256;
            if retry.get(sha).is_some_and(|(at, _)| tokio::time::Instant::now() < *at) {
                continue;
            }
            if !blobs.contains(sha).await.unwrap_or(true) {
                missing.push((sha.clone(), p.record.size, format!("{}/{}", p.record.name, p.record.package_version)));
            }
        }
        remove_unnamed(&blobs, &read_model).await;
        if missing.is_empty() {
            continue;
        }
        let d = dir.clone();
        let Ok(Ok(mut peers)) = tokio::task::spawn_blocking(move || d.all()).await else { continue };
        peers.retain(|p| p.name != dir.me().name);
        if let Some(url) = leader() {
            peers.sort_by_key(|p| !same_url(&p.api_url, &url));
        }
        for (sha, size, name) in missing {
            let mut why = Vec::new();
            for peer in &peers {
                match fetch(&client, &dir, &blobs, peer, &sha, size).await {
                    Ok(()) => {
                        tracing::info!(package = %name, from = %peer.name, "fetched a package's tarball this master lacked");
                        why.clear();
                        break;
                    }
                    Err(e) => why.push(format!("{}: {e}", peer.name)),
                }
            }
            if why.is_empty() {
                retry.remove(&sha);
                continue;
            }
            let pause = retry.get(&sha).map_or(LOOK_EVERY, |(_, p)| (*p * 2).min(MAX_RETRY));
            if pause >= MAX_RETRY / 2 || !retry.contains_key(&sha) {
                tracing::warn!(package = %name, tried = %why.join("; "), retry_in = ?pause, "no other master gave this package's tarball");
            }
            retry.insert(sha, (tokio::time::Instant::now() + pause, pause));
        }
    }
}

/// Removes the tarballs no package names that were left [`UNNAMED_GRACE`]
/// ago. Which packages exist is read from the store itself, not the read
/// model: a package the model leaves out (its spec no longer parses under
/// this build) or does not hold yet (a follower's view behind) still keeps
/// its tarball.
async fn remove_unnamed(blobs: &BlobStore, read_model: &super::read_model::ReadModel) {
    let b = blobs.clone();
    let Ok(Ok(held)) = tokio::task::spawn_blocking(move || b.digests()).await else { return };
    let named_in_view: std::collections::HashSet<String> =
        read_model.packages().values().map(|p| p.record.sha256.clone()).collect();
    let old: Vec<String> = held
        .into_iter()
        .filter(|(sha, written)| written.elapsed().is_ok_and(|age| age > UNNAMED_GRACE) && !named_in_view.contains(sha))
        .map(|(sha, _)| sha)
        .collect();
    if old.is_empty() {
        return;
    }
    let store = read_model.store().clone();
    let stored = tokio::task::spawn_blocking(move || {
        crate::storage::meta::load::<crate::storage::records::PackageRecord>(
            &*store,
            crate::storage::keys::master_cf::PACKAGES,
        )
    })
    .await;
    // Unknown (the store did not answer, or a record does not decode): keep all.
    let Ok(Ok(stored)) = stored else { return };
    let named: std::collections::HashSet<String> = stored.into_iter().map(|p| p.sha256).collect();
    for sha in old.into_iter().filter(|sha| !named.contains(sha)) {
        match blobs.remove(&sha).await {
            Ok(()) => tracing::info!(sha256 = %sha, "removed a package tarball no package names"),
            Err(e) => tracing::warn!(sha256 = %sha, error = %e, "cannot remove a tarball no package names"),
        }
    }
}
