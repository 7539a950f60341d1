//! The `CopySchedule` resource: CopyJobs created on a cron schedule, as a `CronJob` creates
//! Jobs (the operator's `copyschedule` module runs it), and the names it gives what it
//! creates: the label and annotation on each CopyJob, and its events' reasons.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use crate::CopyJobSpec;

/// Label on every CopyJob a CopySchedule creates: the schedule's name, or, for a name too
/// long to leave room for the run's suffix in a CopyJob name, its head and a hash (the
/// prefix of the jobs' names either way). `kubectl get cpj -l ferry.dev/copyschedule=NAME`.
pub const SCHEDULE_LABEL: &str = "ferry.dev/copyschedule";
/// Annotation on every CopyJob a CopySchedule creates: the scheduled time it ran for
/// (RFC 3339, UTC), which is not the time it was created when a run started late.
pub const SCHEDULED_TIME_ANNOTATION: &str = "ferry.dev/scheduled-time";

wire_enum! {
    /// Reasons of a CopySchedule's events (its Accepted condition uses `Reason`: `Valid`, or
    /// `InvalidSpec`, which is also an event).
    pub enum ScheduleEvent {
        /// A CopyJob was created for a scheduled time.
        Created,
        /// A scheduled time came and no CopyJob was created for it: the previous one is
        /// unfinished (Forbid), it is later than startingDeadlineSeconds, or another object
        /// has the run's name.
        Skipped,
        /// An unfinished CopyJob was deleted to start the next run (Replace).
        Replaced,
        /// A finished CopyJob beyond the history limits was deleted.
        Deleted,
    }
}

/// What to do when a run comes due while an earlier CopyJob of the schedule is unfinished.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, schemars::JsonSchema,
)]
pub enum ConcurrencyPolicy {
    /// Skip the run (an event says so); the most recent skipped run starts once the earlier
    /// one finishes, if that is within startingDeadlineSeconds.
    #[default]
    Forbid,
    /// Delete the unfinished CopyJob (its agents stop at the next file, as for any deleted
    /// CopyJob; what it copied stays), then create the new one.
    Replace,
}

/// Labels and annotations for the CopyJobs a schedule creates.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TemplateMetadata {
    /// Labels of each CopyJob (the operator adds `ferry.dev/copyschedule`, which wins).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Annotations of each CopyJob (the operator adds `ferry.dev/scheduled-time`, which wins).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// The CopyJob each run creates.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct CopyJobTemplate {
    /// Labels and annotations of each CopyJob. Its name is the schedule's and the run's
    /// scheduled time; its namespace is the schedule's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<TemplateMetadata>,
    /// The spec of each CopyJob, as in a CopyJob.
    pub spec: CopyJobSpec,
}

/// CopyJobs created on a cron schedule in the schedule's namespace, like a CronJob's Jobs:
/// each run copies `jobTemplate.spec` again (with `overwrite: IfChanged` and
/// `deleteExtraneous`, a replica kept in step with its source).
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[kube(
    group = "ferry.dev",
    version = "v1alpha1",
    kind = "CopySchedule",
    plural = "copyschedules",
    shortname = "cps",
    namespaced,
    status = "CopyScheduleStatus",
    printcolumn = r#"{"name":"Schedule","type":"string","jsonPath":".spec.schedule"}"#,
    printcolumn = r#"{"name":"TimeZone","type":"string","jsonPath":".spec.timeZone"}"#,
    printcolumn = r#"{"name":"Suspend","type":"boolean","jsonPath":".spec.suspend"}"#,
    printcolumn = r#"{"name":"Active","type":"integer","jsonPath":".status.activeCount"}"#,
    printcolumn = r#"{"name":"Last Schedule","type":"date","jsonPath":".status.lastScheduleTime"}"#,
    printcolumn = r#"{"name":"Last Success","type":"date","jsonPath":".status.lastSuccessfulTime"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct CopyScheduleSpec {
    /// When to run: a cron expression of 5 fields, minute (0-59), hour (0-23), day of month
    /// (1-31), month (1-12 or JAN-DEC), day of week (0-7 or SUN-SAT; 0 and 7 are Sunday),
    /// each `*`, a value, a range `a-b`, a step `*/n` or `a-b/n`, or a list of those (`0 3 * * *`:
    /// 03:00 every day; `*/15 * * * *`: every 15 minutes); or @yearly (@annually), @monthly,
    /// @weekly, @daily (@midnight), @hourly. As in crontab, when both day fields are
    /// restricted a day matching either runs. Also accepted: `L` (last day of the month, or
    /// `5L` the last Friday), `5#2` (the second Friday), `15W` (the weekday nearest the
    /// 15th). A time zone goes in timeZone, not here.
    #[schemars(length(min = 1, max = 256))]
    #[x_kube(validation = Rule::new("self.startsWith('@') || self.split(' ').filter(f, f != '').size() == 5").message("schedule must have 5 fields separated by spaces (minute hour day-of-month month day-of-week), or be @hourly, @daily, @weekly, @monthly or @yearly"))]
    #[x_kube(validation = Rule::new("!self.startsWith('TZ=') && !self.startsWith('CRON_TZ=')").message("a time zone goes in spec.timeZone, not in spec.schedule"))]
    pub schedule: String,
    /// IANA time zone the schedule is read in (`Europe/Berlin`, `America/New_York`; default
    /// `UTC`). Across a daylight-saving change, a time the clocks skip runs at the first
    /// minute after the gap and a time they repeat runs once, at its first occurrence.
    #[serde(default = "utc")]
    #[schemars(length(min = 1, max = 64))]
    pub time_zone: String,
    /// The CopyJob each run creates.
    pub job_template: CopyJobTemplate,
    /// When a run comes due while a CopyJob of this schedule is unfinished: Forbid (the
    /// default) skips it, Replace deletes the unfinished CopyJob and creates the new one.
    #[serde(default)]
    pub concurrency_policy: ConcurrencyPolicy,
    /// While true, no new run starts (a CopyJob already running goes on). After it turns
    /// false, a run missed meanwhile starts once, as after any downtime, unless
    /// startingDeadlineSeconds says it is too late.
    #[serde(default)]
    pub suspend: bool,
    /// Succeeded CopyJobs to keep (0-100, default 3); older ones are deleted, oldest
    /// first. A deleted CopyJob's copied data stays.
    #[serde(default = "three")]
    #[x_kube(validation = Rule::new("self >= 0 && self <= 100").message("successfulJobsHistoryLimit must be between 0 and 100"))]
    pub successful_jobs_history_limit: i32,
    /// Failed CopyJobs to keep (0-100, default 1); older ones are deleted, oldest first.
    #[serde(default = "one")]
    #[x_kube(validation = Rule::new("self >= 0 && self <= 100").message("failedJobsHistoryLimit must be between 0 and 100"))]
    pub failed_jobs_history_limit: i32,
    /// A run that could not start within this many seconds of its scheduled time (the
    /// operator was down, the schedule suspended, an earlier run unfinished under Forbid)
    /// is skipped. Unset: a missed run starts late, once, however late.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 0").message("startingDeadlineSeconds cannot be negative"))]
    pub starting_deadline_seconds: Option<i64>,
}

fn utc() -> String {
    "UTC".into()
}

fn three() -> i32 {
    3
}

fn one() -> i32 {
    1
}

/// Observed state of a CopySchedule, written by the operator.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CopyScheduleStatus {
    /// The scheduled time of the newest run a CopyJob was created for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_schedule_time: Option<Time>,
    /// When the newest Succeeded CopyJob of this schedule finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_successful_time: Option<Time>,
    /// The newest scheduled time that came and got no CopyJob when it came (see the
    /// Skipped event for why). Under Forbid it may still run once the earlier one finishes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_skipped_time: Option<Time>,
    /// Names of this schedule's CopyJobs that have not finished (in its namespace).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub active: Vec<String>,
    /// How many names `active` has (the ACTIVE column).
    #[serde(default)]
    pub active_count: i32,
    /// Accepted: Valid, or False with InvalidSpec when the schedule, the time zone or the
    /// template is refused (the message names the field and what to change); no CopyJob
    /// is created while it is False.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "conditions_schema")]
    pub conditions: Vec<Condition>,
}

