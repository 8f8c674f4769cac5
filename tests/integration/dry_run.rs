//! `?dry_run=true`: a preview changes nothing (the API's view, the
//! operations, the processes and the files on the agents compared before
//! and after), refuses what the real call refuses, and predicts what the
//! real call then does: the same new instance on the same node with the
//! same ports, and which members restart, reload or stay untouched.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::common::{PackageBuilder, TestEnv, dir_of, id_of, pid_of, role_instances};

const SPEC: &str = r#"
[component]
name = "dr"
version = "1.0.0"

[config]
greeting = { type = "string", default = "hello" }

[[roles]]
name = "web"
count = { min = 1, max = 3 }
ports = ["http"]
start = ["bin/run.sh"]

[[roles.files]]
path = "conf/greeting"
template = "{{ cluster.config.greeting }}\n"

[[roles]]
name = "api"
count = { min = 1, max = 3 }
start = ["bin/run.sh"]
reload = ["bin/reload.sh"]

[[roles.files]]
path = "conf/greeting"
template = "{{ cluster.config.greeting }} from api\n"

[[roles]]
name = "fixed"
count = { min = 1, max = 3 }
start = ["bin/run.sh"]

[[roles.files]]
path = "conf/size"
template = "64\n"
"#;

/// Everything a dry run must leave as it was.
async fn state(env: &TestEnv) -> Value {
    let mut cluster = env.cluster("dr").await;
    let files: Vec<Value> = cluster["instances"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            let conf =
                std::fs::read_dir(dir_of(i).join("conf")).unwrap().map(|e| e.unwrap().path()).collect::<Vec<_>>();
            let texts: Vec<String> = conf.iter().map(|p| std::fs::read_to_string(p).unwrap()).collect();
            json!({ "pid_alive": crate::common::pid_alive(pid_of(i)), "conf": texts })
        })
        .collect();
    let (_, ops) = env.get("/operations?cluster=dr&limit=100").await;
    let (_, clusters) = env.get("/clusters").await;
    cluster["files"] = json!(files);
    json!({ "cluster": cluster, "operations": ops, "clusters": clusters, "dirs": env.agent_instance_dirs() })
}

