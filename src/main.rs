//! The `flotilla` binary: command-line parsing only; everything else is in
//! the library.

use std::path::PathBuf;

// The global allocator (mimalloc behind a byte meter) is declared in the
// library, `flotilla::alloc_meter`, so tests and benches run on it too.

/// mimalloc v3 keeps freed pages for `purge_delay` (1 s by default) before
/// giving them back to the OS, and only a thread that allocates again
/// purges its own: after a placement burst the master kept them. With
/// 10 ms (v2's default), a master holding 100,000 instances sat at 253-259
/// MiB at rest instead of 286-294, and peaked at 255-260 MiB instead of
/// 310-331, with the same CPU per placement (BENCHMARKS.md, B8). Set for
/// the master only, where it was measured; the agent keeps the default.
///
/// RocksDB (C++) allocates through glibc's malloc: its memtables in blocks
/// of 8 MiB. glibc's mmap threshold grows to the size of the first such
/// block freed, so later blocks came from a malloc arena, which kept them
/// after the memtables were flushed (27 MiB of an idle master holding
/// 100,000 instances). A fixed threshold of 1 MiB keeps every block
/// `mmap`ed, given back when freed (BENCHMARKS.md, B8).
#[allow(unsafe_code)]
fn tune_allocator() {
    // SAFETY: `mallopt` sets one of glibc's malloc parameters; called
    // before the master starts its threads.
    unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 20) };
    // `mi_option_purge_delay`: its index in `mi_option_e` of the mimalloc
    // v3 that libmimalloc-sys 0.1.49 vendors (pinned in Cargo.toml).
    const PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;
    // SAFETY: sets one integer option of the allocator, which mimalloc
    // allows at any time; called before the master starts its threads.
    unsafe { libmimalloc_sys::mi_option_set(PURGE_DELAY, 10) };
}

use anyhow::Context;
use clap::{Parser, Subcommand};
use flotilla::config::{AgentConfig, LogFormat, MasterConfig};

#[derive(Parser)]
#[command(name = "flotilla", version, about = "Orchestrates clusters of long-running software across machines")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum StoreCmd {
    /// Copies the store of a stopped master (`--data-dir`) into etcd, with
    /// its agent link CA; refuses a prefix that holds anything. Then start
    /// the masters with `--store etcd` and copy `<data-dir>/packages/` to
    /// each one's data dir.
    Migrate {
        /// The stopped master's data dir (its `db/` and `ca/`).
        #[arg(long)]
        data_dir: PathBuf,
        /// TOML settings file with an `[etcd]` section (config/master.toml).
        #[arg(long)]
        config: Option<PathBuf>,
        /// The etcd members' client URLs, comma-separated.
        #[arg(long, value_delimiter = ',')]
        etcd_endpoints: Vec<String>,
        /// The installation's key prefix (default `/flotilla/`).
        #[arg(long)]
        etcd_prefix: Option<String>,
    },
}

