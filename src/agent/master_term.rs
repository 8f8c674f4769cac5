//! The highest master term this agent has seen (several masters on etcd:
//! each leader's term is the etcd revision that made it leader, and grows).
//! A master of a lower term has been deposed: its `Welcome` makes the agent
//! leave and dial the next master, and its requests are refused
//! (`FailureKind::StaleTerm`), so a leader that was paused past its lease
//! and wakes up commands nothing. Kept in the agent's store, so a restart
//! of the agent does not forget it.

use std::sync::atomic::{AtomicI64, Ordering};

use crate::storage::keys::{MASTER_TERM_KEY, agent_cf};
use crate::storage::{AgentStore, StorageError, WriteOp, codec};

#[derive(Debug, Default)]
pub struct MasterTerm {
    seen: AtomicI64,
}

impl MasterTerm {
    /// The term the store kept (0: none yet).
    pub fn load(store: &AgentStore) -> Result<MasterTerm, StorageError> {
        let seen = store.meta(MASTER_TERM_KEY)?.map(|raw| codec::decode::<i64>(&raw)).transpose()?.unwrap_or(0);
        Ok(MasterTerm { seen: AtomicI64::new(seen) })
    }

    pub fn seen(&self) -> i64 {
        self.seen.load(Ordering::SeqCst)
    }

    /// The answer to a request of `term` when it is below the highest
    /// seen (nothing of it is done); `None` when it may run.
    pub fn refusal(&self, term: i64) -> Option<crate::protocol::messages::AgentResponse> {
        let seen = self.seen();
        if term >= seen {
            return None;
        }
        tracing::warn!(term, seen, "a request of an older master term refused");
        Some(crate::agent::node::failure(
            crate::protocol::messages::FailureKind::StaleTerm,
            format!(
                "refused: the request is of master term {term}, older than term {seen} this agent has seen (another master leads)"
            ),
        ))
    }

    /// Admits a master of `term` at its `Welcome`: refuses one below the
    /// highest seen (naming both); records a higher one durably first.
    pub async fn admit(&self, store: &AgentStore, term: i64) -> Result<(), String> {
        let seen = self.seen();
        if term < seen {
            return Err(format!(
                "the master's term {term} is older than term {seen} this agent has seen: another master leads"
            ));
        }
        if term > seen {
            let op = WriteOp::Put {
                cf: agent_cf::META,
                key: MASTER_TERM_KEY.to_vec(),
                value: codec::encode(&term).map_err(|e| e.to_string())?,
            };
            store.writer().commit(vec![op]).await.map_err(|e| format!("recording the master's term {term}: {e}"))?;
            self.seen.fetch_max(term, Ordering::SeqCst);
        }
        Ok(())
    }
}
