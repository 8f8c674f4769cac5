//! What a connection to the agent listener may hold before it is admitted,
//! and the refusals when it may not: the bookkeeping behind the design in
//! the parent module's doc.
//!
//! - A [`Ticket`] is taken at `accept`, before a byte is read: it counts
//!   the connection against the listener's total (`max_agent_connections`,
//!   links included), its source (an IPv4 address, an IPv6 /64) and its
//!   subnet (an IPv4 /24, an IPv6 /64). Past any of them the connection is
//!   closed at once.
//! - Once its ClientHello is in, the ticket takes a handshake slot
//!   ([`Ticket::take_slot`]): a *reserved* one when the ClientHello names a
//!   certificate this master issued and no other connection holds a
//!   reserved slot under that certificate, else a *general* one. A
//!   reserved slot gives the source and subnet counts back: the reserved
//!   room is bounded per certificate instead, so an agent's reconnect does
//!   not stand in its subnet's queue.
//! - Everything is given back when the ticket drops, however the
//!   connection ends (admitted, refused, timed out, its task cancelled).
//!
//! The counts sit behind one `std` mutex held for a few map operations and
//! never across an `.await`; the slots are tokio semaphores, whose FIFO
//! queue keeps the connections waiting for one in arrival order.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, Ipv6Addr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use crate::protocol::tls::Fingerprint;

/// The listener's bounds (see `config/master.toml`).
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub max_connections: usize,
    /// Handshake slots anyone may take.
    pub general: usize,
    /// Handshake slots only a connection claiming a certificate may take.
    pub reserved: usize,
    pub per_source: usize,
    pub per_subnet: usize,
}

/// Why a connection was closed before it was admitted; each one is a
/// label value of `flotilla_agent_connections_refused_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// `max_agent_connections` reached (links and connections being admitted).
    Full,
    /// Its source holds `max_agent_handshakes_per_source` already.
    PerSource,
    /// Its subnet holds `max_agent_handshakes_per_subnet` already.
    PerSubnet,
    /// No whole ClientHello within `first_bytes_timeout`.
    NoClientHello,
    /// Its first bytes are not a TLS ClientHello.
    NotTls,
    /// No handshake slot came free before the handshake's deadline.
    NoSlot,
    /// The TLS handshake failed or timed out.
    Tls,
    /// It claimed one certificate in its ClientHello and presented another
    /// (or none).
    ClaimBroken,
    /// Refused by the protocol (no certificate, a revoked one, a bad `Hello`,
    /// a refused enrollment) or ended during it.
    Protocol,
}

impl Refusal {
    pub fn label(self) -> &'static str {
        match self {
            Refusal::Full => "listener_full",
            Refusal::PerSource => "per_source",
            Refusal::PerSubnet => "per_subnet",
            Refusal::NoClientHello => "no_client_hello",
            Refusal::NotTls => "not_tls",
            Refusal::NoSlot => "no_handshake_slot",
            Refusal::Tls => "tls",
            Refusal::ClaimBroken => "claim_broken",
            Refusal::Protocol => "protocol",
        }
    }

    /// Why, for the log.
    pub fn reason(self, limits: &Limits, first_bytes: Duration) -> String {
        match self {
            Refusal::Full => format!("the listener holds max_agent_connections ({}) already", limits.max_connections),
            Refusal::PerSource => format!(
                "its address has max_agent_handshakes_per_source ({}) connections being admitted already",
                limits.per_source
            ),
            Refusal::PerSubnet => format!(
                "its subnet (an IPv4 /24, an IPv6 /64) has max_agent_handshakes_per_subnet ({}) connections being admitted already",
                limits.per_subnet
            ),
            Refusal::NoClientHello => format!("no TLS ClientHello within first_bytes_timeout ({first_bytes:?})"),
            Refusal::NotTls => "its first bytes are not a TLS ClientHello".into(),
            Refusal::NoSlot => "no handshake slot came free before handshake_timeout".into(),
            Refusal::Tls => "the TLS handshake failed".into(),
            Refusal::ClaimBroken => "it did not present the certificate its ClientHello named".into(),
            Refusal::Protocol => "refused by the protocol".into(),
        }
    }

    /// Refusals anyone can cause in bulk without a byte of TLS: logged as
    /// a count once a second, not a line each.
    pub fn is_bulk(self) -> bool {
        matches!(
            self,
            Refusal::Full | Refusal::PerSource | Refusal::PerSubnet | Refusal::NoClientHello | Refusal::NotTls
        )
    }
}

