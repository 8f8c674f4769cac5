//! Package endpoints: streamed, size-capped upload; list; show; delete.
//! Upload and delete take `?dry_run=true`: every check, nothing kept.

use actix_web::{HttpRequest, HttpResponse, web};
use serde_json::json;

use super::AppState;
use super::dto::PackageDto;
use super::error::ApiError;
use crate::actors::packages::{DeletePackage, Packages, Uploaded};
use crate::error::Error;

pub async fn upload(
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
    req: HttpRequest,
    body: web::Payload,
    q: web::Query<super::clusters::DryRun>,
) -> Result<HttpResponse, ApiError> {
    let (name, version) = path.into_inner();
    Packages::check_names(&name, &version)?;
    // Refuse early when the client announces a body over the cap.
    if let Some(len) =
        req.headers().get("content-length").and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok())
        && len > state.max_upload_bytes
    {
        return Err(ApiError(Error::TooLarge {
            message: format!("package of {len} bytes is larger than the limit of {} bytes", state.max_upload_bytes),
        }));
    }
    let uploaded = state.packages.upload(&name, &version, body, q.dry_run).await?;
    if let Uploaded::WouldCreate(record, spec) = &uploaded {
        let roles: Vec<&str> = spec.roles.iter().map(|r| r.name.as_str()).collect();
        return Ok(HttpResponse::Ok().json(json!({
            "dry_run": true,
            "valid": true,
            "would": "create",
            "package": { "name": record.name, "version": record.package_version, "sha256": record.sha256,
                         "size": record.size, "roles": roles },
        })));
    }
    if q.dry_run {
        // The same bytes are there already: the real upload changes nothing either.
        return Ok(HttpResponse::Ok().json(json!({ "dry_run": true, "valid": true, "would": "nothing (unchanged)" })));
    }
    let view = state.shared.read_model.package(&name, &version).as_ref().map(PackageDto::from);
    let view = view.ok_or_else(|| Error::not_found("package", format!("{name}/{version}")))?;
    Ok(match uploaded {
        Uploaded::Created(_) => HttpResponse::Created().json(json!({ "package": view })),
        Uploaded::Unchanged(_) | Uploaded::WouldCreate(..) => HttpResponse::Ok().json(json!({ "package": view })),
    })
}

pub async fn list(state: web::Data<AppState>) -> HttpResponse {
    let v: Vec<PackageDto> = state.shared.read_model.packages().values().map(PackageDto::from).collect();
    HttpResponse::Ok().json(json!({ "packages": v }))
}

pub async fn get(state: web::Data<AppState>, path: web::Path<(String, String)>) -> Result<HttpResponse, ApiError> {
    let (name, version) = path.into_inner();
    let p = state
        .shared
        .read_model
        .package(&name, &version)
        .ok_or_else(|| Error::not_found("package", format!("{name}/{version}")))?;
    Ok(HttpResponse::Ok().json(json!({ "package": PackageDto::from(&p), "spec": p.record.spec_toml })))
}

pub async fn delete(
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
    q: web::Query<super::clusters::DryRun>,
) -> Result<HttpResponse, ApiError> {
    let (name, version) = path.into_inner();
    let slot = state.reserve_supervisor()?;
    let dry_run = q.dry_run;
    state
        .supervisor
        .send(DeletePackage { name: name.clone(), version: version.clone(), slot, dry_run })
        .await
        .map_err(|e| Error::unavailable(format!("supervisor: {e}")))??;
    if dry_run {
        let would = format!("delete {name}/{version}");
        return Ok(HttpResponse::Ok().json(json!({ "dry_run": true, "valid": true, "would": would })));
    }
    Ok(HttpResponse::NoContent().finish())
}
