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
//! Anything else is refused with a `Refusal` frame saying why, before any
//! state changes.
//!
//! # Who gets in while the listener is under a flood
//!
//! Before its handshake is done nothing tells a reconnecting agent from
//! an attacker's connection, so the listener bounds what each phase of a
//! connection may hold, and keeps room for what can prove itself soonest
//! ([`admission`] keeps the books):
//!
//! 1. **Accepted, waiting for its ClientHello.** Every connection is
//!    accepted at once (nothing waits in the kernel's backlog behind idle
//!    sockets) and counted against `max_agent_connections` (links
//!    included), its address (`max_agent_handshakes_per_source`; an IPv6
//!    /64 counts as one address) and its subnet
//!    (`max_agent_handshakes_per_subnet`: an IPv4 /24, an IPv6 /64); past
//!    any of them it is closed at once. It must send a whole TLS
//!    ClientHello within `first_bytes_timeout` (3 s), else it is closed:
//!    a socket that sends nothing, or something that is not TLS, costs a
//!    task and a few seconds of one count, never a handshake slot.
//! 2. **ClientHello in, TLS under way.** Now the connection takes a
//!    handshake slot, which it holds until it is admitted or closed (the
//!    TLS handshake and then the protocol's): `max_agent_handshakes`
//!    general slots anyone may take, and `reserved_agent_handshakes` kept
//!    for connections whose ClientHello names (as an ALPN protocol, see
//!    [`crate::protocol::tls::certificate_claim`]) a certificate this
//!    master issued and has not revoked. A claim is only a word at this
//!    point, so the reserved room is bounded per certificate: one slot
//!    under each, and a connection holding one must finish TLS within
//!    `first_bytes_timeout` and present that very certificate, or it is
//!    closed. The reserved slot gives the address's and subnet's counts
//!    back. A claim that is not a live certificate of this master, an
//!    enrollment, or a second claim of a certificate already holding a
//!    reserved slot waits for a general slot (a claim takes whichever
//!    comes free first), up to `handshake_timeout` from the accept.
//! 3. **TLS done.** Enrollment or registration, as above, in the slot.
//!
//! So idle sockets never delay anyone past their own few seconds, and
//! garbage that does speak TLS (a ClientHello, then silence) fills at
//! most the general slots: an enrolled agent's reconnect takes a reserved
//! slot at once and is through in a round trip or two. To keep it out an
//! attacker must replay the ClientHellos of enrolled agents (they travel
//! in the clear), and then holds one slot per certificate replayed, for
//! `first_bytes_timeout` at a time; the agent whose claim is held still
//! waits for a general slot as before. What the subnet cap cannot help is
//! an agent sharing an address or /24 with the flood: its connections are
//! counted with the flood's until they send their ClientHello.
//!
//! Every refusal is counted in `flotilla_agent_connections_refused_total`
//! by reason; the ones anyone can cause in bulk without a byte of TLS
//! (caps, the first-bytes deadline, not TLS) are logged as a count once a
//! second per kind, the others one line each with the peer and the cause.

pub mod admission;
pub mod hello;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use time::OffsetDateTime;
use tokio::net::TcpListener;
use tokio::time::Instant;
use tokio_util::codec::{Framed, FramedWrite};

use self::admission::{Admission, Limits, Refusal, Ticket};
use super::Shared;
use super::node_manager::NodeManagerActor;
use super::supervisor::Supervisor;
use super::trust::Trust;
use crate::error::Error;
use crate::protocol::codec::MasterCodec;
use crate::protocol::handshake::{LinkStream, Opening, master_open, refuse, welcome};
use crate::protocol::messages::{MasterFrame, PROTOCOL_VERSION, Welcome};
use crate::protocol::tls::{claimed_certificate, fingerprint};
use crate::storage::WriteOp;
use crate::storage::records::{NodeRecord, RECORD_VERSION};

/// The largest opening frame of a connection without a certificate.
const ENROLL_FRAME_MAX: usize = 4096;

/// What the listener needs besides the actors.
#[derive(Clone)]
pub struct ListenerConfig {
    pub heartbeat_interval: Duration,
    pub handshake_timeout: Duration,
    /// A whole ClientHello must be in within this of the accept.
    pub first_bytes_timeout: Duration,
    /// The master's own listening addresses (see [`hello::check`]).
    pub own_addrs: Vec<SocketAddr>,
    pub limits: Limits,
}

/// Accepts agent connections until the process ends.
pub async fn run(
    listener: Arc<TcpListener>,
    shared: Shared,
    supervisor: actix::Addr<Supervisor>,
    trust: Arc<Trust>,
    cfg: ListenerConfig,
) {
    let admission = Admission::new(cfg.limits);
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(error = %e, "accepting an agent connection failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        // Counted before a byte is read; closed at once past a cap.
        let ticket = match admission.enter(peer.ip(), shared.links.len()) {
            Ok(t) => t,
            Err(refusal) => {
                admission.refused(refusal, peer, cfg.first_bytes_timeout);
                continue;
            }
        };
        let (shared, supervisor, trust, cfg, admission) =
            (shared.clone(), supervisor.clone(), trust.clone(), cfg.clone(), admission.clone());
        actix::spawn(async move {
            // The ticket lives in `admit` and is given back when it returns.
            if let Err((refusal, reason)) = admit(stream, peer, ticket, &shared, &supervisor, &trust, &cfg).await {
                admission.refused(refusal, peer, cfg.first_bytes_timeout);
                if !refusal.is_bulk() {
                    tracing::warn!(%peer, kind = refusal.label(), error = %reason, "agent not admitted");
                }
            }
        });
    }
}

