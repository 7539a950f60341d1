//! Migration hooks' grant: `get`, `patch` and `delete` on every Job, narrowed only by the
//! chart's `-migrations` admission policy to `spec.suspend` of a Job labelled
//! `ferry.dev/hook-for`, and the deletion of such a Job.
//! A stolen operator token must not be able to change what any Job runs, nor start one its
//! author did not prepare as a hook. Here, on the operator's own ServiceAccount token (and a
//! tenant's, and an admin's) against the chart as rendered into `deploy/`:
//!
//! - the patch `migrate::hook::suspend_patch` builds, to start a hook and to stop it, is
//!   admitted on a labelled Job, and refused on one without the label;
//! - that patch with anything else of the Job changed (its template, which a suspended Job
//!   lets change, its other spec fields, its labels and annotations) is refused naming the
//!   field;
//! - the operator deletes a labelled Job (a completed hook whose pods mount the claim) and
//!   no other; it cannot create one (RBAC);
//! - a tenant and an admin change their Jobs as before: not this policy's.
//!
//! The table is checked against the patch first: a field added to `suspend_patch` without
//! a row here fails.

use anyhow::{Context, Result};
use ferry_e2e::ControlPlane;
use ferry_operator::migrate::hook;
use serde_json::{json, Value};

use super::holder::{
    answered, apply, ask_patch_in, ask_rows, check_coverage, install, row, set, Answer, Row, TEAM,
};
use super::migrations::{new_claim, MIG};

/// The refusal of a Job change by the `-migrations` policy.
const ONLY_SUSPEND: &str = "changes a Job only to start or stop a migration's hook";
/// The API server's refusal of a patch at an old resourceVersion.
const CONFLICT: &str = "the object has been modified";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Base {
    /// `suspend_patch(false, ..)` on the labelled, suspended Job `hook`.
    Start,
    /// `suspend_patch(true, ..)` on the labelled, running Job `started`.
    Stop,
    /// `suspend_patch(false, ..)` on the suspended Job `plain`, which has no label.
    Unlabelled,
}

/// A suspended (or not) Job of `TEAM`, labelled a hook of migration `move-db` or not.
fn job(name: &str, suspend: bool, labelled: bool) -> Value {
    let mut j = json!({
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": TEAM, "labels": {"app": "db"}},
        "spec": {"suspend": suspend, "backoffLimit": 0,
            "template": {"spec": {"restartPolicy": "Never",
                "containers": [{"name": "flush", "image": "registry.k8s.io/pause:3.10",
                    "command": ["/flush"]}]}}}
    });
    if labelled {
        j["metadata"]["labels"][ferry_crds::HOOK_LABEL] = json!("move-db");
    }
    j
}

/// The Job each base patches.
fn target(base: Base) -> &'static str {
    match base {
        Base::Start => "job/hook",
        Base::Stop => "job/started",
        Base::Unlabelled => "job/plain",
    }
}

#[rustfmt::skip]
fn rows() -> Vec<Row<Base>> {
    use Answer::{Admitted, Refused};
    use Base::{Start, Stop, Unlabelled};
    vec![
        row(Start, "as built", vec![], Admitted),
        row(Stop, "as built", vec![], Admitted),
        row(Unlabelled, "as built, on a Job without the label", vec![], Refused("metadata.labels[ferry.dev/hook-for]")),
        row(Start, "at an old resourceVersion", vec![set("/metadata/resourceVersion", json!("1"))], Refused(CONFLICT)),
        row(Start, "its suspend left as it is", vec![set("/spec/suspend", json!(true))], Admitted),
        row(Start, "another command", vec![set("/spec/template", json!({"spec": {"restartPolicy": "Never",
            "containers": [{"name": "flush", "image": "registry.k8s.io/pause:3.10", "command": ["/bin/sh"]}]}}))],
            Refused("spec.template")),
        row(Start, "a node selector (a suspended Job's template allows it)", vec![set("/spec/template", json!({"spec": {"nodeSelector": {"kubernetes.io/hostname": "node-b"}}}))], Refused("spec.template")),
        row(Start, "more parallelism", vec![set("/spec/parallelism", json!(5))], Refused("spec.parallelism")),
        row(Stop, "a deadline", vec![set("/spec/activeDeadlineSeconds", json!(1))], Refused("spec.activeDeadlineSeconds")),
        row(Start, "its hook label dropped", vec![set("/metadata/labels", json!({"ferry.dev/hook-for": null}))], Refused("metadata.labels")),
        row(Start, "another label", vec![set("/metadata/labels", json!({"app": "web"}))], Refused("metadata.labels")),
        row(Start, "an annotation", vec![set("/metadata/annotations", json!({"x": "y"}))], Refused("metadata.annotations")),
        row(Unlabelled, "the label added with it", vec![set("/metadata/labels", json!({"ferry.dev/hook-for": "move-db"}))], Refused(ONLY_SUSPEND)),
    ]
}

