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
        Role { leadership: None, name, api_url, following: None }
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
}

/// The `leadership` child: waits until the leadership is lost, then ends
/// the master with why (`supervision::spec("leadership")`: never
/// restarted; a master that no longer leads must not go on writing or
/// commanding, and comes back as a follower).
pub async fn watch_leadership(
    leadership: Arc<Leadership>,
    tasks: Arc<super::supervised::Tasks>,
    stats: Arc<super::read_model::ActorStats>,
) {
    stats.set_state(format!("leading (term {})", leadership.term));
    let mut lost = leadership.lost();
    let why = loop {
        if let Some(why) = lost.borrow_and_update().clone() {
            break why;
        }
        if lost.changed().await.is_err() {
            break "the lease thread ended".to_string();
        }
    };
    let cause = format!("this master's leadership (term {}) is lost: {why}", leadership.term);
    stats.exited(cause.clone(), false);
    stats.set_state("failed");
    tasks.fatal(cause);
}
