//! This master's place among several: the only one (RocksDB), or the
//! leader of its term on etcd (`storage::etcd::election`). `GET /health`
//! says which; the `leadership` child of the supervision tree ends the
//! master when the leadership is lost.

use std::sync::Arc;

use crate::storage::etcd::election::Leadership;

/// What `GET /health` tells about this master's role.
#[derive(Debug)]
pub struct Role {
    /// `None`: the only master (embedded store), always leading.
    pub leadership: Option<Arc<Leadership>>,
    pub name: String,
    pub api_url: String,
}

impl Role {
    /// The only master (the embedded store).
    pub fn single(name: String, api_url: String) -> Role {
        Role { leadership: None, name, api_url }
    }

    /// The term this master leads in (0 with the embedded store).
    pub fn term(&self) -> i64 {
        self.leadership.as_ref().map_or(0, |l| l.term)
    }

    /// Whether it may act as the leader now (send commands to agents): with
    /// etcd, only while its lease is surely still held.
    pub fn may_act(&self) -> bool {
        self.leadership.as_ref().is_none_or(|l| l.is_valid())
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
