//! [`TestEnv::start_ha`]: several real masters on real etcd members, on
//! fixed loopback addresses (127.0.K.1.., API port 7070, agent port 7071),
//! and three real agents that know all of them (`--master A,B,C`). Master
//! 0 is started first and leads; the others wait. Helpers find the leader,
//! point the env's API at it, and signal or kill one master.

use std::process::{Child, ExitStatus};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;

use super::TestEnv;
use super::etcd::EtcdCluster;

/// Where [`TestEnv::start_ha_laid_out`] runs its masters.
pub struct HaLayout {
    /// Each master's API and agent address, master 0 first.
    pub addrs: Vec<(String, String)>,
    /// Master 0 runs in this network namespace.
    pub netns: Option<String>,
    /// Master 0's config text (the others get the env's).
    pub first_config: Option<String>,
    /// The agents' addresses (they dial from them), if not loopback ones.
    pub agent_ips: Option<Vec<String>>,
}

impl TestEnv {
    /// `masters` masters (2 or 3) on `etcd` and three agents, Ready.
    pub async fn start_ha(name: &str, etcd: &EtcdCluster, masters: usize) -> TestEnv {
        let config = super::env::etcd_config(name, etcd);
        TestEnv::start_ha_laid_out(name, &config, masters, None).await
    }

    /// [`start_ha`](Self::start_ha) with the masters where `layout` puts
    /// them, master 0 with its own config (`config` for the others).
    pub async fn start_ha_laid_out(name: &str, config: &str, masters: usize, layout: Option<HaLayout>) -> TestEnv {
        let mut env = TestEnv::new_with(name, &[], &[], 3, "127.0.0.1", Some(config), masters, layout).await;
        for i in 1..=3 {
            let agent = env.spawn_agent(i);
            env.agents.push(agent);
        }
        env.wait_ready().await;
        env
    }

    /// `masters` masters on `etcd` and `agents` simulated agents that know
    /// all of them (they find the leader as real agents do), Ready.
    pub async fn start_ha_sim(name: &str, etcd: &EtcdCluster, masters: usize, agents: usize) -> TestEnv {
        let config = super::env::etcd_config(name, etcd);
        let mut env = TestEnv::new_with(name, &[], &[], agents, "127.0.0.1", Some(&config), masters, None).await;
        env.fleet = Some(flotilla::bench::sim::Fleet::start(&env.fleet_config(agents, Default::default())));
        env.wait_ready().await;
        env
    }

    /// [`start_ha`](Self::start_ha), then waits until master 0 leads and
    /// every other serves reads as a follower.
    pub async fn start_ha_serving(name: &str, etcd: &EtcdCluster, masters: usize) -> TestEnv {
        let mut env = TestEnv::start_ha(name, etcd, masters).await;
        let (leader, h) = env.follow_leader(None, Duration::from_secs(10)).await;
        assert_eq!(leader, 0, "master 0 started first and leads: {h:#}");
        for i in 1..masters {
            env.serving_follower(i).await;
        }
        env
    }

    /// Every master's agent address, comma-separated (the agents' `--master`).
    pub fn master_list(&self) -> String {
        if self.master_addrs.is_empty() {
            return self.agent_addr.clone();
        }
        self.master_addrs.iter().map(|(_, a)| a.as_str()).collect::<Vec<_>>().join(",")
    }

    /// Master `i` (1..) started, waiting to lead, logging to `master-<i>.log`.
    pub(super) fn spawn_other(&self, i: usize) -> Child {
        let dir = self.root_path.join(format!("master-{i}"));
        std::fs::create_dir_all(&dir).expect("a master's dir");
        let (out, err) = self.log(&format!("master-{i}.log"));
        let (http, agent) = &self.master_addrs[i];
        let mut cmd = self.command();
        cmd.arg("master")
            .arg("--data-dir")
            .arg(&dir)
            .args(["--http-addr", http, "--agent-addr", agent, "--name", &format!("m{i}")])
            .args(self.master_config.iter().flat_map(|p| [std::ffi::OsStr::new("--config"), p.as_os_str()]))
            .stdout(out)
            .stderr(err);
        cmd.spawn().expect("spawn a master")
    }

