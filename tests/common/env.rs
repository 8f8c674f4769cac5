//! [`TestEnv`]: one real `flotilla master` and three real `flotilla agent`
//! processes (the binary cargo built for this test run) in a temp dir, with
//! their logs in files, torn down in the right order when the env is dropped.
//!
//! [`TestEnv::start_sim`] starts the same real master with N simulated agents
//! instead ([`flotilla::bench::sim::Fleet`], in the test process: the real
//! protocol over real TCP, a fake process layer), for tests of the master
//! under load and under agent faults (a slow reader, a half-open link).
//!
//! Tests run as parallel threads of one process, so every env gets its own
//! loopback IPs (127.0.K.11/12/13) and its own block of 200 instance ports;
//! K and the block come from a per-process counter mixed with the pid, so two
//! test processes on one machine are unlikely to collide either.

use std::fs::{File, OpenOptions};
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use flotilla::bench::sim::{Fleet, FleetConfig, Latency};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;

use super::procfs;

/// A client that sends `token` with every request.
pub fn client_with_token(token: &str) -> reqwest::Client {
    let mut headers = reqwest::header::HeaderMap::new();
    let value = reqwest::header::HeaderValue::from_str(&format!("Bearer {token}")).expect("token header");
    headers.insert(reqwest::header::AUTHORIZATION, value);
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(90))
        .default_headers(headers)
        .build()
        .expect("client")
}

/// How many agents every env runs.
pub const AGENTS: usize = 3;

static NEXT_SLOT: AtomicU32 = AtomicU32::new(0);

/// The node id prefix of simulated agents (`sim-1`, `sim-2`, ...).
pub const SIM_PREFIX: &str = "sim-";

/// A master and its agents, ready (every node `Ready`) once `start` returns.
pub struct TestEnv {
    pub name: String,
    /// `http://127.0.0.1:PORT/api/v1`
    pub api: String,
    /// Sends the master's first API token (`--init`) with every request.
    pub client: reqwest::Client,
    /// That token.
    pub token: String,
    /// A join token every agent of this env enrolls with (real ones on
    /// their first start, simulated ones at each fleet's start).
    pub join_token: String,
    /// The agents' addresses, node-1 first.
    pub agent_ips: Vec<String>,
    /// The instance port range every agent was given.
    pub port_range: (u16, u16),
    root: Option<tempfile::TempDir>,
    pub(super) root_path: PathBuf,
    pub(super) master: Option<Child>,
    pub(super) agents: Vec<Child>,
    /// `127.0.0.1:0` at first; the real ports once the master listened, so a
    /// restarted master comes back on the same ones.
    http_addr: String,
    pub(super) agent_addr: String,
    master_env: Vec<(String, String)>,
    /// The master's `--config` file, if the test wrote one.
    pub(super) master_config: Option<PathBuf>,
    /// Extra command-line flags per agent (index 1..=3).
    agent_flags: Vec<(usize, String)>,
    /// How many nodes `wait_ready` waits for.
    nodes: usize,
    /// The simulated agents of [`TestEnv::start_sim`] (none with real agents).
    pub fleet: Option<Fleet>,
    /// Several masters on etcd ([`TestEnv::start_ha`], `ha_env.rs`): each
    /// one's API and agent addresses (master 0 first; empty otherwise),
    /// and the processes of masters 1.. (master 0 is `master`).
    pub(super) master_addrs: Vec<(String, String)>,
    pub(super) others: Vec<Option<Child>>,
    /// Master 0's network namespace and config, when not the host's and
    /// the env's (`HaLayout`).
    pub(super) first_netns: Option<String>,
    pub(super) first_config: Option<PathBuf>,
}

impl TestEnv {
    /// Starts a master and three agents and waits until the nodes are Ready.
    pub async fn start(name: &str) -> TestEnv {
        TestEnv::start_with(name, &[]).await
    }

