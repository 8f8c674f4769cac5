//! The master's supervision tree, declared in one place (as an OTP child
//! spec is): who supervises whom, with which strategy, restart intensity
//! and backoff, and what happens when a child is given up. `GET /actors`
//! and the dashboard draw this tree; the supervisor and the task runner
//! ([`crate::actors::supervised::task`]) restart by it.
//!
//! ```text
//! master ─┬─ store_writer      (thread; its death, or one write past store_stall_limit, exits the master)
//!         ├─ supervisor        (actor; one_for_one over the rest)
//!         │   ├─ cluster/*     (actor; its instance actors live and die with it)
//!         │   │   └─ instance/* (a panic in a turn fails the cluster's actor: one_for_all)
//!         │   └─ node_manager/* (actor + its link writer, one_for_all)
//!         ├─ agent_listener    (task)
//!         ├─ node_watcher      (task)
//!         ├─ leaked_sweep      (task)
//!         ├─ peer_blobs        (task, on etcd)
//!         ├─ pool_launcher     (task; node pools and requests, from the store at each start)
//!         └─ announce/*        (temporary tasks: one per event write, never restarted, a panic reported)
//! ```

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// How a supervisor restarts its children when one fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    /// Only the child that failed.
    OneForOne,
    /// The child and the others of its group (a node manager and its link
    /// writer; a cluster actor and its instance actors).
    OneForAll,
}

/// What is done once a child has failed more often than its intensity
/// allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GiveUp {
    /// The child is left down, listed as `failed`, and its cluster goes
    /// `Error` (durably) saying why; an operator restarts it.
    ClusterError,
    /// The master exits non-zero with the cause: a service manager starts
    /// it again, and the journal resumes what ran. Never a half-working
    /// master.
    ExitMaster,
    /// The connection is closed: the agent connects again, and a new child
    /// serves it (each connection is a new child, so none is given up).
    Reconnect,
    /// Never restarted alone: its group's head fails with it (an instance
    /// actor's panic fails its cluster's actor, which its supervisor
    /// restarts with every instance actor from the store).
    Group,
    /// A temporary child (OTP's `temporary`): its one piece of work is
    /// lost, its panic is logged and counted, nothing else is touched.
    Reported,
}

/// One kind of child.
#[derive(Debug)]
pub struct ChildSpec {
    pub kind: &'static str,
    /// The kind that supervises it (`master` for the root's children).
    pub supervisor: &'static str,
    pub strategy: Strategy,
    /// At most this many restarts within `period`; one more and the child
    /// is given up (`give_up`). Zero: never restarted.
    pub intensity: usize,
    pub period: Duration,
    /// The wait before a restart.
    pub backoff: Duration,
    pub give_up: GiveUp,
}

impl ChildSpec {
    /// As `GET /actors` shows it, e.g. `one_for_one, 3 in 60s`.
    pub fn describe(&self) -> String {
        let strategy = match self.strategy {
            Strategy::OneForOne => "one_for_one",
            Strategy::OneForAll => "one_for_all",
        };
        let then = match self.give_up {
            GiveUp::ClusterError => "then failed (cluster Error)",
            GiveUp::ExitMaster => "then the master exits",
            GiveUp::Reconnect => "then the agent reconnects",
            GiveUp::Reported => "a panic is logged and counted",
            GiveUp::Group => "its group fails with it",
        };
        if self.give_up == GiveUp::Group {
            return format!("{strategy}: its failure fails its cluster's actor, and it is restarted with it");
        }
        match self.intensity {
            0 => format!("{strategy}, never restarted, {then}"),
            n => format!("{strategy}, {n} in {}s, {then}", self.period.as_secs()),
        }
    }
}

const MINUTE: Duration = Duration::from_secs(60);

