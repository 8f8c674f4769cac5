//! The admin API (DESIGN.md §9): actix-web under `/api/v1`, JSON in and out.
//!
//! Handlers talk to actors (mutations, through the cluster registry) and to
//! the read model (every GET), never to storage. Mutations answer `202
//! Accepted` with the operation once its record is durable; `GET
//! /operations/{id}?wait=S` long-polls its end. A full mailbox or write
//! queue answers `503 overloaded` with `Retry-After`, before anything of
//! the request happened. Every route needs an API token of the scope its
//! line of the route table names (`auth.rs`), but the API description,
//! `GET /api/v1/openapi.json` (`openapi.rs`), generated from these
//! handlers and their bodies (`dto.rs`).

mod actors;
mod ask;
pub(crate) mod auth;
mod body_deadline;
mod cluster_run;
mod clusters;
mod cordons;
mod dashboard;
pub mod dto;
pub mod error;
mod events;
mod instances;
pub mod logs;
pub mod metrics;
pub mod openapi;
mod packages;
mod peer_blobs;
mod peers_view;
pub mod pools;
pub mod standby;
mod status;
mod test_hooks;
mod tokens;
mod trust;

use std::sync::Arc;

use actix::Addr;
use actix_web::web;

use crate::actors::Shared;
use crate::actors::packages::Packages;
use crate::actors::supervisor::Supervisor;
use crate::actors::tokens::ApiTokens;
use crate::error::Error;
use crate::scope::Scope;

/// How long an API client has to send a request's head (line and
/// headers); past it the request is answered `408` and its connection
/// closed. actix-web's default, named here so it is a decision.
pub const HEAD_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// What every handler gets.
#[derive(Clone)]
pub struct AppState {
    pub supervisor: Addr<Supervisor>,
    pub shared: Shared,
    pub packages: Arc<Packages>,
    pub max_upload_bytes: u64,
    pub tokens: Arc<ApiTokens>,
    /// The agent link's CA, join tokens and node certificates.
    pub trust: Arc<crate::actors::trust::Trust>,
    /// `GET /api/v1/health` answers without a token.
    pub open_health: bool,
    /// `GET /metrics` answers without a token.
    pub open_metrics: bool,
    /// A request body (but a package upload's) must be in within this of
    /// the request's head (`body_deadline`).
    pub request_body_timeout: std::time::Duration,
    /// The metrics recorder's handle (`None`: not recorded here).
    pub metrics: Option<metrics_exporter_prometheus::PrometheusHandle>,
    /// Instance log reads under way (bounded per node and per instance).
    pub log_readers: Arc<logs::LogReaders>,
    /// `/test-hooks/...` is served (`test_hooks.rs`).
    pub test_hooks: bool,
    /// Cordon changes, one at a time.
    pub cordons: Arc<crate::actors::cordons::Cordons>,
    /// Node pools and requests (`actors::pools`).
    pub pools: Arc<crate::actors::pools::Pools>,
}

impl AppState {
    /// Reserves a place in the supervisor's mailbox, or `503 overloaded`.
    pub fn reserve_supervisor(&self) -> Result<crate::actors::read_model::Reservation, Error> {
        crate::actors::read_model::Reservation::within(&self.shared.supervisor, self.shared.limits.cluster_mailbox)
            .ok_or_else(|| Error::overloaded("the supervisor has too many requests waiting; retry shortly"))
    }
}

/// A streaming response body fed by `rx` (the event stream, followed logs):
/// it ends when the sender is dropped.
fn channel_body(
    rx: tokio::sync::mpsc::Receiver<bytes::Bytes>,
) -> impl futures::Stream<Item = Result<bytes::Bytes, std::convert::Infallible>> {
    futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|b| (Ok(b), rx)) })
}

/// Declares the routes under `/api/v1`: each path once, with its handler
/// and the scope a token needs for it, per method. Another method on a
/// listed path answers `405` with `Allow` (a resource's default service);
/// [`API_ROUTES`] lists the table for the token check (`auth.rs`, which
/// answers `403` to a token below the route's scope before any handler
/// runs), the API description (`openapi.rs`) and the tests.
macro_rules! api_routes {
    ($($path:literal => [$($method:ident $handler:path => $scope:ident),+ $(,)?]),* $(,)?) => {
        /// Every route under `/api/v1`: (path, [(method, scope needed)]).
        pub const API_ROUTES: &[(&str, &[(&str, Scope)])] =
            &[$(($path, &[$((stringify!($method), Scope::$scope)),+])),*];

        fn api_resources(scope: actix_web::Scope) -> actix_web::Scope {
            scope$(.service(resource($path, &[$(stringify!($method)),+])$(.route(web::$method().to($handler)))+))*
        }
    };
}

