//! Tenant safety through CopyJobs: paths that pass admission but lead through a symlink a
//! tenant planted inside the root are refused by the agent (which resolves every path from
//! the root's fd with openat2), the job fails with reason SymlinkRejected, and the files
//! outside the root stay as they were. Roots and claims a namespace may not use are refused
//! by the operator before any agent is given the job.

use anyhow::{ensure, Result};
use ferry_e2e::ControlPlane;

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
    let job = |name: &str, src: &str, dst: &str| {
        format!("apiVersion: ferry.dev/v1alpha1\nkind: CopyJob\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  source: {src}\n  destination: {dst}\n")
    };
    for (name, src, dst, reason) in [
        (
            "read-private",
            "{root: private, path: .}",
            "{root: tenant, path: stolen}",
            "RootNotAllowed",
        ),
        (
            "write-private",
            "{root: tenant, path: data}",
            "{root: private, path: planted}",
            "RootNotAllowed",
        ),
        (
            "write-archive",
            "{root: tenant, path: data}",
            "{root: archive, path: planted}",
            "ReadOnlyRoot",
        ),
        (
            "grab-claim",
            "{pvc: grab, path: .}",
            "{root: tenant, path: stolen2}",
            "CrossNamespace",
        ),
    ] {
        cp.apply(&job(name, src, dst))?;
        cp.wait_until(
            &format!("copyjob/{name}"),
            "default",
            "{.status.conditions[?(@.type==\"Accepted\")].reason}",
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
    for stolen in ["stolen", "stolen2"] {
        ensure!(
            !node.join("srv/tenant").join(stolen).exists(),
            "{stolen} was copied"
        );
    }
    Ok(())
}
