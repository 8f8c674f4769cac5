//! Bad requests are refused with the right status and stable code, and
//! change nothing: no cluster, no package, no operation appears.

use serde_json::{Value, json};

use crate::common::http::error_code;
use crate::common::{PackageBuilder, TestEnv};

const SPEC: &str = r#"
[component]
name = "kv"
version = "1.0.0"

[config]
greeting = { type = "string", default = "hi" }
limit = { type = "int", default = 10, min = 1, max = 100 }

[[roles]]
name = "store"
count = { min = 1, max = 5 }
start = ["bin/start.sh"]
stop_grace = "2s"
"#;

/// Clusters, packages and operations, as the API lists them.
async fn snapshot(env: &TestEnv) -> (Value, Value, Value) {
    let (_, c) = env.get("/clusters").await;
    let (_, p) = env.get("/packages").await;
    let (_, o) = env.get("/operations").await;
    (c, p, o)
}

fn create(name: &str, package: &str) -> Value {
    json!({"name": name, "package": {"name": package, "version": "1.0.0"}})
}

#[tokio::test]
async fn bad_requests_are_refused_and_change_nothing() {
    let env = TestEnv::start("bad-inputs").await;
    env.upload(&PackageBuilder::new("kv", "1.0.0").spec(SPEC).script("bin/start.sh", "exec sleep 100000\n")).await;
    let before = snapshot(&env).await;
    assert_eq!(before.1["packages"].as_array().map(Vec::len), Some(1), "{:#}", before.1);

    let mut unknown_field = create("ok-name", "kv");
    unknown_field["colour"] = json!("blue");
    let mut too_many = create("ok-name", "kv");
    too_many["roles"] = json!({"store": {"count": 9}});
    let mut wrong_type = create("ok-name", "kv");
    wrong_type["config"] = json!({"limit": "ten"});
    // Refused on the new cluster's own thread, where its instances are placed.
    let mut pinned_unknown = create("ok-name", "kv");
    pinned_unknown["roles"] = json!({"store": {"count": 1, "nodes": ["nowhere"]}});
    let cases: Vec<(&str, Value, u16, &str, Option<&str>)> = vec![
        ("unknown package", create("ok-name", "nope"), 404, "not_found", None),
        ("bad cluster name", create("Bad_Name", "kv"), 400, "invalid_name", None),
        ("unknown field", unknown_field, 400, "invalid_json", Some("colour")),
        ("count over max", too_many, 422, "spec_violation", None),
        ("config of the wrong type", wrong_type, 422, "spec_violation", Some("limit")),
        ("a pinned node unknown", pinned_unknown, 422, "spec_violation", Some("nowhere")),
    ];
    for (what, body, status, code, mentions) in cases {
        let (got, resp) = env.post("/clusters", body.clone()).await;
        assert_eq!(
            (got.as_u16(), error_code(&resp)),
            (status, code),
            "{what}: POST /clusters {body} answered {resp:#}"
        );
        assert!(resp["error"]["request_id"].as_str().is_some_and(|r| !r.is_empty()), "{what}: no request_id: {resp:#}");
        if let Some(word) = mentions {
            let msg = resp["error"]["message"].as_str().unwrap_or_default();
            assert!(msg.contains(word), "{what}: the message does not name {word:?}: {msg:?}");
        }
    }

    // A package without component.toml, and a bad package name.
    let no_spec = PackageBuilder::new("nospec", "1.0.0").script("bin/start.sh", "exec sleep 100000\n");
    let (got, resp) = env.put_bytes("/packages/nospec/1.0.0", no_spec.build()).await;
    assert_eq!((got.as_u16(), error_code(&resp)), (400, "invalid_package"), "{resp:#}");
    let pkg = PackageBuilder::new("kv", "1.0.0").spec(SPEC).script("bin/start.sh", "exec sleep 100000\n");
    let (got, resp) = env.put_bytes("/packages/Bad_Name/1.0.0", pkg.build()).await;
    assert_eq!((got.as_u16(), error_code(&resp)), (400, "invalid_name"), "{resp:#}");

    assert_eq!(snapshot(&env).await, before, "a refused request changed the state");
}

