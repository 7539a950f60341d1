//! A CopySchedule reconcile's decisions, as one pure function of the schedule, the CopyJobs
//! it created and the clock: the Accepted condition, whether a run is due and for which
//! scheduled time, the CopyJob it creates, which CopyJobs to delete (unfinished ones under
//! Replace, finished ones beyond the history limits), the status and the events that
//! explain it, and when to look again. The rules are Kubernetes' CronJob controller's
//! (`mostRecentScheduleTime`, `syncCronJob`): of the scheduled times after the last one
//! that ran (or after the schedule's creation) and at or before now, only the most recent
//! runs, once, unless it is older than startingDeadlineSeconds.

use std::time::Duration;

use ferry_crds::{
    ConcurrencyPolicy, ConditionType, CopyJob, CopySchedule, CopyScheduleStatus, Phase, Reason,
    ScheduleEvent, SCHEDULED_TIME_ANNOTATION, SCHEDULE_LABEL,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::ObjectMeta;
use kube::runtime::events::{Event as KubeEvent, EventType};
use kube::{Resource, ResourceExt};

use crate::cron::Schedule;
use crate::status::condition;
use crate::validate::{Memo, Refusal};

/// The longest wait between two looks at a schedule, whatever its next time: an edit is
/// seen at once (it is watched), but a clock that jumps is not.
pub const MAX_WAIT: Duration = Duration::from_secs(300);

/// Longest CopyJob name the operator makes: a label value's limit, so a name also fits
/// wherever Kubernetes puts it in a label.
const NAME_MAX: usize = 63;
/// Room kept for `-<minutes since 1970>`: 9 digits last until the year 3871.
const SUFFIX_MAX: usize = 1 + 9;

/// What a decision is made from, read from the cluster beforehand.
#[derive(Debug)]
pub struct Inputs<'a> {
    /// The schedule as the watch saw it; its status is the previous decision.
    pub schedule: &'a CopySchedule,
    /// The CopyJobs in its namespace labelled as a schedule's ([`owned_by`] picks its own).
    pub jobs: &'a [&'a CopyJob],
    /// The operator's clock.
    pub now: Timestamp,
}

/// A CopyJob to create for a scheduled time.
#[derive(Debug, Clone)]
pub struct Run {
    /// The scheduled time it runs for.
    pub time: Timestamp,
    /// The CopyJob, named after the schedule and `time`.
    pub job: CopyJob,
}

/// A CopyJob to delete, and the event that says why.
#[allow(missing_debug_implementations)] // KubeEvent is not Debug
pub struct Deletion {
    pub name: String,
    pub event: KubeEvent,
}

/// What the reconcile decided.
#[allow(missing_debug_implementations)] // KubeEvent is not Debug
pub struct Decision {
    /// The status, as it is without `run` (see [`Decision::ran`] and
    /// [`Decision::name_taken`]).
    pub status: CopyScheduleStatus,
    /// Delete these unfinished CopyJobs before creating `run` (Replace).
    pub replace: Vec<Deletion>,
    /// The CopyJob to create.
    pub run: Option<Run>,
    /// Delete these finished CopyJobs (beyond the history limits), oldest first.
    pub prune: Vec<Deletion>,
    /// Events to publish once the status is written.
    pub events: Vec<KubeEvent>,
    /// When to look again (`None`: when something changes).
    pub requeue: Option<Duration>,
}

impl Decision {
    /// `run`'s CopyJob now exists: `created` by this reconcile, or found, created by an
    /// earlier one (which said so).
    pub fn ran(&mut self, created: bool) {
        let Some(run) = self.run.take() else {
            return;
        };
        let name = run.job.name_any();
        self.status.last_schedule_time = Some(Time(run.time));
        if !self.status.active.contains(&name) {
            self.status.active.push(name.clone());
            self.status.active_count = self.status.active.len() as i32;
        }
        if created {
            self.events.push(event(
                EventType::Normal,
                ScheduleEvent::Created,
                format!("created CopyJob {name} for the run of {}", run.time),
            ));
        }
    }

