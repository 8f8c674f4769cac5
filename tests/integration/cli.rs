//! The CLI end to end against `flotilla dev` (a master and three real
//! agents, the example packages loaded): every verb, its exit codes, its
//! `--json` output parsed, and what it did checked through the API and on
//! the instances' own pages.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::common::dev::Dev;

fn instances(c: &Value) -> Vec<Value> {
    c["instances"].as_array().cloned().unwrap_or_default()
}

fn statuses(c: &Value) -> Vec<String> {
    instances(c).iter().map(|i| i["status"].as_str().unwrap_or("").to_string()).collect()
}

/// The page one instance serves.
fn page(i: &Value) -> String {
    let url = format!("http://{}:{}/", i["host"].as_str().unwrap(), i["ports"]["http"]);
    let out = Command::new("curl").args(["-s", "--max-time", "5", &url]).output().expect("curl");
    String::from_utf8_lossy(&out.stdout).to_string()
}

#[test]
fn every_verb_against_flotilla_dev_with_exit_codes_and_json() {
    let dev = Dev::start();
    let d = &dev;

    // Nodes and packages as dev left them.
    let nodes = d.json(&["node", "ls"]);
    let ready = nodes["nodes"].as_array().unwrap().iter().filter(|n| n["status"] == "Ready").count();
    assert_eq!(ready, 3, "{nodes:#}");
    assert_eq!(d.json(&["node", "get", "node-2"])["id"], "node-2");
    let table = d.ok(&["node", "ls"]);
    assert!(table.starts_with("NODE") && table.contains("node-3"), "{table}");
    // Cordon and uncordon: shown on the node, in the table, and undone.
    let out = d.ok(&["node", "cordon", "node-3", "--reason", "disk errors"]);
    assert!(out.contains("node node-3 cordoned since"), "{out}");
    assert_eq!(d.json(&["node", "get", "node-3"])["cordon"]["reason"], "disk errors");
    let row = d.ok(&["node", "ls"]).lines().find(|l| l.starts_with("node-3")).unwrap_or_default().to_string();
    assert!(row.contains("cordoned"), "{row}");
    assert!(d.ok(&["node", "uncordon", "node-3"]).contains("node node-3 uncordoned"));
    assert!(d.ok(&["node", "uncordon", "node-3"]).contains("was not cordoned"));
    assert!(d.json(&["node", "get", "node-3"])["cordon"].is_null());
    let pkgs = d.json(&["package", "ls"]);
    assert!(pkgs["packages"].as_array().unwrap().iter().any(|p| p["name"] == "web"), "{pkgs:#}");

    // Create, waiting for the operation; the page shows the config.
    let out = d.ok(&[
        "cluster",
        "create",
        "demo",
        "--package",
        "web:1.0.0",
        "--role",
        "server=2",
        "--config",
        "greeting=hi-from-cli",
    ]);
    assert!(out.contains("Create") && out.contains("succeeded"), "{out}");
    let c = d.cluster("demo");
    assert_eq!((c["status"].as_str(), statuses(&c)), (Some("Active"), vec!["Running".to_string(); 2]), "{c:#}");
    assert!(page(&instances(&c)[0]).contains("hi-from-cli"));
    let ls = d.json(&["cluster", "ls"]);
    assert_eq!(ls["clusters"][0]["name"], "demo", "{ls:#}");

    // Scale out and in.
    d.ok(&["cluster", "scale", "demo", "server", "--add", "1"]);
    let c = d.cluster("demo");
    assert_eq!(instances(&c).len(), 3);
    let gone = instances(&c)[0]["id"].as_str().unwrap().to_string();
    d.ok(&["cluster", "scale", "demo", "server", "--remove", &gone]);
    let c = d.cluster("demo");
    assert_eq!(instances(&c).len(), 2);
    assert!(instances(&c).iter().all(|i| i["id"] != gone.as_str()));

    // Config change: every page says the new greeting.
    d.ok(&["cluster", "config", "demo", "greeting=bonjour-cli"]);
    for i in instances(&d.cluster("demo")) {
        assert!(page(&i).contains("bonjour-cli"), "{} still serves the old page", i["id"]);
    }

    // The instance's own log: http.server logs each request on stderr.
    let first = instances(&d.cluster("demo"))[0].clone();
    let log = d.ok(&["cluster", "logs", "demo", first["id"].as_str().unwrap(), "--stderr", "--tail", "5"]);
    assert!(log.contains("\"GET / HTTP/1.1\" 200"), "{log}");

    // --dry-run: the preview, and nothing changed.
    let preview = d.json(&["cluster", "config", "demo", "greeting=never-applied", "--dry-run"]);
    assert_eq!(preview["dry_run"], true, "{preview:#}");
    let human = d.ok(&["cluster", "scale", "demo", "server", "--add", "1", "--dry-run"]);
    assert!(
        human.starts_with("dry run of ScaleOut: nothing was changed") && human.contains("new demo-server-"),
        "{human}"
    );
    assert_eq!(instances(&d.cluster("demo")).len(), 2);
    assert!(page(&instances(&d.cluster("demo"))[0]).contains("bonjour-cli"));

    // Stop, start, restart; one instance's restart changes only its pid.
    d.ok(&["cluster", "stop", "demo"]);
    assert_eq!(statuses(&d.cluster("demo")), vec!["Stopped".to_string(); 2]);
    d.ok(&["cluster", "start", "demo"]);
    d.ok(&["cluster", "restart", "demo"]);
    let before = instances(&d.cluster("demo"));
    let one = before[0]["id"].as_str().unwrap();
    d.ok(&["cluster", "restart", "demo", "--instance", one]);
    let after = instances(&d.cluster("demo"));
    assert_ne!(after[0]["pid"], before[0]["pid"], "the restarted instance has a new pid");
    assert_eq!(after[1]["pid"], before[1]["pid"], "the other one kept its process");

    // Resize (limits), upgrade to a pushed version, remove the old one.
    d.ok(&["cluster", "resize", "demo", "server", "--memory", "256M"]);
    let v2 = tempfile::tempdir().unwrap();
    copy_dir(&Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/components/web"), v2.path());
    let spec = std::fs::read_to_string(v2.path().join("component.toml")).unwrap();
    std::fs::write(v2.path().join("component.toml"), spec.replace("version = \"1.0.0\"", "version = \"1.0.1\""))
        .unwrap();
    let pushed = d.ok(&["package", "push", v2.path().to_str().unwrap()]);
    assert!(pushed.contains("web:1.0.1"), "{pushed}");
    d.ok(&["cluster", "upgrade", "demo", "1.0.1"]);
    assert_eq!(d.cluster("demo")["package"]["version"], "1.0.1");
    let out = d.ok(&["package", "rm", "web", "1.0.0", "--dry-run"]);
    assert!(out.contains("would delete web/1.0.0; nothing was changed"), "{out}");
    assert!(d.json(&["package", "ls"])["packages"].as_array().unwrap().iter().any(|p| p["version"] == "1.0.0"));
    let (code, _, err) = d.run(&["package", "rm", "web", "1.0.1", "--dry-run"], &[]);
    assert_eq!(code, 1, "in use: refused as the real delete is: {err}");
    assert!(err.contains("package_in_use"), "{err}");
    d.ok(&["package", "rm", "web", "1.0.0"]);
    assert!(
        !d.json(&["package", "ls"])["packages"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["version"] == "1.0.0" && p["name"] == "web")
    );

    // Operations: listed newest first, one read whole, one watched.
    let ops = d.json(&["op", "ls", "--cluster", "demo", "--limit", "50"]);
    let kinds: Vec<&str> = ops["operations"].as_array().unwrap().iter().map(|o| o["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds.first(), Some(&"Upgrade"), "{kinds:?}");
    assert!(kinds.contains(&"Create") && kinds.contains(&"ScaleIn") && kinds.contains(&"Reconfigure"), "{kinds:?}");
    let create_id = ops["operations"].as_array().unwrap().last().unwrap()["id"].as_str().unwrap().to_string();
    let op = d.json(&["op", "get", &create_id]);
    assert_eq!((op["kind"].as_str(), op["status"].as_str()), (Some("Create"), Some("Succeeded")), "{op:#}");
    let (code, out, _) = d.run(&["op", "watch", &create_id], &[]);
    assert_eq!(code, 0, "{out}");

    // --no-wait answers before the end; op watch follows it.
    let started = d.json(&["cluster", "create", "quick", "--package", "web:1.0.1", "--role", "server=1", "--no-wait"]);
    let quick_op = started["id"].as_str().expect("the operation").to_string();
    d.ok(&["op", "watch", &quick_op]);
    assert_eq!(d.cluster("quick")["status"], "Active");

    // The event stream (killed after a moment): JSON lines, the creates there.
    let mut events = Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args(["events", "--after", "0", "--kind", "cluster.created", "--json", "--endpoints"])
        .arg(dev.endpoints())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(2));
    let _ = events.kill();
    let out = events.wait_with_output().unwrap();
    let lines: Vec<Value> =
        String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let created: Vec<&str> = lines.iter().map(|e| e["cluster"].as_str().unwrap()).collect();
    assert_eq!(created, vec!["demo", "quick"], "{lines:#?}");

    // Exit codes: refused request 1, usage 2, bad token or no API 3.
    assert_eq!(d.run(&["cluster", "upgrade", "demo", "9.9.9"], &[]).0, 1, "an unknown version");
    assert_eq!(d.run(&["cluster", "get", "nope"], &[]).0, 1);
    assert_eq!(d.run(&["cluster", "scale", "demo", "server", "--add", "100"], &[]).0, 1, "over count.max");
    assert_eq!(d.run(&["cluster", "scale", "demo", "server"], &[]).0, 2, "neither --add nor --remove");
    assert_eq!(d.run(&["cluster", "create", "x", "--package", "web"], &[]).0, 2, "no version");
    assert_eq!(d.run(&["cluster", "frob"], &[]).0, 2);
    assert_eq!(d.run(&["cluster", "ls"], &[("FLOTILLA_TOKEN", "flt_000000000000_00")]).0, 3);
    assert_eq!(d.run(&["cluster", "ls"], &[("FLOTILLA_API", "http://127.0.0.1:1")]).0, 3);

    // Delete both; the cluster is gone (exit 1 to get it).
    d.ok(&["cluster", "delete", "quick"]);
    d.ok(&["cluster", "delete", "demo"]);
    let (code, _, err) = d.run(&["cluster", "get", "demo"], &[]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("not_found"), "{err}");
    assert!(d.json(&["cluster", "ls"])["clusters"].as_array().unwrap().is_empty());
}

fn copy_dir(from: &Path, to: &Path) {
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dest = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            std::fs::create_dir_all(&dest).unwrap();
            copy_dir(&e.path(), &dest);
        } else {
            std::fs::copy(e.path(), &dest).unwrap();
        }
    }
}
