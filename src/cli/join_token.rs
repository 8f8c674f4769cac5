//! `flotilla node token create|ls|rm`: the join tokens agents enroll with.

use reqwest::Method;
use serde_json::json;

use super::{CliError, Client, Target, field, table};

#[derive(Debug, clap::Subcommand)]
pub enum JoinTokenCmd {
    /// Make a join token; prints it (only now: the master keeps its hash).
    /// Start an agent with it once: `flotilla agent --join-token T ...`
    /// (or FLOTILLA_AGENT_JOIN_TOKEN=T).
    Create {
        /// What it is for (`rack-7`).
        #[arg(long, default_value = "join")]
        name: String,
        /// How long it stays good: `90s`, `30m`, `1h`, `7d` (at most a week).
        #[arg(long, default_value = "1h")]
        ttl: String,
        /// How many agents may enroll with it.
        #[arg(long, default_value_t = 1)]
        uses: u32,
        /// Enroll only this node id (an agent started with another
        /// `--node-id` is refused); any node id without it.
        #[arg(long, value_name = "ID")]
        node: Option<String>,
    },
    /// List join tokens not expired (ids, names, uses left, the node each
    /// is bound to; never secrets).
    Ls,
    /// Delete a join token: no agent enrolls with it from then on.
    Rm { id: String },
}

/// `90s`, `30m`, `1h`, `7d` (or plain seconds) in seconds.
fn parse_ttl(s: &str) -> Result<u64, CliError> {
    let bad = || CliError::Usage(format!("--ttl {s:?}: expected a number with s, m, h or d (e.g. 1h)"));
    let s = s.trim();
    let (digits, unit) = match s.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let n: u64 = digits.parse().map_err(|_| bad())?;
    let unit = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(bad()),
    };
    n.checked_mul(unit).ok_or_else(bad)
}

pub async fn run(cmd: JoinTokenCmd, client: &Client, target: &Target) -> Result<(), CliError> {
    match cmd {
        JoinTokenCmd::Create { name, ttl, uses, node } => {
            let mut body = json!({ "name": name, "ttl_seconds": parse_ttl(&ttl)?, "uses": uses });
            if let Some(node) = &node {
                body["node"] = json!(node);
            }
            let v = client.call(Method::POST, "/join-tokens", Some(&body)).await?;
            if target.json {
                super::out(format!("{v:#}"));
            } else {
                let t = &v["token"];
                let bound = t["node"].as_str().map(|n| format!(" of node {n}")).unwrap_or_default();
                eprintln!(
                    "join token {} ({name}) made: good for {} enrollment(s){bound} until {}; it is shown only now:",
                    field(t, "id"),
                    field(t, "uses_left"),
                    field(t, "expires_at")
                );
                super::out(v["secret"].as_str().unwrap_or_default());
            }
        }
        JoinTokenCmd::Ls => {
            let v = client.call(Method::GET, "/join-tokens", None).await?;
            super::show(target, &v, |v| {
                let rows: Vec<Vec<String>> = v["join_tokens"]
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .map(|t| {
                                ["id", "name", "uses_left", "expires_at", "node"].iter().map(|k| field(t, k)).collect()
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                table(&["ID", "NAME", "USES LEFT", "EXPIRES", "NODE"], &rows)
            });
        }
        JoinTokenCmd::Rm { id } => {
            if id.is_empty() || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(CliError::Usage(format!("{id:?} is not a join token id (see `flotilla node token ls`)")));
            }
            let v = client.call(Method::DELETE, &format!("/join-tokens/{id}"), None).await?;
            super::show(target, &v, |_| format!("deleted join token {id}"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttls_parse_with_units_and_refuse_anything_else() {
        assert_eq!(parse_ttl("90").unwrap(), 90);
        assert_eq!(parse_ttl("90s").unwrap(), 90);
        assert_eq!(parse_ttl("30m").unwrap(), 1800);
        assert_eq!(parse_ttl("1h").unwrap(), 3600);
        assert_eq!(parse_ttl("7d").unwrap(), 604_800);
        for bad in ["", "h", "1w", "-1h", "1.5h", "99999999999999999999d"] {
            assert!(parse_ttl(bad).is_err(), "{bad:?} accepted");
        }
    }
}
