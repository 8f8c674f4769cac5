//! `flotilla dev --ha`: three etcd members (Debian's `etcd`, election
//! settings fast enough for a laptop: heartbeat 20 ms, election 200 ms),
//! three masters on them (API ports 7070, 7072, 7074; agent ports 7071,
//! 7073, 7075 on 127.0.0.1), and agents that know all three. A master that
//! exits (killed to see a failover) is started again and waits as a
//! follower. Ctrl-C stops everything, etcd last, and removes `<data
//! dir>/ha` (every master's, agent's and member's data).

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::process::{Child, Command};

use super::{DevError, setup};

/// The members' client and peer ports on 127.0.0.1 (not etcd's default
/// 2379: a system etcd there must not be taken for one of ours).
const ETCD_PORTS: [(u16, u16); 3] = [(12379, 12380), (22379, 22380), (32379, 32380)];

/// The masters' API and agent ports on 127.0.0.1.
const MASTER_PORTS: [(u16, u16); 3] = [(7070, 7071), (7072, 7073), (7074, 7075)];

/// Ops and bytes per etcd transaction: the members are started with room
/// for them (`--max-txn-ops`, `--max-request-bytes` 2 MiB above), so a
/// group-commit round is one or a few transactions (BENCHMARKS.md, "A on
/// etcd": rounds in transactions of up to 2,048 placed 1.26× (pipelined)
/// to 1.46× (one by one) as fast as in etcd's default of 128).
const TXN_OPS: usize = 2048;
const TXN_BYTES: usize = 6 * 1024 * 1024;

/// What `--ha` runs.
pub struct Ha {
    /// The data dir given (`endpoints.json` goes there).
    pub base: PathBuf,
    /// `<data dir>/ha`: every master's, agent's and etcd member's data,
    /// made afresh and removed at the end.
    pub root: PathBuf,
    /// `<root>/etcd`: the members' data and logs.
    pub etcd_dir: PathBuf,
    /// The config file every master starts with (`store = "etcd"`).
    pub config: PathBuf,
}

