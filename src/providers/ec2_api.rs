//! A small client of the EC2 Query API: requests signed with AWS
//! Signature Version 4 (HMAC-SHA256 over `sha2`, no SDK: see
//! docs/architecture.md for the cold-build figures that decided it), one
//! call at a time per rate slot, answers parsed with `roxmltree` and
//! errors classed for the launcher (EC2's error codes).

use std::collections::BTreeMap;
use std::time::Duration;

use sha2::{Digest, Sha256};
use time::OffsetDateTime;

use super::driver::{DriverError, ErrorClass};

/// The EC2 API version the requests speak.
pub const API_VERSION: &str = "2016-11-15";
/// An answer larger than this is refused (a page of 1,000 instances is
/// a few MiB).
const MAX_BODY: usize = 16 << 20;
/// One call, from send to the last byte of its answer.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// Where the API is and who calls it.
#[derive(Clone)]
pub struct Credentials {
    pub access_key_id: String,
    pub secret_access_key: String,
    pub session_token: Option<String>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials").field("access_key_id", &self.access_key_id).finish_non_exhaustive()
    }
}

impl Credentials {
    /// From `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY` (and
    /// `AWS_SESSION_TOKEN`, if set) in the master's environment: secrets
    /// never sit in its config file.
    pub fn from_env() -> Result<Credentials, String> {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let missing = |k: &str| format!("{k} is not set in the master's environment (the ec2 driver's credentials)");
        Ok(Credentials {
            access_key_id: var("AWS_ACCESS_KEY_ID").ok_or_else(|| missing("AWS_ACCESS_KEY_ID"))?,
            secret_access_key: var("AWS_SECRET_ACCESS_KEY").ok_or_else(|| missing("AWS_SECRET_ACCESS_KEY"))?,
            session_token: var("AWS_SESSION_TOKEN"),
        })
    }
}

pub struct Client {
    http: reqwest::Client,
    endpoint: reqwest::Url,
    region: String,
    creds: Credentials,
    /// The earliest moment the next call may be sent (`calls_per_second`).
    next_slot: tokio::sync::Mutex<tokio::time::Instant>,
    interval: Duration,
}

impl Client {
    pub fn new(
        endpoint: reqwest::Url,
        region: String,
        creds: Credentials,
        calls_per_second: u32,
    ) -> Result<Client, String> {
        let http = reqwest::Client::builder()
            .timeout(CALL_TIMEOUT)
            .connect_timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| format!("cannot make an HTTP client: {e}"))?;
        let interval = Duration::from_secs(1) / calls_per_second.max(1);
        Ok(Client {
            http,
            endpoint,
            region,
            creds,
            next_slot: tokio::sync::Mutex::new(tokio::time::Instant::now()),
            interval,
        })
    }

    /// Calls `action` with `params`; the answer's XML text, or the error
    /// classed by EC2's code.
    pub async fn call(&self, action: &str, params: &[(String, String)]) -> Result<String, DriverError> {
        {
            let mut slot = self.next_slot.lock().await;
            let now = tokio::time::Instant::now();
            let at = (*slot).max(now);
            *slot = at + self.interval;
            drop(slot);
            tokio::time::sleep_until(at).await;
        }
        let mut all: Vec<(String, String)> =
            vec![("Action".into(), action.into()), ("Version".into(), API_VERSION.into())];
        all.extend(params.iter().cloned());
        let body = form(&all);
        let headers = self.signed_headers(&body, OffsetDateTime::now_utc())?;
        let mut req = self.http.post(self.endpoint.clone()).body(body);
        // `host` is the one reqwest sends (the endpoint's, with its port).
        for (k, v) in headers.iter().filter(|(k, _)| *k != "host") {
            req = req.header(k, v);
        }
        let resp = req.send().await.map_err(|e| DriverError::transient(format!("{action}: {e}")))?;
        let status = resp.status();
        let text = read_capped(resp).await.map_err(|e| DriverError::transient(format!("{action}: {e}")))?;
        if status.is_success() {
            return Ok(text);
        }
        let (code, message) = error_of(&text).unwrap_or_else(|| (String::new(), text.clone()));
        // Bounded: it lands in events, the pool's last error and logs.
        let (code, message): (String, String) = (code.chars().take(100).collect(), message.chars().take(300).collect());
        let class = if code.is_empty() && status.is_server_error() { ErrorClass::Transient } else { classify(&code) };
        Err(DriverError::new(class, format!("{action}: {status} {code}: {message}")))
    }
}

