//! The supervisor's children failing: a cluster actor that failed is
//! started again from the store within its intensity
//! (`supervision::spec("cluster")`), and past it given up: listed as
//! `failed`, its cluster put in `Error` durably saying why. The operator's
//! verbs on actors (`POST /actors/{kind}/{id}/kill|restart`).

use super::*;

impl Handler<ClusterPanicked> for Supervisor {
    type Result = ();

    /// Starts the cluster's actor again from its stored records (the dead
    /// one's memory is not trusted), and resumes the operation it was
    /// running from its journal, as a master restart would.
    fn handle(&mut self, msg: ClusterPanicked, ctx: &mut Context<Self>) {
        let ClusterPanicked { name, cluster, stats, reason, slot } = msg;
        slot.begin("restart cluster actor");
        self.stats.end(Some(format!("cluster actor {name} failed: {reason}")));
        // A later incarnation (or none: deleted) is not this one's to replace.
        if !self.shared.registry.get(&name).is_some_and(|h| Arc::ptr_eq(&h.stats, &stats)) {
            self.shared.read_model.unregister_actor(&stats);
            return;
        }
        // Listed while it is restarted (or failed), with how it ended (its
        // `on_panic` listed it already; again here for a report that came
        // some other way).
        self.shared.read_model.register_actor(&stats);
        let child = spec("cluster");
        let restart = self.restarts.entry(name.clone()).or_default().failed(child, std::time::Instant::now());
        let n = match restart {
            Ok(n) => n,
            Err(n) => return self.give_up_cluster(ctx, name, cluster, stats, reason, n),
        };
        stats.exited(reason.clone(), true);
        stats.set_state("restarting");
        tracing::error!(cluster = %name, %reason, restart = n, "cluster actor failed; restarting it from its stored records");
        let shared = self.shared.clone();
        let backoff = child.backoff;
        let why = format!("{reason}; restarted from its stored records (restart {n} of at most {})", child.intensity);
        let failed = events::actor("actor.failed", "cluster", &name, Some(&name), Some(&why));
        let load = async move {
            // The event's write also lets every write queued before it (the
            // dead actor's last ones) land before the records are read.
            tokio::time::sleep(backoff).await;
            let event = events::append(&failed)?;
            match shared.store.commit(vec![event]).await {
                Ok(()) | Err(crate::storage::StorageError::Frozen) => {}
                Err(e) => tracing::warn!(error = %e, "cannot record an event"),
            }
            let store = shared.store.clone();
            tokio::task::spawn_blocking(move || crate::storage::meta::load_cluster(&*store, &cluster))
                .await
                .map_err(|e| crate::storage::StorageError::Codec(e.to_string()))?
        };
        ctx.spawn(
            load.into_actor(self).map(move |loaded, act, ctx| act.restart_cluster(ctx, &name, cluster, &stats, loaded)),
        );
    }
}

impl Supervisor {
    fn restart_cluster(
        &mut self,
        ctx: &mut Context<Self>,
        name: &str,
        cluster: ClusterId,
        dead: &Arc<ActorStats>,
        loaded: Result<Option<crate::storage::meta::StoredCluster>, crate::storage::StorageError>,
    ) {
        if !self.shared.registry.get(name).is_some_and(|h| Arc::ptr_eq(&h.stats, dead)) {
            return;
        }
        let stored = match loaded {
            Ok(Some(s)) => s,
            Ok(None) => {
                self.forget_unstored(name, cluster, dead);
                return;
            }
            Err(e) => {
                let why = format!("cannot read the cluster to restart its actor: {}", crate::error::ErrorChain(&e));
                tracing::error!(cluster = %name, error = %why, "the cluster actor stays down; an operator may restart it");
                dead.set_state("failed");
                dead.end(Some(why));
                return;
            }
        };
        // Its running operation goes on from its journal; one that cannot
        // (ended meanwhile, or no plan) is not resumed, and the cluster
        // stays busy with it until a master restart ends it.
        let resume = stored.operation.filter(|o| !o.status.is_terminal() && o.resume.is_some());
        if let Some(op) = &resume {
            tracing::info!(cluster = %name, operation = %op.id, "the restarted cluster actor resumes its operation");
            self.shared.read_model.put_operation(op);
        }
        let start = Start {
            record: stored.record,
            instances: stored.instances,
            resume,
            history: stored.history,
            visible: true,
            predecessor: Some(dead.clone()),
        };
        // The successor's listing replaces the dead one's (same key).
        let handle = ClusterActor::start(start, self.shared.clone(), ctx.address());
        self.shared.registry.insert(name, handle);
    }
}

