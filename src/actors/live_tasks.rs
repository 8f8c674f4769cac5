//! `flotilla_live_tasks{kind}`: how many tasks of each kind live now (a
//! soak checks the count returns to its idle value: no task of a dead
//! actor left behind). Kinds: `supervised_task`, `operation`,
//! `instance_turn`, `node_manager`, `link_writer`, `announce`.
//!
//! The counts live here and each change sets the gauge to the count; the
//! metrics thread sets them again every few seconds ([`refresh`]), so a
//! count that stays put (the idle supervised tasks) never drops out of
//! `/metrics` under the exporter's idle timeout for gauges.

use std::collections::BTreeMap;
use std::sync::Mutex;

static COUNTS: Mutex<BTreeMap<&'static str, i64>> = Mutex::new(BTreeMap::new());

fn change(kind: &'static str, by: i64) {
    let mut counts = COUNTS.lock().unwrap_or_else(|p| p.into_inner());
    let n = counts.entry(kind).or_default();
    *n += by;
    metrics::gauge!("flotilla_live_tasks", "kind" => kind).set(*n as f64);
}

/// Sets every kind's gauge to its count again.
pub fn refresh() {
    let counts = COUNTS.lock().unwrap_or_else(|p| p.into_inner());
    for (kind, n) in counts.iter() {
        metrics::gauge!("flotilla_live_tasks", "kind" => *kind).set(*n as f64);
    }
}

/// A live task of `kind`, counted while it lives.
pub struct LiveTask(&'static str);

impl LiveTask {
    pub fn new(kind: &'static str) -> LiveTask {
        change(kind, 1);
        LiveTask(kind)
    }
}

impl Drop for LiveTask {
    fn drop(&mut self) {
        change(self.0, -1);
    }
}