/// Conditions as a list map keyed by type, as a CopyJob's are.
fn conditions_schema(gen: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let mut s = gen.subschema_for::<Vec<Condition>>();
    s.insert("x-kubernetes-list-type".into(), "map".into());
    s.insert(
        "x-kubernetes-list-map-keys".into(),
        serde_json::json!(["type"]),
    );
    s
}

#[cfg(test)]
mod tests {
    use kube::CustomResourceExt;

    use super::*;

    #[test]
    fn the_crd_bounds_the_schedule_the_zone_and_the_history_and_knows_both_policies() {
        let crd = serde_json::to_value(CopySchedule::crd()).expect("serialize the CRD");
        let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
            ["properties"];
        assert_eq!(spec["schedule"]["maxLength"], 256);
        let rules = spec["schedule"]["x-kubernetes-validations"].to_string();
        assert!(
            rules.contains("5 fields") && rules.contains("spec.timeZone"),
            "{rules}"
        );
        assert_eq!(spec["timeZone"]["maxLength"], 64);
        assert_eq!(spec["timeZone"]["default"], "UTC");
        assert_eq!(
            spec["concurrencyPolicy"]["enum"],
            serde_json::json!(["Forbid", "Replace"])
        );
        assert_eq!(spec["concurrencyPolicy"]["default"], "Forbid");
        assert_eq!(spec["successfulJobsHistoryLimit"]["default"], 3);
        assert_eq!(spec["failedJobsHistoryLimit"]["default"], 1);
        let rules = spec["failedJobsHistoryLimit"]["x-kubernetes-validations"].to_string();
        assert!(rules.contains("self <= 100"), "{rules}");
        // The template is a CopyJob spec, with the CopyJob's admission rules.
        let template = spec["jobTemplate"]["properties"]["spec"].to_string();
        assert!(
            template.contains("set exactly one of root, pvc, snapshot or export"),
            "{template}"
        );
        let columns: Vec<String> = crd["spec"]["versions"][0]["additionalPrinterColumns"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| c["name"].as_str().map(str::to_string))
            .collect();
        assert_eq!(
            columns,
            [
                "Schedule",
                "TimeZone",
                "Suspend",
                "Active",
                "Last Schedule",
                "Last Success",
                "Age"
            ]
        );
        assert_eq!(
            crd["spec"]["names"]["shortNames"],
            serde_json::json!(["cps"])
        );
        assert_eq!(crd["spec"]["scope"], "Namespaced");
    }

    #[test]
    fn a_minimal_schedule_gets_the_defaults() {
        let s: CopyScheduleSpec = serde_json::from_value(serde_json::json!({
            "schedule": "@daily",
            "jobTemplate": {"spec": {"source": {"root": "r", "path": "a"}, "destination": {"root": "r", "path": "b"}}},
        }))
        .expect("a CopyScheduleSpec");
        assert_eq!(s.concurrency_policy, ConcurrencyPolicy::Forbid);
        assert_eq!(
            (s.successful_jobs_history_limit, s.failed_jobs_history_limit),
            (3, 1)
        );
        assert_eq!(s.time_zone, "UTC");
        assert!(!s.suspend && s.starting_deadline_seconds.is_none());
    }
}
