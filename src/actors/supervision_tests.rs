//! The master's actors driven directly (a real store, no agent process:
//! the test answers the link itself): what readers are shown only once it
//! is durable, a panicking cluster actor started again from the store, an
//! inventory older than the instance, a member crash during an operation.

use std::collections::BTreeMap;
use std::time::Duration;

use actix::Addr;

use super::cluster::{Kill, OpRequest};
use super::supervisor::{CreateAnswer, CreateCluster, RoleRequest, Supervisor};
use super::test_support::{Harness, cluster, eventually, is_cluster_write, is_journal, is_new_operation, run};
use crate::error::Error;
use crate::ids::NodeId;
use crate::operations::lifecycle::InstanceVerb;
use crate::protocol::messages::{AgentRequest, AgentResponse};
use crate::storage::records::{ClusterStatus, InstanceStatus, OperationRecord, OperationStatus};

/// A create of the harness's package named `name`, with `roles`.
fn create_request(name: &str, roles: BTreeMap<String, RoleRequest>) -> CreateCluster {
    CreateCluster {
        name: name.into(),
        package: crate::storage::records::PackageRef { name: "t".into(), version: "1".into() },
        roles,
        config: Default::default(),
    }
}

/// Sends a create to the supervisor: its handing over to the new cluster's actor.
async fn hand_over(h: &Harness, sup: &Addr<Supervisor>, req: CreateCluster) -> Result<CreateAnswer, Error> {
    let slot = super::read_model::Reservation::counted(&h.shared.supervisor);
    sup.send(super::supervisor::Create(req, slot)).await.expect("the supervisor's mailbox")
}

/// Sends a create and waits for the cluster actor's answer.
async fn create(h: &Harness, sup: &Addr<Supervisor>, req: CreateCluster) -> Result<OperationRecord, Error> {
    hand_over(h, sup, req).await?.answer().await
}

/// A journal write that fails (and fails again when tried again) stops the
/// operation: it ends Failed saying why, the cluster Error, no step ran,
/// and no reader was shown a step the store does not hold.
#[test]
fn a_journal_write_that_fails_ends_the_operation_and_shows_nothing_unrecorded() {
    run(async {
        let h = Harness::new();
        let (c, members) = cluster("j", 1);
        h.persist(&c, &members).await;
        let _sup = h.boot(vec![c.clone()], members.clone()).await;
        let mut agent = h.link("n1", 1);
        // The first write and its three retries.
        h.store.fail(4, is_journal);
        let op = h.run("j", OpRequest::Stop).await.expect("accepted");
        eventually("the operation's end", || h.published("j").operation.is_none()).await;
        let stored = h.stored_operation(&op.id);
        assert_eq!(stored.status, OperationStatus::Failed);
        let error = stored.error.clone().unwrap_or_default();
        assert!(error.contains("journal could not be written") && error.contains("injected"), "{error}");
        assert!(stored.steps.iter().all(|s| s.status == crate::storage::records::StepStatus::Pending), "{stored:?}");
        let cluster = h.published("j");
        assert_eq!(cluster.status, ClusterStatus::Error);
        assert!(cluster.status_description.contains("journal could not be written"), "{}", cluster.status_description);
        assert_eq!(Some((*cluster).clone()), h.stored_cluster(&c), "readers see what the store holds");
        // Nothing was sent to the agent, and no step was announced.
        assert!(tokio::time::timeout(Duration::from_millis(200), agent.request()).await.is_err());
        let steps: Vec<_> = h.events().into_iter().filter(|(k, _)| k.starts_with("operation.step")).collect();
        assert!(steps.is_empty(), "{steps:?}");
        assert_eq!(h.store.refused.load(std::sync::atomic::Ordering::SeqCst), 4);
    });
}