impl Ha {
    /// Checks etcd is there and every port is free, makes `<base>/ha`
    /// afresh and writes the masters' config.
    pub fn prepare(base: &Path) -> Result<Ha, DevError> {
        let found = std::process::Command::new("etcd").arg("--version").output();
        if !found.is_ok_and(|o| o.status.success()) {
            return Err(DevError::Setup("--ha needs etcd (Debian's etcd-server; scripts/setup.sh installs it)".into()));
        }
        let ports = ETCD_PORTS.iter().chain(MASTER_PORTS.iter()).flat_map(|(a, b)| [*a, *b]);
        for port in ports {
            if std::net::TcpListener::bind(("127.0.0.1", port)).is_err() {
                return Err(DevError::Setup(format!(
                    "--ha needs 127.0.0.1:{port}, which is in use (another flotilla dev --ha?)"
                )));
            }
        }
        let root = base.join("ha");
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("master")).map_err(setup("creating <data dir>/ha"))?;
        let endpoints: Vec<String> = ETCD_PORTS.iter().map(|(c, _)| format!("\"http://127.0.0.1:{c}\"")).collect();
        let config = root.join("master-ha.toml");
        let text = format!(
            "store = \"etcd\"\n\n[etcd]\nendpoints = [{}]\nprefix = \"/flotilla-dev/\"\nmax_txn_ops = {TXN_OPS}\nmax_txn_bytes = {TXN_BYTES}\n",
            endpoints.join(", ")
        );
        std::fs::write(&config, text).map_err(setup("writing the masters' config"))?;
        Ok(Ha { base: base.to_path_buf(), etcd_dir: root.join("etcd"), root, config })
    }

    /// Starts the members, waits for their leader, then master 0 (which
    /// writes `internal` once it listens); what started is in `children`
    /// (stopped by the caller, whatever this answers).
    pub async fn start(
        &self,
        exe: &Path,
        internal: &Path,
        children: &mut Vec<(String, Child)>,
    ) -> Result<(), DevError> {
        for i in 0..3 {
            children.push((format!("etcd-{i}"), self.spawn_etcd(i)?));
        }
        self.wait_etcd(children).await?;
        children.push(("master-0".into(), self.spawn_master(exe, &self.root, 0, Some(internal))?));
        Ok(())
    }

    /// Every master's API URL.
    pub fn api_urls() -> Vec<String> {
        MASTER_PORTS.iter().map(|(h, _)| format!("http://127.0.0.1:{h}")).collect()
    }

    /// Every master's agent address, comma-separated (the agents' `--master`).
    pub fn agent_addrs() -> String {
        MASTER_PORTS.iter().map(|(_, a)| format!("127.0.0.1:{a}")).collect::<Vec<_>>().join(",")
    }

    /// Starts etcd member `i`.
    pub fn spawn_etcd(&self, i: usize) -> Result<Child, DevError> {
        let initial: Vec<String> =
            ETCD_PORTS.iter().enumerate().map(|(n, (_, p))| format!("m{n}=http://127.0.0.1:{p}")).collect();
        let (client, peer) = ETCD_PORTS[i];
        std::fs::create_dir_all(&self.etcd_dir).map_err(setup("creating etcd's dir"))?;
        let log = std::fs::File::create(self.etcd_dir.join(format!("m{i}.log"))).map_err(setup("etcd's log"))?;
        let err = log.try_clone().map_err(setup("etcd's log"))?;
        Command::new("etcd")
            .args(["--name", &format!("m{i}")])
            .arg("--data-dir")
            .arg(self.etcd_dir.join(format!("m{i}")))
            .args(["--listen-client-urls", &format!("http://127.0.0.1:{client}")])
            .args(["--advertise-client-urls", &format!("http://127.0.0.1:{client}")])
            .args(["--listen-peer-urls", &format!("http://127.0.0.1:{peer}")])
            .args(["--initial-advertise-peer-urls", &format!("http://127.0.0.1:{peer}")])
            .args(["--initial-cluster", &initial.join(",")])
            .args(["--initial-cluster-state", "new", "--initial-cluster-token", "flotilla-dev"])
            .args(["--heartbeat-interval", "20", "--election-timeout", "200"])
            .args(["--auto-compaction-retention", "1"])
            .args(["--max-txn-ops", &TXN_OPS.to_string()])
            .args(["--max-request-bytes", &(TXN_BYTES + 2 * 1024 * 1024).to_string()])
            .args(["--logger", "zap", "--log-outputs", "stderr"])
            .stdout(log)
            .stderr(err)
            // Its own process group: a terminal's Ctrl-C reaches dev only,
            // which stops the members last.
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .map_err(|source| DevError::Spawn { what: format!("etcd member {i}"), source })
    }

    /// Waits until every member has a leader (and none of ours exited).
    pub async fn wait_etcd(&self, children: &mut [(String, Child)]) -> Result<(), DevError> {
        let http = reqwest::Client::builder().no_proxy().build().map_err(setup("http client"))?;
        for (client, _) in ETCD_PORTS {
            let url = format!("http://127.0.0.1:{client}/health");
            let mut tries = 0;
            loop {
                let ok = match http.get(&url).timeout(Duration::from_secs(1)).send().await {
                    Ok(r) => r.json::<serde_json::Value>().await.is_ok_and(|v| v["health"] == "true"),
                    Err(_) => false,
                };
                if ok {
                    break;
                }
                for (name, c) in children.iter_mut() {
                    if let Ok(Some(status)) = c.try_wait() {
                        return Err(DevError::Setup(format!(
                            "{name} exited at start ({status}); see {}",
                            self.etcd_dir.display()
                        )));
                    }
                }
                tries += 1;
                if tries > 300 {
                    return Err(DevError::Setup(format!(
                        "etcd at {url} not healthy within 30 s; see {}",
                        self.etcd_dir.display()
                    )));
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        Ok(())
    }

    /// Master `i` (its data dir `<dir>/master` for 0, `<dir>/master-<i>`
    /// otherwise); the first one with `--init` and the endpoints file.
    pub fn spawn_master(&self, exe: &Path, dir: &Path, i: usize, first: Option<&Path>) -> Result<Child, DevError> {
        let data = if i == 0 { dir.join("master") } else { dir.join(format!("master-{i}")) };
        std::fs::create_dir_all(&data).map_err(setup("creating a master's dir"))?;
        let (http, agent) = MASTER_PORTS[i];
        let mut cmd = Command::new(exe);
        cmd.arg("master")
            .arg("--data-dir")
            .arg(&data)
            .args(["--http-addr", &format!("127.0.0.1:{http}"), "--agent-addr", &format!("127.0.0.1:{agent}")])
            .args(["--name", &format!("m{i}")])
            .arg("--config")
            .arg(&self.config);
        if let Some(endpoints) = first {
            cmd.arg("--endpoints-file").arg(endpoints).arg("--init").arg("--token-file").arg(data.join("token"));
        }
        cmd.process_group(0)
            .kill_on_drop(true)
            .spawn()
            .map_err(|source| DevError::Spawn { what: format!("master {i}"), source })
    }

    /// Removes `<data dir>/ha` (after everything stopped).
    pub fn remove_data(&self) {
        if let Err(e) = std::fs::remove_dir_all(&self.root)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            eprintln!("flotilla dev: could not remove {}: {e}", self.root.display());
        }
    }
}