impl Supervisor {
    /// A failed cluster actor's cluster is not stored: its create never
    /// became durable, or its delete's end landed as the actor died (the
    /// `ClusterGone` it would have sent is lost with it). Its name is freed
    /// and everything kept for it goes, as at `ClusterGone`: its restarts,
    /// its commands' count, and its operations shown running (published
    /// again as stored: ended).
    fn forget_unstored(&mut self, name: &str, cluster: ClusterId, dead: &Arc<ActorStats>) {
        tracing::warn!(cluster = %name, "the failed cluster actor's cluster is not stored; its name is free");
        self.shared.read_model.unregister_actor(dead);
        self.shared.registry.remove(name);
        self.shared.read_model.remove_cluster(name);
        self.restarts.remove(name);
        self.shared.in_flight.forget(&cluster);
        let running: Vec<_> = self
            .shared
            .read_model
            .running_operations()
            .values()
            .filter(|o| o.cluster_id == cluster)
            .map(|o| o.id)
            .collect();
        if running.is_empty() {
            return;
        }
        let read_model = self.shared.read_model.clone();
        tokio::task::spawn_blocking(move || {
            for id in running {
                match read_model.operation(&id) {
                    Ok(Some(op)) => read_model.put_operation(&op),
                    Ok(None) => {}
                    Err(e) => {
                        tracing::warn!(operation = %id, error = %e, "cannot read an operation of a deleted cluster")
                    }
                }
            }
        });
    }

    /// A cluster actor failed more often than its intensity allows: it is
    /// left down and listed as `failed`, and its cluster goes `Error`,
    /// durably, saying why (tried until it lands). An operator restarts it
    /// ([`ActorVerb`]).
    fn give_up_cluster(
        &mut self,
        ctx: &mut Context<Self>,
        name: String,
        cluster: ClusterId,
        stats: Arc<ActorStats>,
        reason: String,
        restarts: usize,
    ) {
        let child = spec("cluster");
        let why = format!(
            "the cluster's actor gave up after {} failures within {}s: {reason}; restart it (POST /api/v1/actors/cluster/{name}/restart), then start the cluster",
            restarts + 1,
            child.period.as_secs()
        );
        tracing::error!(cluster = %name, %reason, restarts, "cluster actor failed past its restart intensity; given up");
        stats.exited(reason, false);
        // Not `failed` (which lets an operator restart it) until its
        // cluster's Error is durable: a restart must not race that write.
        stats.set_state("giving up");
        stats.end(Some(why.clone()));
        let shared = self.shared.clone();
        let event = events::actor("actor.failed", "cluster", &name, Some(&name), Some(&why));
        let n = name.clone();
        let write = async move {
            // A write of its own first: every write the dead incarnation
            // queued lands before the record is read (its end of a delete,
            // of an operation), so no older copy is written back.
            let flushed = events::append(&events::actor(
                "actor.giving_up",
                "cluster",
                &n,
                Some(&n),
                Some("past its restart intensity"),
            ))
            .map_err(|e| e.to_string())?;
            super::super::cluster::commit_until_landed(&shared, "a given-up cluster's event", || {
                Ok(vec![flushed.clone()])
            })
            .await?;
            let store = shared.store.clone();
            let loaded = tokio::task::spawn_blocking(move || crate::storage::meta::load_cluster(&*store, &cluster))
                .await
                .map_err(|e| e.to_string())?
                .map_err(|e| crate::error::ErrorChain(&e).to_string())?;
            let Some(stored) = loaded else { return Ok(None) };
            let mut record = stored.record;
            record.status = ClusterStatus::Error;
            record.status_description = why;
            record.updated_at = OffsetDateTime::now_utc();
            let ops = || -> Result<Vec<WriteOp>, String> {
                Ok(vec![
                    WriteOp::put_cluster(&record).map_err(|e| e.to_string())?,
                    events::append(&event).map_err(|e| e.to_string())?,
                ])
            };
            super::super::cluster::commit_until_landed(&shared, "a given-up cluster's Error", ops).await?;
            tracing::info!(cluster = %n, "the given-up cluster actor's cluster is in Error");
            Ok::<_, String>(Some(record))
        };
        ctx.spawn(write.into_actor(self).map(move |written, act, _| {
            // Still this incarnation's name (not deleted, not replaced).
            let ours = act.shared.registry.get(&name).is_some_and(|h| Arc::ptr_eq(&h.stats, &stats));
            if ours && matches!(written, Ok(None)) {
                // Nothing stored to restart (a create never durable, a
                // delete whose end landed as the actor died): nothing to
                // keep down either.
                act.forget_unstored(&name, cluster, &stats);
                return;
            }
            stats.set_state("failed");
            match written {
                Ok(Some(record)) if ours => {
                    if let Some(cell) = act.shared.read_model.cluster_cell(&name) {
                        cell.set_record(record);
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::error!(cluster = %name, error = %e, "cannot record the Error of a given-up cluster actor")
                }
            }
        }));
    }
}

/// What an operator asks of an actor (Erlang's observer): `Kill` stops it
/// as if it failed ("killed by the operator"), and its supervisor acts on
/// that as on any failure; `Restart` brings a given-up (`failed`) actor back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    Kill,
    Restart,
    /// Test hooks only (`http::test_hooks`).
    Inject(Fault),
}