    /// Another object has `run`'s name (`owner`: what it names as its controller): nothing
    /// was created, and the run is skipped.
    pub fn name_taken(&mut self, owner: &str) {
        let Some(run) = self.run.take() else {
            return;
        };
        if self.status.last_skipped_time.as_ref().map(|t| t.0) != Some(run.time) {
            self.status.last_skipped_time = Some(Time(run.time));
            self.events.push(event(
                EventType::Warning,
                ScheduleEvent::Skipped,
                format!(
                    "the run of {} was not started: a CopyJob named {} already exists and was not created by this schedule ({owner}); rename or delete it",
                    run.time,
                    run.job.name_any()
                ),
            ));
        }
    }
}

fn event(type_: EventType, reason: ScheduleEvent, note: String) -> KubeEvent {
    KubeEvent {
        type_,
        reason: reason.to_string(),
        // Events carry at most 1 KiB of note.
        note: Some(ferry_crds::shorten(&note, 1024)),
        action: "Schedule".into(),
        secondary: None,
    }
}

/// Whether `job` is one of `schedule`'s: in its namespace, and naming it (by uid) as its
/// controller. Nothing else is ever deleted or counted, whatever its labels say.
pub fn owned_by(schedule: &CopySchedule, job: &CopyJob) -> bool {
    let uid = schedule.meta().uid.as_deref();
    uid.is_some()
        && job.namespace() == schedule.namespace()
        && job
            .owner_references()
            .iter()
            .any(|o| o.controller == Some(true) && Some(o.uid.as_str()) == uid)
}

/// The schedule's template spec and timing, checked; an `InvalidSpec` refusal names the
/// field and the fix. The template is checked by the CopyJob's own rules, with its fields
/// named where they are in a CopySchedule.
pub fn validate(schedule: &CopySchedule) -> Result<Schedule, Refusal> {
    // Compiled once a generation: a template's patterns and a cron expression that never
    // comes due each cost up to ~100 ms (see ferry_resolve::validate::Memo).
    static MEMO: Memo<Result<Schedule, Refusal>> = Memo::new();
    let meta = &schedule.metadata;
    MEMO.get(meta.uid.as_deref(), meta.generation, &schedule.spec, || {
        checked(schedule)
    })
}

fn checked(schedule: &CopySchedule) -> Result<Schedule, Refusal> {
    let spec = &schedule.spec;
    let timing = Schedule::new(&spec.schedule, &spec.time_zone)?;
    for (field, value) in [
        (
            "successfulJobsHistoryLimit",
            spec.successful_jobs_history_limit,
        ),
        ("failedJobsHistoryLimit", spec.failed_jobs_history_limit),
    ] {
        if !(0..=100).contains(&value) {
            return Err(Refusal {
                reason: Reason::InvalidSpec,
                message: format!("spec.{field} must be between 0 and 100"),
            });
        }
    }
    if spec.starting_deadline_seconds.is_some_and(|s| s < 0) {
        return Err(Refusal {
            reason: Reason::InvalidSpec,
            message: "spec.startingDeadlineSeconds cannot be negative".into(),
        });
    }
    crate::validate::validate(&spec.job_template.spec).map_err(|r| Refusal {
        // A refusal of the template's spec is a refusal of this spec (a PathEscape in a
        // template is as invalid as any other field).
        reason: Reason::InvalidSpec,
        message: in_template(&r.message),
    })?;
    Ok(timing)
}

