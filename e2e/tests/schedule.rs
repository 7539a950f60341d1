//! CopySchedules through the real kube-apiserver, the operator and agents as processes,
//! on the wall clock (every minute), in about two minutes: a schedule's runs are CopyJobs
//! named after it and their minute, owned by it, that copy and succeed; its status and
//! `kubectl get cps` say when it last ran and succeeded; finished runs beyond its history
//! limit are deleted; a run that comes while an earlier one is unfinished is skipped under
//! Forbid and replaces it under Replace; a bad schedule, time zone or template is refused
//! (Accepted=False, InvalidSpec, naming the field) and creates nothing; the operator's
//! schedule gauges follow it and go with it. What a clock cannot show in two minutes (a
//! missed run after downtime runs once, startingDeadlineSeconds, a daylight-saving day) is
//! tested on a fake clock in operator/src/copyschedule/decide/tests.rs and cron.rs.

use std::process::Command;
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use ferry_e2e::{assert_same_contents, http_get, metric, wait_for, ControlPlane};

const NS: &str = "default";

fn schedule(name: &str, spec: &str) -> String {
    format!("apiVersion: ferry.dev/v1alpha1\nkind: CopySchedule\nmetadata:\n  name: {name}\n  namespace: {NS}\nspec:\n{spec}")
}

/// A template copying `src` of `root` to `dst`.
fn template(root: &str, dst: &str, extra: &str) -> String {
    format!("  jobTemplate:\n    metadata:\n      labels: {{app: replica}}\n    spec:\n      source: {{root: {root}, path: src}}\n      destination: {{root: {root}, path: {dst}}}\n{extra}")
}

/// Unix seconds of an RFC 3339 time (GNU date: the test crate has no time library).
fn unix(rfc3339: &str) -> Result<i64> {
    let out = Command::new("date")
        .args(["-u", "-d", rfc3339, "+%s"])
        .output()?;
    ensure!(out.status.success(), "date -d {rfc3339}: {out:?}");
    Ok(String::from_utf8(out.stdout)?.trim().parse()?)
}

/// The names of the CopyJobs labelled as `schedule`'s, oldest first.
fn jobs_of(cp: &ControlPlane, schedule: &str) -> Result<Vec<String>> {
    let out = cp.kubectl_ok(&[
        "get",
        "copyjobs",
        "-n",
        NS,
        "-l",
        &format!("ferry.dev/copyschedule={schedule}"),
        "--sort-by=.metadata.name",
        "-o",
        "jsonpath={.items[*].metadata.name}",
    ])?;
    Ok(out.split_whitespace().map(str::to_string).collect())
}

/// A status time that has been set (the operator writes an unset one as null).
fn is_set(t: &str) -> bool {
    !t.is_empty() && t != "null"
}

fn condition(cp: &ControlPlane, name: &str, field: &str) -> Result<String> {
    cp.get(
        &format!("copyschedule/{name}"),
        NS,
        &format!("{{.status.conditions[?(@.type==\"Accepted\")].{field}}}"),
    )
}

