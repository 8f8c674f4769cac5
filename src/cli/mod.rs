//! The command-line client: `flotilla cluster|package|node|op|events|token`.
//! Where it finds the master, in order: `--api` /
//! `FLOTILLA_API` and `--token` / `FLOTILLA_TOKEN`, else the
//! `endpoints.json` that `flotilla dev` writes (`--endpoints`, by default
//! `./flotilla-data/endpoints.json`).
//!
//! Exit codes scripts can rely on: 0 done (a mutating verb: its operation
//! succeeded); 1 the master refused the request, or its operation failed or
//! was rolled back (the error is printed); 2 usage (bad flags); 3 the API is
//! unreachable or the token is refused. Mutating verbs wait for their
//! operation with a progress bar (`--no-wait`: print it and return).

pub mod actor;
pub mod cluster;
pub mod events;
pub mod inventory;
pub mod join_token;
pub mod pools;
pub mod token;
pub mod wait;

use std::path::PathBuf;

use serde_json::Value;

/// Exit codes.
pub const EXIT_FAILED: i32 = 1;
pub const EXIT_USAGE: i32 = 2;
pub const EXIT_UNREACHABLE: i32 = 3;

/// Where the master is, for every client verb. (No `Debug`: it holds the token.)
#[derive(Clone, clap::Args)]
pub struct Target {
    /// The master's API, `http://HOST:PORT`; several masters (on etcd):
    /// each one's, comma-separated (the leader is found and asked).
    #[arg(long, env = "FLOTILLA_API", global = true)]
    pub api: Option<String>,
    /// An API token (`flt_...`).
    #[arg(long, env = "FLOTILLA_TOKEN", global = true, hide_env_values = true)]
    pub token: Option<String>,
    /// The endpoints file `flotilla dev` writes (api_url and token).
    #[arg(long, global = true, default_value = "./flotilla-data/endpoints.json")]
    pub endpoints: PathBuf,
    /// Print JSON instead of a table.
    #[arg(long, global = true)]
    pub json: bool,
    /// For a mutating verb (cluster, package, token): show what it would do
    /// (for clusters: steps, new instances, which members restart or
    /// reload); change nothing. Read-only verbs ignore it.
    #[arg(long, global = true)]
    pub dry_run: bool,
}

/// Why a command failed, and the exit code that says so.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("{0}")]
    Usage(String),
    #[error("{0}")]
    Unreachable(String),
    /// The master answered with an error (`code`: its stable error code).
    #[error("{code}: {message}")]
    Api { status: u16, code: String, message: String },
    /// The operation ran and did not succeed (`status`: Failed, RolledBack, ...).
    #[error("operation {id} {status}: {message}")]
    Operation { id: String, status: String, message: String },
}

impl CliError {
    pub fn exit_code(&self) -> i32 {
        match self {
            CliError::Usage(_) => EXIT_USAGE,
            CliError::Unreachable(_) => EXIT_UNREACHABLE,
            CliError::Api { status: 401 | 403, .. } => EXIT_UNREACHABLE,
            CliError::Api { .. } | CliError::Operation { .. } => EXIT_FAILED,
        }
    }
}

/// Prints a line on stdout. A reader that went away (`flotilla events |
/// head`) ends the command quietly, as other command-line tools do (SIGPIPE
/// stays ignored: a write to a closed socket must be an error, not a kill).
pub fn out(line: impl std::fmt::Display) {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    if writeln!(stdout, "{line}").and_then(|()| stdout.flush()).is_err() {
        std::process::exit(0);
    }
}

/// Prints `v` as JSON when `--json` was given, else `human(v)`.
pub fn show(target: &Target, v: &Value, human: impl FnOnce(&Value) -> String) {
    if target.json {
        out(format!("{v:#}"));
    } else {
        out(human(v));
    }
}

/// `path` with `dry_run=true` when `--dry-run` was given.
pub fn dry(target: &Target, path: &str) -> String {
    match (target.dry_run, path.contains('?')) {
        (false, _) => path.to_string(),
        (true, true) => format!("{path}&dry_run=true"),
        (true, false) => format!("{path}?dry_run=true"),
    }
}

/// A dry run's answer for people.
pub fn describe_dry(v: &Value) -> String {
    format!("dry run: would {}; nothing was changed", v["would"].as_str().unwrap_or("do it"))
}

/// A string field (empty when missing), a number or `-`.
pub fn field(v: &Value, key: &str) -> String {
    match &v[key] {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    }
}

