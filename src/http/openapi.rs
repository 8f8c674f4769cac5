//! `GET /api/v1/openapi.json`: the API description (OpenAPI 3.1), generated
//! by utoipa from the handlers' `#[utoipa::path]` annotations and the
//! bodies' `ToSchema` derives, so it says what the code does.
//!
//! Every route under `/api/v1` needs a bearer token (an HTTP `bearer`
//! security scheme, applied to the whole document), except this document
//! itself, which is public: it holds no secret and no state, and tools
//! read it before they have a token. `/health` and `/metrics` take a token
//! or none (the `open_health` / `open_metrics` settings). Each operation
//! names the scope its token needs as the scope of its `bearer`
//! requirement (OpenAPI 3.1 lets any scheme list roles), says it in its
//! description, and lists `403` when that scope is above `read`; all three
//! come from the route table, so they say what `auth.rs` enforces. Every error is
//! an [`ErrorBody`](super::error::ErrorBody); the reusable error responses
//! are declared in `error.rs`. A test holds the document to the route
//! table (`API_ROUTES` in `mod.rs`), and schemathesis holds the server to
//! the document (`tests/integration/openapi.rs`).

use std::sync::OnceLock;

use actix_web::HttpResponse;
use utoipa::openapi::path::Operation;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme};
use utoipa::openapi::{PathItem, Ref, RefOr};
use utoipa::{Modify, OpenApi};

use super::error::{
    BadRequest, Conflict, ErrorBody, Forbidden, Internal, NotFound, SpecViolation, TooLarge, Unauthorized, Unavailable,
};
use super::events::{DroppedData, EventData, SseEvent};
use super::logs::StreamName;
use super::{clusters, events, logs, metrics, packages, status, tokens, trust};
use crate::actors::cluster::{PlacedInstance, PlanPreview, PreviewStep};
use crate::scope::Scope;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "flotilla admin API",
        description = "Drives a flotilla master: packages, clusters and their instances, nodes, operations, \
            the event stream, API tokens. Every mutation answers `202 Accepted` with the operation once it \
            is journaled (follow it with `GET /api/v1/operations/{id}?wait=S`), or, with `?dry_run=true`, \
            `200` with what it would do. Send `Authorization: Bearer <token>`. A token has a scope, \
            `read` < `operate` < `admin` (`GET /api/v1/whoami` says which): each operation names the one it \
            needs as the scope of its `bearer` requirement, and a token below it is answered `403 forbidden`."
    ),
    paths(
        status::health,
        document,
        tokens::create,
        tokens::list,
        tokens::revoke,
        tokens::whoami,
        status::actors,
        super::actors::kill,
        super::actors::restart,
        events::stream,
        status::list_nodes,
        status::get_node,
        trust::create,
        trust::list,
        trust::delete,
        trust::revoke,
        super::cordons::cordon,
        super::cordons::uncordon,
        super::pools::hold,
        super::pools::remove,
        super::pools::list,
        super::pools::host_log,
        super::pools::list_requests,
        super::pools::create_request,
        status::list_operations,
        status::get_operation,
        packages::list,
        packages::upload,
        packages::get,
        packages::delete,
        clusters::create,
        clusters::list,
        clusters::get,
        clusters::delete,
        clusters::start,
        clusters::stop,
        clusters::restart,
        clusters::scale,
        clusters::reconfigure,
        clusters::upgrade,
        clusters::resize,
        super::instances::list,
        logs::logs,
        clusters::start_instance,
        clusters::stop_instance,
        clusters::restart_instance,
        clusters::replace_instance,
        metrics::scrape,
    ),
    components(
        schemas(
            ErrorBody,
            EventData,
            DroppedData,
            SseEvent,
            PlanPreview,
            PreviewStep,
            PlacedInstance,
            StreamName,
            Scope
        ),
        responses(
            BadRequest,
            Unauthorized,
            Forbidden,
            NotFound,
            Conflict,
            TooLarge,
            SpecViolation,
            Unavailable,
            Internal
        )
    ),
    modifiers(&TokenAuth),
    security(("bearer" = [])),
    tags(
        (name = "clusters", description = "Clusters and their operations"),
        (name = "instances", description = "One instance: start, stop, restart, its logs"),
        (name = "packages", description = "Component packages"),
        (name = "operations", description = "What mutations started, step by step"),
        (name = "nodes", description = "The agents' hosts, the join tokens they enroll with, and their certificates"),
        (name = "events", description = "Every state change, live"),
        (name = "tokens", description = "API tokens"),
        (name = "status", description = "The master itself"),
    )
)]
pub struct ApiDoc;