fn preview_of<'a>(p: &'a Value, step_action: &str) -> &'a Value {
    p["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["action"] == step_action && s["members"].is_object())
        .unwrap_or_else(|| panic!("no {step_action} step with members: {p:#}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dry_run_changes_nothing_and_predicts_the_real_call() {
    let env = TestEnv::start("dry-run").await;
    env.upload(
        &PackageBuilder::new("dr", "1.0.0")
            .spec(SPEC)
            .script("bin/run.sh", "exec sleep 100000\n")
            .script("bin/reload.sh", "true\n"),
    )
    .await;
    let body = json!({"name": "dr", "package": {"name": "dr", "version": "1.0.0"},
                      "roles": {"web": {"count": 1}, "api": {"count": 1}, "fixed": {"count": 1}}});

    // A create previewed: its plan and placements, and no cluster after.
    let (status, p) = env.post("/clusters?dry_run=true", body.clone()).await;
    assert_eq!(status, StatusCode::OK, "{p:#}");
    assert_eq!((p["dry_run"].as_bool(), p["kind"].as_str()), (Some(true), Some("Create")), "{p:#}");
    assert_eq!(p["new_instances"].as_array().unwrap().len(), 3, "{p:#}");
    let (status, _) = env.get("/clusters/dr").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "a previewed create creates nothing");
    let created = env.create_active(body).await;
    // Ids carry the new cluster id (drawn per create); role, ordinal, node
    // and ports are what the preview said.
    let key = |i: &Value| (i["role"].as_str().unwrap().to_string(), i["ordinal"].as_u64().unwrap());
    for i in p["new_instances"].as_array().unwrap() {
        let real = created["instances"].as_array().unwrap().iter().find(|r| key(r) == key(i));
        let real = real.unwrap_or_else(|| panic!("{:?} not created: {created:#}", key(i)));
        assert_eq!((&real["node"], &real["ports"]), (&i["node"], &i["ports"]), "{:?} placed as previewed", key(i));
    }

    let before = state(&env).await;

    // A config change previewed: web restarts, api reloads, fixed is untouched.
    let (status, p) = env.patch("/clusters/dr/config?dry_run=true", json!({"config": {"greeting": "bonjour"}})).await;
    assert_eq!(status, StatusCode::OK, "{p:#}");
    let members = &preview_of(&p, "reconfigure")["members"];
    let by_role = |role: &str| {
        let id = id_of(&role_instances(&created, role)[0]);
        members[&id].as_str().unwrap_or_else(|| panic!("{id} missing: {members:#}")).to_string()
    };
    assert!(by_role("web").starts_with("restart (conf/greeting"), "{members:#}");
    assert!(by_role("api").starts_with("reload (conf/greeting"), "{members:#}");
    assert_eq!(by_role("fixed"), "unchanged", "{members:#}");

    // A scale-out previewed: the new instance, node and ports.
    let (status, s) = env.post("/clusters/dr/scale?dry_run=true", json!({"role": "web", "add": 1})).await;
    assert_eq!(status, StatusCode::OK, "{s:#}");
    let new = s["new_instances"][0].clone();
    assert_eq!(new["role"], "web", "{s:#}");

    // Refused as the real call is (the real one is sent after the check below).
    let (refused_status, refused) = env.post("/clusters/dr/scale?dry_run=true", json!({"role": "web", "add": 9})).await;
    let (status, _) = env.post("/clusters/dr/restart?dry_run=true&bogus=1", json!({})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "unknown query parameters are refused");
    for path in ["/clusters/dr/stop", "/clusters/dr/restart", "/clusters/dr/start"] {
        let (status, p) = env.post(&format!("{path}?dry_run=true"), json!({})).await;
        assert_eq!(status, StatusCode::OK, "{path}: {p:#}");
    }
    let (status, p) = env.delete("/clusters/dr?dry_run=true").await;
    assert_eq!((status, p["kind"].as_str()), (StatusCode::OK, Some("Delete")), "{p:#}");

    // Nothing changed: the API's view, the operations, processes, files.
    let after = state(&env).await;
    assert_eq!(before, after, "a dry run changed something");
    let (real_status, real) = env.post("/clusters/dr/scale", json!({"role": "web", "add": 9})).await;
    assert_eq!(
        (refused_status, &refused["error"]["code"]),
        (real_status, &real["error"]["code"]),
        "{refused:#} vs {real:#}"
    );
    assert_eq!(real_status, StatusCode::UNPROCESSABLE_ENTITY);

    // The real calls do what the previews said.
    let scaled = env.run_ok("/clusters/dr/scale", Some(json!({"role": "web", "add": 1}))).await;
    assert_eq!(scaled["status"], "Succeeded");
    let c = env.cluster("dr").await;
    let real_new = c["instances"].as_array().unwrap().iter().find(|i| i["id"] == new["id"]).cloned();
    let real_new = real_new.unwrap_or_else(|| panic!("the previewed id {} was not created: {c:#}", new["id"]));
    assert_eq!((&real_new["node"], &real_new["ports"]), (&new["node"], &new["ports"]), "placed as previewed");

    let pids: Vec<(String, u32)> = c["instances"].as_array().unwrap().iter().map(|i| (id_of(i), pid_of(i))).collect();
    env.run_op_patch("/clusters/dr/config", json!({"config": {"greeting": "bonjour"}})).await;
    let c = env.cluster("dr").await;
    for role in ["web", "api", "fixed"] {
        let i = &role_instances(&c, role)[0];
        let old = pids.iter().find(|(id, _)| *id == id_of(i)).unwrap().1;
        let restarted = pid_of(i) != old;
        assert_eq!(
            restarted,
            role == "web",
            "{role}: restarted {restarted} (previewed: web restarts, api reloads, fixed untouched)"
        );
    }

    // A member the operator stopped: its files are written, it stays stopped.
    let web = id_of(&role_instances(&c, "web")[0]);
    env.run_ok(&format!("/clusters/dr/instances/{web}/stop"), None).await;
    let (status, p) = env.patch("/clusters/dr/config?dry_run=true", json!({"config": {"greeting": "third"}})).await;
    assert_eq!(status, StatusCode::OK, "{p:#}");
    let said = preview_of(&p, "reconfigure")["members"][&web].as_str().unwrap().to_string();
    assert!(said.ends_with("stays stopped"), "{said}");
    env.run_op_patch("/clusters/dr/config", json!({"config": {"greeting": "third"}})).await;
    let c = env.cluster("dr").await;
    let i = c["instances"].as_array().unwrap().iter().find(|i| i["id"] == web.as_str()).unwrap();
    assert_eq!(i["status"], "Stopped", "previewed: {said}");
}

/// Package and token dry runs: checked exactly as the real call, nothing kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn package_and_token_dry_runs_check_and_keep_nothing() {
    let env = TestEnv::start_sim("dry-run-pkg", &[], 1).await;
    let blobs = || std::fs::read_dir(env.master_dir().join("packages")).map(|d| d.count()).unwrap_or(0);
    let pkg = crate::common::sim::package("svc", "1.0.0", 3);

    // An upload previewed: valid, its roles named, nothing stored.
    let blobs_before = blobs();
    let (status, p) = env.put_bytes("/packages/svc/1.0.0?dry_run=true", pkg.build()).await;
    assert_eq!(status, StatusCode::OK, "{p:#}");
    assert_eq!((p["would"].as_str(), p["package"]["name"].as_str()), (Some("create"), Some("svc")), "{p:#}");
    let (_, list) = env.get("/packages").await;
    assert!(list["packages"].as_array().unwrap().is_empty(), "a previewed upload stores nothing: {list:#}");
    assert_eq!(blobs(), blobs_before, "no package file kept");
    // A broken package is refused the same way either way.
    let broken = PackageBuilder::new("svc", "1.0.1").spec("[component]\nname = \"svc\"\n");
    let (dry_status, dry) = env.put_bytes("/packages/svc/1.0.1?dry_run=true", broken.build()).await;
    let (real_status, real) = env.put_bytes("/packages/svc/1.0.1", broken.build()).await;
    assert!(dry_status.is_client_error(), "{dry:#}");
    assert_eq!((dry_status, &dry["error"]["code"]), (real_status, &real["error"]["code"]));

    // A delete previewed: refused while in use, checked when free.
    env.upload(&pkg).await;
    env.create_active(json!({"name": "u", "package": {"name": "svc", "version": "1.0.0"}})).await;
    let (status, body) = env.delete("/packages/svc/1.0.0?dry_run=true").await;
    assert_eq!((status, body["error"]["code"].as_str()), (StatusCode::CONFLICT, Some("package_in_use")), "{body:#}");
    let (status, _) = env.delete("/packages/svc/9.9.9?dry_run=true").await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // Tokens: a create previewed creates none; revoking the only one is
    // refused; revoking another is checked and the token keeps working.
    let (status, p) = env.post("/tokens?dry_run=true", json!({"name": "ci"})).await;
    assert_eq!((status, p["would"].as_str()), (StatusCode::OK, Some("create")), "{p:#}");
    assert!(p.get("secret").is_none());
    let (_, list) = env.get("/tokens").await;
    assert_eq!(list["tokens"].as_array().unwrap().len(), 1, "{list:#}");
    let (status, _) = env.post("/tokens?dry_run=true", json!({"name": "Not A Name"})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let first = env.token.split('_').nth(1).unwrap().to_string();
    let (status, body) = env.delete(&format!("/tokens/{first}?dry_run=true")).await;
    assert_eq!((status, body["error"]["code"].as_str()), (StatusCode::CONFLICT, Some("last_token")));
    let (_, made) = env.post("/tokens", json!({"name": "second"})).await;
    let second = made["token"]["id"].as_str().unwrap().to_string();
    let (status, p) = env.delete(&format!("/tokens/{second}?dry_run=true")).await;
    assert_eq!((status, p["would"].as_str()), (StatusCode::OK, Some("revoke")), "{p:#}");
    let still = crate::common::env::client_with_token(made["secret"].as_str().unwrap());
    let resp = still.get(format!("{}/nodes", env.api)).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK, "a previewed revoke revokes nothing");
}
