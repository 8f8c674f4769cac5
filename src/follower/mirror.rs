//! A follower's read model, kept from the store's changes as the etcd
//! watch delivers them ([`crate::storage::etcd::watch`]): the same
//! [`ReadModel`] the leader's actors publish to, so the same handlers
//! answer reads on either.
//!
//! What it keeps: clusters and their instances, nodes, packages, running
//! operations (an ended one is read from the store), leftovers, cordons
//! and API tokens; appended events go to the store's event feed. What it
//! cannot keep is what lives only in the leader's memory: agents' links,
//! actors, pools; a follower sends those reads to the leader
//! ([`super::gate`]).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use crate::actors::read_model::{ClusterCell, InstanceEntry, PackageView, ReadModel};
use crate::actors::tokens::ApiTokens;
use crate::ids::{ClusterId, InstanceId, NodeId, OperationId};
use crate::spec::ComponentSpec;
use crate::storage::db::decode_value;
use crate::storage::etcd::watch::{Apply, Change};
use crate::storage::keys::{self, master_cf};
use crate::storage::records::{
    ClusterRecord, CordonRecord, InstanceRecord, LeftoverRecord, NodeRecord, OperationRecord, PackageRecord,
    TokenRecord,
};

/// Hands appended events (number, stored value) to the event feed.
pub type Announce = Box<dyn FnMut(Vec<(u64, Vec<u8>)>) + Send>;

/// How many cluster and instance records the view holds no readable
/// value of (stored by a newer build, or damaged): a master must not boot
/// from such a view (its cluster would look gone, its name free).
pub type Unreadable = Arc<std::sync::atomic::AtomicUsize>;

