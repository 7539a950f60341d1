//! Hole 4: "copied, each verified" for data that is not there. At 934c0cf a job's spec
//! could change whenever its phase was Pending, and a job goes back to Pending while its
//! shards still run (its CSI claim's pod deleted, VolumeInUse, SnapshotNotReady): a new
//! `destination.path` then gave Succeeded, "40 files copied, each verified", for an empty
//! directory. Now what a job copies is fixed once any shard exists (the CRD's rule), and
//! without that rule the operator and the agents still run and report a shard only for the
//! spec it was cut for.

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use ferry_e2e::{merge_patch, ControlPlane, PACED};

const JOB: &str = "apiVersion: ferry.dev/v1alpha1\nkind: CopyJob\nmetadata:\n  name: moved\n  namespace: default\nspec:\n  source: {root: tenant, path: data}\n  destination: {root: tenant, path: out}\n";

#[test]
fn a_started_jobs_spec_cannot_change_even_while_it_is_pending() -> Result<()> {
    let Some(cp) = ControlPlane::start_or_skip()? else {
        return Ok(());
    };
    cp.install_crds()?;
    cp.apply(JOB)?;
    // Back in Pending with a shard cut (what the operator writes when a running job's
    // claim loses its pod): the status an attacker waits for.
    cp.kubectl_ok(&merge_patch(
        "copyjob/moved",
        "default",
        true,
        r#"{"status":{"phase":"Pending","shards":[{"id":"0","node":"node-a","epoch":1,"sourceRoot":"/srv/tenant","destinationRoot":"/srv/tenant","part":"","state":"Running","filesDone":0,"bytesDone":0,"bytesReflinked":0,"skipped":0,"failed":0,"unlisted":0,"bytesPerSecond":0,"deleted":0,"failures":[]}]}}"#,
    ))?;
    let out = cp.kubectl(&merge_patch(
        "copyjob/moved",
        "default",
        false,
        r#"{"spec":{"destination":{"root":"tenant","path":"elsewhere"}}}"#,
    ))?;
    let err = String::from_utf8_lossy(&out.stderr);
    ensure!(
        !out.status.success() && err.contains("cannot change"),
        "a Pending job with a shard had its destination changed: {err}"
    );
    // What a started job may change, it still may.
    cp.kubectl_ok(&merge_patch(
        "copyjob/moved",
        "default",
        false,
        r#"{"spec":{"suspend":true,"ttlSecondsAfterFinished":60}}"#,
    ))?;
    // A job refused before anything was cut can be mended.
    cp.apply(&JOB.replace("name: moved", "name: refused"))?;
    cp.kubectl_ok(&merge_patch(
        "copyjob/refused",
        "default",
        true,
        r#"{"status":{"phase":"Pending"}}"#,
    ))?;
    cp.kubectl_ok(&merge_patch(
        "copyjob/refused",
        "default",
        false,
        r#"{"spec":{"destination":{"root":"tenant","path":"elsewhere"}}}"#,
    ))?;
    Ok(())
}

#[test]
fn without_the_crds_rule_a_changed_spec_fails_the_job_and_is_never_reported_copied() -> Result<()> {
    let Some(cp) = ControlPlane::start_or_skip()? else {
        return Ok(());
    };
    cp.install_crds()?;
    // A CRD installed without its transition rule (an older chart, a hand edit): the
    // operator and the agents must hold the line alone.
    let crd = cp.kubectl_ok(&["get", "crd", "copyjobs.ferry.dev", "-o", "json"])?;
    let mut crd: serde_json::Value = serde_json::from_str(&crd)?;
    let schema = &mut crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
    let rules = schema["x-kubernetes-validations"]
        .as_array_mut()
        .context("the CRD's root rules")?;
    let before = rules.len();
    rules.retain(|r| !r["rule"].as_str().unwrap_or_default().contains("oldSelf"));
    ensure!(rules.len() < before, "no transition rule to remove");
    crd["metadata"]
        .as_object_mut()
        .context("metadata")?
        .retain(|k, _| k == "name");
    cp.kubectl_stdin(&["replace", "-f", "-"], &crd.to_string())
        .and_then(|o| {
            ensure!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            Ok(())
        })?;
    let (_ferry, hosts) =
        cp.start_ferry_with(&["node-a"], &[("FERRY_FAULT_FILE_DELAY_MS", "40"), PACED])?;
    let root = hosts.join("node-a/srv/tenant");
    std::fs::create_dir_all(root.join("data"))?;
    for i in 0..150 {
        std::fs::write(root.join(format!("data/f{i:03}")), format!("file {i}"))?;
    }
    cp.apply(
        "apiVersion: ferry.dev/v1alpha1\nkind: StorageRoot\nmetadata:\n  name: tenant\nspec:\n  path: /srv/tenant\n  nodeSelector: {ferry.dev/node: node-a}\n  namespaces: {names: [default]}\n",
    )?;
    let phases = cp.watch("copyjob", "default", "moved", "{.status.phase}")?;
    std::thread::sleep(Duration::from_millis(500));
    cp.apply(JOB)?;
    cp.wait_until(
        "copyjob/moved",
        "default",
        "{.status.shards[0].filesDone}",
        Duration::from_secs(60),
        |v| v.parse::<i64>().is_ok_and(|n| n > 0),
    )?;
    // Mid-copy, the destination moves: admitted, since the rule is gone.
    cp.kubectl_ok(&merge_patch(
        "copyjob/moved",
        "default",
        false,
        r#"{"spec":{"destination":{"root":"tenant","path":"elsewhere"}}}"#,
    ))?;
    let got = cp.wait_until(
        "copyjob/moved",
        "default",
        "{.status.phase} {.status.conditions[?(@.type==\"Failed\")].reason}",
        Duration::from_secs(120),
        |v| v.starts_with("Failed") || v.starts_with("Succeeded"),
    )?;
    ensure!(
        got == "Failed SpecChanged",
        "a job whose destination moved mid-copy ended {got:?}, not Failed SpecChanged"
    );
    // Give the agent time to publish anything it still would: the status stays Failed.
    std::thread::sleep(Duration::from_secs(3));
    let seen = phases.seen();
    ensure!(
        !seen.iter().any(|p| p.contains("Succeeded")),
        "the job was reported Succeeded at some point: {seen:?}"
    );
    let complete = cp.get(
        "copyjob/moved",
        "default",
        "{.status.phase} {.status.conditions[?(@.type==\"Complete\")].status}",
    )?;
    ensure!(
        complete.starts_with("Failed") && !complete.contains("True"),
        "status after the change: {complete:?}"
    );
    // Nothing was copied to where the status would now point.
    let elsewhere = root.join("elsewhere");
    ensure!(
        !elsewhere.exists() || std::fs::read_dir(&elsewhere)?.next().is_none(),
        "the agent copied into the new destination"
    );
    Ok(())
}
