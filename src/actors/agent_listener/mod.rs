//! The master's agent listener: TLS, then the first frame decides.
//!
//! - A connection that presents a certificate must open with `Hello`; the
//!   node is the one [`Trust`] issued that certificate to, and a `Hello`
//!   naming another node is refused. The `Hello` is checked ([`hello`]),
//!   the node registered, and the connection handed to a
//!   `NodeManagerActor`.
//! - A connection without one may only enroll: a join token in, a
//!   certificate out, then the master closes it.
//!
//! Anything else is refused with a `Refused` frame saying why, before any
//! state changes. The listener holds at most `max_connections` agent
//! connections (the live links and the handshakes under way) and runs at
//! most `max_handshakes` TLS and protocol handshakes at once; past that a
//! new connection waits in the kernel's backlog. One source address holds
//! at most `max_handshakes_per_source` of them; a connection past that is
//! closed at once.

pub mod hello;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use time::OffsetDateTime;
use tokio::net::TcpListener;
use tokio::time::Instant;
use tokio_util::codec::{Framed, FramedWrite};

use super::Shared;
use super::node_manager::NodeManagerActor;
use super::supervisor::Supervisor;
use super::trust::Trust;
use crate::error::Error;
use crate::protocol::codec::MasterCodec;
use crate::protocol::handshake::{LinkStream, Opening, master_open, refuse, welcome};
use crate::protocol::messages::{MasterFrame, PROTOCOL_VERSION, Welcome};
use crate::protocol::tls::fingerprint;

/// The largest opening frame of a connection without a certificate.
const ENROLL_FRAME_MAX: usize = 4096;
use crate::storage::WriteOp;
use crate::storage::records::{NodeRecord, RECORD_VERSION};

/// What the listener needs besides the actors.
#[derive(Clone)]
pub struct ListenerConfig {
    pub heartbeat_interval: Duration,
    pub handshake_timeout: Duration,
    /// The master's own listening addresses (see [`hello::check`]).
    pub own_addrs: Vec<SocketAddr>,
    pub max_connections: usize,
    pub max_handshakes: usize,
    pub max_handshakes_per_source: usize,
}

/// Handshakes in flight per source address.
#[derive(Default)]
struct PerSource(std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>);

/// One source's handshake slot, given back when dropped.
struct SourceSlot(Arc<PerSource>, std::net::IpAddr);

/// The source a connection counts against: an IPv4 address (also when
/// mapped into IPv6), or an IPv6 /64, which one host may fill with
/// addresses of its own.
fn source_of(ip: std::net::IpAddr) -> std::net::IpAddr {
    match ip.to_canonical() {
        std::net::IpAddr::V6(v6) => {
            let bits = u128::from(v6) & !((1u128 << 64) - 1);
            std::net::IpAddr::V6(std::net::Ipv6Addr::from(bits))
        }
        v4 => v4,
    }
}

impl PerSource {
    fn take(self: &Arc<Self>, ip: std::net::IpAddr, max: usize) -> Option<SourceSlot> {
        let ip = source_of(ip);
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let n = map.entry(ip).or_default();
        if *n >= max {
            return None;
        }
        *n += 1;
        Some(SourceSlot(self.clone(), ip))
    }
}

impl Drop for SourceSlot {
    fn drop(&mut self) {
        let mut map = self.0.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = map.get_mut(&self.1) {
            *n -= 1;
            if *n == 0 {
                map.remove(&self.1);
            }
        }
    }
}