/// An API client for a master, or for several (on etcd, one leads): a
/// request answered `307` by a waiting master is sent again, token and
/// body included, to the leader it names, which is asked first from then
/// on; a master that cannot be reached gives way to the next one listed.
pub struct Client {
    http: reqwest::Client,
    /// `http://HOST:PORT/api/v1` of each master known, the one to ask first
    /// at `current`.
    bases: std::sync::Mutex<(Vec<String>, usize)>,
    token: String,
}

/// Redirects followed for one request (a waiting master names the leader:
/// one is enough, a few allow for an election under way).
const MAX_HOPS: usize = 4;

impl Client {
    /// From the flags, the environment, or the endpoints file.
    pub fn new(t: &Target) -> Result<Client, CliError> {
        let file = || -> Result<Value, CliError> {
            let bytes = std::fs::read(&t.endpoints).map_err(|e| {
                CliError::Usage(format!(
                    "no --api/--token (or FLOTILLA_API/FLOTILLA_TOKEN), and {} cannot be read: {e}",
                    t.endpoints.display()
                ))
            })?;
            serde_json::from_slice(&bytes)
                .map_err(|e| CliError::Usage(format!("{} is not an endpoints file: {e}", t.endpoints.display())))
        };
        let (api, token) = match (&t.api, &t.token) {
            (Some(a), Some(k)) => (a.clone(), k.clone()),
            (a, k) => {
                let f = file()?;
                let from = |key: &str| {
                    f[key]
                        .as_str()
                        .map(str::to_string)
                        .ok_or_else(|| CliError::Usage(format!("{} has no {key:?}", t.endpoints.display())))
                };
                // Several masters: every one's URL (`api_urls`), else the one.
                let all =
                    f["api_urls"].as_array().map(|l| l.iter().filter_map(|u| u.as_str()).collect::<Vec<_>>().join(","));
                let api = match (a.clone(), all.filter(|l| !l.is_empty())) {
                    (Some(a), _) => a,
                    (None, Some(all)) => all,
                    (None, None) => from("api_url")?,
                };
                (api, k.clone().map_or_else(|| from("token"), Ok)?)
            }
        };
        let http = reqwest::Client::builder()
            .no_proxy()
            .timeout(std::time::Duration::from_secs(150))
            // A master whose machine is gone gives way to the next soon.
            .connect_timeout(std::time::Duration::from_secs(3))
            // Followed here, with the token (reqwest drops it for another host).
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| CliError::Unreachable(format!("http client: {e}")))?;
        let bases: Vec<String> = api
            .split(',')
            .map(str::trim)
            .filter(|a| !a.is_empty())
            .map(|a| format!("{}/api/v1", a.trim_end_matches('/')))
            .collect();
        if bases.is_empty() {
            return Err(CliError::Usage("no master API URL".into()));
        }
        Ok(Client { http, bases: std::sync::Mutex::new((bases, 0)), token })
    }

    fn base(&self) -> (String, usize, usize) {
        let b = self.bases.lock().unwrap_or_else(|p| p.into_inner());
        (b.0[b.1].clone(), b.1, b.0.len())
    }

    /// Sends the request `build` makes for a URL (`base + path`): to the
    /// master asked first, the next ones when it cannot be reached, and
    /// the leader a waiting master redirects to.
    async fn send(
        &self,
        path: &str,
        build: impl Fn(&str) -> reqwest::RequestBuilder,
    ) -> Result<(reqwest::Response, String), CliError> {
        let (_, first, known) = self.base();
        let mut unreachable = 0;
        let mut hops = 0;
        loop {
            let (base, at, _) = self.base();
            let url = format!("{base}{path}");
            let resp = match build(&url).bearer_auth(&self.token).send().await {
                Ok(r) => r,
                Err(e) if e.is_connect() && unreachable + 1 < known => {
                    unreachable += 1;
                    let mut b = self.bases.lock().unwrap_or_else(|p| p.into_inner());
                    b.1 = (at + 1) % b.0.len();
                    continue;
                }
                Err(e) => {
                    let mut b = self.bases.lock().unwrap_or_else(|p| p.into_inner());
                    b.1 = first;
                    return Err(CliError::Unreachable(format!("{url}: {e}")));
                }
            };
            let status = resp.status();
            if (status == reqwest::StatusCode::TEMPORARY_REDIRECT || status == reqwest::StatusCode::PERMANENT_REDIRECT)
                && hops < MAX_HOPS
                && let Some(location) = resp.headers().get("location").and_then(|l| l.to_str().ok())
                && let Some(leader) = location.strip_suffix(path)
            {
                hops += 1;
                let mut b = self.bases.lock().unwrap_or_else(|p| p.into_inner());
                let leader = leader.to_string();
                b.1 = match b.0.iter().position(|x| *x == leader) {
                    Some(i) => i,
                    None => {
                        b.0.push(leader);
                        b.0.len() - 1
                    }
                };
                continue;
            }
            return Ok((resp, url));
        }
    }

    pub async fn get(&self, path: &str) -> Result<Value, CliError> {
        self.call(reqwest::Method::GET, path, None).await
    }

    /// Every item of a paged list (`?limit=&after=`, the answer's `next`).
    pub async fn get_all(&self, path: &str, key: &str) -> Result<Vec<Value>, CliError> {
        let sep = if path.contains('?') { '&' } else { '?' };
        let mut out = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let page_path = match &after {
                Some(a) => format!("{path}{sep}limit=1000&after={a}"),
                None => format!("{path}{sep}limit=1000"),
            };
            let v = self.get(&page_path).await?;
            out.extend(v[key].as_array().cloned().unwrap_or_default());
            match v["next"].as_str() {
                Some(n) => after = Some(n.to_string()),
                None => return Ok(out),
            }
        }
    }

    /// The raw response of `GET path` (for streams).
    pub async fn get_stream(&self, path: &str, last_id: Option<u64>) -> Result<reqwest::Response, CliError> {
        let (resp, _) = self
            .send(path, |url| {
                let req = self.http.get(url).timeout(std::time::Duration::from_secs(86_400 * 365));
                match last_id {
                    Some(id) => req.header("last-event-id", id.to_string()),
                    None => req,
                }
            })
            .await?;
        if resp.status().is_success() {
            return Ok(resp);
        }
        let status = resp.status();
        let v: Value = resp.json().await.unwrap_or(Value::Null);
        Err(CliError::Api {
            status: status.as_u16(),
            code: v["error"]["code"].as_str().unwrap_or_default().to_string(),
            message: v["error"]["message"].as_str().unwrap_or("").to_string(),
        })
    }

    /// `PUT path` with a binary body.
    pub async fn put_bytes(&self, path: &str, bytes: Vec<u8>) -> Result<Value, CliError> {
        // Shared, not copied, when a redirect sends it again.
        let bytes = bytes::Bytes::from(bytes);
        let (resp, url) = self.send(path, |url| self.http.put(url).body(bytes.clone())).await?;
        Self::answer(resp, &url).await
    }

    /// `method` on `path` (under `/api/v1`), with a JSON body if given.
    pub async fn call(&self, method: reqwest::Method, path: &str, body: Option<&Value>) -> Result<Value, CliError> {
        let (resp, url) = self
            .send(path, |url| {
                let req = self.http.request(method.clone(), url);
                match body {
                    Some(b) => req.json(b),
                    None => req,
                }
            })
            .await?;
        Self::answer(resp, &url).await
    }

    async fn answer(resp: reqwest::Response, url: &str) -> Result<Value, CliError> {
        let status = resp.status();
        let text = resp.text().await.map_err(|e| CliError::Unreachable(format!("{url}: {e}")))?;
        let v: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        if status.is_success() {
            return Ok(v);
        }
        let field = |k: &str| v["error"][k].as_str().unwrap_or_default().to_string();
        Err(CliError::Api {
            status: status.as_u16(),
            code: field("code"),
            message: if field("message").is_empty() { format!("HTTP {status}") } else { field("message") },
        })
    }
}

/// Left-aligned columns with a header row.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut s = String::new();
        for (i, (c, w)) in cells.iter().zip(&widths).enumerate() {
            if i + 1 == cells.len() {
                s.push_str(c);
            } else {
                s.push_str(&format!("{c:<w$}  "));
            }
        }
        s.trim_end().to_string()
    };
    let mut out = vec![line(header.to_vec())];
    out.extend(rows.iter().map(|r| line(r.iter().map(String::as_str).collect())));
    out.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_columns_and_exit_codes_follow_the_failure() {
        let t = table(&["ID", "NAME"], &[vec!["abc".into(), "x".into()], vec!["a".into(), "longer".into()]]);
        assert_eq!(t, "ID   NAME\nabc  x\na    longer");
        let api = |status| CliError::Api { status, code: "c".into(), message: "m".into() };
        assert_eq!(api(401).exit_code(), 3);
        assert_eq!(api(404).exit_code(), 1);
        assert_eq!(CliError::Unreachable("x".into()).exit_code(), 3);
        assert_eq!(CliError::Usage("x".into()).exit_code(), 2);
    }
}
