//! Tenant safety through CopyJobs: paths that pass admission but lead through a symlink a
//! tenant planted inside the root are refused by the agent (which resolves every path from
//! the root's fd with openat2), the job fails with reason SymlinkRejected, and the files
//! outside the root stay as they were. Roots and claims a namespace may not use are refused
//! by the operator before any agent is given the job.

use std::time::Duration;

use anyhow::{ensure, Result};
use ferry_e2e::{ControlPlane, PACED};

#[test]
fn symlinks_planted_in_a_root_fail_the_job_with_symlink_rejected_and_touch_nothing_outside(
) -> Result<()> {
    let Some(cp) = ControlPlane::start_or_skip()? else {
        return Ok(());
    };
    cp.install_crds()?;
    let (_ferry, hosts) = cp.start_ferry(&["node-a"])?;
    let node = hosts.join("node-a");
    // The node's secrets, outside the root, and a root whose tenant planted links to them.
    let secret = node.join("etc/secret");
    std::fs::create_dir_all(&secret)?;
    std::fs::write(secret.join("key"), b"do not copy")?;
    // An atime far in the past: under relatime any read of the key would move it.
    let old = std::fs::FileTimes::new()
        .set_accessed(std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000))
        .set_modified(std::time::UNIX_EPOCH + std::time::Duration::from_secs(2_000_000));
    std::fs::File::options()
        .write(true)
        .open(secret.join("key"))?
        .set_times(old)?;
    let root = node.join("srv/tenant");
    std::fs::create_dir_all(root.join("data"))?;
    std::fs::write(root.join("data/ok"), b"tenant data")?;
    std::os::unix::fs::symlink("/etc/secret", root.join("up"))?;
    std::os::unix::fs::symlink("../../../etc/secret", root.join("data/rel"))?;
    cp.apply(
        "apiVersion: ferry.dev/v1alpha1\nkind: StorageRoot\nmetadata:\n  name: tenant\nspec:\n  path: /srv/tenant\n  nodeSelector: {ferry.dev/node: node-a}\n  namespaces: {names: [default]}\n",
    )?;
    let job = |name: &str, src: &str, dst: &str| {
        format!("apiVersion: ferry.dev/v1alpha1\nkind: CopyJob\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  source: {{root: tenant, path: {src}}}\n  destination: {{root: tenant, path: {dst}}}\n")
    };
    for (name, src, dst) in [
        ("read-through-link", "up", "stolen"),
        ("read-below-link", "data/rel/key", "stolen2"),
        ("write-through-link", "data", "up/planted"),
        ("write-below-link", "data", "data/rel/planted"),
    ] {
        cp.apply(&job(name, src, dst))?;
        let got = cp.wait_until(
            &format!("copyjob/{name}"),
            "default",
            "{.status.phase} {.status.conditions[?(@.type==\"Failed\")].reason}",
            std::time::Duration::from_secs(60),
            |v| v.starts_with("Failed") || v.starts_with("Succeeded"),
        )?;
        ensure!(
            got == "Failed SymlinkRejected",
            "{name}: {src} -> {dst} should fail with SymlinkRejected, got {got:?}"
        );
        let msg = cp.get(
            &format!("copyjob/{name}"),
            "default",
            "{.status.failures[0].message}",
        )?;
        ensure!(
            msg.contains("symlink"),
            "{name}: the message does not say why: {msg}"
        );
        // And an event says so.
        let events = cp.kubectl_ok(&[
            "get",
            "events.events.k8s.io",
            "-n",
            "default",
            "--field-selector",
            &format!("regarding.name={name}"),
            "-o",
            "jsonpath={.items[*].reason}",
        ])?;
        ensure!(
            events.contains("SymlinkRejected"),
            "{name}: no SymlinkRejected event: {events:?}"
        );
    }
    use std::os::unix::fs::MetadataExt;
    let atime = std::fs::metadata(secret.join("key"))?.atime();
    ensure!(atime == 1_000_000, "the secret was read (atime {atime})");
    ensure!(std::fs::read(secret.join("key"))? == b"do not copy");
    let names: Vec<_> = std::fs::read_dir(&secret)?.collect();
    ensure!(names.len() == 1, "something was written next to the secret");
    for stolen in ["stolen", "stolen2"] {
        ensure!(
            !root.join(stolen).exists(),
            "{stolen} exists: the secret was copied"
        );
    }
    Ok(())
}