#[derive(Subcommand)]
enum Command {
    /// Run the master: admin API, agent listener, metadata store.
    Master {
        /// TOML settings file (see config/master.toml).
        #[arg(long)]
        config: Option<PathBuf>,
        #[arg(long)]
        data_dir: Option<PathBuf>,
        #[arg(long)]
        http_addr: Option<String>,
        #[arg(long)]
        agent_addr: Option<String>,
        /// Write {"api_url", "agent_addr"} here once listening.
        #[arg(long)]
        endpoints_file: Option<PathBuf>,
        /// Create the first API token if the store has none, print it on
        /// stdout (or write it to --token-file), then run.
        #[arg(long)]
        init: bool,
        /// With --init: write the first token to this file (mode 0600).
        #[arg(long, requires = "init")]
        token_file: Option<PathBuf>,
        /// `text` (colours only on a terminal) or `json` (one object per line).
        #[arg(long)]
        log_format: Option<String>,
        /// Where the state lives: `rocksdb` (embedded, the default) or
        /// `etcd` (several masters, one leading; see `[etcd]` in config/master.toml).
        #[arg(long)]
        store: Option<String>,
        /// With `--store etcd`: the members' client URLs, comma-separated.
        #[arg(long, value_delimiter = ',')]
        etcd_endpoints: Vec<String>,
        /// With `--store etcd`: the installation's key prefix (default `/flotilla/`).
        #[arg(long)]
        etcd_prefix: Option<String>,
        /// This master's name among several (default: its http_addr).
        #[arg(long)]
        name: Option<String>,
        /// The API URL other masters send clients to (default: http://<http_addr>).
        #[arg(long)]
        advertise_url: Option<String>,
    },
    /// Run a node manager (agent) that dials the master.
    Agent {
        /// TOML settings file (see config/agent.toml).
        #[arg(long)]
        config: Option<PathBuf>,
        #[arg(long)]
        node_id: Option<String>,
        /// The master's agent listener, HOST:PORT; with several masters
        /// (a store on etcd) every one, comma-separated: the agent serves
        /// the one that leads.
        #[arg(long)]
        master: Option<String>,
        /// The IP instances on this node bind to.
        #[arg(long)]
        address: Option<String>,
        #[arg(long)]
        data_dir: Option<PathBuf>,
        /// LOW-HIGH, e.g. 20000-29999.
        #[arg(long)]
        port_range: Option<String>,
        #[arg(long)]
        default_run_as: Option<String>,
        #[arg(long)]
        allow_root: bool,
        /// Enroll with this join token (`flotilla node token create`) if
        /// the data dir holds no certificate yet; ignored once enrolled.
        /// Also FLOTILLA_AGENT_JOIN_TOKEN, which `ps` does not show.
        #[arg(long)]
        join_token: Option<String>,
        #[arg(long)]
        no_cgroups: bool,
        /// A label of this node, KEY=VALUE (repeatable; over the config
        /// file's `[labels]`): a role's `node_labels` place it by them.
        #[arg(long = "label", value_name = "KEY=VALUE")]
        labels: Vec<String>,
        /// Stop every instance when the agent exits (dev mode).
        #[arg(long)]
        stop_instances_on_exit: bool,
        /// `text` (colours only on a terminal) or `json` (one object per line).
        #[arg(long)]
        log_format: Option<String>,
    },
    /// The master's store, offline: `migrate` copies a stopped master's
    /// RocksDB state into etcd, for several masters.
    Store {
        #[command(subcommand)]
        cmd: StoreCmd,
    },
    /// A master and N agents on loopback, with the example packages loaded.
    Dev(flotilla::dev::DevArgs),
    /// Load-test a master: simulated agents (the real protocol, no real
    /// processes) driven through create, scale-out, restart, reconfigure
    /// and scale-in by concurrent clients; `bench real` for real agents.
    Bench(flotilla::bench::BenchArgs),
    /// Clusters: ls, get, create, scale, start, stop, restart, config, upgrade, resize, delete.
    Cluster {
        #[command(subcommand)]
        cmd: flotilla::cli::cluster::ClusterCmd,
        #[command(flatten)]
        target: flotilla::cli::Target,
    },
    /// Packages: push, ls, rm.
    Package {
        #[command(subcommand)]
        cmd: flotilla::cli::inventory::PackageCmd,
        #[command(flatten)]
        target: flotilla::cli::Target,
    },
    /// Nodes: ls, get, cordon, hold, revoke, token, request.
    Node {
        #[command(subcommand)]
        cmd: flotilla::cli::inventory::NodeCmd,
        #[command(flatten)]
        target: flotilla::cli::Target,
    },
    /// Node pools: ls (`flotilla node request` for their requests).
    Pool {
        #[command(subcommand)]
        cmd: flotilla::cli::pools::PoolCmd,
        #[command(flatten)]
        target: flotilla::cli::Target,
    },
    /// Operations: ls, get, watch.
    Op {
        #[command(subcommand)]
        cmd: flotilla::cli::inventory::OpCmd,
        #[command(flatten)]
        target: flotilla::cli::Target,
    },
    /// The event stream, live (`--after N` to replay first).
    Events {
        #[command(flatten)]
        args: flotilla::cli::events::EventsArgs,
        #[command(flatten)]
        target: flotilla::cli::Target,
    },
    /// The supervision tree: list actors, kill one, restart a failed one.
    Actor {
        #[command(subcommand)]
        cmd: flotilla::cli::actor::ActorCmd,
        #[command(flatten)]
        target: flotilla::cli::Target,
    },
    /// API tokens: create, list, revoke.
    Token {
        #[command(subcommand)]
        cmd: flotilla::cli::token::TokenCmd,
        #[command(flatten)]
        target: flotilla::cli::Target,
    },
}

