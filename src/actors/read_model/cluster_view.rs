//! One cluster as readers see it: an immutable snapshot (the record and an
//! index of its instances) behind an `ArcSwap`, replaced whole by the
//! cluster's actor after every durable change.
//!
//! Readers take the current snapshot (one atomic load) and keep it as long
//! as they like; they never lock and never wait for a writer. The snapshot
//! shares its parts with the previous one (`imbl`'s persistent map, `Arc`ed
//! records), so publishing one instance's change costs a path copy in the
//! index, not a copy of the cluster.
//!
//! Single writer: only the cluster's actor publishes (its instance actors
//! live on the same thread), so a load-modify-store never loses an update.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use arc_swap::ArcSwap;
use imbl::OrdMap;

use crate::ids::InstanceId;
use crate::storage::records::{ClusterRecord, InstanceRecord};

/// What `GET /actors` shows of one instance actor; written by the actor,
/// read by anyone, never locked.
#[derive(Debug, Default)]
pub struct InstanceStats {
    /// Messages waiting for the actor (commands and observations).
    pub queued: AtomicU32,
    pub handled: AtomicU64,
    /// What it does now: an index into `VERBS` (0: idle).
    current: AtomicU32,
    /// Unix ms when it began its current message (0: idle).
    since_ms: AtomicU64,
    /// Unix ms when its oldest waiting message was queued (0: none).
    oldest_ms: AtomicU64,
}

/// The verbs an instance actor can be busy with (index 0: idle).
const VERBS: [&str; 11] =
    ["", "install", "start", "stop", "write files", "delete", "hook", "health check", "signal", "observe", "reload"];

fn now_ms() -> u64 {
    u64::try_from(time::OffsetDateTime::now_utc().unix_timestamp_nanos() / 1_000_000).unwrap_or(0)
}

impl InstanceStats {
    pub fn enqueue(&self) {
        if self.queued.fetch_add(1, Ordering::Relaxed) == 0 {
            self.oldest_ms.store(now_ms(), Ordering::Relaxed);
        }
    }

    pub fn begin(&self, verb: &str) {
        if self.queued.fetch_sub(1, Ordering::Relaxed) <= 1 {
            self.oldest_ms.store(0, Ordering::Relaxed);
        }
        self.handled.fetch_add(1, Ordering::Relaxed);
        let i = VERBS.iter().position(|v| *v == verb).unwrap_or(6) as u32;
        self.current.store(i, Ordering::Relaxed);
        self.since_ms.store(now_ms(), Ordering::Relaxed);
    }

    pub fn end(&self) {
        self.current.store(0, Ordering::Relaxed);
        self.since_ms.store(0, Ordering::Relaxed);
    }

    /// (current verb, since ms, queued, oldest queued ms, handled)
    pub fn read(&self) -> (Option<&'static str>, u64, u32, u64, u64) {
        let cur = self.current.load(Ordering::Relaxed) as usize;
        (
            VERBS.get(cur).copied().filter(|v| !v.is_empty()),
            self.since_ms.load(Ordering::Relaxed),
            self.queued.load(Ordering::Relaxed),
            self.oldest_ms.load(Ordering::Relaxed),
            self.handled.load(Ordering::Relaxed),
        )
    }
}

/// One instance in a snapshot.
#[derive(Debug, Clone)]
pub struct InstanceEntry {
    pub record: Arc<InstanceRecord>,
    pub stats: Arc<InstanceStats>,
}

/// A cluster at one moment.
#[derive(Debug, Clone)]
pub struct ClusterSnapshot {
    pub record: Arc<ClusterRecord>,
    pub instances: OrdMap<InstanceId, InstanceEntry>,
    /// Kept with every change, so a summary (`GET /clusters`) costs the
    /// number of roles, not of instances.
    pub counts: Counts,
}

/// Instances by role and by status.
#[derive(Debug, Clone, Default)]
pub struct Counts {
    pub roles: std::collections::BTreeMap<std::sync::Arc<str>, u32>,
    /// Indexed by `InstanceStatus as usize`.
    pub statuses: [u32; 11],
}

impl Counts {
    fn add(&mut self, r: &InstanceRecord, sign: i64) {
        let role = self.roles.entry(r.role.clone()).or_default();
        *role = (*role as i64 + sign).max(0) as u32;
        if *role == 0 {
            self.roles.remove(&*r.role);
        }
        let st = &mut self.statuses[r.status as usize];
        *st = (*st as i64 + sign).max(0) as u32;
    }
}

