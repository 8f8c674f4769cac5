//! Latency samples and the report `flotilla bench` prints and writes.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use serde::Serialize;

/// Samples of one latency, in milliseconds; thread-safe.
#[derive(Debug, Default)]
pub struct Samples(Mutex<Vec<f64>>);

impl Samples {
    pub fn add(&self, d: Duration) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).push(d.as_secs_f64() * 1000.0);
    }

    pub fn summary(&self) -> Summary {
        let mut v = self.0.lock().unwrap_or_else(|p| p.into_inner()).clone();
        v.sort_by(|a, b| a.total_cmp(b));
        Summary::of(&v)
    }

    pub fn len(&self) -> usize {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Percentiles of sorted samples (nearest rank).
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Summary {
    pub count: usize,
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
}

impl Summary {
    pub fn of(sorted: &[f64]) -> Summary {
        let pick = |q: f64| {
            if sorted.is_empty() {
                return 0.0;
            }
            let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
            round(sorted[rank - 1])
        };
        Summary { count: sorted.len(), p50: pick(0.50), p99: pick(0.99), max: pick(1.0) }
    }
}

/// Two decimals: figures, not noise.
pub fn round(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// Latency samples per operation kind.
#[derive(Debug, Default)]
pub struct ByKind(Mutex<BTreeMap<String, Vec<f64>>>);

impl ByKind {
    pub fn add(&self, kind: &str, d: Duration) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(kind.to_string())
            .or_default()
            .push(d.as_secs_f64() * 1000.0);
    }

    pub fn summaries(&self) -> BTreeMap<String, OpSummary> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(k, v)| {
                let mut v = v.clone();
                v.sort_by(|a, b| a.total_cmp(b));
                let s = Summary::of(&v);
                (k.clone(), OpSummary { count: s.count, p50_ms: s.p50, p99_ms: s.p99, max_ms: s.max })
            })
            .collect()
    }
}

#[derive(Debug, Clone, Copy, Serialize)]
pub struct OpSummary {
    pub count: usize,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        let s = Summary::of(&v);
        assert_eq!((s.count, s.p50, s.p99, s.max), (100, 50.0, 99.0, 100.0));
        let one = Summary::of(&[7.0]);
        assert_eq!((one.p50, one.p99), (7.0, 7.0));
        assert_eq!(Summary::of(&[]).count, 0);
    }
}
