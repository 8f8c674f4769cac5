//! The `ec2` driver: each node an EC2 instance made by `RunInstances`,
//! tagged with the pool's tags and `Name` = its node id, whose user data
//! fetches the agent binary, checks its sha256, and starts it (under
//! systemd where there is one, else a restart loop) with its single-use
//! join token; `DescribeInstances` by tag lists the pool, and
//! `TerminateInstances` deletes (an instance already gone is a success).
//! EC2's error codes map to the launcher's classes
//! ([`ec2_api::classify`](super::ec2_api::classify)); calls are rate
//! limited per pool (`calls_per_second`).
//!
//! ```toml
//! [node_pools.settings]
//! region = "eu-west-1"
//! endpoint = "https://ec2.eu-west-1.amazonaws.com"  # the default, from the region
//! image_id = "ami-0abcdef1234567890"                # with curl, sha256sum, sh
//! instance_type = "m6i.large"
//! subnet_id = "subnet-0123"                         # optional
//! security_group_ids = ["sg-0123"]                  # optional
//! key_name = "ops"                                  # optional
//! agent_url = "https://artifacts.example.com/flotilla-1.4.0"  # the agent binary, fetched by the instance
//! agent_sha256 = "..."                              # default: the master's own binary's
//! master_host = "10.0.0.5"                          # how instances reach the master (default: the agent listener's address)
//! agent_dir = "/var/lib/flotilla-node"              # the default
//! port_range = "20000-29999"                        # the default
//! calls_per_second = 5                              # the default
//! ```
//!
//! Credentials come from `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`
//! and `AWS_SESSION_TOKEN` in the master's environment.

use std::sync::Arc;

use base64::Engine;
use futures::future::BoxFuture;

use super::driver::{
    Driver, DriverError, DriverQuota, ErrorClass, LaunchSpec, Resource, ResourceState, TAG_MASTER, TAG_POOL,
};
use super::ec2_api::{Client, Credentials, instances};
use super::ssh::scripts::{sq, supervisor, unit_file};

/// Pages of `DescribeInstances` a listing reads at most (1,000 each).
const MAX_PAGES: usize = 100;
const AGENT_DIR: &str = "/var/lib/flotilla-node";

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Keys {
    region: String,
    #[serde(default)]
    endpoint: Option<String>,
    image_id: String,
    instance_type: String,
    #[serde(default)]
    subnet_id: Option<String>,
    #[serde(default)]
    security_group_ids: Vec<String>,
    #[serde(default)]
    key_name: Option<String>,
    agent_url: String,
    #[serde(default)]
    agent_sha256: Option<String>,
    #[serde(default)]
    master_host: Option<String>,
    #[serde(default)]
    agent_dir: Option<String>,
    #[serde(default)]
    port_range: Option<String>,
    #[serde(default)]
    calls_per_second: Option<u32>,
}

/// An `ec2` pool's settings, checked.
#[derive(Debug, Clone)]
pub struct Ec2Settings {
    pub region: String,
    pub endpoint: reqwest::Url,
    pub image_id: String,
    pub instance_type: String,
    pub subnet_id: Option<String>,
    pub security_group_ids: Vec<String>,
    pub key_name: Option<String>,
    pub agent_url: String,
    pub agent_sha256: String,
    pub master_host: Option<String>,
    pub agent_dir: String,
    pub port_range: String,
    pub calls_per_second: u32,
    /// This installation's id and the pool's name (the listing's filter).
    pub install: String,
    pub pool: String,
}

/// A plain value for the user data and the API: no quoting surprises.
fn plain(key: &str, v: &str, extra: &str) -> Result<(), (String, String)> {
    let ok = !v.is_empty()
        && v.len() <= 255
        && v.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c) || extra.contains(c));
    if ok { Ok(()) } else { Err((key.to_string(), format!("{v:?}: letters, digits and -_.{extra} only"))) }
}

