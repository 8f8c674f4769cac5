//! The step that waits for nodes ([`Action::AwaitNodes`]): a role whose
//! new instances need more nodes than are `Ready` with its labels files a
//! node request with the pools, waits until it is served, then places the
//! instances (on the request's nodes and any other free one) and journals
//! where they go, so the `allocate` step after it creates them.
//!
//! Run again after a master restart, it finds its request by its
//! requestor (`operation:<id>/<role>`) instead of filing a second one, and
//! a placement already journaled is kept.

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::ops::{ClusterOps, fail};
use super::writes::{JOURNAL_RETRIES, commit_retrying};
use crate::actors::pools::{NewRequest, OPERATION_PRIORITY, Pools};
use crate::actors::supervisor::{fitting_nodes, place_instances, wanted_labels};
use crate::ids::{InstanceId, NodeId};
use crate::operations::StepFailure;
use crate::storage::WriteOp;
use crate::storage::pool_records::RequestState;
use crate::storage::records::InstanceResult;

/// How often the request is looked at.
const POLL: Duration = Duration::from_millis(250);

impl ClusterOps {
    pub(super) async fn await_nodes(
        &self,
        role: &str,
        first_ordinal: u32,
        nodes: u32,
        ids: &[InstanceId],
    ) -> Result<Vec<InstanceResult>, StepFailure> {
        let placed_on = |core: &super::Core, id: &InstanceId| {
            core.pending
                .get(id)
                .map(|p| p.node.clone())
                .or_else(|| core.instances.get(id).map(|h| h.record().node.clone()))
        };
        // Placed before a restart (the placement journaled, the step not).
        {
            let core = self.core.borrow();
            let known: Vec<(InstanceId, NodeId)> =
                ids.iter().filter_map(|id| placed_on(&core, id).map(|n| (id.clone(), n))).collect();
            if known.len() == ids.len() {
                return Ok(known.iter().map(|(id, n)| InstanceResult::ok(id, format!("placed on {n}"))).collect());
            }
            // A role's instances are placed together: never some of them.
            if !known.is_empty() {
                return Err(fail(format!("{} of the {} instances are placed already", known.len(), ids.len())));
            }
        }
        let op = self.plan.borrow().as_ref().map(|(op, _)| *op).ok_or_else(|| fail("no operation runs".into()))?;
        // The nodes placed on already (other roles, at validation) stay
        // out of their pools' retirement while this waits.
        let placed_nodes: Vec<NodeId> = self.core.borrow().pending.values().map(|p| p.node.clone()).collect();
        self.hold(&placed_nodes)?;
        let requestor = format!("operation:{op}/{role}");
        let pools = self.loaded_pools().await;
        let current = self.current().map_err(fail)?;
        let spec = current.spec.role(role).ok_or_else(|| fail(format!("the package has no role {role:?}")))?;
        let record = self.core.borrow().record.clone();
        let labels = wanted_labels(&record, spec).clone();
        let shown: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let shown = format!("{{{}}}", shown.join(","));
        let request = match pools.request_of(&requestor) {
            Some(r) => r,
            None => {
                let new = NewRequest { labels: labels.clone(), count: nodes, requestor, priority: OPERATION_PRIORITY };
                pools.request(new).await.map_err(|e| fail(format!("cannot file a node request for {shown}: {e}")))?
            }
        };
        let id = request.id.clone();
        tracing::info!(request = %id, role, nodes, "waiting for nodes");
        // Every change of the request is progress for the watchdog.
        let mut seen = None;
        let served = loop {
            let view = pools.view();
            let Some(r) = view.requests.get(&id) else {
                return Err(fail(format!("node request {id} is gone (dropped with the oldest done requests)")));
            };
            let now = (r.state, r.nodes.len(), r.declined_by.len(), r.pool.clone());
            if seen.as_ref() != Some(&now) {
                self.env.progress.fetch_add(1, Ordering::Relaxed);
                seen = Some(now);
            }
            match r.state {
                RequestState::Fulfilled => break r.clone(),
                RequestState::Failed => {
                    // Each reason names its pool.
                    return Err(fail(format!(
                        "node request {id} for {nodes} node(s) carrying {shown} failed, every pool declined it: {}",
                        r.reasons.join("; ")
                    )));
                }
                _ => tokio::time::sleep(POLL).await,
            }
        };
        self.hold(&served.nodes)?;
        // Served before a master restart: its agents reconnect first (each
        // until it would count as Down, as a resumed operation waits for
        // its nodes).
        let patience = tokio::time::Instant::now() + self.shared.timing.node_down_after;
        let mut on_served = loop {
            let fitting = fitting_nodes(&self.shared, &labels);
            let ready: Vec<NodeId> = served.nodes.iter().filter(|n| fitting.contains(n)).cloned().collect();
            if ready.len() == served.nodes.len() || tokio::time::Instant::now() >= patience {
                break ready;
            }
            self.env.progress.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(POLL).await;
        };
        // On the request's nodes first; on other open nodes with the labels
        // that hold none of the role's instances only for what they lack.
        let (in_cluster, taken) = {
            let core = self.core.borrow();
            let mut in_cluster = std::collections::BTreeMap::<NodeId, usize>::new();
            let mut taken = BTreeSet::new();
            let members = core.members();
            let all =
                members.iter().map(|m| (&*m.role, &m.node)).chain(core.pending.values().map(|p| (&*p.role, &p.node)));
            for (r, n) in all {
                *in_cluster.entry(n.clone()).or_default() += 1;
                if r == role {
                    taken.insert(n.clone());
                }
            }
            (in_cluster, taken)
        };
        if on_served.len() < ids.len() {
            let others = fitting_nodes(&self.shared, &labels)
                .into_iter()
                .filter(|n| !served.nodes.contains(n) && !taken.contains(n));
            on_served.extend(others.take(ids.len() - on_served.len()));
        }
        if on_served.is_empty() {
            return Err(fail(format!(
                "node request {id} was served ({}), but none of its nodes is Ready and open now",
                served.nodes.iter().map(|n| n.as_str()).collect::<Vec<_>>().join(", ")
            )));
        }
        let placed = place_instances(
            &self.shared,
            &record,
            spec,
            first_ordinal,
            ids.len() as u32,
            Some(&on_served),
            &in_cluster,
        )
        .map_err(|e| fail(format!("placing after node request {id}: {e}")))?;
        if placed.iter().map(|p| &p.id).ne(ids.iter()) {
            for p in &placed {
                self.shared.ports.release(&p.node, p.ports.values().copied());
            }
            return Err(fail("the placed instances are not those the plan names".into()));
        }
        let on: Vec<NodeId> = placed.iter().map(|p| p.node.clone()).collect();
        // In the operation's pending instances at once: whatever ends it
        // (a failed write below, the watchdog dropping this step) gives
        // their ports back with the rest (`complete`).
        {
            let mut core = self.core.borrow_mut();
            for p in &placed {
                core.pending.insert(p.id.clone(), p.clone());
            }
        }
        self.hold(&on)?;
        // Journaled with the plan before the allocate step may count on it.
        let plan = {
            let mut guard = self.plan.borrow_mut();
            let Some((_, plan)) = guard.as_mut() else { return Err(fail("no operation runs".into())) };
            plan.pending.retain(|p| !ids.contains(&p.id));
            plan.pending.extend(placed.iter().cloned());
            plan.clone()
        };
        let write = WriteOp::put_op_plan(&op, &plan).map_err(|e| fail(e.to_string()))?;
        if let Err(e) =
            commit_retrying(&self.shared, vec![write], &JOURNAL_RETRIES, "a placement after a node request").await
        {
            return Err(fail(format!("cannot journal the placement: {}", crate::error::ErrorChain(&e))));
        }
        let pool = served.pool.as_deref().unwrap_or("?");
        Ok(placed
            .iter()
            .map(|p| InstanceResult::ok(&p.id, format!("placed on {} (node request {id}, pool {pool})", p.node)))
            .collect())
    }

    /// Counts the operation in on `nodes` in the removal gate until it
    /// ends; a node its pool is removing fails the step, naming it.
    fn hold(&self, nodes: &[NodeId]) -> Result<(), StepFailure> {
        let guard = self.shared.read_model.removals.begin_allocate(nodes).map_err(|node| {
            fail(format!("node {node} is being removed by its pool; place the instances again (a new operation)"))
        })?;
        self.holds.borrow_mut().push(guard);
        Ok(())
    }

    /// The pools once they run and their launcher has loaded the store (a
    /// step resumed at boot starts before them).
    async fn loaded_pools(&self) -> std::sync::Arc<Pools> {
        loop {
            if let Some(p) = self.shared.pools.get()
                && (p.pools.is_empty() || p.view().loaded)
            {
                return p.clone();
            }
            tokio::time::sleep(POLL).await;
        }
    }
}
