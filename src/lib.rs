//! flotilla: an orchestrator for clusters of long-running software components.
//!
//! A **master** keeps the truth about clusters in RocksDB and serves the HTTP
//! admin API; a **node manager (agent)** on every machine installs component
//! packages, writes per-instance config, and runs and watches the processes.
//! The master is an actix actor system: one supervisor, one actor per cluster,
//! per instance and per connected agent.
//!
//! # Layout
//!
//! | module | owns |
//! |---|---|
//! | [`alloc_meter`] | the global allocator (mimalloc) and its per-thread byte meter, which bounds a template's memory |
//! | [`config`] | master and agent settings (file + `FLOTILLA_*` env), validated on load |
//! | [`error`] | the domain `Error` (no HTTP in it) and `ErrorChain` |
//! | [`ids`] | typed ids and the name rule |
//! | [`scope`] | an API token's scope: `read` < `operate` < `admin` |
//! | [`fd_limit`] | the open-files limit raised at start, the original kept for children |
//! | [`thread_nice`] | a thread's OS priority, lowered for bulk work and raised back while a request waits |
//! | [`private_file`] | files only their owner reads (tokens, keys), written crash-safe |
//! | [`spec`] | `component.toml`: model, validation, config typing, template rendering |
//! | [`storage`] | RocksDB stores (master and agent), records, codec, the group-commit writer; the master's store on etcd with the leader's election and fence (`storage::etcd`) |
//! | [`protocol`] | master <-> agent frames, messages, codec, handshake; TLS: the master's CA, agent credentials (`protocol::tls`) |
//! | [`actors`] | master-side actors: supervisor, cluster, instance, node manager, read model; node pools' launcher (`actors::pools`) |
//! | [`operations`] | multi-step cluster operations as step lists with undo, and their runner |
//! | [`providers`] | where nodes come from: the driver trait, the `local` driver (a network namespace and a real agent per node), `static` (SSH hosts), `ec2` (the EC2 Query API, SigV4), `sim` (load tests), the fault wrapper, `[[node_pools]]` settings; the launcher's policy is in `actors::pools` |
//! | [`http`] | the actix-web admin API: routes, DTOs, error mapping |
//! | [`agent`] | the node manager: connection, installer, process control, local state; every file operation inside an instance directory in `agent::beneath` (never through the instance's links), each cluster's dynamic user in `agent::node::dynamic_users` |
//! | [`master`] | wiring that starts a master: storage, actors, listeners, the first API token (`--init`) |
//! | [`open_store`] | which store a master runs on: RocksDB, or etcd once it leads (`--store etcd`) |
//! | [`follower`] | a master that does not lead: its read model from an etcd watch, reads served, the rest sent to the leader |
//! | [`cli`] | the command-line client (`flotilla cluster`, `package`, `node`, `op`, `events`, `token`): finding the master, waiting for operations, exit codes |
//! | [`dev`] | `flotilla dev`: a master and N agents on loopback; `--ha`: three etcd members and three masters (`dev::ha`) |
//! | [`shutdown`] | the signal master, agent and `flotilla dev` stop on (Ctrl-C, SIGTERM) |
//! | [`bench`] | `flotilla bench`: simulated agents (the real protocol, a fake process layer) and the load driver |
//! | [`package`] | package tarballs: reading `component.toml` out of an upload |
//!
//! Integration tests in `tests/` start a real master and real agents as
//! processes of the `flotilla` binary and check `/proc` and the disk.

pub mod actors;
pub mod agent;
pub mod alloc_meter;
pub mod bench;
pub mod cli;
pub mod config;
pub mod dev;
pub mod error;
pub mod fd_limit;
pub mod follower;
pub mod http;
pub mod ids;
pub mod master;
pub mod open_store;
pub mod operations;
pub mod package;
pub mod private_file;
pub mod protocol;
pub mod providers;
pub mod scope;
pub mod shutdown;
pub mod spec;
pub mod storage;
pub mod thread_nice;
