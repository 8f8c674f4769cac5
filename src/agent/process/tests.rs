//! Tests of the controller with real processes, checked in `/proc` and in
//! the cgroup filesystem. Every scenario runs twice: with a cgroup per
//! instance and with the process-group fallback.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use super::tree::{self, MARKER_VAR};
use super::*;
use crate::protocol::messages::{ProcessSpec, ResourceLimits};

static SEQ: AtomicU32 = AtomicU32::new(0);

/// One instance directory and a controller; kills whatever the test left.
/// The settle window the early-exit tests start with.
const SETTLE: Duration = Duration::from_millis(200);

pub(super) struct Fixture {
    _tmp: tempfile::TempDir,
    pub(super) dir: PathBuf,
    pub(super) id: InstanceId,
    pub(super) ctl: ProcessController,
    me: RunAs,
}

impl Fixture {
    pub(super) fn new(name: &str, cgroups: bool) -> Fixture {
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        let tmp = tempfile::tempdir().unwrap();
        std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let dir = tmp.path().join("inst");
        std::fs::create_dir(&dir).unwrap();
        // The cgroup mode needs root and a cgroup2 mount: without either it
        // fails here, saying which, rather than quietly testing the
        // process-group mode twice.
        if cgroups {
            assert!(
                nix::unistd::geteuid().is_root(),
                "the cgroup mode of this test needs root (run it as root, as .ci/run does)"
            );
            let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
            assert!(
                cgroup::cgroup2_mount(&mountinfo).is_some(),
                "the cgroup mode of this test needs a cgroup2 mount (none in /proc/self/mountinfo)"
            );
        }
        let ctl = ProcessController::new(&format!("test-{pid}-{n}"), cgroups);
        assert_eq!(
            ctl.cgroups_enabled(),
            cgroups,
            "asked for cgroups: {cgroups}; root with a cgroup2 mount must get them (is the mount writable?)"
        );
        let id = InstanceId::new(format!("t-{name}-{pid}-{n}"));
        Fixture { _tmp: tmp, dir, id, ctl, me: users::current() }
    }

    pub(super) fn script(&self, rel: &str, body: &str) {
        let path = self.dir.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    pub(super) fn start_req<'a>(&'a self, spec: &'a ProcessSpec, current: Option<&'a PidIdentity>) -> StartRequest<'a> {
        StartRequest { instance: &self.id, dir: &self.dir, spec, run_as: &self.me, current, settle: SETTLE }
    }

    pub(super) fn stop_req<'a>(&'a self, spec: &'a ProcessSpec, current: Option<&'a PidIdentity>) -> StopRequest<'a> {
        StopRequest { instance: &self.id, dir: &self.dir, spec, run_as: &self.me, current }
    }

    /// Every process in the machine carrying this instance's marker.
    fn marked(&self) -> Vec<u32> {
        crate::agent::testkit::marked(&self.id)
    }

    pub(super) fn cgroup(&self) -> Option<PathBuf> {
        self.ctl.cgroup_of(&self.id)
    }

    /// Checks that nothing of the instance is left anywhere. A process
    /// SIGKILLed a moment ago may still be on its way out: it gets 2 s,
    /// far more than dying takes and far less than a leak lasts.
    pub(super) fn assert_nothing_left(&self) {
        let deadline = Instant::now() + Duration::from_secs(2);
        while !self.marked().is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(self.marked(), Vec::<u32>::new(), "processes with the instance marker survive");
        assert_eq!(self.ctl.instance_pids(&self.id), Vec::<u32>::new());
        if let Some(cg) = self.cgroup() {
            assert!(!cg.exists(), "cgroup {} was not removed", cg.display());
        }
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let cg = self.cgroup();
        if let Some(cg) = &cg {
            let _ = cgroup::kill_all(cg);
        }
        tree::signal(&tree::collect(&self.id, &[], cg.as_deref()).unwrap_or_default(), Signal::SIGKILL);
        // Independent of `tree::collect`, in case that is what broke.
        for pid in self.marked() {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), Signal::SIGKILL);
        }
        let limit_cgroups = self.ctl.limit_cgroups_of(&self.id);
        for dir in cg.iter().chain(&limit_cgroups) {
            let _ = std::fs::remove_dir(dir);
            if let Some(base) = dir.parent() {
                let _ = std::fs::remove_dir(base);
            }
        }
    }
}

