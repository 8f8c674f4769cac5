//! The API description held to the server it describes: schemathesis
//! (from PyPI, pinned in `scripts/setup.sh`) reads `GET
//! /api/v1/openapi.json` from a real `flotilla dev` (a master, three real
//! agents, the example packages, and a cluster `demo` of one web server,
//! the name the document's examples use), generates requests for every
//! operation (a bounded number per operation, seeded), and checks each
//! answer.
//!
//! Checks run: `not_a_server_error` (no 5xx), `status_code_conformance`
//! (every status is documented), `content_type_conformance`,
//! `response_headers_conformance`, `response_schema_conformance` (every
//! body matches its schema), `negative_data_rejection` (input outside the
//! schema is refused with a 4xx), `missing_required_header`,
//! `unsupported_method` (a method a path lacks answers 405 with `Allow`),
//! `ignored_auth` (an operation that needs the token refuses a request
//! without it).
//!
//! Left out: `positive_data_acceptance`: schema-valid input is often
//! rightly refused here (a random package name that was never uploaded is
//! `404`, a random tarball is `400`, a cluster busy with the operation a
//! moment ago is `409`); `use_after_free`, `ensure_resource_availability`
//! and the `stateful` phase: they follow OpenAPI links, which the document
//! does not declare (the CLI test and the lifecycle tests cover sequences);
//! `object_level_authorization`: tokens are not scoped to objects;
//! `max_response_time`: `?wait=` long-polls by design.
//!
//! `POST /nodes/{id}/revoke` is asked only with an id no node has (the
//! config file pins it): revoking `node-1` would take the node of `demo`'s
//! instance away for the rest of the run (its routes then rightly answer
//! `503`). Leaving it to generated ids was not enough: a CI run's coverage
//! phase asked it with `node-1`, the example of `GET /nodes/{id}`.
//! `tests/integration/trust.rs` revokes for real.
//!
//! A config file (written per run) points half of the generated instance
//! routes at `demo` and its instance, so they reach real answers (202, the
//! plan of a dry run, a log), not only 404s. Streaming routes must not hold
//! the run: `GET /events` never ends by design, so schemathesis reads at
//! most 5 events of each stream, or for 1 s of silence, and checks each
//! event against the document (the stream then counts as cut short, not
//! failed); a followed log streams for as long as the client stays, so the
//! logs route is always asked with `follow=false` (its other parameters
//! are generated). `--request-timeout` bounds every other request.
//!
//! Without schemathesis the test fails and says how to install it.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::dev::Dev;

/// As in `scripts/setup.sh`.
const PINNED: &str = "schemathesis==4.32.5";
/// Test cases per operation and phase (about 40 s on 2 cores).
const MAX_EXAMPLES: &str = "40";
/// The whole run, at most.
const DEADLINE: Duration = Duration::from_secs(300);
const CHECKS: &str = "not_a_server_error,status_code_conformance,content_type_conformance,\
    response_headers_conformance,response_schema_conformance,negative_data_rejection,\
    missing_required_header,unsupported_method,ignored_auth";

fn require_schemathesis() {
    let out = Command::new("schemathesis").arg("--version").output();
    assert!(
        out.as_ref().is_ok_and(|o| o.status.success()),
        "schemathesis is not installed (or not on PATH): run scripts/setup.sh, or \
         `python3 -m pip install '{PINNED}'` ({out:?})"
    );
}

/// `curl -s -i` of `method url` with `headers`: the status line, headers and body.
fn curl(method: &str, url: &str, headers: &[&str]) -> String {
    let mut cmd = Command::new("curl");
    cmd.args(["-s", "-i", "--max-time", "10", "-X", method, url]);
    for h in headers {
        cmd.args(["-H", h]);
    }
    String::from_utf8_lossy(&cmd.output().expect("curl").stdout).to_string()
}

