//! `flotilla package push|ls|rm`, `flotilla node ls|get|cordon|...`, `flotilla op ls|get|watch`.

use std::path::PathBuf;

use reqwest::Method;
use serde_json::{Value, json};

use super::{CliError, Client, Target, field, show, table};

#[derive(Debug, clap::Subcommand)]
pub enum PackageCmd {
    /// Upload a package: a folder with component.toml at its root (packed
    /// here), or a .tar.gz. Name and version come from its component.toml.
    Push { path: PathBuf },
    /// Uploaded packages.
    Ls,
    /// Delete a package version (refused while a cluster uses it).
    Rm { name: String, version: String },
}

#[derive(Debug, clap::Subcommand)]
pub enum NodeCmd {
    /// Nodes: status, heartbeat age, address, instances.
    Ls,
    /// One node (with the certificate it connects with).
    Get { id: String },
    /// Join tokens agents enroll with: create, ls, rm.
    Token {
        #[command(subcommand)]
        cmd: super::join_token::JoinTokenCmd,
    },
    /// Revoke a node's certificate: its link is closed at once and it
    /// cannot connect again until it enrolls with a new join token.
    Revoke { id: String },
    /// Take a node out of placement: no new instance goes there; what
    /// runs there stays.
    Cordon {
        id: String,
        /// Why (shown with the node).
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// Put a cordoned node back into placement.
    Uncordon { id: String },
    /// Keep a node a pool launched out of every cleanup (a failed launch
    /// kept for debugging, a suspect machine) until the hold expires.
    Hold {
        id: String,
        /// For this long (default 24h).
        #[arg(long = "for", conflicts_with_all = ["until", "release"])]
        for_: Option<String>,
        /// Until this time (RFC 3339).
        #[arg(long, conflicts_with = "release")]
        until: Option<String>,
        /// End the hold.
        #[arg(long)]
        release: bool,
    },
    /// Remove a node a pool launched: cordoned, drained (it must hold no
    /// instance), deleted through its driver, forgotten.
    Remove { id: String },
    /// Node requests: ls, create.
    Request {
        #[command(subcommand)]
        cmd: super::pools::RequestCmd,
    },
}

#[derive(Debug, clap::Subcommand)]
pub enum OpCmd {
    /// Operations, newest first.
    Ls {
        #[arg(long)]
        cluster: Option<String>,
        #[arg(long, default_value_t = 20)]
        limit: usize,
    },
    /// One operation with its steps and per-instance results.
    Get { id: String },
    /// Follow an operation to its end (exit code 0 only if it succeeded).
    Watch { id: String },
}

/// Name, version and bytes of the package at `path`.
fn pack(path: &std::path::Path) -> Result<(String, String, Vec<u8>), CliError> {
    if path.is_dir() {
        return crate::package::pack_dir(path).map_err(|e| CliError::Usage(format!("{}: {e}", path.display())));
    }
    let info = crate::package::inspect_package(path, &crate::package::ExtractLimits::default())
        .map_err(|e| CliError::Usage(format!("{}: {}", path.display(), crate::error::ErrorChain(&e))))?;
    let spec = crate::spec::ComponentSpec::parse(&info.spec_toml)
        .map_err(|e| CliError::Usage(format!("{}: component.toml: {e}", path.display())))?;
    let bytes = std::fs::read(path).map_err(|e| CliError::Usage(format!("{}: {e}", path.display())))?;
    Ok((spec.component.name.clone(), spec.component.version.clone(), bytes))
}

pub async fn package(cmd: PackageCmd, target: &Target) -> Result<(), CliError> {
    let client = Client::new(target)?;
    match cmd {
        PackageCmd::Push { path } => {
            let (name, version, bytes) = pack(&path)?;
            let v = client.put_bytes(&super::dry(target, &format!("/packages/{name}/{version}")), bytes).await?;
            if target.dry_run {
                show(target, &v, super::describe_dry);
            } else {
                show(target, &v, |v| format!("{name}:{version} uploaded (sha256 {})", field(&v["package"], "sha256")));
            }
        }
        PackageCmd::Ls => {
            let v = client.get("/packages").await?;
            show(target, &v, |v| {
                let rows: Vec<Vec<String>> = v["packages"]
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .map(|p| {
                                vec![field(p, "name"), field(p, "version"), field(p, "size"), field(p, "uploaded_at")]
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                table(&["NAME", "VERSION", "BYTES", "UPLOADED"], &rows)
            });
        }
        PackageCmd::Rm { name, version } => {
            let v =
                client.call(Method::DELETE, &super::dry(target, &format!("/packages/{name}/{version}")), None).await?;
            if target.dry_run {
                show(target, &v, super::describe_dry);
            } else {
                show(target, &v, |_| format!("{name}:{version} deleted"));
            }
        }
    }
    Ok(())
}

pub async fn node(cmd: NodeCmd, target: &Target) -> Result<(), CliError> {
    let client = Client::new(target)?;
    match cmd {
        NodeCmd::Ls => {
            let nodes = client.get_all("/nodes", "nodes").await?;
            show(target, &json!({ "nodes": nodes }), |_| {
                let rows: Vec<Vec<String>> = nodes.iter().map(node_row).collect();
                table(&["NODE", "STATUS", "HEARTBEAT", "ADDRESS", "INSTANCES", "KIND", "ORIGIN"], &rows)
            });
        }
        NodeCmd::Get { id } => {
            let v = client.get(&format!("/nodes/{id}")).await?;
            show(target, &v, |v| {
                let n = if v["node"].is_object() { &v["node"] } else { v };
                let mut out =
                    table(&["NODE", "STATUS", "HEARTBEAT", "ADDRESS", "INSTANCES", "KIND", "ORIGIN"], &[node_row(n)]);
                let c = &n["certificate"];
                if c.is_object() {
                    let revoked = c["revoked_at"].as_str().map(|t| format!(", REVOKED {t}")).unwrap_or_default();
                    out.push_str(&format!(
                        "\ncertificate {} (issued {}, join token {}{revoked})",
                        field(c, "fingerprint"),
                        field(c, "issued_at"),
                        field(c, "token_id")
                    ));
                }
                out
            });
        }
        NodeCmd::Token { cmd } => return super::join_token::run(cmd, &client, target).await,
        NodeCmd::Remove { id } => {
            crate::ids::validate_name(&id).map_err(|m| CliError::Usage(format!("node id {id:?}: {m}")))?;
            let v = client.call(reqwest::Method::POST, &format!("/nodes/{id}/remove"), None).await?;
            show(target, &v, |v| {
                format!(
                    "node {id} is {}: it is deleted once seen empty (follow it with `flotilla pool ls`)",
                    field(v, "state")
                )
            });
        }
        NodeCmd::Request { cmd } => return super::pools::request(cmd, &client, target).await,
        NodeCmd::Hold { id, for_, until, release } => {
            return super::pools::hold(&client, target, &id, for_, until, release).await;
        }
        NodeCmd::Revoke { id } => {
            crate::ids::validate_name(&id).map_err(|m| CliError::Usage(format!("node id {id:?}: {m}")))?;
            let v = client.call(reqwest::Method::POST, &format!("/nodes/{id}/revoke"), None).await?;
            show(target, &v, |v| {
                let gone = if v["disconnected"] == true { "; its link is closed" } else { "" };
                format!("revoked the certificate of node {id}{gone}")
            });
        }
        NodeCmd::Cordon { id, reason } => {
            crate::ids::validate_name(&id).map_err(|m| CliError::Usage(format!("node id {id:?}: {m}")))?;
            let body = json!({ "reason": reason });
            let v = client.call(reqwest::Method::POST, &format!("/nodes/{id}/cordon"), Some(&body)).await?;
            show(target, &v, |v| format!("node {id} cordoned since {}", field(&v["cordon"], "since")));
        }
        NodeCmd::Uncordon { id } => {
            crate::ids::validate_name(&id).map_err(|m| CliError::Usage(format!("node id {id:?}: {m}")))?;
            let v = client.call(reqwest::Method::POST, &format!("/nodes/{id}/uncordon"), None).await?;
            show(target, &v, |v| {
                if v["changed"] == true {
                    format!("node {id} uncordoned")
                } else {
                    format!("node {id} was not cordoned")
                }
            });
        }
    }
    Ok(())
}

fn node_row(n: &Value) -> Vec<String> {
    let age = n["heartbeat_age_ms"].as_u64().map(|ms| format!("{:.1}s ago", ms as f64 / 1000.0));
    let mut status =
        if n["connected"] == true { field(n, "status") } else { format!("{} (disconnected)", field(n, "status")) };
    if n["cordon"].is_object() {
        status.push_str(", cordoned");
    }
    vec![
        field(n, "id"),
        status,
        age.unwrap_or_else(|| "-".into()),
        field(n, "address"),
        field(n, "instance_count"),
        if n["simulated"] == true { "simulated".into() } else { "agent".into() },
        match n["origin"]["pool"].as_str() {
            Some(pool) => format!("pool {pool} ({})", field(n, "lifecycle")),
            None => "manual".into(),
        },
    ]
}

pub async fn op(cmd: OpCmd, target: &Target) -> Result<(), CliError> {
    let client = Client::new(target)?;
    match cmd {
        OpCmd::Ls { cluster, limit } => {
            let mut path = format!("/operations?limit={}", limit.clamp(1, 1000));
            if let Some(c) = cluster {
                path.push_str(&format!("&cluster={c}"));
            }
            let v = client.get(&path).await?;
            show(target, &v, |v| {
                let rows: Vec<Vec<String>> = v["operations"]
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .map(|o| {
                                vec![
                                    field(o, "id"),
                                    field(o, "kind"),
                                    field(o, "cluster"),
                                    field(o, "status"),
                                    field(o, "created_at"),
                                ]
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                table(&["OPERATION", "KIND", "CLUSTER", "STATUS", "CREATED"], &rows)
            });
        }
        OpCmd::Get { id } => {
            let v = client.get(&format!("/operations/{id}")).await?;
            show(target, &v["operation"], describe_op);
        }
        OpCmd::Watch { id } => {
            let op = super::wait::follow(&client, target, &id).await?;
            show(target, &op, describe_op);
            super::wait::outcome(op)?;
        }
    }
    Ok(())
}

/// An operation for people: its header, then each step and its failures.
fn describe_op(o: &Value) -> String {
    let mut out = format!(
        "{} {} on {}: {}{}\n",
        field(o, "kind"),
        field(o, "id"),
        field(o, "cluster"),
        field(o, "status"),
        o["error"].as_str().map(|e| format!(" ({e})")).unwrap_or_default()
    );
    for s in o["steps"].as_array().into_iter().flatten() {
        let results = s["results"].as_array().cloned().unwrap_or_default();
        let ok = results.iter().filter(|r| r["ok"] == true).count();
        out.push_str(&format!("  {:<28} {:<10} {ok}/{} ok\n", field(s, "name"), field(s, "status"), results.len()));
        for r in results.iter().filter(|r| r["ok"] != true) {
            out.push_str(&format!(
                "    {}: {} (exit {})\n",
                field(r, "instance"),
                field(r, "message"),
                field(r, "exit_code")
            ));
            let tail = field(r, "stderr_tail");
            if !tail.is_empty() && tail != "-" {
                out.push_str(&format!("      stderr: {}\n", tail.trim_end().replace('\n', "\n      ")));
            }
        }
    }
    out.trim_end().to_string()
}
