//! The integration-test harness: [`TestEnv`] (a real master and three real
//! agents, or simulated ones), admin API helpers, an in-memory package
//! builder, and `/proc` readers to check the real processes.

pub mod dev;
pub mod env;
pub mod etcd;
pub mod fake_master;
pub mod faulty;
pub mod ha_env;
pub mod http;
pub mod netns;
pub mod package;
pub mod procfs;
pub mod scripts;
pub mod sim;
pub mod sse;
pub mod zk;

pub use env::TestEnv;
pub use http::{all_instances, dir_of, error_code, id_of, pid_of, role_instances};
pub use package::PackageBuilder;
pub use procfs::{DYNAMIC_UIDS, cmdline, dynamic_uid, eventually, instance_pids, pid_alive, proc_uid};
