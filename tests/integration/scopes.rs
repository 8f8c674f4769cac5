//! Scoped API tokens on a real master: every route the master serves,
//! as its own API description lists them, asked with a token of each
//! scope; a token below the route's scope is refused `403` naming the
//! scope needed, one at or above it gets through (to whatever the made-up
//! names then get: `400`, `404`, ...). The scopes expected are written
//! out here ([`POLICY`]), apart from the route table the master enforces,
//! so a wrong line in that table fails this test, and so does a route the
//! master serves without a decision here. Then: minting (only `admin`
//! makes tokens; the scope a body names, or `admin`; unknown scopes and
//! fields refused), and an `operate` token reading a real instance's log
//! but uploading no package.

use std::collections::BTreeSet;
use std::time::Duration;

use flotilla::scope::Scope::{self, Admin, Operate, Read};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::common::env::client_with_token;
use crate::common::{PackageBuilder, TestEnv, id_of, role_instances};

/// What each route needs, as the README's "API tokens" says: every GET
/// that shows state `read`, instance logs and the verbs on clusters and
/// instances `operate`, packages, tokens, nodes, join tokens and trust
/// `admin`. (Health and the description are open; a token of any scope
/// gets them.)
const POLICY: &[(&str, &str, Scope)] = &[
    ("GET", "/api/v1/health", Read),
    ("GET", "/api/v1/openapi.json", Read),
    ("GET", "/metrics", Read),
    ("GET", "/api/v1/whoami", Read),
    ("GET", "/api/v1/actors", Read),
    ("POST", "/api/v1/actors/{kind}/{id}/kill", Admin),
    ("POST", "/api/v1/actors/{kind}/{id}/restart", Admin),
    ("GET", "/api/v1/events", Read),
    ("GET", "/api/v1/nodes", Read),
    ("GET", "/api/v1/nodes/{id}", Read),
    ("GET", "/api/v1/operations", Read),
    ("GET", "/api/v1/operations/{id}", Read),
    ("GET", "/api/v1/packages", Read),
    ("GET", "/api/v1/packages/{name}/{version}", Read),
    ("GET", "/api/v1/clusters", Read),
    ("GET", "/api/v1/clusters/{name}", Read),
    ("GET", "/api/v1/clusters/{name}/instances", Read),
    ("GET", "/api/v1/clusters/{name}/instances/{id}/logs", Operate),
    ("POST", "/api/v1/clusters", Operate),
    ("DELETE", "/api/v1/clusters/{name}", Operate),
    ("POST", "/api/v1/clusters/{name}/start", Operate),
    ("POST", "/api/v1/clusters/{name}/stop", Operate),
    ("POST", "/api/v1/clusters/{name}/restart", Operate),
    ("POST", "/api/v1/clusters/{name}/scale", Operate),
    ("PATCH", "/api/v1/clusters/{name}/config", Operate),
    ("POST", "/api/v1/clusters/{name}/upgrade", Operate),
    ("PATCH", "/api/v1/clusters/{name}/roles/{role}", Operate),
    ("POST", "/api/v1/clusters/{name}/instances/{id}/start", Operate),
    ("POST", "/api/v1/clusters/{name}/instances/{id}/stop", Operate),
    ("POST", "/api/v1/clusters/{name}/instances/{id}/restart", Operate),
    ("POST", "/api/v1/clusters/{name}/instances/{id}/replace", Operate),
    ("GET", "/api/v1/pools/{name}/hosts/{host}/log", Admin),
    ("PUT", "/api/v1/packages/{name}/{version}", Admin),
    ("DELETE", "/api/v1/packages/{name}/{version}", Admin),
    ("POST", "/api/v1/tokens", Admin),
    ("GET", "/api/v1/tokens", Admin),
    ("DELETE", "/api/v1/tokens/{id}", Admin),
    ("POST", "/api/v1/join-tokens", Admin),
    ("GET", "/api/v1/join-tokens", Admin),
    ("DELETE", "/api/v1/join-tokens/{id}", Admin),
    ("POST", "/api/v1/nodes/{id}/revoke", Admin),
    ("POST", "/api/v1/nodes/{id}/cordon", Admin),
    ("POST", "/api/v1/nodes/{id}/uncordon", Admin),
    ("POST", "/api/v1/nodes/{id}/hold", Admin),
    ("POST", "/api/v1/nodes/{id}/remove", Admin),
    ("GET", "/api/v1/pools", Read),
    ("GET", "/api/v1/node-requests", Read),
    ("POST", "/api/v1/node-requests", Admin),
];

