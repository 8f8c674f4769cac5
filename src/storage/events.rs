//! What each state change looks like in the event log (`GET
//! /api/v1/events`). Whoever writes a change builds its event here and
//! appends it in the same request ([`WriteOp::append_event`]), so the event
//! is durable exactly when the change is, numbered in commit order.
//!
//! Kinds (the SSE `event:` field) and their `data`:
//!
//! | kind | data |
//! |---|---|
//! | `cluster.created`, `cluster.status` | `status`, `description`, `operation` |
//! | `cluster.deleted` | `id` |
//! | `instance.added`, `instance.status`, `instance.removed` | `instance`, `role`, `node`, `status`, `pid`, `error` |
//! | `operation.created`, `operation.ended` | `operation`, `kind`, `status`, `error` |
//! | `operation.step_started`, `operation.step_ended` | `operation`, `step` (index), `name`, `status`, `error`, `ok`, `failed` |
//! | `operation.progress` | `operation`, `step`, `done` (instance commands answered in the step), `total` (its instances when each gets one command, else 0) |
//! | `node.status` | `node`, `status`, `connected` |
//! | `instance.leaked` | `node`, `instance`, `first_seen`, `remove_at` (unix seconds; null: never), `running`, `pid`, `unrecorded` |
//! | `instance.leak_removed` | the same, and `deleted` (removed by the master, or gone / known meanwhile), `reason` |
//! | `actor.started`, `actor.stopped`, `actor.failed` | `actor` (kind), `id`, `reason` |

use serde_json::{Value, json};
use time::OffsetDateTime;

use super::records::{
    ClusterRecord, EventRecord, InstanceRecord, InstanceStatus, NodeStatus, OperationRecord, RECORD_VERSION, StepStatus,
};
use super::{StorageError, WriteOp};

/// An event of `kind` about `cluster`, now.
pub fn event(kind: &str, cluster: Option<&str>, data: Value) -> EventRecord {
    event_json(kind, cluster, data.to_string())
}

/// Like [`event`], with `data` already as JSON text.
fn event_json(kind: &str, cluster: Option<&str>, data: String) -> EventRecord {
    EventRecord {
        version: RECORD_VERSION,
        seq: 0,
        at: OffsetDateTime::now_utc(),
        kind: kind.to_string(),
        cluster: cluster.map(str::to_string),
        data,
    }
}

/// The append of `e`.
pub fn append(e: &EventRecord) -> Result<WriteOp, StorageError> {
    WriteOp::append_event(e)
}

pub fn cluster(kind: &str, r: &ClusterRecord) -> EventRecord {
    let data = json!({
        "status": r.status,
        "description": r.status_description,
        "operation": r.operation.map(|o| o.to_string()),
    });
    event(kind, Some(&r.name), data)
}

/// `cluster.status` when the status or its description changed.
pub fn cluster_changed(old: &ClusterRecord, new: &ClusterRecord) -> Option<EventRecord> {
    (old.status != new.status || old.status_description != new.status_description)
        .then(|| cluster("cluster.status", new))
}

/// An instance event's `data`. A struct, not `json!`: four or five of these
/// are written per placed instance, and a `Value` map costs a dozen
/// allocations. Fields in the order `json!` printed them (sorted).
#[derive(serde::Serialize)]
struct InstanceData<'a> {
    error: Option<&'a str>,
    instance: &'a str,
    node: &'a str,
    pid: Option<u32>,
    role: &'a str,
    status: InstanceStatus,
}

pub fn instance(kind: &str, r: &InstanceRecord) -> EventRecord {
    let data = InstanceData {
        error: r.last_error.as_deref(),
        instance: r.id.as_str(),
        node: r.node.as_str(),
        pid: r.pid,
        role: &r.role,
        status: r.status,
    };
    // Serializing these plain fields cannot fail.
    event_json(kind, Some(&r.cluster), serde_json::to_string(&data).unwrap_or_default())
}

/// `instance.status` when the status or the pid changed.
pub fn instance_changed(old: &InstanceRecord, new: &InstanceRecord) -> Option<EventRecord> {
    (old.status != new.status || old.pid != new.pid).then(|| instance("instance.status", new))
}

