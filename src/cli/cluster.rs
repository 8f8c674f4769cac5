//! `flotilla cluster ls|get|create|scale|start|stop|restart|config|upgrade|resize|delete`.

use std::collections::BTreeMap;

use reqwest::Method;
use serde_json::{Value, json};

use super::wait::after_mutation;
use super::{CliError, Client, Target, dry, field, show, table};

#[derive(Debug, clap::Subcommand)]
pub enum ClusterCmd {
    /// Clusters with their status and instance counts.
    Ls,
    /// One cluster: status, roles, every instance.
    Get { name: String },
    /// Create a cluster: `create demo --package web:1.0.0 --role server=3 --config greeting=hi`.
    Create {
        name: String,
        /// NAME:VERSION of an uploaded package.
        #[arg(long)]
        package: String,
        /// ROLE=COUNT, once per role (roles not named get their default count).
        #[arg(long = "role", value_name = "ROLE=COUNT")]
        roles: Vec<String>,
        /// KEY=VALUE (a JSON value, or else a string), once per key.
        #[arg(long = "config", value_name = "KEY=VALUE")]
        config: Vec<String>,
        #[arg(long)]
        no_wait: bool,
    },
    /// Add instances to a role (`--add N`) or remove these (`--remove ID...`).
    Scale {
        name: String,
        role: String,
        #[arg(long, conflicts_with = "remove")]
        add: Option<u32>,
        #[arg(long, num_args = 1.., required_unless_present = "add")]
        remove: Vec<String>,
        /// Place new instances on these nodes only.
        #[arg(long = "node")]
        nodes: Vec<String>,
        #[arg(long)]
        no_wait: bool,
    },
    /// Start a cluster (or one instance with `--instance`).
    Start(Verb),
    /// Stop a cluster (or one instance).
    Stop(Verb),
    /// Restart a cluster (or one instance).
    Restart(Verb),
    /// Move one instance to another node: `replace demo --instance ID` adds
    /// a replacement elsewhere, then removes it.
    Replace(Verb),
    /// Change config values: `config demo greeting=bonjour`.
    Config {
        name: String,
        #[arg(required = true, value_name = "KEY=VALUE")]
        values: Vec<String>,
        /// Instances changed at a time (default: a quarter of each role).
        #[arg(long)]
        batch: Option<usize>,
        #[arg(long)]
        no_wait: bool,
    },
    /// Upgrade to another version of the cluster's package.
    Upgrade {
        name: String,
        version: String,
        #[arg(long)]
        batch: Option<usize>,
        #[arg(long)]
        no_wait: bool,
    },
    /// Change a role's resource limits: `resize demo server --memory 256M --cpu 0.5`.
    Resize {
        name: String,
        role: String,
        #[arg(long)]
        memory: Option<String>,
        #[arg(long)]
        cpu: Option<f64>,
        #[arg(long)]
        batch: Option<usize>,
        #[arg(long)]
        no_wait: bool,
    },
    /// An instance's log from its agent: the last lines, or followed.
    Logs {
        name: String,
        instance: String,
        /// stderr instead of stdout.
        #[arg(long)]
        stderr: bool,
        #[arg(long, default_value_t = 100)]
        tail: u32,
        /// Keep printing what the process writes (Ctrl-C to stop).
        #[arg(long, short)]
        follow: bool,
    },
    /// Delete a cluster (`--force`: go on past agents that cannot be reached).
    Delete {
        name: String,
        #[arg(long)]
        force: bool,
        #[arg(long)]
        no_wait: bool,
    },
}

#[derive(Debug, clap::Args)]
pub struct Verb {
    name: String,
    /// Only this instance.
    #[arg(long)]
    instance: Option<String>,
    #[arg(long)]
    no_wait: bool,
}

