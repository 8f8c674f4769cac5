//! This master's place among several: the only one (RocksDB), or the
//! leader of its term on etcd (`storage::etcd::election`), or a follower
//! serving reads (`crate::follower`). `GET /health`
//! says which; the `leadership` child of the supervision tree ends the
//! master when the leadership is lost.

use std::sync::Arc;

use crate::storage::etcd::election::{Leadership, Seen};
use crate::storage::etcd::watch::Progress;

/// How this master names itself to the others.
#[derive(Debug, Clone)]
pub struct Named {
    pub name: String,
    pub api_url: String,
}

impl Named {
    /// From the settings, else from the address its API listens on.
    pub fn of(cfg: &crate::config::MasterConfig, http_addr: std::net::SocketAddr) -> Named {
        Named {
            name: cfg.name.clone().unwrap_or_else(|| http_addr.to_string()),
            api_url: cfg.advertise_url.clone().unwrap_or_else(|| format!("http://{http_addr}")),
        }
    }
}

/// What `GET /health` tells about this master's role.
#[derive(Debug)]
pub struct Role {
    /// `None`: the only master (embedded store), always leading.
    pub leadership: Option<Arc<Leadership>>,
    pub name: String,
    pub api_url: String,
    /// Set on a follower: whom it follows and how current its view is.
    pub following: Option<Following>,
    /// How this master took over once it won (several masters on etcd).
    pub took_over: std::sync::OnceLock<TookOver>,
}

/// How a master that won booted (`GET /health` `took_over`).
#[derive(Debug, Clone)]
pub struct TookOver {
    /// `view`: its clusters and instances from the view it kept as a
    /// follower; `store`: read from the store again.
    pub from: &'static str,
    /// From the view: how it was found the store's (`revisions`: every
    /// revision since its load brought its watch an event; `keys`: a
    /// keys-only read of the store matched it).
    pub verified: Option<&'static str>,
    /// From winning the campaign to serving as the leader.
    pub ms: u64,
}

/// A follower's place: the leader it sends writes to, and its view's progress.
#[derive(Debug, Clone)]
pub struct Following {
    pub leader: Seen,
    pub progress: Arc<Progress>,
}

impl Role {
    /// The only master (the embedded store).
    pub fn single(name: String, api_url: String) -> Role {
        Role { leadership: None, name, api_url, following: None, took_over: Default::default() }
    }

    /// The term this master leads in (0 with the embedded store), or, on
    /// a follower, the term of the leader it follows.
    pub fn term(&self) -> i64 {
        match (&self.leadership, &self.following) {
            (Some(l), _) => l.term,
            (None, Some(f)) => f.leader.get().map_or(0, |l| l.term),
            (None, None) => 0,
        }
    }

    /// Whether it may act as the leader now (send commands to agents): with
    /// etcd, only while its lease is surely still held.
    pub fn may_act(&self) -> bool {
        self.following.is_none() && self.leadership.as_ref().is_none_or(|l| l.is_valid())
    }

    /// Whether it leads but its lease's renewal is overdue (`GET /health`'s
    /// `suspended`).
    pub fn suspended(&self) -> bool {
        self.following.is_none() && self.leadership.as_ref().is_some_and(|l| l.is_suspended())
    }
}

/// The `leadership` child: waits until the leadership is lost, then ends
/// the master with why (`supervision::spec("leadership")`: never
/// restarted; a master that no longer leads must not go on writing or
/// commanding, and comes back as a follower). Suspended (the lease not
/// renewed in time) for as long as a command waits for it to end
/// ([`SUSPENDED_WAIT`](super::node_link::SUSPENDED_WAIT), when every
/// waiting command has failed anyway), every agent's link is closed:
/// another master may lead by now, and the agents must reach it rather
/// than stay with one that commands nothing (this one refuses them until
/// it renews). A shorter suspension (etcd slow for a moment under load)
/// only delays the commands.
pub async fn watch_leadership(
    leadership: Arc<Leadership>,
    tasks: Arc<super::supervised::Tasks>,
    stats: Arc<super::read_model::ActorStats>,
    links: super::node_link::NodeLinks,
) {
    let leading = format!("leading (term {})", leadership.term);
    stats.set_state(&leading);
    let mut lost = leadership.lost();
    // Since when it is suspended, and whether its links were closed.
    let mut suspended: Option<(std::time::Instant, bool)> = None;
    let why = loop {
        if let Some(why) = lost.borrow_and_update().clone() {
            break why;
        }
        match (&mut suspended, !leadership.is_suspended()) {
            (None, false) => {
                suspended = Some((std::time::Instant::now(), false));
                stats.set_state(format!("suspended (term {}): lease not renewed in time", leadership.term));
            }
            (Some((since, closed @ false)), false) if since.elapsed() >= super::node_link::SUSPENDED_WAIT => {
                *closed = true;
                let n = links.close_all();
                tracing::error!(
                    links = n,
                    "the leadership is still suspended: the agents' links are closed, they dial the masters again"
                );
            }
            (Some(_), true) => {
                suspended = None;
                stats.set_state(&leading);
            }
            _ => {}
        }
        // Looked at every 100 ms (no command leaves while suspended: the
        // links check before each request).
        if let Ok(Err(_)) = tokio::time::timeout(std::time::Duration::from_millis(100), lost.changed()).await {
            break "the lease thread ended".to_string();
        }
    };
    let cause = format!("this master's leadership (term {}) is lost: {why}", leadership.term);
    stats.exited(cause.clone(), false);
    stats.set_state("failed");
    tasks.fatal(cause);
}
