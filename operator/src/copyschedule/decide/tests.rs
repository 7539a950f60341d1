//! The schedule controller's decisions on a fake clock: when a run is due and for which
//! time, what it creates, skips, replaces and prunes, and what the status and events say.

use super::*;
use ferry_crds::CopyJobStatus;

fn at(s: &str) -> Timestamp {
    s.parse().expect("an RFC 3339 time")
}

const UID: &str = "0f0e0d0c-uid-of-the-schedule";

/// A schedule `name` in `team`, created at `created`, with `extra` merged into its spec.
fn schedule(name: &str, expression: &str, created: &str, extra: serde_json::Value) -> CopySchedule {
    let mut spec = serde_json::json!({
        "schedule": expression,
        "jobTemplate": {
            "metadata": {"labels": {"app": "replica"}, "annotations": {"note": "nightly"}},
            "spec": {"source": {"root": "data", "path": "src"}, "destination": {"root": "data", "path": "dst"}},
        },
    });
    if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra.as_object()) {
        for (k, v) in extra {
            spec.insert(k.clone(), v.clone());
        }
    }
    serde_json::from_value(serde_json::json!({
        "apiVersion": "ferry.dev/v1alpha1",
        "kind": "CopySchedule",
        "metadata": {"name": name, "namespace": "team", "uid": UID, "generation": 1, "creationTimestamp": created},
        "spec": spec,
    }))
    .expect("a CopySchedule")
}

fn with_status(mut s: CopySchedule, last_schedule: Option<&str>) -> CopySchedule {
    s.status = Some(CopyScheduleStatus {
        last_schedule_time: last_schedule.map(|t| Time(at(t))),
        ..Default::default()
    });
    s
}

/// The CopyJob `schedule` created for `time`, in `phase`, finished at `finished`.
fn job(
    schedule: &CopySchedule,
    time: &str,
    phase: Option<Phase>,
    finished: Option<&str>,
) -> CopyJob {
    let mut j = job_for(schedule, at(time));
    j.metadata.creation_timestamp = Some(Time(at(time)));
    j.status = Some(CopyJobStatus {
        phase,
        finished_at: finished.map(|t| Time(at(t))),
        ..Default::default()
    });
    j
}

fn decide_at(schedule: &CopySchedule, jobs: &[CopyJob], now: &str) -> Decision {
    let jobs: Vec<&CopyJob> = jobs.iter().collect();
    decide(&Inputs {
        schedule,
        jobs: &jobs,
        now: at(now),
    })
}

fn reasons(d: &Decision) -> Vec<String> {
    d.events.iter().map(|e| e.reason.clone()).collect()
}

/// The decision's status as the next reconcile reads it, once its run was created.
fn after(mut s: CopySchedule, mut d: Decision) -> CopySchedule {
    d.ran(true);
    s.status = Some(d.status);
    s
}

#[test]
fn every_minute_runs_once_per_minute_from_the_first_minute_after_creation() {
    let s = schedule(
        "every",
        "* * * * *",
        "2026-05-04T10:00:30Z",
        serde_json::json!({}),
    );
    // Before the first minute after creation: nothing, and a look at the next minute.
    let d = decide_at(&s, &[], "2026-05-04T10:00:50Z");
    assert!(d.run.is_none());
    assert_eq!(d.requeue, Some(Duration::from_secs(10)));
    // Then the 10:01 run, named after the schedule and its minute.
    let mut d = decide_at(&s, &[], "2026-05-04T10:01:02Z");
    let run = d.run.clone().expect("the 10:01 run");
    assert_eq!(run.time, at("2026-05-04T10:01:00Z"));
    let minutes = at("2026-05-04T10:01:00Z").as_second() / 60;
    assert_eq!(run.job.name_any(), format!("every-{minutes}"));
    assert_eq!(run.job.namespace().as_deref(), Some("team"));
    assert_eq!(run.job.labels()["app"], "replica");
    assert_eq!(run.job.labels()[SCHEDULE_LABEL], "every");
    assert_eq!(run.job.annotations()["note"], "nightly");
    assert_eq!(
        run.job.annotations()[SCHEDULED_TIME_ANNOTATION],
        "2026-05-04T10:01:00Z"
    );
    let owner = &run.job.owner_references()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()),
        ("CopySchedule", "every", UID)
    );
    assert_eq!(
        (owner.controller, owner.block_owner_deletion),
        (Some(true), Some(true))
    );
    assert_eq!(run.job.spec, s.spec.job_template.spec);
    assert_eq!(d.requeue, Some(Duration::from_secs(58)));
    d.ran(true);
    assert_eq!(reasons(&d), ["Created"]);
    assert_eq!(
        d.status.last_schedule_time,
        Some(Time(at("2026-05-04T10:01:00Z")))
    );
    assert_eq!(d.status.active, [run.job.name_any()]);
    assert_eq!(d.status.active_count, 1);
    let accepted = &d.status.conditions[0];
    assert_eq!(
        (accepted.status.as_str(), accepted.reason.as_str()),
        ("True", "Valid")
    );
    // The same minute again (a watch event, a restart): no second run.
    let s = after(s, d);
    let jobs = [job(
        &s,
        "2026-05-04T10:01:00Z",
        Some(Phase::Succeeded),
        Some("2026-05-04T10:01:04Z"),
    )];
    let d = decide_at(&s, &jobs, "2026-05-04T10:01:30Z");
    assert!(d.run.is_none() && d.events.is_empty());
    assert_eq!(
        d.status.last_successful_time,
        Some(Time(at("2026-05-04T10:01:04Z")))
    );
    assert!(d.status.active.is_empty());
    // The next minute: the next run.
    let d = decide_at(&s, &jobs, "2026-05-04T10:02:00Z");
    assert_eq!(d.run.map(|r| r.time), Some(at("2026-05-04T10:02:00Z")));
}