/// With the store refusing every write (frozen: the master is shutting
/// down), the operation pauses: nothing is shown past what is durable, and
/// the cluster stays busy with it for the next master to resume.
#[test]
fn an_operation_whose_store_refuses_every_write_pauses_without_showing_anything() {
    run(async {
        let h = Harness::new();
        let (c, members) = cluster("f", 1);
        h.persist(&c, &members).await;
        let _sup = h.boot(vec![c.clone()], members.clone()).await;
        let _agent = h.link("n1", 1);
        // The operation's creation lands; everything after it is refused.
        h.store.freeze_for(|ops| is_journal(ops) || (is_cluster_write(ops) && !is_new_operation(ops)));
        let op = h.run("f", OpRequest::Stop).await.expect("accepted");
        let stats = h.handle("f").stats;
        eventually("the pause", || stats.snapshot().state.starts_with("paused")).await;
        assert_eq!(h.published("f").operation, Some(op.id), "still busy with it");
        assert_eq!(h.published("f").status, ClusterStatus::Active);
        let shown = h.shared.read_model.running_operations().get(&op.id).cloned().expect("shown as running");
        assert_eq!(shown.status, OperationStatus::Pending, "as created: nothing later is durable");
        assert_eq!(h.stored_operation(&op.id).status, OperationStatus::Pending);
        let busy = h.run("f", OpRequest::Start).await.expect_err("busy");
        assert!(busy.to_string().contains(&op.id.to_string()), "{busy}");
    });
}

/// A create whose write fails never shows the cluster: not in the read
/// model, not among the actors, no event.
#[test]
fn a_create_that_is_not_durable_never_appears() {
    run(async {
        let h = Harness::new();
        let sup = h.boot(Vec::new(), Vec::new()).await;
        h.store.fail(1, is_cluster_write);
        let req = create_request("new", Default::default());
        let res = create(&h, &sup, req.clone()).await;
        assert!(res.is_err());
        assert!(!h.shared.registry.contains("new"), "the refused create freed its name before it was answered");
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(h.shared.read_model.cluster("new").is_none());
        assert!(!h.shared.read_model.actors().iter().any(|a| a.id == "new"), "not among the actors");
        assert!(h.events().iter().all(|(_, d)| d["data"]["id"] != "new"), "{:?}", h.events());
        // Once durable, it appears, with its actor and its event.
        create(&h, &sup, req).await.expect("created");
        assert!(h.shared.read_model.cluster("new").is_some());
        eventually("actor.started", || h.events().iter().any(|(k, d)| k == "actor.started" && d["id"] == "new")).await;
    });
}

/// A create refused on its cluster's thread, where its instances are
/// placed (a pinned node unknown), or after they were placed (its write
/// failed), holds nothing: its name is free when the refusal is answered,
/// and so are the ports its placement took.
#[test]
fn a_refused_create_gives_back_its_name_and_its_ports() {
    run(async {
        let h = Harness::new();
        let sup = h.boot(Vec::new(), Vec::new()).await;
        let n1 = NodeId::new("n1");
        let node = h.shared.read_model.node(&n1).expect("n1 registered");
        node.live.connect(1);
        let first_port = node.record().port_range.0;
        let pinned = |nodes: &[&str]| {
            let role = RoleRequest {
                count: Some(2),
                nodes: Some(nodes.iter().map(|n| NodeId::new(*n)).collect()),
                node_labels: None,
            };
            create_request("new", [("server".to_string(), role)].into())
        };
        let unknown = create(&h, &sup, pinned(&["n1", "nowhere"])).await.expect_err("an unknown node");
        assert!(unknown.to_string().contains("unknown node"), "{unknown}");
        assert!(!h.shared.registry.contains("new"), "the name is free once refused");
        h.store.fail(1, is_cluster_write);
        let lost = create(&h, &sup, pinned(&["n1"])).await.expect_err("not durable");
        assert!(lost.to_string().contains("injected"), "the store's refusal, not a closed mailbox: {lost}");
        assert!(!h.shared.registry.contains("new"), "the name is free once refused");
        // Neither holds a port: the create that succeeds gets the lowest two.
        let op = create(&h, &sup, pinned(&["n1"])).await.expect("created");
        let placed = op.resume.expect("a running create keeps its plan").pending;
        let mut ports: Vec<u16> = placed.iter().flat_map(|i| i.ports.values().copied()).collect();
        ports.sort_unstable();
        assert_eq!(ports, vec![first_port, first_port + 1], "{placed:?}");
        assert!(placed.iter().all(|i| i.node == n1));
    });
}

/// A create whose caller stopped waiting before the new cluster's actor
/// took it is still run: its name never stays with an actor that did not
/// run its create (actix skips a message whose sender has gone).
#[test]
fn a_create_whose_caller_left_is_still_run() {
    run(async {
        let mut h = Harness::new();
        // The cluster's thread is held until the caller has gone.
        let thread = actix::Arbiter::new();
        let (release, held) = std::sync::mpsc::channel::<()>();
        thread.spawn(async move {
            let _ = held.recv();
        });
        h.shared.arbiters = std::sync::Arc::new(vec![thread.handle()]);
        let sup = h.boot(Vec::new(), Vec::new()).await;
        let answer = hand_over(&h, &sup, create_request("left", Default::default())).await.expect("handed over");
        drop(answer);
        release.send(()).expect("the thread waits");
        eventually("the create run", || h.shared.read_model.cluster("left").is_some()).await;
        thread.stop();
    });
}

