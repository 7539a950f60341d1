//! Hole 8, the operator's pod lists: at 934c0cf a job waiting for a pod to mount its CSI
//! claim made the operator list every pod of the namespace, whole, every 5 s (twice a
//! reconcile). A tenant's namespace full of large pods then cost the operator their whole
//! size at each look. Now it lists only Running pods, a page at a time, and keeps of each
//! only what says which claim it mounts.

use std::time::Duration;

use anyhow::{ensure, Result};
use ferry_e2e::ControlPlane;

#[test]
fn a_namespace_of_large_pods_costs_the_operator_nothing_while_a_job_waits_for_a_mount() -> Result<()>
{
    let Some(cp) = ControlPlane::start_or_skip()? else {
        return Ok(());
    };
    cp.install_crds()?;
    let (ferry, hosts) = cp.start_ferry(&["node-a", "node-b"])?;
    let operator = ferry[0].id();
    let _binder = cp.start_volume_binder()?;
    cp.apply(
        "apiVersion: v1\nkind: PersistentVolume\nmetadata:\n  name: pv-csi\nspec:\n  capacity: {storage: 1Gi}\n  accessModes: [ReadWriteOnce]\n  storageClassName: fake-csi\n  csi: {driver: fake.csi.ferry.dev, volumeHandle: vol-0001}\n  claimRef: {namespace: default, name: data}\n---\napiVersion: v1\nkind: PersistentVolumeClaim\nmetadata:\n  name: data\n  namespace: default\nspec:\n  accessModes: [ReadWriteOnce]\n  storageClassName: fake-csi\n  volumeName: pv-csi\n  resources: {requests: {storage: 1Gi}}\n---\napiVersion: ferry.dev/v1alpha1\nkind: StorageRoot\nmetadata:\n  name: backup\nspec:\n  path: /srv/backup\n  nodeSelector: {ferry.dev/node: node-b}\n  namespaces: {names: [default]}\n",
    )?;
    cp.wait_claim_bound("default", "data")?;
    std::fs::create_dir_all(hosts.join("node-b/srv/backup"))?;
    // 200 pods of ~200 KiB each (an annotation: a tenant may write that much), none of them
    // running (no kubelet here): ~40 MB the operator used to read at every look.
    const PODS: usize = 200;
    let filler = "x".repeat(200 * 1024);
    let pods: Vec<String> = (0..PODS)
        .map(|i| {
            format!("apiVersion: v1\nkind: Pod\nmetadata:\n  name: big-{i}\n  namespace: default\n  annotations: {{filler: {filler}}}\nspec:\n  containers:\n  - {{name: pause, image: registry.k8s.io/pause:3.10}}\n")
        })
        .collect();
    for chunk in pods.chunks(20) {
        let out = cp.kubectl_stdin(&["create", "-f", "-"], &chunk.join("---\n"))?;
        ensure!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let before = super::memory_kib(operator)?.1;
    cp.apply("apiVersion: ferry.dev/v1alpha1\nkind: CopyJob\nmetadata:\n  name: from-csi\n  namespace: default\nspec:\n  source: {pvc: data, path: src}\n  destination: {root: backup, path: copy}\n")?;
    cp.wait_until(
        "copyjob/from-csi",
        "default",
        "{.status.conditions[?(@.type==\"Resolved\")].reason}",
        Duration::from_secs(60),
        |r| r == "VolumeNotMounted",
    )?;
    // Three more looks (every 5 s).
    std::thread::sleep(Duration::from_secs(16));
    let after = super::memory_kib(operator)?.1;
    eprintln!(
        "{PODS} pods of 200 KiB: operator peak {} -> {} MiB while a job waits for a mount",
        before / 1024,
        after / 1024
    );
    ensure!(
        after < before + 16 * 1024,
        "the operator's peak grew from {} to {} MiB while a job waited among {PODS} large pods",
        before / 1024,
        after / 1024
    );
    Ok(())
}
