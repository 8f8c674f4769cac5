//! Secret config values: rendered into the instances' files, never shown
//! back. Everything a reader can get (the cluster, the operations, a dry
//! run, the event log, the actor view, the master's and agents' logs) is
//! searched for the secret, after a create and a reconfigure.

use std::time::Duration;

use serde_json::{Value, json};

use crate::common::sse::SseReader;
use crate::common::{PackageBuilder, TestEnv, dir_of, error_code, role_instances};

const SPEC: &str = r#"
[component]
name = "vault"
version = "1.0.0"

[config]
password = { type = "secret", description = "the admin password" }
user = { type = "string", default = "admin" }

[[roles]]
name = "svc"
count = { min = 1, max = 1 }
start = ["sh", "-c", "exec sleep 100000"]
stop_grace = "2s"

[[roles.files]]
path = "conf/auth"
template = "{{ cluster.config.user }}:{{ cluster.config.password }}"
"#;

const FIRST: &str = "first-S3CRET-7f3a9c";
const SECOND: &str = "second-S3CRET-1b2d8e";

/// Everything the API, the event log and the logs give a reader, as text.
async fn everything_shown(env: &TestEnv, name: &str) -> String {
    let mut shown = String::new();
    for path in [
        "/clusters".to_string(),
        format!("/clusters/{name}"),
        "/operations?limit=100".to_string(),
        "/actors".to_string(),
        "/nodes".to_string(),
    ] {
        let (_, body) = env.get(&path).await;
        shown.push_str(&body.to_string());
    }
    let (_, ops) = env.get("/operations?limit=100").await;
    for op in ops["operations"].as_array().expect("operations") {
        let (_, body) = env.get(&format!("/operations/{}", op["id"].as_str().unwrap())).await;
        shown.push_str(&body.to_string());
    }
    let mut events = SseReader::open(&env.client, &env.api, "?after=0", None).await;
    while let Some(e) = events.next(Duration::from_secs(2)).await {
        shown.push_str(&e.data.to_string());
    }
    shown.push_str(&env.master_log());
    for i in 1..=3 {
        shown.push_str(&env.agent_log(i));
    }
    shown
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_reaches_its_files_and_no_reader() {
    let env = TestEnv::start("iso-secrets").await;
    env.upload(&PackageBuilder::new("vault", "1.0.0").spec(SPEC)).await;
    let create = json!({"name": "v", "package": {"name": "vault", "version": "1.0.0"}, "config": {"password": FIRST}});

    // A dry run of the create shows the secret as set.
    let (status, preview) = env.post("/clusters?dry_run=true", create.clone()).await;
    assert_eq!(status.as_u16(), 200, "{preview:#}");
    assert!(!preview.to_string().contains(FIRST), "the dry run shows the secret: {preview:#}");

    let c = env.create_active(create).await;
    let i = role_instances(&c, "svc").remove(0);
    let auth = dir_of(&i).join("conf/auth");
    assert_eq!(std::fs::read_to_string(&auth).unwrap(), format!("admin:{FIRST}"));
    assert_eq!(c["config"]["password"], json!({"secret": "set"}), "{c:#}");
    assert_eq!(c["config"]["user"], "admin");

    // A secret of the wrong type is refused without being echoed.
    let (status, body) = env.patch("/clusters/v/config", json!({"config": {"password": 7_654_321}})).await;
    assert_eq!((status.as_u16(), error_code(&body)), (422, "spec_violation"), "{body:#}");
    assert!(!body.to_string().contains("7654321"), "the refusal echoes the value: {body:#}");

    // Sent back as shown, the secret is unchanged (nothing to do).
    let (status, body) = env.patch("/clusters/v/config?dry_run=true", json!({"config": c["config"]})).await;
    assert_eq!(status.as_u16(), 200, "{body:#}");
    assert!(!body.to_string().contains("conf/auth"), "sending the config back as shown changes the file: {body:#}");

    // A reconfigure renders the new secret; its dry run and its operation
    // show it as set.
    let (status, preview) = env.patch("/clusters/v/config?dry_run=true", json!({"config": {"password": SECOND}})).await;
    assert_eq!(status.as_u16(), 200, "{preview:#}");
    assert!(preview.to_string().contains("conf/auth"), "the dry run does not see the file change: {preview:#}");
    let op = env.run_op_patch("/clusters/v/config", json!({"config": {"password": SECOND}})).await;
    assert_eq!(op["status"], "Succeeded", "{op:#}");
    assert_eq!(std::fs::read_to_string(&auth).unwrap(), format!("admin:{SECOND}"));

    let shown = everything_shown(&env, "v").await;
    for secret in [FIRST, SECOND] {
        assert!(!shown.contains(secret), "a reader sees the secret {secret}");
    }
    // The search can find what it looks for: the files' paths and the
    // plain value are there.
    assert!(shown.contains("conf/auth") || shown.contains("reconfigure"), "the search saw nothing");
    assert!(shown.contains(r#""password":{"secret":"set"}"#), "the secret is not shown as set");
    let v: Value = env.cluster("v").await;
    assert_eq!(v["config"]["password"], json!({"secret": "set"}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_package_cannot_ship_a_default_secret() {
    let env = TestEnv::start("iso-secret-default").await;
    let spec = SPEC.replace(r#"type = "secret","#, r#"type = "secret", default = "changeme","#);
    let (status, body) =
        env.put_bytes("/packages/vault/1.0.0", PackageBuilder::new("vault", "1.0.0").spec(&spec).build()).await;
    assert_eq!((status.as_u16(), error_code(&body)), (422, "spec_violation"), "{body:#}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("config.password.default") && message.contains("secret"), "{message}");
}