/// The ClientHello, a handshake slot, TLS (the module doc's phases 1 and
/// 2), then [`register`]; `ticket` is held throughout.
async fn admit(
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    mut ticket: Ticket,
    shared: &Shared,
    supervisor: &actix::Addr<Supervisor>,
    trust: &Arc<Trust>,
    cfg: &ListenerConfig,
) -> Result<(), (Refusal, String)> {
    let deadline = Instant::now() + cfg.handshake_timeout;
    if let Err(e) = crate::protocol::socket::prepare(&stream) {
        tracing::debug!(%peer, error = %e, "socket options not set");
    }
    let first_bytes = (Instant::now() + cfg.first_bytes_timeout).min(deadline);
    let acceptor = tokio_rustls::LazyConfigAcceptor::new(rustls::server::Acceptor::default(), stream);
    let start = match tokio::time::timeout_at(first_bytes, acceptor).await {
        Err(_) => return Err((Refusal::NoClientHello, String::new())),
        Ok(Err(e)) => return Err((Refusal::NotTls, e.to_string())),
        Ok(Ok(start)) => start,
    };
    // Only a live certificate of this master is worth the reserved room;
    // any other claim is as good as none.
    let claim =
        claimed_certificate(start.client_hello().alpn().into_iter().flatten()).filter(|fp| trust.identify(fp).is_ok());
    tokio::time::timeout_at(deadline, ticket.take_slot(claim)).await.map_err(|_| {
        (Refusal::NoSlot, format!("no handshake slot came free within handshake_timeout ({:?})", cfg.handshake_timeout))
    })?;
    // A reserved slot is the room kept for agents' reconnects: its holder
    // gets a round trip's worth of time to prove its claim, not the whole
    // handshake's, so a replayed claim holds it only briefly.
    let tls_deadline = match ticket.reserved_for() {
        Some(_) => (Instant::now() + cfg.first_bytes_timeout).min(deadline),
        None => deadline,
    };
    let tls = tokio::time::timeout_at(tls_deadline, start.into_stream(trust.acceptor().config().clone()))
        .await
        .map_err(|_| (Refusal::Tls, "TLS handshake timed out".to_string()))?
        .map_err(|e| (Refusal::Tls, format!("TLS handshake failed: {}", crate::error::ErrorChain(&e))))?;
    let presented = tls.get_ref().1.peer_certificates().and_then(|c| c.first()).map(|c| fingerprint(c));
    if let Some(claimed) = ticket.reserved_for()
        && presented != Some(claimed)
    {
        let what = presented.map_or_else(|| "none".to_string(), hex::encode);
        let reason = format!("its ClientHello named certificate {}, it presented {what}", hex::encode(claimed));
        return Err((Refusal::ClaimBroken, reason));
    }
    let result = register(Box::new(tls), presented, peer, deadline, shared, supervisor, trust, cfg).await;
    drop(ticket);
    result.map_err(|reason| (Refusal::Protocol, reason))
}

/// After TLS: the opening frame, then enrollment or registration, within
/// `deadline`; `presented` is the certificate the agent presented.
#[allow(clippy::too_many_arguments)]
async fn register(
    stream: LinkStream,
    presented: Option<crate::protocol::tls::Fingerprint>,
    peer: SocketAddr,
    deadline: Instant,
    shared: &Shared,
    supervisor: &actix::Addr<Supervisor>,
    trust: &Arc<Trust>,
    cfg: &ListenerConfig,
) -> Result<(), String> {
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
    // A master whose leadership is suspended takes no agent: another may
    // lead by now (the agent tries the next master it knows).
    if !shared.role.may_act() {
        let reason = "this master's leadership is suspended (its lease could not be renewed): try another master";
        refuse(&mut framed, reason.into(), deadline).await;
        return Err(reason.into());
    }
    // Identified by its certificate: its frames may be full size.
    framed.codec_mut().set_max_frame(usize::MAX);
    let beat = Welcome {
        protocol_version: PROTOCOL_VERSION,
        heartbeat_interval_ms: cfg.heartbeat_interval.as_millis() as u64,
        term: shared.role.term(),
    };
    welcome(&mut framed, beat, deadline).await.map_err(|e| crate::error::ErrorChain(&e).to_string())?;
    tracing::info!(%node, %peer, instances = hello.inventory.len(), simulated = hello.simulated, "agent registered");
    let (reader, write_half) = crate::protocol::handshake::split_after_handshake(framed);
    let writer = FramedWrite::new(write_half, MasterCodec::default());
    let link =
        NodeManagerActor::start_for(node.clone(), reader, writer, entry, shared.clone(), hello.inventory.clone());
    // A revocation that landed while this connection was being admitted
    // looked for the node's link before this one was registered: look at
    // the certificate again now that it is (the revocation swaps its table
    // before it looks, so one of the two sees the other).
    if let Some(fp) = presented
        && let Err(reason) = trust.identify(&fp)
    {
        link.close_for_good();
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