/// `n` bytes gzip cannot shrink (xorshift noise).
fn noise(n: usize) -> Vec<u8> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[tokio::test]
async fn upload_over_the_cap_is_413() {
    let env = TestEnv::start_with("upload-cap", &[("FLOTILLA_MASTER_MAX_UPLOAD_BYTES", "100000")]).await;
    let pkg = PackageBuilder::new("big", "1.0.0").spec(&SPEC.replace("\"kv\"", "\"big\"")).file(
        "blob.bin",
        0o644,
        noise(200_000),
    );
    let bytes = pkg.build();
    assert!(bytes.len() > 190_000, "the package is only {} bytes", bytes.len());
    let (got, resp) = env.put_bytes("/packages/big/1.0.0", bytes).await;
    assert_eq!((got.as_u16(), error_code(&resp)), (413, "too_large"), "{resp:#}");
    let (_, list) = env.get("/packages").await;
    assert_eq!(list["packages"], json!([]), "{list:#}");

    // Under the cap, the same master takes it.
    let small = PackageBuilder::new("kv", "1.0.0").spec(SPEC).script("bin/start.sh", "exec sleep 100000\n");
    env.upload(&small).await;
}

/// Writes `PUT /api/v1/packages/{name}/1.0.0` by hand: the headers
/// announce `bytes` whole, then `send` writes it in its own time; the
/// answer's status line and body.
async fn raw_upload(
    env: &TestEnv,
    name: &str,
    bytes: &[u8],
    send: impl AsyncFnOnce(&mut tokio::net::TcpStream, &[u8]),
) -> (u16, Value) {
    raw_request(env, &format!("PUT /api/v1/packages/{name}/1.0.0"), "application/gzip", bytes, send).await
}

/// `request` (method and path) by hand, as [`raw_upload`] does.
async fn raw_request(
    env: &TestEnv,
    request: &str,
    content_type: &str,
    bytes: &[u8],
    send: impl AsyncFnOnce(&mut tokio::net::TcpStream, &[u8]),
) -> (u16, Value) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let host = env.api.trim_start_matches("http://").split('/').next().unwrap().to_string();
    let mut tcp = tokio::net::TcpStream::connect(&host).await.unwrap();
    let head = format!(
        "{request} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {}\r\n\
         Content-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        env.token,
        bytes.len()
    );
    tcp.write_all(head.as_bytes()).await.unwrap();
    send(&mut tcp, bytes).await;
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(std::time::Duration::from_secs(20), tcp.read_to_end(&mut answer)).await;
    let text = String::from_utf8_lossy(&answer).to_string();
    let status = text.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let body = text.split("\r\n\r\n").nth(1).unwrap_or_default();
    // The body may be chunked: the JSON object is what lies between the braces.
    let json = body.find('{').and_then(|a| body.rfind('}').map(|b| &body[a..=b])).unwrap_or("null");
    (status, serde_json::from_str(json).unwrap_or(Value::Null))
}