/// A cluster actor that panics mid-operation is started again from the
/// store, goes on with the operation from its journal, and answers again.
#[test]
fn a_panicking_cluster_actor_is_restarted_from_the_store_and_resumes() {
    run(async {
        let h = Harness::new();
        let (c, members) = cluster("p", 2);
        h.persist(&c, &members).await;
        let _sup = h.boot(vec![c.clone()], members.clone()).await;
        let mut agent = h.link("n1", 1);
        let op = h.run("p", OpRequest::Stop).await.expect("accepted");
        // The first stop reaches the agent, which does not answer yet.
        let (_first, req) = agent.request().await;
        assert!(matches!(req, AgentRequest::Stop { .. }), "{req:?}");
        let dead = h.handle("p");
        dead.addr.do_send(Kill { reason: "injected panic".into() });
        eventually("a new cluster actor", || !std::sync::Arc::ptr_eq(&h.handle("p").stats, &dead.stats)).await;
        // The operation goes on: every member is stopped (again: stops are
        // idempotent), and it ends.
        agent.serve();
        eventually("the operation's end", || h.published("p").operation.is_none()).await;
        assert_eq!(h.stored_operation(&op.id).status, OperationStatus::Succeeded);
        let snap = h.shared.read_model.cluster("p").unwrap();
        assert_eq!(snap.record.status, ClusterStatus::Stopped);
        assert_eq!(snap.instances.len(), 2);
        assert!(snap.instances.values().all(|i| i.record.status == InstanceStatus::Stopped));
        // It answers requests again.
        let start = h.run("p", OpRequest::Start).await.expect("accepted after the restart");
        assert_eq!(start.cluster, "p");
        let events = h.events();
        assert!(events.iter().any(|(k, d)| k == "actor.failed"
            && d["reason"].as_str().is_some_and(|r| r.contains("injected panic") && r.contains("restarted"))));
    });
}

/// An inventory taken before a command the master sent on the same
/// connection does not mark the instance Lost; one of a later connection
/// is the truth, even for a generation the master had sent (on an older
/// connection: the agent never got it).
#[test]
fn an_inventory_older_than_a_command_on_its_connection_is_ignored() {
    run(async {
        let h = Harness::new();
        let (c, mut members) = cluster("i", 2);
        members[0].status = InstanceStatus::Stopped;
        members[0].desired = DesiredState::Stopped;
        members[0].pid = None;
        h.persist(&c, &members).await;
        let _sup = h.boot(vec![c.clone()], members.clone()).await;
        let mut agent = h.link("n1", 7);
        let id = members[0].id.clone();
        h.run("i", OpRequest::Instance { id: id.clone(), verb: InstanceVerb::Start }).await.expect("accepted");
        let (rid, req) = agent.request().await;
        assert!(matches!(req, AgentRequest::Start { .. }), "{req:?}");
        agent.answer(rid, AgentResponse::Started { pid: 4242, already_running: false });
        eventually("the start's end", || h.published("i").operation.is_none()).await;
        let report = |m: &crate::storage::records::InstanceRecord, generation, running: bool| {
            crate::protocol::messages::InstanceReport {
                instance: m.id.clone(),
                generation,
                desired_running: true,
                running,
                pid: running.then_some(99),
            }
        };
        // As the connection's node manager hands it over, before any report.
        let inventory = |connection, reports: Vec<crate::protocol::messages::InstanceReport>| {
            let node = crate::ids::NodeId::new("n1");
            let entry = h.shared.read_model.node(&node).expect("the node is registered");
            let handle = h.shared.registry.get("i").expect("the cluster's actor");
            for (instance, observation) in super::node_manager::inventory_lines(&entry, connection, &reports) {
                let slot = crate::actors::read_model::Reservation::counted(&handle.stats);
                handle.addr.do_send(super::cluster::InstanceObserved { instance, observation, ack: None, slot });
            }
        };
        // The Hello of connection 7, taken before that start: the first
        // member is not there yet (an agent that lost it would say the
        // same); the second is there and running.
        inventory(7, vec![report(&members[1], 0, true)]);
        tokio::time::sleep(Duration::from_millis(200)).await;
        let snap = h.shared.read_model.cluster("i").unwrap();
        assert_eq!(snap.instances[&id].record.status, InstanceStatus::Running, "not Lost");
        assert_eq!(snap.instances[&id].record.pid, Some(4242));
        assert_eq!(snap.record.status, ClusterStatus::Active);

        // Connection 8's, which the start (sent on 7, generation 1) does
        // not precede: the agent never got it, so it holds no process.
        let _agent = h.link("n1", 8);
        inventory(8, vec![report(&members[0], 0, false), report(&members[1], 0, true)]);
        eventually("Failed: not running when its agent reconnected", || {
            let r = &h.shared.read_model.cluster("i").unwrap().instances[&id].record;
            r.status == InstanceStatus::Failed
                && r.last_error
                    .as_deref()
                    .is_some_and(|e| e.contains("not running on node n1 when its agent reconnected"))
        })
        .await;
        // And connection 9's, without it: Lost.
        let _agent = h.link("n1", 9);
        inventory(9, vec![report(&members[1], 0, true)]);
        eventually("Lost", || {
            h.shared.read_model.cluster("i").unwrap().instances[&id].record.status == InstanceStatus::Lost
        })
        .await;
    });
}