    /// Like [`TestEnv::start`], with extra environment variables for the
    /// master (e.g. `FLOTILLA_MASTER_MAX_UPLOAD_BYTES`).
    pub async fn start_with(name: &str, master_env: &[(&str, &str)]) -> TestEnv {
        TestEnv::start_full(name, master_env, &[]).await
    }

    /// Like [`TestEnv::start`], with an extra flag for agent `node` (1..=3),
    /// e.g. `--no-cgroups`.
    pub async fn start_with_agent_flag(name: &str, node: usize, flag: &str) -> TestEnv {
        TestEnv::start_full(name, &[], &[(node, flag)]).await
    }

    /// Like [`TestEnv::start`], with extra flags for agents (`(node, flag)`,
    /// node 1..=3; a node may have several).
    pub async fn start_with_agent_flags(name: &str, flags: &[(usize, &str)]) -> TestEnv {
        TestEnv::start_full(name, &[], flags).await
    }

    /// Like [`TestEnv::start_with`], with the master's agent listener on
    /// `ip` instead of 127.0.0.1 (an address agents in another network
    /// namespace can reach; the three agents here dial it too).
    pub async fn start_listening_on(name: &str, master_env: &[(&str, &str)], ip: &str) -> TestEnv {
        let mut env = TestEnv::new(name, master_env, &[], AGENTS, ip, None).await;
        for i in 1..=AGENTS {
            let agent = env.spawn_agent(i);
            env.agents.push(agent);
        }
        env.wait_ready().await;
        env
    }

    /// A master started with `config` as its `--config` file and its agent
    /// listener on every interface (node pools' agents dial it from their
    /// network namespaces), with `agents` agents of its own (0..=3).
    pub async fn start_with_config(name: &str, master_env: &[(&str, &str)], config: &str, agents: usize) -> TestEnv {
        let mut env = TestEnv::new(name, master_env, &[], agents, "0.0.0.0", Some(config)).await;
        for i in 1..=agents {
            let agent = env.spawn_agent(i);
            env.agents.push(agent);
        }
        env.wait_ready().await;
        env
    }

    /// A master whose store is on `etcd` (under the prefix `/<name>/`),
    /// and three agents.
    pub async fn start_on_etcd(name: &str, etcd: &super::etcd::EtcdCluster) -> TestEnv {
        let config = etcd_config(name, etcd);
        let mut env = TestEnv::new(name, &[], &[], AGENTS, "127.0.0.1", Some(&config)).await;
        for i in 1..=AGENTS {
            let agent = env.spawn_agent(i);
            env.agents.push(agent);
        }
        env.wait_ready().await;
        env
    }

    /// Another master on this env's config (its store on etcd), with a data
    /// dir and loopback ports of its own, logging to `<name>.log`; it
    /// writes `<dir>/endpoints.json` once it leads and listens.
    pub fn spawn_other_master(&self, name: &str) -> (Child, PathBuf) {
        let dir = self.root_path.join(name);
        std::fs::create_dir_all(&dir).expect("another master's dir");
        let (out, err) = self.log(&format!("{name}.log"));
        let mut cmd = self.command();
        cmd.arg("master")
            .arg("--data-dir")
            .arg(&dir)
            .args(["--http-addr", "127.0.0.1:0", "--agent-addr", "127.0.0.1:0", "--name", name])
            .arg("--endpoints-file")
            .arg(dir.join("endpoints.json"))
            .args(self.master_config.iter().flat_map(|p| [std::ffi::OsStr::new("--config"), p.as_os_str()]))
            .stdout(out)
            .stderr(err);
        (cmd.spawn().expect("spawn another master"), dir)
    }

    /// A log file of this env (`master.log`, `agent-1.log`, ...).
    pub fn log_file(&self, name: &str) -> String {
        std::fs::read_to_string(self.root_path.join(name)).unwrap_or_default()
    }

