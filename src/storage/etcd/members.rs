//! The etcd members one master talks to: a client per member, and a
//! current one. A request that reached no member able to apply it (the
//! member is down: connection refused or timed out; it has no leader) is
//! tried on the next member; anything else is the answer. tonic's own
//! balancing kept sending to a killed member for seconds, and gives no say
//! on which failures may be retried: a write may be retried only when it
//! surely was not applied.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A client per member; cheap to clone.
#[derive(Clone)]
pub struct Members {
    clients: Arc<Vec<(String, etcd_client::Client)>>,
    current: Arc<AtomicUsize>,
}

impl std::fmt::Debug for Members {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.clients.iter().map(|(e, _)| e.as_str()).collect();
        f.debug_struct("Members").field("endpoints", &names).finish()
    }
}

impl Members {
    /// A client for each endpoint. Connections are made on first use, so a
    /// member down now is only skipped.
    pub async fn connect(
        endpoints: &[String],
        options: Option<etcd_client::ConnectOptions>,
    ) -> Result<Members, etcd_client::Error> {
        let mut clients = Vec::with_capacity(endpoints.len());
        for e in endpoints {
            clients.push((e.clone(), etcd_client::Client::connect([e.as_str()], options.clone()).await?));
        }
        if clients.is_empty() {
            return Err(etcd_client::Error::InvalidArgs("no etcd endpoint".into()));
        }
        Ok(Members { clients: Arc::new(clients), current: Arc::default() })
    }

    /// The member in use, and its index.
    pub fn pick(&self) -> (usize, etcd_client::Client) {
        let i = self.current.load(Ordering::Relaxed) % self.clients.len();
        (i, self.clients[i].1.clone())
    }

    /// Member `i` failed: the next one is used (unless another caller
    /// already moved on).
    pub fn failed(&self, i: usize) {
        let next = (i + 1) % self.clients.len();
        let _ = self.current.compare_exchange(i, next, Ordering::Relaxed, Ordering::Relaxed);
    }

    /// Runs `f` against the current member, then each other member once
    /// while the failure is one `retry` allows.
    pub async fn run<T, F, Fut>(
        &self,
        mut f: F,
        retry: fn(&etcd_client::Error) -> bool,
    ) -> Result<T, etcd_client::Error>
    where
        F: FnMut(etcd_client::Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let mut tries = self.clients.len();
        loop {
            let (i, client) = self.pick();
            match f(client).await {
                Ok(v) => return Ok(v),
                Err(e) => {
                    tries -= 1;
                    if tries == 0 || !retry(&e) {
                        if retry(&e) {
                            self.failed(i);
                        }
                        return Err(e);
                    }
                    tracing::debug!(member = %self.clients[i].0, error = %e, "etcd member failed; trying the next");
                    self.failed(i);
                }
            }
        }
    }
}

/// The request reached no member able to apply it: the connection could
/// not be made, or the member has no leader (`--require-leader`). A write
/// failing so was not applied, and may be sent to another member.
pub fn unreached(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::TransportError(_) => true,
        // Only a connection never made, or a member without a leader; not
        // etcd's "request timed out, possibly due to connection lost" (the
        // proposal may still apply) nor a connection reset mid-request.
        etcd_client::Error::GRpcStatus(s) => {
            let m = s.message();
            s.code() == tonic::Code::Unavailable
                && (m.contains("tcp connect error") || m.contains("error trying to connect") || m.contains("no leader"))
        }
        _ => false,
    }
}

/// A read may go to another member after any failure of the member or
/// the link (it changes nothing).
pub fn read_retryable(e: &etcd_client::Error) -> bool {
    unreached(e)
        || matches!(e, etcd_client::Error::GRpcStatus(s)
            if matches!(s.code(), tonic::Code::Unavailable | tonic::Code::DeadlineExceeded | tonic::Code::Unknown))
}