use crate::agent::testkit::spec;

fn environ(pid: u32) -> Vec<String> {
    let raw = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    raw.split(|b| *b == 0).filter(|e| !e.is_empty()).map(|e| String::from_utf8_lossy(e).into_owned()).collect()
}

/// `Name:\tvalues...` of /proc/<pid>/status.
fn status_field(pid: u32, name: &str) -> Vec<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = text.lines().find(|l| l.starts_with(&format!("{name}:"))).unwrap().to_string();
    line.split_whitespace().skip(1).map(str::to_string).collect()
}

pub(super) async fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

macro_rules! both_modes {
    ($name:ident) => {
        mod $name {
            #[tokio::test]
            async fn with_cgroup() {
                super::$name(true).await;
            }
            #[tokio::test]
            async fn with_process_group() {
                super::$name(false).await;
            }
        }
    };
}

async fn foreground_start_is_idempotent_and_stop_kills_it(cg: bool) {
    let f = Fixture::new("fg", cg);
    f.script("bin/run.sh", "exec sleep 1000");
    let spec = spec(&["bin/run.sh"]);
    let started = f.ctl.start(&f.start_req(&spec, None)).await.unwrap();
    assert!(!started.already_running);
    let id = started.identity.clone();
    assert!(identity::is_alive(&id));
    assert_eq!(identity::read_identity(id.pid), Some(id.clone()));
    assert_eq!(std::fs::read_link(format!("/proc/{}/cwd", id.pid)).unwrap(), f.dir);
    let env = environ(id.pid);
    assert!(env.contains(&format!("{MARKER_VAR}={}", f.id)));
    assert!(env.contains(&"GREETING=hello".to_string()));
    assert!(env.contains(&format!("HOME={}", f.dir.display())));
    assert!(env.contains(&"PATH=/usr/local/bin:/usr/bin:/bin".to_string()));
    assert_eq!(std::fs::read_link(format!("/proc/{}/fd/0", id.pid)).unwrap(), Path::new("/dev/null"));
    assert_eq!(std::fs::read_link(format!("/proc/{}/fd/2", id.pid)).unwrap(), f.dir.join("logs/stderr.log"));
    if let Some(cgp) = f.cgroup() {
        assert_eq!(cgroup::procs(&cgp), vec![id.pid]);
        let rel = cgp.strip_prefix(f.ctl.cgroups.as_ref().unwrap().mount()).unwrap();
        let own = std::fs::read_to_string(format!("/proc/{}/cgroup", id.pid)).unwrap();
        assert!(own.lines().any(|l| l == format!("0::/{}", rel.display())), "{own}");
    }
    assert_eq!(f.ctl.instance_pids(&f.id), vec![id.pid]);

    let again = f.ctl.start(&f.start_req(&spec, Some(&id))).await.unwrap();
    assert!(again.already_running);
    assert_eq!(again.identity, id);
    assert_eq!(f.ctl.instance_pids(&f.id), vec![id.pid]);

    assert!(f.ctl.stop(&f.stop_req(&spec, Some(&id))).await.unwrap());
    assert!(!identity::is_alive(&id));
    let exit = tokio::time::timeout(Duration::from_secs(5), started.exit).await.unwrap();
    assert_eq!((exit.pid, exit.exit_code, exit.signal), (id.pid, None, Some(libc::SIGTERM)));
    f.assert_nothing_left();
    assert!(!f.ctl.stop(&f.stop_req(&spec, Some(&id))).await.unwrap());
}
both_modes!(foreground_start_is_idempotent_and_stop_kills_it);