#[test]
fn hourly_runs_on_the_hour_and_waits_at_most_five_minutes_between_looks() {
    let s = with_status(
        schedule(
            "hourly",
            "@hourly",
            "2026-05-04T08:10:00Z",
            serde_json::json!({}),
        ),
        Some("2026-05-04T09:00:00Z"),
    );
    let d = decide_at(&s, &[], "2026-05-04T09:20:00Z");
    assert!(d.run.is_none());
    assert_eq!(
        d.requeue,
        Some(MAX_WAIT),
        "40 minutes away: look again in 5"
    );
    let d = decide_at(&s, &[], "2026-05-04T09:58:00Z");
    assert_eq!(d.requeue, Some(Duration::from_secs(120)));
    let d = decide_at(&s, &[], "2026-05-04T10:00:01Z");
    assert_eq!(d.run.map(|r| r.time), Some(at("2026-05-04T10:00:00Z")));
}

#[test]
fn runs_missed_while_the_operator_was_down_run_once_for_the_most_recent_time() {
    // Every 10 minutes; the last run was 06:00 and the operator comes back at 10:23:
    // 25 runs were missed. One runs, for 10:20.
    let s = with_status(
        schedule(
            "tenmin",
            "*/10 * * * *",
            "2026-05-01T00:00:00Z",
            serde_json::json!({}),
        ),
        Some("2026-05-04T06:00:00Z"),
    );
    let mut d = decide_at(&s, &[], "2026-05-04T10:23:00Z");
    assert_eq!(
        d.run.as_ref().map(|r| r.time),
        Some(at("2026-05-04T10:20:00Z"))
    );
    assert_eq!(d.requeue, Some(Duration::from_secs(7 * 60).min(MAX_WAIT)));
    d.ran(true);
    let s = after(s, d);
    let jobs = [job(&s, "2026-05-04T10:20:00Z", Some(Phase::Running), None)];
    // Looking again before 10:30 runs nothing more.
    let d = decide_at(&s, &jobs, "2026-05-04T10:29:59Z");
    assert!(d.run.is_none() && d.events.is_empty());
}

#[test]
fn a_run_later_than_the_starting_deadline_is_skipped_once_and_said_so() {
    let spec = serde_json::json!({"startingDeadlineSeconds": 600});
    let s = with_status(
        schedule("hourly", "0 * * * *", "2026-05-01T00:00:00Z", spec),
        Some("2026-05-04T06:00:00Z"),
    );
    // 10:00 is 23 minutes old at 10:23: more than 600 s.
    let d = decide_at(&s, &[], "2026-05-04T10:23:00Z");
    assert!(d.run.is_none());
    assert_eq!(reasons(&d), ["Skipped"]);
    let note = d.events[0].note.clone().unwrap_or_default();
    assert!(
        note.contains("1380 s late, more than startingDeadlineSeconds (600)")
            && note.contains("next run is at 2026-05-04T11:00:00Z"),
        "{note}"
    );
    assert!(matches!(d.events[0].type_, EventType::Warning));
    assert_eq!(
        d.status.last_skipped_time,
        Some(Time(at("2026-05-04T10:00:00Z")))
    );
    assert_eq!(
        d.status.last_schedule_time,
        Some(Time(at("2026-05-04T06:00:00Z")))
    );
    // Said once: the next look (status written) says nothing more and runs nothing.
    let mut s2 = s.clone();
    s2.status = Some(d.status);
    let d = decide_at(&s2, &[], "2026-05-04T10:27:00Z");
    assert!(d.run.is_none() && d.events.is_empty());
    // Within the deadline, the same missed run starts.
    let d = decide_at(&s, &[], "2026-05-04T10:09:00Z");
    assert_eq!(d.run.map(|r| r.time), Some(at("2026-05-04T10:00:00Z")));
}

