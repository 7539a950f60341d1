//! Hole 3: every agent held every CopyJob of the cluster. At 934c0cf an agent watched all
//! CopyJobs with their whole spec; 40 refused jobs in another namespace grew an uninvolved
//! agent by ~50 MiB. Now the operator labels a job for the nodes of its shards and an agent
//! watches only its own: a job on node-a is never held by node-b's agent, and a deleted job
//! by none. The operator's memory under the same load is measured here (it prints the
//! numbers docs/security.md's bounds table quotes).

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use ferry_e2e::{http_get, metric, wait_for, ControlPlane};

fn jobs_watched(cp: &ControlPlane, node: &str) -> Result<Option<f64>> {
    let port = cp.agent_port(node)?;
    Ok(http_get(port, "/metrics").and_then(|m| metric(&m, "ferry_agent_jobs_watched", &[])))
}

/// `n` CopyJobs in namespace `mallory` on node-a's root, each with include and exclude
/// lists at the pattern bounds (the costliest spec admission lets through).
fn hostile_jobs(n: usize) -> String {
    let list = |c: char| {
        (0..256)
            .map(|i| format!("\"{c}*{c}*{c}*{c}*{i:04}x\""))
            .collect::<Vec<_>>()
            .join(", ")
    };
    (0..n)
        .map(|i| {
            format!(
                "apiVersion: ferry.dev/v1alpha1\nkind: CopyJob\nmetadata:\n  name: heavy-{i}\n  namespace: mallory\nspec:\n  source: {{root: a-only, path: src}}\n  destination: {{root: a-only, path: out-{i}}}\n  include: [{}]\n  exclude: [{}]\n",
                list('a'),
                list('b')
            )
        })
        .collect::<Vec<_>>()
        .join("---\n")
}

#[test]
fn an_agent_holds_only_the_jobs_with_a_shard_on_its_node() -> Result<()> {
    let Some(cp) = ControlPlane::start_or_skip()? else {
        return Ok(());
    };
    cp.install_crds()?;
    let (ferry, hosts) = cp.start_ferry(&["node-a", "node-b"])?;
    let operator = ferry[0].id();
    let agent_b = ferry[2].id();
    cp.kubectl_ok(&["create", "namespace", "mallory"])?;
    std::fs::create_dir_all(hosts.join("node-a/srv/a/src"))?;
    std::fs::create_dir_all(hosts.join("node-b/srv/b/src"))?;
    std::fs::write(hosts.join("node-b/srv/b/src/f"), b"node-b's tenant")?;
    cp.apply(
        "apiVersion: ferry.dev/v1alpha1\nkind: StorageRoot\nmetadata:\n  name: a-only\nspec:\n  path: /srv/a\n  nodeSelector: {ferry.dev/node: node-a}\n  namespaces: {names: [mallory]}\n---\napiVersion: ferry.dev/v1alpha1\nkind: StorageRoot\nmetadata:\n  name: b-only\nspec:\n  path: /srv/b\n  nodeSelector: {ferry.dev/node: node-b}\n  namespaces: {names: [default]}\n",
    )?;
    wait_for(
        "node-b's agent to serve its metrics",
        Duration::from_secs(30),
        || jobs_watched(&cp, "node-b").ok().flatten().is_some(),
    )?;
    let (_, operator_before) = super::memory_kib(operator)?;
    let (agent_before, _) = super::memory_kib(agent_b)?;
    // 40 jobs at the pattern bounds, all on node-a.
    const HOSTILE: usize = 40;
    cp.apply(&hostile_jobs(HOSTILE))?;
    wait_for(
        "the hostile jobs to be Succeeded",
        Duration::from_secs(180),
        || {
            cp.get(
                "copyjobs",
                "mallory",
                "{range .items[*]}{.status.phase}{\"\\n\"}{end}",
            )
            .is_ok_and(|p| p.lines().filter(|l| *l == "Succeeded").count() == HOSTILE)
        },
    )?;
    // node-b's tenant copies as ever, and node-b's agent holds only its own job (a finished
    // job stays with the agents that worked on it, for its final metrics, until deleted).
    cp.apply(
        "apiVersion: ferry.dev/v1alpha1\nkind: CopyJob\nmetadata:\n  name: neighbour\n  namespace: default\nspec:\n  source: {root: b-only, path: src}\n  destination: {root: b-only, path: out}\n",
    )?;
    cp.wait_succeeded("default", "neighbour", 60)?;
    wait_for(
        "each agent to hold its own jobs",
        Duration::from_secs(30),
        || {
            jobs_watched(&cp, "node-b").ok().flatten() == Some(1.0)
                && jobs_watched(&cp, "node-a").ok().flatten() == Some(HOSTILE as f64)
        },
    )
    .with_context(|| {
        format!(
            "node-a holds {:?}, node-b {:?}",
            jobs_watched(&cp, "node-a"),
            jobs_watched(&cp, "node-b")
        )
    })?;
    let labels = cp.get(
        "copyjobs",
        "mallory",
        "{range .items[*]}{.metadata.labels}{\"\\n\"}{end}",
    )?;
    ensure!(
        labels.lines().count() == HOSTILE
            && labels
                .lines()
                .all(|l| l.contains("node.ferry.dev/node-a") && !l.contains("node-b")),
        "the hostile jobs' labels: {labels}"
    );
    // Deleted jobs go from the agent that held them.
    cp.kubectl_ok(&[
        "delete",
        "copyjobs",
        "--all",
        "-n",
        "mallory",
        "--wait=false",
    ])?;
    wait_for(
        "node-a's agent to let the deleted jobs go",
        Duration::from_secs(60),
        || jobs_watched(&cp, "node-a").ok().flatten() == Some(0.0),
    )?;
    let (agent_after, _) = super::memory_kib(agent_b)?;
    let (operator_now, operator_peak) = super::memory_kib(operator)?;
    eprintln!(
        "{HOSTILE} jobs at the pattern bounds: operator peak {} MiB (before {} MiB, now {} MiB); uninvolved agent {} -> {} MiB",
        operator_peak / 1024,
        operator_before / 1024,
        operator_now / 1024,
        agent_before / 1024,
        agent_after / 1024
    );
    // The chart's operator limit is 256Mi (a debug build here, larger than the image's).
    ensure!(
        operator_peak < 256 * 1024,
        "the operator peaked at {} MiB under {HOSTILE} hostile jobs",
        operator_peak / 1024
    );
    ensure!(
        agent_after < agent_before + 16 * 1024,
        "node-b's agent grew from {agent_before} to {agent_after} KiB"
    );
    Ok(())
}