/// A member that crashes while an operation runs on another member is
/// escalated once the operation has ended (it was dropped: the cluster
/// stayed Active with a dead member).
#[test]
fn a_member_crash_during_an_operation_on_others_is_escalated() {
    run(async {
        let h = Harness::new();
        let (c, members) = cluster("d", 2);
        h.persist(&c, &members).await;
        let _sup = h.boot(vec![c.clone()], members.clone()).await;
        let mut agent = h.link("n1", 1);
        let (a, b) = (members[0].clone(), members[1].clone());
        h.run("d", OpRequest::Instance { id: b.id.clone(), verb: InstanceVerb::Restart }).await.expect("accepted");
        let (rid, req) = agent.request().await;
        assert!(matches!(req, AgentRequest::Stop { .. }), "{req:?}");
        // Member a dies meanwhile.
        let handle = h.handle("d");
        let exited = super::instance::Observation::Exited {
            pid: a.pid.unwrap(),
            description: "exited with code 137".into(),
            restarting: false,
        };
        let slot = super::read_model::Reservation::counted(&handle.stats);
        handle
            .addr
            .send(super::cluster::InstanceObserved { instance: a.id.clone(), observation: exited, ack: None, slot })
            .await
            .unwrap();
        assert_eq!(h.published("d").status, ClusterStatus::Active, "the operation decides while it runs");
        agent.answer(rid, AgentResponse::Stopped { was_running: true });
        let (rid, req) = agent.request().await;
        assert!(matches!(req, AgentRequest::Start { .. }), "{req:?}");
        agent.answer(rid, AgentResponse::Started { pid: 5000, already_running: false });
        eventually("Error", || h.published("d").status == ClusterStatus::Error).await;
        let description = h.published("d").status_description.clone();
        assert!(description.contains(a.id.as_str()) && description.contains("code 137"), "{description}");
        assert_eq!(h.stored_cluster(&c).unwrap().status, ClusterStatus::Error, "durable");
    });
}

use crate::storage::records::DesiredState;

/// Whether `ops` puts the record of instance `id`.
fn puts_instance(ops: &[crate::storage::WriteOp], id: &crate::ids::InstanceId) -> bool {
    ops.iter().any(|o| {
        matches!(o, crate::storage::WriteOp::Put { cf, key, .. }
            if *cf == crate::storage::keys::master_cf::INSTANCES && key.ends_with(id.as_str().as_bytes()))
    })
}

/// An exit the agent reports for `m` (its policy gave up).
fn died(
    h: &Harness,
    name: &str,
    m: &crate::storage::records::InstanceRecord,
) -> impl std::future::Future<Output = ()> + use<> {
    let handle = h.handle(name);
    let observation = super::instance::Observation::Exited {
        pid: m.pid.unwrap(),
        description: "exited with code 137".into(),
        restarting: false,
    };
    let slot = super::read_model::Reservation::counted(&handle.stats);
    let msg = super::cluster::InstanceObserved { instance: m.id.clone(), observation, ack: None, slot };
    async move { handle.addr.send(msg).await.unwrap() }
}

