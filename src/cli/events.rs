//! `flotilla events`: the event stream, one line per event (or the JSON
//! of each with `--json`), resuming after a dropped connection (a master
//! restart) from the last event it printed, retrying with backoff until the
//! master answers again.

use serde_json::Value;

use super::{CliError, Client, Target};

#[derive(Debug, clap::Args)]
pub struct EventsArgs {
    /// Start after this event (0: everything the master keeps); default: from now.
    #[arg(long)]
    after: Option<u64>,
    #[arg(long)]
    cluster: Option<String>,
    /// Kinds, comma-separated; one ending in `.` matches by prefix (`operation.`).
    #[arg(long)]
    kind: Option<String>,
}

pub async fn run(args: EventsArgs, target: &Target) -> Result<(), CliError> {
    let client = Client::new(target)?;
    let mut query = Vec::new();
    if let Some(c) = &args.cluster {
        query.push(format!("cluster={c}"));
    }
    if let Some(k) = &args.kind {
        query.push(format!("kind={k}"));
    }
    let path = if query.is_empty() { "/events".to_string() } else { format!("/events?{}", query.join("&")) };
    let mut last = args.after;
    let mut backoff = std::time::Duration::from_millis(500);
    loop {
        // A master that is restarting (refused, or 503 while it starts) is
        // waited for; a refused token or a bad request ends the command.
        let mut resp = match client.get_stream(&path, last).await {
            Ok(r) => r,
            Err(CliError::Unreachable(_) | CliError::Api { status: 503, .. }) => {
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(std::time::Duration::from_secs(5));
                continue;
            }
            Err(e) => return Err(e),
        };
        backoff = std::time::Duration::from_millis(500);
        let mut buf: Vec<u8> = Vec::new();
        loop {
            let chunk = match resp.chunk().await {
                Ok(Some(c)) => c,
                // The master went away: reconnect from the last event printed.
                Ok(None) | Err(_) => break,
            };
            buf.extend_from_slice(&chunk);
            while let Some(end) = buf.windows(2).position(|w| w == b"\n\n") {
                let block: Vec<u8> = buf.drain(..end + 2).collect();
                let text = String::from_utf8_lossy(&block);
                let Some(data) = text.lines().find_map(|l| l.strip_prefix("data: ")) else { continue };
                let v: Value = serde_json::from_str(data).unwrap_or(Value::Null);
                if text.lines().any(|l| l == "event: dropped") {
                    return Err(CliError::Api {
                        status: 410,
                        code: "dropped".into(),
                        message: v["reason"].as_str().unwrap_or("dropped by the master").to_string(),
                    });
                }
                last = v["id"].as_u64().or(last);
                if target.json {
                    super::out(format!("{v}"));
                } else {
                    super::out(format!(
                        "{:>8}  {}  {:<24} {:<12} {}",
                        v["id"],
                        v["at"].as_str().unwrap_or(""),
                        v["kind"].as_str().unwrap_or(""),
                        v["cluster"].as_str().unwrap_or("-"),
                        v["data"]
                    ));
                }
            }
        }
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
}