impl Ec2Settings {
    /// Checks `value` (a pool's `settings`); errors name the key.
    pub fn from_value(value: serde_json::Value, install: &str, pool: &str) -> Result<Ec2Settings, (String, String)> {
        let k: Keys =
            serde_path_to_error::deserialize(value).map_err(|e| (e.path().to_string(), e.inner().to_string()))?;
        plain("region", &k.region, "")?;
        plain("image_id", &k.image_id, "")?;
        plain("instance_type", &k.instance_type, "")?;
        if let Some(s) = &k.subnet_id {
            plain("subnet_id", s, "")?;
        }
        for (i, g) in k.security_group_ids.iter().enumerate() {
            plain(&format!("security_group_ids[{i}]"), g, "")?;
        }
        if let Some(s) = &k.key_name {
            plain("key_name", s, "")?;
        }
        if let Some(h) = &k.master_host {
            plain("master_host", h, ":")?;
        }
        let endpoint = k.endpoint.unwrap_or_else(|| format!("https://ec2.{}.amazonaws.com/", k.region));
        let endpoint: reqwest::Url =
            endpoint.parse().map_err(|e| ("endpoint".to_string(), format!("{endpoint:?}: {e}")))?;
        if !matches!(endpoint.scheme(), "http" | "https") || endpoint.host_str().is_none() {
            return Err(("endpoint".into(), format!("{endpoint}: an http(s) URL with a host")));
        }
        let url_ok = k.agent_url.starts_with("https://")
            || k.agent_url.starts_with("http://")
            || k.agent_url.starts_with("file:///");
        if !url_ok || k.agent_url.contains(['\'', '"', '\\', '$', '`', ' ', '\n']) {
            return Err((
                "agent_url".into(),
                format!("{:?}: an http(s) or file URL without quotes, spaces or $", k.agent_url),
            ));
        }
        let agent_sha256 = match k.agent_sha256 {
            Some(s) if s.len() == 64 && s.chars().all(|c| c.is_ascii_hexdigit()) => s.to_ascii_lowercase(),
            Some(s) => return Err(("agent_sha256".into(), format!("{s:?}: 64 hex digits"))),
            None => own_sha256().map_err(|m| ("agent_sha256".to_string(), m))?,
        };
        let agent_dir = k.agent_dir.unwrap_or_else(|| AGENT_DIR.into());
        if !agent_dir.starts_with('/') || agent_dir.split('/').any(|p| p == "..") {
            return Err(("agent_dir".into(), format!("{agent_dir:?}: an absolute path without ..")));
        }
        plain("agent_dir", &agent_dir, "/")?;
        let port_range = k.port_range.unwrap_or_else(|| "20000-29999".into());
        plain("port_range", &port_range, "")?;
        let calls_per_second = k.calls_per_second.unwrap_or(5);
        if !(1..=100).contains(&calls_per_second) {
            return Err(("calls_per_second".into(), format!("{calls_per_second}: 1 to 100")));
        }
        Ok(Ec2Settings {
            region: k.region,
            endpoint,
            image_id: k.image_id,
            instance_type: k.instance_type,
            subnet_id: k.subnet_id,
            security_group_ids: k.security_group_ids,
            key_name: k.key_name,
            agent_url: k.agent_url,
            agent_sha256,
            master_host: k.master_host,
            agent_dir: agent_dir.trim_end_matches('/').to_string(),
            port_range,
            calls_per_second,
            install: install.to_string(),
            pool: pool.to_string(),
        })
    }
}

/// The sha256 of this binary (the agent the instances run by default).
fn own_sha256() -> Result<String, String> {
    use sha2::Digest;
    let exe = std::env::current_exe().map_err(|e| format!("this binary: {e}"))?;
    let mut f = std::fs::File::open(&exe).map_err(|e| format!("{}: {e}", exe.display()))?;
    let mut h = sha2::Sha256::new();
    std::io::copy(&mut f, &mut h).map_err(|e| format!("{}: {e}", exe.display()))?;
    Ok(hex::encode(h.finalize()))
}

pub struct Ec2Driver {
    s: Ec2Settings,
    api: Arc<Client>,
}

impl Ec2Driver {
    pub fn new(s: Ec2Settings, creds: Credentials) -> Result<Ec2Driver, String> {
        let api = Client::new(s.endpoint.clone(), s.region.clone(), creds, s.calls_per_second)?;
        Ok(Ec2Driver { s, api: Arc::new(api) })
    }