impl ClusterSnapshot {
    /// The instances by role, then ordinal.
    pub fn sorted_instances(&self) -> Vec<&InstanceEntry> {
        let mut v: Vec<&InstanceEntry> = self.instances.values().collect();
        v.sort_by(|a, b| (&*a.record.role, a.record.ordinal).cmp(&(&*b.record.role, b.record.ordinal)));
        v
    }
}

/// The published snapshot of one cluster.
#[derive(Debug)]
pub struct ClusterCell {
    snap: ArcSwap<ClusterSnapshot>,
}

impl ClusterCell {
    pub fn new(record: ClusterRecord) -> Arc<ClusterCell> {
        Arc::new(ClusterCell {
            snap: ArcSwap::from_pointee(ClusterSnapshot {
                record: Arc::new(record),
                instances: OrdMap::new(),
                counts: Counts::default(),
            }),
        })
    }

    /// The current snapshot.
    pub fn load(&self) -> Arc<ClusterSnapshot> {
        self.snap.load_full()
    }

    fn update(&self, f: impl FnOnce(&mut ClusterSnapshot)) {
        let mut next = ClusterSnapshot::clone(&self.snap.load());
        f(&mut next);
        self.snap.store(Arc::new(next));
    }

    /// Publishes the cluster's record (after it is durable).
    pub fn set_record(&self, record: ClusterRecord) {
        self.update(|s| s.record = Arc::new(record));
    }

    /// Publishes one instance (after it is durable).
    pub fn put_instance(&self, entry: InstanceEntry) {
        self.put_instances(std::iter::once(entry));
    }

    /// Publishes many instances at once (a whole step's records).
    pub fn put_instances(&self, entries: impl IntoIterator<Item = InstanceEntry>) {
        self.update(|s| {
            for e in entries {
                s.counts.add(&e.record, 1);
                if let Some(old) = s.instances.insert(e.record.id.clone(), e) {
                    s.counts.add(&old.record, -1);
                }
            }
        });
    }

    pub fn remove_instances(&self, ids: &[InstanceId]) {
        self.update(|s| {
            for id in ids {
                if let Some(old) = s.instances.remove(id) {
                    s.counts.add(&old.record, -1);
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::testdata as td;

    #[test]
    fn a_reader_keeps_its_snapshot_while_the_writer_publishes() {
        let c = td::cluster("web");
        let cell = ClusterCell::new(c.clone());
        let entry = |i| InstanceEntry { record: Arc::new(td::instance(&c, i)), stats: Arc::default() };
        cell.put_instances((1..=3).map(entry));
        let before = cell.load();
        cell.put_instance(entry(4));
        cell.remove_instances(&[before.sorted_instances()[0].record.id.clone()]);
        assert_eq!(before.instances.len(), 3, "a held snapshot never changes");
        let after = cell.load();
        assert_eq!(after.instances.len(), 3);
        let ordinals: Vec<u32> = after.sorted_instances().iter().map(|e| e.record.ordinal).collect();
        assert_eq!(ordinals, vec![2, 3, 4]);
        // The counts follow every change.
        assert_eq!(after.counts.roles.values().sum::<u32>(), 3);
        assert_eq!(after.counts.statuses.iter().sum::<u32>(), 3);
        let mut failed = InstanceRecord::clone(&after.sorted_instances()[0].record);
        failed.status = crate::storage::records::InstanceStatus::Failed;
        cell.put_instance(InstanceEntry { record: Arc::new(failed), stats: Arc::default() });
        let counts = cell.load().counts.clone();
        assert_eq!(counts.statuses[crate::storage::records::InstanceStatus::Failed as usize], 1);
        assert_eq!(counts.statuses.iter().sum::<u32>(), 3);
    }

    #[test]
    fn stats_show_the_current_verb_and_the_oldest_waiting_message() {
        let s = InstanceStats::default();
        s.enqueue();
        s.enqueue();
        let (cur, _, queued, oldest, _) = s.read();
        assert_eq!((cur, queued), (None, 2));
        assert!(oldest > 0);
        s.begin("start");
        assert_eq!(s.read().0, Some("start"));
        assert!(s.read().3 > 0, "one still waits");
        s.end();
        s.begin("stop");
        assert_eq!(s.read().3, 0, "nothing waits");
        assert_eq!(s.read().4, 2);
    }
}
