//! The master's store on real etcd members: it means what the RocksDB store
//! means (the same commits give the same reads, scan by scan), a request
//! too large for one etcd transaction lands whole (and a leader that died
//! half way is finished by the next; a follower never loads half of it),
//! and a deposed leader cannot write.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flotilla::storage::etcd::conn::{Conn, Fence};
use flotilla::storage::etcd::election::{self, Campaign, LeaderInfo};
use flotilla::storage::etcd::layout::Layout;
use flotilla::storage::etcd::members::Members;
use flotilla::storage::etcd::txn::EtcdWrite;
use flotilla::storage::etcd::watch::{self, Apply, Change, Progress};
use flotilla::storage::etcd::{self, EtcdSettings, EtcdStore, Fenced, sink};
use flotilla::storage::keys::master_cf;
use flotilla::storage::meta::{MetaStore, Scan};
use flotilla::storage::{MasterStore, StorageError, WriteOp};

use crate::common::etcd::EtcdCluster;

fn settings(c: &EtcdCluster, prefix: &str) -> EtcdSettings {
    EtcdSettings { endpoints: c.endpoints.clone(), prefix: prefix.into(), ..EtcdSettings::default() }
}

fn open(c: &EtcdCluster, prefix: &str, fence: Option<Fenced>) -> EtcdStore {
    let s = settings(c, prefix);
    let (bridge, members) = etcd::connect(&s).expect("connect to etcd");
    EtcdStore::open_default(bridge, members, &s, fence).expect("open the store on etcd")
}

/// A small deterministic generator (xorshift), so a failure replays.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

const CFS: [&str; 3] = [master_cf::CLUSTERS, master_cf::CLUSTER_OPS, master_cf::LEFTOVERS];

fn key(r: &mut Rng) -> Vec<u8> {
    // Few keys, so writes collide within a round; bytes 0x00 and 0xff
    // included, so order is checked at its edges.
    let first = [b'a', b'b', 0x00, 0xff][r.below(4) as usize];
    vec![first, r.below(6) as u8]
}

fn random_request(r: &mut Rng) -> Vec<WriteOp> {
    (0..1 + r.below(4))
        .map(|_| {
            let cf = CFS[r.below(3) as usize];
            match r.below(10) {
                0 => {
                    let (a, b) = (key(r), key(r));
                    let (from, to) = if a <= b { (a, b) } else { (b, a) };
                    WriteOp::DeleteRange { cf, from, to }
                }
                1 | 2 => WriteOp::Delete { cf, key: key(r) },
                3 => WriteOp::Append { cf: master_cf::EVENTS, value: r.next().to_be_bytes().to_vec() },
                _ => WriteOp::Put { cf, key: key(r), value: r.next().to_be_bytes().to_vec() },
            }
        })
        .collect()
}

fn scans(r: &mut Rng) -> Vec<(Scan, usize)> {
    let mut out = vec![(Scan::default(), usize::MAX), (Scan { reverse: true, ..Scan::default() }, usize::MAX)];
    for _ in 0..6 {
        let k = key(r);
        out.push((Scan { prefix: k[..1].to_vec(), from: None, reverse: r.below(2) == 0 }, 1 + r.below(4) as usize));
        out.push((Scan { prefix: k[..1].to_vec(), from: Some(k.clone()), reverse: r.below(2) == 0 }, usize::MAX));
    }
    out
}

#[test]
fn the_same_commits_read_the_same_on_etcd_as_on_rocksdb() {
    same_as_rocksdb(None);
}

/// With 4 ops per transaction a round is several transactions, sent
/// together: they must land in order (the few keys collide across them).
#[test]
fn a_round_in_many_transactions_sent_at_once_lands_in_order() {
    let early = same_as_rocksdb(Some(4));
    eprintln!("transactions sent again because etcd evaluated them before their predecessor: {early}");
}