/// This document
#[utoipa::path(get, path = "/api/v1/openapi.json", operation_id = "openapi", tag = "status", security(()),
    responses((status = 200, description = "The API description (OpenAPI 3.1)", body = Object,
        content_type = "application/json")))]
pub async fn document() -> HttpResponse {
    static JSON: OnceLock<String> = OnceLock::new();
    let json = JSON.get_or_init(|| ApiDoc::openapi().to_json().unwrap_or_default());
    HttpResponse::Ok().content_type("application/json").body(json.as_str())
}

/// The bearer scheme; the `401` the token check answers on every
/// operation under `/api/v1` but this document; the scope each operation
/// needs, and its `403`.
struct TokenAuth;

impl Modify for TokenAuth {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let scheme = HttpBuilder::new()
            .scheme(HttpAuthScheme::Bearer)
            .description(Some(
                "An API token: the one `flotilla dev` prints (and writes to endpoints.json), or one from \
                 `flotilla token create`",
            ))
            .build();
        doc.components.get_or_insert_with(Default::default).add_security_scheme("bearer", SecurityScheme::Http(scheme));
        for (path, item) in doc.paths.paths.iter_mut() {
            if path == super::auth::OPENAPI {
                continue;
            }
            for (method, op) in operations(item) {
                if path.starts_with("/api/v1/") {
                    op.responses
                        .responses
                        .entry("401".into())
                        .or_insert_with(|| RefOr::Ref(Ref::from_response_name("Unauthorized")));
                }
                if let Some(scope) = scope_of(path, method) {
                    document_scope(op, scope);
                }
            }
        }
    }
}

/// The scope the route table (or `auth::METRICS`) says `method path` needs.
fn scope_of(path: &str, method: &str) -> Option<Scope> {
    if path == "/metrics" {
        return (method == "get").then_some(super::auth::METRICS);
    }
    let route = path.strip_prefix("/api/v1")?;
    let (_, methods) = super::API_ROUTES.iter().find(|(r, _)| *r == route)?;
    methods.iter().find(|(m, _)| *m == method).map(|(_, scope)| *scope)
}

/// `op` needs a token of `scope`: its `bearer` requirement lists it (an
/// operation open without a token keeps its empty alternative), its
/// description says it, and above `read` it may answer `403`.
fn document_scope(op: &mut Operation, scope: Scope) {
    let open = SecurityRequirement::default();
    let mut security = vec![SecurityRequirement::new("bearer", [scope.as_str()])];
    if op.security.as_ref().is_some_and(|s| s.contains(&open)) {
        security.insert(0, open);
    }
    op.security = Some(security);
    let line = format!("Needs a token of scope `{scope}` (or above).");
    op.description = Some(match op.description.take() {
        Some(d) if !d.is_empty() => format!("{d}\n\n{line}"),
        _ => line,
    });
    if scope > Scope::Read {
        op.responses.responses.insert("403".into(), RefOr::Ref(Ref::from_response_name("Forbidden")));
    }
}