/// A member's failure and its cluster's `Error` are one batch: while it
/// fails (tried again until it lands), readers see neither; once it lands,
/// both, durably. (They were two writes, the member's first: a reader, or
/// a crash, could see a failed member in an `Active` cluster.)
#[test]
fn a_member_failure_and_its_clusters_error_are_one_durable_batch() {
    run(async {
        let h = Harness::new();
        let (c, members) = cluster("e", 2);
        h.persist(&c, &members).await;
        let _sup = h.boot(vec![c.clone()], members.clone()).await;
        let _agent = h.link("n1", 1);
        let a = members[0].clone();
        let id = a.id.clone();
        h.store.fail(3, move |ops| puts_instance(ops, &id) && super::test_support::is_cluster_write(ops));
        let applied = actix::spawn(died(&h, "e", &a));
        tokio::time::sleep(Duration::from_millis(150)).await;
        let snap = h.shared.read_model.cluster("e").unwrap();
        assert_eq!(snap.instances[&a.id].record.status, InstanceStatus::Running, "shown before it is durable");
        assert_eq!(snap.record.status, ClusterStatus::Active);
        applied.await.unwrap();
        assert_eq!(
            h.store.refused.load(std::sync::atomic::Ordering::SeqCst),
            3,
            "the member and the cluster were not written in one batch"
        );
        let snap = h.shared.read_model.cluster("e").unwrap();
        assert_eq!(snap.instances[&a.id].record.status, InstanceStatus::Failed);
        assert_eq!(snap.record.status, ClusterStatus::Error);
        let stored = h.stored_cluster(&c).unwrap();
        assert_eq!(stored.status, ClusterStatus::Error, "durable");
        assert!(
            stored.status_description.contains(a.id.as_str()) && stored.status_description.contains("code 137"),
            "{}",
            stored.status_description
        );

        // A second member failing adds itself to the description: one
        // Error, no second escalation.
        died(&h, "e", &members[1]).await;
        let stored = h.stored_cluster(&c).unwrap();
        assert!(stored.status_description.contains(members[1].id.as_str()), "{}", stored.status_description);
        let failed = h.events().iter().filter(|(kind, _)| kind == "actor.failed").count();
        assert_eq!(failed, 2, "one actor.failed event per member, no more");
    });
}

/// A scale-out accepted while a member's failure is being written keeps
/// the ordinals it counted: the failure's write never puts back an older
/// copy of the cluster record (it did: the next scale-out reused the ids
/// of running members, and its undo deleted them).
#[test]
fn a_scale_out_accepted_during_an_escalation_keeps_its_ordinals() {
    run(async {
        let h = Harness::new();
        let (c, members) = cluster("o", 2);
        h.persist(&c, &members).await;
        let _sup = h.boot(vec![c.clone()], members.clone()).await;
        let _agent = h.link("n1", 1);
        h.shared.read_model.node(&NodeId::new("n1")).unwrap().live.connect(1);
        let a = members[0].clone();
        let id = a.id.clone();
        // Its first two tries fail: the scale-out is accepted in between.
        h.store.fail(2, move |ops| puts_instance(ops, &id));
        let applied = actix::spawn(died(&h, "o", &a));
        tokio::time::sleep(Duration::from_millis(50)).await;
        let req = OpRequest::ScaleOut { role: "server".into(), add: 1, nodes: None };
        h.run("o", req).await.expect("accepted");
        applied.await.unwrap();
        assert_eq!(h.store.refused.load(std::sync::atomic::Ordering::SeqCst), 2);
        let next = |r: &crate::storage::records::ClusterRecord| r.roles["server"].next_ordinal;
        assert_eq!(next(&h.published("o")), 4, "published");
        assert_eq!(next(&h.stored_cluster(&c).unwrap()), 4, "stored");
        assert_eq!(h.shared.read_model.cluster("o").unwrap().instances[&a.id].record.status, InstanceStatus::Failed);
    });
}

