//! The dashboard in a real browser: `flotilla dev` (a master and three
//! real agents), a cluster `demo` of two web servers, and Debian's
//! Chromium driven by `tests/browser/dashboard.mjs` (playwright-core):
//! log in with the URL `flotilla dev` printed, see the actor tree, scale
//! out from the page and watch the operation's bar advance and the new
//! instances appear without a reload, kill an instance's process and see
//! its restart, then the operations, nodes and events views; then, with a
//! token of scope `read` (`flotilla token create --scope read`) in a tab of
//! its own, the same cluster without one control that would change it.
//! Screenshots are kept in `$CARGO_TARGET_TMPDIR/dashboard/`.
//!
//! Needs `node`, `/usr/bin/chromium` and `tests/browser/node_modules`
//! (`scripts/setup.sh` installs all three); without them the test fails
//! and says which is missing.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::dev::Dev;

fn browser_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/browser")
}

fn require_browser_tools() {
    let node = Command::new("node").arg("--version").output();
    assert!(node.is_ok_and(|o| o.status.success()), "node is missing: run scripts/setup.sh (Debian's nodejs)");
    assert!(Path::new("/usr/bin/chromium").exists(), "/usr/bin/chromium is missing: run scripts/setup.sh");
    assert!(
        browser_dir().join("node_modules/playwright-core").exists(),
        "tests/browser/node_modules/playwright-core is missing: run scripts/setup.sh (npm ci in tests/browser)"
    );
}

/// The dashboard URL from `flotilla dev`'s banner.
fn login_url(dev: &Dev) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let log = dev.log();
        if let Some(line) = log.lines().find(|l| l.trim_start().starts_with("dashboard")) {
            return line.split_whitespace().nth(1).expect("a URL after `dashboard`").to_string();
        }
        assert!(Instant::now() < deadline, "flotilla dev printed no dashboard URL:\n{log}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// What the master serves at `/` and `/ui/`: without a token, with a CSP
/// that forbids anything not from itself, revalidated by ETag.
fn check_assets(api: &str) {
    let get = |path: &str, etag: Option<&str>| {
        let mut args = vec!["-s".to_string(), "-D".into(), "-".into(), "-o".into(), "/dev/null".into()];
        if let Some(e) = etag {
            args.extend(["-H".into(), format!("If-None-Match: {e}")]);
        }
        args.push(format!("{api}{path}"));
        let out = Command::new("curl").args(&args).output().expect("curl");
        String::from_utf8_lossy(&out.stdout).to_lowercase()
    };
    let page = get("/", None);
    assert!(page.starts_with("http/1.1 200"), "GET / without a token: {page}");
    assert!(page.contains("content-security-policy: default-src 'none'; script-src 'self'"), "{page}");
    assert!(page.contains("content-type: text/html"), "{page}");
    let etag = page.lines().find_map(|l| l.strip_prefix("etag: ")).expect("an ETag").trim().to_string();
    assert!(get("/", Some(&etag)).starts_with("http/1.1 304"), "an unchanged page is not sent again");
    assert!(get("/ui/app.js", None).contains("content-type: text/javascript"));
    assert!(get("/ui/nothing.js", None).starts_with("http/1.1 404"));
    assert!(get("/ui/..%2fCargo.toml", None).starts_with("http/1.1 404"));
}

#[test]
fn an_operator_scales_out_and_watches_a_restart_from_the_dashboard() {
    require_browser_tools();
    let dev = Dev::start();
    let url = login_url(&dev);
    let (api, token) = dev.api();
    assert_eq!(url, format!("{api}/#token={token}"), "the login URL carries the token in the fragment only");
    check_assets(&api);

    dev.ok(&["cluster", "create", "demo", "--package", "web:1.0.0", "--role", "server=2"]);
    let viewer = dev.ok(&["token", "create", "viewer", "--scope", "read"]).trim().to_string();
    let read_url = format!("{api}/#token={viewer}");
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard");
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out).expect("screenshot dir");

    let _alone = crate::common::netns::browsing();
    let mut child = Command::new("node")
        .arg(browser_dir().join("dashboard.mjs"))
        .arg(&url)
        .arg(&out)
        .arg(&read_url)
        .current_dir(browser_dir())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start node");
    let deadline = Instant::now() + Duration::from_secs(240);
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait for node") {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            break child.wait().expect("reap node");
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let output = child.wait_with_output().expect("node output");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        status.success(),
        "the dashboard run failed ({status}); screenshots in {}\nstdout: {stdout}\nstderr: {stderr}\nflotilla dev:\n{}",
        out.display(),
        dev.log()
    );
    let seen: serde_json::Value = serde_json::from_str(stdout.trim()).expect("the script's JSON line");
    assert_eq!(seen["ok"], true, "{seen}");
    eprintln!("dashboard: what the page showed: {seen}");
    assert_eq!((seen["scope"].as_str(), seen["readScope"].as_str()), (Some("admin"), Some("read")), "{seen}");
    assert_eq!(seen["readControls"], 0, "{seen}");
    for shot in ["1-actors", "3-scale-preview", "4-scaled-out", "5-restarted", "6-operation", "8-events", "9-read-only"]
    {
        let png = std::fs::read(out.join(format!("{shot}.png"))).unwrap_or_default();
        assert!(png.starts_with(b"\x89PNG") && png.len() > 10_000, "screenshot {shot} missing or empty");
    }
    // What the page showed is what happened: four web servers, one of them
    // with the new pid the page showed.
    let c = dev.cluster("demo");
    let pids: Vec<u64> = c["instances"].as_array().unwrap().iter().filter_map(|i| i["pid"].as_u64()).collect();
    assert_eq!(pids.len(), 4, "{c}");
    assert!(pids.contains(&seen["restart"]["newPid"].as_u64().unwrap()), "{seen} vs {c}");
}

