//! What a master answers while another leads (several masters on etcd):
//! it campaigns, and meanwhile its API port says so. `GET /api/v1/health`
//! answers `200` with `role: follower`, the leader's API URL and term;
//! every other request is answered `307 Temporary Redirect` to the same
//! path on the leader (method and body kept), or `503 no_leader` (with
//! `Retry-After`) while nobody leads. Once this master wins, the standby
//! server stops and the master's own serves the same socket.
//!
//! A follower does not serve reads from a read model of its own yet: it
//! redirects them too (docs/architecture.md, "Several masters on etcd").

use std::sync::{Arc, Mutex};

use actix_web::{App, HttpRequest, HttpResponse, HttpServer, web};

use crate::storage::etcd::election::Leader;

/// The leader as last seen by the campaign.
#[derive(Clone, Default)]
pub struct Seen(Arc<Mutex<Option<Leader>>>);

impl Seen {
    pub fn set(&self, leader: Option<&Leader>) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = leader.cloned();
    }

    fn get(&self) -> Option<Leader> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

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

    /// Stops answering (requests under way finish).
    pub async fn stop(self) {
        self.handle.stop(true).await;
    }
}

async fn answer(req: HttpRequest, state: web::Data<(String, Seen)>) -> HttpResponse {
    let (name, seen) = &**state;
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
    match info {
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
