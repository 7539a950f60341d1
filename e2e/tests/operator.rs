//! The operator against a real kube-apiserver: it takes ownership of CopyJobs (finalizer),
//! accepts valid ones, and refuses what the namespace may not do with a condition reason,
//! a message that says what to change, and an event.

use anyhow::{ensure, Result};
use ferry_e2e::ControlPlane;

fn job(ns: &str, name: &str, source: &str, destination: &str) -> String {
    format!("apiVersion: ferry.dev/v1alpha1\nkind: CopyJob\nmetadata:\n  name: {name}\n  namespace: {ns}\nspec:\n  source: {source}\n  destination: {destination}\n")
}

/// Wait (on the condition, not on time) until `type`'s reason is `reason`; return its message.
fn wait_reason(
    cp: &ControlPlane,
    ns: &str,
    name: &str,
    type_: &str,
    reason: &str,
) -> Result<String> {
    let path = format!("{{.status.conditions[?(@.type==\"{type_}\")].reason}}");
    let out = cp.kubectl(&[
        "wait",
        &format!("--for=jsonpath={path}={reason}"),
        "--timeout=60s",
        "-n",
        ns,
        &format!("copyjob/{name}"),
    ])?;
    if !out.status.success() {
        let log = std::fs::read_to_string(cp.dir().join("operator.log")).unwrap_or_default();
        let got = cp
            .get(&format!("copyjob/{name}"), ns, "{.status}")
            .unwrap_or_default();
        anyhow::bail!(
            "{ns}/{name}: {type_} never became {reason}; status: {got}\noperator log:\n{log}"
        );
    }
    cp.get(
        &format!("copyjob/{name}"),
        ns,
        &format!("{{.status.conditions[?(@.type==\"{type_}\")].message}}"),
    )
}

#[test]
fn operator_accepts_valid_jobs_and_refuses_roots_a_namespace_may_not_use() -> Result<()> {
    let Some(cp) = ControlPlane::start_or_skip()? else {
        return Ok(());
    };
    cp.install_crds()?;
    cp.kubectl_ok(&["create", "namespace", "team-a"])?;
    cp.kubectl_ok(&["create", "namespace", "team-b"])?;
    cp.kubectl_ok(&["label", "namespace", "team-a", "tier=gold"])?;
    cp.apply(
        "apiVersion: ferry.dev/v1alpha1\nkind: StorageRoot\nmetadata:\n  name: datasets\nspec:\n  path: /srv/datasets\n  shared: true\n  namespaces:\n    selector:\n      matchLabels: {tier: gold}\n---\napiVersion: ferry.dev/v1alpha1\nkind: StorageRoot\nmetadata:\n  name: archive\nspec:\n  path: /srv/archive\n  shared: true\n  readOnly: true\n  namespaces:\n    names: [team-a, team-b]\n",
    )?;
    cp.kubectl_ok(&["create", "namespace", "ferry-system"])?;
    let _operator = cp.spawn_operator("operator", &[])?;

    cp.apply(&job(
        "team-a",
        "ok",
        "{root: archive, path: in}",
        "{root: datasets, path: out}",
    ))?;
    cp.apply(&job(
        "team-b",
        "denied",
        "{root: datasets, path: in}",
        "{root: datasets, path: out}",
    ))?;
    cp.apply(&job(
        "team-a",
        "readonly",
        "{root: datasets, path: in}",
        "{root: archive, path: out}",
    ))?;
    cp.apply(&job(
        "team-a",
        "missing",
        "{root: nowhere}",
        "{root: datasets, path: out}",
    ))?;

    wait_reason(&cp, "team-a", "ok", "Resolved", "Resolved")?;
    let fin = cp.get("copyjob/ok", "team-a", "{.metadata.finalizers}")?;
    ensure!(
        fin.contains("ferry.dev/cleanup"),
        "no finalizer on an accepted job: {fin}"
    );
    let gen = cp.get(
        "copyjob/ok",
        "team-a",
        "{.status.conditions[0].observedGeneration}",
    )?;
    ensure!(gen == "1", "observedGeneration should be 1, got {gen:?}");

    let msg = wait_reason(&cp, "team-b", "denied", "Accepted", "RootNotAllowed")?;
    ensure!(
        msg.contains("team-b") && msg.contains("datasets") && msg.contains("ask an admin"),
        "unhelpful message: {msg}"
    );
    let msg = wait_reason(&cp, "team-a", "readonly", "Accepted", "ReadOnlyRoot")?;
    ensure!(msg.contains("read-only"), "unhelpful message: {msg}");
    let msg = wait_reason(&cp, "team-a", "missing", "Resolved", "RootNotFound")?;
    ensure!(msg.contains("nowhere"), "unhelpful message: {msg}");

    // The refusal also reaches the user as an event on the job.
    let events = cp.kubectl_ok(&[
        "get",
        "events",
        "-n",
        "team-b",
        "-o",
        "jsonpath={.items[*].reason}",
    ])?;
    ensure!(
        events.contains("RootNotAllowed"),
        "no RootNotAllowed event in team-b: {events:?}"
    );

    // Deleting a job goes through the finalizer and completes.
    cp.kubectl_ok(&["delete", "copyjob", "ok", "-n", "team-a", "--timeout=60s"])?;
    Ok(())
}
