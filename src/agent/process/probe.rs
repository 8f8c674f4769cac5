//! How fast this machine starts processes the way the agent does: each in
//! a fresh cgroup of its own, joined between `clone` and `exec` by the
//! agent's own spawn (`vfork.rs`), several at once. `flotilla bench real`
//! reports it beside the plain spawn ceiling (one `posix_spawn` after
//! another): the agent pays for the cgroup (every move takes the kernel's
//! `cgroup_threadgroup_rwsem` for writing) but spawns in parallel.

use std::fs::OpenOptions;
use std::io;
use std::time::{Duration, Instant};

use super::cgroup::{self, CgroupRoot};
use super::spawn::{self, Launch};
use super::users;
use crate::ids::InstanceId;

/// `/bin/true` spawned into a new cgroup, waited for, its cgroup removed,
/// repeatedly for `dur`, by `parallel` tasks at once: processes per second.
/// `None` when this process cannot create cgroup v2 groups (not root, no
/// writable cgroup2 mount).
pub async fn spawn_in_cgroup_per_s(dur: Duration, parallel: usize) -> Option<io::Result<f64>> {
    let root = CgroupRoot::detect(&format!("spawn-probe-{}", std::process::id()))?;
    let root = std::sync::Arc::new(root);
    let started = Instant::now();
    let tasks: Vec<_> = (0..parallel.max(1))
        .map(|t| {
            let root = root.clone();
            tokio::spawn(async move {
                let mut n = 0u64;
                while started.elapsed() < dur {
                    one(&root, &InstanceId::new(format!("p{t}-{n}"))).await?;
                    n += 1;
                }
                Ok::<u64, io::Error>(n)
            })
        })
        .collect();
    // Every task is waited for (none is left spawning), and the base
    // cgroup is removed whatever happened.
    let mut total = 0;
    let mut failed = None;
    for t in tasks {
        match t.await {
            Ok(Ok(n)) => total += n,
            Ok(Err(e)) => failed = failed.or(Some(e)),
            Err(e) => failed = failed.or(Some(io::Error::other(e))),
        }
    }
    let rate = total as f64 / started.elapsed().as_secs_f64();
    let _ = std::fs::remove_dir(root.base());
    Some(match failed {
        Some(e) => Err(e),
        None => Ok(rate),
    })
}

async fn one(root: &CgroupRoot, id: &InstanceId) -> io::Result<()> {
    let dir = root.create(id)?;
    let procs = OpenOptions::new().write(true).open(dir.join("cgroup.procs"))?;
    let null = OpenOptions::new().write(true).open("/dev/null")?;
    let launch = Launch {
        argv: &["/bin/true".to_string()],
        dir: std::path::Path::new("/"),
        env: &[],
        marker: None,
        run_as: &users::current(),
        cgroup_procs: std::slice::from_ref(&procs),
        stdout: &null,
        stderr: &null,
    };
    let status = match spawn::spawn(&launch) {
        Ok(mut child) => child.wait().await.map(|_| ()),
        Err(e) => Err(io::Error::other(crate::error::ErrorChain(&e).to_string())),
    };
    drop(procs);
    cgroup::remove(&dir).await?;
    status
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn spawns_into_cgroups_and_leaves_no_cgroup_behind() {
        let rate = spawn_in_cgroup_per_s(Duration::from_millis(200), 2)
            .await
            .expect("root on a machine with a writable cgroup2 mount must be able to run the probe")
            .expect("the probe failed");
        assert!(rate > 0.0, "{rate} spawns per second");
        let root = CgroupRoot::detect("probe-check").expect("cgroup2");
        let base = root.base().parent().unwrap().join(format!("spawn-probe-{}", std::process::id()));
        assert!(!base.exists(), "{} was left behind", base.display());
        let _ = std::fs::remove_dir(root.base());
    }
}
