//! The operator's metrics and readiness, served on `--listen` by [`ferry_serve`] as
//! `/metrics`, `/healthz` and `/readyz`.
//!
//! Readiness: both replicas are ready once they do their part. The leader is ready when
//! its CopyJob watch has delivered its first list; a standby is ready while it reaches the
//! API server (its last look at the leader Lease succeeded within the lease's duration),
//! so a rolling update of a two-replica Deployment is not held up by the replica that
//! waits. Only the leader watches CopyJobs and CopySchedules, so only the leader exports
//! the job and schedule gauges (`ferry_operator_jobs`, `ferry_operator_job_phase`,
//! `ferry_operator_schedule_*`): a sum over replicas counts each once.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ferry_crds::{CopyJob, CopySchedule, Phase};
use k8s_openapi::jiff::Timestamp;
use kube::runtime::reflector::Store;
use kube::ResourceExt;
use prometheus::{Histogram, HistogramOpts, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};

/// Every phase, as exported (a job without a phase yet is Pending).
const PHASES: [Phase; 5] = [
    Phase::Pending,
    Phase::Running,
    Phase::Suspended,
    Phase::Succeeded,
    Phase::Failed,
];

fn phase_label(p: Phase) -> &'static str {
    match p {
        Phase::Pending => "Pending",
        Phase::Running => "Running",
        Phase::Suspended => "Suspended",
        Phase::Succeeded => "Succeeded",
        Phase::Failed => "Failed",
    }
}

/// Every `kind` label of `ferry_operator_reconcile_errors_total`.
pub const ERROR_KINDS: [&str; 3] = ["kube_api", "finalizer", "no_namespace"];

/// What a reconcile error tells the metrics: its bounded `kind` label (one of
/// [`ERROR_KINDS`]), or `None` for an outcome that is not a failure.
pub trait MetricKind {
    fn metric_kind(&self) -> Option<&'static str>;
}

/// Reconcile times: most reconciles are a few API calls.
const RECONCILE_SECONDS_BUCKETS: [f64; 12] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0, 30.0,
];

/// The operator's metrics, named `ferry_operator_<what>_<unit>`.
#[allow(missing_debug_implementations)]
pub struct Metrics {
    pub registry: Registry,
    /// `ferry_operator_reconcile_duration_seconds`.
    pub reconcile_seconds: Histogram,
    /// `ferry_operator_reconcile_errors_total{kind}`.
    pub reconcile_errors: IntCounterVec,
    /// `ferry_operator_jobs{phase}` (leader only, set at each scrape).
    pub jobs: IntGaugeVec,
    /// `ferry_operator_job_phase{copyjob_namespace, copyjob, phase}`: 1 for the job's
    /// phase, 0 for the others (leader only, set at each scrape).
    pub job_phase: IntGaugeVec,
    /// `ferry_operator_schedule_last_success_timestamp_seconds{copyschedule_namespace,
    /// copyschedule}`: when the schedule's newest Succeeded CopyJob finished (absent
    /// until one has).
    pub schedule_last_success: IntGaugeVec,
    /// `ferry_operator_schedule_created_timestamp_seconds{...}`: when the schedule was
    /// created (what "late" counts from before a first success).
    pub schedule_created: IntGaugeVec,
    /// `ferry_operator_schedule_interval_seconds{...}`: the nominal time between two runs
    /// (absent while suspended or refused: such a schedule is never late).
    pub schedule_interval: IntGaugeVec,
    /// `ferry_operator_leader`: 1 while this replica leads.
    pub leader: IntGauge,
    /// `ferry_operator_ready`: what `/readyz` answers, as 1 or 0.
    pub ready: IntGauge,
    /// Scrapes rebuild the job gauges one at a time.
    scrape: Mutex<()>,
}

