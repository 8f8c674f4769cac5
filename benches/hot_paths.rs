//! Micro-benchmarks of the master's hot paths: the storage writer's group
//! commit (every API mutation waits for one synced batch) and the wire codec
//! (every package byte crosses it). Run with `cargo bench --bench hot_paths`;
//! figures go in BENCHMARKS.md.

use bytes::BytesMut;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use flotilla::ids::{ClusterId, InstanceId, NodeId};
use flotilla::protocol::codec::{AgentCodec, MasterCodec};
use flotilla::protocol::messages::{AgentRequest, MasterFrame};
use flotilla::storage::records::{DesiredState, InstanceRecord, InstanceStatus, RECORD_VERSION};
use flotilla::storage::{MasterStore, WriteOp};
use tokio_util::codec::{Decoder, Encoder};

fn instance(n: u32) -> InstanceRecord {
    let cluster_id = ClusterId::random();
    InstanceRecord {
        version: RECORD_VERSION,
        id: InstanceId::generate("bench", &cluster_id, "server", n),
        cluster_id,
        cluster: "bench".into(),
        role: "server".into(),
        ordinal: n,
        node: NodeId::new("node-1"),
        host: "127.0.0.11".into(),
        ports: [("client".to_string(), 20000u16)].into_iter().collect(),
        status: InstanceStatus::Running,
        desired: DesiredState::Running,
        pid: Some(4242),
        generation: 7,
        dir: "/var/lib/flotilla/instances/x".into(),
        last_error: None,
        applied: None,
        pending_restart: flotilla::storage::records::PendingRestart::No,
    }
}

fn storage(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = MasterStore::open(dir.path()).expect("open");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let mut g = c.benchmark_group("storage_commit");
    g.sample_size(10);
    for concurrent in [1usize, 64] {
        g.throughput(Throughput::Elements(concurrent as u64));
        g.bench_function(format!("{concurrent}_concurrent_synced_commits"), |b| {
            b.iter(|| {
                rt.block_on(async {
                    let mut tasks = Vec::with_capacity(concurrent);
                    for i in 0..concurrent {
                        let w = store.writer().clone();
                        let op = WriteOp::put_instance(&instance(i as u32)).expect("encode");
                        tasks.push(tokio::spawn(async move { w.commit(vec![op]).await }));
                    }
                    for t in tasks {
                        t.await.expect("join").expect("commit");
                    }
                })
            })
        });
    }
    g.finish();
}

fn codec(c: &mut Criterion) {
    let frame = MasterFrame::Request {
        request_id: 1,
        body: AgentRequest::InstallData {
            instance: InstanceId::new("bench-server-1-abcdef"),
            seq: 0,
            bytes: vec![7u8; 1024 * 1024],
        },
    };
    let mut g = c.benchmark_group("codec");
    g.throughput(Throughput::Bytes(1024 * 1024));
    g.bench_function("install_chunk_1MiB_encode_decode", |b| {
        let mut enc = MasterCodec::default();
        let mut dec = AgentCodec::default();
        let mut buf = BytesMut::with_capacity(2 * 1024 * 1024);
        b.iter(|| {
            enc.encode(frame.clone(), &mut buf).expect("encode");
            let out = dec.decode(&mut buf).expect("decode").expect("a frame");
            assert!(matches!(out, MasterFrame::Request { .. }));
        })
    });
    g.finish();
}

criterion_group!(benches, storage, codec);
criterion_main!(benches);
