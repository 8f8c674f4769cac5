//! `flotilla pool ls`, `flotilla node request ls|create`, `flotilla node
//! hold`: node pools and the requests they serve (`GET /pools`,
//! `/node-requests`, `POST /nodes/{id}/hold`).

use serde_json::{Value, json};

use super::{CliError, Client, Target, field, show, table};

#[derive(Debug, clap::Subcommand)]
pub enum PoolCmd {
    /// Pools: driver, labels, nodes by lifecycle state, health, last error.
    Ls,
}

#[derive(Debug, clap::Subcommand)]
pub enum RequestCmd {
    /// Node requests, newest first.
    Ls {
        #[arg(long, default_value_t = 20)]
        limit: usize,
    },
    /// Ask the pools for nodes carrying the labels.
    Create {
        /// A label every node must carry, KEY=VALUE (repeatable).
        #[arg(long = "label", value_name = "KEY=VALUE")]
        labels: Vec<String>,
        #[arg(long, default_value_t = 1)]
        count: u32,
    },
}

pub async fn pool(cmd: PoolCmd, target: &Target) -> Result<(), CliError> {
    let client = Client::new(target)?;
    match cmd {
        PoolCmd::Ls => {
            let v = client.get("/pools").await?;
            show(target, &v, |v| {
                let pools = v["pools"].as_array().cloned().unwrap_or_default();
                if pools.is_empty() {
                    return "this master has no node pools ([[node_pools]] in its config)".into();
                }
                let rows: Vec<Vec<String>> = pools.iter().map(pool_row).collect();
                let mut out = table(&["POOL", "DRIVER", "LABELS", "NODES", "MAX", "WAITING", "HEALTH"], &rows);
                for p in pools.iter().filter(|p| p["last_error"].is_string()) {
                    out.push_str(&format!("\n{}: {}", field(p, "name"), field(p, "last_error")));
                }
                out
            });
        }
    }
    Ok(())
}

fn pool_row(p: &Value) -> Vec<String> {
    let by_state: Vec<String> = p["nodes_by_state"]
        .as_object()
        .map(|m| m.iter().map(|(k, n)| format!("{n} {k}")).collect())
        .unwrap_or_default();
    vec![
        field(p, "name"),
        field(p, "driver"),
        labels(&p["labels"]),
        if by_state.is_empty() { "-".into() } else { by_state.join(", ") },
        field(p, "capacity"),
        field(p, "requests_waiting"),
        field(p, "health"),
    ]
}

fn labels(v: &Value) -> String {
    match v.as_object() {
        Some(m) if !m.is_empty() => {
            m.iter().map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("?"))).collect::<Vec<_>>().join(",")
        }
        _ => "-".into(),
    }
}

pub async fn request(cmd: RequestCmd, client: &Client, target: &Target) -> Result<(), CliError> {
    match cmd {
        RequestCmd::Ls { limit } => {
            let v = client.get(&format!("/node-requests?limit={}", limit.clamp(1, 1000))).await?;
            show(target, &v, |v| {
                let rows: Vec<Vec<String>> =
                    v["node_requests"].as_array().map(|a| a.iter().map(request_row).collect()).unwrap_or_default();
                table(&["REQUEST", "LABELS", "COUNT", "REQUESTOR", "STATE", "POOL", "REASONS"], &rows)
            });
        }
        RequestCmd::Create { labels, count } => {
            let mut map = serde_json::Map::new();
            for l in &labels {
                let (k, v) =
                    l.split_once('=').ok_or_else(|| CliError::Usage(format!("--label {l:?}: expected KEY=VALUE")))?;
                map.insert(k.to_string(), json!(v));
            }
            let body = json!({ "labels": map, "count": count });
            let v = client.call(reqwest::Method::POST, "/node-requests", Some(&body)).await?;
            show(target, &v, |v| {
                format!(
                    "node request {} filed ({} node(s)); follow it with `flotilla node request ls`",
                    field(v, "id"),
                    count
                )
            });
        }
    }
    Ok(())
}

fn request_row(r: &Value) -> Vec<String> {
    let reasons: Vec<String> = r["reasons"]
        .as_array()
        .map(|a| a.iter().filter_map(|s| s.as_str().map(String::from)).collect())
        .unwrap_or_default();
    vec![
        field(r, "id"),
        labels(&r["labels"]),
        field(r, "count"),
        field(r, "requestor"),
        field(r, "state"),
        field(r, "pool"),
        if reasons.is_empty() { "-".into() } else { reasons.join("; ") },
    ]
}

/// `flotilla node hold ID [--for 2h | --until T | --release]`.
pub async fn hold(
    client: &Client,
    target: &Target,
    id: &str,
    for_: Option<String>,
    until: Option<String>,
    release: bool,
) -> Result<(), CliError> {
    crate::ids::validate_name(id).map_err(|m| CliError::Usage(format!("node id {id:?}: {m}")))?;
    let mut body = serde_json::Map::new();
    if let Some(f) = for_ {
        body.insert("for".into(), json!(f));
    }
    if let Some(u) = until {
        body.insert("until".into(), json!(u));
    }
    if release {
        body.insert("release".into(), json!(true));
    }
    let v = client.call(reqwest::Method::POST, &format!("/nodes/{id}/hold"), Some(&Value::Object(body))).await?;
    show(target, &v, |v| match v["held_until"].as_str() {
        Some(t) => format!("node {id} held until {t}: no cleanup touches it"),
        None => format!("node {id} released"),
    });
    Ok(())
}
