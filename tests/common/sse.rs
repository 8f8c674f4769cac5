//! A test client of `GET /api/v1/events`: reads server-sent events off a
//! real HTTP response, one at a time.

use std::time::Duration;

use serde_json::Value;

/// One event as the stream sent it.
#[derive(Debug, Clone, PartialEq)]
pub struct Sse {
    /// `None` for an event without `id:` (`dropped`).
    pub id: Option<u64>,
    pub kind: String,
    pub data: Value,
}

pub struct SseReader {
    resp: reqwest::Response,
    buf: Vec<u8>,
}

impl SseReader {
    /// Opens `GET {api}/events{query}` with `last_id` as `Last-Event-ID`.
    pub async fn open(client: &reqwest::Client, api: &str, query: &str, last_id: Option<u64>) -> SseReader {
        let mut req = client.get(format!("{api}/events{query}")).timeout(Duration::from_secs(3600));
        if let Some(id) = last_id {
            req = req.header("last-event-id", id.to_string());
        }
        let resp = req.send().await.expect("GET /events");
        assert_eq!(resp.status(), reqwest::StatusCode::OK, "GET /events{query}");
        let ct = resp.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
        assert!(ct.starts_with("text/event-stream"), "content type {ct}");
        SseReader { resp, buf: Vec::new() }
    }

    /// The next event (comments skipped), or `None` if none came within
    /// `wait` or the stream ended.
    pub async fn next(&mut self, wait: Duration) -> Option<Sse> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            if let Some(end) = self.buf.windows(2).position(|w| w == b"\n\n") {
                let block: Vec<u8> = self.buf.drain(..end + 2).collect();
                let text = String::from_utf8_lossy(&block).to_string();
                let (mut id, mut kind, mut data) = (None, String::from("message"), String::new());
                for line in text.lines() {
                    if let Some(v) = line.strip_prefix("id: ") {
                        id = Some(v.parse().expect("a numeric id"));
                    } else if let Some(v) = line.strip_prefix("event: ") {
                        kind = v.to_string();
                    } else if let Some(v) = line.strip_prefix("data: ") {
                        data.push_str(v);
                    }
                }
                if data.is_empty() {
                    continue; // a comment (keepalive)
                }
                let data = serde_json::from_str(&data).unwrap_or_else(|e| panic!("data is not JSON ({e}): {data}"));
                return Some(Sse { id, kind, data });
            }
            match tokio::time::timeout_at(deadline, self.resp.chunk()).await {
                Ok(Ok(Some(bytes))) => self.buf.extend_from_slice(&bytes),
                _ => return None,
            }
        }
    }

    /// Every event until `stop` says so (inclusive), within `wait` overall.
    pub async fn until(&mut self, wait: Duration, stop: impl Fn(&Sse) -> bool) -> Vec<Sse> {
        let deadline = tokio::time::Instant::now() + wait;
        let mut out = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match self.next(left).await {
                Some(e) => {
                    let done = stop(&e);
                    out.push(e);
                    if done {
                        return out;
                    }
                }
                None => panic!("the stream stopped before the expected event; got {} events: {out:#?}", out.len()),
            }
        }
    }
}