/// An `Active` cluster stored with a failed member (an older master
/// crashed between the two writes) is put in `Error` at boot, naming it.
#[test]
fn boot_puts_an_active_cluster_with_a_failed_member_in_error() {
    run(async {
        let h = Harness::new();
        let (c, mut members) = cluster("b", 2);
        members[1].status = InstanceStatus::Lost;
        members[1].pid = None;
        members[1].last_error = Some("node n1 is down: no word from its agent for 30 s".into());
        h.persist(&c, &members).await;
        let _sup = h.boot(vec![c.clone()], members.clone()).await;
        eventually("Error", || h.published("b").status == ClusterStatus::Error).await;
        let stored = h.stored_cluster(&c).unwrap();
        assert_eq!(stored.status, ClusterStatus::Error);
        assert!(
            stored.status_description.contains(members[1].id.as_str())
                && stored.status_description.contains("node n1 is down"),
            "{}",
            stored.status_description
        );
    });
}

/// Members failing at the same moment give one `Error`, naming each: the
/// second waits for the first's write and adds itself (they were each
/// written from the `Active` record, the last one's reason winning).
#[test]
fn members_failing_together_give_one_error_naming_each() {
    run(async {
        let h = Harness::new();
        let (c, members) = cluster("t", 3);
        h.persist(&c, &members).await;
        let _sup = h.boot(vec![c.clone()], members.clone()).await;
        let _agent = h.link("n1", 1);
        let all: Vec<_> = members.iter().map(|m| actix::spawn(died(&h, "t", m))).collect();
        for a in all {
            a.await.unwrap();
        }
        let stored = h.stored_cluster(&c).unwrap();
        assert_eq!(stored.status, ClusterStatus::Error);
        for m in &members {
            assert!(
                stored.status_description.contains(&format!("member {} failed", m.id)),
                "{}",
                stored.status_description
            );
        }
        let to_error = h.events().iter().filter(|(kind, d)| kind == "cluster.status" && d["status"] == "Error").count();
        assert_eq!(to_error, 3, "one status change per member named (Active -> Error, then two descriptions)");
        assert_eq!(h.published("t").status_description, stored.status_description, "published as stored");
    });
}

/// A command the watchdog stopped waiting for (its agent answers late) is
/// waited for before the cluster's next operation starts its steps: that
/// operation sends nothing until the command has ended. (It went ahead at
/// once, its commands to other members racing the abandoned one.)
#[test]
fn the_next_operation_waits_for_a_command_the_watchdog_left_running() {
    run(async {
        let mut h = Harness::new();
        // A stop step fails after 2 s without progress plus twice the
        // package's 1 s stop grace; the link waits 60 s for an answer.
        h.shared.timing.agent_reply_timeout = Duration::from_secs(1);
        h.shared.timing.step_idle_margin = Duration::from_secs(1);
        let (c, members) = cluster("w", 2);
        h.persist(&c, &members).await;
        let _sup = h.boot(vec![c.clone()], members.clone()).await;
        let mut agent = h.link_within("n1", 1, Duration::from_secs(60));
        let (a, b) = (members[0].id.clone(), members[1].id.clone());
        let stop = h.run("w", OpRequest::Instance { id: a.clone(), verb: InstanceVerb::Stop }).await.expect("accepted");
        let (late, req) = agent.request().await;
        assert!(matches!(&req, AgentRequest::Stop { instance, .. } if *instance == a), "{req:?}");
        eventually("the stop's end", || h.published("w").operation.is_none()).await;
        let stop = h.stored_operation(&stop.id);
        assert_eq!(stop.status, OperationStatus::Failed, "{stop:?}");
        assert!(stop.error.as_deref().is_some_and(|e| e.contains("watchdog")), "{stop:?}");

        // The next operation, on the other member, is accepted and waits.
        let restart =
            h.run("w", OpRequest::Instance { id: b.clone(), verb: InstanceVerb::Restart }).await.expect("accepted");
        let early = tokio::time::timeout(Duration::from_secs(2), agent.request()).await;
        assert!(early.is_err(), "the restart sent {early:?} while the abandoned stop was unanswered");
        let state = h.handle("w").stats.state();
        assert_eq!(state, "waiting for the commands an earlier operation left running (1)");
        agent.answer(late, AgentResponse::Stopped { was_running: true });
        let (rid, req) = agent.request().await;
        assert!(matches!(&req, AgentRequest::Stop { instance, .. } if *instance == b), "{req:?}");
        agent.answer(rid, AgentResponse::Stopped { was_running: true });
        agent.serve();
        eventually("the restart's end", || h.stored_operation(&restart.id).status != OperationStatus::Running).await;
        assert_eq!(h.stored_operation(&restart.id).status, OperationStatus::Succeeded);
    });
}
