//! What `flotilla bench` reports: a table for people, and with `--json FILE`
//! the same figures as a document (the keys of issue 7, and more).

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;

use super::stats::OpSummary;

#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Percentiles {
    pub p50: f64,
    pub p99: f64,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct ApiFigures {
    /// Reads of a bounded size (lists, nodes, operations): B5's read p99.
    pub read_ms: Percentiles,
    /// Whole-cluster reads (`GET /clusters/{name}`, every instance): B5
    /// gives them their own budget by size (250 ms for 10,000 instances).
    pub whole_cluster_read_ms: Percentiles,
    /// Both kinds of read together.
    pub all_read_ms: Percentiles,
    pub write_ms: Percentiles,
    pub get_largest_cluster_ms: f64,
    pub reads: usize,
    pub whole_cluster_reads: usize,
    pub writes: usize,
    /// `503 overloaded` answers (each retried after its Retry-After).
    pub overloaded: u64,
    /// Calls a follower answered `307` (followed to the leader).
    pub redirected: u64,
    /// `503` while no master led or one took over (retried).
    pub between_leaders: u64,
    /// Latency by route (long polls left out).
    pub routes: BTreeMap<String, OpSummary>,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    pub mode: String,
    pub agents: usize,
    pub instances: u64,
    pub clusters: usize,
    pub clients: usize,
    pub cores: usize,
    /// Nice steps below the bench at which the simulated agents ran.
    pub sim_nice: u8,
    /// The master settings given with `--master-set`.
    pub master_set: Vec<String>,
    pub placements_per_s: f64,
    pub placement_secs: f64,
    pub durable_transitions_per_s: f64,
    /// Synced batches per second the store wrote during placement.
    pub store_syncs_per_s: f64,
    pub fdatasync_per_s: f64,
    /// Durable instance transitions per second the master's store takes
    /// alone (`ceilings::store_transitions_per_s`): B2's numerator if the
    /// rest of the master and the agents cost nothing.
    pub store_transitions_per_s: f64,
    pub spawn_per_s: f64,
    /// Whether the master's process was observed (it is not with `--api`):
    /// without it the memory and CPU figures are 0 and B8/B9 are not judged.
    pub master_measured: bool,
    pub master_rss_mb: f64,
    /// The master's memory with the agents connected and no instance.
    pub master_rss_idle_mb: f64,
    /// The master's memory at rest: once it stops falling after the placement.
    pub master_rss_rest_mb: f64,
    pub master_cpu_pct: f64,
    pub master_cpu_ms_per_instance: f64,
    /// The master's CPU during the placement alone, per instance placed.
    pub place_cpu_ms_per_instance: f64,
    /// CPU of the master while only heartbeats come in.
    pub idle_master_cpu_pct: f64,
    /// The simulator's resident memory per agent.
    pub sim_rss_per_agent_kb: f64,
    pub running_in_simulator: u64,
    pub api: ApiFigures,
    pub exit_visible_ms: Value,
    pub operations: BTreeMap<String, OpSummary>,
    pub failures: usize,
    /// `flotilla bench real` figures.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub real: Option<Value>,
    /// `flotilla bench linearity` figures.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub linearity: Option<Value>,
    /// `flotilla bench pools` figures.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pools: Option<Value>,
    /// `flotilla bench failover` figures.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failover: Option<Value>,
    /// Each target of issue 7 this run can judge: the figure, the target, met or not.
    pub targets: BTreeMap<String, Value>,
}