#[test]
fn no_one_but_the_operator_sets_the_node_labels_agents_watch_by() -> Result<()> {
    let Some(cp) = ControlPlane::start_or_skip()? else {
        return Ok(());
    };
    let Some(helm) = ferry_e2e::helm_or_skip()? else {
        return Ok(());
    };
    cp.install_crds()?;
    let out = std::process::Command::new(helm)
        .current_dir(ferry_e2e::repo_root())
        .args([
            "template",
            "ferry",
            "charts/ferry",
            "--namespace",
            "ferry-system",
        ])
        .args(["--show-only", "templates/node-labels-policy.yaml"])
        .output()?;
    ensure!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    cp.kubectl_stdin(&["apply", "-f", "-"], &String::from_utf8(out.stdout)?)
        .and_then(|o| {
            ensure!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            Ok(())
        })?;
    // A tenant with the chart's edit rights on CopyJobs and CopySchedules in its namespace.
    cp.kubectl_ok(&["create", "namespace", "mallory"])?;
    cp.kubectl_ok(&["create", "serviceaccount", "tenant", "-n", "mallory"])?;
    cp.kubectl_ok(&[
        "create",
        "role",
        "edit",
        "-n",
        "mallory",
        "--verb=get,list,watch,create,update,patch",
        "--resource=copyjobs.ferry.dev,copyschedules.ferry.dev",
    ])?;
    cp.kubectl_ok(&[
        "create",
        "rolebinding",
        "edit",
        "-n",
        "mallory",
        "--role=edit",
        "--serviceaccount=mallory:tenant",
    ])?;
    let tenant = cp.as_user(cp.service_account_kubeconfig("mallory", "tenant", None)?);
    let job = |name: &str, labels: &str| {
        format!("apiVersion: ferry.dev/v1alpha1\nkind: CopyJob\nmetadata:\n  name: {name}\n  namespace: mallory\n  labels: {{{labels}}}\nspec:\n  source: {{root: r, path: a}}\n  destination: {{root: r, path: b}}\n")
    };
    let refused = |k: &ferry_e2e::Kubectl, yaml: &str| -> Result<String> {
        let out = k.kubectl_stdin(&["create", "-f", "-"], yaml)?;
        ensure!(!out.status.success(), "admitted:\n{yaml}");
        Ok(String::from_utf8_lossy(&out.stderr).into_owned())
    };
    // The API server applies a new policy a moment after it is stored: ask until it
    // refuses (see `dry_run_refused`).
    let labelled = job("everywhere", "node.ferry.dev/node-a: ''");
    let _ = wait_for(
        "the node-labels policy in force",
        Duration::from_secs(30),
        || cp.dry_run_refused(&[], &labelled, "set by Ferry's operator alone"),
    );
    // Labelled for every node at creation: refused, for the tenant and for an admin alike.
    let err = refused(&tenant, &labelled)?;
    ensure!(err.contains("set by Ferry's operator alone"), "{err}");
    refused(&cp, &job("admin", "node.ferry.dev/node-b: ''"))?;
    // Other labels are the tenant's own; adding a node label later is refused too.
    let out = tenant.kubectl_stdin(&["create", "-f", "-"], &job("plain", "team: a"))?;
    ensure!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = tenant.kubectl(&[
        "label",
        "copyjob",
        "plain",
        "-n",
        "mallory",
        "node.ferry.dev/node-a=",
    ])?;
    ensure!(
        !out.status.success(),
        "a tenant labelled its job for node-a"
    );
    tenant.kubectl_ok(&[
        "label",
        "copyjob",
        "plain",
        "-n",
        "mallory",
        "team=b",
        "--overwrite",
    ])?;
    // Nor through a CopySchedule's template.
    let err = refused(
        &tenant,
        "apiVersion: ferry.dev/v1alpha1\nkind: CopySchedule\nmetadata:\n  name: sched\n  namespace: mallory\nspec:\n  schedule: '@daily'\n  jobTemplate:\n    metadata:\n      labels: {node.ferry.dev/node-a: ''}\n    spec:\n      source: {root: r, path: a}\n      destination: {root: r, path: b}\n",
    )?;
    ensure!(err.contains("node.ferry.dev/node-a"), "{err}");
    Ok(())
}
