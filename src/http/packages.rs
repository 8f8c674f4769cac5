//! Package endpoints: streamed, size-capped upload; list; show; delete.
//! Upload and delete take `?dry_run=true`: every check, nothing kept.

use actix_web::{HttpRequest, HttpResponse, web};

use super::AppState;
use super::clusters::DryRun;
use super::dto::{
    PackageCheckDto, PackageDetail, PackageDto, PackageEnvelope, PackageList, PackagePreview, PackageUploadAnswer,
};
use super::error::ApiError;
use crate::actors::packages::{DeletePackage, Packages, Uploaded};
use crate::error::Error;

/// Uploads a package
///
/// The body is the package: a gzipped tarball with `component.toml` at its
/// root, whose name and version must be the path's. Streamed to disk and
/// size-capped; nothing is kept unless the whole package is good. The same
/// bytes again answer `200` and change nothing; other bytes under a stored
/// name and version are refused (`409 already_exists`).
#[utoipa::path(put, path = "/api/v1/packages/{name}/{version}", operation_id = "upload_package", tag = "packages",
    params(
        ("name" = String, Path, description = "The component's name", example = "web", pattern = "^[a-z0-9][a-z0-9-]{0,62}$"),
        ("version" = String, Path, description = "Its version", example = "1.0.0", pattern = "^[A-Za-z0-9_+-][A-Za-z0-9._+-]{0,63}$"),
        DryRun),
    request_body(content = Vec<u8>, content_type = "application/octet-stream",
        description = "The package: a `.tar.gz` with `component.toml` at its root"),
    responses(
        (status = 201, description = "Stored", body = PackageEnvelope),
        (status = 200, description = "The same package was there already, or (`?dry_run=true`) what the \
            upload would do", body = PackageUploadAnswer),
        (status = 400, response = super::error::BadRequest),
        (status = 409, response = super::error::Conflict),
        (status = 413, response = super::error::TooLarge),
        (status = 422, response = super::error::SpecViolation),
        (status = 500, response = super::error::Internal),
        (status = 503, response = super::error::Unavailable)))]
pub async fn upload(
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
    req: HttpRequest,
    body: web::Payload,
    q: web::Query<DryRun>,
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
        let package = PackageCheckDto {
            name: record.name.clone(),
            version: record.package_version.clone(),
            sha256: record.sha256.clone(),
            size: record.size,
            roles: spec.roles.iter().map(|r| r.name.clone()).collect(),
        };
        let would = PackagePreview { dry_run: true, valid: true, would: "create".into(), package: Some(package) };
        return Ok(HttpResponse::Ok().json(PackageUploadAnswer::DryRun(would)));
    }
    if q.dry_run {
        // The same bytes are there already: the real upload changes nothing either.
        let would = PackagePreview { dry_run: true, valid: true, would: "nothing (unchanged)".into(), package: None };
        return Ok(HttpResponse::Ok().json(PackageUploadAnswer::DryRun(would)));
    }
    let view = state.shared.read_model.package(&name, &version).as_ref().map(PackageDto::from);
    let view = view.ok_or_else(|| Error::not_found("package", format!("{name}/{version}")))?;
    Ok(match uploaded {
        Uploaded::Created(_) => HttpResponse::Created().json(PackageEnvelope { package: view }),
        Uploaded::Unchanged(_) | Uploaded::WouldCreate(..) => {
            HttpResponse::Ok().json(PackageUploadAnswer::Unchanged(PackageEnvelope { package: view }))
        }
    })
}

/// The packages
#[utoipa::path(get, path = "/api/v1/packages", operation_id = "list_packages", tag = "packages",
    responses((status = 200, description = "Every package", body = PackageList)))]
pub async fn list(state: web::Data<AppState>) -> HttpResponse {
    let packages: Vec<PackageDto> = state.shared.read_model.packages().values().map(PackageDto::from).collect();
    HttpResponse::Ok().json(PackageList { packages })
}

/// One package, with its `component.toml`
#[utoipa::path(get, path = "/api/v1/packages/{name}/{version}", operation_id = "get_package", tag = "packages",
    params(("name" = String, Path, description = "The component's name", example = "web"),
        ("version" = String, Path, description = "Its version", example = "1.0.0")),
    responses(
        (status = 200, description = "The package", body = PackageDetail),
        (status = 404, response = super::error::NotFound)))]
pub async fn get(state: web::Data<AppState>, path: web::Path<(String, String)>) -> Result<HttpResponse, ApiError> {
    let (name, version) = path.into_inner();
    let p = state
        .shared
        .read_model
        .package(&name, &version)
        .ok_or_else(|| Error::not_found("package", format!("{name}/{version}")))?;
    Ok(HttpResponse::Ok().json(PackageDetail { package: PackageDto::from(&p), spec: p.record.spec_toml.clone() }))
}

/// Deletes a package
///
/// Refused while a cluster uses it (`409`).
#[utoipa::path(delete, path = "/api/v1/packages/{name}/{version}", operation_id = "delete_package", tag = "packages",
    params(("name" = String, Path, description = "The component's name", example = "web"),
        ("version" = String, Path, description = "Its version", example = "1.0.0"), DryRun),
    responses(
        (status = 204, description = "Deleted"),
        (status = 200, description = "`?dry_run=true`: it would be deleted", body = PackagePreview),
        (status = 400, response = super::error::BadRequest),
        (status = 404, response = super::error::NotFound),
        (status = 409, response = super::error::Conflict),
        (status = 500, response = super::error::Internal),
        (status = 503, response = super::error::Unavailable)))]
pub async fn delete(
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
    q: web::Query<DryRun>,
) -> Result<HttpResponse, ApiError> {
    let (name, version) = path.into_inner();
    let slot = state.reserve_supervisor()?;
    let dry_run = q.dry_run;
    let (n, v, limit) = (name.clone(), version.clone(), state.shared.limits.request_take_limit);
    super::ask::ask(&state.supervisor, slot, limit, |slot| DeletePackage { name: n, version: v, slot, dry_run })
        .await??;
    if dry_run {
        let would = format!("delete {name}/{version}");
        return Ok(HttpResponse::Ok().json(PackagePreview { dry_run: true, valid: true, would, package: None }));
    }
    Ok(HttpResponse::NoContent().finish())
}
