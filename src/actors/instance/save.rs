//! How an instance actor writes its record: a change made on a copy,
//! durable, then adopted and published; a member's failure written with
//! what it does to its cluster, in one batch.

use super::*;

impl InstanceActor {
    /// Applies `change` to a copy of the record, persists it, then makes it
    /// the record and publishes it.
    pub(super) async fn save(&self, change: impl FnOnce(&mut InstanceRecord)) -> Result<(), String> {
        let Some((next, ops)) = self.writes(change)? else { return Ok(()) };
        self.env.shared.store.commit(ops).await.map_err(|e| format!("cannot persist instance record: {e}"))?;
        self.adopt(next);
        Ok(())
    }

    /// The record changed by `change` and the writes that store it; `None`
    /// when nothing changes.
    #[allow(clippy::type_complexity)]
    pub(super) fn writes(
        &self,
        change: impl FnOnce(&mut InstanceRecord),
    ) -> Result<Option<(InstanceRecord, Vec<WriteOp>)>, String> {
        if self.forgotten.get() {
            return Err(format!("instance {} was forgotten by its cluster; nothing is recorded", self.id()));
        }
        let mut next = InstanceRecord::clone(&self.record.borrow());
        change(&mut next);
        if next == **self.record.borrow() {
            // Nothing changed: nothing to write or publish.
            return Ok(None);
        }
        let mut ops = vec![WriteOp::put_instance(&next).map_err(|e| e.to_string())?];
        if let Some(e) = crate::storage::events::instance_changed(&self.record.borrow(), &next) {
            ops.push(crate::storage::events::append(&e).map_err(|e| e.to_string())?);
        }
        Ok(Some((next, ops)))
    }

    /// A written record becomes the record, and is published.
    pub(super) fn adopt(&self, next: InstanceRecord) {
        *self.record.borrow_mut() = Arc::new(next);
        self.env.cell.put_instance(self.entry());
        self.env.shared.read_model.count_transitions(1);
    }

    /// Writes a member's failure (`change` makes it `Failed` or `Lost`)
    /// with what it does to its cluster (its `Error`, [`MemberFailures`])
    /// in one batch, tried until it lands: neither is shown before both are
    /// durable, and a crash cannot keep one without the other. The cluster's
    /// part is decided again at each try, from the cluster as it is then.
    pub(super) async fn save_failure(&self, change: impl Fn(&mut InstanceRecord)) -> Result<(), String> {
        let failures = self.env.failures.borrow().clone();
        // The cluster record may change with it: in turn with its other writes.
        let probe = self.writes(&change)?.map(|(r, _)| r);
        let turn = match (&failures, &probe) {
            (Some(f), Some(r)) if f.may_escalate(r) => Some(self.env.record_writes.lock().await),
            _ => None,
        };
        let mut after: Option<Box<dyn FnOnce()>> = None;
        let mut next = None;
        crate::actors::cluster::commit_until_landed(&self.env.shared, "a member's failure", || {
            after = None;
            next = None;
            let Some((record, mut ops)) = self.writes(&change)? else { return Ok(Vec::new()) };
            if turn.is_some()
                && let Some((extra, then)) = failures.as_ref().and_then(|f| f.escalate(&record))
            {
                ops.extend(extra);
                after = Some(then);
            }
            next = Some(record);
            Ok(ops)
        })
        .await?;
        if let Some(record) = next {
            self.adopt(record);
        }
        match after {
            Some(then) => then(),
            None => {
                if let Some(f) = &failures {
                    f.landed();
                }
            }
        }
        drop(turn);
        Ok(())
    }
}