#[test]
fn roots_and_claims_a_namespace_may_not_use_are_refused_before_any_agent_touches_them() -> Result<()>
{
    let Some(cp) = ControlPlane::start_or_skip()? else {
        return Ok(());
    };
    cp.install_crds()?;
    let (_ferry, hosts) = cp.start_ferry(&["node-a"])?;
    let _binder = cp.start_volume_binder()?;
    let node = hosts.join("node-a");
    // Another team's data, a read-only archive, and the tenant's own root; the canaries
    // have an atime far in the past, so any read would show.
    let canaries = [node.join("srv/private/key"), node.join("srv/archive/key")];
    for c in &canaries {
        std::fs::create_dir_all(c.parent().unwrap_or(&node))?;
        std::fs::write(c, b"not yours")?;
        let old = std::fs::FileTimes::new()
            .set_accessed(std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000))
            .set_modified(std::time::UNIX_EPOCH + std::time::Duration::from_secs(2_000_000));
        std::fs::File::options()
            .write(true)
            .open(c)?
            .set_times(old)?;
    }
    std::fs::create_dir_all(node.join("srv/tenant/data"))?;
    std::fs::write(node.join("srv/tenant/data/f"), b"tenant data")?;
    cp.kubectl_ok(&["create", "namespace", "other"])?;
    cp.apply(
        "apiVersion: ferry.dev/v1alpha1\nkind: StorageRoot\nmetadata:\n  name: private\nspec:\n  path: /srv/private\n  nodeSelector: {ferry.dev/node: node-a}\n  namespaces: {names: [other]}\n---\napiVersion: ferry.dev/v1alpha1\nkind: StorageRoot\nmetadata:\n  name: archive\nspec:\n  path: /srv/archive\n  nodeSelector: {ferry.dev/node: node-a}\n  readOnly: true\n  namespaces: {names: [default]}\n---\napiVersion: ferry.dev/v1alpha1\nkind: StorageRoot\nmetadata:\n  name: tenant\nspec:\n  path: /srv/tenant\n  nodeSelector: {ferry.dev/node: node-a}\n  namespaces: {names: [default]}\n---\napiVersion: v1\nkind: PersistentVolume\nmetadata:\n  name: others-pv\nspec:\n  capacity: {storage: 1Gi}\n  accessModes: [ReadWriteOnce]\n  storageClassName: local\n  local: {path: /srv/private}\n  claimRef: {namespace: other, name: theirs}\n  nodeAffinity:\n    required:\n      nodeSelectorTerms:\n      - matchExpressions:\n        - {key: ferry.dev/node, operator: In, values: [node-a]}\n---\napiVersion: v1\nkind: PersistentVolumeClaim\nmetadata:\n  name: grab\n  namespace: default\nspec:\n  accessModes: [ReadWriteOnce]\n  storageClassName: local\n  volumeName: others-pv\n  resources: {requests: {storage: 1Gi}}\n",
    )?;
    // An admin's volume on the node's / that no claim is bound to, and a claim that names
    // it: the PV controller will not bind them (the classes differ), so the claim stays
    // Pending, whatever its spec.volumeName says.
    cp.apply("apiVersion: v1\nkind: PersistentVolume\nmetadata:\n  name: node-root\nspec:\n  capacity: {storage: 1Gi}\n  accessModes: [ReadWriteOnce]\n  storageClassName: admin-only\n  hostPath: {path: /srv/private}\n---\napiVersion: v1\nkind: PersistentVolumeClaim\nmetadata:\n  name: reach\n  namespace: default\nspec:\n  accessModes: [ReadWriteOnce]\n  storageClassName: mine\n  volumeName: node-root\n  resources: {requests: {storage: 1Gi}}\n")?;
    // A pair the PV controller does bind, so the refusals below are not just a controller
    // that has not started.
    cp.apply("apiVersion: v1\nkind: PersistentVolume\nmetadata:\n  name: tenant-pv\nspec:\n  capacity: {storage: 1Gi}\n  accessModes: [ReadWriteOnce]\n  storageClassName: local\n  local: {path: /srv/tenant}\n  claimRef: {namespace: default, name: own}\n  nodeAffinity:\n    required:\n      nodeSelectorTerms:\n      - matchExpressions:\n        - {key: ferry.dev/node, operator: In, values: [node-a]}\n---\napiVersion: v1\nkind: PersistentVolumeClaim\nmetadata:\n  name: own\n  namespace: default\nspec:\n  accessModes: [ReadWriteOnce]\n  storageClassName: local\n  volumeName: tenant-pv\n  resources: {requests: {storage: 1Gi}}\n")?;
    cp.wait_claim_bound("default", "own")?;
    let job = |name: &str, src: &str, dst: &str| {
        format!("apiVersion: ferry.dev/v1alpha1\nkind: CopyJob\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  source: {src}\n  destination: {dst}\n")
    };
    for (name, src, dst, condition, reason) in [
        (
            "read-private",
            "{root: private, path: .}",
            "{root: tenant, path: stolen}",
            "Accepted",
            "RootNotAllowed",
        ),
        (
            "write-private",
            "{root: tenant, path: data}",
            "{root: private, path: planted}",
            "Accepted",
            "RootNotAllowed",
        ),
        (
            "write-archive",
            "{root: tenant, path: data}",
            "{root: archive, path: planted}",
            "Accepted",
            "ReadOnlyRoot",
        ),
        // A claim naming another namespace's volume: never bound, never used.
        (
            "grab-claim",
            "{pvc: grab, path: .}",
            "{root: tenant, path: stolen2}",
            "Resolved",
            "PVCNotBound",
        ),
        // A claim naming an unclaimed volume it was not bound to (once enough to copy the
        // volume's host path: the claim's spec.volumeName was trusted).
        (
            "reach-volume",
            "{pvc: reach, path: .}",
            "{root: tenant, path: stolen3}",
            "Resolved",
            "PVCNotBound",
        ),
    ] {
        cp.apply(&job(name, src, dst))?;
        cp.wait_until(
            &format!("copyjob/{name}"),
            "default",
            &format!("{{.status.conditions[?(@.type==\"{condition}\")].reason}}"),
            std::time::Duration::from_secs(60),
            |v| v == reason,
        )?;
        let shards = cp.get(&format!("copyjob/{name}"), "default", "{.status.shards}")?;
        ensure!(
            shards.is_empty() || shards == "[]",
            "{name} was scheduled: {shards}"
        );
    }
    use std::os::unix::fs::MetadataExt;
    for c in &canaries {
        let atime = std::fs::metadata(c)?.atime();
        ensure!(
            atime == 1_000_000,
            "{} was read (atime {atime})",
            c.display()
        );
        ensure!(std::fs::read(c)? == b"not yours", "{} changed", c.display());
        let n = std::fs::read_dir(c.parent().unwrap_or(&node))?.count();
        ensure!(n == 1, "something was written next to {}", c.display());
    }
    for claim in ["grab", "reach"] {
        let phase = cp.get(&format!("pvc/{claim}"), "default", "{.status.phase}")?;
        ensure!(phase == "Pending", "claim {claim} is {phase}, not Pending");
    }
    for stolen in ["stolen", "stolen2", "stolen3"] {
        ensure!(
            !node.join("srv/tenant").join(stolen).exists(),
            "{stolen} was copied"
        );
    }
    Ok(())
}

