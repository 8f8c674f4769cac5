//! Package endpoints: streamed, size-capped upload; list; show; delete.

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
    let uploaded = state.packages.upload(&name, &version, body).await?;
    let view = state.shared.read_model.package(&name, &version).as_ref().map(PackageDto::from);
    let view = view.ok_or_else(|| Error::not_found("package", format!("{name}/{version}")))?;
    Ok(match uploaded {
        Uploaded::Created(_) => HttpResponse::Created().json(json!({ "package": view })),
        Uploaded::Unchanged(_) => HttpResponse::Ok().json(json!({ "package": view })),
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

pub async fn delete(state: web::Data<AppState>, path: web::Path<(String, String)>) -> Result<HttpResponse, ApiError> {
    let (name, version) = path.into_inner();
    let slot = state.reserve_supervisor()?;
    state
        .supervisor
        .send(DeletePackage { name, version, slot })
        .await
        .map_err(|e| Error::unavailable(format!("supervisor: {e}")))??;
    Ok(HttpResponse::NoContent().finish())
}