impl Client {
    /// The headers of a POST of `body` at `now`, `authorization` included
    /// (and `host`, signed, which the HTTP client sends itself).
    pub fn signed_headers(&self, body: &str, now: OffsetDateTime) -> Result<BTreeMap<String, String>, DriverError> {
        let host = match (self.endpoint.host_str(), self.endpoint.port()) {
            (Some(h), Some(p)) => format!("{h}:{p}"),
            (Some(h), None) => h.to_string(),
            _ => return Err(DriverError::config(format!("endpoint {} has no host", self.endpoint))),
        };
        let mut headers = BTreeMap::from([
            ("content-type".to_string(), "application/x-www-form-urlencoded; charset=utf-8".to_string()),
            ("host".to_string(), host),
            ("x-amz-date".to_string(), amz_date(now)),
        ]);
        if let Some(t) = &self.creds.session_token {
            headers.insert("x-amz-security-token".into(), t.clone());
        }
        let path = if self.endpoint.path().is_empty() { "/" } else { self.endpoint.path() };
        let auth = sign(&self.creds, &self.region, "ec2", "POST", path, "", &headers, body.as_bytes(), now);
        headers.insert("authorization".into(), auth);
        Ok(headers)
    }
}

async fn read_capped(mut resp: reqwest::Response) -> Result<String, String> {
    let mut out = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(|e| e.to_string())? {
        if out.len() + chunk.len() > MAX_BODY {
            return Err(format!("an answer over {} MiB", MAX_BODY >> 20));
        }
        out.extend_from_slice(&chunk);
    }
    String::from_utf8(out).map_err(|_| "an answer that is not UTF-8".to_string())
}

/// How the launcher treats EC2 error `code`.
pub fn classify(code: &str) -> ErrorClass {
    match code {
        "InsufficientInstanceCapacity"
        | "InsufficientHostCapacity"
        | "InsufficientReservedInstanceCapacity"
        | "InsufficientCapacity"
        | "Unsupported" => ErrorClass::Capacity,
        "InstanceLimitExceeded"
        | "VcpuLimitExceeded"
        | "MaxSpotInstanceCountExceeded"
        | "InsufficientAddressCapacity"
        | "AddressLimitExceeded" => ErrorClass::Quota,
        "RequestLimitExceeded"
        | "Throttling"
        | "ThrottlingException"
        | "InternalError"
        | "InternalFailure"
        | "ServiceUnavailable"
        | "Unavailable"
        | "IdempotentParameterMismatch" => ErrorClass::Transient,
        // Credentials that stopped working (or a clock far off): no retry
        // mends them; the pool is broken until the master is given others.
        "ExpiredToken"
        | "RequestExpired"
        | "MissingAuthenticationToken"
        | "UnrecognizedClientException"
        | "InvalidClientTokenId" => ErrorClass::Config,
        c if c.starts_with("Invalid")
            || c.starts_with("Unauthorized")
            || c.starts_with("AuthFailure")
            || c.starts_with("MissingParameter")
            || c == "OptInRequired"
            || c == "Blocked"
            || c == "SignatureDoesNotMatch" =>
        {
            ErrorClass::Config
        }
        _ => ErrorClass::Transient,
    }
}

/// The first `<Error>`'s code and message of an EC2 error answer.
pub fn error_of(xml: &str) -> Option<(String, String)> {
    let doc = roxmltree::Document::parse(xml).ok()?;
    let e = doc.descendants().find(|n| n.has_tag_name("Error"))?;
    let text =
        |name: &str| e.children().find(|c| c.has_tag_name(name)).and_then(|c| c.text()).unwrap_or("").to_string();
    Some((text("Code"), text("Message")))
}

/// `application/x-www-form-urlencoded`, each part encoded as SigV4 wants.
pub fn form(params: &[(String, String)]) -> String {
    params.iter().map(|(k, v)| format!("{}={}", uri_encode(k), uri_encode(v))).collect::<Vec<_>>().join("&")
}

/// RFC 3986 percent-encoding of everything but the unreserved characters.
pub fn uri_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `YYYYMMDDTHHMMSSZ`.
pub fn amz_date(t: OffsetDateTime) -> String {
    format!("{:04}{:02}{:02}T{:02}{:02}{:02}Z", t.year(), t.month() as u8, t.day(), t.hour(), t.minute(), t.second())
}