impl Metrics {
    pub fn new() -> prometheus::Result<Self> {
        let registry = Registry::new();
        let reconcile_seconds = Histogram::with_opts(
            HistogramOpts::new(
                "ferry_operator_reconcile_duration_seconds",
                "Time one CopyJob reconcile took (finalizer, validation, resolution, placement, status)",
            )
            .buckets(RECONCILE_SECONDS_BUCKETS.to_vec()),
        )?;
        let reconcile_errors = IntCounterVec::new(
            Opts::new(
                "ferry_operator_reconcile_errors_total",
                "Reconciles that failed and were requeued, by kind (kube_api, finalizer, no_namespace)",
            ),
            &["kind"],
        )?;
        let jobs = IntGaugeVec::new(
            Opts::new(
                "ferry_operator_jobs",
                "CopyJobs by phase (exported by the leading replica)",
            ),
            &["phase"],
        )?;
        let job_phase = IntGaugeVec::new(
            Opts::new(
                "ferry_operator_job_phase",
                "1 for a CopyJob's current phase, 0 for the others (exported by the leading replica)",
            ),
            &["copyjob_namespace", "copyjob", "phase"],
        )?;
        let schedule_labels = ["copyschedule_namespace", "copyschedule"];
        let schedule_last_success = IntGaugeVec::new(
            Opts::new(
                "ferry_operator_schedule_last_success_timestamp_seconds",
                "When the CopySchedule's newest Succeeded CopyJob finished, in Unix seconds (exported by the leading replica)",
            ),
            &schedule_labels,
        )?;
        let schedule_created = IntGaugeVec::new(
            Opts::new(
                "ferry_operator_schedule_created_timestamp_seconds",
                "When the CopySchedule was created, in Unix seconds (exported by the leading replica)",
            ),
            &schedule_labels,
        )?;
        let schedule_interval = IntGaugeVec::new(
            Opts::new(
                "ferry_operator_schedule_interval_seconds",
                "Nominal seconds between two runs of the CopySchedule: the longest gap among its next runs (absent while suspended or refused; exported by the leading replica)",
            ),
            &schedule_labels,
        )?;
        let leader = IntGauge::new(
            "ferry_operator_leader",
            "1 while this replica holds the leader Lease",
        )?;
        let ready = IntGauge::new(
            "ferry_operator_ready",
            "1 when this replica is ready (see /readyz), else 0",
        )?;
        for c in [
            Box::new(reconcile_seconds.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(reconcile_errors.clone()),
            Box::new(jobs.clone()),
            Box::new(job_phase.clone()),
            Box::new(schedule_last_success.clone()),
            Box::new(schedule_created.clone()),
            Box::new(schedule_interval.clone()),
            Box::new(leader.clone()),
            Box::new(ready.clone()),
        ] {
            registry.register(c)?;
        }
        for kind in ERROR_KINDS {
            reconcile_errors.with_label_values(&[kind]);
        }
        Ok(Self {
            registry,
            reconcile_seconds,
            reconcile_errors,
            jobs,
            job_phase,
            schedule_last_success,
            schedule_created,
            schedule_interval,
            leader,
            ready,
            scrape: Mutex::new(()),
        })
    }

    /// One reconcile ended after `took`, with `error` when it failed.
    pub fn reconciled(&self, took: Duration, error: Option<&dyn MetricKind>) {
        self.reconcile_seconds.observe(took.as_secs_f64());
        if let Some(kind) = error.and_then(MetricKind::metric_kind) {
            self.reconcile_errors.with_label_values(&[kind]).inc();
        }
    }

    /// Set the job gauges from the controller's cache (the jobs that exist now; the series
    /// of deleted jobs go).
    pub fn observe_jobs(&self, jobs: &[Arc<CopyJob>]) {
        let _one = self.scrape.lock().unwrap_or_else(|e| e.into_inner());
        let mut counts: HashMap<&'static str, i64> = HashMap::new();
        self.job_phase.reset();
        for job in jobs {
            let phase = job
                .status
                .as_ref()
                .and_then(|s| s.phase)
                .unwrap_or_default();
            *counts.entry(phase_label(phase)).or_default() += 1;
            let (ns, name) = (job.namespace().unwrap_or_default(), job.name_any());
            for p in PHASES {
                self.job_phase
                    .with_label_values(&[&ns, &name, phase_label(p)])
                    .set(i64::from(p == phase));
            }
        }
        for p in PHASES {
            let label = phase_label(p);
            self.jobs
                .with_label_values(&[label])
                .set(counts.get(label).copied().unwrap_or(0));
        }
    }
}

impl Metrics {
    /// Set the schedule gauges from the schedule controller's cache at `now` (the
    /// schedules that exist now; a deleted schedule's series go).
    pub fn observe_schedules(&self, schedules: &[Arc<CopySchedule>], now: Timestamp) {
        let _one = self.scrape.lock().unwrap_or_else(|e| e.into_inner());
        for g in [
            &self.schedule_last_success,
            &self.schedule_created,
            &self.schedule_interval,
        ] {
            g.reset();
        }
        for s in schedules {
            let (ns, name) = (s.namespace().unwrap_or_default(), s.name_any());
            let labels = [ns.as_str(), name.as_str()];
            if let Some(t) = &s.metadata.creation_timestamp {
                self.schedule_created
                    .with_label_values(&labels)
                    .set(t.0.as_second());
            }
            if let Some(t) = s
                .status
                .as_ref()
                .and_then(|st| st.last_successful_time.as_ref())
            {
                self.schedule_last_success
                    .with_label_values(&labels)
                    .set(t.0.as_second());
            }
            // Only a schedule the controller accepted is read again here: finding out that
            // one never comes due ("0 0 30 2 *") takes a search to the year 5000.
            let refused = s.status.as_ref().is_none_or(|st| {
                !st.conditions.iter().any(|c| {
                    c.type_ == "Accepted"
                        && c.status == "True"
                        && c.observed_generation == s.metadata.generation
                })
            });
            if s.spec.suspend || refused {
                continue;
            }
            let interval = crate::cron::Schedule::new(&s.spec.schedule, &s.spec.time_zone)
                .ok()
                .and_then(|c| c.interval(now));
            if let Some(i) = interval {
                self.schedule_interval
                    .with_label_values(&labels)
                    .set(i64::try_from(i.as_secs()).unwrap_or(i64::MAX));
            }
        }
    }
}

/// This replica's part, for `/readyz` (0: has not looked at the lease yet).
const STANDBY: u8 = 1;
const LEADER: u8 = 2;

/// What `/readyz` looks at.
#[derive(Default)]
#[allow(missing_debug_implementations)] // Store is not Debug
pub struct Health {
    /// 0 (starting), [`STANDBY`] or [`LEADER`].
    role: AtomicU8,
    /// Unix seconds of the last successful look at the leader Lease (0: never).
    api_reached: AtomicI64,
    /// The leader's CopyJob watch has delivered its first list.
    watching: Arc<AtomicBool>,
    /// The leader's CopyJob cache (the controller's).
    store: Mutex<Option<Store<CopyJob>>>,
    /// The leader's CopySchedule cache (the schedule controller's).
    schedules: Mutex<Option<Store<CopySchedule>>>,
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

impl Health {
    /// A look at the leader Lease succeeded: this replica leads (`true`) or stands by.
    pub fn lease_checked(&self, leading: bool) {
        self.api_reached.store(unix_now(), Ordering::Relaxed);
        self.role
            .store(if leading { LEADER } else { STANDBY }, Ordering::Relaxed);
    }

