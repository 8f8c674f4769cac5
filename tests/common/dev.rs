//! `flotilla dev` as a user starts it (a master and three real agents, the
//! example packages loaded), for the tests that drive it from outside: the
//! CLI, the dashboard, schemathesis.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// Held by each test that runs `flotilla dev --ha`'s fixed ports (etcd
/// 12379.., masters 7070..): `dev --ha` itself and `bench failover`.
pub static HA_PORTS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// `flotilla dev` in a temp dir, stopped (Ctrl-C) when dropped.
pub struct Dev {
    child: Child,
    pub dir: tempfile::TempDir,
}

/// A port range of its own for each dev environment of this test run:
/// they all put their agents on 127.0.0.11-13, and run at once.
fn own_ports() -> String {
    static NEXT: std::sync::atomic::AtomicU16 = std::sync::atomic::AtomicU16::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 30;
    let from = 30_000 + n * 1000;
    format!("{from}-{}", from + 999)
}

impl Dev {
    pub fn start() -> Dev {
        Dev::start_with(3, None)
    }

    /// `flotilla dev --agents AGENTS`, with `master_config` (the text of a
    /// `--master-config` file) if given.
    pub fn start_with(agents: u8, master_config: Option<&str>) -> Dev {
        Dev::start_args(agents, master_config, &[])
    }

    /// `flotilla dev --ha --agents AGENTS`: three etcd members and three
    /// masters on their fixed ports (one such dev at a time per machine).
    pub fn start_ha(agents: u8) -> Dev {
        Dev::start_args(agents, None, &["--ha"])
    }

    fn start_args(agents: u8, master_config: Option<&str>, extra: &[&str]) -> Dev {
        let dir = tempfile::Builder::new().prefix("flotilla-dev-").tempdir().expect("temp dir");
        // Dev mode's instances run as users of their own, who must reach their dirs.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod temp dir");
        let log = std::fs::File::create(dir.path().join("dev.log")).expect("log");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_flotilla"));
        if let Some(text) = master_config {
            let path = dir.path().join("master.toml");
            std::fs::write(&path, text).expect("write the master config");
            cmd.arg("dev").arg("--master-config").arg(path);
        } else {
            cmd.arg("dev");
        }
        let child = cmd
            .args(["--http-addr", "127.0.0.1:0", "--agents", &agents.to_string(), "--port-range", &own_ports()])
            .args(extra)
            .arg("--data-dir")
            .arg(dir.path())
            .arg("--examples")
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/components"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start flotilla dev");
        let dev = Dev { child, dir };
        let deadline = Instant::now() + Duration::from_secs(60);
        while !dev.endpoints().exists() {
            assert!(Instant::now() < deadline, "flotilla dev wrote no endpoints.json in 60 s:\n{}", dev.log());
            std::thread::sleep(Duration::from_millis(100));
        }
        dev
    }

    pub fn endpoints(&self) -> PathBuf {
        self.dir.path().join("endpoints.json")
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("dev.log")).unwrap_or_default()
    }

    /// `flotilla ARGS --endpoints ...` with `env`: (exit code, stdout, stderr).
    pub fn run(&self, args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
        let out = Command::new(env!("CARGO_BIN_EXE_flotilla"))
            .args(args)
            .arg("--endpoints")
            .arg(self.endpoints())
            .env_remove("FLOTILLA_API")
            .env_remove("FLOTILLA_TOKEN")
            .envs(env.iter().copied())
            .output()
            .expect("run flotilla");
        let text = |b: &[u8]| String::from_utf8_lossy(b).to_string();
        (out.status.code().unwrap_or(-1), text(&out.stdout), text(&out.stderr))
    }

    /// Runs a verb that must succeed; its stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let (code, out, err) = self.run(args, &[]);
        assert_eq!(code, 0, "flotilla {args:?}: exit {code}\nstdout: {out}\nstderr: {err}\n{}", self.log());
        out
    }

    /// Runs a verb with `--json`; its output parsed.
    pub fn json(&self, args: &[&str]) -> Value {
        let mut all = args.to_vec();
        all.push("--json");
        let out = self.ok(&all);
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("flotilla {args:?} --json: not JSON ({e}): {out}"))
    }

    pub fn cluster(&self, name: &str) -> Value {
        self.json(&["cluster", "get", name])
    }
}

impl Drop for Dev {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT);
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Dev {
    /// The pid of the agent running node `i` (1..=3), from `/proc`.
    pub fn agent_pid(&self, i: usize) -> Option<u32> {
        let data_dir = self.dir.path().join(format!("agent-{i}"));
        let data_dir = data_dir.to_string_lossy().to_string();
        std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let args: Vec<String> =
                cmdline.split(|b| *b == 0).map(|a| String::from_utf8_lossy(a).to_string()).collect();
            (args.get(1).is_some_and(|a| a == "agent") && args.contains(&data_dir)).then_some(pid)
        })
    }

    /// Ctrl-C, then waits up to 60 s for `flotilla dev` to exit: its status.
    pub fn interrupt(&mut self) -> std::process::ExitStatus {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT);
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("flotilla dev did not exit within 60 s of Ctrl-C:\n{}", self.log());
    }

    /// What `endpoints.json` says: (API URL, token).
    pub fn api(&self) -> (String, String) {
        let text = std::fs::read_to_string(self.endpoints()).expect("endpoints.json");
        let v: Value = serde_json::from_str(&text).expect("endpoints.json is JSON");
        (v["api_url"].as_str().expect("api_url").to_string(), v["token"].as_str().expect("token").to_string())
    }
}
