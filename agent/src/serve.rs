//! The agent's metrics and readiness, served on `--listen` by [`ferry_serve`] as
//! `/metrics`, `/healthz` and `/readyz`.
//!
//! Every series carries the constant label `node` (the agent's node), so dashboards can
//! group by node without any relabelling in the scrape configuration. Labels are bounded:
//! strategy, result and reason come from exhaustive matches on engine enums; the only
//! object names are the job identity (`copyjob_namespace`, `copyjob`) on the per-job
//! progress gauges, whose series are removed when the job is deleted.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use ferry_engine::{Reason, Strategy};
use prometheus::{
    Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};

use crate::lock;

/// Buckets of the per-file copy time, in seconds: from a small file on tmpfs (~100 µs) to
/// a large file over a slow network filesystem.
const FILE_SECONDS_BUCKETS: [f64; 16] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0,
    30.0, 300.0,
];

/// Labels of the per-job gauges. Not `namespace` and `job`: Prometheus gives those names
/// to the scrape target's own labels, and would rename ours to `exported_*`.
const JOB_LABELS: [&str; 2] = ["copyjob_namespace", "copyjob"];

/// The agent's metrics, named `ferry_agent_<what>_<unit>`.
#[derive(Clone)]
#[allow(missing_debug_implementations)]
pub struct Metrics {
    pub registry: Registry,
    /// `ferry_agent_bytes_copied_total{strategy}`: data bytes that reached destinations.
    pub bytes: IntCounterVec,
    /// The same counter per strategy, resolved once (indexed by `Strategy as usize`).
    bytes_by_strategy: [IntCounter; 3],
    /// `ferry_agent_files_total{result}`: copied, skipped or failed.
    pub files: IntCounterVec,
    files_copied: IntCounter,
    files_skipped: IntCounter,
    files_failed: IntCounter,
    files_deleted: IntCounter,
    /// `ferry_agent_failures_total{reason}`.
    pub failures: IntCounterVec,
    /// `ferry_agent_bytes_verified_total`.
    pub bytes_verified: IntCounter,
    /// `ferry_agent_checksum_mismatches_total`.
    pub checksum_mismatches: IntCounter,
    /// `ferry_agent_file_copy_duration_seconds`.
    pub file_copy_seconds: Histogram,
    /// `ferry_agent_active_shards`.
    pub active_shards: IntGauge,
    /// `ferry_agent_ready`: what `/readyz` answers, as 1 or 0 (set at each scrape).
    pub ready: IntGauge,
    /// `ferry_agent_jobs_watched`: CopyJobs this agent holds (those labelled for its node).
    pub jobs_watched: IntGauge,
    jobs: Arc<JobGauges>,
    /// `ferry_agent_network_bytes_total{direction, copyjob_namespace, copyjob}`: file bytes of copies
    /// between nodes, sent (as a sender) or received (as a receiver).
    pub network_bytes: IntCounterVec,
    /// The jobs `network_bytes` has series of, to drop them with the job.
    network_jobs: Arc<Mutex<HashSet<(String, String)>>>,
    /// `ferry_agent_network_connections{role}`: open transfer connections.
    pub connections: IntGaugeVec,
    /// `ferry_agent_network_redials_total`: connections to a sender dialled again after one
    /// was lost mid-copy.
    pub redials: IntCounter,
    /// `ferry_agent_network_resends_total`: files asked for once more after their bytes
    /// arrived changed.
    pub resends: IntCounter,
}

/// The per-job progress gauges and the per-shard numbers they add up.
struct JobGauges {
    bytes_done: IntGaugeVec,
    bytes_total: IntGaugeVec,
    files_done: IntGaugeVec,
    /// (namespace, job) → shard id → its latest numbers.
    shards: Mutex<HashMap<(String, String), HashMap<String, ShardProgress>>>,
}

/// One shard's progress, as the agent last published it to the job's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardProgress {
    pub files_done: u64,
    pub bytes_done: u64,
    /// What the shard carries in all, once counted (or once it has finished).
    pub bytes_total: Option<u64>,
}