/// A client per scope, each with its own fresh token (made by the first,
/// `admin`, token), and that token's id.
async fn scoped_clients(env: &TestEnv) -> Vec<(Scope, reqwest::Client, String)> {
    let mut out = Vec::new();
    for scope in Scope::ALL {
        let (status, body) = env.post("/tokens", json!({"name": format!("walk-{scope}"), "scope": scope})).await;
        assert_eq!(status, StatusCode::CREATED, "{body:#}");
        assert_eq!(body["token"]["scope"], scope.as_str(), "{body:#}");
        let id = body["token"]["id"].as_str().expect("an id").to_string();
        out.push((scope, client_with_token(body["secret"].as_str().expect("a secret")), id));
    }
    out
}

/// `method url` with a JSON body no route takes (an unknown field is
/// refused before anything is done), the answer's body not waited for
/// (the event stream never ends).
async fn ask(client: &reqwest::Client, method: &str, url: &str) -> (StatusCode, Value) {
    let method = Method::from_bytes(method.as_bytes()).expect("method");
    let resp = client
        .request(method.clone(), url)
        .json(&json!({"scope_walk": true}))
        .send()
        .await
        .unwrap_or_else(|e| panic!("{method} {url}: {e}"));
    let status = resp.status();
    if status.is_success() {
        return (status, Value::Null);
    }
    let body = tokio::time::timeout(Duration::from_secs(10), resp.json::<Value>()).await;
    (status, body.ok().and_then(Result::ok).unwrap_or(Value::Null))
}