#[test]
fn migrations_policy_lets_the_operator_only_start_stop_and_delete_a_labelled_jobs_hook(
) -> Result<()> {
    // The patches as the code builds them, checked against the rows (at a placeholder
    // resourceVersion; the real one is set below).
    let bases = |rv: &str| {
        [
            (Base::Start, hook::suspend_patch(false, rv)),
            (Base::Stop, hook::suspend_patch(true, rv)),
            (Base::Unlabelled, hook::suspend_patch(false, rv)),
        ]
    };
    let rows = rows();
    check_coverage(&bases("1"), &rows, &[])?;

    let Some(cp) = ControlPlane::start_or_skip()? else {
        return Ok(());
    };
    let mut labelled = new_claim(MIG, None)?;
    apply(&mut labelled, &set("/metadata/labels/app", json!("db")))?;
    let kc = install(&cp, &labelled, "metadata.labels")?;
    // No Job controller runs here: the Jobs stay as stored.
    for (name, suspend, hook) in [
        ("hook", true, true),
        ("started", false, true),
        ("plain", true, false),
    ] {
        cp.apply(&job(name, suspend, hook).to_string())?;
    }
    let rv = |name: &str| {
        cp.kubectl_ok(&[
            "get",
            "job",
            name,
            "-n",
            TEAM,
            "-o",
            "jsonpath={.metadata.resourceVersion}",
        ])
    };
    ask_rows(
        "Job rows",
        &rows,
        |base| {
            let patch = bases(&rv(target(base).trim_start_matches("job/"))?)
                .into_iter()
                .find(|(b, _)| *b == base)
                .map(|(_, p)| p);
            Ok((target(base), patch.context("no such base")?))
        },
        |to, patch, answer| ask_patch_in(&cp, &kc, Some(TEAM), to, patch, answer),
    )?;

    // The operator deletes a hook's Job and no other, and creates none.
    let kcs = kc.to_string_lossy();
    let made = cp.kubectl_stdin(
        &[
            "--kubeconfig",
            &kcs,
            "create",
            "--dry-run=server",
            "-f",
            "-",
        ],
        &job("mine", false, true).to_string(),
    )?;
    answered(&made, Answer::Refused("forbidden"))?;
    for (job, answer) in [
        ("hook", Answer::Admitted),
        (
            "plain",
            Answer::Refused("metadata.labels[ferry.dev/hook-for]"),
        ),
    ] {
        let deleted = cp.kubectl(&[
            "--kubeconfig",
            &kcs,
            "delete",
            "job",
            job,
            "-n",
            TEAM,
            "--dry-run=server",
        ])?;
        answered(&deleted, answer).map_err(|e| e.context(format!("deleting Job {job}")))?;
    }

    // A tenant with patch on its Jobs, and an admin, change them as before.
    cp.kubectl_ok(&["create", "serviceaccount", "tenant", "-n", TEAM])?;
    cp.kubectl_ok(&[
        "create",
        "role",
        "tenant-jobs",
        "-n",
        TEAM,
        "--verb=get,patch",
        "--resource=jobs.batch",
    ])?;
    cp.kubectl_ok(&[
        "create",
        "rolebinding",
        "tenant-jobs",
        "-n",
        TEAM,
        "--role=tenant-jobs",
        &format!("--serviceaccount={TEAM}:tenant"),
    ])?;
    let tenant = cp.service_account_kubeconfig(TEAM, "tenant", None)?;
    let admin = cp.kubeconfig.clone();
    let change = json!({"spec": {"parallelism": 2}, "metadata": {"labels": {"app": "web"}}});
    for (who, kc) in [
        ("a tenant", tenant.as_path()),
        ("an admin", admin.as_path()),
    ] {
        for t in ["job/hook", "job/plain"] {
            ask_patch_in(&cp, kc, Some(TEAM), t, &change, Answer::Admitted)
                .map_err(|e| e.context(format!("{t} changed by {who}")))?;
        }
    }
    Ok(())
}