impl Report {
    /// Judges the figures against the targets (B1, B2, B5, B8, B9, B10, B12).
    pub fn judge(&mut self) {
        let mut t = std::mem::take(&mut self.targets);
        let mut put = |k: &str, figure: f64, target: &str, met: bool| {
            t.insert(k.to_string(), serde_json::json!({"figure": figure, "target": target, "met": met}));
        };
        if self.instances > 0 {
            put("B1_placements_per_s", self.placements_per_s, ">= 3750", self.placements_per_s >= 3750.0);
            let ratio =
                if self.fdatasync_per_s > 0.0 { self.durable_transitions_per_s / self.fdatasync_per_s } else { 0.0 };
            put("B2_transitions_per_fdatasync", super::stats::round(ratio), ">= 30", ratio >= 30.0);
            put("B5_write_p99_ms", self.api.write_ms.p99, "<= 25", self.api.write_ms.p99 <= 25.0);
            put("B5_read_p99_ms", self.api.read_ms.p99, "<= 10", self.api.read_ms.p99 <= 10.0);
            // Whole clusters have B5's budget by size: 250 ms for 10,000
            // instances (25 us each), never less than a bounded read's.
            let largest = self.instances.div_ceil(self.clusters.max(1) as u64);
            let budget = super::stats::round((largest as f64 * 0.025).max(10.0));
            let at_most = format!("<= {budget}");
            let whole = self.api.whole_cluster_read_ms.p99;
            put("B5_whole_cluster_read_p99_ms", whole, &at_most, whole <= budget);
            let get = self.api.get_largest_cluster_ms;
            put("B5_get_largest_cluster_ms", get, &at_most, get <= budget);
            // What the instances keep at rest, above the master with its
            // agents connected (RocksDB's memtables, the links' buffers).
            if self.master_measured {
                let kept = (self.master_rss_rest_mb - self.master_rss_idle_mb).max(0.0);
                let per10k = kept / (self.instances as f64 / 10_000.0);
                put("B8_rss_mb_per_10k_instances", super::stats::round(per10k), "<= 15", per10k <= 15.0);
            }
            if let Some(p99) = self.exit_visible_ms["p99"].as_f64() {
                put("B10_exit_visible_p99_ms", p99, "<= 100", p99 <= 100.0);
            }
        }
        // B9 is about 1,000 agents: with more, their cost per thousand.
        if self.master_measured {
            let per_1000 = super::stats::round(self.idle_master_cpu_pct * 1000.0 / self.agents.max(1000) as f64);
            put("B9_idle_master_cpu_pct_per_1000_agents", per_1000, "<= 5", per_1000 <= 5.0);
        }
        put("B12_sim_kb_per_agent", self.sim_rss_per_agent_kb, "<= 100", self.sim_rss_per_agent_kb <= 100.0);
        self.targets = t;
    }