/// The flotilla binary runs with transparent huge pages off (its allocator
/// asks for it) and a raised open-files limit, and both survive `exec`: an
/// instance must get the machine's huge-page policy and the limit the agent
/// started with, not the agent's.
#[tokio::test]
async fn an_instance_does_not_inherit_the_agents_huge_pages_or_fd_limit() {
    crate::fd_limit::raise();
    let (soft, _) = crate::fd_limit::original().expect("raise() records the original limit");
    // Changed only while no other test's spawn is inside its window (the
    // flag is the whole process's).
    let was = super::vfork::swap_thp_disable(true);
    let f = Fixture::new("thp", true);
    f.script("bin/run.sh", "exec sleep 1000");
    let spec = spec(&["bin/run.sh"]);
    let started = f.ctl.start(&f.start_req(&spec, None)).await;
    // The child shared the agent's address space until its exec: the flag
    // it cleared there for the new program is the agent's, set again since.
    let agent_still_off = super::vfork::swap_thp_disable(was);
    assert!(agent_still_off, "the agent's own huge pages were turned back on by a spawn");
    let id = started.unwrap().identity;
    assert_eq!(status_field(id.pid, "THP_enabled"), vec!["1"], "the instance runs with huge pages disabled");
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", id.pid)).unwrap();
    let open_files = limits.lines().find(|l| l.starts_with("Max open files")).unwrap();
    let got: u64 = open_files.split_whitespace().nth(3).unwrap().parse().unwrap();
    assert_eq!(got, soft, "the instance's soft limit on open files: {open_files}");
    assert!(f.ctl.stop(&f.stop_req(&spec, Some(&id))).await.unwrap());
}

async fn daemon_is_found_through_its_pidfile(cg: bool) {
    let f = Fixture::new("daemon", cg);
    f.script("bin/start.sh", "sleep 1000 &\necho $! > run/x.pid\nexit 0");
    // A stale pidfile of an earlier run must not be taken for this one.
    std::fs::create_dir_all(f.dir.join("run")).unwrap();
    std::fs::write(f.dir.join("run/x.pid"), format!("{}\n", std::process::id())).unwrap();
    let spec = ProcessSpec { pidfile: Some("run/x.pid".into()), ..spec(&["bin/start.sh"]) };
    let started = f.ctl.start(&f.start_req(&spec, None)).await.unwrap();
    let id = started.identity.clone();
    let written: u32 = std::fs::read_to_string(f.dir.join("run/x.pid")).unwrap().trim().parse().unwrap();
    assert_eq!(id.pid, written);
    assert!(identity::is_alive(&id));
    // The pidfile may name the script's forked child before it has exec'd
    // `sleep` (same process, same identity): the name follows shortly.
    let comm = || std::fs::read_to_string(format!("/proc/{}/comm", id.pid)).unwrap_or_default();
    wait_until("the daemon has exec'd sleep", || comm().trim() == "sleep").await;
    assert!(identity::is_alive(&id), "the identity recorded before the exec still names the daemon");
    if let Some(cgp) = f.cgroup() {
        assert_eq!(cgroup::procs(&cgp), vec![id.pid]);
    }
    let watcher = tokio::spawn(f.ctl.watch(&f.id, &id));
    assert!(f.ctl.stop(&f.stop_req(&spec, Some(&id))).await.unwrap());
    assert!(!identity::is_alive(&id));
    let exit = tokio::time::timeout(Duration::from_secs(5), watcher).await.unwrap().unwrap();
    assert_eq!(exit.pid, id.pid);
    f.assert_nothing_left();
    assert!(!f.ctl.stop(&f.stop_req(&spec, Some(&id))).await.unwrap());
}
both_modes!(daemon_is_found_through_its_pidfile);

async fn stop_leaves_no_grandchild_behind(cg: bool) {
    let f = Fixture::new("tree", cg);
    f.script("bin/run.sh", "(setsid sleep 1000 &)\nsleep 1000 &\nexec sleep 1000");
    let spec = spec(&["bin/run.sh"]);
    let started = f.ctl.start(&f.start_req(&spec, None)).await.unwrap();
    wait_until("three processes carry the marker", || f.marked().len() == 3).await;
    let pids = f.ctl.instance_pids(&f.id);
    assert_eq!(pids.len(), 3, "{pids:?}");
    if let Some(cgp) = f.cgroup() {
        let mut in_cg = cgroup::procs(&cgp);
        in_cg.sort();
        assert_eq!(in_cg, pids);
    }
    assert!(f.ctl.stop(&f.stop_req(&spec, Some(&started.identity))).await.unwrap());
    f.assert_nothing_left();
}
both_modes!(stop_leaves_no_grandchild_behind);