    /// Master `i`'s API (`http://127.0.K.i+1:7070/api/v1`).
    pub fn ha_api(&self, i: usize) -> String {
        format!("http://{}/api/v1", self.master_addrs[i].0)
    }

    /// Master `i`'s `GET /health`, if it answers within a second.
    pub async fn ha_health(&self, i: usize) -> Option<Value> {
        let r = self.client.get(format!("{}/health", self.ha_api(i))).timeout(Duration::from_secs(1)).send().await;
        r.ok()?.json().await.ok()
    }

    /// The master that says it leads, with its health; waits up to `within`.
    pub async fn leader_within(&self, within: Duration) -> (usize, Value) {
        let deadline = Instant::now() + within;
        loop {
            for i in 0..self.master_addrs.len() {
                if let Some(h) = self.ha_health(i).await
                    && h["role"] == "leader"
                {
                    return (i, h);
                }
            }
            assert!(Instant::now() < deadline, "no master leads within {within:?}\n{}", self.log_tails());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Points the env's API at the master that leads now, other than `not`.
    pub async fn follow_leader(&mut self, not: Option<usize>, within: Duration) -> (usize, Value) {
        let deadline = Instant::now() + within;
        loop {
            let (i, h) = self.leader_within(deadline.saturating_duration_since(Instant::now())).await;
            if Some(i) != not {
                self.api = self.ha_api(i);
                return (i, h);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn ha_child(&mut self, i: usize) -> &mut Option<Child> {
        if i == 0 { &mut self.master } else { &mut self.others[i - 1] }
    }

    /// Master `i`'s process id.
    pub fn ha_pid(&mut self, i: usize) -> u32 {
        self.ha_child(i).as_ref().expect("the master runs").id()
    }

    /// Sends `sig` to master `i` (SIGSTOP pauses it, SIGCONT resumes it).
    pub fn signal_ha(&mut self, i: usize, sig: Signal) {
        let pid = self.ha_pid(i);
        let _ = kill(Pid::from_raw(pid as i32), sig);
    }

    /// Master `i`'s exit, if it exits within `within`.
    pub async fn ha_exit_within(&mut self, i: usize, within: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(Ok(Some(status))) = self.ha_child(i).as_mut().map(|m| m.try_wait()) {
                *self.ha_child(i) = None;
                return Some(status);
            }
            if Instant::now() > deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The config file the master starts with from now on.
    pub fn use_master_config(&mut self, text: &str) {
        let path = self.root_path.join("master.toml");
        std::fs::write(&path, text).expect("write the master's config file");
        self.master_config = Some(path);
    }

    /// Starts master `i` again (after it exited): it waits as a follower.
    pub fn respawn_ha(&mut self, i: usize) {
        assert!(self.ha_child(i).is_none(), "master {i} still runs");
        let child = if i == 0 { self.spawn_master() } else { self.spawn_other(i) };
        *self.ha_child(i) = Some(child);
    }

    /// Master `i`'s data dir.
    pub fn ha_dir(&self, i: usize) -> std::path::PathBuf {
        if i == 0 { self.master_dir() } else { self.root_path.join(format!("master-{i}")) }
    }

    /// Waits until master `i` serves reads as a follower (its own view of
    /// the store loaded); its health.
    pub async fn serving_follower(&self, i: usize) -> Value {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(h) = self.ha_health(i).await
                && h["role"] == "follower"
                && h["applied_revision"].as_i64().is_some_and(|r| r > 0)
            {
                return h;
            }
            assert!(Instant::now() < deadline, "master {i} never served as a follower\n{}", self.ha_log(i));
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Master `i`'s log.
    pub fn ha_log(&self, i: usize) -> String {
        if i == 0 { self.master_log() } else { self.log_file(&format!("master-{i}.log")) }
    }
}