/// `KEY=VALUE` pairs; a value that parses as JSON is taken as such.
pub fn pairs(items: &[String], what: &str) -> Result<BTreeMap<String, Value>, CliError> {
    items
        .iter()
        .map(|kv| {
            let (k, v) =
                kv.split_once('=').ok_or_else(|| CliError::Usage(format!("{what} {kv:?}: expected KEY=VALUE")))?;
            let value = serde_json::from_str(v).unwrap_or_else(|_| Value::String(v.to_string()));
            Ok((k.to_string(), value))
        })
        .collect()
}

pub async fn run(cmd: ClusterCmd, target: &Target) -> Result<(), CliError> {
    let client = Client::new(target)?;
    let post = |path: String, body: Value| {
        let client = &client;
        async move { client.call(Method::POST, &dry(target, &path), Some(&body)).await }
    };
    match cmd {
        ClusterCmd::Ls => {
            let clusters = client.get_all("/clusters", "clusters").await?;
            show(target, &json!({ "clusters": clusters }), |_| {
                let rows: Vec<Vec<String>> = clusters
                    .iter()
                    .map(|c| {
                        let counts = c["instances"]
                            .as_object()
                            .map(|m| m.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(","));
                        vec![
                            field(c, "name"),
                            field(c, "status"),
                            format!("{}:{}", field(&c["package"], "name"), field(&c["package"], "version")),
                            counts.unwrap_or_default(),
                            field(c, "status_description"),
                        ]
                    })
                    .collect();
                table(&["NAME", "STATUS", "PACKAGE", "INSTANCES", "DESCRIPTION"], &rows)
            });
        }
        ClusterCmd::Get { name } => {
            let c = client.get(&format!("/clusters/{name}")).await?;
            show(target, &c, describe);
        }
        ClusterCmd::Create { name, package, roles, config, no_wait } => {
            let (pkg, version) = package
                .split_once(':')
                .ok_or_else(|| CliError::Usage(format!("--package {package:?}: expected NAME:VERSION")))?;
            let mut role_map = serde_json::Map::new();
            for (role, count) in pairs(&roles, "--role")? {
                let count = count
                    .as_u64()
                    .ok_or_else(|| CliError::Usage(format!("--role {role}: the count must be a number")))?;
                role_map.insert(role, json!({ "count": count }));
            }
            let body = json!({
                "name": name,
                "package": { "name": pkg, "version": version },
                "roles": role_map,
                "config": pairs(&config, "--config")?,
            });
            let answer = post("/clusters".into(), body).await?;
            after_mutation(&client, target, answer, no_wait).await?;
        }
        ClusterCmd::Scale { name, role, add, remove, nodes, no_wait } => {
            let mut body = json!({ "role": role });
            match add {
                Some(n) => body["add"] = json!(n),
                None => body["remove"] = json!(remove),
            }
            if !nodes.is_empty() {
                body["nodes"] = json!(nodes);
            }
            let answer = post(format!("/clusters/{name}/scale"), body).await?;
            after_mutation(&client, target, answer, no_wait).await?;
        }
        ClusterCmd::Start(v) => verb(&client, target, "start", v).await?,
        ClusterCmd::Stop(v) => verb(&client, target, "stop", v).await?,
        ClusterCmd::Restart(v) => verb(&client, target, "restart", v).await?,
        ClusterCmd::Replace(v) => {
            if v.instance.is_none() {
                return Err(CliError::Usage("replace: name the instance with --instance ID".into()));
            }
            verb(&client, target, "replace", v).await?
        }
        ClusterCmd::Config { name, values, batch, no_wait } => {
            let mut body = json!({ "config": pairs(&values, "config")? });
            if let Some(b) = batch {
                body["batch"] = json!(b);
            }
            let answer =
                client.call(Method::PATCH, &dry(target, &format!("/clusters/{name}/config")), Some(&body)).await?;
            after_mutation(&client, target, answer, no_wait).await?;
        }
        ClusterCmd::Upgrade { name, version, batch, no_wait } => {
            let mut body = json!({ "version": version });
            if let Some(b) = batch {
                body["batch"] = json!(b);
            }
            let answer = post(format!("/clusters/{name}/upgrade"), body).await?;
            after_mutation(&client, target, answer, no_wait).await?;
        }
        ClusterCmd::Resize { name, role, memory, cpu, batch, no_wait } => {
            if memory.is_none() && cpu.is_none() {
                return Err(CliError::Usage("resize: give --memory and/or --cpu".into()));
            }
            let mut body = json!({ "resources": { "memory": memory, "cpu": cpu } });
            if let Some(b) = batch {
                body["batch"] = json!(b);
            }
            let answer = client
                .call(Method::PATCH, &dry(target, &format!("/clusters/{name}/roles/{role}")), Some(&body))
                .await?;
            after_mutation(&client, target, answer, no_wait).await?;
        }
        ClusterCmd::Logs { name, instance, stderr, tail, follow } => {
            let stream = if stderr { "stderr" } else { "stdout" };
            let path =
                format!("/clusters/{name}/instances/{instance}/logs?stream={stream}&tail={tail}&follow={follow}");
            let mut resp = client.get_stream(&path, None).await?;
            use std::io::Write;
            let mut stdout = std::io::stdout();
            while let Some(chunk) = resp.chunk().await.map_err(|e| CliError::Unreachable(e.to_string()))? {
                if stdout.write_all(&chunk).and_then(|()| stdout.flush()).is_err() {
                    std::process::exit(0);
                }
            }
        }
        ClusterCmd::Delete { name, force, no_wait } => {
            let path = if force { format!("/clusters/{name}?force=true") } else { format!("/clusters/{name}") };
            let answer = client.call(Method::DELETE, &dry(target, &path), None).await?;
            after_mutation(&client, target, answer, no_wait).await?;
        }
    }
    Ok(())
}

