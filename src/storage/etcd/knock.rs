//! Whether a dead leader's process is surely gone, seen from a waiting
//! master: it knocks on the leader's API port ([`leader_process_gone`]),
//! and revokes the leader's lease when it is (`election::campaign`).

use std::time::Duration;

use super::election::LeaderInfo;

/// How often a follower knocks on the leader's API port.
const KNOCK_EVERY: Duration = Duration::from_millis(50);

/// After a refused knock, the next one comes this soon (the second refusal
/// is what counts: a kill is then seen within ~KNOCK_EVERY + this, not two
/// knock periods; under the failover bench's load the knock was ~150 ms of
/// the ~1 s from a kill to a write).
const KNOCK_AGAIN: Duration = Duration::from_millis(20);

/// Resolves once the leader's process is surely gone: its API port
/// refuses two connections in a row (its machine answers, its process
/// does not), or twice in a row a master of the leader's own name answers
/// there, not leading, with another pid (the dead leader restarted in
/// place by its service manager, now waiting as a follower). Another
/// master answering (an `advertise_url` shared behind a load balancer)
/// proves nothing and is ignored. A machine gone, or a paused process,
/// never refuses, and is left to its lease. Pending forever otherwise, or
/// for an API URL it cannot resolve.
pub(super) async fn leader_process_gone(api_url: &str, leader: &LeaderInfo) {
    let addr = reqwest::Url::parse(api_url)
        .ok()
        .and_then(|u| Some(format!("{}:{}", u.host_str()?, u.port_or_known_default()?)));
    // An unspecified address (`http_addr = 0.0.0.0:P` and no
    // `advertise_url`) would knock on the knocker's own machine.
    let unspecified = |a: &str| a.starts_with("0.0.0.0:") || a.starts_with("[::]:");
    let Some(addr) = addr.filter(|a| !unspecified(a)) else { return futures::future::pending().await };
    let client = reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_millis(500))
        .build()
        .ok();
    let health = format!("{}/api/v1/health", api_url.trim_end_matches('/'));
    let (mut refused, mut replaced) = (0, 0);
    loop {
        tokio::time::sleep(if refused > 0 { KNOCK_AGAIN } else { KNOCK_EVERY }).await;
        match tokio::time::timeout(Duration::from_millis(500), tokio::net::TcpStream::connect(&addr)).await {
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                (refused, replaced) = (refused + 1, 0);
                if refused >= 2 {
                    return;
                }
            }
            Ok(Ok(_)) => {
                refused = 0;
                let answer = match &client {
                    Some(c) => answering(c, &health).await,
                    None => None,
                };
                replaced = match answer {
                    Some(a) if restarted(&a, leader) => replaced + 1,
                    _ => 0,
                };
                if replaced >= 2 {
                    return;
                }
            }
            _ => (refused, replaced) = (0, 0),
        }
    }
}

/// What a master's `GET /api/v1/health` says of it: (name, pid, role).
type Answer = (String, u32, String);

async fn answering(client: &reqwest::Client, url: &str) -> Option<Answer> {
    let r = client.get(url).send().await.ok()?;
    let v: serde_json::Value = r.json().await.ok()?;
    let pid = u32::try_from(v.get("pid")?.as_u64()?).ok()?;
    Some((v.get("name")?.as_str()?.to_string(), pid, v.get("role")?.as_str()?.to_string()))
}

/// Whether `answer` is the leader restarted in place: its own name, not
/// leading, another process (and not the one asking).
fn restarted(answer: &Answer, leader: &LeaderInfo) -> bool {
    let (name, pid, role) = answer;
    *name == leader.name && *pid != leader.pid && *pid != std::process::id() && role != "leader"
}

#[cfg(test)]
#[path = "knock_tests.rs"]
mod tests;