pub fn operation(kind: &str, r: &OperationRecord) -> EventRecord {
    let data = json!({
        "operation": r.id.to_string(),
        "kind": r.kind,
        "status": r.status,
        "error": r.error,
    });
    event(kind, Some(&r.cluster), data)
}

/// The step events of `r` for each step whose status differs from
/// `before` (the statuses last journaled; missing ones count as Pending).
pub fn steps_changed(before: &[StepStatus], r: &OperationRecord) -> Vec<EventRecord> {
    r.steps
        .iter()
        .enumerate()
        .filter(|(i, s)| before.get(*i).copied().unwrap_or(StepStatus::Pending) != s.status)
        .map(|(i, s)| {
            let kind = match s.status {
                StepStatus::Pending | StepStatus::Running | StepStatus::Undoing => "operation.step_started",
                StepStatus::Done | StepStatus::Failed | StepStatus::Undone | StepStatus::UndoFailed => {
                    "operation.step_ended"
                }
            };
            let ok = s.results.iter().filter(|x| x.ok).count();
            let data = json!({
                "operation": r.id.to_string(),
                "step": i,
                "name": s.name,
                "status": s.status,
                "error": s.error,
                "ok": ok,
                "failed": s.results.len() - ok,
            });
            event(kind, Some(&r.cluster), data)
        })
        .collect()
}

/// `done` instance commands of the step answered so far, of `total` (0
/// when the step sends each instance several).
pub fn progress(operation: &str, cluster: &str, step: usize, done: u64, total: usize) -> EventRecord {
    let data = json!({ "operation": operation, "step": step, "done": done, "total": total });
    event("operation.progress", Some(cluster), data)
}

pub fn node(node: &str, status: NodeStatus, connected: bool) -> EventRecord {
    event("node.status", None, json!({ "node": node, "status": status, "connected": connected }))
}

/// `actor.started`, `actor.stopped` or `actor.failed`.
pub fn actor(kind: &str, actor: &str, id: &str, cluster: Option<&str>, reason: Option<&str>) -> EventRecord {
    event(kind, cluster, json!({ "actor": actor, "id": id, "reason": reason }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::records::InstanceStatus;
    use crate::storage::testdata as td;

    #[test]
    fn only_real_changes_make_events_and_data_is_a_json_object() {
        let c = td::cluster("web");
        let i = td::instance(&c, 1);
        assert!(instance_changed(&i, &i).is_none());
        let mut j = i.clone();
        j.status = InstanceStatus::Running;
        j.pid = Some(42);
        let e = instance_changed(&i, &j).expect("a status change is an event");
        assert_eq!(e.kind, "instance.status");
        assert_eq!(e.cluster.as_deref(), Some("web"));
        let data: Value = serde_json::from_str(&e.data).unwrap();
        assert_eq!(data["status"], "Running");
        assert_eq!(data["pid"], 42);
        assert_eq!(data["instance"], i.id.as_str());

        assert!(cluster_changed(&c, &c).is_none());
        let mut d = c.clone();
        d.status_description = "scale out: configuring".into();
        assert_eq!(cluster_changed(&c, &d).unwrap().kind, "cluster.status");
    }

    #[test]
    fn step_events_say_started_or_ended_for_each_changed_step() {
        let mut op = td::operation(&td::cluster("web"), td::T0);
        op.steps[0].status = StepStatus::Pending;
        op.steps = vec![op.steps[0].clone(); 3];
        assert!(steps_changed(&[], &op).is_empty(), "all pending: nothing new");
        op.steps[0].status = StepStatus::Done;
        op.steps[1].status = StepStatus::Running;
        let kinds: Vec<String> = steps_changed(&[StepStatus::Running], &op).into_iter().map(|e| e.kind).collect();
        assert_eq!(kinds, vec!["operation.step_ended", "operation.step_started"]);
        let before: Vec<StepStatus> = op.steps.iter().map(|s| s.status).collect();
        assert!(steps_changed(&before, &op).is_empty());
    }
}