/// The source a connection counts against: an IPv4 address (also when
/// mapped into IPv6), or an IPv6 /64, which one host may fill with
/// addresses of its own.
pub fn source_of(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => IpAddr::V6(Ipv6Addr::from(u128::from(v6) & !((1u128 << 64) - 1))),
        v4 => v4,
    }
}

/// The subnet a connection counts against: an IPv4 /24, an IPv6 /64 (for
/// IPv6 the same key as its source: a /64 is one host's as far as
/// addresses can tell, so the two caps meet there and the lower binds).
pub fn subnet_of(ip: IpAddr) -> IpAddr {
    match source_of(ip) {
        IpAddr::V4(v4) => IpAddr::V4((u32::from(v4) & 0xffff_ff00).into()),
        v6 => v6,
    }
}

#[derive(Default)]
struct Counts {
    sources: HashMap<IpAddr, usize>,
    subnets: HashMap<IpAddr, usize>,
}

fn release(map: &mut HashMap<IpAddr, usize>, key: IpAddr) {
    if let Some(n) = map.get_mut(&key) {
        *n -= 1;
        if *n == 0 {
            map.remove(&key);
        }
    }
}

/// The listener's admission state, shared by the accept loop and every
/// connection's task.
pub struct Admission {
    pub limits: Limits,
    counts: Mutex<Counts>,
    /// Connections accepted and not yet admitted or closed.
    pending: AtomicUsize,
    general: Arc<Semaphore>,
    reserved: Arc<Semaphore>,
    /// Certificates under which a reserved slot is held: one each, so
    /// replaying a certificate's claim buys one slot, not the pool.
    claimed: Mutex<HashSet<Fingerprint>>,
    /// Per bulk refusal: how many since the last line, and when that was.
    logged: Mutex<HashMap<Refusal, (u64, Option<Instant>)>>,
}

