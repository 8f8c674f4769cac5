//! The master a benchmark drives: a `flotilla master` child process in a
//! fresh data dir (so its CPU and memory are its own, read from `/proc`),
//! or an existing master given by `--api`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::process::{Child, Command};

use crate::agent::masters::Masters;

pub struct MasterProc {
    child: Option<Child>,
    /// The master's pid when it is our child (its usage can be read).
    pub pid: Option<u32>,
    /// `http://HOST:PORT`
    pub api: String,
    /// Its agent listener (several masters' with `--agent-addr A,B,C`).
    pub agents: Masters,
    pub data_dir: Option<PathBuf>,
    /// The API token: the one the child master created (`--init`), or `--token`.
    pub token: Option<String>,
}

impl MasterProc {
    /// Starts `flotilla master` in `dir` on loopback ports chosen by the
    /// kernel, with `env` (e.g. `FLOTILLA_MASTER_ACTOR_THREADS`), and waits
    /// until it listens.
    pub async fn spawn(dir: &Path, env: &[(String, String)]) -> Result<MasterProc, String> {
        MasterProc::spawn_with_config(dir, env, None).await
    }

    /// [`spawn`](Self::spawn) with a `--config` file.
    pub async fn spawn_with_config(
        dir: &Path,
        env: &[(String, String)],
        config: Option<&Path>,
    ) -> Result<MasterProc, String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        let endpoints = dir.join("endpoints.json");
        let _ = std::fs::remove_file(&endpoints);
        let token_file = dir.join("token");
        let exe = std::env::current_exe().map_err(|e| format!("finding the flotilla binary: {e}"))?;
        let log = std::fs::File::create(dir.join("master.log")).map_err(|e| format!("master.log: {e}"))?;
        let mut cmd = Command::new(exe);
        cmd.arg("master")
            .arg("--data-dir")
            .arg(dir)
            .args(["--http-addr", "127.0.0.1:0", "--agent-addr", "127.0.0.1:0"])
            .arg("--endpoints-file")
            .arg(&endpoints)
            .arg("--init")
            .arg("--token-file")
            .arg(&token_file)
            .args(config.iter().flat_map(|c| [std::ffi::OsStr::new("--config"), c.as_os_str()]))
            .env("RUST_LOG", std::env::var("FLOTILLA_BENCH_MASTER_LOG").unwrap_or_else(|_| "warn".into()))
            .stderr(log)
            .kill_on_drop(true);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().map_err(|e| format!("starting the master: {e}"))?;
        for _ in 0..600 {
            if let Ok(bytes) = std::fs::read(&endpoints)
                && let Ok(v) = serde_json::from_slice::<serde_json::Value>(&bytes)
            {
                let api = v["api_url"].as_str().unwrap_or_default().to_string();
                let agents = v["agent_addr"]
                    .as_str()
                    .and_then(|a| a.parse().ok())
                    .map(Masters::one)
                    .ok_or_else(|| format!("bad endpoints file {}", endpoints.display()))?;
                // Written before the master listens, so before the endpoints.
                let token = std::fs::read_to_string(&token_file)
                    .map_err(|e| format!("the master's first API token {}: {e}", token_file.display()))?;
                let pid = child.id();
                return Ok(MasterProc {
                    child: Some(child),
                    pid,
                    api,
                    agents,
                    data_dir: Some(dir.to_path_buf()),
                    token: Some(token.trim().to_string()),
                });
            }
            if let Ok(Some(status)) = child.try_wait() {
                return Err(format!("the master exited at start ({status}); see {}", dir.join("master.log").display()));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err("the master did not start within 30 s".into())
    }

    /// An existing master (or several: `api` any of them).
    pub fn attach(api: &str, agents: Masters, token: Option<String>) -> MasterProc {
        let api = api.trim_end_matches('/').to_string();
        MasterProc { child: None, pid: None, api, agents, data_dir: None, token }
    }

    /// (RSS MiB, CPU seconds) of our child master.
    pub fn usage(&self) -> Option<(f64, f64)> {
        self.pid.and_then(super::ceilings::proc_usage)
    }

    /// SIGTERM, then wait (KILL after 30 s).
    pub async fn stop(mut self) {
        if let Some(mut c) = self.child.take() {
            if let Some(pid) = c.id() {
                let _ =
                    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGTERM);
            }
            if tokio::time::timeout(Duration::from_secs(30), c.wait()).await.is_err() {
                let _ = c.kill().await;
            }
        }
    }
}