/// The tree. Every long-lived actor and task of the master is one of these.
pub const TREE: [ChildSpec; 12] = [
    ChildSpec {
        kind: "store_writer",
        supervisor: "master",
        strategy: Strategy::OneForOne,
        intensity: 0,
        period: MINUTE,
        backoff: Duration::ZERO,
        give_up: GiveUp::ExitMaster,
    },
    // On etcd (`actors::role`): a master whose leadership is lost exits
    // (it comes back as a follower); with the embedded store, absent.
    ChildSpec {
        kind: "leadership",
        supervisor: "master",
        strategy: Strategy::OneForOne,
        intensity: 0,
        period: MINUTE,
        backoff: Duration::ZERO,
        give_up: GiveUp::ExitMaster,
    },
    ChildSpec {
        kind: "supervisor",
        supervisor: "master",
        strategy: Strategy::OneForOne,
        intensity: 0,
        period: MINUTE,
        backoff: Duration::ZERO,
        give_up: GiveUp::ExitMaster,
    },
    ChildSpec {
        kind: "cluster",
        supervisor: "supervisor",
        strategy: Strategy::OneForAll,
        intensity: 3,
        period: MINUTE,
        backoff: Duration::from_millis(100),
        give_up: GiveUp::ClusterError,
    },
    ChildSpec {
        kind: "instance",
        supervisor: "cluster",
        strategy: Strategy::OneForAll,
        intensity: 0,
        period: MINUTE,
        backoff: Duration::ZERO,
        give_up: GiveUp::Group,
    },
    ChildSpec {
        kind: "node_manager",
        supervisor: "supervisor",
        strategy: Strategy::OneForAll,
        intensity: 0,
        period: MINUTE,
        backoff: Duration::ZERO,
        give_up: GiveUp::Reconnect,
    },
    ChildSpec {
        kind: "agent_listener",
        supervisor: "master",
        strategy: Strategy::OneForOne,
        intensity: 5,
        period: MINUTE,
        backoff: Duration::from_millis(200),
        give_up: GiveUp::ExitMaster,
    },
    ChildSpec {
        kind: "node_watcher",
        supervisor: "master",
        strategy: Strategy::OneForOne,
        intensity: 5,
        period: MINUTE,
        backoff: Duration::from_millis(200),
        give_up: GiveUp::ExitMaster,
    },
    ChildSpec {
        kind: "leaked_sweep",
        supervisor: "master",
        strategy: Strategy::OneForOne,
        intensity: 5,
        period: MINUTE,
        backoff: Duration::from_millis(200),
        give_up: GiveUp::ExitMaster,
    },
    // Fetching package tarballs this master lacks from the others (on
    // etcd: `peer_blobs`); it looks again from scratch each pass.
    ChildSpec {
        kind: "peer_blobs",
        supervisor: "master",
        strategy: Strategy::OneForOne,
        intensity: 5,
        period: MINUTE,
        backoff: Duration::from_secs(1),
        give_up: GiveUp::ExitMaster,
    },
    // Node pools' launcher (`actors::pools`): it starts over from the
    // store, so a restart loses nothing it committed.
    ChildSpec {
        kind: "pool_launcher",
        supervisor: "master",
        strategy: Strategy::OneForOne,
        intensity: 5,
        period: MINUTE,
        backoff: Duration::from_secs(1),
        give_up: GiveUp::ExitMaster,
    },
    // Best-effort event writes (`announce`): many short tasks, not listed
    // one by one in `GET /actors`; counted in `flotilla_live_tasks`.
    ChildSpec {
        kind: "announce",
        supervisor: "master",
        strategy: Strategy::OneForOne,
        intensity: 0,
        period: MINUTE,
        backoff: Duration::ZERO,
        give_up: GiveUp::Reported,
    },
];

/// How `kind`'s supervisor restarts it (`GET /actors`); the root says so.
pub fn describe(kind: &str) -> String {
    match TREE.iter().find(|s| s.kind == kind) {
        Some(s) => s.describe(),
        None => "the root: restarted by the service manager".into(),
    }
}

/// The spec of `kind` (every kind the master starts is in [`TREE`]).
pub fn spec(kind: &str) -> &'static ChildSpec {
    TREE.iter().find(|s| s.kind == kind).unwrap_or_else(|| panic!("no child spec for actor kind {kind:?}"))
}

/// A child's recent restarts, against its spec's intensity.
#[derive(Debug, Default)]
pub struct Intensity {
    recent: VecDeque<Instant>,
}

impl Intensity {
    /// Counts a failure at `now`: `Ok(n)` when the child may be restarted
    /// (its `n`-th restart in the period), `Err(n)` when it is given up
    /// (`n` restarts already in the period).
    pub fn failed(&mut self, spec: &ChildSpec, now: Instant) -> Result<usize, usize> {
        self.recent.retain(|t| now.duration_since(*t) < spec.period);
        if self.recent.len() >= spec.intensity {
            return Err(self.recent.len());
        }
        self.recent.push_back(now);
        Ok(self.recent.len())
    }

    /// How many more failures at `now` would still be restarted.
    pub fn room(&mut self, spec: &ChildSpec, now: Instant) -> usize {
        self.recent.retain(|t| now.duration_since(*t) < spec.period);
        spec.intensity.saturating_sub(self.recent.len())
    }

    /// Forgets the restarts (an operator restarted a given-up child).
    pub fn reset(&mut self) {
        self.recent.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_one_spec_and_a_supervisor_in_the_tree() {
        for s in &TREE {
            assert_eq!(TREE.iter().filter(|o| o.kind == s.kind).count(), 1, "{} twice", s.kind);
            assert!(s.supervisor == "master" || TREE.iter().any(|o| o.kind == s.supervisor), "{s:?}");
        }
        assert_eq!(spec("cluster").describe(), "one_for_all, 3 in 60s, then failed (cluster Error)");
        assert_eq!(spec("store_writer").describe(), "one_for_one, never restarted, then the master exits");
        assert_eq!(spec("announce").describe(), "one_for_one, never restarted, a panic is logged and counted");
        assert_eq!(
            spec("instance").describe(),
            "one_for_all: its failure fails its cluster's actor, and it is restarted with it"
        );
    }

    #[test]
    fn past_its_intensity_a_child_is_given_up_until_the_period_has_passed() {
        let s = spec("cluster");
        let mut i = Intensity::default();
        let t0 = Instant::now();
        assert_eq!(i.failed(s, t0), Ok(1));
        assert_eq!(i.failed(s, t0 + Duration::from_secs(1)), Ok(2));
        assert_eq!(i.failed(s, t0 + Duration::from_secs(2)), Ok(3));
        assert_eq!(i.failed(s, t0 + Duration::from_secs(3)), Err(3));
        // Once the first restart is older than the period, one more is allowed.
        assert_eq!(i.failed(s, t0 + Duration::from_millis(60_500)), Ok(3));
        i.reset();
        assert_eq!(i.failed(s, t0 + Duration::from_secs(62)), Ok(1));
        assert_eq!(Intensity::default().failed(spec("store_writer"), t0), Err(0));
    }
}