impl Metrics {
    /// Metrics whose every series carries `node="<node>"` (no such label when empty).
    pub fn new(node: &str) -> prometheus::Result<Self> {
        let labels = (!node.is_empty()).then(|| HashMap::from([("node".into(), node.into())]));
        let registry = Registry::new_custom(None, labels)?;
        let bytes = IntCounterVec::new(
            Opts::new(
                "ferry_agent_bytes_copied_total",
                "File data bytes that reached destinations, by strategy (reflink, copy_file_range, read_write)",
            ),
            &["strategy"],
        )?;
        let files = IntCounterVec::new(
            Opts::new(
                "ferry_agent_files_total",
                "Entries by result: copied (regular files committed under their final names), skipped (kept as the destination has them), failed (see ferry_agent_failures_total), deleted (removed from a destination by a mirror, deleteExtraneous)",
            ),
            &["result"],
        )?;
        let failures = IntCounterVec::new(
            Opts::new(
                "ferry_agent_failures_total",
                "Entries that failed to copy, by reason",
            ),
            &["reason"],
        )?;
        let bytes_verified = IntCounter::new(
            "ferry_agent_bytes_verified_total",
            "Destination bytes read back and matched against the source's hash",
        )?;
        let checksum_mismatches = IntCounter::new(
            "ferry_agent_checksum_mismatches_total",
            "Files whose destination bytes did not hash to the source's (not committed)",
        )?;
        let file_copy_seconds = Histogram::with_opts(
            HistogramOpts::new(
                "ferry_agent_file_copy_duration_seconds",
                "Time to copy one regular file, from opening its source to its commit",
            )
            .buckets(FILE_SECONDS_BUCKETS.to_vec()),
        )?;
        let active_shards = IntGauge::new(
            "ferry_agent_active_shards",
            "CopyJob shards this agent is running",
        )?;
        let ready = IntGauge::new(
            "ferry_agent_ready",
            "1 when the agent is ready (CopyJob watch synced, heartbeat Lease current), else 0",
        )?;
        let jobs_watched = IntGauge::new(
            "ferry_agent_jobs_watched",
            "CopyJobs this agent holds: those with a shard on its node (labelled for it)",
        )?;
        let job_gauge =
            |name: &str, help: &str| IntGaugeVec::new(Opts::new(name, help), &JOB_LABELS);
        let jobs = Arc::new(JobGauges {
            bytes_done: job_gauge(
                "ferry_agent_job_bytes_done",
                "Bytes of committed files of a CopyJob's shards on this agent (until the job is deleted)",
            )?,
            bytes_total: job_gauge(
                "ferry_agent_job_bytes_total",
                "Bytes a CopyJob's shards on this agent carry in all, once counted (until the job is deleted)",
            )?,
            files_done: job_gauge(
                "ferry_agent_job_files_done",
                "Files committed by a CopyJob's shards on this agent (until the job is deleted)",
            )?,
            shards: Mutex::default(),
        });
        let network_bytes = IntCounterVec::new(
            Opts::new(
                "ferry_agent_network_bytes_total",
                "File bytes of copies between nodes, by direction (sent: served as a sender; received: as a receiver) and CopyJob (holes are not sent)",
            ),
            &["direction", JOB_LABELS[0], JOB_LABELS[1]],
        )?;
        let connections = IntGaugeVec::new(
            Opts::new(
                "ferry_agent_network_connections",
                "Open transfer connections of copies between nodes, by role (sender, receiver)",
            ),
            &["role"],
        )?;
        let redials = IntCounter::new(
            "ferry_agent_network_redials_total",
            "Connections to a sender dialled again after one was lost mid-copy (the copy resumes)",
        )?;
        let resends = IntCounter::new(
            "ferry_agent_network_resends_total",
            "Files of copies between nodes asked for once more because their bytes arrived changed (a second change is a ChecksumMismatch)",
        )?;
        for role in ["sender", "receiver"] {
            connections.with_label_values(&[role]);
        }
        for c in [
            Box::new(network_bytes.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(connections.clone()),
            Box::new(redials.clone()),
            Box::new(resends.clone()),
            Box::new(bytes.clone()),
            Box::new(files.clone()),
            Box::new(failures.clone()),
            Box::new(bytes_verified.clone()),
            Box::new(checksum_mismatches.clone()),
            Box::new(file_copy_seconds.clone()),
            Box::new(active_shards.clone()),
            Box::new(ready.clone()),
            Box::new(jobs_watched.clone()),
            Box::new(jobs.bytes_done.clone()),
            Box::new(jobs.bytes_total.clone()),
            Box::new(jobs.files_done.clone()),
        ] {
            registry.register(c)?;
        }
        // Every label value is exported from the start, so rate() and increase() have a
        // zero to start from and a panel shows 0 rather than no data.
        for kind in Reason::PER_ENTRY {
            failures.with_label_values(&[kind.as_str()]);
        }
        let bytes_by_strategy = Strategy::ALL.map(|s| bytes.with_label_values(&[s.as_str()]));
        Ok(Self {
            registry,
            bytes_by_strategy,
            files_copied: files.with_label_values(&["copied"]),
            files_skipped: files.with_label_values(&["skipped"]),
            files_failed: files.with_label_values(&["failed"]),
            files_deleted: files.with_label_values(&["deleted"]),
            bytes,
            files,
            failures,
            bytes_verified,
            checksum_mismatches,
            file_copy_seconds,
            active_shards,
            ready,
            jobs_watched,
            jobs,
            network_bytes,
            network_jobs: Arc::default(),
            connections,
            redials,
            resends,
        })
    }

    /// `n` more file bytes of `namespace/job` crossed the network in `direction` (`sent` or
    /// `received`).
    pub fn network(&self, direction: &str, namespace: &str, job: &str, n: u64) {
        lock(&self.network_jobs).insert((namespace.to_string(), job.to_string()));
        self.network_bytes
            .with_label_values(&[direction, namespace, job])
            .inc_by(n);
    }

    /// `bytes` reached a destination by `strategy`.
    pub fn bytes_copied(&self, bytes: u64, strategy: Strategy) {
        self.bytes_by_strategy[strategy as usize].inc_by(bytes);
    }

    /// A regular file was committed after `seconds`.
    pub fn file_copied(&self, seconds: f64) {
        self.files_copied.inc();
        self.file_copy_seconds.observe(seconds);
    }

    /// An entry was kept as the destination has it.
    pub fn file_skipped(&self) {
        self.files_skipped.inc();
    }

    /// A mirror removed this many entries from a destination.
    pub fn entries_deleted(&self, n: u64) {
        self.files_deleted.inc_by(n);
    }

    /// An entry failed.
    pub fn file_failed(&self, kind: Reason) {
        self.files_failed.inc();
        self.failures.with_label_values(&[kind.as_str()]).inc();
        if kind == Reason::ChecksumMismatch {
            self.checksum_mismatches.inc();
        }
    }

    /// Record a shard's progress and set its job's gauges to the sum over the job's
    /// shards on this agent. The total is exported only when every one of them has one
    /// (a partial sum would make the job look nearer its end than it is).
    pub fn shard_progress(&self, namespace: &str, job: &str, shard: &str, p: ShardProgress) {
        let jobs = &self.jobs;
        let mut all = lock(&jobs.shards);
        let shards = all
            .entry((namespace.to_string(), job.to_string()))
            .or_default();
        shards.insert(shard.to_string(), p);
        let labels = [namespace, job];
        let sum = |f: fn(&ShardProgress) -> u64| shards.values().map(f).sum::<u64>() as i64;
        jobs.files_done
            .with_label_values(&labels)
            .set(sum(|s| s.files_done));
        jobs.bytes_done
            .with_label_values(&labels)
            .set(sum(|s| s.bytes_done));
        let total: Option<u64> = shards.values().map(|s| s.bytes_total).sum();
        match total {
            Some(t) => jobs.bytes_total.with_label_values(&labels).set(t as i64),
            None => {
                let _ = jobs.bytes_total.remove_label_values(&labels);
            }
        }
    }

    /// The job is gone: its series go too (Prometheus marks them stale at the next scrape).
    pub fn forget_job(&self, namespace: &str, job: &str) {
        if lock(&self.network_jobs).remove(&(namespace.to_string(), job.to_string())) {
            for direction in ["sent", "received"] {
                let _ = self
                    .network_bytes
                    .remove_label_values(&[direction, namespace, job]);
            }
        }
        let mut all = lock(&self.jobs.shards);
        if all
            .remove(&(namespace.to_string(), job.to_string()))
            .is_some()
        {
            let labels = [namespace, job];
            for g in [
                &self.jobs.files_done,
                &self.jobs.bytes_done,
                &self.jobs.bytes_total,
            ] {
                let _ = g.remove_label_values(&labels);
            }
        }
    }

    /// After a full list of the CopyJobs: forget every job that is not in it (deleted while
    /// the watch was down, so no delete event came).
    pub fn retain_jobs(&self, existing: &HashSet<(String, String)>) {
        let mut gone: Vec<(String, String)> = lock(&self.jobs.shards)
            .keys()
            .filter(|k| !existing.contains(*k))
            .cloned()
            .collect();
        gone.extend(
            lock(&self.network_jobs)
                .iter()
                .filter(|k| !existing.contains(*k))
                .cloned(),
        );
        for (ns, job) in gone {
            self.forget_job(&ns, &job);
        }
    }
}

static METRICS: std::sync::OnceLock<Metrics> = std::sync::OnceLock::new();

/// The process's metrics, labelled with `node` (first call wins; `ferry-agent run` makes
/// it before anything counts).
pub fn init_metrics(node: &str) -> &'static Metrics {
    // The names are constants: registration cannot fail.
    METRICS.get_or_init(|| Metrics::new(node).unwrap_or_else(|e| panic!("metrics: {e}")))
}

