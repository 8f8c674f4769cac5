//! A mutating request reaching its cluster's actor: refused (busy,
//! invalid: nothing is left behind), or built into an operation whose
//! record and the busy cluster record are written in one durable batch,
//! handed to the API as soon as that write is under way (the caller
//! answers `202` from the store's answer), then published and run.

use super::*;

impl Handler<RunOperation> for ClusterActor {
    // Atomic: no other message is handled until the new operation (or a
    // refusal's note) is durable, so two writes of the cluster record never
    // cross (a stale one landing last could drop the busy mark).
    type Result = AtomicResponse<Self, Result<OperationRecord, Error>>;

    fn handle(&mut self, msg: RunOperation, _ctx: &mut Context<Self>) -> Self::Result {
        let RunOperation(req, mut slot, early) = msg;
        // An API request stays ahead of bulk work on this thread until it
        // is answered (durable), not only until it is taken.
        let urgent = slot.urgent();
        let is_create = matches!(req, OpRequest::Create { .. });
        if let Err(e) = slot.take(req.name()) {
            if is_create {
                // Its caller stopped waiting: the name is freed, as for
                // any create refused.
                return Self::refuse_create(e);
            }
            return AtomicResponse::new(Box::pin(fut::ready(Err(e))));
        }
        if self.creating && !is_create {
            let name = self.core.borrow().record.name.clone();
            self.stats.refused();
            return AtomicResponse::new(Box::pin(fut::ready(Err(Error::not_found("cluster", name)))));
        }
        let busy = self.core.borrow().record.operation;
        if let Some(running) = busy {
            let kind = self
                .shared
                .read_model
                .running_operations()
                .get(&running)
                .map(|o| format!("{:?}", o.kind))
                .unwrap_or_default();
            let name = self.core.borrow().record.name.clone();
            self.stats.refused();
            return AtomicResponse::new(Box::pin(fut::ready(Err(Error::conflict(
                "cluster_busy",
                format!("cluster {name} is busy with operation {running} ({kind}); retry when it has ended"),
            )))));
        }
        let is_change = matches!(
            req,
            OpRequest::ScaleOut { .. }
                | OpRequest::ScaleIn { .. }
                | OpRequest::Reconfigure { .. }
                | OpRequest::Upgrade { .. }
                | OpRequest::Resize { .. }
                | OpRequest::Replace { .. }
        );
        let prepared = self.package().and_then(|(_, spec)| self.prepare(req, &spec));
        let prepared = match prepared {
            Ok(p) => p,
            Err(e) => {
                // Nothing placed is left behind: a placement that fails
                // gives back the ports it took (`place_new_cluster`).
                // A refused request: counted, not the actor failing.
                self.stats.refused();
                if is_create {
                    return Self::refuse_create(e);
                }
                if is_change && self.core.borrow().record.status == ClusterStatus::Active {
                    // Sahara: a refused scale leaves the cluster Active, with the reason.
                    let description = format!("request refused, nothing changed: {e}");
                    let ops = self.ops(None);
                    return AtomicResponse::new(Box::pin(
                        async move {
                            if let Err(w) = ops.save_cluster(|r| r.status_description = description.clone()).await {
                                tracing::warn!(error = %w, "cannot record why a request was refused");
                            }
                            Err(e)
                        }
                        .into_actor(self),
                    ));
                }
                return AtomicResponse::new(Box::pin(fut::ready(Err(e))));
            }
        };
        let now = OffsetDateTime::now_utc();
        let op = {
            let mut core = self.core.borrow_mut();
            let op = OperationRecord {
                version: RECORD_VERSION,
                id: OperationId::random(),
                cluster_id: core.record.id,
                cluster: core.record.name.clone(),
                kind: prepared.kind,
                params: prepared.params.clone(),
                status: OperationStatus::Pending,
                steps: vec![],
                error: None,
                created_at: now,
                ended_at: None,
                resume: Some(Resumable {
                    plan: prepared.plan.clone(),
                    pending: prepared.pending.clone(),
                    on_success: prepared.on_success,
                    force: prepared.force,
                }),
            };
            // Busy from here on, before any await.
            core.record.operation = Some(op.id);
            core.record.updated_at = now;
            for p in &prepared.pending {
                core.pending.insert(p.id.clone(), p.clone());
            }
            op
        };
        let mut op = op;
        runner::prepare(&mut op, &prepared.plan);
        let cluster = self.core.borrow().record.clone();
        let writes = WriteOp::put_cluster(&cluster).and_then(|a| {
            let mut w = vec![a];
            w.extend(WriteOp::new_operation(&op)?);
            if is_create {
                w.push(events::append(&events::cluster("cluster.created", &cluster))?);
            }
            w.push(events::append(&events::operation("operation.created", &op))?);
            Ok(w)
        });
        let store = self.shared.store.clone();
        let durable = async move {
            match writes {
                // A new request: refused (503) rather than queued when
                // the store is overloaded; nothing of it exists then.
                Ok(w) => store.try_commit(w).await.map_err(Error::from),
                Err(e) => Err(Error::from(e)),
            }
        }
        .boxed()
        .shared();
        let accepting = self.shared.read_model.accepting(op.id);
        // An upgrade is answered once published: deleting a package decides
        // "in use" from the published view, which must show an upgrade a
        // client has been told about.
        if let Some(early) = early.filter(|_| prepared.kind != OperationKind::Upgrade) {
            // Gone: the caller stopped waiting; the operation goes on.
            let _ = early.send(Accepted { op: op.clone(), durable: durable.clone() });
        }
        AtomicResponse::new(Box::pin(durable.into_actor(self).map(move |res, act, ctx| {
            let _answered = urgent;
            act.stats.end(res.as_ref().err().map(|e| e.to_string()));
            match res {
                Ok(()) => {
                    act.env.cell.set_record(cluster.clone());
                    if is_create {
                        // The cluster appears once its create is durable.
                        act.shared.read_model.add_cluster(&cluster.name, act.env.cell.clone());
                        act.shared.read_model.register_actor(&act.stats);
                        act.creating = false;
                        let name = &cluster.name;
                        crate::actors::announce::actor(&act.shared, "actor.started", "cluster", name, Some(name), None);
                    }
                    act.shared.read_model.put_operation(&op);
                    accepting.published();
                    act.spawn_operation(ctx, prepared, op.clone());
                    Ok(op)
                }
                Err(e) => {
                    let mut core = act.core.borrow_mut();
                    core.record.operation = None;
                    for p in &prepared.pending {
                        core.pending.remove(&p.id);
                        act.shared.ports.release(&p.node, p.ports.values().copied());
                    }
                    drop(core);
                    if is_create {
                        act.forget_refused_create(ctx);
                    } else {
                        // A member that failed while this request held the
                        // busy mark was left to an operation that never ran.
                        act.check_members(ctx);
                    }
                    Err(e)
                }
            }
        })))
    }
}

impl ClusterActor {
    /// A create refused before it became durable: frees the name (before
    /// the refusal is answered, so the caller may retry it at once) and
    /// stops the actor, which was never shown.
    /// Answers a refused create with `e`, then frees its name and stops
    /// the actor: inside the answer's future, since an actor stopped in the
    /// handler itself never sends it (the caller would see a closed mailbox
    /// instead of the refusal).
    fn refuse_create(e: Error) -> AtomicResponse<Self, Result<OperationRecord, Error>> {
        AtomicResponse::new(Box::pin(ActorFutureExt::map(fut::ready(Err(e)), |res, act: &mut Self, ctx| {
            act.forget_refused_create(ctx);
            res
        })))
    }

    fn forget_refused_create(&mut self, ctx: &mut Context<Self>) {
        let (name, id) = {
            let c = self.core.borrow();
            (c.record.name.clone(), c.record.id)
        };
        self.shared.registry.remove_if(&name, &self.stats);
        self.shared.in_flight.forget(&id);
        ctx.stop();
    }
}