    async fn start_full(name: &str, master_env: &[(&str, &str)], agent_flags: &[(usize, &str)]) -> TestEnv {
        let mut env = TestEnv::new(name, master_env, agent_flags, AGENTS, "127.0.0.1", None).await;
        for i in 1..=AGENTS {
            let agent = env.spawn_agent(i);
            env.agents.push(agent);
        }
        env.wait_ready().await;
        env
    }

    /// A real master with `agents` simulated agents (`sim-1`...) in this
    /// process, no latency; ready once every node is `Ready`.
    pub async fn start_sim(name: &str, master_env: &[(&str, &str)], agents: usize) -> TestEnv {
        TestEnv::start_sim_with(name, master_env, agents, Latency::default()).await
    }

    /// Like [`TestEnv::start_sim`], with the fake processes' latencies.
    pub async fn start_sim_with(name: &str, master_env: &[(&str, &str)], agents: usize, latency: Latency) -> TestEnv {
        let mut env = TestEnv::new(name, master_env, &[], agents, "127.0.0.1", None).await;
        env.fleet = Some(Fleet::start(&env.fleet_config(agents, latency)));
        env.wait_ready().await;
        env
    }

    /// How a fleet of `agents` simulated agents dials this env's master;
    /// another fleet with the same prefix has the same node ids.
    pub fn fleet_config(&self, agents: usize, latency: Latency) -> FleetConfig {
        FleetConfig {
            masters: flotilla::agent::masters::Masters::parse(&self.master_list())
                .expect("the masters' agent addresses"),
            agents,
            prefix: SIM_PREFIX.into(),
            // Simulated instances bind nothing: a wide range costs nothing.
            port_range: (20000, 60000),
            latency,
            join_token: self.join_token.clone(),
        }
    }

    /// The master's agent listener.
    pub fn agent_socket(&self) -> SocketAddr {
        self.agent_addr.parse().expect("agent address")
    }

    /// The simulated agents; panics for an env of real agents.
    pub fn fleet(&self) -> &Fleet {
        self.fleet.as_ref().expect("an env of simulated agents (TestEnv::start_sim)")
    }

    /// The temp dir, master started and listening, no agent yet.
    async fn new(
        name: &str,
        master_env: &[(&str, &str)],
        agent_flags: &[(usize, &str)],
        nodes: usize,
        agent_listen_ip: &str,
        config: Option<&str>,
    ) -> TestEnv {
        TestEnv::new_with(name, master_env, agent_flags, nodes, agent_listen_ip, config, 1, None).await
    }