/// Accepts agent connections until the process ends.
pub async fn run(
    listener: TcpListener,
    shared: Shared,
    supervisor: actix::Addr<Supervisor>,
    trust: Arc<Trust>,
    cfg: ListenerConfig,
) {
    let handshakes = Arc::new(tokio::sync::Semaphore::new(cfg.max_handshakes.max(1)));
    let per_source = Arc::new(PerSource::default());
    let (mut refused, mut last_warned) = (0u64, None::<Instant>);
    loop {
        // Waits here while the handshakes are all taken: new agents queue
        // in the backlog instead of in tasks.
        let Ok(permit) = handshakes.clone().acquire_owned().await else { return };
        let (stream, peer) = match listener.accept().await {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(error = %e, "accepting an agent connection failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let in_flight = cfg.max_handshakes.max(1) - handshakes.available_permits();
        if shared.links.len() + in_flight > cfg.max_connections {
            tracing::warn!(%peer, max = cfg.max_connections, "agent connection refused: the listener is full");
            continue;
        }
        let Some(source) = per_source.take(peer.ip(), cfg.max_handshakes_per_source.max(1)) else {
            refused += 1;
            // A flood of them is not a flood of log lines: one a second.
            if last_warned.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
                tracing::warn!(%peer, max = cfg.max_handshakes_per_source, refused, "agent connections refused: their address has as many handshakes under way as one source may");
                last_warned = Some(Instant::now());
                refused = 0;
            }
            continue;
        };
        let (shared, supervisor, trust, cfg) = (shared.clone(), supervisor.clone(), trust.clone(), cfg.clone());
        actix::spawn(async move {
            let result = admit(stream, peer, &shared, &supervisor, &trust, &cfg).await;
            drop((permit, source));
            if let Err(e) = result {
                tracing::warn!(%peer, error = %e, "agent not admitted");
            }
        });
    }
}

/// TLS, the opening frame, then enrollment or registration.
async fn admit(
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    shared: &Shared,
    supervisor: &actix::Addr<Supervisor>,
    trust: &Arc<Trust>,
    cfg: &ListenerConfig,
) -> Result<(), String> {
    let deadline = Instant::now() + cfg.handshake_timeout;
    if let Err(e) = crate::protocol::socket::prepare(&stream) {
        tracing::debug!(%peer, error = %e, "socket options not set");
    }
    let tls = tokio::time::timeout_at(deadline, trust.acceptor().accept(stream))
        .await
        .map_err(|_| "TLS handshake timed out".to_string())?
        .map_err(|e| format!("TLS handshake failed: {}", crate::error::ErrorChain(&e)))?;
    let presented = tls.get_ref().1.peer_certificates().and_then(|c| c.first()).map(|c| fingerprint(c));
    let stream: LinkStream = Box::new(tls);
    let mut framed = Framed::new(stream, MasterCodec::default());
    // Without a certificate only an enrollment may come: a few hundred bytes.
    if presented.is_none() {
        framed.codec_mut().set_max_frame(ENROLL_FRAME_MAX);
    }
    let opening = master_open(&mut framed, PROTOCOL_VERSION, deadline)
        .await
        .map_err(|e| crate::error::ErrorChain(&e).to_string())?;
    let hello = match (opening, presented) {
        (Opening::Enroll(request), _) => {
            let node = request.node_id.clone();
            let enrolled = tokio::time::timeout_at(deadline, trust.enroll(&request))
                .await
                .map_err(|_| format!("enrollment of {node} timed out waiting for the store"))?;
            return match enrolled {
                Ok((enrolled, record)) => {
                    tracing::info!(%node, %peer, certificate = %hex::encode(record.fingerprint), token = %record.token_id, "node enrolled");
                    let sent = tokio::time::timeout_at(
                        deadline,
                        futures::SinkExt::send(&mut framed, MasterFrame::Enrolled(enrolled)),
                    );
                    sent.await.map_err(|_| "sending the certificate timed out".to_string())?.map_err(|e| e.to_string())
                }
                // What asking again cannot change is refused, and the agent
                // stops; anything else (the store busy or stopping) just
                // ends the connection, and the agent tries again.
                Err(e @ (Error::Invalid { .. } | Error::Conflict { .. } | Error::NotFound { .. })) => {
                    refuse(&mut framed, e.to_string(), deadline).await;
                    Err(format!("enrollment of {node} refused: {e}"))
                }
                Err(e) => Err(format!("enrollment of {node} not done, the agent will retry: {e}")),
            };
        }
        (Opening::Hello(_), None) => {
            let reason = "this agent has no certificate: enroll it with a join token (`flotilla node token create`)";
            refuse(&mut framed, reason.into(), deadline).await;
            return Err(reason.into());
        }
        (Opening::Hello(hello), Some(fp)) => match trust.identify(&fp) {
            Ok(node) if node == hello.node_id => hello,
            Ok(node) => {
                let reason = format!("this certificate is node {node}'s, not {}", hello.node_id);
                refuse(&mut framed, reason.clone(), deadline).await;
                return Err(reason);
            }
            Err(reason) => {
                refuse(&mut framed, reason.clone(), deadline).await;
                return Err(reason);
            }
        },
    };
    if let Err(reason) = hello::check(&hello, &cfg.own_addrs) {
        let reason = format!("Hello from {}: {reason}", hello.node_id);
        refuse(&mut framed, reason.clone(), deadline).await;
        return Err(reason);
    }
    let node = hello.node_id.clone();
    let record = NodeRecord {
        version: RECORD_VERSION,
        id: node.clone(),
        address: hello.address.as_str().into(),
        port_range: hello.port_range,
        labels: hello.labels.clone(),
        cgroups: hello.cgroups,
        resource_limits: hello.resource_limits,
        agent_version: hello.agent_version.clone(),
        instance_root: hello.instance_root.clone(),
        registered_at: OffsetDateTime::now_utc(),
        simulated: hello.simulated,
    };
    // A node seen before with the same registration needs no write: a
    // thousand agents reconnecting after a master restart cost no fsync.
    let known = shared.read_model.node(&node).map(|n| n.record());
    let changed = known.as_ref().is_none_or(|k| NodeRecord { registered_at: k.registered_at, ..record.clone() } != **k);
    if changed {
        let op = WriteOp::put_node(&record).map_err(|e| e.to_string())?;
        tokio::time::timeout_at(deadline, shared.store.try_commit(vec![op]))
            .await
            .map_err(|_| "registering the node timed out waiting for the store".to_string())?
            .map_err(|e| e.to_string())?;
    }
    let entry = match shared.read_model.node(&node) {
        Some(e) if !changed => e,
        _ => shared.read_model.register_node(record),
    };
    // Identified by its certificate: its frames may be full size.
    framed.codec_mut().set_max_frame(usize::MAX);
    let beat = Welcome {
        protocol_version: PROTOCOL_VERSION,
        heartbeat_interval_ms: cfg.heartbeat_interval.as_millis() as u64,
    };
    welcome(&mut framed, beat, deadline).await.map_err(|e| crate::error::ErrorChain(&e).to_string())?;
    tracing::info!(%node, %peer, instances = hello.inventory.len(), simulated = hello.simulated, "agent registered");
    let (reader, write_half) = crate::protocol::handshake::split_after_handshake(framed);
    let writer = FramedWrite::new(write_half, MasterCodec::default());
    let link = NodeManagerActor::start_for(node.clone(), reader, writer, entry, shared.clone());
    // A revocation that landed while this connection was being admitted
    // looked for the node's link before this one was registered: look at
    // the certificate again now that it is (the revocation swaps its table
    // before it looks, so one of the two sees the other).
    if let Some(fp) = presented
        && let Err(reason) = trust.identify(&fp)
    {
        link.close();
        return Err(reason);
    }
    let slot = super::read_model::Reservation::counted(&shared.supervisor);
    supervisor.do_send(super::supervisor::NodeInventory {
        node,
        connection: link.connection,
        reports: hello.inventory,
        unrecorded: hello.unrecorded,
        slot,
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use super::source_of;

    #[test]
    fn a_source_is_an_ipv4_address_or_an_ipv6_64() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert_eq!(source_of(ip("10.1.2.3")), ip("10.1.2.3"));
        assert_eq!(source_of(ip("::ffff:10.1.2.3")), ip("10.1.2.3"), "mapped IPv4 is IPv4");
        assert_eq!(source_of(ip("2001:db8:1:2:aaaa:bbbb:cccc:dddd")), ip("2001:db8:1:2::"));
        assert_eq!(source_of(ip("2001:db8:1:2::7")), source_of(ip("2001:db8:1:2:ffff::1")), "one /64");
        assert_ne!(source_of(ip("2001:db8:1:2::7")), source_of(ip("2001:db8:1:3::7")));
    }
}