/// Commits the same random rounds on etcd and on RocksDB, comparing every
/// scan after each; how many transactions were sent again.
fn same_as_rocksdb(max_txn_ops: Option<usize>) -> u64 {
    let cluster = EtcdCluster::start(3);
    let mut s = settings(&cluster, "/diff/");
    if let Some(n) = max_txn_ops {
        s.max_txn_ops = n;
    }
    let (bridge, members) = etcd::connect(&s).expect("connect to etcd");
    let etcd_store = EtcdStore::open_default(bridge, members, &s, None).expect("open the store on etcd");
    let dir = tempfile::tempdir().unwrap();
    let rocks = MasterStore::open(dir.path()).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let mut r = Rng(0x9e37_79b9_7f4a_7c15);
    for round in 0..60 {
        // Several requests queued at once ride in one group-commit round
        // (queued in order: the same order on both stores).
        let requests: Vec<Vec<WriteOp>> = (0..1 + r.below(12)).map(|_| random_request(&mut r)).collect();
        for req in &requests {
            rt.block_on(rocks.commit(req.clone())).unwrap();
        }
        let results = rt.block_on(futures::future::join_all(requests.iter().map(|q| etcd_store.commit(q.clone()))));
        for res in results {
            res.unwrap_or_else(|e| panic!("round {round}: {e}\n{}", cluster.logs()));
        }
        for cf in CFS.iter().chain([&master_cf::EVENTS]) {
            for (scan, limit) in scans(&mut r) {
                let want = rocks.scan(cf, &scan, limit).unwrap();
                let got = etcd_store.scan(cf, &scan, limit).unwrap();
                assert_eq!(got, want, "round {round}, {cf}, {scan:?} limit {limit}");
            }
            // Point reads asked together: every key some request wrote
            // (some deleted since) and one never written, in that order.
            let mut keys: Vec<Vec<u8>> = (0..1 + r.below(80)).map(|_| key(&mut r)).collect();
            keys.push(b"never-written".to_vec());
            let want: Vec<_> = keys.iter().map(|k| rocks.get(cf, k).unwrap()).collect();
            assert_eq!(etcd_store.get_many(cf, &keys).unwrap(), want, "round {round}, {cf}: get_many");
        }
    }
    // Appends got the same numbers, so the event logs are equal too.
    let events = |s: &dyn MetaStore| s.scan(master_cf::EVENTS, &Scan::default(), usize::MAX).unwrap();
    assert!(!events(&rocks).is_empty());
    assert_eq!(events(&etcd_store), events(&rocks));
    // Group commit coalesced rounds into fewer transactions than commits.
    let stats = etcd_store.stats();
    assert!(stats.batches < stats.commits, "{stats:?}");
    etcd_store.sent_again()
}

#[test]
fn a_request_larger_than_a_transaction_lands_whole_and_leaves_no_redo_record() {
    let cluster = EtcdCluster::start(3);
    let store = open(&cluster, "/big/", None);
    let rt = tokio::runtime::Runtime::new().unwrap();
    // 1,000 puts of 2 KiB: 8 times etcd's ops per transaction, past its
    // request size too.
    let ops: Vec<WriteOp> = (0..1000u32)
        .map(|i| WriteOp::Put { cf: master_cf::CLUSTERS, key: i.to_be_bytes().to_vec(), value: vec![i as u8; 2048] })
        .collect();
    let mut feed = store.subscribe();
    rt.block_on(store.commit(ops)).expect("the big request");
    let all = store.scan(master_cf::CLUSTERS, &Scan::default(), usize::MAX).unwrap();
    assert_eq!(all.len(), 1000);
    assert!(all.iter().enumerate().all(|(i, (k, v))| *k == (i as u32).to_be_bytes() && v[0] == i as u8));
    // Announced as one batch.
    let batch = feed.try_recv().expect("the batch on the change feed");
    assert_eq!(batch.ops.len(), 1000);
    assert_eq!(cluster.ctl(&["get", "--prefix", "--keys-only", "/big/_redo"]).trim(), "", "the redo record is gone");
}

/// The redo record a leader leaves when it dies between committing a large
/// request and applying it.
fn leave_redo_record(cluster: &EtcdCluster, prefix: &str, writes: &[EtcdWrite], with_head: bool) {
    let record = sink::encode(writes);
    let layout = Layout::new(prefix);
    let mut puts = vec![
        (layout.redo_chunk(0), record[..record.len() / 2].to_vec()),
        (layout.redo_chunk(1), record[record.len() / 2..].to_vec()),
    ];
    if with_head {
        puts.push((layout.redo_head(), sink::head_bytes(&record, 2)));
    }
    raw_puts(cluster, prefix, puts);
}

