//! Admin API helpers on [`TestEnv`]: every call answers `(status, JSON)`;
//! the `run_*`/`create_*` helpers also wait for the operation to end.
//! Paths are relative to `/api/v1`.

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::Value;

use super::env::TestEnv;
use super::package::PackageBuilder;

/// Operation statuses that end it.
pub const TERMINAL: [&str; 4] = ["Succeeded", "Failed", "RolledBack", "Cancelled"];

impl TestEnv {
    async fn send(&self, req: reqwest::RequestBuilder, what: &str) -> (StatusCode, Value) {
        let resp = req.send().await.unwrap_or_else(|e| panic!("{what}: request failed: {e}"));
        let status = resp.status();
        let text = resp.text().await.unwrap_or_else(|e| panic!("{what}: reading the body failed: {e}"));
        let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
        (status, body)
    }

    /// POST with the answer's headers too (for `Retry-After`).
    pub async fn post_full(&self, path: &str, body: Value) -> (StatusCode, reqwest::header::HeaderMap, Value) {
        let what = format!("POST {path}");
        let req = self.client.post(format!("{}{path}", self.api)).json(&body);
        let resp = req.send().await.unwrap_or_else(|e| panic!("{what}: request failed: {e}"));
        let (status, headers) = (resp.status(), resp.headers().clone());
        let text = resp.text().await.unwrap_or_else(|e| panic!("{what}: reading the body failed: {e}"));
        (status, headers, serde_json::from_str(&text).unwrap_or(Value::String(text)))
    }

