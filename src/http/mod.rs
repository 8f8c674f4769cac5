//! The admin API (DESIGN.md §9): actix-web under `/api/v1`, JSON in and out.
//!
//! Handlers talk to actors (mutations, through the cluster registry) and to
//! the read model (every GET), never to storage. Mutations answer `202
//! Accepted` with the operation once its record is durable; `GET
//! /operations/{id}?wait=S` long-polls its end. A full mailbox or write
//! queue answers `503 overloaded` with `Retry-After`, before anything of
//! the request happened. Every route needs an API token (`auth.rs`).

pub(crate) mod auth;
mod clusters;
pub mod dto;
pub mod error;
mod events;
mod logs;
pub mod metrics;
mod packages;
mod status;
mod tokens;

use std::sync::Arc;

use actix::Addr;
use actix_web::web;

use crate::actors::Shared;
use crate::actors::packages::Packages;
use crate::actors::supervisor::Supervisor;
use crate::actors::tokens::ApiTokens;
use crate::error::Error;

/// What every handler gets.
#[derive(Clone)]
pub struct AppState {
    pub supervisor: Addr<Supervisor>,
    pub shared: Shared,
    pub packages: Arc<Packages>,
    pub max_upload_bytes: u64,
    pub tokens: Arc<ApiTokens>,
    /// `GET /api/v1/health` answers without a token.
    pub open_health: bool,
    /// `GET /metrics` answers without a token.
    pub open_metrics: bool,
    /// The metrics recorder's handle (`None`: not recorded here).
    pub metrics: Option<metrics_exporter_prometheus::PrometheusHandle>,
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

/// Registers every route under `/api/v1`.
pub fn configure(cfg: &mut web::ServiceConfig, state: AppState, max_json_bytes: usize) {
    cfg.app_data(web::Data::new(state))
        .app_data(web::JsonConfig::default().limit(max_json_bytes).error_handler(error::json_error))
        .app_data(web::QueryConfig::default().error_handler(error::query_error))
        .app_data(web::PathConfig::default().error_handler(error::path_error))
        .service(
            web::scope("/api/v1")
                .wrap(actix_web::middleware::from_fn(auth::require_token))
                .route("/health", web::get().to(status::health))
                .route("/tokens", web::post().to(tokens::create))
                .route("/tokens", web::get().to(tokens::list))
                .route("/tokens/{id}", web::delete().to(tokens::revoke))
                .route("/actors", web::get().to(status::actors))
                .route("/events", web::get().to(events::stream))
                .route("/nodes", web::get().to(status::list_nodes))
                .route("/nodes/{id}", web::get().to(status::get_node))
                .route("/operations", web::get().to(status::list_operations))
                .route("/operations/{id}", web::get().to(status::get_operation))
                .route("/packages", web::get().to(packages::list))
                .route("/packages/{name}/{version}", web::put().to(packages::upload))
                .route("/packages/{name}/{version}", web::get().to(packages::get))
                .route("/packages/{name}/{version}", web::delete().to(packages::delete))
                .route("/clusters", web::post().to(clusters::create))
                .route("/clusters", web::get().to(clusters::list))
                .route("/clusters/{name}", web::get().to(clusters::get))
                .route("/clusters/{name}", web::delete().to(clusters::delete))
                .route("/clusters/{name}/start", web::post().to(clusters::start))
                .route("/clusters/{name}/stop", web::post().to(clusters::stop))
                .route("/clusters/{name}/restart", web::post().to(clusters::restart))
                .route("/clusters/{name}/scale", web::post().to(clusters::scale))
                .route("/clusters/{name}/config", web::patch().to(clusters::reconfigure))
                .route("/clusters/{name}/upgrade", web::post().to(clusters::upgrade))
                .route("/clusters/{name}/roles/{role}", web::patch().to(clusters::resize))
                .route("/clusters/{name}/instances/{id}/logs", web::get().to(logs::logs))
                .route("/clusters/{name}/instances/{id}/{verb}", web::post().to(clusters::instance_verb)),
        )
        .route("/metrics", web::get().to(metrics::scrape))
        .default_service(web::to(status::not_found));
}
