//! A store whose writer stops answering ends the master with the cause
//! (`store_stall_limit`), instead of leaving a master that takes requests
//! it can never record. Only the writer thread is stopped (ptrace, as a
//! hung disk would hold it); the rest of the master runs on.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use nix::sys::ptrace;
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;
use serde_json::json;

use crate::common::TestEnv;

/// The writer thread's name as `/proc` shows it (cut to 15 bytes).
const WRITER_COMM: &str = "flotilla-storag";

fn writer_thread(pid: u32) -> Pid {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).expect("the master's threads");
    for t in tasks.filter_map(|t| t.ok()) {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if comm.trim_end() == WRITER_COMM {
            let tid: i32 = t.file_name().to_string_lossy().parse().expect("a thread id");
            return Pid::from_raw(tid);
        }
    }
    panic!("no thread named {WRITER_COMM} in master {pid}");
}

/// Stops thread `tid` alone (seized and interrupted: no group stop) and
/// keeps it stopped until `release` is dropped or sent to, or the thread
/// dies (its process exits).
fn hold_thread(tid: Pid) -> mpsc::Sender<()> {
    let (release, wait) = mpsc::channel::<()>();
    let (stopped_tx, stopped) = mpsc::channel();
    std::thread::spawn(move || {
        // The tracer is this thread: every ptrace call comes from it, and
        // the thread runs again when it ends.
        let held = ptrace::seize(tid, ptrace::Options::empty())
            .and_then(|()| ptrace::interrupt(tid))
            .and_then(|()| waitpid(tid, Some(WaitPidFlag::__WALL)).map(|_| ()));
        stopped_tx.send(held.map_err(|e| e.to_string())).expect("report the stop");
        // A traced thread's death is reported to its tracer first: until
        // it is reaped here, its process would never be seen to exit.
        loop {
            match wait.recv_timeout(Duration::from_millis(50)) {
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                _ => {
                    let _ = ptrace::detach(tid, None);
                    return;
                }
            }
            match waitpid(tid, Some(WaitPidFlag::__WALL | WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(..) | WaitStatus::Signaled(..)) | Err(_) => return,
                Ok(_) => {}
            }
        }
    });
    if let Err(e) = stopped.recv().expect("the tracer's report") {
        panic!(
            "cannot stop the store's writer thread {tid} with ptrace (it needs CAP_SYS_PTRACE, and Yama's \
             ptrace_scope and any seccomp filter must allow it): {e}"
        );
    }
    release
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_that_stops_answering_ends_the_master_with_the_cause() {
    const LIMIT: Duration = Duration::from_secs(3);
    let mut env = TestEnv::start_sim("storestall", &[("FLOTILLA_MASTER_STORE_STALL_LIMIT", "3s")], 1).await;
    // An idle writer is not a stuck one: past the limit with nothing to
    // write, the master runs on.
    tokio::time::sleep(LIMIT * 2).await;
    assert!(env.wait_master_exit(Duration::ZERO).await.is_none(), "an idle master exited\n{}", env.master_log());
    env.make_join_token(1).await;

    let release = hold_thread(writer_thread(env.master_pid()));
    let stopped_at = Instant::now();
    let write = {
        let (client, url) = (env.client.clone(), format!("{}/join-tokens", env.api));
        tokio::spawn(async move {
            let sent = client.post(url).json(&json!({"name": "after", "uses": 1})).send().await;
            sent.map(|r| r.status())
        })
    };
    // The limit, then the orderly stop or, past its deadline (20 s), the
    // hard exit: the writer stays stopped, so the store's drop would wait.
    let status = env.wait_master_exit(LIMIT + Duration::from_secs(40)).await;
    let took = stopped_at.elapsed();
    drop(release);
    let status = status
        .unwrap_or_else(|| panic!("the master still runs {took:?} after its writer stopped\n{}", env.master_log()));
    assert_eq!(status.code(), Some(1), "the master's exit: {status}");
    assert!(took >= LIMIT, "the master exited after {took:?}, before the limit ({LIMIT:?})");
    let log = env.master_log();
    assert!(
        log.contains("waited") && log.contains("store_stall_limit") && log.contains("the disk does not answer"),
        "the master's log does not name the cause:\n{log}"
    );
    // The write was never acknowledged: nothing of it was durable.
    match write.await.expect("the write's task") {
        Ok(code) => assert!(!code.is_success(), "a write the store never took was answered {code}"),
        Err(e) => eprintln!("the write's connection ended: {e}"),
    }
    eprintln!("stuck writer: the master exited {took:?} after its writer stopped");
}
