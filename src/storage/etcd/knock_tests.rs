//! The knock rule of `knock.rs`.

use super::*;

#[test]
fn only_the_leader_itself_restarted_in_place_counts_as_gone() {
    let leader = LeaderInfo { name: "m0".into(), api_url: "http://vip:7070".into(), pid: 100, lease: 1 };
    let me = std::process::id();
    let answer = |name: &str, pid: u32, role: &str| (name.to_string(), pid, role.to_string());
    assert!(restarted(&answer("m0", 200, "follower"), &leader), "a new process of the leader's name");
    assert!(!restarted(&answer("m0", 100, "follower"), &leader), "the leader's own process");
    assert!(!restarted(&answer("m0", 200, "leader"), &leader), "leading: a later term, not a dead one");
    assert!(!restarted(&answer("m1", 200, "follower"), &leader), "another master behind a shared URL");
    assert!(!restarted(&answer("m0", me, "follower"), &leader), "the asking process itself");
}
