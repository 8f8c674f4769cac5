//! `flotilla dev`: the embedded default. One command starts a master and N
//! agents (each on its own loopback address 127.0.0.11, .12, ...) as child
//! processes of this one, loads the example packages from
//! `examples/components/`, writes `DIR/endpoints.json`, and prints the URLs
//! and a copy-paste example. Ctrl-C stops the agents first (each stops its
//! instances), then the master, and leaves no process behind. `--ha`: three
//! etcd members and three masters on them instead ([`ha`]).

pub mod ha;

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::process::{Child, Command};

/// Flags of `flotilla dev`.
#[derive(Debug, Clone, clap::Args)]
pub struct DevArgs {
    /// Where the master's and agents' data live.
    #[arg(long, default_value = "./flotilla-data")]
    pub data_dir: PathBuf,
    /// The admin API address.
    #[arg(long, default_value = "127.0.0.1:7070")]
    pub http_addr: String,
    /// How many agents (at most 200).
    #[arg(long, default_value_t = 3)]
    pub agents: u8,
    /// Folder of example components to load (each a folder with component.toml).
    #[arg(long)]
    pub examples: Option<PathBuf>,
    /// The ports each agent gives its instances, `FROM-TO`. Every dev
    /// environment puts its agents on 127.0.0.11, .12, ...: two at once
    /// on one machine need ranges that do not overlap.
    #[arg(long, default_value = "20000-29999")]
    pub port_range: String,
    /// Let the agents run an instance as root where its spec names root
    /// (`run_as = "root"`). Without it they refuse root; either way an
    /// instance whose spec names no user runs as its cluster's own dynamic
    /// user (a uid of 61184-65519 given per cluster).
    #[arg(long)]
    pub allow_root: bool,
    /// Master settings (a `flotilla master --config` file) merged over dev's
    /// defaults: where dev's node pools come from (`[[node_pools]]`; a
    /// `local` pool's nodes are network namespaces with an agent each,
    /// deleted at Ctrl-C). `--agents 0` then runs only the pools' nodes.
    #[arg(long)]
    pub master_config: Option<PathBuf>,
    /// Several masters: three etcd members (ports 12379, 22379, 32379) and
    /// three masters on them (APIs on 127.0.0.1:7070, 7072, 7074), the
    /// agents knowing all three. Kill the leader (its pid in `GET
    /// /api/v1/health`) to see another take over; the killed one comes
    /// back as a follower. Ctrl-C removes etcd's data too.
    #[arg(long)]
    pub ha: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum DevError {
    #[error("{0}")]
    Setup(String),
    #[error("cannot start {what}")]
    Spawn {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

/// Under root, instances run as users of their own, which must be able to reach
/// their directories under `dir`: says so at once (and how to fix it)
/// rather than at the first install.
fn warn_if_unreachable(dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    if !nix::unistd::geteuid().is_root() {
        return;
    }
    let closed = dir.ancestors().find(|d| std::fs::metadata(d).is_ok_and(|m| m.permissions().mode() & 0o001 == 0));
    if let Some(d) = closed {
        eprintln!(
            "flotilla dev: warning: instances run as users of their own, who cannot reach {} ({} is not searchable by others): \
             installs will fail; pass a --data-dir outside it (e.g. /var/tmp/flotilla-dev) or `chmod o+x {}`",
            dir.display(),
            d.display(),
            d.display()
        );
    }
}

fn setup<E: std::fmt::Display>(what: &str) -> impl FnOnce(E) -> DevError + '_ {
    move |e| DevError::Setup(format!("{what}: {e}"))
}

pub async fn run(args: DevArgs) -> Result<(), DevError> {
    let pools = match &args.master_config {
        Some(file) => crate::config::MasterConfig::load(Some(file), &[]).map_err(setup("--master-config"))?.node_pools,
        None => Vec::new(),
    };
    if args.agents > 200 || (args.agents == 0 && pools.is_empty()) {
        return Err(DevError::Setup("--agents must be 1 to 200 (0 only with node pools in --master-config)".into()));
    }
    // A local pool's agents dial the master from their namespaces: the
    // agent listener takes every interface (mTLS still admits only
    // enrolled agents).
    let agent_listen = if pools.iter().any(|p| p.driver == "local") { "0.0.0.0:0" } else { "127.0.0.1:0" };
    std::fs::create_dir_all(&args.data_dir).map_err(setup("creating --data-dir"))?;
    let base = std::fs::canonicalize(&args.data_dir).map_err(setup("resolving --data-dir"))?;
    // --ha keeps all of its state under <data dir>/ha/, made afresh and
    // removed at the end (its etcd's data with it): a single master's dev
    // data beside it is never touched, and nothing stale (an agent's
    // certificate of another CA) outlives the run.
    let prepared = if args.ha {
        if args.master_config.is_some() {
            return Err(DevError::Setup("--ha and --master-config together are not supported yet".into()));
        }
        Some(ha::Ha::prepare(&base)?)
    } else {
        None
    };
    let dir = prepared.as_ref().map_or_else(|| base.clone(), |h| h.root.clone());
    let exe = std::env::current_exe().map_err(setup("finding the flotilla binary"))?;
    let internal = dir.join("master").join("endpoints.internal.json");
    let _ = std::fs::remove_file(&internal);
    std::fs::create_dir_all(dir.join("master")).map_err(setup("creating the master's dir"))?;

    let mut children: Vec<(String, Child)> = Vec::new();
    let started = match &prepared {
        Some(ha) => ha.start(&exe, &internal, &mut children).await,
        None => single_master(&args, &dir, &exe, &internal, agent_listen).map(|m| children.push(("master".into(), m))),
    };
    let mut install = None;
    let result = match started {
        Ok(()) => start_and_wait(&args, &dir, &exe, &internal, &mut children, &mut install, prepared.as_ref()).await,
        Err(e) => Err(e),
    };
    if let Err(e) = &result {
        eprintln!("flotilla dev: {e}");
    }
    stop_children(children).await;
    if let Some(install) = install {
        delete_pool_nodes(&pools, &dir.join("master"), &install).await;
    }
    let left = sweep_instances(&dir);
    if left > 0 {
        eprintln!("flotilla dev: killed {left} instance process(es) an agent crash had left running");
    }
    if let Some(ha) = &prepared {
        ha.remove_data();
    }
    result
}

/// The one master of the embedded default.
fn single_master(
    args: &DevArgs,
    dir: &Path,
    exe: &Path,
    internal: &Path,
    agent_listen: &str,
) -> Result<Child, DevError> {
    Command::new(exe)
        .arg("master")
        .arg("--data-dir")
        .arg(dir.join("master"))
        .arg("--http-addr")
        .arg(&args.http_addr)
        .arg("--agent-addr")
        .arg(agent_listen)
        .args(args.master_config.iter().flat_map(|f| [std::ffi::OsStr::new("--config"), f.as_os_str()]))
        .arg("--endpoints-file")
        .arg(internal)
        .arg("--init")
        .arg("--token-file")
        .arg(dir.join("master").join("token"))
        .kill_on_drop(true)
        .spawn()
        .map_err(|source| DevError::Spawn { what: "the master".into(), source })
}

async fn start_and_wait(
    args: &DevArgs,
    dir: &Path,
    exe: &Path,
    internal: &Path,
    children: &mut Vec<(String, Child)>,
    install: &mut Option<String>,
    ha: Option<&ha::Ha>,
) -> Result<(), DevError> {
    let endpoints = wait_for_endpoints(internal, children).await?;
    let api_url = endpoints["api_url"].as_str().unwrap_or_default().to_string();
    let mut agent_addr = endpoints["agent_addr"].as_str().unwrap_or_default().to_string();
    let mut api_urls = vec![api_url.clone()];
    if let Some(ha) = ha {
        // The first leads; these wait (and take over when it dies).
        for i in 1..3 {
            children.push((format!("master-{i}"), ha.spawn_master(exe, dir, i, None)?));
        }
        agent_addr = ha::Ha::agent_addrs();
        api_urls = ha::Ha::api_urls();
    }
    warn_if_unreachable(dir);
    // Written by the master (its first start) before it listens.
    let token_file = dir.join("master").join("token");
    let token = std::fs::read_to_string(&token_file)
        .map(|t| t.trim().to_string())
        .map_err(|e| DevError::Setup(format!("the master's API token {}: {e}", token_file.display())))?;
    let mut headers = reqwest::header::HeaderMap::new();
    let bearer = reqwest::header::HeaderValue::from_str(&format!("Bearer {token}")).map_err(setup("the API token"))?;
    headers.insert(reqwest::header::AUTHORIZATION, bearer);
    let client =
        reqwest::Client::builder().no_proxy().default_headers(headers).build().map_err(setup("http client"))?;
    if args.master_config.is_some() {
        *install = Some(installation(&client, &api_url).await?);
    }
    let join_token = join_token(&client, &api_url, args.agents).await?;
    let agent = AgentCommand { exe, dir, agent_addr: &agent_addr, args, join_token: &join_token };
    for i in 1..=args.agents {
        children.push((format!("agent-{i}"), agent.spawn(i)?));
    }
    wait_for_nodes(&client, &api_url, args.agents as usize).await?;
    let examples = args.examples.clone().unwrap_or_else(default_examples);
    let loaded = load_examples(&client, &api_url, &examples).await;
    // With the token in it, readable by this user only.
    let endpoints =
        serde_json::json!({ "api_url": api_url, "api_urls": api_urls, "agent_addr": agent_addr, "token": token });
    // Where the CLI looks: the data dir itself, also with --ha.
    let out = ha.map_or(dir, |h| h.base.as_path());
    crate::master::write_private(
        &out.join("endpoints.json"),
        &serde_json::to_vec_pretty(&endpoints).unwrap_or_default(),
    )
    .map_err(setup("writing endpoints.json"))?;
    print_banner(&api_url, &token, out, args.agents, &loaded);
    if ha.is_some() {
        println!(
            "Several masters (--ha): etcd on 127.0.0.1:12379, 22379, 32379; masters m0, m1, m2 at {} (each says\n\
             its role in GET /api/v1/health). To see a failover, kill -9 the leader's pid (in its health); another\n\
             leads within a second or two, and the killed one comes back as a follower. The CLI finds the leader.\n",
            api_urls.join(", ")
        );
    }
    tokio::select! {
        _ = crate::shutdown::signal() => {
            eprintln!("\nflotilla dev: stopping agents (and their instances), then the master ...");
            Ok(())
        }
        who = supervise(children, &agent, ha.map(|h| (h, exe, dir))) => Err(DevError::Setup(format!("{who}; stopping everything"))),
    }
}

/// How `flotilla dev` starts (and starts again) agent `i`.
struct AgentCommand<'a> {
    exe: &'a Path,
    dir: &'a Path,
    agent_addr: &'a str,
    args: &'a DevArgs,
    join_token: &'a str,
}

impl AgentCommand<'_> {
    fn spawn(&self, i: u8) -> Result<Child, DevError> {
        Command::new(self.exe)
            .arg("agent")
            .args(["--node-id", &format!("node-{i}")])
            .args(["--master", self.agent_addr])
            .args(["--address", &format!("127.0.0.{}", 10 + i as u32)])
            .arg("--data-dir")
            .arg(self.dir.join(format!("agent-{i}")))
            .args(["--port-range", &self.args.port_range])
            // Never as the user who ran `flotilla dev` (root, often): each
            // cluster as a dynamic user of its own (the agent's default),
            // or root only where a spec names it and the operator passed
            // --allow-root.
            .args(self.args.allow_root.then_some("--allow-root"))
            .arg("--stop-instances-on-exit")
            // Enrolls at its first start; later starts use its certificate.
            .env("FLOTILLA_AGENT_JOIN_TOKEN", self.join_token)
            .kill_on_drop(true)
            .spawn()
            .map_err(|source| DevError::Spawn { what: format!("agent {i}"), source })
    }
}