/// A handshake slot.
enum Slot {
    General(#[allow(dead_code)] OwnedSemaphorePermit),
    Reserved(#[allow(dead_code)] OwnedSemaphorePermit, Fingerprint),
}

/// What one connection holds until it is admitted or closed (module doc).
pub struct Ticket {
    admission: Arc<Admission>,
    /// Its source and subnet, while they count it.
    counted: Option<(IpAddr, IpAddr)>,
    slot: Option<Slot>,
}

impl Admission {
    pub fn new(limits: Limits) -> Arc<Admission> {
        Arc::new(Admission {
            limits,
            counts: Mutex::default(),
            pending: AtomicUsize::new(0),
            general: Arc::new(Semaphore::new(limits.general.max(1))),
            reserved: Arc::new(Semaphore::new(limits.reserved)),
            claimed: Mutex::default(),
            logged: Mutex::default(),
        })
    }

    /// A ticket for a connection from `ip` accepted while `links` agents
    /// are connected, or why it is refused. Called by the accept loop
    /// only, so `pending` cannot pass the bound between check and add.
    pub fn enter(self: &Arc<Self>, ip: IpAddr, links: usize) -> Result<Ticket, Refusal> {
        if links + self.pending.load(Ordering::Acquire) >= self.limits.max_connections {
            return Err(Refusal::Full);
        }
        let (source, subnet) = (source_of(ip), subnet_of(ip));
        {
            let mut counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
            if counts.sources.get(&source).is_some_and(|n| *n >= self.limits.per_source.max(1)) {
                return Err(Refusal::PerSource);
            }
            if counts.subnets.get(&subnet).is_some_and(|n| *n >= self.limits.per_subnet.max(1)) {
                return Err(Refusal::PerSubnet);
            }
            *counts.sources.entry(source).or_default() += 1;
            *counts.subnets.entry(subnet).or_default() += 1;
        }
        self.pending.fetch_add(1, Ordering::AcqRel);
        Ok(Ticket { admission: self.clone(), counted: Some((source, subnet)), slot: None })
    }

    /// Counts `refusal` (the metric), and logs it: a bulk one as a count
    /// once a second per kind, so a flood is not a flood of lines.
    pub fn refused(&self, refusal: Refusal, peer: std::net::SocketAddr, first_bytes: Duration) {
        metrics::counter!("flotilla_agent_connections_refused_total", "reason" => refusal.label()).increment(1);
        if !refusal.is_bulk() {
            return;
        }
        let mut logged = self.logged.lock().unwrap_or_else(|p| p.into_inner());
        let (count, last) = logged.entry(refusal).or_default();
        *count += 1;
        if last.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
            let reason = refusal.reason(&self.limits, first_bytes);
            tracing::warn!(%peer, refused = *count, kind = refusal.label(), "agent connections refused: {reason}");
            *count = 0;
            *last = Some(Instant::now());
        }
    }

    /// Reserved slots free now (for tests and the log).
    #[cfg(test)]
    fn reserved_free(&self) -> usize {
        self.reserved.available_permits()
    }
}

impl Ticket {
    /// Waits for a handshake slot: a reserved one for `claim` (a
    /// certificate this master issued, named in the ClientHello) when one
    /// is free and no other connection holds one under that certificate,
    /// else the first of a general one or (for a claim) a reserved one
    /// coming free. The caller bounds the wait with its deadline.
    pub async fn take_slot(&mut self, claim: Option<Fingerprint>) {
        let adm = self.admission.clone();
        let Some(fp) = claim else {
            // Closed never: the semaphores live as long as `adm`.
            if let Ok(p) = adm.general.clone().acquire_owned().await {
                self.slot = Some(Slot::General(p));
            }
            return;
        };
        loop {
            let held = adm.claimed.lock().unwrap_or_else(|p| p.into_inner()).contains(&fp);
            // Both acquires are cancel-safe: the loser leaves its queue.
            // Biased: a free reserved slot is taken before a free general
            // one (select! would otherwise pick at random between two
            // ready branches, and a claim would hold a general slot half
            // the time, with the whole handshake's deadline).
            let reserved = tokio::select! {
                biased;
                Ok(p) = adm.reserved.clone().acquire_owned(), if !held => p,
                Ok(p) = adm.general.clone().acquire_owned() => {
                    self.slot = Some(Slot::General(p));
                    return;
                }
            };
            // Another connection under this certificate may have won a
            // reserved slot between the look and the permit: look again
            // with the permit in hand, and give it back if so.
            if adm.claimed.lock().unwrap_or_else(|p| p.into_inner()).insert(fp) {
                self.slot = Some(Slot::Reserved(reserved, fp));
                self.uncount();
                return;
            }
        }
    }

    /// Whether this connection holds a reserved slot, under which
    /// certificate.
    pub fn reserved_for(&self) -> Option<Fingerprint> {
        match &self.slot {
            Some(Slot::Reserved(_, fp)) => Some(*fp),
            _ => None,
        }
    }

