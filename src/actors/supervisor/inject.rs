//! Test hooks (`http::test_hooks`): a fault injected into an actor or a
//! supervised task, so the supervision tests fail each kind of child for
//! real, where it runs, and watch its supervisor act.

use actix::prelude::*;

use super::Supervisor;
use super::children::Fault;
use crate::error::Error;
use crate::ids::NodeId;

impl Supervisor {
    pub(super) fn inject(
        &mut self,
        ctx: &mut Context<Self>,
        kind: &str,
        id: &str,
        fault: Fault,
    ) -> Result<String, Error> {
        let known = || Error::not_found("actor", format!("{kind}/{id}"));
        match (kind, fault) {
            ("cluster", Fault::Panic) => {
                let h = self.shared.registry.get(id).ok_or_else(known)?;
                h.addr.do_send(crate::actors::cluster::Kill { reason: "a panic injected by a test hook".into() });
                Ok(format!("the actor of cluster {id} panics"))
            }
            ("cluster", Fault::Stall(d)) => {
                let h = self.shared.registry.get(id).ok_or_else(known)?;
                h.addr.do_send(crate::actors::cluster::Stall(d));
                Ok(format!("the actor of cluster {id} takes no message for {d:?}"))
            }
            ("instance", Fault::Panic) => {
                let cluster = self.owner_of(id).ok_or_else(known)?;
                let h = self.shared.registry.get(&cluster).ok_or_else(known)?;
                if matches!(h.stats.state().as_str(), "restarting" | "failed" | "giving up") {
                    // Its instance actors are being replaced: the mark would be lost.
                    return Err(Error::conflict(
                        "actor_restarting",
                        format!("the actor of cluster {cluster} is down or restarting; try again once it runs"),
                    ));
                }
                h.addr.do_send(crate::actors::cluster::InjectInstancePanic(crate::ids::InstanceId::new(id)));
                Ok(format!("the instance actor {id} (cluster {cluster}) panics in its next turn"))
            }
            ("link_writer", Fault::Panic) => {
                let link = self.shared.links.get(&NodeId::new(id)).ok_or_else(known)?;
                link.inject_writer_panic();
                Ok(format!("the link writer of {id} panics at its next frame or heartbeat"))
            }
            ("announce", Fault::Panic) if id == "announce" => {
                crate::actors::announce::inject_panic();
                Ok("the next event write (announce) panics".into())
            }
            ("cluster", Fault::Block(d)) => {
                let h = self.shared.registry.get(id).ok_or_else(known)?;
                h.addr.do_send(crate::actors::cluster::Block(d));
                Ok(format!("the thread of cluster {id}'s actor is blocked for {d:?}"))
            }
            ("supervisor", Fault::Panic) => {
                // After this answer: the caller hears what happens.
                ctx.run_later(std::time::Duration::from_millis(100), |_, _| {
                    panic!("a panic injected by a test hook (supervisor)")
                });
                Ok("the supervisor panics: the master exits".into())
            }
            ("supervisor", Fault::Block(d)) => {
                // After this answer, which goes out first.
                ctx.run_later(std::time::Duration::from_millis(10), move |_, _| std::thread::sleep(d));
                Ok(format!("the supervisor's thread is blocked for {d:?}"))
            }
            ("supervisor", Fault::Stall(d)) => {
                ctx.wait(actix::fut::wrap_future(tokio::time::sleep(d)));
                Ok(format!("the supervisor takes no message for {d:?}"))
            }
            ("node_manager", Fault::Panic) => {
                let link = self.shared.links.get(&NodeId::new(id)).ok_or_else(known)?;
                link.inject_panic();
                Ok(format!("the node manager of {id} panics at its agent's next frame"))
            }
            (task, Fault::Panic) if self.shared.tasks.contains(task) && id == task => {
                self.shared.tasks.inject_panic(task).map_err(|e| Error::conflict("no_task", e))?;
                Ok(format!("{task} panics"))
            }
            (kind, fault) => {
                Err(Error::conflict("no_such_fault", format!("no hook injects {fault:?} into {kind}/{id}")))
            }
        }
    }
}