#[test]
fn forbid_skips_while_a_run_is_unfinished_then_runs_the_skipped_time_when_it_finishes() {
    let s = with_status(
        schedule(
            "sync",
            "*/5 * * * *",
            "2026-05-01T00:00:00Z",
            serde_json::json!({}),
        ),
        Some("2026-05-04T10:00:00Z"),
    );
    let running = [job(&s, "2026-05-04T10:00:00Z", Some(Phase::Running), None)];
    let d = decide_at(&s, &running, "2026-05-04T10:05:01Z");
    assert!(d.run.is_none() && d.replace.is_empty());
    assert_eq!(reasons(&d), ["Skipped"]);
    let note = d.events[0].note.clone().unwrap_or_default();
    let first = running[0].name_any();
    assert!(
        note.contains(&format!(
            "CopyJob {first} has not finished and concurrencyPolicy is Forbid"
        )),
        "{note}"
    );
    assert_eq!(d.status.active, [first]);
    assert_eq!(
        d.status.last_skipped_time,
        Some(Time(at("2026-05-04T10:05:00Z")))
    );
    // Its progress wakes the schedule every second: no second event.
    let mut s = s;
    s.status = Some(d.status);
    let d = decide_at(&s, &running, "2026-05-04T10:05:02Z");
    assert!(d.events.is_empty() && d.run.is_none());
    // It finishes at 10:07: the 10:05 run starts then, as a CronJob's would.
    let done = [job(
        &s,
        "2026-05-04T10:00:00Z",
        Some(Phase::Succeeded),
        Some("2026-05-04T10:07:00Z"),
    )];
    let d = decide_at(&s, &done, "2026-05-04T10:07:01Z");
    assert_eq!(d.run.map(|r| r.time), Some(at("2026-05-04T10:05:00Z")));
    assert_eq!(
        d.status.last_successful_time,
        Some(Time(at("2026-05-04T10:07:00Z")))
    );
}

#[test]
fn replace_deletes_the_unfinished_runs_then_creates_the_new_one() {
    let s = with_status(
        schedule(
            "sync",
            "*/5 * * * *",
            "2026-05-01T00:00:00Z",
            serde_json::json!({"concurrencyPolicy": "Replace"}),
        ),
        Some("2026-05-04T10:00:00Z"),
    );
    let mut deleting = job(&s, "2026-05-04T09:55:00Z", Some(Phase::Running), None);
    deleting.metadata.deletion_timestamp = Some(Time(at("2026-05-04T10:00:00Z")));
    let jobs = [
        deleting,
        job(&s, "2026-05-04T10:00:00Z", Some(Phase::Running), None),
    ];
    let d = decide_at(&s, &jobs, "2026-05-04T10:05:00Z");
    // The one already being deleted is not deleted again.
    let replaced: Vec<&str> = d.replace.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(replaced, [jobs[1].name_any()]);
    assert_eq!(d.replace[0].event.reason, "Replaced");
    assert_eq!(d.run.map(|r| r.time), Some(at("2026-05-04T10:05:00Z")));
}

