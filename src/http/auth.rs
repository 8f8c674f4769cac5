//! Every `/api/v1` request presents `Authorization: Bearer <token>`
//! (`actors::tokens`); without a valid one it is answered `401
//! unauthorized` (with `WWW-Authenticate: Bearer`) before any handler
//! runs. `GET /api/v1/health` is left open while the `open_health` setting
//! is on (the default), for load balancers and process supervisors. The
//! API description, `/api/v1/openapi.json`, is always open: it is published
//! documentation (no secret, no state), and tools read it before they
//! have a token.
//!
//! A valid token must also have the scope its route needs (the route
//! table, `API_ROUTES` in `mod.rs`: one line per route and method); a
//! token below it is answered `403 forbidden` naming the scope needed and
//! the token's, here too before any handler runs. The route is found the
//! way actix's router finds it (its `ResourceDef`s, on the same
//! percent-decoded path), and a request no route matches (answered `404`
//! or `405` by the router) needs `admin`: should this lookup and the
//! router ever disagree, a token is refused rather than let through.

use std::sync::{Arc, OnceLock};

use actix_web::body::MessageBody;
use actix_web::dev::{ResourceDef, ServiceRequest, ServiceResponse};
use actix_web::middleware::Next;
use actix_web::{HttpMessage, web};

use super::error::ApiError;
use super::{API_ROUTES, AppState};
use crate::error::Error;
use crate::scope::Scope;
use crate::storage::records::TokenRecord;

/// The token a request was let in with (in its extensions), for handlers
/// that keep serving after the check (the event stream) or answer with it
/// (`/whoami`, the scope a new token may have).
#[derive(Debug, Clone)]
pub struct AuthedToken(pub Arc<TokenRecord>);

/// The path left open by `open_health`.
const HEALTH: &str = "/api/v1/health";
/// The path always open.
pub const OPENAPI: &str = "/api/v1/openapi.json";
/// The scope `GET /metrics` needs (unless `open_metrics` is on): a
/// Prometheus scraper's token is a `read` one.
pub const METRICS: Scope = Scope::Read;
/// The scope of a request no route matches.
const UNMATCHED: Scope = Scope::Admin;

pub async fn require_token(
    req: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let Some(state) = req.app_data::<web::Data<AppState>>() else {
        return Err(ApiError(Error::Internal { message: "no app state for the token check".into() }).into());
    };
    let open = req.path() == OPENAPI || (state.open_health && req.path() == HEALTH);
    if !open {
        let token = check(state, req.headers().get(actix_web::http::header::AUTHORIZATION))?;
        // The path as the router sees it (percent-decoded but for `/`).
        let (route, needed) = needed_scope(req.method().as_str(), req.match_info().as_str());
        if !token.scope.allows(needed) {
            let what = match route {
                Some(pattern) => format!("{} {pattern}", req.method()),
                None => "a request that matches no route".into(),
            };
            return Err(ApiError(Error::forbidden(what, needed, token.scope)).into());
        }
        req.extensions_mut().insert(AuthedToken(token));
    }
    next.call(req).await
}

/// The route (its pattern, `/api/v1/clusters/{name}`) `method path`
/// matches and the scope it needs; `None` and `admin` when it matches
/// none. `path` is the whole path, percent-decoded as the router decodes it.
pub fn needed_scope(method: &str, path: &str) -> (Option<&'static str>, Scope) {
    /// (the route's definition as the router has it, its pattern, its methods)
    type Table = Vec<(ResourceDef, String, &'static [(&'static str, Scope)])>;
    static TABLE: OnceLock<Table> = OnceLock::new();
    let table = TABLE.get_or_init(|| {
        API_ROUTES
            .iter()
            .map(|(route, methods)| {
                let pattern = format!("/api/v1{route}");
                (ResourceDef::new(pattern.as_str()), pattern, *methods)
            })
            .collect()
    });
    // The router takes the first resource that matches, so this does too.
    let Some((_, pattern, methods)) = table.iter().find(|(def, _, _)| def.is_match(path)) else {
        return (None, UNMATCHED);
    };
    match methods.iter().find(|(m, _)| m.eq_ignore_ascii_case(method)) {
        Some((_, scope)) => (Some(pattern.as_str()), *scope),
        None => (None, UNMATCHED),
    }
}

/// The valid token `header` presents, of scope `needed` at least (for
/// routes outside `/api/v1`: `/metrics`).
pub(crate) fn authorize(
    state: &AppState,
    header: Option<&actix_web::http::header::HeaderValue>,
    what: &str,
    needed: Scope,
) -> Result<Arc<TokenRecord>, ApiError> {
    let token = check(state, header)?;
    if !token.scope.allows(needed) {
        return Err(ApiError(Error::forbidden(what, needed, token.scope)));
    }
    Ok(token)
}

/// The valid token `header` presents.
fn check(
    state: &AppState,
    header: Option<&actix_web::http::header::HeaderValue>,
) -> Result<Arc<TokenRecord>, ApiError> {
    let Some(value) = header else {
        return Err(unauthorized("this API needs a token: send `Authorization: Bearer <token>`"));
    };
    let token = value
        .to_str()
        .ok()
        .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
        .map(str::trim)
        .ok_or_else(|| unauthorized("the Authorization header must read `Bearer <token>`"))?;
    state.tokens.verify(token).ok_or_else(|| unauthorized("the token is not valid (unknown, revoked or mistyped)"))
}

fn unauthorized(message: &str) -> ApiError {
    ApiError(Error::Unauthorized { message: message.into() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_route_is_found_as_the_router_finds_it() {
        use Scope::*;
        let cases = [
            ("GET", "/api/v1/clusters", Some("/api/v1/clusters"), Read),
            ("post", "/api/v1/clusters", Some("/api/v1/clusters"), Operate),
            ("DELETE", "/api/v1/clusters/web", Some("/api/v1/clusters/{name}"), Operate),
            (
                "GET",
                "/api/v1/clusters/web/instances/web-server-1-abcdef/logs",
                Some("/api/v1/clusters/{name}/instances/{id}/logs"),
                Operate,
            ),
            ("PUT", "/api/v1/packages/zk/3.8.0", Some("/api/v1/packages/{name}/{version}"), Admin),
            ("GET", "/api/v1/packages/zk/3.8.0", Some("/api/v1/packages/{name}/{version}"), Read),
            // No such route, a method the path lacks, a segment too many,
            // a trailing slash: the router answers 404 or 405; admin here.
            ("GET", "/api/v1/nothing", None, Admin),
            ("POST", "/api/v1/nodes", None, Admin),
            ("GET", "/api/v1/clusters/web/extra/more", None, Admin),
            ("GET", "/api/v1/clusters/", None, Admin),
            // An encoded slash stays inside its segment, as in the router.
            ("GET", "/api/v1/clusters/a%2Fb", Some("/api/v1/clusters/{name}"), Read),
        ];
        for (method, path, route, scope) in cases {
            assert_eq!(needed_scope(method, path), (route, scope), "{method} {path}");
        }
    }

    /// Every line of the table is found by its own pattern.
    #[test]
    fn every_route_of_the_table_is_found() {
        for (route, methods) in API_ROUTES {
            let path =
                route.replace("{name}", "n").replace("{version}", "1.0").replace("{role}", "r").replace("{id}", "i");
            for (method, scope) in *methods {
                let pattern = format!("/api/v1{route}");
                assert_eq!(needed_scope(method, &format!("/api/v1{path}")), (Some(pattern.as_str()), *scope));
            }
        }
    }
}