    /// The script cloud-init runs at the instance's first boot.
    pub fn user_data(&self, spec: &LaunchSpec) -> Result<String, DriverError> {
        let master = match &self.s.master_host {
            Some(h) if h.contains(':') => h.clone(),
            Some(h) => format!("{h}:{}", spec.master_addr.port()),
            None if spec.master_addr.ip().is_unspecified() => {
                return Err(DriverError::config(format!(
                    "the agent listener is on every interface ({}): set settings.master_host to the address instances reach the master at",
                    spec.master_addr
                )));
            }
            None => spec.master_addr.to_string(),
        };
        let node = spec.node.as_str();
        let d = format!("{}/{node}", self.s.agent_dir);
        let mut args: Vec<String> = vec!["agent".into(), "--node-id".into(), node.into(), "--master".into(), master];
        args.extend(["--data-dir".into(), format!("{d}/agent"), "--port-range".into(), self.s.port_range.clone()]);
        args.push("--stop-instances-on-exit".into());
        for (k, v) in &spec.labels {
            args.extend(["--label".into(), format!("{k}={v}")]);
        }
        // Every argument is plain (checked): neither shell nor systemd quoting needed.
        let args = args.join(" ");
        let (sup, unit) = (supervisor(node, &d, &args), unit_file(node, &d, &args));
        Ok(format!(
            r#"#!/bin/sh
# flotilla agent of node {node} (written by flotilla's ec2 driver)
set -eu
d={d}
umask 022
mkdir -p "$d/bin" "$d/agent"
chmod 0711 "$d"
curl -fsS --retry 5 --retry-delay 2 -o "$d/bin/flotilla.part" {url}
got=$(sha256sum "$d/bin/flotilla.part" | cut -d' ' -f1)
if [ "$got" != {sum} ]; then echo "the agent binary's sha256 is $got, not {sum}" >&2; rm -f "$d/bin/flotilla.part"; exit 4; fi
chmod 0755 "$d/bin/flotilla.part"
mv -f "$d/bin/flotilla.part" "$d/bin/flotilla"
addr=$(hostname -I 2>/dev/null | cut -d' ' -f1)
(umask 077; printf 'FLOTILLA_AGENT_JOIN_TOKEN=%s\nFLOTILLA_AGENT_ADDRESS=%s\n' {token} "$addr" >"$d/agent.env")
if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
  cat >/etc/systemd/system/flotilla-agent-{node}.service <<'UNIT'
{unit}UNIT
  systemctl daemon-reload
  systemctl enable --now flotilla-agent-{node}.service
else
  cat >"$d/agent.sh" <<'SUP'
{sup}SUP
  chmod 0700 "$d/agent.sh"
  setsid sh "$d/agent.sh" </dev/null >>"$d/agent.log" 2>&1 &
fi
"#,
            url = sq(&self.s.agent_url),
            sum = sq(&self.s.agent_sha256),
            token = sq(&spec.join_token),
        ))
    }

    fn run_params(&self, spec: &LaunchSpec, token: &str, user_data: &str) -> Vec<(String, String)> {
        let mut p: Vec<(String, String)> = vec![
            ("ImageId".into(), self.s.image_id.clone()),
            ("InstanceType".into(), self.s.instance_type.clone()),
            ("MinCount".into(), "1".into()),
            ("MaxCount".into(), "1".into()),
            ("ClientToken".into(), token.into()),
            ("UserData".into(), base64::engine::general_purpose::STANDARD.encode(user_data)),
            ("TagSpecification.1.ResourceType".into(), "instance".into()),
            // IMDSv2 only: the user data (with its single-use token) is not
            // readable by a plain GET from whatever runs on the machine.
            ("MetadataOptions.HttpTokens".into(), "required".into()),
            // A machine shut down from inside is gone, not a stopped
            // instance the pool keeps paying for.
            ("InstanceInitiatedShutdownBehavior".into(), "terminate".into()),
        ];
        let mut tags = spec.tags.clone();
        tags.insert("Name".into(), spec.node.to_string());
        for (i, (k, v)) in tags.iter().enumerate() {
            p.push((format!("TagSpecification.1.Tag.{}.Key", i + 1), k.clone()));
            p.push((format!("TagSpecification.1.Tag.{}.Value", i + 1), v.clone()));
        }
        if let Some(s) = &self.s.subnet_id {
            p.push(("SubnetId".into(), s.clone()));
        }
        for (i, g) in self.s.security_group_ids.iter().enumerate() {
            p.push((format!("SecurityGroupId.{}", i + 1), g.clone()));
        }
        if let Some(k) = &self.s.key_name {
            p.push(("KeyName".into(), k.clone()));
        }
        p
    }
}

/// A resource state for an EC2 instance state.
fn state_of(s: &str) -> ResourceState {
    match s {
        "pending" => ResourceState::Pending,
        "running" => ResourceState::Running,
        "terminated" => ResourceState::Gone,
        _ => ResourceState::Stopping,
    }
}

fn not_found(e: &DriverError) -> bool {
    e.message.contains("InvalidInstanceID.NotFound")
}

