//! `/internal/v1/blobs/{sha256}`: package tarballs between the masters of
//! one installation (`actors::peer_blobs`). Only another master may call
//! it: `Authorization: Peer <secret>` with the installation's peer secret
//! (kept in etcd beside the CA), compared in constant time. `GET` streams
//! a tarball this master holds; `PUT` takes one, kept only when its bytes
//! hash to the digest in the path. Not part of the API (`404` on a master
//! with the embedded store).

use actix_web::{HttpRequest, HttpResponse, web};
use futures::StreamExt;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tokio::io::AsyncWriteExt;

use super::AppState;
use super::error::ApiError;
use crate::actors::peer_blobs::{FROM_HEADER, TO_HEADER};
use crate::error::Error;
use crate::storage::etcd::peers::Directory;

/// A pause longer than this in a pushed tarball ends the transfer.
const IDLE: std::time::Duration = std::time::Duration::from_secs(30);

/// The directory, once the caller has shown the peer secret.
fn peer<'a>(state: &'a AppState, req: &HttpRequest) -> Result<&'a Directory, Error> {
    let Some(dir) = state.shared.peers.as_deref() else {
        return Err(Error::not_found("route", "no such endpoint; see /api/v1"));
    };
    let shown = req.headers().get("authorization").and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Peer "));
    if !shown.is_some_and(|s| bool::from(s.as_bytes().ct_eq(dir.secret().as_bytes()))) {
        return Err(Error::Unauthorized { message: "only another master of this installation may call this".into() });
    }
    // Meant for this master, from another one: a transfer that reached the
    // wrong master (an address shared by several) must not count.
    let header = |name| req.headers().get(name).and_then(|v| v.to_str().ok());
    let (to, from) = (header(TO_HEADER), header(FROM_HEADER));
    if to != Some(dir.me().name.as_str()) || from.is_none_or(|f| f == dir.me().name) {
        return Err(Error::conflict(
            "wrong_master",
            format!("this is master {:?}; the transfer is meant for {to:?} from {from:?}", dir.me().name),
        ));
    }
    Ok(dir)
}

pub async fn get(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    peer(&state, &req)?;
    let sha = path.into_inner();
    let file_path = state.shared.blobs.path_for(&sha).map_err(Error::from)?;
    let file = match tokio::fs::File::open(&file_path).await {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(ApiError(Error::not_found("blob", &sha))),
        Err(e) => return Err(ApiError(Error::internal(e))),
    };
    Ok(HttpResponse::Ok().content_type("application/octet-stream").streaming(tokio_util::io::ReaderStream::new(file)))
}

pub async fn put(
    state: web::Data<AppState>,
    req: HttpRequest,
    path: web::Path<String>,
    mut body: web::Payload,
) -> Result<HttpResponse, ApiError> {
    peer(&state, &req)?;
    let sha = path.into_inner();
    let blobs = &state.shared.blobs;
    blobs.path_for(&sha).map_err(Error::from)?;
    let (tmp, mut file) = blobs.create_temp().await.map_err(Error::from)?;
    let limit = state.max_upload_bytes;
    let kept = async {
        let (mut hasher, mut size) = (Sha256::new(), 0u64);
        loop {
            let next = tokio::time::timeout(IDLE, body.next())
                .await
                .map_err(|_| Error::invalid("upload_stalled", format!("no bytes for {IDLE:?}")))?;
            let Some(chunk) = next else { break };
            let chunk = chunk.map_err(|e| Error::invalid("upload_failed", e.to_string()))?;
            size += chunk.len() as u64;
            if size > limit {
                return Err(Error::TooLarge { message: format!("larger than the limit of {limit} bytes") });
            }
            hasher.update(&chunk);
            file.write_all(&chunk).await.map_err(Error::internal)?;
        }
        file.sync_all().await.map_err(Error::internal)?;
        let digest = hex::encode(hasher.finalize());
        if digest != sha {
            return Err(Error::invalid("digest_mismatch", format!("the bytes hash to {digest}, not {sha}")));
        }
        blobs.persist(&tmp, &sha).await.map_err(Error::from)?;
        Ok(())
    }
    .await;
    drop(file);
    let _ = tokio::fs::remove_file(&tmp).await;
    kept?;
    Ok(HttpResponse::Created().finish())
}