async fn failing_start_reports_exit_code_and_this_runs_stderr(cg: bool) {
    let f = Fixture::new("fail", cg);
    std::fs::create_dir_all(f.dir.join("logs")).unwrap();
    std::fs::write(f.dir.join("logs/stderr.log"), "old run's complaint\n").unwrap();
    f.script("bin/run.sh", "sleep 1000 &\necho 'bad config: port missing' >&2\nexit 3");
    for pidfile in [None, Some("run/x.pid".to_string())] {
        let spec = ProcessSpec { pidfile, ..spec(&["bin/run.sh"]) };
        let err = f.ctl.start(&f.start_req(&spec, None)).await.unwrap_err();
        assert!(matches!(err, ProcessError::StartFailed { exit_code: Some(3), .. }), "{err:?}");
        assert_eq!(err.exit_code(), Some(3));
        assert!(err.stderr_tail().contains("bad config: port missing"), "{:?}", err.stderr_tail());
        assert!(!err.stderr_tail().contains("old run"));
        // The backgrounded sleep of the failed start is gone too.
        f.assert_nothing_left();
    }
}
both_modes!(failing_start_reports_exit_code_and_this_runs_stderr);

async fn missing_pidfile_times_out(cg: bool) {
    let f = Fixture::new("nopid", cg);
    f.script("bin/start.sh", "sleep 1000 &\necho 'forgot the pidfile' >&2\nexit 0");
    let spec = ProcessSpec { pidfile: Some("run/x.pid".into()), start_timeout_ms: 500, ..spec(&["bin/start.sh"]) };
    let t = Instant::now();
    let err = f.ctl.start(&f.start_req(&spec, None)).await.unwrap_err();
    let took = t.elapsed();
    assert!(matches!(&err, ProcessError::PidfileTimeout { waited_ms: 500, .. }), "{err:?}");
    assert!(err.stderr_tail().contains("forgot the pidfile"));
    assert!(took >= Duration::from_millis(450) && took < Duration::from_secs(3), "{took:?}");
    f.assert_nothing_left();
}
both_modes!(missing_pidfile_times_out);

async fn foreign_pid_in_pidfile_is_refused_and_not_signalled(cg: bool) {
    let f = Fixture::new("foreign", cg);
    let mut foreign = tokio::process::Command::new("sleep")
        .arg("1000")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let fpid = foreign.id().unwrap();
    let before = identity::read_identity(fpid).unwrap();
    f.script("bin/start.sh", &format!("echo {fpid} > run/x.pid"));
    let spec = ProcessSpec { pidfile: Some("run/x.pid".into()), ..spec(&["bin/start.sh"]) };
    let err = f.ctl.start(&f.start_req(&spec, None)).await.unwrap_err();
    assert!(matches!(err, ProcessError::PidNotInTree { pid } if pid == fpid), "{err:?}");
    // Neither start nor stop touches a process that is not the instance's,
    // even when handed its pid as `current` with a wrong start time.
    let fake = PidIdentity { start_time: before.start_time + 1, ..before.clone() };
    assert!(!f.ctl.stop(&f.stop_req(&spec, Some(&fake))).await.unwrap());
    assert!(identity::is_alive(&before));
    foreign.kill().await.unwrap();
}
both_modes!(foreign_pid_in_pidfile_is_refused_and_not_signalled);