#[test]
fn a_schedule_runs_each_minute_keeps_its_history_skips_or_replaces_an_unfinished_run_and_refuses_bad_specs(
) -> Result<()> {
    let Some(cp) = ControlPlane::start_or_skip()? else {
        return Ok(());
    };
    cp.install_crds()?;
    let (_ferry, hosts) = cp.start_ferry(&["node-a"])?;
    // node-b's agent waits 10 minutes before each file: a job there runs and never ends.
    cp.add_node("node-b")?;
    let _stuck = cp.spawn_agent("node-b", &[("FERRY_FAULT_FILE_DELAY_MS", "600000")])?;
    let tree = hosts.join("node-a/srv/data/src");
    for d in 0..3 {
        std::fs::create_dir_all(tree.join(format!("d{d}")))?;
        for f in 0..10 {
            std::fs::write(
                tree.join(format!("d{d}/f{f}")),
                format!("{d}/{f}").repeat(f + 1),
            )?;
        }
    }
    std::fs::create_dir_all(hosts.join("node-b/srv/slow/src"))?;
    std::fs::write(hosts.join("node-b/srv/slow/src/one"), b"never copied")?;
    for (name, node) in [("data", "node-a"), ("slow", "node-b")] {
        cp.apply(&format!("apiVersion: ferry.dev/v1alpha1\nkind: StorageRoot\nmetadata:\n  name: {name}\nspec:\n  path: /srv/{name}\n  nodeSelector: {{ferry.dev/node: {node}}}\n  namespaces: {{names: [{NS}]}}\n"))?;
    }

    // Admission refuses what CEL can see: not 5 fields, a zone inside the schedule.
    for (bad, says) in [
        ("'* * * *'", "schedule must have 5 fields"),
        ("'TZ=UTC 0 3 * * *'", "a time zone goes in spec.timeZone"),
    ] {
        let out = cp.kubectl_stdin(
            &["apply", "-f", "-"],
            &schedule(
                "refused",
                &format!("  schedule: {bad}\n{}", template("data", "x", "")),
            ),
        )?;
        let err = String::from_utf8_lossy(&out.stderr);
        ensure!(!out.status.success() && err.contains(says), "{bad}: {err}");
    }

    cp.apply(&schedule(
        "every",
        &format!(
            "  schedule: '* * * * *'\n  successfulJobsHistoryLimit: 1\n{}",
            template("data", "copy", "      overwrite: IfChanged\n")
        ),
    ))?;
    cp.apply(&schedule(
        "forbid",
        &format!("  schedule: '* * * * *'\n{}", template("slow", "copy", "")),
    ))?;
    // What only the operator can refuse, each naming its field.
    let refused = [
        (
            "bad-zone",
            format!(
                "  schedule: '0 3 * * *'\n  timeZone: Mars/Olympus_Mons\n{}",
                template("data", "x", "")
            ),
            "spec.timeZone \"Mars/Olympus_Mons\" is not a time zone of the IANA database",
        ),
        (
            "bad-cron",
            format!("  schedule: '61 * * * *'\n{}", template("data", "x", "")),
            "spec.schedule \"61 * * * *\" is not a cron expression",
        ),
        (
            "bad-template",
            format!(
                "  schedule: '* * * * *'\n{}",
                template("data", "x", "      deleteExcluded: true\n")
            ),
            "spec.jobTemplate.spec.deleteExcluded removes excluded entries as part of a mirror: set spec.jobTemplate.spec.deleteExtraneous: true",
        ),
    ];
    for (name, spec, _) in &refused {
        cp.apply(&schedule(name, spec))?;
    }
    for (name, _, says) in &refused {
        cp.wait_until(
            &format!("copyschedule/{name}"),
            NS,
            "{.status.conditions[?(@.type==\"Accepted\")].reason}",
            Duration::from_secs(60),
            |r| r == "InvalidSpec",
        )?;
        let message = condition(&cp, name, "message")?;
        ensure!(message.contains(says), "{name}: {message}");
        ensure!(condition(&cp, name, "status")? == "False", "{name}");
        wait_for(
            &format!("the InvalidSpec event of {name}"),
            Duration::from_secs(30),
            || {
                cp.event_reasons(NS, name)
                    .is_ok_and(|r| r.contains("InvalidSpec"))
            },
        )?;
    }

    // The first run of `every` (at the next minute) copies the tree and succeeds.
    let last_success = cp.wait_until(
        "copyschedule/every",
        NS,
        "{.status.lastSuccessfulTime}",
        Duration::from_secs(100),
        is_set,
    )?;
    let first = cp.get("copyschedule/every", NS, "{.status.lastScheduleTime}")?;
    let job = format!("every-{}", unix(&first)? / 60);
    ensure!(
        jobs_of(&cp, "every")? == [job.clone()],
        "the first run's job is {job}: {:?}",
        jobs_of(&cp, "every")?
    );
    let owner = cp.get(
        &format!("copyjob/{job}"),
        NS,
        "{.metadata.ownerReferences[0].kind}/{.metadata.ownerReferences[0].name} {.metadata.ownerReferences[0].controller} {.metadata.ownerReferences[0].blockOwnerDeletion} {.metadata.labels.app} {.metadata.annotations.ferry\\.dev/scheduled-time} {.status.phase}",
    )?;
    ensure!(
        owner == format!("CopySchedule/every true true replica {first} Succeeded"),
        "{job}: {owner}"
    );
    assert_same_contents(&tree, &hosts.join("node-a/srv/data/copy"))?;
    ensure!(
        unix(&last_success)? >= unix(&first)?,
        "succeeded at {last_success}, before its scheduled time {first}"
    );
    let ok = condition(&cp, "every", "reason")?;
    ensure!(ok == "Valid", "every: Accepted {ok}");
    // The printer columns.
    let table = cp.kubectl_ok(&["get", "cps", "every", "-n", NS])?;
    let mut lines = table.lines();
    let header: Vec<&str> = lines
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    ensure!(
        header
            == [
                "NAME", "SCHEDULE", "TIMEZONE", "SUSPEND", "ACTIVE", "LAST", "SCHEDULE", "LAST",
                "SUCCESS", "AGE"
            ],
        "{table}"
    );
    let row: Vec<&str> = lines
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    // ACTIVE is 0, or 1 if the next minute's run has just started.
    ensure!(
        row.len() == 12
            && row[..8] == ["every", "*", "*", "*", "*", "*", "UTC", "false"]
            && (row[8] == "0" || row[8] == "1"),
        "{table}"
    );
    // The operator's gauges.
    let port = cp.operator_port()?;
    let labels = [("copyschedule_namespace", NS), ("copyschedule", "every")];
    let text = http_get(port, "/metrics").context("the operator's /metrics")?;
    let interval = metric(&text, "ferry_operator_schedule_interval_seconds", &labels);
    ensure!(interval == Some(60.0), "interval {interval:?}");
    let success = metric(
        &text,
        "ferry_operator_schedule_last_success_timestamp_seconds",
        &labels,
    );
    ensure!(
        success == Some(unix(&last_success)? as f64),
        "last success {success:?}, status {last_success}"
    );
    for name in ["bad-zone", "bad-cron", "bad-template"] {
        let labels = [("copyschedule_namespace", NS), ("copyschedule", name)];
        ensure!(
            metric(&text, "ferry_operator_schedule_interval_seconds", &labels).is_none(),
            "{name} has an interval, so it could alert as late"
        );
    }

    // `forbid`'s first run is stuck on node-b; at the next minute its run is skipped.
    let skipped = cp.wait_until(
        "copyschedule/forbid",
        NS,
        "{.status.lastSkippedTime}",
        Duration::from_secs(90),
        is_set,
    )?;
    let stuck = jobs_of(&cp, "forbid")?;
    ensure!(stuck.len() == 1, "forbid has jobs {stuck:?}");
    let active = cp.get(
        "copyschedule/forbid",
        NS,
        "{.status.active} {.status.activeCount}",
    )?;
    ensure!(active == format!("[\"{}\"] 1", stuck[0]), "active {active}");
    ensure!(
        cp.event_reasons(NS, "forbid")?.contains("Skipped"),
        "events {}",
        cp.event_reasons(NS, "forbid")?
    );

    // By then `every` ran again: only the newest succeeded run is kept (limit 1).
    cp.wait_until(
        "copyschedule/every",
        NS,
        "{.status.lastScheduleTime}",
        Duration::from_secs(60),
        |t| t != first,
    )?;
    wait_for(
        "every's first run to be deleted as history",
        Duration::from_secs(60),
        || {
            jobs_of(&cp, "every").is_ok_and(|j| j.len() == 1 && j[0] != job)
                && cp
                    .event_reasons(NS, "every")
                    .is_ok_and(|r| r.contains("Deleted"))
        },
    )
    .with_context(|| format!("every's jobs: {:?}", jobs_of(&cp, "every")))?;

    // Replace: the skipped run starts now, and the stuck job is deleted for it (it is held
    // by its finalizer until its agent stops, which this one will not for 10 minutes).
    cp.kubectl_ok(&ferry_e2e::merge_patch(
        "copyschedule/forbid",
        NS,
        false,
        r#"{"spec":{"concurrencyPolicy":"Replace"}}"#,
    ))?;
    // The run replaces the stuck one: the skipped minute's, or a later one if the next
    // minute came first.
    let skipped_minute = unix(&skipped)? / 60;
    let replaced = |jobs: &[String]| {
        jobs.iter().any(|j| {
            j.strip_prefix("forbid-")
                .and_then(|m| m.parse::<i64>().ok())
                .is_some_and(|m| m >= skipped_minute)
        })
    };
    wait_for(
        "the replacement run and the stuck one's deletion",
        Duration::from_secs(30),
        || {
            jobs_of(&cp, "forbid").is_ok_and(|j| replaced(&j))
                && cp
                    .get(
                        &format!("copyjob/{}", stuck[0]),
                        NS,
                        "{.metadata.deletionTimestamp}",
                    )
                    .is_ok_and(|t| !t.is_empty())
        },
    )
    .with_context(|| format!("forbid's jobs: {:?}", jobs_of(&cp, "forbid")))?;
    ensure!(
        cp.event_reasons(NS, "forbid")?.contains("Replaced"),
        "events {}",
        cp.event_reasons(NS, "forbid")?
    );

    // The refused schedules created nothing.
    for name in ["bad-zone", "bad-cron", "bad-template"] {
        let made = jobs_of(&cp, name)?;
        ensure!(made.is_empty(), "{name} created {made:?}");
    }

    // Deleting a schedule removes its gauges.
    cp.kubectl_ok(&["delete", "copyschedule", "every", "-n", NS])?;
    wait_for("every's gauges to go", Duration::from_secs(30), || {
        http_get(port, "/metrics").is_some_and(|t| !t.contains("copyschedule=\"every\""))
    })?;
    let log = cp.log_tail("operator.log", 200);
    if log.contains("schedule reconcile failed") {
        bail!("the schedule controller failed a reconcile:\n{log}");
    }
    Ok(())
}
