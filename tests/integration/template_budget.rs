//! A template that doubles a string thirty times (issue 22, item 3: it
//! took the master from 59 MB to 2.68 GB) against a real master. How many
//! times is a config value, so a cluster can first be created harmlessly
//! (0) and then previewed and changed to 30: the config change's dry run
//! (which renders every member's files), the config change and a create
//! with 30 fail naming the template memory budget; the master's peak
//! resident memory (`VmHWM`, reset through `clear_refs` before each) stays
//! within 64 MB of what it held just before; the master serves on.
//! (A create's dry run renders nothing, so it has nothing to refuse.)

use reqwest::StatusCode;
use serde_json::json;

use crate::common::{PackageBuilder, TestEnv};

const SPEC: &str = r#"
[component]
name = "doubler"
version = "1.0.0"

[config]
rounds = { type = "int", default = 0, min = 0, max = 64 }

[[roles]]
name = "web"
count = { min = 1, max = 3 }
start = ["bin/run.sh"]

[[roles.files]]
path = "conf/big"
template = "{% set ns = namespace(s='x') %}{% for i in range(cluster.config.rounds) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}"
"#;

const BUDGET: &str = "the template memory budget";

/// A field of `/proc/<pid>/status` in kB.
fn status_kb(pid: u32, field: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = text.lines().find(|l| l.starts_with(field)).unwrap_or_else(|| panic!("no {field} in {text}"));
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// Resets the master's peak RSS to its current RSS and answers that RSS.
fn reset_peak(pid: u32) -> u64 {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5")
        .unwrap_or_else(|e| panic!("clear_refs of the master ({pid}): {e} (this test needs root)"));
    status_kb(pid, "VmRSS:")
}

/// Runs `f` against the master and answers (RSS before, peak during) in kB.
async fn peak_during<F: std::future::Future<Output = ()>>(env: &TestEnv, f: F) -> (u64, u64) {
    let pid = env.master_pid();
    let before = reset_peak(pid);
    f.await;
    (before, status_kb(pid, "VmHWM:"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_doubling_template_fails_naming_the_budget_and_the_master_stays_small() {
    let env = TestEnv::start("template-budget").await;
    env.upload(&PackageBuilder::new("doubler", "1.0.0").spec(SPEC).script("bin/run.sh", "exec sleep 100000\n")).await;
    let create = |name: &str, rounds: u32| {
        json!({"name": name, "package": {"name": "doubler", "version": "1.0.0"}, "roles": {"web": {"count": 2}},
               "config": {"rounds": rounds}})
    };
    env.create_active(create("dbl", 0)).await;

    // The dry run of a config change renders the members' files.
    let mut answer = json!(null);
    let (before, peak) = peak_during(&env, async {
        let (status, p) = env.patch("/clusters/dbl/config?dry_run=true", json!({"config": {"rounds": 30}})).await;
        answer = json!({"status": status.as_u16(), "body": p});
    })
    .await;
    eprintln!("config dry run: RSS before {before} kB, peak {peak} kB: {answer}");
    assert_ne!(answer["status"], 200, "the dry run must fail: {answer:#}");
    assert!(answer.to_string().contains(BUDGET), "not the budget: {answer:#}");
    assert!(peak < before + 64 * 1024, "dry run: peak {peak} kB, {before} kB before");

    // The config change itself, then a create: refused up front or failed
    // by their operation, naming the budget.
    for (what, path, method_patch, body) in [
        ("config change", "/clusters/dbl/config", true, json!({"config": {"rounds": 30}})),
        ("create", "/clusters", false, create("dbl2", 30)),
    ] {
        let mut outcome = json!(null);
        let (before, peak) = peak_during(&env, async {
            let (status, resp) =
                if method_patch { env.patch(path, body.clone()).await } else { env.post(path, body.clone()).await };
            outcome = if status == StatusCode::ACCEPTED {
                env.wait_op(resp["operation"]["id"].as_str().unwrap()).await
            } else {
                json!({"status": status.as_u16(), "body": resp})
            };
        })
        .await;
        eprintln!("{what}: RSS before {before} kB, peak {peak} kB: {outcome}");
        assert_ne!(outcome["status"], "Succeeded", "the {what} must fail: {outcome:#}");
        assert!(outcome.to_string().contains(BUDGET), "{what}: not the budget: {outcome:#}");
        assert!(peak < before + 64 * 1024, "{what}: peak {peak} kB, {before} kB before");
    }

    // The master still serves, and a sound package still deploys.
    let (status, _) = env.get("/clusters").await;
    assert_eq!(status, StatusCode::OK);
    env.upload(&PackageBuilder::sleeper("fine")).await;
    let (status, p) = env
        .post(
            "/clusters?dry_run=true",
            json!({"name": "ok", "package": {"name": "fine", "version": PackageBuilder::sleeper("fine").version()}}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{p:#}");
}