/// Hostile pidfiles of the list: pid 1, the agent's own pid (this
/// test process runs the controller), and a process of another user. Each
/// is refused as not the instance's, and none is signalled.
async fn hostile_pidfiles_are_refused_and_nothing_is_signalled(cg: bool) {
    let f = Fixture::new("hostile-pid", cg);
    let nobody = users::resolve("nobody").expect("the user nobody (Debian has it)");
    let mut other = tokio::process::Command::new("sleep")
        .arg("1000")
        .uid(nobody.uid)
        .gid(nobody.gid)
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .expect("a process of another user (the tests run as root)");
    let other_pid = other.id().unwrap();
    let me = std::process::id();
    let watched: Vec<(u32, PidIdentity)> =
        [1, me, other_pid].iter().map(|&p| (p, identity::read_identity(p).expect("alive"))).collect();
    for (pid, _) in &watched {
        f.script("bin/start.sh", &format!("echo {pid} > run/x.pid"));
        let spec = ProcessSpec { pidfile: Some("run/x.pid".into()), ..spec(&["bin/start.sh"]) };
        let err = f.ctl.start(&f.start_req(&spec, None)).await.unwrap_err();
        // pid 1 is refused as a pidfile's content already; the others as
        // processes outside the instance's tree.
        let refused = match err {
            ProcessError::PidfileInvalid { ref reason, .. } => *pid == 1 && reason.contains("1 is init"),
            ProcessError::PidNotInTree { pid: p } => p == *pid,
            _ => false,
        };
        assert!(refused, "pidfile naming {pid}: {err:?}");
    }
    for (pid, id) in &watched {
        assert!(identity::is_alive(id), "{pid} was signalled");
    }
    other.kill().await.unwrap();
}
both_modes!(hostile_pidfiles_are_refused_and_nothing_is_signalled);

async fn stop_command_is_used(cg: bool) {
    let f = Fixture::new("stopcmd", cg);
    // Ignores TERM; only the stop command's USR1 makes it exit (with 0).
    f.script("bin/run.sh", "trap 'exit 0' USR1\ntrap '' TERM\necho $$ > run/main.pid\nwhile :; do sleep 0.05; done");
    f.script("bin/stop.sh", "echo \"stopped by $(id -u) in $PWD, marker=${FLOTILLA_INSTANCE:-none}\" > stop-ran\nkill -USR1 $(cat run/main.pid)");
    std::fs::create_dir_all(f.dir.join("run")).unwrap();
    let spec = ProcessSpec { stop: Some(vec!["bin/stop.sh".into()]), stop_grace_ms: 4000, ..spec(&["bin/run.sh"]) };
    let started = f.ctl.start(&f.start_req(&spec, None)).await.unwrap();
    wait_until("the pidfile is written", || f.dir.join("run/main.pid").exists()).await;
    let t = Instant::now();
    assert!(f.ctl.stop(&f.stop_req(&spec, Some(&started.identity))).await.unwrap());
    assert!(t.elapsed() < Duration::from_secs(3), "stop waited for the grace period: {:?}", t.elapsed());
    let ran = std::fs::read_to_string(f.dir.join("stop-ran")).unwrap();
    assert_eq!(ran.trim(), format!("stopped by {} in {}, marker=none", f.me.uid, f.dir.display()));
    let exit = started.exit.await;
    assert_eq!(exit.exit_code, Some(0), "{exit:?}");
    f.assert_nothing_left();
}
both_modes!(stop_command_is_used);

async fn term_ignoring_process_is_killed_after_grace(cg: bool) {
    let f = Fixture::new("stubborn", cg);
    f.script("bin/run.sh", "trap '' TERM\nexec sleep 1000");
    let spec = ProcessSpec { stop_grace_ms: 300, ..spec(&["bin/run.sh"]) };
    let started = f.ctl.start(&f.start_req(&spec, None)).await.unwrap();
    let t = Instant::now();
    assert!(f.ctl.stop(&f.stop_req(&spec, Some(&started.identity))).await.unwrap());
    let took = t.elapsed();
    assert!(took >= Duration::from_millis(300) && took < Duration::from_secs(3), "{took:?}");
    let exit = started.exit.await;
    assert_eq!(exit.signal, Some(libc::SIGKILL));
    f.assert_nothing_left();
}
both_modes!(term_ignoring_process_is_killed_after_grace);

