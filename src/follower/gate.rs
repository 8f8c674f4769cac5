//! Which requests a follower answers itself: the reads its read model
//! holds (clusters, instances, operations, packages, the event stream,
//! health, the API document). Every other request goes to the leader:
//! writes, and reads of what only the leader knows (agents' links and node
//! health, actors, pools, logs, tokens and join tokens, metrics, the
//! dashboard): `307` to the same path there, or `503 no_leader` during an
//! election (`http::standby::to_leader`).

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::middleware::Next;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

use actix_web::http::{ConnectionType, Method};
use actix_web::{Error, web};

use crate::actors::role::Following;

/// The paths a follower serves (`GET` only); `{}` is one path segment.
const SERVED: &[&str] = &[
    "/api/v1/health",
    "/api/v1/openapi.json",
    "/api/v1/whoami",
    "/api/v1/events",
    "/api/v1/operations",
    "/api/v1/operations/{}",
    "/api/v1/packages",
    "/api/v1/packages/{}/{}",
    "/api/v1/clusters",
    "/api/v1/clusters/{}",
    "/api/v1/clusters/{}/instances",
];

/// Whether a follower answers this request itself (package tarballs
/// between masters too: `http::peer_blobs`).
pub fn served(method: &Method, path: &str) -> bool {
    (*method == Method::GET && SERVED.iter().any(|pattern| matches(pattern, path)))
        || ((*method == Method::GET || *method == Method::PUT) && matches("/internal/v1/blobs/{}", path))
}

fn matches(pattern: &str, path: &str) -> bool {
    let (mut p, mut s) = (pattern.split('/'), path.split('/'));
    loop {
        match (p.next(), s.next()) {
            (None, None) => return true,
            (Some("{}"), Some(seg)) if !seg.is_empty() => {}
            (Some(a), Some(b)) if a == b => {}
            _ => return false,
        }
    }
}

/// Where the follower's server is in its life (one per server).
#[derive(Debug, Clone, Default)]
pub struct Phase(Arc<AtomicU8>);

/// It follows: writes and leader-only reads go to the leader.
const FOLLOWING: u8 = 0;
/// This master won and boots: reads are still served from the view, the
/// rest is answered `503 taking_over` (a redirect would point at itself).
const TAKING_OVER: u8 = 1;
/// The master's own server has the socket: this one answers what its
/// open connections still send, each answer closing its connection (a
/// keep-alive connection closed under a client's request would fail that
/// request), and sends long polls and streams to the master's.
const DRAINING: u8 = 2;

impl Phase {
    pub fn taking_over(&self) {
        self.0.store(TAKING_OVER, Ordering::SeqCst);
    }

    pub fn draining(&self) {
        self.0.store(DRAINING, Ordering::SeqCst);
    }

    fn get(&self) -> u8 {
        self.0.load(Ordering::SeqCst)
    }
}

/// A request that may hold its connection for long: the event stream, a
/// long poll.
fn lasting(req: &ServiceRequest) -> bool {
    req.path() == "/api/v1/events" || req.query_string().split('&').any(|kv| kv.starts_with("wait="))
}

/// The follower's outermost middleware.
pub async fn route(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<impl MessageBody>, Error> {
    let phase_now = |req: &actix_web::HttpRequest| req.app_data::<web::Data<Phase>>().map_or(FOLLOWING, |p| p.get());
    let phase = phase_now(req.request());
    let own = served(req.method(), req.path()) && !(phase == DRAINING && lasting(&req));
    let mut res = if own {
        next.call(req).await?.map_into_left_body()
    } else if phase == TAKING_OVER {
        req.into_response(crate::http::standby::taking_over()).map_into_right_body()
    } else {
        let leader = req.app_data::<web::Data<Following>>().and_then(|f| f.leader.get());
        let answer = crate::http::standby::to_leader(req.request(), leader.as_ref());
        req.into_response(answer).map_into_right_body()
    };
    // On its way out: no connection is kept for another request (the
    // server closing an idle one under a client's next request would fail
    // that request).
    // (Read again: a long poll may have begun while following.)
    if phase_now(res.request()) != FOLLOWING {
        res.response_mut().head_mut().set_connection_type(ConnectionType::Close);
    }
    Ok(res)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_of_the_read_model_are_served_and_everything_else_goes_to_the_leader() {
        for path in
            ["/api/v1/clusters", "/api/v1/clusters/web", "/api/v1/clusters/web/instances", "/api/v1/operations/x"]
        {
            assert!(served(&Method::GET, path), "{path}");
            assert!(!served(&Method::POST, path), "POST {path}");
        }
        for path in [
            "/api/v1/nodes",
            "/api/v1/actors",
            "/api/v1/clusters/web/scale",
            "/api/v1/clusters//instances",
            "/api/v1/clusters/web/instances/i1/logs",
            "/api/v1/packages/a",
            "/metrics",
            "/",
            "/ui/app.js",
        ] {
            assert!(!served(&Method::GET, path), "{path}");
        }
        assert!(!served(&Method::DELETE, "/api/v1/clusters/web"));
        assert!(!served(&Method::PUT, "/api/v1/packages/a/1"));
    }
}