    /// [`TestEnv::new`] with `masters` masters (more than one: on fixed
    /// addresses 127.0.K.1.., the first leading, the others waiting).
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn new_with(
        name: &str,
        master_env: &[(&str, &str)],
        agent_flags: &[(usize, &str)],
        nodes: usize,
        agent_listen_ip: &str,
        config: Option<&str>,
        masters: usize,
        layout: Option<super::ha_env::HaLayout>,
    ) -> TestEnv {
        let slot = NEXT_SLOT.fetch_add(1, Ordering::SeqCst).wrapping_add(std::process::id().wrapping_mul(37));
        let k = slot % 250 + 1;
        let low = 20000 + (slot % 200) as u16 * 200;
        let root = tempfile::Builder::new().prefix(&format!("flotilla-{name}-")).tempdir().expect("temp dir");
        // Instances run as users of their own (the agent is root): they must
        // reach their dirs.
        std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod temp dir");
        let root_path = std::fs::canonicalize(root.path()).expect("resolve temp dir");
        std::fs::create_dir_all(root_path.join("master")).expect("master dir");
        let mut env = TestEnv {
            name: name.to_string(),
            api: String::new(),
            client: reqwest::Client::new(),
            token: String::new(),
            join_token: String::new(),
            agent_ips: (1..=AGENTS).map(|i| format!("127.0.{k}.{}", 10 + i)).collect(),
            port_range: (low, low + 199),
            root: Some(root),
            root_path,
            master: None,
            agents: Vec::new(),
            http_addr: "127.0.0.1:0".into(),
            agent_addr: format!("{agent_listen_ip}:0"),
            master_env: master_env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            master_config: None,
            agent_flags: agent_flags.iter().map(|(i, f)| (*i, f.to_string())).collect(),
            nodes,
            fleet: None,
            master_addrs: Vec::new(),
            others: Vec::new(),
            first_netns: None,
            first_config: None,
        };
        if masters > 1 {
            env.master_addrs =
                (1..=masters).map(|i| (format!("127.0.{k}.{i}:7070"), format!("127.0.{k}.{i}:7071"))).collect();
        }
        if let Some(text) = config {
            let path = env.root_path.join("master.toml");
            std::fs::write(&path, text).expect("write the master's config file");
            env.master_config = Some(path);
        }
        if let Some(l) = layout {
            assert_eq!(l.addrs.len(), masters, "an address per master");
            env.master_addrs = l.addrs;
            env.first_netns = l.netns;
            if let Some(ips) = l.agent_ips {
                env.agent_ips = ips;
            }
            if let Some(text) = l.first_config {
                let path = env.root_path.join("master-0.toml");
                std::fs::write(&path, text).expect("write master 0's config file");
                env.first_config = Some(path);
            }
        }
        if masters > 1 {
            (env.http_addr, env.agent_addr) = env.master_addrs[0].clone();
        }
        env.master = Some(env.spawn_master());
        env.wait_endpoints().await;
        // Written before the master listens, so before the endpoints file.
        let token_file = env.root_path.join("master").join("token");
        env.token = std::fs::read_to_string(&token_file)
            .unwrap_or_else(|e| panic!("the master's first token {}: {e}", token_file.display()))
            .trim()
            .to_string();
        env.client = client_with_token(&env.token);
        env.join_token = env.make_join_token(nodes.max(AGENTS) as u32 * 2 + 10).await;
        for i in 1..masters {
            let other = env.spawn_other(i);
            env.others.push(Some(other));
        }
        env
    }

    /// A join token for `uses` enrollments, made through the API.
    pub async fn make_join_token(&self, uses: u32) -> String {
        let body = serde_json::json!({ "name": "test", "uses": uses });
        let resp =
            self.client.post(format!("{}/join-tokens", self.api)).json(&body).send().await.expect("POST /join-tokens");
        let status = resp.status();
        let v: Value = resp.json().await.expect("join token answer");
        assert_eq!(status, reqwest::StatusCode::CREATED, "making a join token: {v}");
        v["secret"].as_str().expect("join token secret").to_string()
    }

    /// SIGKILLs agent `i` (1..=3): its instances keep running, as after a
    /// crash of the agent or a lost node.
    pub fn kill_agent(&mut self, i: usize) {
        let a = &mut self.agents[i - 1];
        let _ = a.kill();
        let _ = a.wait();
    }