async fn runs_as_nobody_without_root_groups(cg: bool) {
    assert!(nix::unistd::geteuid().is_root(), "this test needs root (run it as root, as .ci/run does)");
    let mut f = Fixture::new("nobody", cg);
    f.me = users::resolve("nobody").unwrap();
    f.script("bin/run.sh", "echo started >&2\nexec sleep 1000");
    let spec = spec(&["bin/run.sh"]);
    let started = f.ctl.start(&f.start_req(&spec, None)).await.unwrap();
    let pid = started.identity.pid;
    let uid = f.me.uid.to_string();
    let gid = f.me.gid.to_string();
    assert_eq!(status_field(pid, "Uid"), vec![uid.clone(), uid.clone(), uid.clone(), uid]);
    assert_eq!(status_field(pid, "Gid"), vec![gid.clone(), gid.clone(), gid.clone(), gid.clone()]);
    let groups = status_field(pid, "Groups");
    assert!(!groups.contains(&"0".to_string()), "{groups:?}");
    assert_eq!(groups, vec![gid]);
    use std::os::unix::fs::MetadataExt;
    assert_eq!(std::fs::metadata(f.dir.join("logs/stderr.log")).unwrap().uid(), f.me.uid);
    assert!(f.ctl.stop(&f.stop_req(&spec, Some(&started.identity))).await.unwrap());
    f.assert_nothing_left();
}
both_modes!(runs_as_nobody_without_root_groups);

async fn unexpected_exit_is_reported_with_code_and_stderr(cg: bool) {
    let f = Fixture::new("crash", cg);
    f.script("bin/run.sh", "sleep 0.4\necho 'out of memory' >&2\nexit 5");
    let run = spec(&["bin/run.sh"]);
    let started = f.ctl.start(&f.start_req(&run, None)).await.unwrap();
    let exit = tokio::time::timeout(Duration::from_secs(5), f.ctl.watch(&f.id, &started.identity)).await.unwrap();
    assert_eq!((exit.pid, exit.exit_code, exit.signal), (started.identity.pid, Some(5), None));
    assert_eq!(exit.stderr_tail, "out of memory");
    // A process that dies at once is a failed start, not a running one.
    f.script("bin/quick.sh", "echo 'no such option' >&2\nexit 0");
    let err = f.ctl.start(&f.start_req(&spec(&["bin/quick.sh"]), None)).await.unwrap_err();
    assert!(matches!(err, ProcessError::StartFailed { exit_code: Some(0), .. }), "{err:?}");
    assert_eq!(err.stderr_tail(), "no such option");
    // A bare program name is looked up in the clean PATH.
    let err = f.ctl.start(&f.start_req(&spec(&["sh", "-c", "exit 7"]), None)).await.unwrap_err();
    assert_eq!(err.exit_code(), Some(7), "{err:?}");
    let err = f.ctl.start(&f.start_req(&spec(&["bin/missing.sh"]), None)).await.unwrap_err();
    assert!(matches!(err, ProcessError::Spawn { .. }), "{err:?}");
    assert!(!f.ctl.stop(&f.stop_req(&run, Some(&started.identity))).await.unwrap());
    f.assert_nothing_left();
}
both_modes!(unexpected_exit_is_reported_with_code_and_stderr);

#[tokio::test]
async fn cgroup_catches_a_daemon_that_escapes_group_session_and_environment() {
    assert!(nix::unistd::geteuid().is_root(), "this test needs root (run it as root, as .ci/run does)");
    let f = Fixture::new("escape", true);
    assert!(f.ctl.cgroups_enabled(), "root on this machine must get cgroups");
    f.script("bin/run.sh", "(setsid env -i /bin/sleep 1000 &)\nexec sleep 1000");
    let spec = spec(&["bin/run.sh"]);
    let started = f.ctl.start(&f.start_req(&spec, None)).await.unwrap();
    let cgp = f.cgroup().unwrap();
    wait_until("both processes are in the cgroup", || cgroup::procs(&cgp).len() == 2).await;
    assert_eq!(f.ctl.instance_pids(&f.id).len(), 2);
    assert!(f.ctl.stop(&f.stop_req(&spec, Some(&started.identity))).await.unwrap());
    assert!(!cgp.exists());
    f.assert_nothing_left();
}