/// A client that stops sending, or trickles, is refused within the
/// configured bounds, and the version's upload slot is free at once: the
/// same version then uploads. Before, a trickle held the slot (`409
/// upload_in_progress` for everyone else) for as long as it went on.
#[tokio::test]
async fn a_stalled_or_trickling_upload_is_refused_and_frees_its_slot() {
    let env = TestEnv::start_with(
        "upload-slow",
        &[("FLOTILLA_MASTER_UPLOAD_IDLE_TIMEOUT", "1s"), ("FLOTILLA_MASTER_UPLOAD_MIN_RATE", "50000")],
    )
    .await;
    // 4 kB gzip cannot shrink: the trickle below takes seconds.
    let pkg = PackageBuilder::new("kv", "1.0.0")
        .spec(SPEC)
        .script("bin/start.sh", "exec sleep 100000\n")
        .file("blob.bin", 0o644, noise(4096))
        .build();
    assert!(pkg.len() > 4000, "the package is only {} bytes", pkg.len());

    let started = std::time::Instant::now();
    let (status, body) = raw_upload(&env, "kv", &pkg, async |tcp, bytes| {
        use tokio::io::AsyncWriteExt;
        tcp.write_all(&bytes[..bytes.len() / 2]).await.unwrap();
        // ... and nothing more: the half sent is all there is.
    })
    .await;
    assert_eq!((status, error_code(&body)), (400, "upload_stalled"), "{body:#}");
    assert!(started.elapsed() < std::time::Duration::from_secs(5), "refused only after {:?}", started.elapsed());

    let (status, body) = raw_upload(&env, "kv", &pkg, async |tcp, bytes| {
        use tokio::io::AsyncWriteExt;
        // 100 bytes every 300 ms: never idle for 1 s, but ~333 bytes/s.
        for piece in bytes.chunks(100) {
            if tcp.write_all(piece).await.is_err() {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        }
    })
    .await;
    assert_eq!((status, error_code(&body)), (400, "upload_too_slow"), "{body:#}");

    let (_, list) = env.get("/packages").await;
    assert_eq!(list["packages"], json!([]), "a refused upload left a package: {list:#}");
    env.upload(&PackageBuilder::new("kv", "1.0.0").spec(SPEC).script("bin/start.sh", "exec sleep 100000\n")).await;
}

/// A JSON body trickled a byte a second is refused once the body deadline
/// passes (`400 body_timeout`) and its connection closed; before, one such
/// client held a connection and its handler for as long as it liked. The
/// same body sent whole goes through.
#[tokio::test]
async fn a_trickled_json_body_is_refused_at_its_deadline() {
    let env = TestEnv::start_with("body-deadline", &[("FLOTILLA_MASTER_REQUEST_BODY_TIMEOUT", "2s")]).await;
    let body = br#"{"name": "t", "package": {"name": "none", "version": "1.0.0"}}"#;
    let started = std::time::Instant::now();
    let (status, answer) = raw_request(&env, "POST /api/v1/clusters", "application/json", body, async |tcp, bytes| {
        use tokio::io::AsyncWriteExt;
        for b in bytes {
            if tcp.write_all(&[*b]).await.is_err() {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        }
    })
    .await;
    let took = started.elapsed();
    assert_eq!((status, error_code(&answer)), (400, "body_timeout"), "{answer:#}");
    assert!(took < std::time::Duration::from_secs(8), "refused and closed only after {took:?}");
    let message = answer["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("request_body_timeout") && message.contains("2s"), "{message}");

    let (status, answer) = raw_request(&env, "POST /api/v1/clusters", "application/json", body, async |tcp, bytes| {
        use tokio::io::AsyncWriteExt;
        tcp.write_all(bytes).await.unwrap();
    })
    .await;
    assert_eq!((status, error_code(&answer)), (404, "not_found"), "the whole body was not read: {answer:#}");
}

/// The rest of issue 22's item 7 against a real master: a key repeated
/// inside `config` is refused (it was last-wins), `tail` above 10,000 is
/// refused, and a 10,000-character id is not echoed whole.
#[tokio::test]
async fn repeated_keys_huge_tails_and_long_ids_get_short_clear_errors() {
    let env = TestEnv::start("item-7").await;
    let body = r#"{"name": "d", "package": {"name": "kv", "version": "1.0.0"}, "config": {"x": 1, "x": 2}}"#;
    let (status, answer) =
        raw_request(&env, "POST /api/v1/clusters", "application/json", body.as_bytes(), async |tcp, bytes| {
            use tokio::io::AsyncWriteExt;
            tcp.write_all(bytes).await.unwrap();
        })
        .await;
    assert_eq!(status, 400, "{answer:#}");
    let message = answer["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("duplicate key \"x\""), "{message}");

    let (status, answer) = env.get("/clusters/nope/instances/nope-a-1-000000/logs?tail=10001").await;
    assert_eq!((status.as_u16(), error_code(&answer)), (400, "invalid_query"), "{answer:#}");
    assert!(answer["error"]["message"].as_str().unwrap_or_default().contains("at most 10000"), "{answer:#}");

    let long = "a".repeat(10_000);
    for path in [format!("/clusters/{long}"), format!("/operations/{long}"), format!("/nodes/{long}")] {
        let (status, answer) = env.get(&path).await;
        assert!(status.is_client_error(), "{status}");
        let text = answer.to_string();
        assert!(text.len() < 3000, "a {}-byte answer echoes the id: {}", text.len(), &text[..200]);
        assert!(!text.contains(&long[..2500]), "the id is echoed whole");
    }
}