#[test]
fn finished_runs_beyond_the_history_limits_are_deleted_oldest_first() {
    let s = with_status(
        schedule(
            "sync",
            "0 * * * *",
            "2026-05-01T00:00:00Z",
            serde_json::json!({"successfulJobsHistoryLimit": 2}),
        ),
        Some("2026-05-04T09:00:00Z"),
    );
    let ok = |h: u8| {
        job(
            &s,
            &format!("2026-05-04T0{h}:00:00Z"),
            Some(Phase::Succeeded),
            Some(&format!("2026-05-04T0{h}:10:00Z")),
        )
    };
    let failed = |h: u8| {
        job(
            &s,
            &format!("2026-05-04T0{h}:00:00Z"),
            Some(Phase::Failed),
            Some(&format!("2026-05-04T0{h}:01:00Z")),
        )
    };
    // Listed out of order: the order is the scheduled time's.
    let jobs = [ok(5), failed(2), ok(1), failed(8), ok(9), failed(4), ok(3)];
    let d = decide_at(&s, &jobs, "2026-05-04T09:30:00Z");
    let pruned: Vec<String> = d.prune.iter().map(|p| p.name.clone()).collect();
    assert_eq!(
        pruned,
        [
            ok(1).name_any(),
            ok(3).name_any(),
            failed(2).name_any(),
            failed(4).name_any()
        ]
    );
    assert!(d.prune.iter().all(|p| p.event.reason == "Deleted"));
    // The newest success's finish, whatever order they came in.
    assert_eq!(
        d.status.last_successful_time,
        Some(Time(at("2026-05-04T09:10:00Z")))
    );
    // Limits of 0 keep nothing finished; a running job is never history.
    let s0 = with_status(
        schedule(
            "sync",
            "0 * * * *",
            "2026-05-01T00:00:00Z",
            serde_json::json!({"successfulJobsHistoryLimit": 0, "failedJobsHistoryLimit": 0}),
        ),
        Some("2026-05-04T09:00:00Z"),
    );
    let jobs = [
        ok(1),
        failed(2),
        job(&s0, "2026-05-04T09:00:00Z", Some(Phase::Running), None),
    ];
    let d = decide_at(&s0, &jobs, "2026-05-04T09:30:00Z");
    assert_eq!(d.prune.len(), 2);
    assert_eq!(d.status.active_count, 1);
}

#[test]
fn refused_schedules_zones_and_templates_say_which_field_and_create_nothing() {
    for (extra, says) in [
        (serde_json::json!({"schedule": "61 * * * *"}), "spec.schedule \"61 * * * *\" is not a cron expression"),
        (serde_json::json!({"timeZone": "Europe/Atlantis"}), "spec.timeZone \"Europe/Atlantis\" is not a time zone"),
        (
            serde_json::json!({"jobTemplate": {"spec": {"source": {"root": "r", "path": "../etc"}, "destination": {"root": "r", "path": "b"}}}}),
            "spec.jobTemplate.spec.source.path \"../etc\" has a '..' component",
        ),
        (
            serde_json::json!({"jobTemplate": {"spec": {"source": {"root": "r", "path": "a"}, "destination": {"root": "r", "path": "b"}, "deleteExcluded": true}}}),
            "spec.jobTemplate.spec.deleteExcluded removes excluded entries as part of a mirror: set spec.jobTemplate.spec.deleteExtraneous: true",
        ),
        (serde_json::json!({"failedJobsHistoryLimit": 101}), "spec.failedJobsHistoryLimit must be between 0 and 100"),
    ] {
        let s = schedule("bad", "* * * * *", "2026-05-04T10:00:00Z", extra.clone());
        let d = decide_at(&s, &[], "2026-05-04T10:05:00Z");
        assert!(d.run.is_none() && d.requeue.is_none(), "{extra}");
        let c = &d.status.conditions[0];
        assert_eq!(
            (c.type_.as_str(), c.status.as_str(), c.reason.as_str()),
            ("Accepted", "False", "InvalidSpec")
        );
        assert!(c.message.contains(says), "{}", c.message);
        assert_eq!(reasons(&d), ["InvalidSpec"]);
        // Said once.
        let mut s = s;
        s.status = Some(d.status);
        assert!(decide_at(&s, &[], "2026-05-04T10:06:00Z").events.is_empty());
    }
}

#[test]
fn a_suspended_or_deleted_schedule_starts_nothing_but_keeps_its_history() {
    let s = with_status(
        schedule(
            "sync",
            "* * * * *",
            "2026-05-01T00:00:00Z",
            serde_json::json!({"suspend": true, "successfulJobsHistoryLimit": 0}),
        ),
        Some("2026-05-04T09:00:00Z"),
    );
    let jobs = [job(
        &s,
        "2026-05-04T09:00:00Z",
        Some(Phase::Succeeded),
        Some("2026-05-04T09:00:09Z"),
    )];
    let d = decide_at(&s, &jobs, "2026-05-04T10:00:00Z");
    assert!(d.run.is_none() && d.requeue.is_none());
    assert_eq!(d.prune.len(), 1);
    assert_eq!(
        d.status.last_successful_time,
        Some(Time(at("2026-05-04T09:00:09Z")))
    );
    let mut gone = schedule(
        "sync",
        "* * * * *",
        "2026-05-01T00:00:00Z",
        serde_json::json!({}),
    );
    gone.metadata.deletion_timestamp = Some(Time(at("2026-05-04T09:59:00Z")));
    assert!(decide_at(&gone, &[], "2026-05-04T10:00:00Z").run.is_none());
}