/// A CopyJob refusal's message with its fields named as in a CopySchedule: `spec.x` is
/// `spec.jobTemplate.spec.x` here. Only a `spec.` that starts the message or follows a
/// space is a field: a quoted pattern keeps its text.
fn in_template(message: &str) -> String {
    let mut out = String::with_capacity(message.len() + 32);
    let mut rest = message;
    let mut at_word = true;
    while !rest.is_empty() {
        if at_word && rest.starts_with("spec.") {
            out.push_str("spec.jobTemplate.spec.");
            rest = &rest["spec.".len()..];
            at_word = false;
            continue;
        }
        let Some(c) = rest.chars().next() else {
            break;
        };
        out.push(c);
        at_word = c == ' ';
        rest = &rest[c.len_utf8()..];
    }
    out
}

/// The part of a CopyJob name before `-<minutes>`, and the value of [`SCHEDULE_LABEL`]: the
/// schedule's name when it leaves room for the suffix, else its head and a hash of all of
/// it, so two long names that share a head still get their own jobs.
pub fn job_prefix(schedule: &str) -> String {
    let room = NAME_MAX - SUFFIX_MAX;
    if schedule.len() <= room {
        return schedule.to_string();
    }
    // FNV-1a: stable across releases and platforms (the names must not change).
    let hash = schedule.bytes().fold(0x811c_9dc5_u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    });
    // Names are ASCII; a cut inside a character could not be a name anyway.
    let mut cut = room - 9;
    while !schedule.is_char_boundary(cut) {
        cut -= 1;
    }
    let mut head = &schedule[..cut];
    // A name is lowercase letters, digits, '-' and '.', and each dot-separated part must
    // end in a letter or digit.
    while head.ends_with(['-', '.']) {
        head = &head[..head.len() - 1];
    }
    format!("{head}-{hash:08x}")
}

/// The CopyJob name of `schedule`'s run at `time`: the same whoever computes it, so a run
/// created twice (a restart, a new leader, a stale cache) is refused by the API server as
/// AlreadyExists rather than run twice.
pub fn job_name(schedule: &str, time: Timestamp) -> String {
    format!(
        "{}-{}",
        job_prefix(schedule),
        time.as_second().div_euclid(60)
    )
}

/// The CopyJob of `schedule`'s run at `time`: its template's spec, labels and annotations,
/// the schedule's label and the scheduled time, and the schedule as its controller (so
/// deleting the schedule deletes its jobs, and their changes wake the schedule).
fn job_for(schedule: &CopySchedule, time: Timestamp) -> CopyJob {
    let template = &schedule.spec.job_template;
    let meta = template.metadata.clone().unwrap_or_default();
    let mut labels = meta.labels;
    labels.insert(SCHEDULE_LABEL.into(), job_prefix(&schedule.name_any()));
    let mut annotations = meta.annotations;
    annotations.insert(SCHEDULED_TIME_ANNOTATION.into(), time.to_string());
    let owner = OwnerReference {
        api_version: CopySchedule::api_version(&()).into_owned(),
        kind: CopySchedule::kind(&()).into_owned(),
        name: schedule.name_any(),
        uid: schedule.meta().uid.clone().unwrap_or_default(),
        controller: Some(true),
        // The garbage collector's foreground deletion of the schedule waits for it.
        block_owner_deletion: Some(true),
    };
    CopyJob {
        metadata: ObjectMeta {
            name: Some(job_name(&schedule.name_any(), time)),
            namespace: schedule.namespace(),
            labels: Some(labels),
            annotations: Some(annotations),
            owner_references: Some(vec![owner]),
            ..Default::default()
        },
        spec: template.spec.clone(),
        status: None,
    }
}

/// The scheduled time a job ran for: its annotation, else when it was created.
fn scheduled_time(job: &CopyJob) -> Option<Timestamp> {
    job.annotations()
        .get(SCHEDULED_TIME_ANNOTATION)
        .and_then(|t| t.parse().ok())
        .or_else(|| job.meta().creation_timestamp.as_ref().map(|t| t.0))
}

fn phase(job: &CopyJob) -> Option<Phase> {
    job.status.as_ref().and_then(|s| s.phase)
}

