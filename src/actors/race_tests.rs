//! Races between a member's failure, an operation's start and late news
//! from a replaced connection, each reproduced by holding one side.

use std::time::Duration;

use super::cluster::{InstanceObserved, OpRequest};
use super::instance::Observation;
use super::read_model::Reservation;
use super::test_support::{Harness, cluster, is_cluster_write, run};
use crate::ids::InstanceId;
use crate::operations::lifecycle::InstanceVerb;
use crate::storage::WriteOp;
use crate::storage::keys::master_cf;
use crate::storage::records::{ClusterStatus, InstanceStatus};

/// Hands `observation` of `instance` to cluster `name`'s actor as a node
/// manager would (without waiting for it to be applied).
fn observe(h: &Harness, name: &str, instance: &InstanceId, observation: Observation) {
    let handle = h.handle(name);
    let slot = Reservation::counted(&handle.stats);
    handle.addr.do_send(InstanceObserved { instance: instance.clone(), observation, ack: None, slot });
}

/// An operation accepted while a member's failure (and its cluster's
/// `Error`) is being written is what readers see: the failure's `Error`
/// is not published over its busy mark, and the operation's end judges
/// the member. (The `Error` was published without the operation, for a
/// moment or, when the two landings were handled the other way round,
/// until something published the record again.)
#[test]
fn an_operation_accepted_while_a_failure_is_written_is_not_hidden_by_its_error() {
    run(async {
        let h = Harness::new();
        let (c, members) = cluster("s", 2);
        h.persist(&c, &members).await;
        let _sup = h.boot(vec![c.clone()], members.clone()).await;
        let agent = h.link("n1", 1);
        let failure = |ops: &[WriteOp]| {
            is_cluster_write(ops)
                && ops.iter().any(|o| matches!(o, WriteOp::Put { cf, .. } if *cf == master_cf::INSTANCES))
        };
        let release = h.store.hold(failure);
        let (a, b) = (&members[0], &members[1]);
        let exited =
            Observation::Exited { pid: a.pid.unwrap(), description: "exited with code 137".into(), restarting: false };
        observe(&h, "s", &a.id, exited);
        // The failure's batch is written, its answer held: the restart of
        // the other member is accepted meanwhile.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let op =
            h.run("s", OpRequest::Instance { id: b.id.clone(), verb: InstanceVerb::Restart }).await.expect("accepted");
        release.notify_one();
        tokio::time::sleep(Duration::from_millis(300)).await;
        let published = h.published("s");
        assert_eq!((published.operation, published.status), (Some(op.id), ClusterStatus::Active), "{published:?}");
        assert_eq!(h.stored_cluster(&c).unwrap().operation, Some(op.id), "durable");
        // Its end judges the failed member: Error, naming it.
        agent.serve();
        super::test_support::eventually("Error after the restart", || {
            let p = h.published("s");
            p.operation.is_none() && p.status == ClusterStatus::Error
        })
        .await;
        assert!(h.published("s").status_description.contains(a.id.as_str()));
    });
}

/// A replaced connection's inventory line that arrives after the newer
/// connection's does not override it: the member stays `Running` with the
/// pid the newer one saw. (It was applied: `Failed`, its cluster `Error`.)
#[test]
fn a_late_inventory_of_a_replaced_connection_is_ignored() {
    run(async {
        let h = Harness::new();
        let (c, members) = cluster("l", 1);
        h.persist(&c, &members).await;
        let _sup = h.boot(vec![c.clone()], members.clone()).await;
        let m = &members[0];
        let line = |running: bool, pid: Option<u32>, connection: u64| Observation::Inventory {
            present: true,
            running,
            pid,
            generation: Some(m.generation),
            connection: Some(connection),
        };
        observe(&h, "l", &m.id, line(true, Some(2000), 2));
        observe(&h, "l", &m.id, line(false, None, 1));
        super::test_support::eventually("the newer line applied", || {
            h.shared.read_model.cluster("l").unwrap().instances[&m.id].record.pid == Some(2000)
        })
        .await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let r = h.shared.read_model.cluster("l").unwrap().instances[&m.id].record.clone();
        assert_eq!((r.status, r.pid), (InstanceStatus::Running, Some(2000)), "{r:?}");
        assert_eq!(h.published("l").status, ClusterStatus::Active);
    });
}