/// Puts `puts` (etcd keys) one by one, as plain etcd puts.
fn raw_puts(cluster: &EtcdCluster, prefix: &str, puts: Vec<(Vec<u8>, Vec<u8>)>) {
    let (bridge, members) = etcd::connect(&settings(cluster, prefix)).unwrap();
    let mut kv = members.pick().1.kv_client();
    bridge
        .call("test puts", Duration::from_secs(10), async move {
            for (k, v) in puts {
                kv.put(k, v, None).await.map_err(|e| StorageError::Etcd(e.to_string()))?;
            }
            Ok(())
        })
        .unwrap();
}

/// A follower's view of one column family's keys.
struct Keys(Arc<Mutex<BTreeSet<Vec<u8>>>>, &'static str);

impl Apply for Keys {
    fn begin_load(&mut self) {}
    fn apply(&mut self, change: Change) {
        let mut keys = self.0.lock().unwrap();
        match change {
            Change::Put { cf, key, .. } if cf == self.1 => keys.insert(key),
            Change::Delete { cf, key } if cf == self.1 => keys.remove(&key),
            _ => false,
        };
    }
    fn end_load(&mut self) {}
    fn flush(&mut self) {}
}

/// A leader died half way through applying a committed redo record: a
/// follower that loads the store then must not show the half that landed
/// (its view would serve half a request); it loads once the next leader
/// has finished the record, and then shows all of it.
#[test]
fn a_follower_never_loads_a_request_half_applied() {
    let cluster = EtcdCluster::start(3);
    let prefix = "/halfway/";
    let layout = Layout::new(prefix);
    let key = |i: u32| layout.key(master_cf::NODES, &i.to_be_bytes());
    let writes: Vec<EtcdWrite> = (0..300u32).map(|i| EtcdWrite::Put(key(i), vec![1; 100])).collect();
    leave_redo_record(&cluster, prefix, &writes, true);
    raw_puts(&cluster, prefix, (0..150u32).map(|i| (key(i), vec![1; 100])).collect());

    let s = settings(&cluster, prefix);
    let (bridge, members) = etcd::connect(&s).unwrap();
    let conn = Conn::new(bridge, members, layout.clone(), s.limits(), s.call_limit());
    let (view, progress, stop) =
        (Arc::new(Mutex::default()), Arc::new(Progress::default()), Arc::new(AtomicBool::new(false)));
    let follower = {
        let (view, progress, stop) = (view.clone(), progress.clone(), stop.clone());
        std::thread::spawn(move || {
            watch::follow(&conn, &[master_cf::NODES], &mut Keys(view, master_cf::NODES), &progress, &stop)
        })
    };
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(progress.applied_revision(), 0, "the view counts as loaded with a request half applied");
    assert_eq!(view.lock().unwrap().len(), 0, "the view shows half a request");

    // The next leader finishes the record as its store opens.
    let store = open(&cluster, prefix, None);
    assert_eq!(store.scan(master_cf::NODES, &Scan::default(), usize::MAX).unwrap().len(), 300);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while progress.applied_revision() == 0 || view.lock().unwrap().len() < 300 {
        assert!(std::time::Instant::now() < deadline, "the follower did not load the finished request");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(view.lock().unwrap().len(), 300);
    stop.store(true, Ordering::SeqCst);
    follower.join().unwrap();
}

#[test]
fn the_next_leader_finishes_a_committed_redo_record_and_drops_an_uncommitted_one() {
    let cluster = EtcdCluster::start(3);
    let layout = Layout::new("/redo/");
    let writes: Vec<EtcdWrite> =
        (0..300u32).map(|i| EtcdWrite::Put(layout.key(master_cf::NODES, &i.to_be_bytes()), vec![1; 100])).collect();
    leave_redo_record(&cluster, "/redo/", &writes, true);
    let store = open(&cluster, "/redo/", None);
    assert_eq!(store.scan(master_cf::NODES, &Scan::default(), usize::MAX).unwrap().len(), 300, "committed: applied");
    assert_eq!(cluster.ctl(&["get", "--prefix", "--keys-only", "/redo/_redo"]).trim(), "");
    drop(store);

    let layout = Layout::new("/half/");
    let writes: Vec<EtcdWrite> =
        (0..300u32).map(|i| EtcdWrite::Put(layout.key(master_cf::NODES, &i.to_be_bytes()), vec![1; 100])).collect();
    leave_redo_record(&cluster, "/half/", &writes, false);
    let store = open(&cluster, "/half/", None);
    assert!(
        store.scan(master_cf::NODES, &Scan::default(), usize::MAX).unwrap().is_empty(),
        "not committed: nothing applied"
    );
    assert_eq!(cluster.ctl(&["get", "--prefix", "--keys-only", "/half/_redo"]).trim(), "", "its chunks are deleted");
}

fn campaign(cluster: &EtcdCluster, prefix: &str, name: &str) -> (Campaign, etcd::bridge::Bridge, Members) {
    let s = settings(cluster, prefix);
    let (bridge, client) = etcd::connect(&s).unwrap();
    let c = Campaign {
        endpoints: s.endpoints.clone(),
        options: Some(s.connect_options().unwrap()),
        layout: Layout::new(prefix),
        ttl: 2,
        info: LeaderInfo { name: name.into(), api_url: format!("http://{name}"), pid: 1, lease: 0 },
        timeout: Duration::from_secs(5),
        revoke_dead_leader: false,
    };
    (c, bridge, client)
}

#[test]
fn a_deposed_leader_cannot_write_and_the_next_one_has_a_higher_term() {
    let cluster = EtcdCluster::start(3);
    let (ca, bridge_a, client_a) = campaign(&cluster, "/fence/", "a");
    let a = election::campaign(&bridge_a, &client_a, &ca, |_| {}).expect("a leads");
    assert!(a.is_valid());
    let a = std::sync::Arc::new(a);
    let told = std::sync::Arc::new(std::sync::Mutex::new(None::<String>));
    let hook = told.clone();
    let fence = Fenced {
        fence: Fence { key: Layout::new("/fence/").leader(), term: a.term },
        on_deposed: std::sync::Arc::new(move |why| *hook.lock().unwrap() = Some(why)),
    };
    let store_a =
        EtcdStore::open_default(bridge_a.clone(), client_a.clone(), &settings(&cluster, "/fence/"), Some(fence))
            .unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let put = |v: u8| vec![WriteOp::Put { cf: master_cf::CLUSTERS, key: b"k".to_vec(), value: vec![v] }];
    rt.block_on(store_a.commit(put(1))).expect("the leader writes");

    // b waits while a leads.
    let (cb, bridge_b, client_b) = campaign(&cluster, "/fence/", "b");
    let (tx, rx) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let mut seen = None;
        let l = election::campaign(&bridge_b, &client_b, &cb, |leader| {
            if seen.is_none() {
                seen = leader.and_then(|l| l.info.as_ref()).map(|i| i.name.clone());
                let _ = tx.send(seen.clone());
            }
        });
        (l, seen)
    });
    assert_eq!(rx.recv_timeout(Duration::from_secs(10)).unwrap().as_deref(), Some("a"), "b saw a leading");

    // a's lease is revoked (an operator, or a follower that saw a die).
    cluster.ctl(&["lease", "revoke", &format!("{:x}", a.lease)]);
    let (b, _) = waiter.join().unwrap();
    let b = b.expect("b leads once a's key is gone");
    assert!(b.term > a.term, "terms grow: a {} b {}", a.term, b.term);

    // a's next write is refused by the fence, and says why.
    match rt.block_on(store_a.commit(put(2))) {
        Err(StorageError::Deposed { term }) => assert_eq!(term, a.term),
        other => panic!("a deposed leader's write: {other:?}"),
    }
    assert!(told.lock().unwrap().as_deref().is_some_and(|w| w.contains("fence")), "{told:?}");
    // Its lease thread learns it too, and a stops acting.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while a.lost().borrow().is_none() {
        assert!(std::time::Instant::now() < deadline, "a never learnt its lease is gone");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!a.is_valid());
    assert_eq!(store_a.get(master_cf::CLUSTERS, b"k").unwrap(), Some(vec![1]), "the refused write left nothing");
}