#[test]
fn the_server_answers_as_its_api_description_says_under_schemathesis() {
    require_schemathesis();
    let dev = Dev::start();
    let (api, token) = dev.api();
    let bearer = format!("Authorization: Bearer {token}");

    // The document is public and OpenAPI 3.1.
    let doc = curl("GET", &format!("{api}/api/v1/openapi.json"), &[]);
    assert!(doc.starts_with("HTTP/1.1 200"), "GET /api/v1/openapi.json without a token: {doc}");
    assert!(doc.contains("\"openapi\":\"3.1.0\""), "{doc}");
    // A method a path lacks: 405 with Allow and the error body, after the token check.
    let wrong = curl("POST", &format!("{api}/api/v1/nodes"), &[&bearer]);
    assert!(wrong.starts_with("HTTP/1.1 405"), "POST /api/v1/nodes: {wrong}");
    assert!(wrong.to_lowercase().contains("\nallow: get\r"), "{wrong}");
    assert!(wrong.contains("\"code\":\"method_not_allowed\""), "{wrong}");
    let anonymous = curl("POST", &format!("{api}/api/v1/nodes"), &[]);
    assert!(anonymous.starts_with("HTTP/1.1 401"), "POST /api/v1/nodes without a token: {anonymous}");

    // Something for the examples to find: `demo`, as the document's examples say.
    dev.ok(&["cluster", "create", "demo", "--package", "web:1.0.0", "--role", "server=1"]);
    let instance = dev.cluster("demo")["instances"][0]["id"].as_str().expect("demo's instance").to_string();
    let config = dev.dir.path().join("schemathesis.toml");
    std::fs::write(&config, config_file(&instance)).expect("schemathesis.toml");

    let report = dev.dir.path().join("schemathesis.txt");
    let out = std::fs::File::create(&report).expect("report file");
    let started = Instant::now();
    let mut child = Command::new("schemathesis")
        .arg("--config-file")
        .arg(&config)
        .arg("run")
        .arg(format!("{api}/api/v1/openapi.json"))
        .args(["--header", &bearer])
        .args(["--checks", CHECKS])
        .args(["--phases", "examples,coverage,fuzzing"])
        .args(["--max-examples", MAX_EXAMPLES, "--seed", "1", "--workers", "1"])
        .args(["--request-timeout", "30"])
        .args(["--suppress-health-check", "all"])
        .current_dir(dev.dir.path())
        .env("NO_COLOR", "1")
        .env("SCHEMATHESIS_TELEMETRY", "false")
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .expect("start schemathesis");
    let status = loop {
        if let Some(status) = child.try_wait().expect("schemathesis") {
            break status;
        }
        if started.elapsed() > DEADLINE {
            let _ = child.kill();
            let _ = child.wait();
            panic!("schemathesis ran over {DEADLINE:?}:\n{}", read(&report));
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let output = read(&report);
    eprintln!("schemathesis took {:.0?}", started.elapsed());
    assert!(
        status.success(),
        "schemathesis failed ({status}):\n{output}\n--- flotilla dev's log (tail):\n{}",
        tail(&dev)
    );
}

/// What the run needs beyond its flags (see the module's comment).
fn config_file(instance: &str) -> String {
    format!(
        r#"[dictionaries.clusters]
values = ["demo"]

[dictionaries.instances]
values = ["{instance}"]

[[operations]]
include-path-regex = '^/api/v1/clusters/\{{name\}}/instances/\{{id\}}/(start|stop|restart)$'
parameters = {{ "path.name" = {{ dictionary = "clusters", probability = 0.5 }}, "path.id" = {{ dictionary = "instances", probability = 0.5 }} }}

[[operations]]
include-name = "GET /api/v1/clusters/{{name}}/instances/{{id}}/logs"
parameters = {{ "path.name" = {{ dictionary = "clusters", probability = 0.5 }}, "path.id" = {{ dictionary = "instances", probability = 0.5 }}, "query.follow" = "false" }}

[[operations]]
include-name = "POST /api/v1/nodes/{{id}}/revoke"
parameters = {{ "path.id" = "no-such-node" }}

[[operations]]
include-name = "GET /api/v1/events"
request-timeout = 1
max-stream-events = 5
"#
    )
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// Every warning and error of dev mode's log (the run's refusals left
/// out: they are what the checks ask for), then its last 40 lines.
fn tail(dev: &Dev) -> String {
    let log = dev.log();
    let lines: Vec<&str> = log.lines().collect();
    let warnings: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| (l.contains(" WARN ") || l.contains(" ERROR ")) && !l.contains("request refused"))
        .collect();
    format!(
        "warnings and errors:\n{}\n--- last lines:\n{}",
        warnings.join("\n"),
        lines[lines.len().saturating_sub(40)..].join("\n")
    )
}
