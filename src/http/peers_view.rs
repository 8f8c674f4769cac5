//! The installation's masters as `GET /actors` shows them (on etcd): this
//! one from its own role, each other one from its own `GET /health`, asked
//! now (at most [`ASK_LIMIT`], all at once). Another master is a process of
//! its own, supervised by its service manager, not by this one: it is a
//! root beside this master's tree, never a child in it.

use std::time::Duration;

use super::AppState;
use super::dto::MasterStateDto;

/// How long another master's health may take before it counts as
/// unreachable.
const ASK_LIMIT: Duration = Duration::from_millis(500);

fn client() -> &'static reqwest::Client {
    static CLIENT: std::sync::OnceLock<reqwest::Client> = std::sync::OnceLock::new();
    CLIENT.get_or_init(|| {
        reqwest::Client::builder()
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap_or_else(|_| reqwest::Client::new())
    })
}

/// Every master named in etcd, this one first; empty with the embedded store.
pub async fn masters(state: &AppState) -> Vec<MasterStateDto> {
    let Some(dir) = state.shared.peers.clone() else { return Vec::new() };
    let (peers, stale) = dir.known(Duration::from_secs(5));
    if stale {
        let d = dir.clone();
        tokio::task::spawn_blocking(move || d.all());
    }
    let role = &state.shared.role;
    let me = dir.me().name.clone();
    let mut out = vec![MasterStateDto {
        name: me.clone(),
        api_url: dir.me().api_url.clone(),
        this: true,
        role: if role.following.is_some() {
            "follower"
        } else if role.suspended() {
            "leader (suspended)"
        } else {
            "leader"
        }
        .into(),
        term: Some(role.term()),
        pid: Some(std::process::id()),
        error: None,
    }];
    let others = peers.into_iter().filter(|p| p.name != me).map(|p| async move {
        let url = format!("{}/api/v1/health", p.api_url.trim_end_matches('/'));
        let asked = async {
            let r = client().get(&url).timeout(ASK_LIMIT).send().await?;
            // Up, but its health is not open (`open_health = false`).
            if matches!(r.status().as_u16(), 401 | 403) {
                return Ok(None);
            }
            r.error_for_status()?.json::<serde_json::Value>().await.map(Some)
        };
        let (role, term, pid, error) = match asked.await {
            Ok(Some(h)) => {
                let role = match (h["role"].as_str(), h["suspended"] == true) {
                    (Some("leader"), true) => "leader (suspended)".to_string(),
                    (Some(r), _) => r.to_string(),
                    (None, _) => "unknown".to_string(),
                };
                (role, h["term"].as_i64(), h["pid"].as_u64().map(|p| p as u32), None)
            }
            Ok(None) => ("answering (its health needs a token)".to_string(), None, None, None),
            Err(e) => ("unreachable".to_string(), None, None, Some(crate::error::ErrorChain(&e).to_string())),
        };
        MasterStateDto { name: p.name, api_url: p.api_url, this: false, role, term, pid, error }
    });
    out.extend(futures::future::join_all(others).await);
    out
}
