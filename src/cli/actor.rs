//! `flotilla actor ls|kill|restart`: the supervision tree as `GET
//! /actors` shows it, and the operator's verbs on it.

use reqwest::Method;

use super::{CliError, Client, Target, table};

#[derive(Debug, clap::Subcommand)]
pub enum ActorCmd {
    /// List the actors and supervised tasks (instance actors with `--cluster`).
    Ls {
        /// Only this cluster's actor and its instance actors.
        #[arg(long)]
        cluster: Option<String>,
    },
    /// Stop an actor as if it failed; its supervisor acts on it
    /// (`cluster NAME`, `node_manager NODE`, `agent_listener agent_listener`, ...).
    Kill { kind: String, id: String },
    /// Bring a given-up (failed) actor back.
    Restart { kind: String, id: String },
}

pub async fn run(cmd: ActorCmd, target: &Target) -> Result<(), CliError> {
    let client = Client::new(target)?;
    let (verb, kind, id) = match cmd {
        ActorCmd::Ls { cluster } => {
            let path = match cluster {
                Some(c) => format!("/actors?cluster={}", name(&c)?),
                None => "/actors".into(),
            };
            let v = client.call(Method::GET, &path, None).await?;
            if target.json {
                super::out(format!("{v:#}"));
                return Ok(());
            }
            let text = |a: &serde_json::Value, k: &str| match &a[k] {
                serde_json::Value::String(s) => s.clone(),
                serde_json::Value::Null => "-".into(),
                other => other.to_string(),
            };
            let rows: Vec<Vec<String>> = v["actors"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .map(|a| {
                            let exit = a["last_exit"]["reason"].as_str().unwrap_or("-").to_string();
                            vec![
                                format!("{}/{}", text(a, "kind"), text(a, "id")),
                                text(a, "parent"),
                                text(a, "health"),
                                text(a, "state"),
                                text(a, "mailbox"),
                                text(a, "restarts"),
                                exit,
                            ]
                        })
                        .collect()
                })
                .unwrap_or_default();
            super::out(table(&["ACTOR", "SUPERVISOR", "HEALTH", "STATE", "MAILBOX", "RESTARTS", "LAST EXIT"], &rows));
            return Ok(());
        }
        ActorCmd::Kill { kind, id } => ("kill", kind, id),
        ActorCmd::Restart { kind, id } => ("restart", kind, id),
    };
    let path = format!("/actors/{}/{}/{verb}", name(&kind)?, name(&id)?);
    let v = client.call(Method::POST, &path, None).await?;
    if target.json {
        super::out(format!("{v:#}"));
    } else {
        super::out(v["done"].as_str().unwrap_or_default());
    }
    Ok(())
}

/// A kind, an id or a cluster name: letters, digits, `_`, `.` and `-`.
fn name(s: &str) -> Result<&str, CliError> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-')) {
        return Err(CliError::Usage(format!(
            "{s:?} is not an actor kind, id or cluster name (see `flotilla actor ls`)"
        )));
    }
    Ok(s)
}
