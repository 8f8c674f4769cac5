//! `flotilla token create|ls|revoke`. A token is made with a scope
//! (`--scope read|operate|admin`; without one the master makes it
//! `admin`), and lists show each token's.

use reqwest::Method;
use serde_json::json;

use super::{CliError, Client, Target, table};
use crate::scope::Scope;

#[derive(Debug, clap::Subcommand)]
pub enum TokenCmd {
    /// Create a token; prints it (only now: the master keeps its hash).
    Create {
        /// What to call it (`ci`, `alice`).
        name: String,
        /// What it may do: `read` (every GET, the event stream, metrics),
        /// `operate` (read, plus the verbs on clusters and instances, and
        /// logs) or `admin` (everything). Default: admin.
        #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(Scope::NAMES))]
        scope: Option<String>,
    },
    /// List tokens (ids, names, scopes; never secrets).
    Ls,
    /// Revoke a token by id; it is refused from the answer on.
    Revoke { id: String },
}

pub async fn run(cmd: TokenCmd, target: &Target) -> Result<(), CliError> {
    let client = Client::new(target)?;
    match cmd {
        TokenCmd::Create { name, scope } => {
            let mut body = json!({ "name": name });
            if let Some(scope) = scope {
                body["scope"] = json!(scope);
            }
            let v = client.call(Method::POST, &super::dry(target, "/tokens"), Some(&body)).await?;
            if target.dry_run {
                super::show(target, &v, super::describe_dry);
            } else if target.json {
                super::out(format!("{v:#}"));
            } else {
                let (id, scope) =
                    (v["token"]["id"].as_str().unwrap_or("?"), v["token"]["scope"].as_str().unwrap_or("?"));
                eprintln!("token {id} ({name}, scope {scope}) created; it is shown only now:");
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
                                ["id", "name", "scope", "created_at"]
                                    .iter()
                                    .map(|k| t[*k].as_str().unwrap_or_default().to_string())
                                    .collect()
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                super::out(table(&["ID", "NAME", "SCOPE", "CREATED"], &rows));
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
