//! Waiting for an operation: a progress bar (on a terminal) while it
//! runs, then its outcome as the exit code.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressStyle};
use serde_json::Value;

use super::{CliError, Client, Target};

const TERMINAL: [&str; 4] = ["Succeeded", "Failed", "RolledBack", "Cancelled"];

/// The step that runs now, by name.
fn current_step(op: &Value) -> String {
    op["steps"]
        .as_array()
        .and_then(|s| s.iter().find(|s| s["status"] == "Running" || s["status"] == "Undoing"))
        .and_then(|s| s["name"].as_str())
        .unwrap_or("")
        .to_string()
}

/// Follows operation `id` to its end and answers it (whatever its status).
pub async fn follow(client: &Client, target: &Target, id: &str) -> Result<Value, CliError> {
    let bar = if std::io::stderr().is_terminal() && !target.json {
        let b = ProgressBar::new(0);
        b.set_style(
            ProgressStyle::with_template("{spinner} {elapsed_precise} [{bar:30}] {pos}/{len} {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        b.enable_steady_tick(std::time::Duration::from_millis(120));
        Some(b)
    } else {
        None
    };
    let op = loop {
        let v = client.get(&format!("/operations/{id}?wait=2")).await?;
        let op = v["operation"].clone();
        if let Some(b) = &bar {
            b.set_length(op["progress"]["total"].as_u64().unwrap_or(0));
            b.set_position(op["progress"]["done"].as_u64().unwrap_or(0));
            b.set_message(format!(
                "{} {}: {}",
                op["kind"].as_str().unwrap_or(""),
                op["cluster"].as_str().unwrap_or(""),
                current_step(&op)
            ));
        }
        if TERMINAL.contains(&op["status"].as_str().unwrap_or("")) {
            break op;
        }
    };
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    Ok(op)
}

/// `Ok(op)` when it succeeded, else the failure with its reason.
pub fn outcome(op: Value) -> Result<Value, CliError> {
    let status = op["status"].as_str().unwrap_or("").to_string();
    if status == "Succeeded" {
        return Ok(op);
    }
    Err(CliError::Operation {
        id: op["id"].as_str().unwrap_or("").to_string(),
        status,
        message: op["error"].as_str().unwrap_or("no reason given").to_string(),
    })
}

/// After a mutating call answered `{"operation": ...}`: wait for it unless
/// `no_wait`, then print it (JSON, or a line).
pub async fn after_mutation(client: &Client, target: &Target, answer: Value, no_wait: bool) -> Result<(), CliError> {
    if answer["dry_run"] == true {
        super::show(target, &answer, super::cluster::describe_preview);
        return Ok(());
    }
    let id = answer["operation"]["id"].as_str().unwrap_or_default().to_string();
    let kind = answer["operation"]["kind"].as_str().unwrap_or("operation").to_string();
    if no_wait {
        super::show(target, &answer["operation"], |_| format!("{kind} {id} started"));
        return Ok(());
    }
    let op = follow(client, target, &id).await?;
    if target.json {
        super::out(format!("{op:#}"));
    }
    outcome(op)?;
    if !target.json {
        super::out(format!("{kind} {id} succeeded"));
    }
    Ok(())
}
