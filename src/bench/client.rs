//! The load driver's view of the admin API: each call timed, reads and
//! writes counted apart, `503 overloaded` retried after its `Retry-After`
//! (and counted: a load test must say how often the master pushed back).
//!
//! Several masters (`--api` a follower's URL): reads go to the master
//! given, writes to whichever leads: a `307` is followed with the token
//! (reqwest drops it for another port) and the leader remembered for the
//! next write; a read only the leader answers is sent there each time
//! (counted as redirected). `503 no_leader` / `taking_over` is retried
//! after its `Retry-After`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::stats::{ByKind, Samples};

/// A timed API client; cheap to clone.
#[derive(Clone)]
pub struct Api {
    http: reqwest::Client,
    /// `http://HOST:PORT/api/v1` of the master reads go to (the first given).
    pub base: String,
    /// Where writes go: the leader's base, once a redirect named it.
    leader: Arc<std::sync::Mutex<Option<String>>>,
    token: Option<String>,
    /// Reads of a bounded size: lists (paged), nodes, operations, health.
    pub reads: Arc<Samples>,
    /// `GET /clusters/{name}`: a whole cluster, every instance in it (B5
    /// gives these their own budget, by the cluster's size).
    pub whole_cluster_reads: Arc<Samples>,
    /// Every read, both kinds together.
    pub all_reads: Arc<Samples>,
    pub writes: Arc<Samples>,
    /// The same samples by route (`GET /clusters/{}`), to say which call is slow.
    pub routes: Arc<ByKind>,
    pub overloaded: Arc<AtomicU64>,
    /// Calls a follower sent to the leader (`307`, followed).
    pub redirected: Arc<AtomicU64>,
    /// `503` while no master led, or one was taking over (retried).
    pub between_leaders: Arc<AtomicU64>,
}

/// What a call sends.
enum Body<'a> {
    Json(&'a Value),
    /// Shared, not copied, when a redirect sends it again.
    Bytes(bytes::Bytes),
}

/// How long one call waits for a leader before it fails.
const LEADERLESS_LIMIT: Duration = Duration::from_secs(60);

/// Redirects followed for one call before it fails.
const MAX_HOPS: usize = 3;

/// A failed call, with what the master said.
#[derive(Debug, thiserror::Error)]
#[error("{method} {path}: {detail}")]
pub struct ApiError {
    pub method: &'static str,
    pub path: String,
    pub status: Option<u16>,
    pub detail: String,
}

impl Api {
    /// A client of the master at `base` (`http://HOST:PORT`); reads go there,
    /// writes too until a redirect names the leader.
    pub fn new(base: &str, token: Option<String>) -> Result<Api, String> {
        let http = reqwest::Client::builder()
            // Followed here, with the token.
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .pool_max_idle_per_host(64)
            // Below the server's keep-alive (5 s): a pooled connection the
            // server is closing must not be picked for a request.
            .pool_idle_timeout(Duration::from_secs(2))
            .timeout(Duration::from_secs(180))
            .build()
            .map_err(|e| e.to_string())?;
        Ok(Api {
            http,
            base: format!("{}/api/v1", base.trim_end_matches('/')),
            leader: Arc::default(),
            token,
            reads: Arc::default(),
            whole_cluster_reads: Arc::default(),
            all_reads: Arc::default(),
            writes: Arc::default(),
            routes: Arc::default(),
            overloaded: Arc::default(),
            redirected: Arc::default(),
            between_leaders: Arc::default(),
        })
    }

    /// Where a call goes first: reads to this client's master, writes to
    /// the leader once known.
    fn first_base(&self, method: &str) -> String {
        let leader = self.leader.lock().unwrap_or_else(|p| p.into_inner());
        match (method, leader.as_ref()) {
            ("GET", _) | (_, None) => self.base.clone(),
            (_, Some(l)) => l.clone(),
        }
    }

    /// The master a `307` answer to `path` points at (its base), if any.
    fn redirect_target(resp: &reqwest::Response, path: &str) -> Option<String> {
        let status = resp.status().as_u16();
        if status != 307 && status != 308 {
            return None;
        }
        let location = resp.headers().get("location")?.to_str().ok()?;
        location.strip_suffix(path).map(str::to_string)
    }

    async fn call(&self, method: &'static str, path: &str, body: Option<&Value>) -> Result<Value, ApiError> {
        let text = self.send(method, path, body.map(Body::Json)).await?;
        parse(text).await.map_err(|(e, text)| ApiError {
            method,
            path: path.to_string(),
            status: None,
            detail: format!("{e}: {text}"),
        })
    }