/// Decide a reconcile of `input.schedule`.
pub fn decide(input: &Inputs) -> Decision {
    let schedule = input.schedule;
    let spec = &schedule.spec;
    let unset = CopyScheduleStatus::default();
    let old = schedule.status.as_ref().unwrap_or(&unset);
    let now = input.now;
    let mut events = Vec::new();

    // Its own jobs, oldest scheduled time first.
    let mut jobs: Vec<(Timestamp, &CopyJob)> = input
        .jobs
        .iter()
        .copied()
        .filter(|j| owned_by(schedule, j))
        .map(|j| (scheduled_time(j).unwrap_or(now), j))
        .collect();
    jobs.sort_by(|a, b| {
        a.0.cmp(&b.0)
            .then_with(|| a.1.name_any().cmp(&b.1.name_any()))
    });
    let finished = |j: &CopyJob| matches!(phase(j), Some(Phase::Succeeded | Phase::Failed));
    // A job being deleted is still running until its agents stop: it stays active.
    let active: Vec<&CopyJob> = jobs
        .iter()
        .map(|(_, j)| *j)
        .filter(|j| !finished(j))
        .collect();
    let newest_success = jobs
        .iter()
        .filter(|(_, j)| phase(j) == Some(Phase::Succeeded))
        .filter_map(|(_, j)| j.status.as_ref().and_then(|s| s.finished_at.as_ref()))
        .map(|t| t.0)
        .max();
    // The status may lag the jobs (a reconcile that created one and failed to write, or
    // a stale cache): a job of a later run means that run happened. (Not one that claims
    // a time to come, which would hold the schedule until then.)
    let last_run = old
        .last_schedule_time
        .as_ref()
        .map(|t| t.0)
        .into_iter()
        .chain(jobs.iter().map(|(t, _)| *t).filter(|t| *t <= now).max())
        .max();

    // History: the newest of each kind are kept; older ones go, oldest first.
    let mut prune = Vec::new();
    for (kind, limit) in [
        (Phase::Succeeded, spec.successful_jobs_history_limit),
        (Phase::Failed, spec.failed_jobs_history_limit),
    ] {
        let of_kind: Vec<&CopyJob> = jobs
            .iter()
            .map(|(_, j)| *j)
            .filter(|j| phase(j) == Some(kind))
            .collect();
        let keep = usize::try_from(limit.clamp(0, 100)).unwrap_or(0);
        for j in of_kind.iter().take(of_kind.len().saturating_sub(keep)) {
            if j.meta().deletion_timestamp.is_some() {
                continue;
            }
            prune.push(Deletion {
                name: j.name_any(),
                event: event(
                    EventType::Normal,
                    ScheduleEvent::Deleted,
                    format!(
                        "deleted {kind:?} CopyJob {} (beyond {}JobsHistoryLimit {limit}; its copied data stays)",
                        j.name_any(),
                        if kind == Phase::Succeeded { "successful" } else { "failed" }
                    ),
                ),
            });
        }
    }

    let mut status = CopyScheduleStatus {
        last_schedule_time: last_run.map(Time),
        last_successful_time: old
            .last_successful_time
            .as_ref()
            .map(|t| t.0)
            .into_iter()
            .chain(newest_success)
            .max()
            .map(Time),
        last_skipped_time: old.last_skipped_time.clone(),
        active: active.iter().map(|j| j.name_any()).collect(),
        active_count: active.len() as i32,
        conditions: Vec::new(),
    };

    let generation = schedule.meta().generation;
    let timing = match validate(schedule) {
        Ok(timing) => {
            status.conditions = vec![condition(
                ConditionType::Accepted,
                true,
                Reason::Valid,
                "the schedule, the time zone and the job template are valid",
                generation,
                &old.conditions,
            )];
            Some(timing)
        }
        Err(refusal) => {
            let new = !old
                .conditions
                .iter()
                .any(|c| c.status == "False" && c.message == refusal.message);
            status.conditions = vec![condition(
                ConditionType::Accepted,
                false,
                refusal.reason,
                &refusal.message,
                generation,
                &old.conditions,
            )];
            if new {
                events.push(KubeEvent {
                    type_: EventType::Warning,
                    reason: refusal.reason.to_string(),
                    note: Some(ferry_crds::shorten(&refusal.message, 1024)),
                    action: "Validate".into(),
                    secondary: None,
                });
            }
            None
        }
    };

    let mut decision = Decision {
        status,
        replace: Vec::new(),
        run: None,
        prune,
        events,
        requeue: None,
    };
    // No run while refused or suspended, or while the schedule is being deleted (the
    // garbage collector is deleting its jobs).
    let Some(timing) = timing else {
        return decision;
    };
    if spec.suspend || schedule.meta().deletion_timestamp.is_some() {
        return decision;
    }
    decision.requeue = Some(
        timing
            .next_after(now)
            .and_then(|next| Duration::try_from(next.duration_since(now)).ok())
            .map_or(MAX_WAIT, |wait| wait.min(MAX_WAIT)),
    );
    let earliest = last_run.or_else(|| schedule.meta().creation_timestamp.as_ref().map(|t| t.0));
    let Some(due) = timing
        .most_recent(now)
        .filter(|t| earliest.is_some_and(|e| *t > e))
    else {
        return decision;
    };
    let noted = old.last_skipped_time.as_ref().map(|t| t.0) == Some(due);
    let skip = |decision: &mut Decision, type_: EventType, why: String| {
        decision.status.last_skipped_time = Some(Time(due));
        if !noted {
            decision.events.push(event(
                type_,
                ScheduleEvent::Skipped,
                format!("the run of {due} was not started: {why}"),
            ));
        }
    };
    if let Some(deadline) = spec.starting_deadline_seconds {
        let late = now.as_second() - due.as_second();
        if late > deadline {
            skip(
                &mut decision,
                EventType::Warning,
                format!(
                    "it is {late} s late, more than startingDeadlineSeconds ({deadline}); the next run is at {}",
                    timing
                        .next_after(now)
                        .map_or_else(|| "never".to_string(), |t| t.to_string())
                ),
            );
            return decision;
        }
    }
    if !active.is_empty() {
        let names: Vec<String> = active.iter().map(|j| j.name_any()).collect();
        match spec.concurrency_policy {
            ConcurrencyPolicy::Forbid => {
                skip(
                    &mut decision,
                    EventType::Normal,
                    format!(
                        "CopyJob {} has not finished and concurrencyPolicy is Forbid; this run starts when it finishes{}",
                        names.join(", "),
                        spec.starting_deadline_seconds.map_or_else(String::new, |d| format!(
                            " if that is within startingDeadlineSeconds ({d} s)"
                        ))
                    ),
                );
                return decision;
            }
            ConcurrencyPolicy::Replace => {
                for j in active
                    .iter()
                    .filter(|j| j.meta().deletion_timestamp.is_none())
                {
                    decision.replace.push(Deletion {
                        name: j.name_any(),
                        event: event(
                            EventType::Normal,
                            ScheduleEvent::Replaced,
                            format!(
                                "deleted unfinished CopyJob {} for the run of {due} (concurrencyPolicy Replace; what it copied stays)",
                                j.name_any()
                            ),
                        ),
                    });
                }
            }
        }
    }
    decision.run = Some(Run {
        time: due,
        job: job_for(schedule, due),
    });
    decision
}

/// Whether `status` differs from what the schedule has: write it only then, so a
/// reconcile that changes nothing (most of them: every progress update of a job wakes its
/// schedule) costs no API call.
pub fn changed(schedule: &CopySchedule, status: &CopyScheduleStatus) -> bool {
    schedule.status.as_ref() != Some(status)
}

#[cfg(test)]
mod tests;