/// A fault a test injects into an actor or task (`supervisor/inject.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// It panics where it runs.
    Panic,
    /// It takes no message for this long.
    Stall(std::time::Duration),
    /// It blocks its thread for this long (every actor there waits).
    Block(std::time::Duration),
}

pub struct ActorVerb {
    pub kind: String,
    pub id: String,
    pub verb: Verb,
    pub slot: Reservation,
}

impl Message for ActorVerb {
    type Result = Result<ActorVerbAnswer, Error>;
}

/// What was done.
#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
pub struct ActorVerbAnswer {
    pub kind: String,
    pub id: String,
    /// What happens now, in words.
    pub done: String,
}

impl Handler<ActorVerb> for Supervisor {
    type Result = Result<ActorVerbAnswer, Error>;

    fn handle(&mut self, msg: ActorVerb, ctx: &mut Context<Self>) -> Self::Result {
        let ActorVerb { kind, id, verb, slot } = msg;
        slot.take(format!("{verb:?} {kind}/{id}").to_lowercase())?;
        let answer = self.actor_verb(ctx, &kind, &id, verb);
        self.stats.refused_if(answer.is_err());
        answer.map(|done| ActorVerbAnswer { kind, id, done })
    }
}

impl Supervisor {
    fn actor_verb(&mut self, ctx: &mut Context<Self>, kind: &str, id: &str, verb: Verb) -> Result<String, Error> {
        let known = || Error::not_found("actor", format!("{kind}/{id}"));
        match (kind, verb) {
            (_, Verb::Inject(fault)) => self.inject(ctx, kind, id, fault),
            ("cluster", Verb::Kill) => {
                self.kill_cluster(id, "killed by the operator".into())?;
                Ok(format!(
                    "the actor of cluster {id} is killed; its supervisor restarts it ({})",
                    spec("cluster").describe()
                ))
            }
            ("cluster", Verb::Restart) => {
                let h = self.shared.registry.get(id).ok_or_else(known)?;
                if h.stats.state() != "failed" {
                    return Err(Error::conflict(
                        "actor_not_failed",
                        format!(
                            "the actor of cluster {id} is not failed (it is {}); kill it to restart it",
                            h.stats.state()
                        ),
                    ));
                }
                let cluster = self.shared.read_model.cluster(id).map(|c| c.record.id).ok_or_else(known)?;
                if let Some(i) = self.restarts.get_mut(id) {
                    i.reset();
                }
                let (shared, dead, name) = (self.shared.clone(), h.stats.clone(), id.to_string());
                dead.set_state("restarting");
                dead.exited("restarted by the operator", true);
                let load = async move {
                    let store = shared.store.clone();
                    tokio::task::spawn_blocking(move || crate::storage::meta::load_cluster(&*store, &cluster))
                        .await
                        .map_err(|e| crate::storage::StorageError::Codec(e.to_string()))?
                };
                ctx.spawn(
                    load.into_actor(self)
                        .map(move |loaded, act, ctx| act.restart_cluster(ctx, &name, cluster, &dead, loaded)),
                );
                Ok(format!(
                    "the actor of cluster {id} is started again from its stored records; start the cluster to make it Active"
                ))
            }
            ("node_manager", Verb::Kill) => {
                let node = NodeId::new(id);
                let link = self.shared.links.get(&node).ok_or_else(known)?;
                // Restarted: its agent reconnects to a new one, which
                // carries this count and reason on (`NodeEntry::manager`).
                if let Some(stats) = self.shared.read_model.node(&node).and_then(|n| n.manager()) {
                    stats.exited("killed by the operator", true);
                }
                link.close();
                Ok(format!(
                    "the link of node {id} is closed; its agent connects again and a new node manager serves it"
                ))
            }
            ("node_manager", Verb::Restart) => Err(Error::conflict(
                "actor_not_failed",
                "a node manager is never given up: its agent reconnects (kill it to force that)".to_string(),
            )),
            (kind, verb) if self.shared.tasks.contains(kind) => {
                if id != kind {
                    // A task is one of its kind: its id is its kind.
                    return Err(known());
                }
                if verb == Verb::Restart {
                    return Err(Error::conflict(
                        "actor_not_failed",
                        format!(
                            "{kind} is never left down: past its intensity the master exits ({})",
                            spec(kind).describe()
                        ),
                    ));
                }
                self.shared.tasks.kill(kind).map_err(|e| Error::conflict("actor_restart_intensity", e))?;
                Ok(format!("{kind} is killed; its supervisor restarts it ({})", spec(kind).describe()))
            }
            // One group with its cluster's actor (one_for_all): the
            // group fails, and its supervisor restarts it.
            ("instance", Verb::Kill) => {
                let cluster = self.owner_of(id).ok_or_else(known)?;
                self.kill_cluster(&cluster, format!("its instance actor {id} was killed by the operator"))?;
                Ok(format!(
                    "the instance actor {id} is killed, and with it the actor of its cluster {cluster} (one_for_all); \
                     their supervisor restarts them ({})",
                    spec("cluster").describe()
                ))
            }
            ("instance", Verb::Restart) => Err(Error::conflict(
                "actor_linked",
                "an instance actor is restarted with its cluster's actor: restart that one".to_string(),
            )),
            ("supervisor" | "store_writer" | "master", _) => Err(Error::conflict(
                "actor_root",
                format!(
                    "{kind} is not restarted by a supervisor: its death exits the master ({})",
                    crate::actors::supervision::describe(kind)
                ),
            )),
            _ => Err(known()),
        }
    }
}

impl Supervisor {
    /// Kills cluster `name`'s actor as if it failed, `reason`: refused when
    /// it is down already or being restarted.
    fn kill_cluster(&self, name: &str, reason: String) -> Result<(), Error> {
        let h = self.shared.registry.get(name).ok_or_else(|| Error::not_found("actor", format!("cluster/{name}")))?;
        match h.stats.state().as_str() {
            "failed" | "giving up" => Err(Error::conflict(
                "actor_failed",
                format!("the actor of cluster {name} is down already (failed); restart it"),
            )),
            "restarting" => Err(Error::conflict(
                "actor_restarting",
                format!("the actor of cluster {name} is being restarted; try again once it runs"),
            )),
            _ => {
                h.addr.do_send(super::super::cluster::Kill { reason });
                Ok(())
            }
        }
    }

    /// The cluster that instance `id` belongs to.
    pub(super) fn owner_of(&self, id: &str) -> Option<String> {
        let id = crate::ids::InstanceId::new(id);
        let clusters = self.shared.read_model.clusters();
        clusters.iter().find(|(_, cell)| cell.load().instances.contains_key(&id)).map(|(name, _)| name.clone())
    }
}