    /// Sends a call until it is answered other than `503 overloaded` or
    /// between leaders, following redirects; its answer's text when it
    /// succeeded. Timed from its first send to that answer (a redirect's
    /// hop included; a retry's wait not).
    async fn send(&self, method: &'static str, path: &str, body: Option<Body<'_>>) -> Result<String, ApiError> {
        let err = |status: Option<u16>, detail: String| ApiError { method, path: path.to_string(), status, detail };
        let mut base = self.first_base(method);
        let mut hops = 0;
        let mut hop_started = None;
        // How long a call waits for a leader (a write to one that is gone,
        // `503` between leaders) before it fails.
        let leaderless_until = Instant::now() + LEADERLESS_LIMIT;
        loop {
            let url = format!("{base}{path}");
            let mut req = match method {
                "GET" => self.http.get(&url),
                "POST" => self.http.post(&url),
                "PATCH" => self.http.patch(&url),
                "PUT" => self.http.put(&url),
                _ => self.http.delete(&url),
            };
            if let Some(t) = &self.token {
                req = req.bearer_auth(t);
            }
            req = match &body {
                Some(Body::Json(b)) => req.json(b),
                Some(Body::Bytes(b)) => req.body(b.clone()),
                None => req,
            };
            let started: Instant = hop_started.take().unwrap_or_else(Instant::now);
            let resp = match req.send().await {
                Ok(r) => r,
                // The leader it remembered is gone: the master given
                // redirects to whoever leads now.
                Err(e) if e.is_connect() && base != self.base && Instant::now() < leaderless_until => {
                    *self.leader.lock().unwrap_or_else(|p| p.into_inner()) = None;
                    (base, hops, hop_started) = (self.base.clone(), 0, None);
                    continue;
                }
                Err(e) => return Err(err(None, e.to_string())),
            };
            if let Some(leader) = Self::redirect_target(&resp, path)
                && hops < MAX_HOPS
            {
                hops += 1;
                hop_started = Some(started);
                self.redirected.fetch_add(1, Ordering::Relaxed);
                if method != "GET" {
                    *self.leader.lock().unwrap_or_else(|p| p.into_inner()) = Some(leader.clone());
                }
                base = leader;
                continue;
            }
            let status = resp.status();
            let retry_after =
                resp.headers().get("retry-after").and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
            let text = resp.text().await.map_err(|e| err(Some(status.as_u16()), e.to_string()))?;
            let took = started.elapsed();
            // Long polls (`?wait=`) measure the operation, not the API;
            // uploads are not part of the workload.
            if !path.contains("wait=") && !matches!(body, Some(Body::Bytes(_))) {
                let route = route(method, path);
                if method != "GET" {
                    self.writes.add(took)
                } else {
                    self.all_reads.add(took);
                    if route == WHOLE_CLUSTER { self.whole_cluster_reads.add(took) } else { self.reads.add(took) }
                }
                self.routes.add(&route, took);
            }
            if status.as_u16() == 503 && text.contains("overloaded") {
                self.overloaded.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(retry_after.unwrap_or(1) * 100)).await;
                continue;
            }
            if status.as_u16() == 503
                && (text.contains("no_leader") || text.contains("taking_over"))
                && Instant::now() < leaderless_until
            {
                // Sent again to the master first asked: it redirects to
                // whoever leads next.
                self.between_leaders.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(retry_after.unwrap_or(1) * 100)).await;
                base = self.base.clone();
                hops = 0;
                continue;
            }
            if !status.is_success() {
                return Err(err(Some(status.as_u16()), text));
            }
            return Ok(text);
        }
    }

    pub async fn get(&self, path: &str) -> Result<Value, ApiError> {
        self.call("GET", path, None).await
    }

    pub async fn post(&self, path: &str, body: &Value) -> Result<Value, ApiError> {
        self.call("POST", path, Some(body)).await
    }

    pub async fn patch(&self, path: &str, body: &Value) -> Result<Value, ApiError> {
        self.call("PATCH", path, Some(body)).await
    }

    /// Uploads a package (not timed: not part of the workload).
    pub async fn put_package(&self, name: &str, version: &str, bytes: Vec<u8>) -> Result<(), ApiError> {
        let path = format!("/packages/{name}/{version}");
        self.send("PUT", &path, Some(Body::Bytes(bytes::Bytes::from(bytes)))).await.map(|_| ())
    }

    /// Runs a mutating call and waits for its operation to end; returns
    /// the ended operation and the time from the call to its end.
    pub async fn run_op(&self, method: &'static str, path: &str, body: &Value) -> Result<(Value, Duration), ApiError> {
        let started = Instant::now();
        let accepted = self.call(method, path, Some(body)).await?;
        let op = self.wait_op(accepted["operation"]["id"].as_str().unwrap_or_default()).await?;
        Ok((op, started.elapsed()))
    }

    /// Like [`run_op`](Self::run_op), polling the operation every 10 ms to
    /// time its steps: each step's name with the seconds (from the request)
    /// at which it was first seen past `Pending` and first seen `Done`
    /// (within 10 ms of when it was).
    pub async fn run_op_stepped(
        &self,
        method: &'static str,
        path: &str,
        body: &Value,
    ) -> Result<(Value, Duration, Vec<(String, f64, f64)>), ApiError> {
        let started = Instant::now();
        let accepted = self.call(method, path, Some(body)).await?;
        let id = accepted["operation"]["id"].as_str().unwrap_or_default().to_string();
        let mut steps: Vec<(String, f64, f64)> = Vec::new();
        loop {
            let op = self.get(&format!("/operations/{id}")).await?["operation"].clone();
            let at = started.elapsed().as_secs_f64();
            for (i, st) in op["steps"].as_array().into_iter().flatten().enumerate() {
                if steps.len() <= i {
                    steps.push((st["name"].as_str().unwrap_or("?").to_string(), f64::NAN, f64::NAN));
                }
                let status = st["status"].as_str().unwrap_or_default();
                if status != "Pending" && steps[i].1.is_nan() {
                    steps[i].1 = at;
                }
                if status == "Done" && steps[i].2.is_nan() {
                    steps[i].2 = at;
                }
            }
            if !matches!(op["status"].as_str().unwrap_or_default(), "Pending" | "Running") {
                return Ok((op, started.elapsed(), steps));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Waits for operation `id` to end; returns it ended.
    pub async fn wait_op(&self, id: &str) -> Result<Value, ApiError> {
        loop {
            let op = self.get(&format!("/operations/{id}?wait=60")).await?;
            let op = op["operation"].clone();
            let status = op["status"].as_str().unwrap_or_default();
            if !matches!(status, "Pending" | "Running") {
                return Ok(op);
            }
        }
    }
}

/// Bodies this large are parsed off the client's runtime.
const PARSE_APART: usize = 64 * 1024;

/// Parses an answer. A large one (a cluster of 1,000 instances is ~0.5 MB)
/// is parsed on the blocking pool: fifty clients parsing such answers on
/// the runtime's threads held up each other's reads, and the latencies
/// measured the driver's parsing queue instead of the master.
async fn parse(text: String) -> Result<Value, (serde_json::Error, String)> {
    fn now(text: String) -> Result<Value, (serde_json::Error, String)> {
        serde_json::from_str(&text).map_err(|e| (e, text))
    }
    if text.len() < PARSE_APART {
        return now(text);
    }
    match tokio::task::spawn_blocking(move || now(text)).await {
        Ok(parsed) => parsed,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(e) => Err((serde_json::Error::io(std::io::Error::other(e.to_string())), String::new())),
    }
}

/// The route of a whole-cluster read.
const WHOLE_CLUSTER: &str = "GET /clusters/{}";

/// A call's route: its method and path with names and ids as `{}` and
/// without the query (`GET /clusters/{}`, `POST /clusters/{}/scale`,
/// `POST /clusters/{}/instances/{}/stop`).
pub fn route(method: &str, path: &str) -> String {
    let path = path.split('?').next().unwrap_or_default();
    let parts: Vec<&str> = path.split('/').enumerate().map(|(i, p)| if i == 2 || i == 4 { "{}" } else { p }).collect();
    format!("{method} {}", parts.join("/"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn routes_hide_names_and_queries() {
        assert_eq!(super::route("GET", "/clusters?limit=100"), "GET /clusters");
        assert_eq!(super::route("GET", "/clusters/b7"), "GET /clusters/{}");
        assert_eq!(super::route("POST", "/clusters/b7/scale"), "POST /clusters/{}/scale");
        assert_eq!(super::route("GET", "/operations/op-1?wait=60"), "GET /operations/{}");
        assert_eq!(super::route("POST", "/clusters/b7/instances/i-3/stop"), "POST /clusters/{}/instances/{}/stop");
    }
}