/// Agents restarted within [`RESTART_WINDOW`] before dev mode gives up.
const MAX_RESTARTS: usize = 5;
const RESTART_WINDOW: Duration = Duration::from_secs(60);

/// Watches the children: an agent that dies is started again on its data
/// dir (it re-adopts its running instances, as after any agent crash); the
/// master's end, or an agent dying too often, ends dev mode. Returns why.
async fn supervise(
    children: &mut [(String, Child)],
    agent: &AgentCommand<'_>,
    ha: Option<(&ha::Ha, &Path, &Path)>,
) -> String {
    let mut restarts: std::collections::HashMap<String, Vec<std::time::Instant>> = Default::default();
    loop {
        for (name, c) in children.iter_mut() {
            let Ok(Some(status)) = c.try_wait() else { continue };
            let agent_no = name.strip_prefix("agent-").and_then(|n| n.parse::<u8>().ok());
            // With --ha a master that exits (killed to see a failover) comes
            // back, as a follower.
            let master_no = name.strip_prefix("master-").and_then(|n| n.parse::<usize>().ok()).filter(|_| ha.is_some());
            if agent_no.is_none() && master_no.is_none() {
                return format!("{name} exited ({status})");
            }
            let times = restarts.entry(name.clone()).or_default();
            times.retain(|t| t.elapsed() < RESTART_WINDOW);
            if times.len() >= MAX_RESTARTS {
                return format!("{name} exited ({status}) {MAX_RESTARTS} times within {} s", RESTART_WINDOW.as_secs());
            }
            times.push(std::time::Instant::now());
            let again = match (agent_no, master_no, ha) {
                (Some(i), _, _) => {
                    eprintln!("flotilla dev: {name} exited ({status}); starting it again (it re-adopts its instances)");
                    agent.spawn(i)
                }
                (_, Some(i), Some((ha, exe, dir))) => {
                    eprintln!("flotilla dev: {name} exited ({status}); starting it again (it waits as a follower)");
                    ha.spawn_master(exe, dir, i, None)
                }
                _ => unreachable!("checked above"),
            };
            match again {
                Ok(new) => *c = new,
                Err(e) => return format!("{name} exited ({status}) and could not be started again: {e}"),
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Kills every instance process still running from an instance directory
/// under `dir` (an agent killed before it could stop its instances leaves
/// them to init): dev mode leaves nothing running behind. A process counts
/// only when it also carries the `FLOTILLA_INSTANCE=` marker every agent
/// gives its instances, so an operator's shell sitting in such a directory
/// is left alone. Returns how many.
fn sweep_instances(dir: &Path) -> usize {
    let Ok(procs) = std::fs::read_dir("/proc") else { return 0 };
    let roots: Vec<PathBuf> = (1..=u8::MAX).map(|i| dir.join(format!("agent-{i}")).join("instances")).collect();
    let mut killed = 0;
    for entry in procs.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else { continue };
        let Ok(cwd) = std::fs::read_link(format!("/proc/{pid}/cwd")) else { continue };
        let marked = std::fs::read(format!("/proc/{pid}/environ"))
            .is_ok_and(|env| env.split(|b| *b == 0).any(|kv| kv.starts_with(b"FLOTILLA_INSTANCE=")));
        if marked && roots.iter().any(|r| cwd.starts_with(r)) && pid != std::process::id() as i32 {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
            killed += 1;
        }
    }
    killed
}

fn default_examples() -> PathBuf {
    let local = PathBuf::from("examples/components");
    if local.is_dir() { local } else { Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/components") }
}

async fn wait_for_endpoints(path: &Path, children: &mut [(String, Child)]) -> Result<serde_json::Value, DevError> {
    for _ in 0..600 {
        if let Ok(bytes) = std::fs::read(path)
            && let Ok(v) = serde_json::from_slice::<serde_json::Value>(&bytes)
        {
            return Ok(v);
        }
        if let Some((_, c)) = children.iter_mut().find(|(n, _)| n == "master" || n == "master-0")
            && let Ok(Some(status)) = c.try_wait()
        {
            return Err(DevError::Setup(format!("the master exited at start ({status}); see its log above")));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(DevError::Setup("the master did not start within 30 s".into()))
}

/// This installation's id (the `flotilla-master` tag on its pools'
/// resources), from `GET /pools`.
async fn installation(client: &reqwest::Client, api: &str) -> Result<String, DevError> {
    let v: serde_json::Value = client
        .get(format!("{api}/api/v1/pools"))
        .send()
        .await
        .and_then(|r| r.error_for_status())
        .map_err(setup("GET /api/v1/pools"))?
        .json()
        .await
        .map_err(setup("GET /api/v1/pools"))?;
    let id = v["pools"][0]["tags"][crate::providers::driver::TAG_MASTER].as_str();
    Ok(id.unwrap_or_default().to_string())
}

/// Deletes every resource of the local pools tagged with `install` (their
/// namespaces, agents and instances): dev mode leaves nothing behind.
async fn delete_pool_nodes(pools: &[crate::providers::pool_config::PoolConfig], master_dir: &Path, install: &str) {
    use crate::providers::driver::TAG_MASTER;
    for p in pools.iter().filter(|p| p.driver == "local") {
        let driver = match crate::providers::build(p, master_dir, install) {
            Ok(d) => d,
            Err(e) => {
                eprintln!("flotilla dev: cannot clean pool {}: {e}", p.name);
                continue;
            }
        };
        let listed = match driver.list().await {
            Ok(l) => l,
            Err(e) => {
                eprintln!("flotilla dev: cannot list pool {}: {e}", p.name);
                continue;
            }
        };
        let ours: Vec<_> =
            listed.into_iter().filter(|r| !install.is_empty() && r.tag(TAG_MASTER) == Some(install)).collect();
        for r in &ours {
            if let Err(e) = driver.delete(&r.external_id).await {
                eprintln!("flotilla dev: cannot delete {} of pool {}: {e}", r.external_id, p.name);
            }
        }
        if !ours.is_empty() {
            eprintln!("flotilla dev: deleted {} node(s) of pool {}", ours.len(), p.name);
        }
    }
}

/// A join token the dev agents enroll with (one use each).
async fn join_token(client: &reqwest::Client, api: &str, agents: u8) -> Result<String, DevError> {
    let body = serde_json::json!({ "name": "dev", "uses": agents.max(1), "ttl_seconds": 600 });
    let resp = client
        .post(format!("{api}/api/v1/join-tokens"))
        .json(&body)
        .send()
        .await
        .map_err(setup("making a join token"))?;
    let v: serde_json::Value = resp.json().await.map_err(setup("the join token answer"))?;
    v["secret"].as_str().map(str::to_string).ok_or_else(|| DevError::Setup(format!("no join token in {v}")))
}

async fn wait_for_nodes(client: &reqwest::Client, api: &str, n: usize) -> Result<(), DevError> {
    for _ in 0..300 {
        if let Ok(r) = client.get(format!("{api}/api/v1/nodes")).send().await
            && let Ok(v) = r.json::<serde_json::Value>().await
        {
            let ready = v["nodes"].as_array().map(|a| a.iter().filter(|n| n["status"] == "Ready").count()).unwrap_or(0);
            if ready >= n {
                return Ok(());
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(DevError::Setup(format!("{n} agents did not connect within 30 s")))
}

/// Packs every `examples/components/<name>/` folder and uploads it.
async fn load_examples(client: &reqwest::Client, api: &str, dir: &Path) -> Vec<String> {
    let mut loaded = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        eprintln!("flotilla dev: no examples at {}", dir.display());
        return loaded;
    };
    let mut dirs: Vec<PathBuf> =
        entries.filter_map(|e| e.ok()).map(|e| e.path()).filter(|p| p.join("component.toml").is_file()).collect();
    dirs.sort();
    for d in dirs {
        match crate::package::pack_dir(&d) {
            Ok((name, version, bytes)) => {
                let url = format!("{api}/api/v1/packages/{name}/{version}");
                match client.put(&url).body(bytes).send().await {
                    Ok(r) if r.status().is_success() => loaded.push(format!("{name}/{version}")),
                    Ok(r) => eprintln!(
                        "flotilla dev: loading {}: {} {}",
                        d.display(),
                        r.status(),
                        r.text().await.unwrap_or_default()
                    ),
                    Err(e) => eprintln!("flotilla dev: loading {}: {e}", d.display()),
                }
            }
            Err(e) => eprintln!("flotilla dev: packing {}: {e}", d.display()),
        }
    }
    loaded
}

fn print_banner(api: &str, token: &str, dir: &Path, agents: u8, loaded: &[String]) {
    println!(
        r#"
flotilla dev is running: a master and {agents} agents (127.0.0.11 ...).

  dashboard   {api}/#token={token}
  admin API   {api}/api/v1
  API token   {token}
  endpoints   {dir}/endpoints.json (API URL and token: the CLI reads it)
  data        {dir}
  packages    {packages}

Try it (copy-paste; the CLI finds the API and token in
./flotilla-data/endpoints.json, else pass --endpoints {dir}/endpoints.json):

  flotilla cluster create demo --package web:1.0.0 --role server=3 --config greeting=hi
  flotilla cluster get demo
  flotilla cluster scale demo server --add 2
  flotilla events --cluster demo
  flotilla cluster delete demo

or with curl:

  curl -s {api}/api/v1/clusters -H "authorization: Bearer {token}"

Ctrl-C stops everything.
"#,
        dir = dir.display(),
        packages = if loaded.is_empty() { "(none)".to_string() } else { loaded.join(", ") },
    );
}

/// SIGTERM to the agents, wait; then to the masters, wait; then to etcd's
/// members; KILL what is left.
async fn stop_children(children: Vec<(String, Child)>) {
    let (etcd, rest): (Vec<_>, Vec<_>) = children.into_iter().partition(|(n, _)| n.starts_with("etcd-"));
    let (masters, agents): (Vec<_>, Vec<_>) = rest.into_iter().partition(|(n, _)| n.starts_with("master"));
    for group in [agents, masters, etcd] {
        for (_, c) in &group {
            if let Some(pid) = c.id() {
                let _ =
                    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGTERM);
            }
        }
        for (name, mut c) in group {
            match tokio::time::timeout(Duration::from_secs(60), c.wait()).await {
                Ok(Ok(status)) if !status.success() => eprintln!("flotilla dev: {name} ended with {status}"),
                Ok(_) => {}
                Err(_) => {
                    eprintln!("flotilla dev: {name} did not stop within 60 s; killing it");
                    let _ = c.kill().await;
                }
            }
        }
    }
}