/// `403 forbidden`, saying what needed `needed` and that the token has `has`.
fn forbidden(status: StatusCode, body: &Value, what: &str, needed: Scope, has: Scope) {
    assert_eq!(status, StatusCode::FORBIDDEN, "{what} with a {has} token: {body:#}");
    assert_eq!(body["error"]["code"], "forbidden", "{what}: {body:#}");
    assert!(body["error"]["request_id"].is_string(), "{what}: the usual error body: {body:#}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    let says = format!("needs the `{needed}` scope; this token has `{has}`");
    assert!(message.ends_with(&says), "{what}: {message:?} should end {says:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_with_every_scope_is_let_through_or_refused_as_its_scope_says() {
    let env = TestEnv::start_sim("scopes-walk", &[], 1).await;
    let base = env.api.trim_end_matches("/api/v1").to_string();

    // Every route the master serves, from the description it serves (which
    // a unit test holds to its route table), and the scope it documents.
    let (status, doc) = env.get("/openapi.json").await;
    assert_eq!(status, StatusCode::OK);
    let mut served = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for (method, op) in item.as_object().expect("operations") {
            let documented = op["security"].as_array().and_then(|s| s.iter().find_map(|r| r["bearer"][0].as_str()));
            served.insert((method.to_uppercase(), path.clone(), documented.map(str::to_string)));
        }
    }
    let decided: BTreeSet<(String, String)> = POLICY.iter().map(|(m, p, _)| (m.to_string(), p.to_string())).collect();
    let routes: BTreeSet<(String, String)> = served.iter().map(|(m, p, _)| (m.clone(), p.clone())).collect();
    let undecided: Vec<_> = routes.difference(&decided).collect();
    let stale: Vec<_> = decided.difference(&routes).collect();
    assert!(undecided.is_empty(), "served without a scope decision in POLICY (add one): {undecided:?}");
    assert!(stale.is_empty(), "in POLICY but not served: {stale:?}");
    for (method, path, documented) in &served {
        let (_, _, scope) = POLICY.iter().find(|(m, p, _)| m == method && p == path).expect("decided above");
        if path != "/api/v1/openapi.json" {
            assert_eq!(documented.as_deref(), Some(scope.as_str()), "the scope {method} {path} documents");
        }
    }
    assert!(POLICY.len() >= 37, "{} routes", POLICY.len());

    let clients = scoped_clients(&env).await;
    let (_, tokens_before) = env.get("/tokens").await;
    let (_, join_before) = env.get("/join-tokens").await;

    // Made-up names and ids: nothing of this master is touched (and the
    // token revoked, `000000000000`, is none of the walk's).
    let fill = |path: &str| {
        path.replace("{name}", "no-such-thing")
            .replace("{version}", "9.9.9")
            .replace("{role}", "server")
            .replace("{kind}", "no-such-kind")
            .replace("{id}", "000000000000")
    };
    let mut asked = 0;
    for (method, path, needed) in POLICY {
        let url = format!("{base}{}", fill(path));
        for (has, client, _) in &clients {
            let (status, body) = ask(client, method, &url).await;
            let what = format!("{method} {path}");
            if has.allows(*needed) {
                let refused = [StatusCode::UNAUTHORIZED, StatusCode::FORBIDDEN].contains(&status);
                assert!(!refused, "{what} with a {has} token (needs {needed}): {status} {body:#}");
            } else {
                forbidden(status, &body, &what, *needed, *has);
                let message = body["error"]["message"].as_str().unwrap_or_default();
                assert!(message.starts_with(&what), "{what}: the message names the route: {message:?}");
            }
            asked += 1;
        }
    }
    assert_eq!(asked, POLICY.len() * 3);

    // A request no route matches needs admin (it gets the router's 404 or
    // 405 then); a path spelled with percent-escapes is the route the router
    // takes it to, and needs that route's scope.
    let [(_, read, _), (_, operate, _), (_, admin, _)] = &clients[..] else { panic!("three clients") };
    for (method, path, admin_gets) in [
        ("GET", "/api/v1/no-such-route", StatusCode::NOT_FOUND),
        ("POST", "/api/v1/nodes", StatusCode::METHOD_NOT_ALLOWED),
    ] {
        let url = format!("{base}{path}");
        let (status, body) = ask(read, method, &url).await;
        forbidden(status, &body, &format!("{method} {path}"), Admin, Read);
        assert_eq!(ask(admin, method, &url).await.0, admin_gets, "{method} {path} with admin");
    }
    let escaped = format!("{}/clust%65rs", env.api);
    assert_eq!(ask(read, "GET", &escaped).await.0, StatusCode::OK, "the router takes clust%65rs to /clusters");
    let (status, body) = ask(read, "POST", &escaped).await;
    forbidden(status, &body, "POST /api/v1/clust%65rs", Operate, Read);
    assert_eq!(ask(operate, "POST", &escaped).await.0, StatusCode::BAD_REQUEST, "the walk's body is refused");

    // Nothing changed: no cluster, token or join token made or removed, and
    // each walk token still works, with its scope.
    let (_, clusters) = env.get("/clusters").await;
    assert_eq!(clusters["total"], 0, "{clusters:#}");
    assert_eq!(env.get("/tokens").await.1, tokens_before);
    assert_eq!(env.get("/join-tokens").await.1, join_before);
    for (scope, client, id) in &clients {
        let resp = client.get(format!("{}/whoami", env.api)).send().await.expect("whoami");
        assert_eq!(resp.status(), StatusCode::OK);
        let me: Value = resp.json().await.expect("JSON");
        assert_eq!(
            (me["token"]["id"].as_str(), me["token"]["scope"].as_str()),
            (Some(id.as_str()), Some(scope.as_str()))
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_admin_makes_tokens_of_the_scope_asked_and_unknown_scopes_are_refused() {
    let env = TestEnv::start_sim("scopes-mint", &[], 1).await;
    let clients = scoped_clients(&env).await;
    let post = |client: &reqwest::Client, body: Value| {
        let req = client.post(format!("{}/tokens", env.api)).json(&body);
        async move {
            let resp = req.send().await.expect("POST /tokens");
            (resp.status(), resp.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    // A read or operate token makes none, not even of its own scope.
    for (has, client, _) in &clients[..2] {
        for scope in Scope::ALL {
            let (status, body) = post(client, json!({"name": "sneaky", "scope": scope})).await;
            forbidden(status, &body, "POST /api/v1/tokens", Admin, *has);
        }
    }
    // An admin token makes each scope; without one, admin; a dry run says which.
    let (_, admin, _) = &clients[2];
    for scope in Scope::ALL {
        let (status, body) = post(admin, json!({"name": format!("made-{scope}"), "scope": scope})).await;
        assert_eq!((status, body["token"]["scope"].as_str()), (StatusCode::CREATED, Some(scope.as_str())), "{body:#}");
        let made = client_with_token(body["secret"].as_str().unwrap());
        let me: Value = made.get(format!("{}/whoami", env.api)).send().await.unwrap().json().await.unwrap();
        assert_eq!(me["token"]["scope"], scope.as_str(), "{me:#}");
    }
    let (status, body) = post(admin, json!({"name": "plain"})).await;
    assert_eq!((status, body["token"]["scope"].as_str()), (StatusCode::CREATED, Some("admin")), "{body:#}");
    let resp = admin.post(format!("{}/tokens?dry_run=true", env.api)).json(&json!({"name": "dry", "scope": "read"}));
    let dry: Value = resp.send().await.unwrap().json().await.unwrap();
    assert_eq!((dry["dry_run"].as_bool(), dry["scope"].as_str()), (Some(true), Some("read")), "{dry:#}");

    // An unknown scope: 400, naming the scopes there are; an unknown field: 400.
    let (status, body) = post(admin, json!({"name": "x", "scope": "root"})).await;
    assert_eq!((status, body["error"]["code"].as_str()), (StatusCode::BAD_REQUEST, Some("invalid_json")), "{body:#}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("root") && message.contains("`read`, `operate`, `admin`"), "{message}");
    let (status, body) = post(admin, json!({"name": "x", "scope": "read", "role": "admin"})).await;
    assert_eq!((status, body["error"]["code"].as_str()), (StatusCode::BAD_REQUEST, Some("invalid_json")), "{body:#}");
    assert!(body["error"]["message"].as_str().unwrap_or_default().contains("unknown field"), "{body:#}");

    // Every token is listed with its scope.
    let (_, list) = env.get("/tokens").await;
    let mut scopes: Vec<(String, String)> = list["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["name"].as_str().unwrap().to_string(), t["scope"].as_str().unwrap().to_string()))
        .collect();
    scopes.sort();
    let expected = [
        ("initial", "admin"),
        ("made-admin", "admin"),
        ("made-operate", "operate"),
        ("made-read", "read"),
        ("plain", "admin"),
        ("walk-admin", "admin"),
        ("walk-operate", "operate"),
        ("walk-read", "read"),
    ];
    assert_eq!(scopes, expected.map(|(n, s)| (n.to_string(), s.to_string())), "{list:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operate_token_reads_a_log_but_uploads_no_package() {
    let env = TestEnv::start("scopes-logs").await;
    let talk = PackageBuilder::new("talk", "1.0.0")
        .spec(super::instance_logs::SPEC)
        .script("bin/talk.sh", "echo hello from talk\nexec sleep 1000\n");
    env.upload(&talk).await;
    let c = env.create_active(json!({"name": "talk", "package": {"name": "talk", "version": "1.0.0"}})).await;
    let id = id_of(&role_instances(&c, "svc")[0]);
    let clients = scoped_clients(&env).await;
    let [(_, read, _), (_, operate, _), _] = &clients[..] else { panic!("three clients") };
    let logs = format!("{}/clusters/talk/instances/{id}/logs", env.api);

    // operate reads it (once the process has written it).
    let text = env
        .until(10, "the log read with an operate token", async || {
            let resp = operate.get(&logs).send().await.map_err(|e| e.to_string())?;
            let (status, text) = (resp.status(), resp.text().await.map_err(|e| e.to_string())?);
            if status == StatusCode::OK && text.contains("hello from talk") {
                Ok(text)
            } else {
                Err(format!("{status} {text}"))
            }
        })
        .await;
    assert_eq!(text, "hello from talk\n");
    // read does not: logs show what a component prints.
    let (status, body) = ask(read, "GET", &logs).await;
    forbidden(status, &body, "GET /api/v1/clusters/{name}/instances/{id}/logs", Operate, Read);
    assert!(!body.to_string().contains("hello"), "{body:#}");

    // operate uploads no package (a real tarball, which admin could).
    let v2 = PackageBuilder::new("talk", "2.0.0")
        .spec(&super::instance_logs::SPEC.replace("1.0.0", "2.0.0"))
        .script("bin/talk.sh", "exec sleep 1000\n");
    let url = format!("{}/packages/talk/2.0.0", env.api);
    let resp = operate.put(&url).body(v2.build()).send().await.expect("PUT");
    let status = resp.status();
    let body: Value = resp.json().await.unwrap_or(Value::Null);
    forbidden(status, &body, "PUT /api/v1/packages/{name}/{version}", Admin, Operate);
    assert_eq!(env.get("/packages/talk/2.0.0").await.0, StatusCode::NOT_FOUND, "nothing was stored");
    // The same upload with the first (admin) token is taken.
    assert_eq!(env.upload(&v2).await["version"], "2.0.0");
}