/// HMAC-SHA256 (RFC 2104).
pub fn hmac(key: &[u8], msg: &[u8]) -> [u8; 32] {
    let mut k = [0u8; 64];
    if key.len() > 64 {
        k[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        k[..key.len()].copy_from_slice(key);
    }
    let mut inner = Sha256::new();
    inner.update(k.map(|b| b ^ 0x36));
    inner.update(msg);
    let mut outer = Sha256::new();
    outer.update(k.map(|b| b ^ 0x5c));
    outer.update(inner.finalize());
    outer.finalize().into()
}

/// The `Authorization` header of a request signed with SigV4. `headers`:
/// lower-case names, every one signed; `query`: the canonical query string.
#[allow(clippy::too_many_arguments)]
pub fn sign(
    creds: &Credentials,
    region: &str,
    service: &str,
    method: &str,
    path: &str,
    query: &str,
    headers: &BTreeMap<String, String>,
    payload: &[u8],
    now: OffsetDateTime,
) -> String {
    let date = amz_date(now);
    let day = &date[..8];
    let canonical_headers: String = headers.iter().map(|(k, v)| format!("{k}:{}\n", v.trim())).collect();
    let signed: Vec<&str> = headers.keys().map(String::as_str).collect();
    let signed = signed.join(";");
    let canonical =
        format!("{method}\n{path}\n{query}\n{canonical_headers}\n{signed}\n{}", hex::encode(Sha256::digest(payload)));
    let scope = format!("{day}/{region}/{service}/aws4_request");
    let to_sign = format!("AWS4-HMAC-SHA256\n{date}\n{scope}\n{}", hex::encode(Sha256::digest(canonical.as_bytes())));
    let k = hmac(format!("AWS4{}", creds.secret_access_key).as_bytes(), day.as_bytes());
    let k = hmac(&k, region.as_bytes());
    let k = hmac(&k, service.as_bytes());
    let k = hmac(&k, b"aws4_request");
    let signature = hex::encode(hmac(&k, to_sign.as_bytes()));
    format!(
        "AWS4-HMAC-SHA256 Credential={}/{scope}, SignedHeaders={signed}, Signature={signature}",
        creds.access_key_id
    )
}

/// One instance as `DescribeInstances` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instance {
    pub id: String,
    /// `pending`, `running`, `shutting-down`, `terminated`, `stopping`, `stopped`.
    pub state: String,
    pub tags: BTreeMap<String, String>,
}

/// The instances of a `DescribeInstances` or `RunInstances` answer
/// (`action`), and its `nextToken`. An answer that is not that action's
/// (another root, no `reservationSet` or `instancesSet`) is an error,
/// never an empty listing.
pub fn instances(xml: &str, action: &str) -> Result<(Vec<Instance>, Option<String>), DriverError> {
    let doc = roxmltree::Document::parse(xml)
        .map_err(|e| DriverError::transient(format!("an answer that is not XML: {e}")))?;
    let root = doc.root_element();
    let wrong = |what: &str| DriverError::transient(format!("{action}: an answer without {what}"));
    if root.tag_name().name() != format!("{action}Response") {
        return Err(wrong(&format!("<{action}Response>")));
    }
    // RunInstances answers one reservation's `instancesSet` at the root.
    let sets: Vec<roxmltree::Node<'_, '_>> = if action == "RunInstances" {
        vec![child(root, "instancesSet").ok_or_else(|| wrong("instancesSet"))?]
    } else {
        let reservations = child(root, "reservationSet").ok_or_else(|| wrong("reservationSet"))?;
        items(reservations).filter_map(|r| child(r, "instancesSet")).collect()
    };
    let mut out = Vec::new();
    for i in sets.into_iter().flat_map(items) {
        let id = text(i, "instanceId");
        if id.is_empty() {
            return Err(DriverError::transient("an instance without an instanceId in the answer"));
        }
        let state = child(i, "instanceState").map(|s| text(s, "name")).unwrap_or_default();
        let tags = child(i, "tagSet").into_iter().flat_map(items).map(|t| (text(t, "key"), text(t, "value"))).collect();
        out.push(Instance { id, state, tags });
    }
    let next = Some(text(root, "nextToken")).filter(|t| !t.is_empty());
    Ok((out, next))
}

fn child<'a, 'i>(n: roxmltree::Node<'a, 'i>, name: &str) -> Option<roxmltree::Node<'a, 'i>> {
    n.children().find(|c| c.has_tag_name(name))
}

fn text(n: roxmltree::Node<'_, '_>, name: &str) -> String {
    child(n, name).and_then(|c| c.text()).unwrap_or("").to_string()
}

fn items<'a, 'i>(n: roxmltree::Node<'a, 'i>) -> impl Iterator<Item = roxmltree::Node<'a, 'i>> {
    n.children().filter(|c| c.has_tag_name("item"))
}