/// Every operation of a path, with its method (lowercase).
fn operations(item: &mut PathItem) -> impl Iterator<Item = (&'static str, &mut Operation)> {
    [
        ("get", &mut item.get),
        ("put", &mut item.put),
        ("post", &mut item.post),
        ("delete", &mut item.delete),
        ("options", &mut item.options),
        ("head", &mut item.head),
        ("patch", &mut item.patch),
        ("trace", &mut item.trace),
    ]
    .into_iter()
    .filter_map(|(m, op)| op.as_mut().map(|op| (m, op)))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    fn methods(item: &PathItem) -> BTreeSet<String> {
        let mut item = item.clone();
        let mut out = BTreeSet::new();
        for (name, op) in [
            ("get", &mut item.get),
            ("put", &mut item.put),
            ("post", &mut item.post),
            ("delete", &mut item.delete),
            ("patch", &mut item.patch),
            ("head", &mut item.head),
            ("options", &mut item.options),
            ("trace", &mut item.trace),
        ] {
            if op.is_some() {
                out.insert(name.to_string());
            }
        }
        out
    }

    /// A route added to `mod.rs` without an annotation here fails this.
    #[test]
    fn the_document_has_every_route_and_no_other() {
        let doc = ApiDoc::openapi();
        let documented: BTreeSet<(String, String)> = doc
            .paths
            .paths
            .iter()
            .flat_map(|(path, item)| methods(item).into_iter().map(move |m| (path.clone(), m)))
            .collect();
        let mut served: BTreeSet<(String, String)> = crate::http::API_ROUTES
            .iter()
            .flat_map(|(path, methods)| methods.iter().map(move |(m, _)| (format!("/api/v1{path}"), m.to_string())))
            .collect();
        served.insert(("/metrics".into(), "get".into()));
        let missing: Vec<_> = served.difference(&documented).collect();
        let extra: Vec<_> = documented.difference(&served).collect();
        assert!(missing.is_empty() && extra.is_empty(), "not documented: {missing:?}; not served: {extra:?}");
    }

    #[test]
    fn it_is_openapi_3_1_with_bearer_auth_and_401_on_every_api_operation() {
        let json: serde_json::Value = serde_json::from_str(&ApiDoc::openapi().to_json().unwrap()).unwrap();
        assert_eq!(json["openapi"], "3.1.0");
        assert_eq!(json["components"]["securitySchemes"]["bearer"]["scheme"], "bearer");
        assert_eq!(json["security"][0]["bearer"], serde_json::json!([]));
        for (path, item) in json["paths"].as_object().unwrap() {
            for (method, op) in item.as_object().unwrap() {
                let responses = op["responses"].as_object().unwrap();
                let open = path == super::super::auth::OPENAPI;
                assert_eq!(responses.contains_key("401"), !open, "{method} {path}");
                assert!(responses.keys().any(|s| s.starts_with('2')), "{method} {path}: no success answer");
            }
        }
    }

    /// Each operation names the scope the route table gives it (its
    /// `bearer` requirement and its description) and lists `403` exactly
    /// when that scope is above `read`; `/health` and `/metrics` stay
    /// open to a request without a token (their settings), the document
    /// itself needs none.
    #[test]
    fn every_operation_names_its_scope_and_its_403() {
        let json: serde_json::Value = serde_json::from_str(&ApiDoc::openapi().to_json().unwrap()).unwrap();
        let mut seen = 0;
        for (path, item) in json["paths"].as_object().unwrap() {
            for (method, op) in item.as_object().unwrap() {
                let what = format!("{method} {path}");
                if path == super::super::auth::OPENAPI {
                    assert_eq!(op["security"], serde_json::json!([{}]), "{what}");
                    continue;
                }
                let scope = scope_of(path, method).unwrap_or_else(|| panic!("{what}: no scope in the table"));
                let bearer = serde_json::json!({"bearer": [scope.as_str()]});
                let expected = if path.ends_with("/health") || path == "/metrics" {
                    serde_json::json!([{}, bearer])
                } else {
                    serde_json::json!([bearer])
                };
                assert_eq!(op["security"], expected, "{what}");
                let description = op["description"].as_str().unwrap_or_default();
                assert!(description.ends_with(&format!("Needs a token of scope `{scope}` (or above).")), "{what}");
                assert_eq!(op["responses"].get("403").is_some(), scope > Scope::Read, "{what}");
                seen += 1;
            }
        }
        assert!(seen >= 30, "{seen} operations");
        let logs = &json["paths"]["/api/v1/clusters/{name}/instances/{id}/logs"]["get"];
        assert_eq!(logs["security"][0]["bearer"][0], "operate", "logs need operate: {logs}");
        assert_eq!(json["components"]["schemas"]["Scope"]["enum"], serde_json::json!(["read", "operate", "admin"]));
    }
}