    /// Gives its source's and subnet's counts back.
    fn uncount(&mut self) {
        if let Some((source, subnet)) = self.counted.take() {
            let mut counts = self.admission.counts.lock().unwrap_or_else(|p| p.into_inner());
            release(&mut counts.sources, source);
            release(&mut counts.subnets, subnet);
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.uncount();
        if let Some(Slot::Reserved(_, fp)) = &self.slot {
            self.admission.claimed.lock().unwrap_or_else(|p| p.into_inner()).remove(fp);
        }
        // The permit goes back as `slot` drops, after the claim is gone:
        // a waiter woken by it finds the certificate free.
        self.admission.pending.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;
    use std::time::Duration;

    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn limits() -> Limits {
        Limits { max_connections: 100, general: 2, reserved: 1, per_source: 3, per_subnet: 4 }
    }

    #[test]
    fn a_source_is_an_ipv4_address_or_an_ipv6_64_and_a_subnet_a_24_or_a_64() {
        assert_eq!(source_of(ip("10.1.2.3")), ip("10.1.2.3"));
        assert_eq!(source_of(ip("::ffff:10.1.2.3")), ip("10.1.2.3"), "mapped IPv4 is IPv4");
        assert_eq!(source_of(ip("2001:db8:1:2:aaaa:bbbb:cccc:dddd")), ip("2001:db8:1:2::"));
        assert_eq!(source_of(ip("2001:db8:1:2::7")), source_of(ip("2001:db8:1:2:ffff::1")), "one /64");
        assert_ne!(source_of(ip("2001:db8:1:2::7")), source_of(ip("2001:db8:1:3::7")));
        assert_eq!(subnet_of(ip("10.1.2.3")), ip("10.1.2.0"));
        assert_eq!(subnet_of(ip("::ffff:10.1.2.200")), ip("10.1.2.0"));
        assert_ne!(subnet_of(ip("10.1.2.3")), subnet_of(ip("10.1.3.3")));
        assert_eq!(subnet_of(ip("2001:db8:1:2::7")), ip("2001:db8:1:2::"));
    }

    #[test]
    fn sources_subnets_and_the_total_are_capped_and_given_back() {
        let adm = Admission::new(limits());
        let a: Vec<Ticket> = (0..3).map(|_| adm.enter(ip("10.0.0.1"), 0).unwrap()).collect();
        assert_eq!(adm.enter(ip("10.0.0.1"), 0).err(), Some(Refusal::PerSource));
        let b = adm.enter(ip("10.0.0.2"), 0).unwrap();
        assert_eq!(adm.enter(ip("10.0.0.3"), 0).err(), Some(Refusal::PerSubnet), "4 in 10.0.0.0/24");
        assert!(adm.enter(ip("10.0.1.3"), 0).is_ok(), "another /24 is not held back");
        drop(b);
        let c = adm.enter(ip("10.0.0.3"), 0).expect("given back on drop");
        assert_eq!(adm.enter(ip("10.9.9.9"), 96).err(), Some(Refusal::Full), "4 pending + 96 links");
        drop((a, c));
        assert!(adm.counts.lock().unwrap().sources.is_empty() && adm.counts.lock().unwrap().subnets.is_empty());
        assert_eq!(adm.pending.load(Ordering::Acquire), 0);
    }

    #[tokio::test]
    async fn a_claim_takes_the_room_kept_once_per_certificate_and_frees_its_subnet() {
        let adm = Admission::new(Limits { reserved: 2, ..limits() });
        let within = Duration::from_millis(100);
        // Garbage takes every general slot; more of it waits.
        let mut garbage = Vec::new();
        for i in 0..2 {
            let mut t = adm.enter(ip(&format!("10.0.{i}.1")), 0).unwrap();
            t.take_slot(None).await;
            garbage.push(t);
        }
        let mut waiting = adm.enter(ip("10.0.5.1"), 0).unwrap();
        assert!(tokio::time::timeout(within, waiting.take_slot(None)).await.is_err(), "no general slot is free");

        // A claim gets a reserved one at once, and no longer counts
        // against its source and subnet.
        let mut agent = adm.enter(ip("10.0.9.1"), 0).unwrap();
        tokio::time::timeout(within, agent.take_slot(Some([1; 32]))).await.expect("a reserved slot at once");
        assert_eq!(agent.reserved_for(), Some([1; 32]));
        assert!(!adm.counts.lock().unwrap().subnets.contains_key(&ip("10.0.9.0")));
        assert_eq!(adm.reserved_free(), 1);

        // The same certificate again does not get the other reserved slot:
        // it waits for a general one, and gets it when one comes free.
        let mut twin = adm.enter(ip("10.0.9.2"), 0).unwrap();
        let twin_task = tokio::spawn(async move {
            twin.take_slot(Some([1; 32])).await;
            twin
        });
        tokio::time::sleep(within).await;
        assert!(!twin_task.is_finished(), "a twin of a held claim took a second reserved slot");
        assert_eq!(adm.reserved_free(), 1);
        drop(waiting);
        drop(garbage.pop());
        let twin = tokio::time::timeout(Duration::from_secs(1), twin_task).await.unwrap().unwrap();
        assert!(twin.reserved_for().is_none(), "a general slot");

        // Another certificate takes the other reserved slot; given back on drop.
        let mut other = adm.enter(ip("10.0.9.3"), 0).unwrap();
        tokio::time::timeout(within, other.take_slot(Some([2; 32]))).await.expect("the second reserved slot");
        assert_eq!(adm.reserved_free(), 0);
        drop((agent, other, twin));
        assert_eq!(adm.reserved_free(), 2);
        assert!(adm.claimed.lock().unwrap().is_empty());
    }
}