/// A stop waits on the cgroup alone only while everything it signalled is
/// inside: a marked process moved out (root can) is waited for through /proc.
#[tokio::test]
async fn a_process_moved_out_of_the_cgroup_is_waited_for_at_stop() {
    assert!(nix::unistd::geteuid().is_root(), "this test needs root (run it as root, as .ci/run does)");
    let f = Fixture::new("moved", true);
    assert!(f.ctl.cgroups_enabled(), "root on this machine must get cgroups");
    // The background one takes 300 ms to honour TERM.
    f.script("bin/run.sh", "sh -c 'trap \"sleep 0.3; exit 0\" TERM; while :; do sleep 0.05; done' &\nexec sleep 1000");
    let spec = spec(&["bin/run.sh"]);
    let started = f.ctl.start(&f.start_req(&spec, None)).await.unwrap();
    let cgp = f.cgroup().unwrap();
    wait_until("both processes are in the cgroup", || cgroup::procs(&cgp).len() >= 2).await;
    let slow = *cgroup::procs(&cgp).iter().find(|p| **p != started.identity.pid).unwrap();
    // Into the cgroup2 mount's root: <mount>/flotilla/<scope>/<instance>.
    let mount = cgp.ancestors().nth(3).unwrap();
    std::fs::write(mount.join("cgroup.procs"), slow.to_string()).unwrap();
    assert!(!cgroup::procs(&cgp).contains(&slow), "{slow} did not leave the cgroup");
    assert!(f.ctl.stop(&f.stop_req(&spec, Some(&started.identity))).await.unwrap());
    // Had the stop trusted the empty cgroup, `slow` would still run here.
    f.assert_nothing_left();
}

/// A member inside the cgroup when the stop lists it, that moves itself
/// out on TERM (root can): the empty cgroup is confirmed by a pass, which
/// finds it, so the stop waits for it.
#[tokio::test]
async fn a_process_leaving_the_cgroup_during_the_stop_is_waited_for() {
    assert!(nix::unistd::geteuid().is_root(), "this test needs root (run it as root, as .ci/run does)");
    let f = Fixture::new("leaving", true);
    assert!(f.ctl.cgroups_enabled(), "root on this machine must get cgroups");
    let cgp = f.cgroup().unwrap();
    let mount = cgp.ancestors().nth(3).unwrap().join("cgroup.procs");
    let body = format!(
        "sh -c 'trap \"echo \\$\\$ > {}; sleep 0.3; exit 0\" TERM; while :; do sleep 0.05; done' &\nexec sleep 1000",
        mount.display()
    );
    f.script("bin/run.sh", &body);
    let spec = spec(&["bin/run.sh"]);
    let started = f.ctl.start(&f.start_req(&spec, None)).await.unwrap();
    wait_until("the loop runs in the cgroup", || cgroup::procs(&cgp).len() >= 3).await;
    assert!(f.ctl.stop(&f.stop_req(&spec, Some(&started.identity))).await.unwrap());
    // Had the stop trusted the empty cgroup, the shell would still run here.
    f.assert_nothing_left();
}

/// The line of `/proc/<pid>/cgroup` of the hierarchy holding `controller`
/// (v1: `N:memory:/path`; v2: `0::/path`), as its path.
fn proc_cgroup_path(pid: u32, controller: &str, version: limits::Version) -> String {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    text.lines()
        .find_map(|l| {
            let mut parts = l.splitn(3, ':');
            let (_, ctls, path) = (parts.next()?, parts.next()?, parts.next()?);
            let hit = match version {
                limits::Version::V1 => ctls.split(',').any(|c| c == controller),
                limits::Version::V2 => ctls.is_empty(),
            };
            hit.then(|| path.to_string())
        })
        .unwrap_or_else(|| panic!("no {controller} line in /proc/{pid}/cgroup: {text}"))
}