/// The node pools in a real browser: `flotilla dev` with a local pool and
/// no agent of its own, a create that must wait for a node; the
/// operation's page shows the request it filed, the Pools view the pool,
/// its node and the request (`tests/browser/pools.mjs`).
#[test]
fn an_operation_that_waited_for_a_node_shows_its_request_and_the_pool_on_the_dashboard() {
    require_browser_tools();
    let prefix = format!("db{}", std::process::id() % 100_000);
    let config = format!(
        "[[node_pools]]\nname = \"dash\"\ndriver = \"local\"\nmax_nodes = 2\n\
         [node_pools.settings]\nprefix = \"{prefix}\"\nnetwork = \"10.246.{}.0/24\"\n",
        std::process::id() % 250
    );
    // Its local pool adds a namespace and a veth for the node it launches:
    // not while another test's page is open (its own page reloads once).
    let changing = crate::common::netns::changing_interfaces();
    let dev = Dev::start_with(0, Some(&config));
    let url = login_url(&dev);
    let created = dev.json(&["cluster", "create", "w", "--package", "web:1.0.0", "--role", "server=1"]);
    let op = created["operation"]["id"].as_str().or(created["id"].as_str()).unwrap_or_else(|| panic!("{created}"));
    let op = op.to_string();
    let ended = dev.json(&["op", "get", &op]);
    assert_eq!(ended["operation"]["status"].as_str().or(ended["status"].as_str()), Some("Succeeded"), "{ended}");
    drop(changing);
    run_script(&dev, "pools.mjs", &[url.as_str(), op.as_str(), "dash"], "dashboard-pools");
}

/// `flotilla dev --ha` in the browser: the header names the leader and
/// its term; the leader killed, the page says so and links to another
/// master; the link opens the dashboard on the new leader (a later term),
/// signed in (`tests/browser/ha.mjs`).
#[test]
fn a_failover_shows_on_the_dashboard_and_its_link_opens_the_new_leader() {
    require_browser_tools();
    let _ports = crate::common::dev::HA_PORTS.blocking_lock();
    let dev = Dev::start_ha(1);
    let url = login_url(&dev);
    let seen = run_script(&dev, "ha.mjs", &[url.as_str()], "dashboard-ha");
    eprintln!("the failover on the dashboard: {seen}");
}

/// Runs `tests/browser/<script> ARGS... OUT_DIR` against `dev`, its
/// screenshots in `$CARGO_TARGET_TMPDIR/<out>`; asserts it succeeded and
/// answers the JSON line it printed.
fn run_script(dev: &Dev, script: &str, args: &[&str], out: &str) -> serde_json::Value {
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join(out);
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out).expect("screenshot dir");
    let _alone = crate::common::netns::browsing();
    let run = Command::new("node")
        .arg(browser_dir().join(script))
        .args(args)
        .arg(&out)
        .current_dir(browser_dir())
        .stdin(Stdio::null())
        .output()
        .expect("run node");
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "{script} failed ({}); screenshots in {}\nstdout: {stdout}\nstderr: {}\nflotilla dev:\n{}",
        run.status,
        out.display(),
        String::from_utf8_lossy(&run.stderr),
        dev.log()
    );
    let seen: serde_json::Value = serde_json::from_str(stdout.trim()).expect("the script's JSON line");
    assert_eq!(seen["ok"], true, "{seen}");
    seen
}
