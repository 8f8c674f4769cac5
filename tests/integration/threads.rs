//! The master's threads as the kernel sees them (`/proc/<pid>/task`): the
//! cluster actors' threads and the agents' connection threads run at
//! `bulk_nice` below the process while no request waits, each as many as
//! configured; the HTTP workers and the storage writer keep the process's
//! priority.

use std::time::{Duration, Instant};

use crate::common::TestEnv;

/// Each thread of `pid`: its name (`comm`) and nice value.
fn threads(pid: u32) -> Vec<(String, i32)> {
    let dir = std::fs::read_dir(format!("/proc/{pid}/task")).expect("the master's /proc entry");
    dir.filter_map(|e| {
        let task = e.ok()?.path();
        let comm = std::fs::read_to_string(task.join("comm")).ok()?.trim_end().to_string();
        let stat = std::fs::read_to_string(task.join("stat")).ok()?;
        // Fields after the name; the nice value is the 19th field of all.
        let nice = stat.rsplit_once(')')?.1.split_whitespace().nth(16)?.parse().ok()?;
        Some((comm, nice))
    })
    .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn actor_and_link_threads_run_bulk_work_lowered_and_the_request_path_does_not() {
    let env = TestEnv::start_with(
        "threads",
        &[
            ("FLOTILLA_MASTER_ACTOR_THREADS", "2"),
            ("FLOTILLA_MASTER_LINK_THREADS", "3"),
            ("FLOTILLA_MASTER_BULK_NICE", "7"),
            ("FLOTILLA_MASTER_HTTP_WORKERS", "2"),
        ],
    )
    .await;
    // Three agents connected, nothing asked: no request holds a thread up.
    let pid = env.master_pid();
    let deadline = Instant::now() + Duration::from_secs(10);
    let (lowered, all) = loop {
        let all = threads(pid);
        let lowered: Vec<(String, i32)> = all.iter().filter(|(_, n)| *n == 7).cloned().collect();
        if lowered.len() == 5 || Instant::now() > deadline {
            break (lowered, all);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(lowered.len(), 2 + 3, "2 actor threads and 3 link threads at nice 7: {all:?}");
    assert!(lowered.iter().all(|(name, _)| name.starts_with("actix-rt|system")), "only arbiters lowered: {all:?}");
    // The other arbiters are the HTTP workers (actix-web names its workers
    // as arbiters), at the process's priority, and so is the writer.
    let at = |name: &str, nice: i32| all.iter().filter(|(n, v)| n.starts_with(name) && *v == nice).count();
    assert_eq!(at("actix-rt|system", 0), 2, "the 2 HTTP workers at the process's priority: {all:?}");
    assert_eq!(at("flotilla-storag", 0), 1, "the storage writer at the process's priority: {all:?}");
}