// Which scope each route needs, in one place (README "API tokens"):
// `Read` every GET that shows state (not logs: they show what a component
// prints, secrets included); `Operate` the verbs on clusters and instances,
// and logs; `Admin` packages, API tokens, nodes, join tokens, trust, and
// the verbs on actors. Health
// and this document are open or need any token (`auth.rs`); `/metrics`
// needs `read` (`auth::METRICS`).
api_routes! {
    "/health" => [get status::health => Read],
    "/openapi.json" => [get openapi::document => Read],
    "/whoami" => [get tokens::whoami => Read],
    "/tokens" => [post tokens::create => Admin, get tokens::list => Admin],
    "/tokens/{id}" => [delete tokens::revoke => Admin],
    "/actors" => [get status::actors => Read],
    "/actors/{kind}/{id}/kill" => [post actors::kill => Admin],
    "/actors/{kind}/{id}/restart" => [post actors::restart => Admin],
    "/events" => [get events::stream => Read],
    "/join-tokens" => [post trust::create => Admin, get trust::list => Admin],
    "/join-tokens/{id}" => [delete trust::delete => Admin],
    "/nodes" => [get status::list_nodes => Read],
    "/nodes/{id}" => [get status::get_node => Read],
    "/nodes/{id}/revoke" => [post trust::revoke => Admin],
    "/nodes/{id}/cordon" => [post cordons::cordon => Admin],
    "/nodes/{id}/uncordon" => [post cordons::uncordon => Admin],
    "/nodes/{id}/hold" => [post pools::hold => Admin],
    "/nodes/{id}/remove" => [post pools::remove => Admin],
    "/pools" => [get pools::list => Read],
    "/pools/{name}/hosts/{host}/log" => [get pools::host_log => Admin],
    "/node-requests" => [get pools::list_requests => Read, post pools::create_request => Admin],
    "/operations" => [get status::list_operations => Read],
    "/operations/{id}" => [get status::get_operation => Read],
    "/packages" => [get packages::list => Read],
    "/packages/{name}/{version}" => [
        put packages::upload => Admin, get packages::get => Read, delete packages::delete => Admin],
    "/clusters" => [post clusters::create => Operate, get clusters::list => Read],
    "/clusters/{name}" => [get clusters::get => Read, delete clusters::delete => Operate],
    "/clusters/{name}/start" => [post clusters::start => Operate],
    "/clusters/{name}/stop" => [post clusters::stop => Operate],
    "/clusters/{name}/restart" => [post clusters::restart => Operate],
    "/clusters/{name}/scale" => [post clusters::scale => Operate],
    "/clusters/{name}/config" => [patch clusters::reconfigure => Operate],
    "/clusters/{name}/upgrade" => [post clusters::upgrade => Operate],
    "/clusters/{name}/roles/{role}" => [patch clusters::resize => Operate],
    "/clusters/{name}/instances" => [get instances::list => Read],
    "/clusters/{name}/instances/{id}/logs" => [get logs::logs => Operate],
    "/clusters/{name}/instances/{id}/start" => [post clusters::start_instance => Operate],
    "/clusters/{name}/instances/{id}/stop" => [post clusters::stop_instance => Operate],
    "/clusters/{name}/instances/{id}/restart" => [post clusters::restart_instance => Operate],
    "/clusters/{name}/instances/{id}/replace" => [post clusters::replace_instance => Operate],
}

/// A path that answers `405` to any method but `methods`.
fn resource(path: &str, methods: &'static [&'static str]) -> actix_web::Resource {
    web::resource(path).default_service(web::to(move |req: actix_web::HttpRequest| async move {
        error::method_not_allowed(req.method(), methods)
    }))
}

/// Registers every route: the API under `/api/v1` (behind the token
/// check), `/metrics`, and the dashboard.
pub fn configure(cfg: &mut web::ServiceConfig, state: AppState, max_json_bytes: usize) {
    let hooks = state.test_hooks;
    cfg.app_data(web::Data::new(state))
        .app_data(web::JsonConfig::default().limit(max_json_bytes).error_handler(error::json_error))
        .app_data(web::QueryConfig::default().error_handler(error::query_error))
        .app_data(web::PathConfig::default().error_handler(error::path_error))
        .service(
            api_resources(web::scope("/api/v1"))
                .wrap(actix_web::middleware::from_fn(body_deadline::limit))
                .wrap(actix_web::middleware::from_fn(auth::require_token)),
        )
        .service(resource("/metrics", &["get"]).route(web::get().to(metrics::scrape)))
        .service(
            resource("/internal/v1/blobs/{sha256}", &["get", "put"])
                .route(web::get().to(peer_blobs::get))
                .route(web::put().to(peer_blobs::put)),
        )
        .route("/", web::get().to(dashboard::index))
        .route("/ui/{file}", web::get().to(dashboard::asset));
    if hooks {
        // Test-only (`test_hooks`); an admin token, as any route the API
        // table does not list.
        cfg.service(
            web::scope("/test-hooks")
                .route("/actors/{kind}/{id}/{fault}", web::post().to(test_hooks::inject))
                .route("/pools/{name}/faults", web::post().to(test_hooks::pool_faults))
                .wrap(actix_web::middleware::from_fn(auth::require_token)),
        );
    }
    cfg.default_service(web::to(status::not_found));
}
