//! Tests of [`super::node_link::NodeLink`]'s install streaming, the test
//! playing the agent on the other end of the link's frame queue.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use tokio::sync::mpsc;

use super::node_link::{CHUNK_BUDGET, NodeError, NodeLink, Outgoing, lock};
use crate::ids::{InstanceId, NodeId};
use crate::protocol::messages::{
    AgentRequest, AgentResponse, CommandFailure, FailureKind, INSTALL_CHUNK_BYTES, InstallBegin, MasterFrame,
    ProcessSpec,
};

/// Answers request `request_id` as the node manager does with a reply read
/// from the socket.
fn answer(link: &NodeLink, request_id: u64, body: AgentResponse) {
    let tx = lock(&link.pending).get(&request_id).cloned().expect("a request waiting for its answer");
    tx.unbounded_send(body).unwrap();
}

/// After the agent fails an install mid-stream (a broken package, a full
/// disk), the master stops sending chunks and reports that failure; it used
/// to send every remaining chunk first.
#[tokio::test]
async fn an_install_the_agent_failed_mid_stream_sends_no_more_chunks() {
    const CHUNKS: usize = 12;
    let dir = tempfile::tempdir().unwrap();
    let blob = dir.path().join("pkg.tar.gz");
    std::fs::write(&blob, vec![7u8; CHUNKS * INSTALL_CHUNK_BYTES]).unwrap();
    // One frame queued at a time: the test sees each as it is sent.
    let (tx, mut frames) = mpsc::channel::<Outgoing>(1);
    let chunks = Arc::new(tokio::sync::Semaphore::new(CHUNK_BUDGET));
    let link = NodeLink::new(NodeId::new("n1"), 1, tx, chunks, Duration::from_secs(5), Duration::from_secs(5));
    let begin = InstallBegin {
        instance: InstanceId::new("i1"),
        cluster: crate::ids::ClusterId(uuid::Uuid::nil()),
        generation: 1,
        run_as: None,
        process: ProcessSpec {
            start: vec!["bin/start".into()],
            stop: None,
            pidfile: None,
            stop_grace_ms: 1000,
            start_timeout_ms: 1000,
            env: vec![],
            health: None,
            limits: None,
        },
        files: vec![],
        package_sha256: "00".repeat(32),
        package_size: (CHUNKS * INSTALL_CHUNK_BYTES) as u64,
    };
    let progress = AtomicU64::new(0);
    let install = link.install(begin, blob, &progress);
    let data = std::cell::Cell::new(0);
    let agent = async {
        while let Some((frame, _permit)) = frames.recv().await {
            let MasterFrame::Request { request_id, body, .. } = frame else { continue };
            match body {
                AgentRequest::InstallBegin(_) => {
                    answer(&link, request_id, AgentResponse::InstallReady { need_bytes: true });
                }
                AgentRequest::InstallData { .. } => {
                    data.set(data.get() + 1);
                    if data.get() == 1 {
                        let f = CommandFailure {
                            kind: FailureKind::Install,
                            message: "no space left on device".into(),
                            exit_code: None,
                            stderr_tail: String::new(),
                            stdout_tail: String::new(),
                        };
                        answer(&link, request_id, AgentResponse::Failed(f));
                    }
                }
                // The agent dropped the failed install: no answer to its end.
                AgentRequest::InstallEnd { .. } => {}
                other => panic!("unexpected request {other:?}"),
            }
        }
    };
    let result = tokio::time::timeout(Duration::from_secs(20), async {
        tokio::select! {
            r = install => r,
            _ = agent => panic!("the link's queue closed"),
        }
    })
    .await
    .expect("the install ended");
    let data = data.get();
    match result {
        Err(NodeError::Failed(f)) => assert_eq!(f.message, "no space left on device"),
        other => panic!("expected the agent's failure, got {other:?}"),
    }
    // The failed chunk, and at most the one already queued behind it.
    assert!(data <= 2, "{data} of {CHUNKS} chunks sent after the agent failed the install");
    // Then the abort, so the agent lets go of the install at once.
    let next = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match frames.recv().await.map(|(f, _)| f) {
                Some(MasterFrame::Request { body: AgentRequest::InstallData { .. }, .. }) => continue,
                other => return other,
            }
        }
    })
    .await
    .expect("a frame after the failure");
    match next {
        Some(MasterFrame::Request { body: AgentRequest::InstallAbort { instance }, .. }) => {
            assert_eq!(instance.as_str(), "i1")
        }
        other => panic!("expected InstallAbort after the failed install, got {other:?}"),
    }
}