/// The etcd revision each cluster and instance key the view holds was
/// last changed at: a master that boots from the view first checks it
/// against a keys-only read of the store (`Follower::view_at`).
pub type Revisions = Arc<std::sync::Mutex<HashMap<(&'static str, Vec<u8>), i64>>>;

/// Applies the store's changes to a follower's read model.
pub struct Mirror {
    read_model: Arc<ReadModel>,
    tokens: Arc<ApiTokens>,
    /// Where appended events are announced (the follower's store feed).
    announce: Announce,
    /// Each cluster's name (instance keys and deletes carry only its id).
    names: HashMap<ClusterId, String>,
    /// Instances seen before their cluster (kept until it comes).
    orphans: HashMap<ClusterId, Vec<InstanceRecord>>,
    /// Events of the current group, announced at its end.
    appended: Vec<(u64, Vec<u8>)>,
    /// During a load: every key it put (what it did not is gone at its end).
    loading: Option<HashSet<(&'static str, Vec<u8>)>>,
    /// Cluster and instance keys whose last value could not be read.
    unread: HashSet<(&'static str, Vec<u8>)>,
    unreadable: Unreadable,
    revisions: Revisions,
}

/// The column families a load reads (events come only from the watch: a
/// follower's event stream reads older ones from the store).
pub const LOADED: [&str; 8] = [
    master_cf::CLUSTERS,
    master_cf::INSTANCES,
    master_cf::NODES,
    master_cf::PACKAGES,
    master_cf::OPERATIONS,
    master_cf::LEFTOVERS,
    master_cf::CORDONS,
    master_cf::TOKENS,
];

impl Mirror {
    pub fn new(
        read_model: Arc<ReadModel>,
        tokens: Arc<ApiTokens>,
        announce: Announce,
        unreadable: Unreadable,
        revisions: Revisions,
    ) -> Mirror {
        Mirror {
            read_model,
            tokens,
            announce,
            names: HashMap::new(),
            orphans: HashMap::new(),
            appended: Vec::new(),
            loading: None,
            unread: HashSet::new(),
            unreadable,
            revisions,
        }
    }

    /// Notes the revision `key` was last changed at (`None`: deleted).
    fn changed(&self, cf: &'static str, key: &[u8], revision: Option<i64>) {
        if cf != master_cf::CLUSTERS && cf != master_cf::INSTANCES {
            return;
        }
        let mut revisions = self.revisions.lock().unwrap_or_else(|p| p.into_inner());
        match revision {
            Some(r) => revisions.insert((cf, key.to_vec()), r),
            None => revisions.remove(&(cf, key.to_vec())),
        };
    }

    /// Notes whether the last value of `key` could be read.
    fn readable(&mut self, cf: &'static str, key: &[u8], yes: bool) {
        if cf != master_cf::CLUSTERS && cf != master_cf::INSTANCES {
            return;
        }
        if yes {
            self.unread.remove(&(cf, key.to_vec()));
        } else {
            self.unread.insert((cf, key.to_vec()));
        }
        self.unreadable.store(self.unread.len(), std::sync::atomic::Ordering::SeqCst);
    }

    fn put(&mut self, cf: &'static str, key: &[u8], value: &[u8]) -> Result<(), crate::storage::StorageError> {
        let rm = &self.read_model;
        match cf {
            master_cf::CLUSTERS => {
                let r: ClusterRecord = decode_value(cf, key, value)?;
                let id = r.id;
                let name = r.name.clone();
                match rm.cluster_cell(&name).filter(|cell| cell.load().record.id == id) {
                    Some(cell) => cell.set_record(r),
                    None => {
                        // New, or a new cluster of an old one's name (the
                        // old one's delete not seen: a load after a compaction).
                        self.names.retain(|other, n| *other == id || *n != name);
                        let cell = ClusterCell::new(r);
                        if let Some(waiting) = self.orphans.remove(&id) {
                            cell.put_instances(waiting.into_iter().map(entry));
                        }
                        rm.add_cluster(&name, cell);
                    }
                }
                self.names.insert(id, name);
            }
            master_cf::INSTANCES => {
                let r: InstanceRecord = decode_value(cf, key, value)?;
                match self.names.get(&r.cluster_id).and_then(|n| rm.cluster_cell(n)) {
                    Some(cell) => cell.put_instance(entry(r)),
                    None => {
                        let waiting = self.orphans.entry(r.cluster_id).or_default();
                        waiting.retain(|w| w.id != r.id);
                        waiting.push(r);
                    }
                }
            }
            master_cf::NODES => {
                rm.register_node(decode_value::<NodeRecord>(cf, key, value)?);
            }
            master_cf::PACKAGES => {
                let r: PackageRecord = decode_value(cf, key, value)?;
                match ComponentSpec::parse(&r.spec_toml) {
                    Ok(spec) => rm.put_package(PackageView { record: Arc::new(r), spec: Arc::new(spec) }),
                    Err(e) => {
                        tracing::error!(package = %r.name, error = %e, "stored package spec does not parse; not shown")
                    }
                }
            }
            master_cf::OPERATIONS => rm.put_operation(&decode_value::<OperationRecord>(cf, key, value)?),
            master_cf::LEFTOVERS => rm.put_leftovers(&[decode_value::<LeftoverRecord>(cf, key, value)?]),
            master_cf::CORDONS => rm.put_cordon(decode_value::<CordonRecord>(cf, key, value)?),
            master_cf::TOKENS => {
                let r: TokenRecord = decode_value(cf, key, value)?;
                self.tokens.mirror(&r.id.clone(), Some(r));
            }
            master_cf::EVENTS => {
                if let Some(seq) = keys::event_seq(key) {
                    self.appended.push((seq, value.to_vec()));
                }
            }
            _ => {}
        }
        Ok(())
    }

    fn delete(&mut self, cf: &'static str, key: &[u8]) {
        self.changed(cf, key, None);
        let rm = &self.read_model;
        match cf {
            master_cf::CLUSTERS => {
                if let Some(id) = uuid_of(key).map(ClusterId) {
                    self.orphans.remove(&id);
                    if let Some(name) = self.names.remove(&id) {
                        rm.remove_cluster(&name);
                    }
                }
            }
            master_cf::INSTANCES => {
                let Some((cluster, id)) = instance_of(key) else { return };
                match self.names.get(&cluster).and_then(|n| rm.cluster_cell(n)) {
                    Some(cell) => cell.remove_instances(&[id]),
                    None => {
                        if let Some(waiting) = self.orphans.get_mut(&cluster) {
                            waiting.retain(|w| w.id != id);
                        }
                    }
                }
            }
            master_cf::NODES => rm.forget_node(&NodeId::new(text(key))),
            master_cf::PACKAGES => {
                if let Some((name, version)) = text(key).split_once('\0') {
                    rm.remove_package(name, version);
                }
            }
            master_cf::OPERATIONS => {
                if let Some(id) = uuid_of(key).map(OperationId) {
                    rm.forget_operation(&id);
                }
            }
            master_cf::LEFTOVERS => {
                rm.remove_leftover(&InstanceId::new(text(key)));
            }
            master_cf::CORDONS => rm.remove_cordon(&NodeId::new(text(key))),
            master_cf::TOKENS => self.tokens.mirror(&text(key), None),
            _ => {}
        }
    }
}

fn entry(record: InstanceRecord) -> InstanceEntry {
    InstanceEntry { record: Arc::new(record), stats: Arc::default() }
}

fn text(key: &[u8]) -> String {
    String::from_utf8_lossy(key).into_owned()
}

fn uuid_of(key: &[u8]) -> Option<uuid::Uuid> {
    uuid::Uuid::from_slice(key).ok()
}

/// An instance key: its cluster's id (16 bytes), then its own id.
fn instance_of(key: &[u8]) -> Option<(ClusterId, InstanceId)> {
    if key.len() <= 16 {
        return None;
    }
    let cluster = uuid_of(&key[..16])?;
    Some((ClusterId(cluster), InstanceId::new(std::str::from_utf8(&key[16..]).ok()?)))
}

impl Mirror {
    /// The store key of everything the view holds now, by column family.
    fn held_keys(&self) -> Vec<(&'static str, Vec<u8>)> {
        let rm = &self.read_model;
        let mut keys = Vec::new();
        for (id, name) in &self.names {
            keys.push((master_cf::CLUSTERS, keys::cluster_key(id)));
            if let Some(c) = rm.cluster(name) {
                keys.extend(c.instances.keys().map(|i| (master_cf::INSTANCES, keys::instance_key(id, i))));
            }
        }
        keys.extend(rm.nodes().keys().map(|n| (master_cf::NODES, n.as_str().as_bytes().to_vec())));
        keys.extend(rm.packages().keys().map(|(n, v)| (master_cf::PACKAGES, keys::package_key(n, v))));
        keys.extend(rm.running_operations().keys().map(|o| (master_cf::OPERATIONS, keys::operation_key(o))));
        keys.extend(rm.leftovers().keys().map(|i| (master_cf::LEFTOVERS, i.as_str().as_bytes().to_vec())));
        keys.extend(rm.cordons().keys().map(|n| (master_cf::CORDONS, n.as_str().as_bytes().to_vec())));
        keys.extend(self.tokens.list().iter().map(|t| (master_cf::TOKENS, t.id.as_bytes().to_vec())));
        keys
    }
}

impl Apply for Mirror {
    fn begin_load(&mut self) {
        // Instances waiting for their cluster come again if still stored,
        // and records it cannot read are found again.
        self.orphans.clear();
        self.unread.clear();
        self.unreadable.store(0, std::sync::atomic::Ordering::SeqCst);
        // Each key comes again with its revision (a key the read model no
        // longer lists, an orphan's or an old cluster's, would linger).
        self.revisions.lock().unwrap_or_else(|p| p.into_inner()).clear();
        self.loading = Some(HashSet::new());
    }

    fn apply(&mut self, change: Change) {
        match change {
            Change::Put { cf, key, value, revision } => {
                self.changed(cf, &key, Some(revision));
                let read = self.put(cf, &key, &value);
                self.readable(cf, &key, read.is_ok());
                if let Err(e) = read {
                    // One record this build cannot read must not stop the
                    // view; the leader logs the same record at its boot.
                    tracing::error!(cf, key = %hex::encode(&key), error = %e, "a follower cannot read a stored record; not shown");
                }
                if let Some(seen) = &mut self.loading {
                    seen.insert((cf, key));
                }
            }
            Change::Delete { cf, key } => {
                self.readable(cf, &key, true);
                self.delete(cf, &key);
            }
        }
    }

    fn end_load(&mut self) {
        let Some(seen) = self.loading.take() else { return };
        for (cf, key) in self.held_keys() {
            if !seen.contains(&(cf, key.clone())) {
                self.delete(cf, &key);
            }
        }
        // Events the load saw are old: the event stream reads those from the store.
        self.appended.clear();
    }

    fn flush(&mut self) {
        let appended = std::mem::take(&mut self.appended);
        if !appended.is_empty() {
            (self.announce)(appended);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::WriteOp;
    use crate::storage::testdata as td;

    fn token(id: &str) -> TokenRecord {
        TokenRecord {
            version: crate::storage::records::RECORD_VERSION,
            id: id.into(),
            name: id.into(),
            secret_sha256: [7; 32],
            created_at: time::OffsetDateTime::now_utc(),
            scope: crate::scope::Scope::Read,
        }
    }

    fn changes(ops: Vec<WriteOp>) -> Vec<Change> {
        ops.into_iter()
            .map(|op| match op {
                WriteOp::Put { cf, key, value } => Change::Put { cf, key, value, revision: 1 },
                WriteOp::Delete { cf, key } => Change::Delete { cf, key },
                other => panic!("not a point write: {other:?}"),
            })
            .collect()
    }

    #[test]
    fn the_view_follows_puts_and_deletes_in_any_order_and_announces_events_at_the_flush() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn crate::storage::MetaStore> =
            Arc::new(crate::storage::MasterStore::open(&dir.path().join("db")).unwrap());
        let rm = ReadModel::new(store.clone());
        let tokens = ApiTokens::load(store).unwrap();
        let announced = Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = announced.clone();
        let (unreadable, revisions) = (Unreadable::default(), Revisions::default());
        let mut m = Mirror::new(
            rm.clone(),
            tokens.clone(),
            Box::new(move |e| sink.lock().unwrap().push(e)),
            unreadable.clone(),
            revisions.clone(),
        );
        let c = td::cluster("web");
        let (i1, i2) = (td::instance(&c, 1), td::instance(&c, 2));
        // Instances first (another order than the leader wrote them in).
        for ch in changes(vec![WriteOp::put_instance(&i1).unwrap(), WriteOp::put_instance(&i2).unwrap()]) {
            m.apply(ch);
        }
        assert!(rm.cluster("web").is_none());
        for ch in changes(vec![WriteOp::put_cluster(&c).unwrap()]) {
            m.apply(ch);
        }
        assert_eq!(rm.cluster("web").unwrap().instances.len(), 2);
        // Each cluster and instance key with the revision it changed at.
        assert_eq!(revisions.lock().unwrap().len(), 3);
        let mut failed = i1.clone();
        failed.status = crate::storage::records::InstanceStatus::Failed;
        let event = crate::storage::records::EventRecord {
            seq: 7,
            ..crate::storage::events::event("instance.status", Some("web"), serde_json::json!({}))
        };
        let ops = vec![
            WriteOp::put_instance(&failed).unwrap(),
            WriteOp::delete_instance(&c.id, &i2.id),
            WriteOp::put_event(&event).unwrap(),
        ];
        for ch in changes(ops) {
            m.apply(ch);
        }
        assert!(announced.lock().unwrap().is_empty(), "events wait for the end of their group");
        m.flush();
        let web = rm.cluster("web").unwrap();
        assert_eq!(web.instances.len(), 1);
        assert_eq!(revisions.lock().unwrap().len(), 2, "a deleted instance's revision stays");
        assert_eq!(web.instances.get(&i1.id).unwrap().record.status, failed.status);
        assert_eq!(announced.lock().unwrap().len(), 1);
        assert_eq!(announced.lock().unwrap()[0][0].0, 7);
        let token = token("abc123");
        for ch in changes(vec![WriteOp::put_token(&token).unwrap()]) {
            m.apply(ch);
        }
        assert!(tokens.contains(&token.id));
        for ch in changes(vec![WriteOp::delete_token(&token.id), WriteOp::delete_cluster(&c.id)]) {
            m.apply(ch);
        }
        assert!(!tokens.contains(&token.id));
        assert!(rm.cluster("web").is_none());
        // A record this build cannot read is skipped, not fatal; a cluster
        // or instance one is counted (no master boots from this view)
        // until a readable value or a delete replaces it.
        m.apply(Change::Put {
            cf: master_cf::CLUSTERS,
            key: b"junk".to_vec(),
            value: b"not a record".to_vec(),
            revision: 1,
        });
        m.apply(Change::Put { cf: master_cf::NODES, key: b"n1".to_vec(), value: vec![0xff; 3], revision: 1 });
        assert!(rm.clusters().is_empty() && rm.nodes().is_empty());
        assert_eq!(unreadable.load(std::sync::atomic::Ordering::SeqCst), 1);
        m.apply(Change::Delete { cf: master_cf::CLUSTERS, key: b"junk".to_vec() });
        assert_eq!(unreadable.load(std::sync::atomic::Ordering::SeqCst), 0);
        let key = crate::storage::keys::instance_key(&c.id, &i1.id);
        m.apply(Change::Put { cf: master_cf::INSTANCES, key: key.clone(), value: vec![0xff; 3], revision: 1 });
        assert_eq!(unreadable.load(std::sync::atomic::Ordering::SeqCst), 1);
        for ch in changes(vec![WriteOp::put_instance(&i1).unwrap()]) {
            m.apply(ch);
        }
        assert_eq!(unreadable.load(std::sync::atomic::Ordering::SeqCst), 0);
    }

    #[test]
    fn a_load_keeps_the_view_whole_and_drops_only_what_it_did_not_find_again() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn crate::storage::MetaStore> =
            Arc::new(crate::storage::MasterStore::open(&dir.path().join("db")).unwrap());
        let rm = ReadModel::new(store.clone());
        let tokens = ApiTokens::load(store).unwrap();
        let mut m =
            Mirror::new(rm.clone(), tokens.clone(), Box::new(|_| {}), Unreadable::default(), Revisions::default());
        let (kept, gone, old_re) = (td::cluster("kept"), td::cluster("gone"), td::cluster("re"));
        let mut new_re = td::cluster("re");
        new_re.id = ClusterId::random();
        let first = vec![
            WriteOp::put_cluster(&kept).unwrap(),
            WriteOp::put_instance(&td::instance(&kept, 1)).unwrap(),
            WriteOp::put_instance(&td::instance(&kept, 2)).unwrap(),
            WriteOp::put_cluster(&gone).unwrap(),
            WriteOp::put_instance(&td::instance(&gone, 1)).unwrap(),
            WriteOp::put_cluster(&old_re).unwrap(),
            WriteOp::put_token(&token("t1")).unwrap(),
            WriteOp::put_token(&token("t2")).unwrap(),
        ];
        m.begin_load();
        for ch in changes(first) {
            m.apply(ch);
        }
        m.end_load();
        assert_eq!(rm.clusters().len(), 3);
        // A second load (after a compaction) finds less: while it runs,
        // readers still see the whole first view.
        m.begin_load();
        for ch in changes(vec![
            WriteOp::put_cluster(&kept).unwrap(),
            WriteOp::put_instance(&td::instance(&kept, 2)).unwrap(),
            // Deleted and made again under its name between the two loads.
            WriteOp::put_cluster(&new_re).unwrap(),
            WriteOp::put_token(&token("t2")).unwrap(),
        ]) {
            m.apply(ch);
        }
        assert_eq!(rm.clusters().len(), 3, "the view emptied during a load");
        assert!(tokens.contains("t1"), "a token refused during a load");
        m.end_load();
        assert!(rm.cluster("gone").is_none());
        assert_eq!(rm.cluster("re").map(|c| c.record.id), Some(new_re.id), "the cluster made again is shown");
        let kept_now = rm.cluster("kept").unwrap();
        assert_eq!(kept_now.instances.len(), 1);
        assert!(kept_now.instances.contains_key(&td::instance(&kept, 2).id));
        assert!(!tokens.contains("t1") && tokens.contains("t2"));
    }
}
