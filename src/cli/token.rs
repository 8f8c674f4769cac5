//! `flotilla token create|ls|revoke`.

use reqwest::Method;
use serde_json::json;

use super::{CliError, Client, Target, table};

#[derive(Debug, clap::Subcommand)]
pub enum TokenCmd {
    /// Create a token; prints it (only now: the master keeps its hash).
    Create {
        /// What to call it (`ci`, `alice`).
        name: String,
    },
    /// List tokens (ids and names; never secrets).
    Ls,
    /// Revoke a token by id; it is refused from the answer on.
    Revoke { id: String },
}

pub async fn run(cmd: TokenCmd, target: &Target) -> Result<(), CliError> {
    let client = Client::new(target)?;
    match cmd {
        TokenCmd::Create { name } => {
            let v = client.call(Method::POST, &super::dry(target, "/tokens"), Some(&json!({ "name": name }))).await?;
            if target.dry_run {
                super::show(target, &v, super::describe_dry);
            } else if target.json {
                super::out(format!("{v:#}"));
            } else {
                eprintln!("token {} ({name}) created; it is shown only now:", v["token"]["id"].as_str().unwrap_or("?"));
                super::out(v["secret"].as_str().unwrap_or_default());
            }
        }
        TokenCmd::Ls => {
            let v = client.call(Method::GET, "/tokens", None).await?;
            if target.json {
                super::out(format!("{v:#}"));
            } else {
                let rows: Vec<Vec<String>> = v["tokens"]
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .map(|t| {
                                ["id", "name", "created_at"]
                                    .iter()
                                    .map(|k| t[*k].as_str().unwrap_or_default().to_string())
                                    .collect()
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                super::out(table(&["ID", "NAME", "CREATED"], &rows));
            }
        }
        TokenCmd::Revoke { id } => {
            if id.is_empty() || !id.bytes().all(|b| b.is_ascii_alphanumeric()) {
                return Err(CliError::Usage(format!("{id:?} is not a token id (see `flotilla token ls`)")));
            }
            let v = client.call(Method::DELETE, &super::dry(target, &format!("/tokens/{id}")), None).await?;
            if target.dry_run {
                super::show(target, &v, super::describe_dry);
            } else if target.json {
                super::out(format!("{v:#}"));
            } else {
                super::out(format!("revoked token {id}"));
            }
        }
    }
    Ok(())
}