#[test]
fn only_its_own_jobs_in_its_namespace_count_and_a_stale_status_runs_nothing_twice() {
    let s = with_status(
        schedule(
            "sync",
            "*/5 * * * *",
            "2026-05-01T00:00:00Z",
            serde_json::json!({"successfulJobsHistoryLimit": 0}),
        ),
        Some("2026-05-04T10:00:00Z"),
    );
    // Another namespace's job naming this schedule's uid, and one of another schedule with
    // this schedule's label: neither blocks a run nor is ever deleted.
    let mut elsewhere = job(&s, "2026-05-04T10:00:00Z", Some(Phase::Running), None);
    elsewhere.metadata.namespace = Some("other".into());
    let mut foreign = job(
        &s,
        "2026-05-04T09:00:00Z",
        Some(Phase::Succeeded),
        Some("2026-05-04T09:01:00Z"),
    );
    if let Some(o) = foreign.metadata.owner_references.as_mut() {
        o[0].uid = "another-uid".into();
    }
    let d = decide_at(&s, &[elsewhere, foreign], "2026-05-04T10:05:00Z");
    assert!(d.prune.is_empty() && d.status.active.is_empty());
    assert_eq!(d.run.map(|r| r.time), Some(at("2026-05-04T10:05:00Z")));
    // The job of 10:05 exists but the status read still says 10:00 (the reconcile that
    // created it had not written yet): it is not created again.
    let created = [job(&s, "2026-05-04T10:05:00Z", Some(Phase::Running), None)];
    let d = decide_at(&s, &created, "2026-05-04T10:05:01Z");
    assert!(d.run.is_none());
    assert_eq!(
        d.status.last_schedule_time,
        Some(Time(at("2026-05-04T10:05:00Z")))
    );
}

#[test]
fn a_name_taken_by_another_object_skips_the_run_once() {
    let s = schedule(
        "sync",
        "* * * * *",
        "2026-05-04T10:00:30Z",
        serde_json::json!({}),
    );
    let mut d = decide_at(&s, &[], "2026-05-04T10:01:00Z");
    d.name_taken("it has no controller");
    assert!(d.run.is_none());
    assert_eq!(reasons(&d), ["Skipped"]);
    assert_eq!(
        d.status.last_skipped_time,
        Some(Time(at("2026-05-04T10:01:00Z")))
    );
    assert_eq!(d.status.last_schedule_time, None);
}

#[test]
fn spring_forward_runs_the_skipped_wall_time_once_after_the_gap() {
    // 02:30 Europe/Berlin does not exist on 2026-03-29: the run is at 03:00 CEST.
    let s = with_status(
        schedule(
            "nightly",
            "30 2 * * *",
            "2026-03-01T00:00:00Z",
            serde_json::json!({"timeZone": "Europe/Berlin"}),
        ),
        Some("2026-03-28T01:30:00Z"),
    );
    let d = decide_at(&s, &[], "2026-03-29T00:59:00Z");
    assert!(d.run.is_none());
    assert_eq!(d.requeue, Some(Duration::from_secs(60)));
    let d = decide_at(&s, &[], "2026-03-29T01:00:05Z");
    assert_eq!(d.run.map(|r| r.time), Some(at("2026-03-29T01:00:00Z")));
}

#[test]
fn long_schedule_names_give_job_names_and_labels_of_at_most_63_characters_of_their_own() {
    let minute = at("2026-05-04T10:01:00Z");
    assert_eq!(job_prefix("sync"), "sync");
    let a = format!("{}-a", "x".repeat(70));
    let b = format!("{}-b", "x".repeat(70));
    let dotted = format!("{}.{}", "y".repeat(43), "z".repeat(30));
    for name in [&a, &b, &dotted] {
        let job = job_name(name, minute);
        assert!(job.len() <= 63, "{job}: {} characters", job.len());
        let prefix = job_prefix(name);
        assert!(job.starts_with(&prefix), "{job}");
        // A DNS subdomain: each dot-separated part starts and ends with a letter or digit.
        for part in job.split('.') {
            assert!(
                part.starts_with(|c: char| c.is_ascii_alphanumeric())
                    && part.ends_with(|c: char| c.is_ascii_alphanumeric()),
                "{job}"
            );
        }
    }
    assert_ne!(job_name(&a, minute), job_name(&b, minute));
    assert_eq!(job_name(&a, minute), job_name(&a, minute));
}

#[test]
fn template_messages_name_template_fields_but_keep_quoted_patterns() {
    assert_eq!(
        in_template("spec.exclude: pattern \"spec.x\" is not a valid glob"),
        "spec.jobTemplate.spec.exclude: pattern \"spec.x\" is not a valid glob"
    );
    assert_eq!(
        in_template("a: set spec.b"),
        "a: set spec.jobTemplate.spec.b"
    );
}