/// The process's metrics (one registry per agent process, like Prometheus' default one).
pub fn metrics() -> &'static Metrics {
    init_metrics("")
}

/// What `/readyz` looks at.
#[derive(Debug, Default)]
pub struct Health {
    /// The CopyJob watch has delivered its first list.
    pub watching: AtomicBool,
    /// Unix seconds of the last successful heartbeat Lease renewal (0: never).
    pub lease_renewed: AtomicI64,
    /// How long a renewal stays good, in seconds.
    pub lease_seconds: i64,
}

pub fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

impl Health {
    /// `Ok` when ready, or why not.
    pub fn ready(&self) -> Result<(), String> {
        if !self.watching.load(Ordering::Relaxed) {
            return Err("not watching CopyJobs yet".into());
        }
        let renewed = self.lease_renewed.load(Ordering::Relaxed);
        if renewed == 0 {
            return Err("heartbeat Lease not renewed yet".into());
        }
        let age = unix_now() - renewed;
        if age > self.lease_seconds {
            return Err(format!("heartbeat Lease last renewed {age} s ago"));
        }
        Ok(())
    }
}

/// What the agent serves.
#[allow(missing_debug_implementations)]
pub struct AgentEndpoints {
    pub metrics: &'static Metrics,
    pub health: Arc<Health>,
}

