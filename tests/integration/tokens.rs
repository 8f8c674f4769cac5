//! API tokens on a real master: no token or a wrong one gets `401` on every
//! route; a token created through the API works, is listed without its
//! secret, survives a restart, and stops working the moment it is revoked;
//! the store holds the secret's hash, never the secret; `flotilla token`
//! does the same from a terminal, with exit codes scripts can rely on.

use std::path::Path;
use std::process::Command;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use sha2::Digest;

use crate::common::TestEnv;
use crate::common::env::client_with_token;

/// Every route of the master's own table (`http::API_ROUTES`, so a new
/// route is covered the day it is added), with made-up names and ids, but
/// the ones open without a token; and a path that is no route at all,
/// refused for the token before it is found missing.
fn routes() -> Vec<(String, String)> {
    let open = ["/health", "/openapi.json"];
    let mut out: Vec<(String, String)> = flotilla::http::API_ROUTES
        .iter()
        .filter(|(path, _)| !open.contains(path))
        .flat_map(|(path, methods)| {
            let path = ["{name}", "{version}", "{role}", "{id}"]
                .iter()
                .zip(["demo", "1.0.0", "server", "x1"])
                .fold(path.to_string(), |p, (from, to)| p.replace(from, to));
            methods.iter().map(move |(m, _)| (m.to_uppercase(), path.clone()))
        })
        .collect();
    assert!(out.len() >= 25, "the route table: {out:?}");
    out.push(("GET".into(), "/no-such-route".into()));
    out
}

async fn call(client: &reqwest::Client, env: &TestEnv, method: &str, path: &str) -> (StatusCode, Value) {
    let method = Method::from_bytes(method.as_bytes()).expect("method");
    let resp = client
        .request(method, format!("{}{path}", env.api))
        .json(&json!({}))
        .send()
        .await
        .unwrap_or_else(|e| panic!("{path}: {e}"));
    let status = resp.status();
    let www = resp.headers().get("www-authenticate").map(|v| v.to_str().unwrap_or_default().to_string());
    let mut body: Value = resp.json().await.unwrap_or(Value::Null);
    if let Some(w) = www {
        body["www-authenticate"] = json!(w);
    }
    (status, body)
}

