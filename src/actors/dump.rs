//! `SIGUSR2` on the master: its actors and running operations, to the log.

use std::sync::Arc;

use super::read_model::ReadModel;

/// `kill -USR2 <master>`: every actor's state, mailbox depth, oldest
/// message and what it handles now, and every running operation's step,
/// to the log.
pub async fn on_sigusr2(rm: Arc<ReadModel>, pools: Arc<std::sync::OnceLock<Arc<crate::actors::pools::Pools>>>) {
    use tokio::signal::unix::{SignalKind, signal};
    let Ok(mut usr2) = signal(SignalKind::user_defined2()) else { return };
    while usr2.recv().await.is_some() {
        let mut actors = rm.actors();
        actors.sort_by(|a, b| (a.kind, &a.id).cmp(&(b.kind, &b.id)));
        tracing::info!(target: "flotilla::dump", actors = actors.len(), "SIGUSR2: actors");
        for a in &actors {
            let now = match (&a.current, a.current_ms) {
                (Some(c), Some(ms)) => format!("handling {c} for {ms} ms"),
                (Some(c), None) => format!("handling {c}"),
                _ => "idle".into(),
            };
            let oldest = a.oldest_message_ms.map(|ms| format!(", oldest {ms} ms")).unwrap_or_default();
            let error = a.last_error.as_deref().map(|e| format!(", last error: {e}")).unwrap_or_default();
            tracing::info!(
                target: "flotilla::dump",
                "{} {}: {}, mailbox {}{oldest}, {now}, handled {}{error}",
                a.kind, a.id, a.state, a.mailbox, a.handled
            );
        }
        for op in rm.running_operations().values() {
            let step = op.steps.iter().find(|s| s.status == crate::storage::records::StepStatus::Running);
            let step = step.map_or("between steps", |s| s.name.as_str());
            tracing::info!(target: "flotilla::dump", "operation {} {:?} on {}: {:?}, {step}", op.id, op.kind, op.cluster, op.status);
        }
        if let Some(p) = pools.get() {
            p.dump();
        }
    }
}