/// Runs one client command; exits with its code on failure.
fn client<F: std::future::Future<Output = Result<(), flotilla::cli::CliError>>>(f: F) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    if let Err(e) = rt.block_on(f) {
        eprintln!("flotilla: {e}");
        std::process::exit(e.exit_code());
    }
    Ok(())
}

/// Log lines on stderr: colours only on a terminal (a file or a pipe gets
/// plain text), or one JSON object per line.
fn init_logs(format: LogFormat, default_filter: &str) {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
}

fn path_str(p: &std::path::Path) -> String {
    p.display().to_string()
}

/// A handled error at exit is one line with its causes (`a: b: c`), not a
/// backtrace.
fn main() {
    if let Err(e) = run(Cli::parse()) {
        eprintln!("flotilla: {e:#}");
        std::process::exit(1);
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Master {
            config,
            data_dir,
            http_addr,
            agent_addr,
            endpoints_file,
            init,
            token_file,
            log_format,
            store,
            etcd_endpoints,
            etcd_prefix,
            name,
            advertise_url,
        } => {
            tune_allocator();
            let mut o: Vec<(&str, String)> = Vec::new();
            if let Some(v) = &data_dir {
                o.push(("data_dir", path_str(v)));
            }
            if let Some(v) = http_addr {
                o.push(("http_addr", v));
            }
            if let Some(v) = agent_addr {
                o.push(("agent_addr", v));
            }
            if let Some(v) = &endpoints_file {
                o.push(("endpoints_file", path_str(v)));
            }
            if let Some(v) = log_format {
                o.push(("log_format", v));
            }
            for (key, v) in
                [("store", store), ("etcd.prefix", etcd_prefix), ("name", name), ("advertise_url", advertise_url)]
            {
                if let Some(v) = v {
                    o.push((key, v));
                }
            }
            let mut cfg = MasterConfig::load(config.as_deref(), &o)?;
            if !etcd_endpoints.is_empty() {
                cfg.etcd.endpoints = etcd_endpoints;
                cfg.validate()?;
            }
            init_logs(cfg.log_format, "info");
            let rt = flotilla::master::runtime().context("cannot start the runtime")?;
            let init = match (init, token_file) {
                (false, _) => flotilla::master::Init::No,
                (true, None) => flotilla::master::Init::Print,
                (true, Some(f)) => flotilla::master::Init::File(f),
            };
            actix::System::with_tokio_rt(|| rt).block_on(flotilla::master::run(cfg, init)).context("master failed")?;
        }
        Command::Agent {
            config,
            node_id,
            master,
            address,
            data_dir,
            port_range,
            default_run_as,
            allow_root,
            join_token,
            no_cgroups,
            labels,
            stop_instances_on_exit,
            log_format,
        } => {
            let mut given = std::collections::BTreeSet::new();
            let labels: Vec<(String, String)> = labels
                .iter()
                .map(|l| {
                    let Some((k, v)) = l.split_once('=') else {
                        anyhow::bail!("--label {l:?}: must be KEY=VALUE");
                    };
                    // Checked here: the key becomes a config path (`a.b` a table).
                    flotilla::ids::validate_name(k).map_err(|m| anyhow::anyhow!("--label {l:?}: the name {m}"))?;
                    anyhow::ensure!(given.insert(k), "--label {l:?}: label {k} is given twice");
                    Ok((format!("labels.{k}"), v.to_string()))
                })
                .collect::<anyhow::Result<_>>()?;
            let mut o: Vec<(&str, String)> = labels.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
            for (k, v) in [
                ("node_id", node_id),
                ("master_addr", master),
                ("address", address),
                ("port_range", port_range),
                ("default_run_as", default_run_as),
                ("join_token", join_token),
            ] {
                if let Some(v) = v {
                    o.push((k, v));
                }
            }
            if let Some(v) = &data_dir {
                o.push(("data_dir", path_str(v)));
            }
            if allow_root {
                o.push(("allow_root", "true".into()));
            }
            if no_cgroups {
                o.push(("use_cgroups", "false".into()));
            }
            if stop_instances_on_exit {
                o.push(("stop_instances_on_exit", "true".into()));
            }
            if let Some(v) = log_format {
                o.push(("log_format", v));
            }
            let cfg = AgentConfig::load(config.as_deref(), &o)?;
            init_logs(cfg.log_format, "info");
            let rt = tokio::runtime::Runtime::new().context("cannot start the runtime")?;
            let result = rt.block_on(flotilla::agent::run(cfg, flotilla::shutdown::signal()));
            // A blocking task that never returns (a /proc read stuck on a
            // process in the kernel) must not keep the agent from exiting.
            rt.shutdown_timeout(std::time::Duration::from_secs(5));
            result.context("agent failed")?;
        }
        Command::Store { cmd: StoreCmd::Migrate { data_dir, config, etcd_endpoints, etcd_prefix } } => {
            init_logs(flotilla::config::LogFormat::Text, "warn");
            let mut o: Vec<(&str, String)> = vec![("store", "etcd".into())];
            if let Some(p) = etcd_prefix {
                o.push(("etcd.prefix", p));
            }
            let mut cfg = MasterConfig::load(config.as_deref(), &o)?;
            if !etcd_endpoints.is_empty() {
                cfg.etcd.endpoints = etcd_endpoints;
                cfg.validate()?;
            }
            let ca_dir = data_dir.join("ca");
            let ca = if flotilla::protocol::tls::ca::Ca::exists(&ca_dir) {
                Some(flotilla::protocol::tls::ca::Ca::read_pem(&ca_dir).context("reading the master's CA")?)
            } else {
                None
            };
            let copied = flotilla::storage::etcd::copy::from_rocksdb(&data_dir, &cfg.etcd, ca)
                .map_err(|e| anyhow::anyhow!("{}", flotilla::error::ErrorChain(&e)))?;
            for (cf, n) in &copied.keys {
                println!("{cf:<16} {n} keys");
            }
            println!(
                "copied into {} under {}{}; now start the masters with --store etcd and copy {} to each one's data dir",
                cfg.etcd.endpoints.join(","),
                cfg.etcd.prefix,
                if copied.ca { ", with the agent link's CA" } else { "" },
                data_dir.join("packages").display()
            );
        }
        Command::Dev(args) => {
            init_logs(LogFormat::Text, "info");
            let rt = tokio::runtime::Runtime::new().context("cannot start the runtime")?;
            rt.block_on(flotilla::dev::run(args))?;
        }
        Command::Bench(args) => {
            init_logs(LogFormat::Text, "warn");
            let rt = tokio::runtime::Runtime::new().context("cannot start the runtime")?;
            let report = rt.block_on(flotilla::bench::run(args)).map_err(anyhow::Error::msg)?;
            println!("{}", report.table());
        }
        Command::Cluster { cmd, target } => client(flotilla::cli::cluster::run(cmd, &target))?,
        Command::Package { cmd, target } => client(flotilla::cli::inventory::package(cmd, &target))?,
        Command::Node { cmd, target } => client(flotilla::cli::inventory::node(cmd, &target))?,
        Command::Pool { cmd, target } => client(flotilla::cli::pools::pool(cmd, &target))?,
        Command::Op { cmd, target } => client(flotilla::cli::inventory::op(cmd, &target))?,
        Command::Events { args, target } => client(flotilla::cli::events::run(args, &target))?,
        Command::Token { cmd, target } => client(flotilla::cli::token::run(cmd, &target))?,
        Command::Actor { cmd, target } => client(flotilla::cli::actor::run(cmd, &target))?,
    }
    Ok(())
}