    /// Polls `check` every 100 ms for up to `secs` seconds until it answers
    /// `Ok`; else panics with `what`, the last `Err` (the state it saw) and
    /// the tails of the logs.
    pub async fn until<T>(&self, secs: u64, what: &str, mut check: impl AsyncFnMut() -> Result<T, String>) -> T {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let last = match check().await {
                Ok(v) => return v,
                Err(e) => e,
            };
            if Instant::now() >= deadline {
                panic!("{what}: not within {secs} s; last seen: {last}\n{}", self.log_tails());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub async fn get(&self, path: &str) -> (StatusCode, Value) {
        self.send(self.client.get(format!("{}{path}", self.api)), &format!("GET {path}")).await
    }

    pub async fn post(&self, path: &str, body: Value) -> (StatusCode, Value) {
        self.send(self.client.post(format!("{}{path}", self.api)).json(&body), &format!("POST {path}")).await
    }

    /// A POST without a body (start, stop, restart).
    pub async fn post_empty(&self, path: &str) -> (StatusCode, Value) {
        self.send(self.client.post(format!("{}{path}", self.api)), &format!("POST {path}")).await
    }

    pub async fn patch(&self, path: &str, body: Value) -> (StatusCode, Value) {
        self.send(self.client.patch(format!("{}{path}", self.api)).json(&body), &format!("PATCH {path}")).await
    }

    /// PATCH a change (config, role resources), asserting 202; waits for the
    /// operation to end and returns it.
    pub async fn run_op_patch(&self, path: &str, body: Value) -> Value {
        let (status, resp) = self.patch(path, body).await;
        assert_eq!(status, StatusCode::ACCEPTED, "PATCH {path}: {resp:#}");
        self.wait_op(resp["operation"]["id"].as_str().expect("op id")).await
    }

    pub async fn delete(&self, path: &str) -> (StatusCode, Value) {
        self.send(self.client.delete(format!("{}{path}", self.api)), &format!("DELETE {path}")).await
    }

    pub async fn put_bytes(&self, path: &str, bytes: Vec<u8>) -> (StatusCode, Value) {
        self.send(self.client.put(format!("{}{path}", self.api)).body(bytes), &format!("PUT {path}")).await
    }

    /// Uploads `pkg`; asserts 201 Created (or 200 for the same bytes again).
    /// Uploads `pkg` (retried while the master answers `503 overloaded`,
    /// as a client would: tests with tight queues share them with the
    /// master's own writes).
    pub async fn upload(&self, pkg: &PackageBuilder) -> Value {
        let path = format!("/packages/{}/{}", pkg.name(), pkg.version());
        let deadline = Instant::now() + Duration::from_secs(30);
        let (status, body) = loop {
            let (status, body) = self.put_bytes(&path, pkg.build()).await;
            if status == StatusCode::SERVICE_UNAVAILABLE && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
            break (status, body);
        };
        assert!(status == StatusCode::CREATED || status == StatusCode::OK, "PUT {path}: {status} {body:#}");
        body["package"].clone()
    }

    /// `GET /operations/{id}?wait=60` until it ends (120 s cap); the operation.
    pub async fn wait_op(&self, id: &str) -> Value {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let (status, body) = self.get(&format!("/operations/{id}?wait=60")).await;
            assert_eq!(status, StatusCode::OK, "GET /operations/{id}: {body:#}");
            let op = body["operation"].clone();
            if TERMINAL.iter().any(|t| op["status"] == *t) {
                self.check_settled(&op).await;
                return op;
            }
            assert!(Instant::now() < deadline, "operation {id} did not end within 120 s: {op:#}\n{}", self.log_tails());
        }
    }

    /// Once an operation has ended, its cluster no longer shows it running
    /// (a deleted cluster is gone): whoever waited for the operation and then
    /// reads the cluster sees the outcome, and may send the next request.
    async fn check_settled(&self, op: &Value) {
        let cluster = op["cluster"].as_str().expect("op cluster");
        let (status, c) = self.get(&format!("/clusters/{cluster}")).await;
        let settled = if op["kind"] == "Delete" && op["status"] == "Succeeded" {
            status == StatusCode::NOT_FOUND
        } else {
            status == StatusCode::OK && c["operation"] != op["id"]
        };
        assert!(
            settled,
            "operation {} ({}) has ended {}, yet GET /clusters/{cluster} then answers {status}: {c:#}",
            op["id"], op["kind"], op["status"]
        );
    }

    /// `POST /clusters`; asserts 202; the operation as answered (not waited).
    pub async fn create_cluster(&self, body: Value) -> Value {
        let (status, resp) = self.post("/clusters", body.clone()).await;
        assert_eq!(status, StatusCode::ACCEPTED, "POST /clusters {body}: {resp:#}");
        resp["operation"].clone()
    }

    /// Creates a cluster and waits; asserts the operation Succeeded and the
    /// cluster is Active; answers the cluster.
    pub async fn create_active(&self, body: Value) -> Value {
        let name = body["name"].as_str().expect("cluster name").to_string();
        let op = self.create_cluster(body).await;
        let op = self.wait_op(op["id"].as_str().expect("op id")).await;
        self.assert_succeeded(&op);
        let cluster = self.cluster(&name).await;
        assert_eq!(cluster["status"], "Active", "cluster after create: {cluster:#}");
        cluster
    }

    /// POSTs `path` (with `body` when given), asserts 202, waits for the
    /// operation to end and answers it.
    pub async fn run_op(&self, path: &str, body: Option<Value>) -> Value {
        let (status, resp) = match body {
            Some(b) => self.post(path, b).await,
            None => self.post_empty(path).await,
        };
        assert_eq!(status, StatusCode::ACCEPTED, "POST {path}: {resp:#}");
        self.wait_op(resp["operation"]["id"].as_str().expect("op id")).await
    }

    /// Like [`TestEnv::run_op`], and asserts the operation Succeeded.
    pub async fn run_ok(&self, path: &str, body: Option<Value>) -> Value {
        let op = self.run_op(path, body).await;
        self.assert_succeeded(&op);
        op
    }

    pub fn assert_succeeded(&self, op: &Value) {
        assert_eq!(op["status"], "Succeeded", "operation did not succeed: {op:#}\n{}", self.log_tails());
    }

    /// `GET /clusters/{name}`, asserting 200.
    pub async fn cluster(&self, name: &str) -> Value {
        let (status, body) = self.get(&format!("/clusters/{name}")).await;
        assert_eq!(status, StatusCode::OK, "GET /clusters/{name}: {body:#}");
        body
    }
}

/// The instances of `role` in `cluster`, by ordinal.
pub fn role_instances(cluster: &Value, role: &str) -> Vec<Value> {
    let mut v: Vec<Value> =
        cluster["instances"].as_array().expect("instances").iter().filter(|i| i["role"] == role).cloned().collect();
    v.sort_by_key(|i| i["ordinal"].as_u64());
    v
}

/// Every instance of `cluster`, by role then ordinal.
pub fn all_instances(cluster: &Value) -> Vec<Value> {
    let mut v: Vec<Value> = cluster["instances"].as_array().expect("instances").clone();
    v.sort_by_key(|i| (i["role"].as_str().unwrap_or_default().to_string(), i["ordinal"].as_u64()));
    v
}

pub fn id_of(instance: &Value) -> String {
    instance["id"].as_str().expect("instance id").to_string()
}

/// The instance's pid from the API; panics when it has none.
pub fn pid_of(instance: &Value) -> u32 {
    instance["pid"].as_u64().unwrap_or_else(|| panic!("instance without a pid: {instance:#}")) as u32
}

pub fn dir_of(instance: &Value) -> std::path::PathBuf {
    std::path::PathBuf::from(instance["dir"].as_str().expect("instance dir"))
}

/// The `(status code, error code)` of an error answer, for assertions.
pub fn error_code(body: &Value) -> &str {
    body["error"]["code"].as_str().unwrap_or("<no error code>")
}