    /// Waits up to `within` for agent `i` to exit (after a signal); its
    /// exit status, or `None` if it still runs.
    pub fn wait_agent_exit(&mut self, i: usize, within: std::time::Duration) -> Option<std::process::ExitStatus> {
        let deadline = std::time::Instant::now() + within;
        loop {
            if let Ok(Some(status)) = self.agents[i - 1].try_wait() {
                return Some(status);
            }
            if std::time::Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }

    /// Waits (at most `within`) for the master to exit on its own; answers
    /// its exit status, or `None` if it still runs.
    pub async fn wait_master_exit(&mut self, within: std::time::Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(Ok(Some(status))) = self.master.as_mut().map(|m| m.try_wait()) {
                self.master = None;
                return Some(status);
            }
            if Instant::now() > deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Starts agent `i` again on its data dir, after [`TestEnv::kill_agent`].
    pub async fn restart_agent(&mut self, i: usize) {
        // One still running is killed first: replaced untracked, it would
        // outlive the test (nothing else stops it).
        if matches!(self.agents[i - 1].try_wait(), Ok(None)) {
            self.kill_agent(i);
        }
        // Until the master has seen the old link end: else `wait_ready`
        // below takes the dead connection for the new one, and a command
        // sent at once fails "not connected" (a CI run hit it).
        let node = format!("node-{i}");
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if let Ok(r) = self.client.get(format!("{}/nodes", self.api)).send().await
                && let Ok(v) = r.json::<Value>().await
                && v["nodes"].as_array().is_some_and(|a| a.iter().any(|n| n["id"] == node && n["connected"] == false))
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.agents[i - 1] = self.spawn_agent(i);
        self.wait_ready().await;
    }

    /// Sets (or replaces) a master environment variable for its next start.
    pub fn set_master_env(&mut self, key: &str, value: &str) {
        self.master_env.retain(|(k, _)| k != key);
        self.master_env.push((key.to_string(), value.to_string()));
    }

    /// SIGTERM the master, wait for it, start it again on the same data dir
    /// and ports, and wait until the agents (which reconnect by themselves)
    /// are Ready again.
    pub async fn restart_master(&mut self) {
        let mut master = self.master.take().expect("the master is running");
        signal(&master, Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match master.try_wait() {
                Ok(Some(_)) => break,
                Ok(None) if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(50)).await,
                _ => {
                    let _ = master.kill();
                    let _ = master.wait();
                    panic!("the master did not stop within 30 s of SIGTERM\n{}", self.log_tails());
                }
            }
        }
        let _ = std::fs::remove_file(self.endpoints_file());
        let api_before = self.api.clone();
        self.master = Some(self.spawn_master());
        self.wait_endpoints().await;
        assert_eq!(self.api, api_before, "the restarted master must listen on the same address");
        self.wait_ready().await;
    }

    /// SIGKILLs the master (no shutdown at all, as a crash or a power cut
    /// would) and waits until it is gone. [`TestEnv::start_master_again`]
    /// brings it back.
    pub fn kill_master(&mut self) {
        if let Some(mut m) = self.master.take() {
            let _ = m.kill();
            let _ = m.wait();
        }
    }

    /// Starts the master again on its data dir and ports after
    /// [`TestEnv::kill_master`]; returns once it listens, without waiting
    /// for the agents to reconnect.
    pub async fn start_master_again(&mut self) {
        assert!(self.master.is_none(), "the master is still running");
        let _ = std::fs::remove_file(self.endpoints_file());
        let api_before = self.api.clone();
        self.master = Some(self.spawn_master());
        self.wait_endpoints().await;
        assert_eq!(self.api, api_before, "the restarted master must listen on the same address");
    }

    /// Agent `i`'s data dir (its certificate is in `tls/`).
    pub fn agent_dir(&self, i: usize) -> PathBuf {
        self.root_path.join(format!("agent-{i}"))
    }

    /// A `flotilla agent` beside this env's: node `node_id`, data dir and
    /// log (`<name>.log`) of its own, on agent 1's address, enrolling
    /// with `join_token` (none: no token at all). The caller owns it.
    pub fn spawn_extra_agent(&self, name: &str, node_id: &str, join_token: Option<&str>) -> (Child, PathBuf) {
        let mut cmd = self.extra_agent_command(name, node_id, &self.agent_ips[0], join_token, None);
        (cmd.spawn().expect("spawn an extra agent"), self.root_path.join(format!("{name}.log")))
    }

    /// The command of [`TestEnv::spawn_extra_agent`], on `address`, run
    /// inside the network namespace `netns` when one is given (by
    /// `nsenter --net`, which switches only that namespace and execs it:
    /// the child's pid is the agent's, and it sees the cgroup tree).
    pub fn extra_agent_command(
        &self,
        name: &str,
        node_id: &str,
        address: &str,
        join_token: Option<&str>,
        netns: Option<&str>,
    ) -> Command {
        let (out, err) = self.log(&format!("{name}.log"));
        let mut cmd = self.command_in(netns);
        cmd.arg("agent")
            .args(["--node-id", node_id, "--master", &self.agent_addr, "--address", address])
            .arg("--data-dir")
            .arg(self.root_path.join(name))
            .args(["--port-range", &format!("{}-{}", self.port_range.0, self.port_range.1)])
            .env("FLOTILLA_AGENT_RECONNECT_MAX_BACKOFF", "200ms")
            .arg("--stop-instances-on-exit")
            .stdout(out)
            .stderr(err);
        if let Some(t) = join_token {
            cmd.env("FLOTILLA_AGENT_JOIN_TOKEN", t);
        }
        cmd
    }

    /// The master's data dir (its RocksDB is `db/` in it).
    pub fn master_dir(&self) -> PathBuf {
        self.root_path.join("master")
    }

    fn endpoints_file(&self) -> PathBuf {
        self.root_path.join("master").join("endpoints.json")
    }

    pub(super) fn log(&self, name: &str) -> (File, File) {
        let f = OpenOptions::new().create(true).append(true).open(self.root_path.join(name)).expect("log file");
        let g = f.try_clone().expect("log file clone");
        (f, g)
    }

    pub(super) fn command(&self) -> Command {
        self.command_in(None)
    }

    /// The binary, run in network namespace `netns` if given.
    pub(super) fn command_in(&self, netns: Option<&str>) -> Command {
        let mut cmd = match netns {
            Some(ns) => {
                let mut c = Command::new("nsenter");
                c.arg(format!("--net=/run/netns/{ns}")).arg(env!("CARGO_BIN_EXE_flotilla"));
                c
            }
            None => Command::new(env!("CARGO_BIN_EXE_flotilla")),
        };
        self.scrub(&mut cmd);
        cmd
    }

    /// Settings come from the flags of each command, not from whoever ran
    /// the tests.
    fn scrub(&self, cmd: &mut Command) {
        for (k, _) in std::env::vars() {
            if k.starts_with("FLOTILLA_") {
                cmd.env_remove(k);
            }
        }
        cmd.env("RUST_LOG", std::env::var("FLOTILLA_TEST_LOG").unwrap_or_else(|_| "info".into()));
        cmd.stdin(Stdio::null());
    }

    pub(super) fn spawn_master(&self) -> Child {
        let (out, err) = self.log("master.log");
        let mut cmd = self.command_in(self.first_netns.as_deref());
        let config = self.first_config.as_ref().or(self.master_config.as_ref());
        cmd.arg("master")
            .arg("--data-dir")
            .arg(self.root_path.join("master"))
            .args(["--http-addr", &self.http_addr, "--agent-addr", &self.agent_addr])
            .arg("--endpoints-file")
            .arg(self.endpoints_file())
            .arg("--init")
            .arg("--token-file")
            .arg(self.root_path.join("master").join("token"))
            .args(config.iter().flat_map(|p| [std::ffi::OsStr::new("--config"), p.as_os_str()]))
            .envs(self.master_env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdout(out)
            .stderr(err);
        cmd.spawn().expect("spawn the master")
    }

    pub(super) fn spawn_agent(&self, i: usize) -> Child {
        let (out, err) = self.log(&format!("agent-{i}.log"));
        let mut cmd = self.command();
        cmd.arg("agent")
            .args([
                "--node-id",
                &format!("node-{i}"),
                "--master",
                &self.master_list(),
                "--address",
                &self.agent_ips[i - 1],
            ])
            .arg("--data-dir")
            .arg(self.root_path.join(format!("agent-{i}")))
            .args(["--port-range", &format!("{}-{}", self.port_range.0, self.port_range.1)])
            .arg("--stop-instances-on-exit")
            // Used at its first start only; later ones connect with the
            // certificate kept in its data dir.
            .env("FLOTILLA_AGENT_JOIN_TOKEN", &self.join_token)
            .args(self.agent_flags.iter().filter(|(n, _)| *n == i).map(|(_, f)| f.as_str()))
            .stdout(out)
            .stderr(err);
        cmd.spawn().expect("spawn an agent")
    }

    async fn wait_endpoints(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(bytes) = std::fs::read(self.endpoints_file())
                && let Ok(v) = serde_json::from_slice::<Value>(&bytes)
            {
                let api = v["api_url"].as_str().expect("api_url").to_string();
                self.agent_addr = v["agent_addr"].as_str().expect("agent_addr").to_string();
                self.http_addr = api.trim_start_matches("http://").to_string();
                self.api = format!("{api}/api/v1");
                return;
            }
            if let Some(Ok(Some(status))) = self.master.as_mut().map(|m| m.try_wait()) {
                panic!("the master exited at start ({status})\n{}", self.log_tails());
            }
            assert!(Instant::now() < deadline, "no endpoints file within 30 s\n{}", self.log_tails());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Every instance directory on every agent.
    pub fn agent_instance_dirs(&self) -> Vec<std::path::PathBuf> {
        let mut out = Vec::new();
        for i in 1..=self.agents.len() {
            if let Ok(rd) = std::fs::read_dir(self.root_path.join(format!("agent-{i}/instances"))) {
                out.extend(rd.filter_map(|e| e.ok()).map(|e| e.path()));
            }
        }
        out.sort();
        out
    }

    /// Waits until `GET /nodes` shows every agent connected and Ready.
    pub async fn wait_ready(&self) {
        let n = self.nodes;
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut last = Value::Null;
        while Instant::now() < deadline {
            if let Ok(r) = self.client.get(format!("{}/nodes", self.api)).send().await
                && let Ok(v) = r.json::<Value>().await
            {
                let ready = v["nodes"]
                    .as_array()
                    .map(|a| a.iter().filter(|n| n["status"] == "Ready" && n["connected"] == true).count())
                    .unwrap_or(0);
                if ready == n {
                    return;
                }
                last = v;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("{n} nodes not Ready within 30 s; last GET /nodes: {last:#}\n{}", self.log_tails());
    }

    /// The last lines of the master's and agents' logs, and of every
    /// instance's logs: printed when a test fails.
    /// The master's log (this run's, or all of them if appended).
    pub fn master_log(&self) -> String {
        std::fs::read_to_string(self.root_path.join("master.log")).unwrap_or_default()
    }

    /// Agent `i`'s log (1..=3).
    pub fn agent_log(&self, i: usize) -> String {
        std::fs::read_to_string(self.root_path.join(format!("agent-{i}.log"))).unwrap_or_default()
    }

    /// The master's process id.
    pub fn master_pid(&self) -> u32 {
        self.master.as_ref().expect("the master is running").id()
    }

    /// Agent `i`'s process id (1..=3).
    pub fn agent_pid(&self, i: usize) -> u32 {
        self.agents[i - 1].id()
    }

    /// Sends `sig` to the master.
    pub fn signal_master(&self, sig: Signal) {
        signal(self.master.as_ref().expect("the master is running"), sig);
    }

    /// Sends `sig` to agent `i` (1..=3).
    pub fn signal_agent(&self, i: usize, sig: Signal) {
        signal(&self.agents[i - 1], sig);
    }

    pub fn log_tails(&self) -> String {
        let mut out = String::new();
        let mut files = vec![self.root_path.join("master.log")];
        files.extend((1..=self.others.len()).map(|i| self.root_path.join(format!("master-{i}.log"))));
        files.extend((1..=self.agents.len()).map(|i| self.root_path.join(format!("agent-{i}.log"))));
        for f in files {
            out.push_str(&tail(&f, 60));
        }
        for i in 1..=self.agents.len() {
            let instances = self.root_path.join(format!("agent-{i}/instances"));
            let Ok(dirs) = std::fs::read_dir(&instances) else { continue };
            for d in dirs.flatten() {
                let Ok(logs) = std::fs::read_dir(d.path().join("logs")) else { continue };
                for l in logs.flatten() {
                    out.push_str(&tail(&l.path(), 10));
                }
            }
        }
        out
    }
}

fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| format!("(unreadable: {e})"));
    let all: Vec<&str> = text.lines().collect();
    let from = all.len().saturating_sub(lines);
    format!("----- {} (last {lines} lines) -----\n{}\n", path.display(), all[from..].join("\n"))
}

fn signal(child: &Child, sig: Signal) {
    let _ = kill(Pid::from_raw(child.id() as i32), sig);
}

/// Waits for `child` up to `limit`, then SIGKILLs it. True when it exited
/// by itself. Blocking: this runs in `Drop`, which cannot be async, when the
/// test's runtime has nothing left to run.
fn wait_or_kill(child: &mut Child, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    false
}

impl Drop for TestEnv {
    /// Agents first (each stops its instances), then the master; SIGKILL
    /// whatever does not stop, and any process still running in the env's
    /// dir. Prints the logs when the test failed.
    fn drop(&mut self) {
        let failed = std::thread::panicking();
        let mut problems = Vec::new();
        // Simulated agents stop dialing once their fleet is gone.
        drop(self.fleet.take());
        for a in &self.agents {
            signal(a, Signal::SIGTERM);
        }
        for (i, a) in self.agents.iter_mut().enumerate() {
            if !wait_or_kill(a, Duration::from_secs(30)) {
                problems.push(format!("agent {} did not stop within 30 s of SIGTERM", i + 1));
            }
        }
        for m in self.others.iter_mut().flatten() {
            signal(m, Signal::SIGCONT);
            signal(m, Signal::SIGTERM);
            if !wait_or_kill(m, Duration::from_secs(15)) {
                problems.push("a waiting master did not stop within 15 s of SIGTERM".into());
            }
        }
        if let Some(m) = self.master.as_mut() {
            signal(m, Signal::SIGCONT);
            signal(m, Signal::SIGTERM);
            if !wait_or_kill(m, Duration::from_secs(15)) {
                problems.push("the master did not stop within 15 s of SIGTERM".into());
            }
        }
        // Agents run with --stop-instances-on-exit: nothing of the env may
        // still run. Kill leftovers so no test leaves a process behind.
        let leftovers = procfs::pids_with_cwd_under(&self.root_path);
        for pid in &leftovers {
            problems.push(format!("process {pid} ({:?}) still running after the agents exited", procfs::cmdline(*pid)));
            let _ = kill(Pid::from_raw(*pid as i32), Signal::SIGKILL);
        }
        if failed || !problems.is_empty() {
            eprintln!("===== env {} ({}) =====\n{}", self.name, self.root_path.display(), self.log_tails());
            if std::env::var_os("FLOTILLA_TEST_KEEP").is_some()
                && let Some(root) = self.root.take()
            {
                eprintln!("kept {}", root.keep().display());
            }
        }
        if !problems.is_empty() && !failed {
            panic!("teardown of env {}: {}", self.name, problems.join("; "));
        }
    }
}

/// A master's config file putting its store on `etcd` under `/<name>/`.
pub fn etcd_config(name: &str, etcd: &super::etcd::EtcdCluster) -> String {
    let endpoints: Vec<String> = etcd.endpoints.iter().map(|e| format!("{e:?}")).collect();
    // Every takeover in the tests compares the view it boots from with the store.
    format!(
        "store = \"etcd\"\n\n[etcd]\nendpoints = [{}]\nprefix = \"/{name}/\"\ntakeover = \"checked\"\n",
        endpoints.join(", ")
    )
}