async fn verb(client: &Client, target: &Target, verb: &str, v: Verb) -> Result<(), CliError> {
    let path = match &v.instance {
        Some(id) => format!("/clusters/{}/instances/{id}/{verb}", v.name),
        None => format!("/clusters/{}/{verb}", v.name),
    };
    let answer = client.call(Method::POST, &dry(target, &path), None).await?;
    after_mutation(client, target, answer, v.no_wait).await
}

/// A preview for people: each step, its instances, what each member does.
pub fn describe_preview(p: &Value) -> String {
    let mut out = format!("dry run of {}: nothing was changed\n", field(p, "kind"));
    for i in p["new_instances"].as_array().into_iter().flatten() {
        out.push_str(&format!("  new {} on {} ports {}\n", field(i, "id"), field(i, "node"), i["ports"]));
    }
    for s in p["steps"].as_array().into_iter().flatten() {
        let n = s["instances"].as_array().map_or(0, Vec::len);
        out.push_str(&format!("  step {:<28} {:<16} {n} instance(s)\n", field(s, "name"), field(s, "action")));
        for (id, what) in s["members"].as_object().into_iter().flatten() {
            out.push_str(&format!("    {id}: {}\n", what.as_str().unwrap_or("")));
        }
    }
    out.trim_end().to_string()
}

/// A cluster for people: a header, then its instances.
fn describe(c: &Value) -> String {
    let mut out = format!(
        "{}  {}  {}:{}\n{}\n\n",
        field(c, "name"),
        field(c, "status"),
        field(&c["package"], "name"),
        field(&c["package"], "version"),
        field(c, "status_description"),
    );
    let rows: Vec<Vec<String>> = c["instances"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|i| {
                    let ports = i["ports"]
                        .as_object()
                        .map(|m| m.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(","));
                    vec![
                        field(i, "id"),
                        field(i, "role"),
                        field(i, "node"),
                        field(i, "status"),
                        field(i, "pid"),
                        ports.unwrap_or_default(),
                    ]
                })
                .collect()
        })
        .unwrap_or_default();
    out.push_str(&table(&["INSTANCE", "ROLE", "NODE", "STATUS", "PID", "PORTS"], &rows));
    out
}
