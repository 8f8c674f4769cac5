//! flotilla's integration tests: a real master and three real agents (the
//! binary cargo built), real packages built by the test, real processes
//! checked in `/proc` and on disk.
//!
//! One test binary on purpose: every test binary links the whole crate with
//! RocksDB, so one binary links once, and its tests still run in parallel
//! threads (each with its own master, agents, IPs and ports; see
//! `common::env`). Agents run as root here and in CI, so an instance whose
//! spec names no user runs as its cluster's own dynamic user.

mod common;

mod integration {
    mod actors;
    mod agent_faults;
    mod agent_policy;
    mod agent_shutdown;
    mod bad_inputs;
    mod batches;
    mod bench_cli;
    mod big_scale;
    mod busy;
    mod cgroups;
    mod change_modes;
    mod cli;
    mod cordon;
    mod crash;
    mod daemon;
    mod dashboard;
    mod delete;
    mod dev_mode;
    mod dry_run;
    mod escalation;
    mod events;
    mod failing_start;
    mod faults_agent;
    mod faults_master;
    mod faults_packages;
    mod faults_steps;
    mod grandchild;
    mod ha;
    mod hooks;
    mod injected;
    mod instance_logs;
    mod isolation;
    mod labels;
    mod leaked;
    mod lifecycle;
    mod listener;
    mod logs;
    mod master_restart;
    mod metrics;
    mod openapi;
    mod operation_records;
    mod order;
    mod overload;
    mod paging;
    mod parallel_clusters;
    mod partition;
    mod pools;
    mod protocol_battery;
    mod replace;
    mod resize;
    mod retention;
    mod rolling;
    mod run_as_gone;
    mod scale;
    mod scopes;
    mod store_stall;
    mod template_budget;
    mod threads;
    mod tokens;
    mod trust;
    mod upgrade;
    mod zookeeper;
}