/// Rules are checked while a job runs, not only when it starts: when the admin takes the
/// namespace off the StorageRoot mid-copy, the job fails `RootNotAllowed` and its agent
/// stops copying.
#[test]
fn a_job_whose_root_stops_admitting_its_namespace_stops_and_fails_with_the_reason() -> Result<()> {
    let Some(cp) = ControlPlane::start_or_skip()? else {
        return Ok(());
    };
    cp.install_crds()?;
    let (_ferry, hosts) =
        cp.start_ferry_with(&["node-a"], &[("FERRY_FAULT_FILE_DELAY_MS", "30"), PACED])?;
    let root = hosts.join("node-a/srv/data");
    for i in 0..400 {
        let dir = root.join(format!("src/d{}", i % 10));
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join(format!("f{i}")), format!("{i}\n").repeat(20))?;
    }
    let storage_root = |names: &str| {
        format!("apiVersion: ferry.dev/v1alpha1\nkind: StorageRoot\nmetadata:\n  name: data\nspec:\n  path: /srv/data\n  nodeSelector: {{ferry.dev/node: node-a}}\n  namespaces: {{names: [{names}]}}\n")
    };
    cp.apply(&storage_root("default"))?;
    cp.apply("apiVersion: ferry.dev/v1alpha1\nkind: CopyJob\nmetadata:\n  name: revoked\n  namespace: default\nspec:\n  source: {root: data, path: src}\n  destination: {root: data, path: copy}\n")?;
    cp.wait_until(
        "copyjob/revoked",
        "default",
        "{.status.progress.filesDone}",
        std::time::Duration::from_secs(60),
        |n| n.parse::<u64>().is_ok_and(|n| n >= 20),
    )?;
    // The admin no longer lets namespace default use the root.
    cp.apply(&storage_root("other"))?;
    cp.wait_until(
        "copyjob/revoked",
        "default",
        "{.status.phase}/{.status.conditions[?(@.type==\"Failed\")].reason}",
        std::time::Duration::from_secs(30),
        |v| v == "Failed/RootNotAllowed",
    )?;
    // Files written so far, wherever they are (a directory is staged under a temporary
    // name until it is complete): everything under the root but the source and `.ferry`.
    let count = || -> Result<usize> {
        let mut n = 0;
        let mut dirs: Vec<_> = std::fs::read_dir(&root)?
            .flatten()
            .filter(|e| e.file_name() != "src" && e.file_name() != ".ferry")
            .map(|e| e.path())
            .collect();
        while let Some(d) = dirs.pop() {
            if !d.is_dir() {
                n += 1;
                continue;
            }
            dirs.extend(std::fs::read_dir(&d)?.flatten().map(|e| e.path()));
        }
        Ok(n)
    };
    // The agent stops at its next file: a moment later nothing more arrives.
    std::thread::sleep(std::time::Duration::from_millis(500));
    let stopped = count()?;
    std::thread::sleep(std::time::Duration::from_secs(2));
    let later = count()?;
    ensure!(
        later == stopped && later < 400,
        "the agent went on copying after the job was refused: {stopped} then {later} of 400 entries"
    );
    Ok(())
}