    /// The table printed at the end.
    pub fn table(&self) -> String {
        let mut s = String::new();
        let mut row = |k: &str, v: String| s.push_str(&format!("  {k:<34} {v}\n"));
        if let Some(f) = &self.failover {
            let p =
                |v: &Value| format!("p50 {} ms, p99 {} ms, max {} ms ({} x)", v["p50"], v["p99"], v["max"], v["count"]);
            row("leader SIGKILL -> write accepted", p(&f["kills"]));
            row("leader SIGSTOP -> write accepted", format!("{} (lease TTL {} s)", p(&f["pauses"]), f["lease_ttl_s"]));
            row("reads on the leader", p(&f["leader_read_ms"]));
            row("reads on a follower", p(&f["follower_read_ms"]));
            row("reads during the failovers", format!("{}, {} failed", f["reads_during"], f["reads_failed"]));
            row(
                "new leader: win -> serving",
                format!("{} ({} of them from their view)", p(&f["took_over_ms"]), f["took_over_from_view"]),
            );
            let l = &f["load"];
            if !l.is_null() {
                row(
                    "under load",
                    format!("{} simulated agents, {} instances, {} clients", l["agents"], l["instances"], l["clients"]),
                );
                row(
                    "scale-outs through the kills",
                    format!(
                        "{} accepted, {} succeeded, {} failed, {} answers lost",
                        l["ops_accepted"], l["ops_succeeded"], l["ops_failed"], l["answers_lost"]
                    ),
                );
                row("scale-out accepted -> ended", p(&l["op_ms"]));
                row("operations stored, by kind and status", l["stored_operations"].to_string());
                for f in l["failures"].as_array().into_iter().flatten() {
                    row("  failed", f.as_str().unwrap_or_default().to_string());
                }
            }
            return s;
        }
        if let Some(p) = &self.pools {
            row(
                "node requests (one node each)",
                format!("{} filed, {} fulfilled, {} failed", p["requests"], p["fulfilled"], p["failed"]),
            );
            row(
                "simulated create",
                format!("{}-{} ms (mean {} ms)", p["create_ms"][0], p["create_ms"][1], p["mean_create_ms"]),
            );
            row(
                "fulfilled per second",
                format!("{} (ceiling {}: all at once, the slowest create)", p["fulfilled_per_s"], p["ceiling_per_s"]),
            );
            let l = &p["request_to_ready_ms"];
            row("request -> node ready", format!("p50 {} ms, p99 {} ms, max {} ms", l["p50"], l["p99"], l["max"]));
            row(
                "master CPU per launch",
                format!(
                    "{} ms ({} s in all, {} cores)",
                    p["master_cpu_ms_per_launch"], p["master_cpu_secs"], self.cores
                ),
            );
            return s;
        }
        if let Some(real) = &self.real {
            let pct = |v: &Value| format!("p50 {} ms, p99 {} ms ({} samples)", v["p50"], v["p99"], v["count"]);
            let cgroups = if real["cgroups"] == true { "instances in cgroups" } else { "process groups, no cgroups" };
            row("real agents", format!("{} ({cgroups})", real["nodes"]));
            row("spawn ceiling (/bin/true)", format!("{}/s", self.spawn_per_s));
            row("spawn into a new cgroup (8 at once)", format!("{}/s", real["spawn_in_cgroup_per_s"]));
            row("API -> Running, idle", pct(&real["start_to_running_idle_ms"]));
            row("API -> Running, during scale-up", pct(&real["start_to_running_during_scale_up_ms"]));
            row("scale-up", format!("{} instances in {} s", real["scale_up_instances"], real["scale_up_secs"]));
            row(
                "real starts per second",
                format!(
                    "{} ({} of the spawn ceiling, {} of the cgroup one)",
                    real["starts_per_s"], real["starts_per_spawn_ceiling"], real["starts_per_cgroup_spawn_ceiling"]
                ),
            );
            let steps = |v: &Value| {
                let shown: Vec<String> = v
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|st| format!("{} {}-{} s", st["name"].as_str().unwrap_or("?"), st["began_s"], st["done_s"]))
                    .collect();
                shown.join(", ")
            };
            row("  its steps", steps(&real["start_steps"]));
            row("scale-in", format!("{} instances in {} s", real["scale_in_instances"], real["scale_in_secs"]));
            row("  its steps", steps(&real["scale_in_steps"]));
            row("kill -9 -> visible", pct(&real["kill_visible_ms"]));
            row("API read p50 / p99", format!("{} / {} ms", self.api.read_ms.p50, self.api.read_ms.p99));
            let whole = &self.api.whole_cluster_read_ms;
            row("whole-cluster GET p50 / p99", format!("{} / {} ms", whole.p50, whole.p99));
            return s + &self.target_rows();
        }
        if let Some(lin) = &self.linearity {
            for size in ["small", "large"] {
                let v = &lin[size];
                row(
                    &format!("{} instances", v["instances"]),
                    format!(
                        "{} placed/s, {} ms CPU and {} KiB at rest per instance",
                        v["placements_per_s"], v["cpu_ms_per_instance"], v["rest_kb_per_instance"]
                    ),
                );
            }
            return s + &self.target_rows();
        }
        row("agents (simulated)", self.agents.to_string());
        row("instances placed", self.instances.to_string());
        row("placed per second", format!("{} ({} s)", self.placements_per_s, self.placement_secs));
        row("durable transitions per second", self.durable_transitions_per_s.to_string());
        row("store syncs per second", self.store_syncs_per_s.to_string());
        row("fdatasync ceiling (one writer)", format!("{}/s", self.fdatasync_per_s));
        let alone = if self.fdatasync_per_s > 0.0 { self.store_transitions_per_s / self.fdatasync_per_s } else { 0.0 };
        row(
            "store alone: transitions per second",
            format!("{} ({} times fdatasync)", self.store_transitions_per_s, super::stats::round(alone)),
        );
        row("spawn ceiling (/bin/true)", format!("{}/s", self.spawn_per_s));
        if self.master_measured {
            row(
                "master RSS",
                format!(
                    "{} MiB right after placing, {} MiB at rest ({} MiB with the agents alone)",
                    self.master_rss_mb, self.master_rss_rest_mb, self.master_rss_idle_mb
                ),
            );
            row(
                "master CPU",
                format!(
                    "{} % over the run ({} ms per instance; placing: {} ms per instance)",
                    self.master_cpu_pct, self.master_cpu_ms_per_instance, self.place_cpu_ms_per_instance
                ),
            );
            row("master CPU with idle agents", format!("{} %", self.idle_master_cpu_pct));
        } else {
            row("master RSS and CPU", "not observed (the master is not our child: --api)".to_string());
        }
        row("simulator memory per agent", format!("{} KiB", self.sim_rss_per_agent_kb));
        row(
            "API read p50 / p99",
            format!("{} / {} ms ({} reads)", self.api.read_ms.p50, self.api.read_ms.p99, self.api.reads),
        );
        let whole = &self.api.whole_cluster_read_ms;
        row(
            "whole-cluster GET p50 / p99",
            format!("{} / {} ms ({} reads)", whole.p50, whole.p99, self.api.whole_cluster_reads),
        );
        row("all reads p50 / p99", format!("{} / {} ms", self.api.all_read_ms.p50, self.api.all_read_ms.p99));
        row(
            "API write p50 / p99",
            format!("{} / {} ms ({} writes)", self.api.write_ms.p50, self.api.write_ms.p99, self.api.writes),
        );
        row("GET of the largest cluster", format!("{} ms", self.api.get_largest_cluster_ms));
        for (route, o) in &self.api.routes {
            row(
                &format!("  {route}"),
                format!("{} x, p50 {} ms, p99 {} ms, max {} ms", o.count, o.p50_ms, o.p99_ms, o.max_ms),
            );
        }
        row("503 overloaded (retried)", self.api.overloaded.to_string());
        if self.api.redirected + self.api.between_leaders > 0 {
            row("307 followed to the leader", self.api.redirected.to_string());
            row("503 between leaders (retried)", self.api.between_leaders.to_string());
        }
        row(
            "exit -> visible p50 / p99",
            format!("{} / {} ms", self.exit_visible_ms["p50"], self.exit_visible_ms["p99"]),
        );
        for (k, o) in &self.operations {
            row(
                &format!("op {k}"),
                format!("{} x, p50 {} ms, p99 {} ms, max {} ms", o.count, o.p50_ms, o.p99_ms, o.max_ms),
            );
        }
        s + &self.target_rows()
    }

    fn target_rows(&self) -> String {
        let mut s = String::new();
        for (k, v) in &self.targets {
            let mark = if v["met"] == true { "met" } else { "MISSED" };
            let figure = format!("{} (target {}) {mark}", v["figure"], v["target"].as_str().unwrap_or_default());
            s.push_str(&format!("  {k:<34} {figure}\n"));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn master_targets_are_judged_only_when_the_master_was_observed() {
        let mut r = Report { agents: 1000, instances: 100_000, ..Report::default() };
        r.judge();
        assert!(!r.targets.contains_key("B8_rss_mb_per_10k_instances"), "{:?}", r.targets);
        assert!(!r.targets.contains_key("B9_idle_master_cpu_pct_per_1000_agents"));
        assert!(r.table().contains("not observed"));

        let mut r = Report {
            agents: 1000,
            instances: 100_000,
            master_measured: true,
            master_rss_idle_mb: 50.0,
            master_rss_rest_mb: 250.0,
            idle_master_cpu_pct: 0.3,
            ..Report::default()
        };
        r.judge();
        assert_eq!(r.targets["B8_rss_mb_per_10k_instances"]["figure"], 20.0);
        assert_eq!(r.targets["B8_rss_mb_per_10k_instances"]["met"], false);
        assert_eq!(r.targets["B9_idle_master_cpu_pct_per_1000_agents"]["met"], true);
    }
}
