//! What the agent's events mean: each exit, restart and spawn it reports
//! becomes an observation routed to its instance's cluster actor.

use std::time::Duration;

use actix::prelude::*;

use super::NodeManagerActor;
use super::ack::Ack;
use crate::actors::instance::Observation;
use crate::ids::{InstanceId, NodeId};
use crate::protocol::messages::AgentEvent;

impl NodeManagerActor {
    pub(super) fn report(&mut self, event: AgentEvent, ack: Option<Ack>, ctx: &mut Context<Self>) {
        match event {
            AgentEvent::Heartbeat => {
                if let Some(a) = ack {
                    a.send();
                }
            }
            AgentEvent::ProcessExited {
                instance,
                pid,
                exit_code,
                signal,
                stderr_tail,
                restart_in_ms,
                attempt,
                max_attempts,
            } => {
                let restart =
                    restart_in_ms.map(|ms| Restart { delay: Duration::from_millis(ms), attempt, max_attempts });
                let description = exit_description(&instance, &self.node, exit_code, signal, &stderr_tail, restart);
                let observation = Observation::Exited { pid, description, restarting: restart_in_ms.is_some() };
                self.route(instance, observation, ack, ctx);
            }
            AgentEvent::ProcessRestarted { instance, pid, error } => {
                let error =
                    error.map(|e| format!("instance {instance} on node {} could not be restarted: {e}", self.node));
                self.route(instance, Observation::Restarted { pid, error }, ack, ctx);
            }
            AgentEvent::ProcessSpawned { instance, generation, pid } => {
                self.route(instance, Observation::Spawned { generation, pid }, ack, ctx);
            }
        }
    }
}

/// What an operator reads about an unexpected exit.
pub fn exit_description(
    instance: &InstanceId,
    node: &NodeId,
    exit_code: Option<i32>,
    signal: Option<i32>,
    stderr_tail: &str,
    restart: Option<Restart>,
) -> String {
    let how = match (exit_code, signal) {
        (Some(c), _) => format!("exit code {c}"),
        (None, Some(s)) => format!("signal {s}"),
        _ => "unknown status".into(),
    };
    let mut description = format!("instance {instance} on node {node} exited unexpectedly ({how})");
    if !stderr_tail.trim().is_empty() {
        description.push_str(&format!("; stderr: {}", stderr_tail.trim()));
    }
    match restart {
        Some(Restart { delay, attempt, max_attempts }) => description.push_str(&format!(
            "; its agent restarts it in {} (restart {attempt} of at most {max_attempts})",
            humantime::format_duration(delay)
        )),
        None => description.push_str("; its agent's restart policy gave up (or is off)"),
    }
    description
}

/// A restart the agent's policy announced with an exit.
#[derive(Debug, Clone, Copy)]
pub struct Restart {
    pub delay: Duration,
    /// Which restart in the policy's window, and the most it allows there.
    pub attempt: u32,
    pub max_attempts: u32,
}