fn unauthorized(status: StatusCode, body: &Value, what: &str) {
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{what}: {body:#}");
    assert_eq!(body["error"]["code"], "unauthorized", "{what}: {body:#}");
    assert!(body["error"]["request_id"].is_string(), "{what}: the usual error body: {body:#}");
    assert_eq!(body["www-authenticate"], "Bearer realm=\"flotilla\"", "{what}: {body:#}");
}

/// Every file of the store, concatenated.
fn store_bytes(dir: &Path) -> Vec<u8> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).expect("the store's dir") {
        let p = e.expect("entry").path();
        if p.is_file() {
            out.extend(std::fs::read(&p).unwrap_or_default());
        }
    }
    out
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_needs_a_valid_token_and_a_revoked_one_stops_at_once() {
    let mut env = TestEnv::start_sim("tokens", &[], 1).await;
    let none = reqwest::Client::builder().no_proxy().build().unwrap();
    // The right id with its secret's last digit changed.
    let (head, last) = env.token.split_at(env.token.len() - 1);
    let wrong = client_with_token(&format!("{head}{}", if last == "0" { '1' } else { '0' }));
    let junk = client_with_token("not-a-token");
    for (method, path) in routes() {
        for (client, which) in [(&none, "no token"), (&wrong, "a wrong token"), (&junk, "junk")] {
            let (status, body) = call(client, &env, &method, &path).await;
            unauthorized(status, &body, &format!("{method} {path} with {which}"));
        }
    }
    // Health is open by default (load balancers), with the token or without.
    let (status, body) = call(&none, &env, "GET", "/health").await;
    assert_eq!(status, StatusCode::OK, "{body:#}");
    // The master's own token gets through.
    let (status, body) = env.get("/clusters").await;
    assert_eq!(status, StatusCode::OK, "{body:#}");

    // A new token: answered whole once, listed without its secret.
    let (status, body) = env.post("/tokens", json!({"name": "ci"})).await;
    assert_eq!(status, StatusCode::CREATED, "{body:#}");
    let ci = body["secret"].as_str().expect("the token").to_string();
    let ci_id = body["token"]["id"].as_str().expect("its id").to_string();
    assert!(ci.starts_with(&format!("flt_{ci_id}_")), "{ci}");
    let ci_client = client_with_token(&ci);
    let (status, _) = call(&ci_client, &env, "GET", "/nodes").await;
    assert_eq!(status, StatusCode::OK);
    let (_, list) = env.get("/tokens").await;
    let names: Vec<&str> = list["tokens"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(names.len(), 2, "{list:#}");
    assert!(names.contains(&"initial") && names.contains(&"ci"), "{list:#}");
    assert!(!list.to_string().contains(&ci[ci.len() - 64..]), "a list shows no secret: {list:#}");
    let (status, body) = env.post("/tokens", json!({"name": "Not A Name"})).await;
    assert_eq!((status, body["error"]["code"].as_str()), (StatusCode::BAD_REQUEST, Some("invalid_name")));

    // The store has the hash of the secret, not the secret.
    let secret = &ci[ci.len() - 64..];
    let hash: [u8; 32] = sha2::Sha256::digest(secret.as_bytes()).into();
    let bytes = store_bytes(&env.master_dir().join("db"));
    assert!(contains(&bytes, &hash), "the token's hash is in the store (else this check reads the wrong files)");
    assert!(!contains(&bytes, secret.as_bytes()), "the secret itself must not be stored");
    assert!(!contains(&bytes, &env.token.as_bytes()[env.token.len() - 64..]), "nor the first token's");

    // Tokens survive a restart.
    env.restart_master().await;
    let (status, _) = call(&ci_client, &env, "GET", "/nodes").await;
    assert_eq!(status, StatusCode::OK, "the token works after a restart");

    // Revoked: refused on the very next request, and after a restart.
    let (status, body) = env.delete(&format!("/tokens/{ci_id}")).await;
    assert_eq!(status, StatusCode::OK, "{body:#}");
    let (status, body) = call(&ci_client, &env, "GET", "/nodes").await;
    unauthorized(status, &body, "a revoked token");
    env.restart_master().await;
    let (status, body) = call(&ci_client, &env, "GET", "/nodes").await;
    unauthorized(status, &body, "a revoked token after a restart");

    // The last token stays: without one nobody could make another.
    let first_id = env.token.split('_').nth(1).unwrap().to_string();
    let (status, body) = env.delete(&format!("/tokens/{first_id}")).await;
    assert_eq!((status, body["error"]["code"].as_str()), (StatusCode::CONFLICT, Some("last_token")), "{body:#}");
    let (status, _) = env.get("/nodes").await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_needs_a_token_when_open_health_is_off() {
    let env = TestEnv::start_sim("tokens-health", &[("FLOTILLA_MASTER_OPEN_HEALTH", "false")], 1).await;
    let none = reqwest::Client::builder().no_proxy().build().unwrap();
    let (status, body) = call(&none, &env, "GET", "/health").await;
    unauthorized(status, &body, "health with open_health = false");
    let (status, body) = env.get("/health").await;
    assert_eq!(status, StatusCode::OK, "{body:#}");
}

/// `flotilla token ...` against `env`, with `envs`; (exit code, stdout, stderr).
fn cli(env: &TestEnv, args: &[&str], envs: &[(&str, &str)]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args(args)
        .env_remove("FLOTILLA_API")
        .env_remove("FLOTILLA_TOKEN")
        .envs(envs.iter().copied())
        .current_dir(env.master_dir())
        .output()
        .expect("run flotilla");
    let text = |b: &[u8]| String::from_utf8_lossy(b).to_string();
    (out.status.code().unwrap_or(-1), text(&out.stdout), text(&out.stderr))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_cli_creates_lists_and_revokes_with_exit_codes() {
    let env = TestEnv::start_sim("tokens-cli", &[], 1).await;
    let base = env.api.trim_end_matches("/api/v1").to_string();
    let auth = [("FLOTILLA_API", base.as_str()), ("FLOTILLA_TOKEN", env.token.as_str())];

    let (code, out, err) = cli(&env, &["token", "create", "alice"], &auth);
    assert_eq!(code, 0, "{err}");
    let alice = out.trim().to_string();
    assert!(alice.starts_with("flt_") && err.contains("alice"), "stdout {out:?} stderr {err:?}");
    let alice_id = alice.split('_').nth(1).unwrap();

    // With a scope: `--scope read`; without one, admin.
    let (code, out, err) = cli(&env, &["token", "create", "viewer", "--scope", "read"], &auth);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("viewer, scope read"), "{err}");
    let viewer = out.trim().to_string();
    let viewer_id = viewer.split('_').nth(1).unwrap();
    let (code, _, err) = cli(&env, &["token", "create", "root", "--scope", "root"], &auth);
    assert_eq!(code, 2, "an unknown scope is a usage error: {err}");
    assert!(err.contains("read") && err.contains("operate") && err.contains("admin"), "{err}");

    let (code, out, err) = cli(&env, &["token", "ls"], &auth);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("ID") && out.lines().next().unwrap().contains("SCOPE"), "{out}");
    let row =
        |id: &str| out.lines().find(|l| l.starts_with(id)).unwrap_or_default().split_whitespace().collect::<Vec<_>>();
    assert_eq!(row(alice_id)[..3], [alice_id, "alice", "admin"], "{out}");
    assert_eq!(row(viewer_id)[..3], [viewer_id, "viewer", "read"], "{out}");
    let (code, out, _) = cli(&env, &["token", "ls", "--json"], &auth);
    assert_eq!(code, 0);
    let v: Value = serde_json::from_str(&out).expect("--json is JSON");
    let scopes: Vec<(&str, &str)> = v["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["name"].as_str().unwrap(), t["scope"].as_str().unwrap()))
        .collect();
    assert_eq!(scopes.len(), 3, "{v:#}");
    for expected in [("initial", "admin"), ("alice", "admin"), ("viewer", "read")] {
        assert!(scopes.contains(&expected), "{expected:?} in {scopes:?}");
    }

    // A read token reads, but makes no token (nor lists them): 403, exit 3.
    let as_viewer = [("FLOTILLA_API", base.as_str()), ("FLOTILLA_TOKEN", viewer.as_str())];
    assert_eq!(cli(&env, &["node", "ls"], &as_viewer).0, 0);
    let (code, _, err) = cli(&env, &["token", "create", "sneaky", "--scope", "read"], &as_viewer);
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("forbidden") && err.contains("needs the `admin` scope; this token has `read`"), "{err}");
    let (code, _, err) = cli(&env, &["token", "ls"], &as_viewer);
    assert_eq!(code, 3, "{err}");

    // Alice's token works for the CLI too; then she is revoked.
    let as_alice = [("FLOTILLA_API", base.as_str()), ("FLOTILLA_TOKEN", alice.as_str())];
    assert_eq!(cli(&env, &["token", "ls"], &as_alice).0, 0);
    let (code, _, err) = cli(&env, &["token", "revoke", alice_id], &auth);
    assert_eq!(code, 0, "{err}");

    // Exit codes: refused token 3, unreachable 3, a refused request 1, usage 2.
    let (code, _, err) = cli(&env, &["token", "ls"], &as_alice);
    assert_eq!(code, 3, "a revoked token: {err}");
    assert!(err.contains("unauthorized"), "{err}");
    let (code, _, err) =
        cli(&env, &["token", "ls"], &[("FLOTILLA_API", "http://127.0.0.1:1"), ("FLOTILLA_TOKEN", &env.token)]);
    assert_eq!(code, 3, "unreachable: {err}");
    let (code, _, err) = cli(&env, &["token", "revoke", "000000000000"], &auth);
    assert_eq!(code, 1, "unknown token: {err}");
    assert!(err.contains("not_found"), "{err}");
    let (code, _, _) = cli(&env, &["token", "frobnicate"], &auth);
    assert_eq!(code, 2, "usage");
    // Without flags or environment, and no endpoints file here: usage.
    let (code, _, err) = cli(&env, &["token", "ls"], &[]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("endpoints.json"), "{err}");
}
