//! [`EtcdCluster`]: real etcd members (Debian's `etcd`, installed by
//! `scripts/setup.sh`) as child processes on loopback addresses of their
//! own (127.1.S.1..3, the usual ports 2379/2380), data in a temp dir, logs
//! in files; killed and removed when dropped. Election settings are fast
//! (heartbeat 50 ms, election 500 ms) but tolerant of a loaded machine.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

static NEXT_SLOT: AtomicU32 = AtomicU32::new(0);

pub struct EtcdCluster {
    /// `http://127.1.S.i:2379`, member 0 first.
    pub endpoints: Vec<String>,
    ips: Vec<String>,
    members: Vec<Option<Child>>,
    dir: tempfile::TempDir,
    initial: String,
    /// A host address each member also takes clients on (port 23790 + i).
    also_on: Option<String>,
}

impl EtcdCluster {
    /// Starts `n` members and waits until they have a leader.
    pub fn start(n: usize) -> EtcdCluster {
        EtcdCluster::start_also_on(n, None)
    }

    /// [`start`](Self::start), each member also taking clients on `ip`
    /// (port 23790 + its index; see [`endpoints_on`](Self::endpoints_on)).
    pub fn start_also_on(n: usize, ip: Option<&str>) -> EtcdCluster {
        let etcd = which("etcd");
        assert!(
            etcd.is_some(),
            "etcd is not installed (Debian's etcd-server): run scripts/setup.sh; the HA tests need real members"
        );
        let slot = NEXT_SLOT.fetch_add(1, Ordering::SeqCst).wrapping_add(std::process::id().wrapping_mul(53));
        let s = slot % 250 + 1;
        let ips: Vec<String> = (1..=n).map(|i| format!("127.1.{s}.{i}")).collect();
        let initial =
            ips.iter().enumerate().map(|(i, ip)| format!("m{i}=http://{ip}:2380")).collect::<Vec<_>>().join(",");
        let dir = tempfile::Builder::new().prefix("flotilla-etcd-").tempdir().expect("temp dir");
        let mut c = EtcdCluster {
            endpoints: ips.iter().map(|ip| format!("http://{ip}:2379")).collect(),
            ips,
            members: Vec::new(),
            dir,
            initial,
            also_on: ip.map(str::to_string),
        };
        for i in 0..n {
            let child = c.spawn(i, "new");
            c.members.push(Some(child));
        }
        c.wait_healthy(Duration::from_secs(30));
        c
    }

    fn spawn(&self, i: usize, state: &str) -> Child {
        let ip = &self.ips[i];
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join(format!("m{i}.log")))
            .expect("etcd log file");
        Command::new("etcd")
            .args(["--name", &format!("m{i}")])
            .arg("--data-dir")
            .arg(self.dir.path().join(format!("m{i}")))
            .args(["--listen-client-urls", &self.listen_urls(i)])
            .args(["--advertise-client-urls", &format!("http://{ip}:2379")])
            .args(["--listen-peer-urls", &format!("http://{ip}:2380")])
            .args(["--initial-advertise-peer-urls", &format!("http://{ip}:2380")])
            .args(["--initial-cluster", &self.initial])
            .args(["--initial-cluster-state", state])
            .args(["--initial-cluster-token", &format!("t-{}", self.ips[0])])
            .args(["--heartbeat-interval", "50", "--election-timeout", "500"])
            .args(["--logger", "zap", "--log-outputs", "stderr"])
            .env_remove("ETCD_NAME")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("spawn etcd")
    }

    fn listen_urls(&self, i: usize) -> String {
        let own = format!("http://{}:2379", self.ips[i]);
        match &self.also_on {
            Some(extra) => format!("{own},http://{extra}:{}", 23790 + i),
            None => own,
        }
    }

    /// The members' client URLs on the address of
    /// [`start_also_on`](Self::start_also_on).
    pub fn endpoints_on(&self) -> Vec<String> {
        let extra = self.also_on.as_ref().expect("started with start_also_on");
        (0..self.ips.len()).map(|i| format!("http://{extra}:{}", 23790 + i)).collect()
    }

    /// Waits until every running member answers healthy (it has a leader).
    pub fn wait_healthy(&self, within: Duration) {
        let deadline = Instant::now() + within;
        for (i, m) in self.members.iter().enumerate() {
            if m.is_none() {
                continue;
            }
            loop {
                if self.healthy(i) {
                    break;
                }
                assert!(Instant::now() < deadline, "etcd member {i} not healthy within {within:?}\n{}", self.logs());
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }

    /// Whether member `i` has a leader (`etcdctl endpoint health`).
    pub fn healthy(&self, i: usize) -> bool {
        Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .args(["--endpoints", &self.endpoints[i], "--command-timeout", "1s", "endpoint", "health"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    /// Kills member `i` with SIGKILL.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut m) = self.members[i].take() {
            let _ = m.kill();
            let _ = m.wait();
        }
    }

    /// Starts member `i` again on its data.
    pub fn restart(&mut self, i: usize) {
        assert!(self.members[i].is_none(), "member {i} runs");
        let child = self.spawn(i, "existing");
        self.members[i] = Some(child);
    }

    /// `etcdctl` against the cluster (its stdout).
    pub fn ctl(&self, args: &[&str]) -> String {
        let out = Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .args(["--endpoints", &self.endpoints.join(","), "--command-timeout", "5s"])
            .args(args)
            .output()
            .expect("run etcdctl");
        assert!(out.status.success(), "etcdctl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The members' logs, last lines.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        for i in 0..self.ips.len() {
            let text = std::fs::read_to_string(self.dir.path().join(format!("m{i}.log"))).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            out.push_str(&format!("--- etcd m{i} ---\n{}\n", lines[lines.len().saturating_sub(15)..].join("\n")));
        }
        out
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
    }
}

fn which(cmd: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?.to_str()?.split(':').map(|d| PathBuf::from(d).join(cmd)).find(|p| p.is_file())
}
