//! Start scripts shared by the tests, and readers of what they leave in the
//! instance directory. Scripts run as their cluster's dynamic user with the instance directory as
//! their working directory and write nothing outside it.

use serde_json::Value;

use super::http::dir_of;

/// Appends the start time (ns) to `data/started_at`, then becomes a
/// long-running `sleep`: a foreground component.
pub const RECORD_AND_SLEEP: &str = "set -eu\ndate +%s%N >> data/started_at\nexec sleep 100000\n";

/// The start times an instance's start script recorded, one per start.
pub fn started_at(instance: &Value) -> Vec<u128> {
    let path = dir_of(instance).join("data/started_at");
    let text = std::fs::read_to_string(&path).unwrap_or_default();
    text.lines().map(|l| l.trim().parse().unwrap_or_else(|_| panic!("{}: bad line {l:?}", path.display()))).collect()
}

/// A rendered file of an instance, read from its directory.
pub fn rendered(instance: &Value, rel: &str) -> String {
    let path = dir_of(instance).join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The `host:port` lines every member's file must list: the members of
/// `role` by ordinal, with `port` their port of that name.
pub fn member_lines(members: &[Value], port: &str) -> String {
    members
        .iter()
        .map(|m| format!("{}:{}\n", m["host"].as_str().expect("host"), m["ports"][port].as_u64().expect("port")))
        .collect()
}