async fn resource_limits_are_applied_at_start_and_removed_at_stop(cg: bool) {
    let f = Fixture::new("limits", cg);
    f.script("bin/run.sh", "exec sleep 1000");
    let limited =
        |memory_bytes, cpu| ProcessSpec { limits: Some(ResourceLimits { memory_bytes, cpu }), ..spec(&["bin/run.sh"]) };
    let spec = limited(Some(64 << 20), Some(0.5));
    if !cg {
        // Without cgroups (use_cgroups = false) nothing can be limited: the
        // start is refused, never run unlimited.
        assert!(!f.ctl.resource_limits_enabled());
        let err = f.ctl.start(&f.start_req(&spec, None)).await.unwrap_err();
        assert!(matches!(&err, ProcessError::Limits { source: LimitsError::Unavailable { .. }, .. }), "{err:?}");
        let chain = crate::error::ErrorChain(&err).to_string();
        assert!(chain.contains("cannot enforce resource limits") && chain.contains("use_cgroups"), "{chain}");
        f.assert_nothing_left();
        // Limits that limit nothing are no limits.
        let unlimited = limited(None, None);
        let started = f.ctl.start(&f.start_req(&unlimited, None)).await.unwrap();
        assert!(f.ctl.stop(&f.stop_req(&unlimited, Some(&started.identity))).await.unwrap());
        f.assert_nothing_left();
        return;
    }
    assert!(nix::unistd::geteuid().is_root(), "this test needs root (run it as root, as .ci/run does)");
    assert!(f.ctl.resource_limits_enabled(), "root on a machine with memory and cpu controllers must get limits");
    let root = f.ctl.limits.as_ref().unwrap().clone();

    // Invalid values fail the start before anything runs.
    let err = f.ctl.start(&f.start_req(&limited(Some(0), None), None)).await.unwrap_err();
    assert!(matches!(&err, ProcessError::Limits { source: LimitsError::Invalid { .. }, .. }), "{err:?}");
    f.assert_nothing_left();

    let started = f.ctl.start(&f.start_req(&spec, None)).await.unwrap();
    let pid = started.identity.pid;
    let dirs = f.ctl.limit_cgroups_of(&f.id);
    let dir_in = |mount: &Path| dirs.iter().find(|d| d.starts_with(mount)).unwrap().clone();
    let (mem, cpu) = (root.memory().clone(), root.cpu().clone());
    let (mem_dir, cpu_dir) = (dir_in(&mem.mount), dir_in(&cpu.mount));
    let read = |dir: &Path, file: &str| std::fs::read_to_string(dir.join(file)).unwrap().trim().to_string();
    assert!(cgroup::procs(&mem_dir).contains(&pid), "{pid} not in {}", mem_dir.display());
    assert!(cgroup::procs(&cpu_dir).contains(&pid), "{pid} not in {}", cpu_dir.display());
    match mem.version {
        limits::Version::V1 => assert_eq!(read(&mem_dir, "memory.limit_in_bytes"), "67108864"),
        limits::Version::V2 => assert_eq!(read(&mem_dir, "memory.max"), "67108864"),
    }
    match cpu.version {
        limits::Version::V1 => {
            assert_eq!(read(&cpu_dir, "cpu.cfs_quota_us"), "50000");
            assert_eq!(read(&cpu_dir, "cpu.cfs_period_us"), "100000");
        }
        limits::Version::V2 => assert_eq!(read(&cpu_dir, "cpu.max"), "50000 100000"),
    }
    // The kernel's own view of the process agrees.
    let rel = |dir: &Path, mount: &Path| format!("/{}", dir.strip_prefix(mount).unwrap().display());
    assert_eq!(proc_cgroup_path(pid, "memory", mem.version), rel(&mem_dir, &mem.mount));
    assert_eq!(proc_cgroup_path(pid, "cpu", cpu.version), rel(&cpu_dir, &cpu.mount));

    assert!(f.ctl.stop(&f.stop_req(&spec, Some(&started.identity))).await.unwrap());
    for dir in &dirs {
        assert!(!dir.exists(), "limit cgroup {} was not removed", dir.display());
    }
    f.assert_nothing_left();
}
both_modes!(resource_limits_are_applied_at_start_and_removed_at_stop);
