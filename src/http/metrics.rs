//! `GET /metrics` (at the root, as Prometheus expects): the master's
//! metrics in Prometheus text format, through the `metrics` facade and its
//! Prometheus exporter.
//!
//! Counted where they happen: operations by kind and result and step
//! durations (`actors/cluster/ops.rs`), store commit latency and batch size
//! (`storage/writer.rs`), bytes over agent links (`protocol/codec.rs`), API
//! requests by route, method and status with latency ([`track`]). Read
//! from the read model when scraped (nothing is kept up to date while no
//! one scrapes): instances and clusters by status, nodes by status and
//! each node's heartbeat age, mailbox depth per actor kind, running
//! operations. Needs a token (of scope `read` at least: a Prometheus
//! scraper's) unless the `open_metrics` setting is on.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::middleware::Next;
use actix_web::{HttpRequest, HttpResponse, web};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use super::AppState;
use super::error::ApiError;
use crate::error::Error;

/// Seconds: from a fast API read to a slow rolling step.
const SECONDS: &[f64] =
    &[0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0];
/// Requests in one store batch.
const BATCH: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 4096.0];

/// Installs the process-wide recorder (once, in the master). Histograms get
/// buckets (the exporter renders summaries otherwise); a task runs the
/// exporter's upkeep so its buckets do not grow.
pub fn install() -> Result<PrometheusHandle, String> {
    let handle = PrometheusBuilder::new()
        // A node that is gone stops being scraped-set: its age goes away.
        .idle_timeout(metrics_util::MetricKindMask::GAUGE, Some(Duration::from_secs(300)))
        .set_buckets_for_metric(Matcher::Full("flotilla_store_batch_requests".into()), BATCH)
        .and_then(|b| b.set_buckets(SECONDS))
        .map_err(|e| e.to_string())?
        .install_recorder()
        .map_err(|e| e.to_string())?;
    let upkeep = handle.clone();
    std::thread::Builder::new()
        .name("flotilla-metrics".into())
        .spawn(move || {
            loop {
                std::thread::sleep(Duration::from_secs(5));
                crate::actors::live_tasks::refresh();
                upkeep.run_upkeep();
            }
        })
        .map_err(|e| e.to_string())?;
    Ok(handle)
}

/// Times every request: `flotilla_http_requests_total` and
/// `flotilla_http_request_duration_seconds` by method, route pattern
/// (`/api/v1/clusters/:name`, never the names themselves) and status.
pub async fn track(
    req: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let started = Instant::now();
    // A fixed set: any other token would mint a series per request.
    let method: &'static str = match req.method().as_str() {
        "GET" => "GET",
        "POST" => "POST",
        "PUT" => "PUT",
        "PATCH" => "PATCH",
        "DELETE" => "DELETE",
        "HEAD" => "HEAD",
        "OPTIONS" => "OPTIONS",
        _ => "other",
    };
    let res = next.call(req).await?;
    // `/api/v1/clusters/:name`: braces in label values trip some parsers.
    let route =
        res.request().match_pattern().map_or_else(|| "unmatched".into(), |p| p.replace('{', ":").replace('}', ""));
    let status = res.status().as_u16().to_string();
    let labels = [("method", method.to_string()), ("route", route), ("status", status)];
    metrics::counter!("flotilla_http_requests_total", &labels).increment(1);
    metrics::histogram!("flotilla_http_request_duration_seconds", &labels).record(started.elapsed().as_secs_f64());
    Ok(res)
}

/// The master's metrics, in Prometheus text format
///
/// At the root, as Prometheus expects. Needs a token (any scope: `read`
/// is enough) unless the `open_metrics` setting is on.
#[utoipa::path(get, path = "/metrics", operation_id = "metrics", tag = "status",
    security((), ("bearer" = [])),
    responses(
        (status = 200, description = "Prometheus text exposition format 0.0.4", body = String,
            content_type = "text/plain; version=0.0.4"),
        (status = 401, response = super::error::Unauthorized),
        (status = 503, response = super::error::Unavailable)))]
pub async fn scrape(state: web::Data<AppState>, req: HttpRequest) -> Result<HttpResponse, ApiError> {
    if !state.open_metrics {
        let header = req.headers().get(actix_web::http::header::AUTHORIZATION);
        super::auth::authorize(&state, header, "GET /metrics", super::auth::METRICS)?;
    }
    let Some(handle) = &state.metrics else {
        return Err(ApiError(Error::unavailable("metrics are not recorded in this process")));
    };
    read_model_gauges(&state);
    Ok(HttpResponse::Ok().content_type("text/plain; version=0.0.4").body(handle.render()))
}

/// Sets the gauges that are read from the read model.
fn read_model_gauges(state: &AppState) {
    let rm = &state.shared.read_model;
    let mut instances: BTreeMap<String, u64> = BTreeMap::new();
    let mut clusters: BTreeMap<String, u64> = BTreeMap::new();
    for cell in rm.clusters().values() {
        let snap = cell.load();
        *clusters.entry(format!("{:?}", snap.record.status)).or_default() += 1;
        for (status, n) in super::dto::instance_counts(&snap) {
            *instances.entry(status).or_default() += u64::from(n);
        }
    }
    // Every status, so a count that falls to zero reads 0, not its last value.
    for s in super::dto::INSTANCE_STATUSES {
        let name = format!("{s:?}");
        let n = instances.get(&name).copied().unwrap_or(0);
        metrics::gauge!("flotilla_instances", "status" => name).set(n as f64);
    }
    for s in crate::storage::records::CLUSTER_STATUSES {
        let name = format!("{s:?}");
        let n = clusters.get(&name).copied().unwrap_or(0);
        metrics::gauge!("flotilla_clusters", "status" => name).set(n as f64);
    }
    let timing = state.shared.timing;
    let now = Instant::now();
    let mut nodes: BTreeMap<String, u64> = ["Ready", "Unknown", "Down"].iter().map(|s| (s.to_string(), 0)).collect();
    for (id, entry) in rm.nodes().iter() {
        let status = entry.live.status_at(now, timing.node_unknown_after, timing.node_down_after);
        *nodes.entry(format!("{status:?}")).or_default() += 1;
        if let Some(age) = entry.live.silence(now) {
            metrics::gauge!("flotilla_node_heartbeat_age_seconds", "node" => id.to_string()).set(age.as_secs_f64());
        }
    }
    for (status, n) in nodes {
        metrics::gauge!("flotilla_nodes", "status" => status).set(n as f64);
    }
    // Every kind, so one with no actor left reads 0, not its last value.
    let mut depth: BTreeMap<&'static str, (u64, u64)> =
        ["supervisor", "cluster", "node_manager"].iter().map(|k| (*k, (0, 0))).collect();
    for a in rm.actors() {
        let d = depth.entry(a.kind).or_default();
        d.0 += a.mailbox;
        d.1 = d.1.max(a.mailbox);
    }
    for (kind, (sum, max)) in depth {
        metrics::gauge!("flotilla_mailbox_depth", "kind" => kind).set(sum as f64);
        metrics::gauge!("flotilla_mailbox_depth_max", "kind" => kind).set(max as f64);
    }
    metrics::gauge!("flotilla_running_operations").set(rm.running_operations().len() as f64);
}
