//! What a master answers while another leads (several masters on etcd):
//! it campaigns, and meanwhile its API port says so. `GET /api/v1/health`
//! answers `200` with `role: follower`, the leader's API URL and term;
//! every other request is answered `307 Temporary Redirect` to the same
//! path on the leader (method and body kept), or `503 no_leader` (with
//! `Retry-After`) while nobody leads. Once this master wins, the standby
//! server stops and the master's own serves the same socket.
//!
//! It serves until this master's own read model is loaded from etcd; then
//! the follower's server takes the socket (`crate::follower`), and this one
//! is what a follower falls back to while that cannot be built (no CA in
//! the store yet: no master has led).

use actix_web::{App, HttpRequest, HttpResponse, HttpServer, web};

use crate::storage::etcd::election::{Leader, Seen};

/// The standby server; stop it before the master serves the socket.
pub struct Standby {
    handle: actix_web::dev::ServerHandle,
}

impl Standby {
    /// Serves `listener` (a clone of the master's API socket) until stopped.
    pub fn serve(listener: std::net::TcpListener, name: String, seen: Seen) -> std::io::Result<Standby> {
        let server = HttpServer::new(move || {
            App::new().app_data(web::Data::new((name.clone(), seen.clone()))).default_service(web::to(answer))
        })
        .workers(1)
        .disable_signals()
        .shutdown_timeout(1)
        .listen(listener)?
        .run();
        let handle = server.handle();
        actix_web::rt::spawn(server);
        Ok(Standby { handle })
    }

    /// Stops accepting connections (they wait in the socket's backlog for
    /// the server that takes it next), answering those it has.
    pub async fn pause(&self) {
        self.handle.pause().await;
    }

    /// Accepts connections again (the server meant to take over could not).
    pub async fn resume(&self) {
        self.handle.resume().await;
    }

    /// Stops answering (requests under way finish).
    pub async fn stop(self) {
        self.handle.stop(true).await;
    }
}

/// Every answer closes its connection: the server is short-lived, and a
/// kept-alive connection it closed under a client's next request would
/// fail that request.
async fn answer(req: HttpRequest, state: web::Data<(String, Seen)>) -> HttpResponse {
    let mut res = standby_answer(&req, &state);
    res.head_mut().set_connection_type(actix_web::http::ConnectionType::Close);
    res
}

fn standby_answer(req: &HttpRequest, state: &(String, Seen)) -> HttpResponse {
    let (name, seen) = state;
    let leader = seen.get();
    let info = leader.as_ref().and_then(|l| l.info.as_ref());
    if req.path() == "/api/v1/health" {
        return HttpResponse::Ok().json(serde_json::json!({
            "status": "ok",
            "role": "follower",
            "leader": info.map(|i| i.api_url.clone()),
            "term": leader.as_ref().map_or(0, |l| l.term),
            "name": name,
            "pid": std::process::id(),
            "store_engine": "etcd",
        }));
    }
    if info.is_some_and(|i| i.name == *name) {
        // This master won and boots; its own server takes the socket next.
        return taking_over();
    }
    to_leader(req, leader.as_ref())
}

/// `503 taking_over`: this master won the election and is starting (a
/// redirect would point at itself).
pub fn taking_over() -> HttpResponse {
    HttpResponse::ServiceUnavailable().insert_header(("Retry-After", "1")).json(serde_json::json!({
        "error": {
            "code": "taking_over",
            "message": "this master has just been elected leader and is starting; retry in a moment",
        }
    }))
}

/// `307` to the same path on the leader (method and body kept), or `503
/// no_leader` while nobody leads.
pub fn to_leader(req: &HttpRequest, leader: Option<&Leader>) -> HttpResponse {
    match leader.and_then(|l| l.info.as_ref()) {
        Some(i) => {
            let target = format!(
                "{}{}",
                i.api_url.trim_end_matches('/'),
                req.uri().path_and_query().map_or("/", |p| p.as_str())
            );
            HttpResponse::TemporaryRedirect().insert_header(("Location", target)).finish()
        }
        None => HttpResponse::ServiceUnavailable().insert_header(("Retry-After", "1")).json(serde_json::json!({
            "error": {
                "code": "no_leader",
                "message": "no master leads right now (an election is under way); retry shortly",
            }
        })),
    }
}