impl ferry_serve::Endpoints for AgentEndpoints {
    fn metrics(&self) -> String {
        self.metrics
            .ready
            .set(i64::from(self.health.ready().is_ok()));
        ferry_serve::render(&self.metrics.registry)
    }
    fn ready(&self) -> Result<(), String> {
        self.health.ready()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The value of the series `name` that has (at least) `labels`, from rendered text.
    fn value(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        text.lines().find_map(|l| {
            let (series, v) = l.rsplit_once(' ')?;
            let (n, rest) = series.split_once('{').unwrap_or((series, "}"));
            let have: Vec<&str> = rest.trim_end_matches('}').split(',').collect();
            let all = labels
                .iter()
                .all(|(k, v)| have.contains(&format!("{k}=\"{v}\"").as_str()));
            (n == name && all).then(|| v.parse().ok()).flatten()
        })
    }

    fn progress(files: u64, bytes: u64, total: Option<u64>) -> ShardProgress {
        ShardProgress {
            files_done: files,
            bytes_done: bytes,
            bytes_total: total,
        }
    }

    #[test]
    fn every_series_carries_the_node_and_every_label_value_starts_at_zero() {
        let m = Metrics::new("node-a").expect("metrics");
        let text = ferry_serve::render(&m.registry);
        let node = ("node", "node-a");
        for (name, label) in [
            (
                "ferry_agent_bytes_copied_total",
                Some(("strategy", "reflink")),
            ),
            (
                "ferry_agent_bytes_copied_total",
                Some(("strategy", "read_write")),
            ),
            (
                "ferry_agent_failures_total",
                Some(("reason", "ChecksumMismatch")),
            ),
            ("ferry_agent_failures_total", Some(("reason", "IOError"))),
            ("ferry_agent_files_total", Some(("result", "skipped"))),
            ("ferry_agent_files_total", Some(("result", "failed"))),
            ("ferry_agent_files_total", Some(("result", "deleted"))),
            ("ferry_agent_bytes_verified_total", None),
            ("ferry_agent_checksum_mismatches_total", None),
            ("ferry_agent_file_copy_duration_seconds_count", None),
            ("ferry_agent_active_shards", None),
        ] {
            let labels: Vec<_> = [node].into_iter().chain(label).collect();
            assert_eq!(
                value(&text, name, &labels),
                Some(0.0),
                "{name} {labels:?} in:\n{text}"
            );
        }
    }

    #[test]
    fn a_checksum_mismatch_counts_as_a_failed_file_a_failure_and_a_mismatch() {
        let m = Metrics::new("n").expect("metrics");
        m.file_failed(Reason::ChecksumMismatch);
        m.file_failed(Reason::NotFound);
        m.file_copied(0.003);
        m.bytes_copied(4096, Strategy::CopyFileRange);
        let t = ferry_serve::render(&m.registry);
        let files = "ferry_agent_files_total";
        assert_eq!(value(&t, files, &[("result", "failed")]), Some(2.0));
        assert_eq!(value(&t, files, &[("result", "copied")]), Some(1.0));
        assert_eq!(value(&t, files, &[("result", "skipped")]), Some(0.0));
        assert_eq!(
            value(&t, "ferry_agent_checksum_mismatches_total", &[]),
            Some(1.0)
        );
        let failures = "ferry_agent_failures_total";
        assert_eq!(value(&t, failures, &[("reason", "NotFound")]), Some(1.0));
        let bucket = "ferry_agent_file_copy_duration_seconds_bucket";
        assert_eq!(value(&t, bucket, &[("le", "0.005")]), Some(1.0));
        assert_eq!(value(&t, bucket, &[("le", "0.0025")]), Some(0.0));
        let bytes = "ferry_agent_bytes_copied_total";
        let by = |s| value(&t, bytes, &[("strategy", s)]);
        assert_eq!(by("copy_file_range"), Some(4096.0));
        assert_eq!(by("reflink"), Some(0.0));
    }

    #[test]
    fn job_gauges_add_up_the_jobs_shards_and_disappear_with_the_job() {
        let m = Metrics::new("n").expect("metrics");
        m.shard_progress("default", "big", "0", progress(10, 1000, Some(5000)));
        m.shard_progress("default", "big", "3", progress(5, 500, None));
        m.shard_progress("team", "small", "0", progress(1, 7, Some(7)));
        let big = [("copyjob_namespace", "default"), ("copyjob", "big")];
        let t = ferry_serve::render(&m.registry);
        assert_eq!(value(&t, "ferry_agent_job_bytes_done", &big), Some(1500.0));
        assert_eq!(value(&t, "ferry_agent_job_files_done", &big), Some(15.0));
        // One of its shards has no total yet: no total for the job.
        assert_eq!(value(&t, "ferry_agent_job_bytes_total", &big), None);
        m.shard_progress("default", "big", "3", progress(6, 600, Some(600)));
        let t = ferry_serve::render(&m.registry);
        assert_eq!(value(&t, "ferry_agent_job_bytes_total", &big), Some(5600.0));
        assert_eq!(value(&t, "ferry_agent_job_bytes_done", &big), Some(1600.0));
        m.forget_job("default", "big");
        let t = ferry_serve::render(&m.registry);
        assert!(!t.contains(r#"copyjob="big""#), "{t}");
        assert!(t.contains(r#"copyjob="small""#), "{t}");
        // A relist that no longer has it forgets the other one.
        m.retain_jobs(&HashSet::new());
        let t = ferry_serve::render(&m.registry);
        assert!(!t.contains("copyjob="), "{t}");
    }
}
