//! The fencing proof (a killed process never exercises it): a leader
//! paused (SIGSTOP) in the middle of a scale-out until another master has
//! taken over, then resumed (SIGCONT), writes nothing (its writes are
//! refused by the fence, or it finds its lease gone or another master's
//! key first), commands nothing, and exits; the new leader finished the scale-out, and every
//! instance runs once.

use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use super::super::master_restart::slow_scale_out_under_way;
use crate::common::etcd::EtcdCluster;
use crate::common::{TestEnv, all_instances, id_of, instance_pids, pid_of};

#[tokio::test]
async fn a_paused_leader_woken_after_a_takeover_writes_nothing_commands_nothing_and_exits() {
    let etcd = EtcdCluster::start(3);
    let mut env = TestEnv::start_ha("ha-fence", &etcd, 2).await;
    let (first, h0) = env.follow_leader(None, Duration::from_secs(10)).await;
    assert_eq!(first, 0, "master 0 started first and leads: {h0:#}");
    let term0 = h0["term"].as_i64().expect("term");
    let op_id = slow_scale_out_under_way(&env, "fence").await;

    // Paused in the middle of it; the other master takes over once the
    // paused one's lease (2 s) expires.
    let paused = Instant::now();
    env.signal_ha(0, Signal::SIGSTOP);
    let (now, h1) = env.follow_leader(Some(0), Duration::from_secs(30)).await;
    let took = paused.elapsed();
    assert_eq!(now, 1);
    let term1 = h1["term"].as_i64().expect("term");
    assert!(term1 > term0, "the new term {term1} is above {term0}");
    assert!(took < Duration::from_secs(10), "the takeover took {took:?} (lease TTL 2 s)");

    // The agents leave the silent master (their idle limit) for the new
    // leader, which finishes the scale-out from the journal.
    let op = env.wait_op(&op_id).await;
    env.assert_succeeded(&op);
    let c = env.cluster("fence").await;
    let members = all_instances(&c);
    assert_eq!(members.len(), 4, "{c:#}");
    let pids: Vec<(String, u32)> = members.iter().map(|m| (id_of(m), pid_of(m))).collect();

    // Woken up: it believes it leads until its first write or renewal says
    // otherwise, then exits with that cause.
    env.signal_ha(0, Signal::SIGCONT);
    super::exits_saying_why(&mut env, 0, Duration::from_secs(20), "the woken leader").await;
    // It changed nothing: the new leader still leads in its term, every
    // member runs once, the same processes as before it woke.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (still, h) = env.leader_within(Duration::from_secs(5)).await;
    assert_eq!((still, h["term"].as_i64()), (1, Some(term1)), "{h:#}");
    for (id, pid) in pids {
        assert_eq!(instance_pids(&id), vec![pid], "{id} was started again or stopped after the old leader woke");
    }
}
