//! Micro-benchmarks of the master's hot paths: the storage writer's group
//! commit (every API mutation waits for one synced batch) and the wire codec
//! (every package byte crosses it), a template render with and without the
//! memory budget, and the metered allocator. Run with `cargo bench --bench hot_paths`;
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
        term: 0,
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

/// A zoo.cfg of `members` members, as `examples/components/zookeeper`
/// writes it, and the context of member 1.
fn zoo(members: u32) -> (flotilla::spec::ComponentSpec, minijinja::Value) {
    use flotilla::spec::render::*;
    use std::collections::BTreeMap;
    let text =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/components/zookeeper/component.toml"))
            .unwrap();
    let spec = flotilla::spec::ComponentSpec::parse(&text).unwrap();
    let ports = |o: u32| {
        BTreeMap::from([
            ("client".into(), 20000 + o as u16),
            ("peer".into(), 30000 + o as u16),
            ("election".into(), 40000 + o as u16),
        ])
    };
    let member = |o: u32| MemberCtx {
        id: format!("zk-server-{o}-abcdef"),
        ordinal: o,
        host: format!("10.0.{}.{}", o / 250, o % 250),
        node: format!("node-{o}"),
        ports: ports(o),
    };
    let ctx = RenderContext {
        component: ComponentCtx { name: "zookeeper".into(), version: "3.8.0".into() },
        cluster: ClusterCtx {
            name: "zk".into(),
            id: "id".into(),
            config: BTreeMap::from([
                ("tick_time".into(), serde_json::json!(2000)),
                ("init_limit".into(), serde_json::json!(10)),
                ("sync_limit".into(), serde_json::json!(5)),
            ]),
            roles: BTreeMap::from([(
                "server".into(),
                RoleCtx { count: members, members: (1..=members).map(member).collect() },
            )]),
        },
        instance: InstanceCtx {
            id: "zk-server-1-abcdef".into(),
            ordinal: 1,
            role: "server".into(),
            host: "10.0.0.1".into(),
            node: "node-1".into(),
            ports: ports(1),
            dir: "/i".into(),
            data_dir: "/i/data".into(),
        },
    };
    (spec, ctx.to_value())
}

/// One zoo.cfg render with the memory budget (the renderer as the master
/// runs it) and with plain minijinja as before (the same template, the
/// same settings, its own filters): their ratio is the budget's cost.
fn render(c: &mut Criterion) {
    for members in [3, 1000] {
        let (spec, ctx) = zoo(members);
        let role = &spec.roles[0];
        let mut env = minijinja::Environment::new();
        env.set_fuel(Some(flotilla::spec::render::RENDER_FUEL));
        env.set_undefined_behavior(minijinja::UndefinedBehavior::Strict);
        env.set_debug(true);
        for (i, f) in role.files.iter().enumerate() {
            env.add_template_owned(format!("f{i}"), f.template.clone()).unwrap();
        }
        let mut g = c.benchmark_group(format!("zoo_cfg_{members}_members"));
        g.bench_function("budgeted", |b| b.iter(|| spec.templates.render_files(role, &ctx).unwrap()));
        g.bench_function("plain_minijinja", |b| {
            b.iter(|| {
                (0..role.files.len())
                    .map(|i| env.get_template(&format!("f{i}")).unwrap().render(&ctx).unwrap())
                    .collect::<Vec<_>>()
            })
        });
        g.finish();
    }
}

/// What the metered global allocator costs when no meter runs: a 64-byte
/// allocation and free through it (`std::alloc`) and through mimalloc
/// directly.
#[allow(unsafe_code)]
fn allocator(c: &mut Criterion) {
    use std::alloc::{GlobalAlloc, Layout};
    let layout = Layout::from_size_align(64, 8).unwrap();
    let mut g = c.benchmark_group("alloc_free_64");
    g.bench_function("metered_off", |b| {
        // SAFETY: a non-zero-size layout, freed once with the same layout.
        b.iter(|| unsafe {
            let p = std::alloc::alloc(std::hint::black_box(layout));
            std::alloc::dealloc(std::hint::black_box(p), layout);
        })
    });
    g.bench_function("metered_on", |b| {
        flotilla::alloc_meter::measure(|| {
            // SAFETY: a non-zero-size layout, freed once with the same layout.
            b.iter(|| unsafe {
                let p = std::alloc::alloc(std::hint::black_box(layout));
                std::alloc::dealloc(std::hint::black_box(p), layout);
            })
        });
    });
    g.bench_function("mimalloc_direct", |b| {
        // SAFETY: a non-zero-size layout, freed once with the same layout.
        b.iter(|| unsafe {
            let p = mimalloc::MiMalloc.alloc(std::hint::black_box(layout));
            mimalloc::MiMalloc.dealloc(std::hint::black_box(p), layout);
        })
    });
    g.finish();
}

criterion_group!(benches, storage, codec, render, allocator);
criterion_main!(benches);
