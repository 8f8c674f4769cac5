//! The group-commit writer over RocksDB: grouping, atomicity per request,
//! the queue bound, the change feed.

use super::*;
use crate::storage::db;

const CFS: [&str; 2] = ["data", "meta"];

fn open(dir: &std::path::Path) -> (Arc<DB>, StoreWriter) {
    let db = db::open(dir, &CFS, "meta").unwrap();
    let writer = StoreWriter::start(db.clone(), DEFAULT_QUEUE).unwrap();
    (db, writer)
}

fn put(key: &str) -> WriteOp {
    WriteOp::Put { cf: "data", key: key.as_bytes().to_vec(), value: key.as_bytes().to_vec() }
}

fn get(db: &DB, key: &str) -> Option<Vec<u8>> {
    db.get_cf(db.cf_handle("data").unwrap(), key).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_commits_are_grouped_into_fewer_batches() {
    let dir = tempfile::tempdir().unwrap();
    let (db, writer) = open(dir.path());
    let n = 200;
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let w = writer.clone();
            tokio::spawn(async move { w.commit(vec![put(&format!("k{i}")), put(&format!("j{i}"))]).await })
        })
        .collect();
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    for i in 0..n {
        assert_eq!(get(&db, &format!("k{i}")).as_deref(), Some(format!("k{i}").as_bytes()));
        assert!(get(&db, &format!("j{i}")).is_some());
    }
    assert_eq!(writer.commits_written(), n);
    let batches = writer.batches_written();
    assert!(batches >= 1 && batches < n, "{batches} batches for {n} commits");
}

#[tokio::test]
async fn deletes_apply_and_empty_commits_succeed() {
    let dir = tempfile::tempdir().unwrap();
    let (db, writer) = open(dir.path());
    writer.commit(vec![put("a"), put("b")]).await.unwrap();
    writer.commit(vec![WriteOp::Delete { cf: "data", key: b"a".to_vec() }]).await.unwrap();
    writer.commit(Vec::new()).await.unwrap();
    assert_eq!(get(&db, "a"), None);
    assert!(get(&db, "b").is_some());
    assert_eq!(writer.commits_written(), 2);
}

#[tokio::test]
async fn a_failed_batch_reports_the_error_to_every_caller() {
    let dir = tempfile::tempdir().unwrap();
    drop(open(dir.path()));
    // A read-only database refuses every write: a real RocksDB failure.
    let ro = DB::open_cf_for_read_only(&rocksdb::Options::default(), dir.path(), CFS, false).unwrap();
    let writer = StoreWriter::start(Arc::new(ro), DEFAULT_QUEUE).unwrap();
    let results = futures::future::join_all((0..20).map(|i| writer.commit(vec![put(&format!("k{i}"))]))).await;
    for r in results {
        assert!(matches!(r, Err(StorageError::Rocks(_))), "{r:?}");
    }
    assert_eq!(writer.batches_written(), 0);
    assert_eq!(writer.commits_written(), 0);
}

#[tokio::test]
async fn a_request_with_an_unknown_column_family_fails_alone_and_whole() {
    let dir = tempfile::tempdir().unwrap();
    let (db, writer) = open(dir.path());
    let bad = vec![put("half"), WriteOp::Put { cf: "nope", key: b"k".to_vec(), value: b"v".to_vec() }];
    let (bad, good) = tokio::join!(writer.commit(bad), writer.commit(vec![put("good")]));
    assert!(matches!(bad, Err(StorageError::UnknownColumnFamily { cf: "nope" })), "{bad:?}");
    good.unwrap();
    assert_eq!(get(&db, "half"), None, "a failed request must not be partly applied");
    assert!(get(&db, "good").is_some());
}

#[test]
fn commit_blocking_works_off_the_runtime_and_drop_releases_the_db() {
    let dir = tempfile::tempdir().unwrap();
    let (db, writer) = open(dir.path());
    writer.commit_blocking(vec![put("x")]).unwrap();
    drop(db);
    drop(writer);
    // The writer thread held the last handle; the lock must be free now.
    let (db, _writer) = open(dir.path());
    assert!(get(&db, "x").is_some());
}

#[tokio::test]
async fn a_full_queue_refuses_try_commit_and_loses_nothing_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let db = db::open(dir.path(), &CFS, "meta").unwrap();
    let writer = StoreWriter::start(db.clone(), 1).unwrap();
    // Many at once against a queue of one: some are refused, none of
    // the accepted ones is lost.
    let results = futures::future::join_all((0..200).map(|i| {
        let w = writer.clone();
        async move { (i, w.try_commit(vec![put(&format!("k{i}"))]).await) }
    }))
    .await;
    let refused = results.iter().filter(|(_, r)| matches!(r, Err(StorageError::Overloaded))).count();
    assert!(refused > 0, "a queue of one took 200 concurrent requests");
    for (i, r) in &results {
        match r {
            Ok(()) => assert!(get(&db, &format!("k{i}")).is_some(), "acknowledged k{i} is missing"),
            Err(StorageError::Overloaded) => {
                assert!(get(&db, &format!("k{i}")).is_none(), "refused k{i} was written")
            }
            Err(e) => panic!("{e}"),
        }
    }
    // `commit` waits for room instead.
    let all = futures::future::join_all((0..50).map(|i| writer.commit(vec![put(&format!("w{i}"))]))).await;
    assert!(all.iter().all(|r| r.is_ok()));
}

#[tokio::test]
async fn the_change_feed_announces_durable_batches_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let (_db, writer) = open(dir.path());
    writer.commit(vec![put("before")]).await.unwrap();
    let mut feed = writer.subscribe();
    writer.commit(vec![put("a")]).await.unwrap();
    writer.commit(vec![WriteOp::DeleteRange { cf: "data", from: b"a".to_vec(), to: b"b".to_vec() }]).await.unwrap();
    let first = feed.recv().await.unwrap();
    let second = feed.recv().await.unwrap();
    assert_eq!(first.ops, vec![put("a")]);
    assert!(second.seq > first.seq);
    assert!(matches!(second.ops[0], WriteOp::DeleteRange { .. }));
}

#[tokio::test]
async fn delete_range_removes_exactly_the_range() {
    let dir = tempfile::tempdir().unwrap();
    let (db, writer) = open(dir.path());
    writer.commit(vec![put("a1"), put("a2"), put("b1")]).await.unwrap();
    writer.commit(vec![WriteOp::DeleteRange { cf: "data", from: b"a".to_vec(), to: b"b".to_vec() }]).await.unwrap();
    assert_eq!(get(&db, "a1"), None);
    assert_eq!(get(&db, "a2"), None);
    assert!(get(&db, "b1").is_some());
}