    /// The controller's cache, which scrapes read the job gauges from.
    pub fn set_store(&self, store: Store<CopyJob>) {
        *self.store.lock().unwrap_or_else(|e| e.into_inner()) = Some(store);
    }

    /// What to call when the controller's CopyJob watch has listed every job. (Not
    /// `Store::wait_until_ready`: its readiness signal wakes only one waiting task, and
    /// the controller itself waits on it.)
    pub fn watch_listed(&self) -> impl Fn() + Send + Sync + 'static {
        let watching = self.watching.clone();
        move || watching.store(true, Ordering::Relaxed)
    }

    fn store(&self) -> Option<Store<CopyJob>> {
        self.store.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The schedule controller's cache, which scrapes read the schedule gauges from.
    pub fn set_schedule_store(&self, store: Store<CopySchedule>) {
        *self.schedules.lock().unwrap_or_else(|e| e.into_inner()) = Some(store);
    }

    fn schedules(&self) -> Option<Store<CopySchedule>> {
        self.schedules
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// `Ok` when ready, or why not.
    pub fn ready(&self) -> Result<(), String> {
        match self.role.load(Ordering::Relaxed) {
            LEADER if self.watching.load(Ordering::Relaxed) => Ok(()),
            LEADER => Err("leading; the CopyJob watch has not listed the jobs yet".into()),
            STANDBY => {
                let age = unix_now() - self.api_reached.load(Ordering::Relaxed);
                if age > i64::from(crate::leader::LEASE_SECONDS) {
                    Err(format!(
                        "standing by; the API server was last reached {age} s ago"
                    ))
                } else {
                    Ok(())
                }
            }
            _ => Err("has not reached the API server yet".into()),
        }
    }

    fn leading(&self) -> bool {
        self.role.load(Ordering::Relaxed) == LEADER
    }
}

/// What the operator serves.
#[allow(missing_debug_implementations)]
pub struct OperatorEndpoints {
    pub metrics: Arc<Metrics>,
    pub health: Arc<Health>,
}

impl ferry_serve::Endpoints for OperatorEndpoints {
    fn metrics(&self) -> String {
        let m = &self.metrics;
        m.ready.set(i64::from(self.health.ready().is_ok()));
        m.leader.set(i64::from(self.health.leading()));
        if let Some(store) = self.health.store() {
            m.observe_jobs(&store.state());
        }
        if let Some(store) = self.health.schedules() {
            m.observe_schedules(&store.state(), Timestamp::now());
        }
        ferry_serve::render(&m.registry)
    }
    fn ready(&self) -> Result<(), String> {
        self.health.ready()
    }
}

impl MetricKind for crate::Error {
    /// The bounded `kind` label of a reconcile error, or `None` for an outcome that is not
    /// a failure (a deletion that waits for agents to stop their shards).
    fn metric_kind(&self) -> Option<&'static str> {
        use kube::runtime::finalizer::Error as F;
        match self {
            crate::Error::Kube(_) => Some("kube_api"),
            crate::Error::NoNamespace(_) => Some("no_namespace"),
            crate::Error::Ticket(_) => Some("ticket"),
            crate::Error::Stopping(_) => None,
            crate::Error::Finalizer(e) => match &**e {
                F::ApplyFailed(inner) | F::CleanupFailed(inner) => inner.metric_kind(),
                F::AddFinalizer(_)
                | F::RemoveFinalizer(_)
                | F::UnnamedObject
                | F::InvalidFinalizer => Some("finalizer"),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_crds::CopyJobStatus;

    fn job(ns: &str, name: &str, phase: Option<Phase>) -> Arc<CopyJob> {
        let mut j: CopyJob = serde_json::from_value(serde_json::json!({
            "apiVersion": "ferry.dev/v1alpha1",
            "kind": "CopyJob",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"source": {"root": "r", "path": "a"}, "destination": {"root": "r", "path": "b"}},
        }))
        .expect("a CopyJob");
        j.status = Some(CopyJobStatus {
            phase,
            ..Default::default()
        });
        Arc::new(j)
    }

    #[test]
    fn jobs_are_counted_by_phase_and_each_job_has_one_phase_set() {
        let m = Metrics::new().expect("metrics");
        m.observe_jobs(&[
            job("a", "one", Some(Phase::Running)),
            job("a", "two", Some(Phase::Running)),
            job("b", "three", Some(Phase::Failed)),
            job("b", "new", None),
        ]);
        let get = |phase| m.jobs.with_label_values(&[phase]).get();
        assert_eq!(
            [
                get("Pending"),
                get("Running"),
                get("Suspended"),
                get("Succeeded"),
                get("Failed")
            ],
            [1, 2, 0, 0, 1]
        );
        let phase = |ns, name, p| m.job_phase.with_label_values(&[ns, name, p]).get();
        assert_eq!(phase("b", "three", "Failed"), 1);
        assert_eq!(phase("b", "three", "Running"), 0);
        // A job that is gone loses its series at the next scrape.
        m.observe_jobs(&[job("a", "one", Some(Phase::Succeeded))]);
        let text = ferry_serve::render(&m.registry);
        assert!(!text.contains("three"), "{text}");
        assert_eq!(get("Running"), 0);
        assert_eq!(get("Succeeded"), 1);
    }

    fn schedule(name: &str, expression: &str, suspend: bool, accepted: bool) -> Arc<CopySchedule> {
        let mut s: CopySchedule = serde_json::from_value(serde_json::json!({
            "apiVersion": "ferry.dev/v1alpha1",
            "kind": "CopySchedule",
            "metadata": {"name": name, "namespace": "team", "generation": 2, "creationTimestamp": "2026-05-04T10:00:00Z"},
            "spec": {
                "schedule": expression,
                "suspend": suspend,
                "jobTemplate": {"spec": {"source": {"root": "r", "path": "a"}, "destination": {"root": "r", "path": "b"}}},
            },
            "status": {
                "lastSuccessfulTime": "2026-05-04T11:00:07Z",
                "conditions": [{"type": "Accepted", "status": if accepted { "True" } else { "False" }, "reason": "Valid", "message": "", "observedGeneration": 2, "lastTransitionTime": "2026-05-04T10:00:00Z"}],
            },
        }))
        .expect("a CopySchedule");
        if name == "new" {
            s.status = None;
        }
        Arc::new(s)
    }

    #[test]
    fn schedules_export_their_last_success_creation_and_interval_until_deleted() {
        let m = Metrics::new().expect("metrics");
        let now: Timestamp = "2026-05-04T12:00:00Z".parse().expect("a time");
        m.observe_schedules(
            &[
                schedule("hourly", "@hourly", false, true),
                schedule("paused", "@hourly", true, true),
                schedule("refused", "0 0 30 2 *", false, false),
                schedule("new", "*/5 * * * *", false, true),
            ],
            now,
        );
        assert_eq!(
            m.schedule_interval
                .with_label_values(&["team", "hourly"])
                .get(),
            3600
        );
        assert_eq!(
            m.schedule_last_success
                .with_label_values(&["team", "hourly"])
                .get(),
            1_777_892_407
        );
        assert_eq!(
            m.schedule_created
                .with_label_values(&["team", "hourly"])
                .get(),
            1_777_888_800
        );
        // Suspended or refused: never late, so no interval; not yet accepted either.
        let text = ferry_serve::render(&m.registry);
        for name in ["paused", "refused", "new"] {
            assert!(
                !text.contains(&format!(
                    "ferry_operator_schedule_interval_seconds{{copyschedule=\"{name}\""
                )),
                "{name}: {text}"
            );
        }
        // A schedule that never succeeded has no last success.
        assert!(!text.contains(
            "ferry_operator_schedule_last_success_timestamp_seconds{copyschedule=\"new\""
        ));
        // Deleted: its series go.
        m.observe_schedules(&[schedule("paused", "@hourly", true, true)], now);
        let text = ferry_serve::render(&m.registry);
        assert!(!text.contains("\"hourly\""), "{text}");
        assert!(text.contains("ferry_operator_schedule_created_timestamp_seconds{copyschedule=\"paused\",copyschedule_namespace=\"team\"}"), "{text}");
    }

    #[test]
    fn a_standby_is_ready_while_it_reaches_the_api_and_a_leader_once_it_watches() {
        let h = Health::default();
        assert!(h.ready().is_err(), "not ready before reaching the API");
        h.lease_checked(false);
        assert_eq!(h.ready(), Ok(()));
        h.api_reached.store(unix_now() - 60, Ordering::Relaxed);
        assert!(h.ready().is_err_and(|e| e.contains("60 s ago")));
        h.lease_checked(true);
        assert!(h.ready().is_err_and(|e| e.contains("not listed")));
        h.watching.store(true, Ordering::Relaxed);
        assert_eq!(h.ready(), Ok(()));
    }
}