impl Driver for Ec2Driver {
    fn kind(&self) -> &'static str {
        "ec2"
    }

    /// One `RunInstances`, retried (same idempotency token) only when its
    /// answer was lost or EC2 said to try again: a second instance is never
    /// made for one call.
    fn create<'a>(&'a self, spec: &'a LaunchSpec) -> BoxFuture<'a, Result<String, DriverError>> {
        Box::pin(async move {
            let user_data = self.user_data(spec)?;
            // The node id and a nonce: a try after an unwind must not be
            // answered with the instance the last one made (and terminated).
            let mut nonce = [0u8; 4];
            getrandom::fill(&mut nonce).map_err(|e| DriverError::transient(format!("no randomness: {e}")))?;
            let token: String = format!("{}.{}", spec.node, hex::encode(nonce))
                .chars()
                .rev()
                .take(64)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            let params = self.run_params(spec, &token, &user_data);
            let mut last = None;
            for wait in [0u64, 1, 2] {
                tokio::time::sleep(std::time::Duration::from_secs(wait)).await;
                // An answer lost or unreadable is asked again with the same
                // token: EC2 answers it with the instance it made, if any.
                let made = match self.api.call("RunInstances", &params).await {
                    Ok(xml) => instances(&xml, "RunInstances"),
                    Err(e) => Err(e),
                };
                match made {
                    Ok((made, _)) if !made.is_empty() => return Ok(made[0].id.clone()),
                    Ok(_) => last = Some(DriverError::transient("RunInstances answered no instance")),
                    Err(e) if e.class == ErrorClass::Transient => last = Some(e),
                    Err(e) => return Err(e),
                }
            }
            // Before giving up: an instance this token made, if EC2 shows one.
            let by_token = [
                ("Filter.1.Name".to_string(), "client-token".to_string()),
                ("Filter.1.Value.1".to_string(), token.clone()),
            ];
            if let Ok(xml) = self.api.call("DescribeInstances", &by_token).await
                && let Ok((found, _)) = instances(&xml, "DescribeInstances")
                && let Some(i) = found.into_iter().find(|i| i.state != "terminated")
            {
                return Ok(i.id);
            }
            Err(last.unwrap_or_else(|| DriverError::transient("RunInstances: no answer")))
        })
    }

    fn status<'a>(&'a self, external_id: &'a str) -> BoxFuture<'a, Result<ResourceState, DriverError>> {
        Box::pin(async move {
            let params = [("InstanceId.1".to_string(), external_id.to_string())];
            match self.api.call("DescribeInstances", &params).await {
                Ok(xml) => {
                    let (found, _) = instances(&xml, "DescribeInstances")?;
                    Ok(found
                        .iter()
                        .find(|i| i.id == external_id)
                        .map(|i| state_of(&i.state))
                        .unwrap_or(ResourceState::Gone))
                }
                Err(e) if not_found(&e) => Ok(ResourceState::Gone),
                Err(e) => Err(e),
            }
        })
    }

    fn delete<'a>(&'a self, external_id: &'a str) -> BoxFuture<'a, Result<(), DriverError>> {
        Box::pin(async move {
            let params = [("InstanceId.1".to_string(), external_id.to_string())];
            match self.api.call("TerminateInstances", &params).await {
                Ok(_) => Ok(()),
                Err(e) if not_found(&e) => Ok(()),
                Err(e) => Err(e),
            }
        })
    }

    /// Every instance of this installation's pool not terminated, page by
    /// page; any page failing fails the whole listing.
    fn list(&self) -> BoxFuture<'_, Result<Vec<Resource>, DriverError>> {
        Box::pin(async move {
            let mut params: Vec<(String, String)> = vec![
                ("Filter.1.Name".into(), format!("tag:{TAG_MASTER}")),
                ("Filter.1.Value.1".into(), self.s.install.clone()),
                ("Filter.2.Name".into(), format!("tag:{TAG_POOL}")),
                ("Filter.2.Value.1".into(), self.s.pool.clone()),
                ("Filter.3.Name".into(), "instance-state-name".into()),
            ];
            for (i, s) in ["pending", "running", "shutting-down", "stopping", "stopped"].iter().enumerate() {
                params.push((format!("Filter.3.Value.{}", i + 1), s.to_string()));
            }
            params.push(("MaxResults".into(), "1000".into()));
            let mut out = Vec::new();
            let mut next: Option<String> = None;
            for _ in 0..MAX_PAGES {
                let mut p = params.clone();
                if let Some(t) = &next {
                    p.push(("NextToken".into(), t.clone()));
                }
                let (page, more) = instances(&self.api.call("DescribeInstances", &p).await?, "DescribeInstances")?;
                out.extend(page.into_iter().map(|i| Resource {
                    external_id: i.id,
                    state: state_of(&i.state),
                    tags: i.tags,
                }));
                match more {
                    Some(t) => next = Some(t),
                    None => return Ok(out),
                }
            }
            Err(DriverError::transient(format!("more than {MAX_PAGES} pages of instances: the listing is not whole")))
        })
    }

    fn quota(&self) -> BoxFuture<'_, Result<DriverQuota, DriverError>> {
        Box::pin(async { Ok(DriverQuota::default()) })
    }
}

#[cfg(test)]
#[path = "ec2_tests.rs"]
mod tests;