#[test]
fn an_agent_opens_what_the_job_resolves_to_never_a_host_path_the_status_names() -> Result<()> {
    let Some(cp) = ControlPlane::start_or_skip()? else {
        return Ok(());
    };
    cp.install_crds()?;
    let (mut procs, hosts) = cp.start_ferry(&["node-a"])?;
    let node = hosts.join("node-a");
    // The node's secrets, and a tenant's root.
    std::fs::create_dir_all(node.join("etc/secret/src"))?;
    std::fs::write(node.join("etc/secret/src/key"), b"do not copy")?;
    std::fs::create_dir_all(node.join("srv/data/src"))?;
    std::fs::write(node.join("srv/data/src/ok"), b"tenant data")?;
    cp.apply("apiVersion: ferry.dev/v1alpha1\nkind: StorageRoot\nmetadata:\n  name: data\nspec:\n  path: /srv/data\n  nodeSelector: {ferry.dev/node: node-a}\n  namespaces: {names: [default]}\n---\napiVersion: ferry.dev/v1alpha1\nkind: CopyJob\nmetadata:\n  name: aimed\n  namespace: default\nspec:\n  source: {root: data, path: src}\n  destination: {root: data, path: out}\n  suspend: true\n")?;
    cp.wait_until(
        "copyjob/aimed",
        "default",
        "{.status.shards[0].node}",
        Duration::from_secs(60),
        |n| n == "node-a",
    )?;
    // The operator writes the assignment, then labels the job for the node's agent (whose
    // watch selects by that label) in a second request: killed between the two, the agent
    // would never see the job. The assignment is whole once the label is there.
    let label = ferry_crds::node_label("node-a");
    cp.wait_until(
        "copyjob/aimed",
        "default",
        "{.metadata.labels}",
        Duration::from_secs(60),
        |l| l.contains(&format!("\"{label}\"")),
    )?;
    // What a stolen agent token can do where the chart's admission policy is not installed
    // (and the operator, which would write the assignment back, is gone): aim the shard's
    // source at the node's secrets.
    drop(procs.remove(0));
    cp.kubectl_ok(&[
        "patch",
        "copyjob",
        "aimed",
        "-n",
        "default",
        "--subresource=status",
        "--type=json",
        "-p",
        r#"[{"op":"replace","path":"/status/shards/0/sourceRoot","value":"/etc/secret"}]"#,
    ])?;
    cp.kubectl_ok(&ferry_e2e::merge_patch(
        "copyjob/aimed",
        "default",
        false,
        r#"{"spec":{"suspend":false}}"#,
    ))?;
    let state = cp.wait_until(
        "copyjob/aimed",
        "default",
        "{.status.shards[0].state}",
        Duration::from_secs(60),
        |s| s == "Succeeded" || s == "Failed",
    )?;
    let out = node.join("srv/data/out");
    ensure!(
        !out.join("key").exists(),
        "the agent copied the node's secret from the host path the status named"
    );
    ensure!(
        state == "Succeeded" && std::fs::read(out.join("ok"))? == b"tenant data",
        "the agent copied the job's own source (state {state})"
    );
    Ok(())
}
