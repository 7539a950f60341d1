//! A claim on a CSI volume is copied through the kubelet's pod volume directory on the node
//! of a pod that mounts it: refused with `VolumeNotMounted` while no running pod mounts the
//! claim, then copied on that pod's node once one does. No kubelet or CSI driver runs here,
//! so the test makes the mount directory itself under the simulated node's host root.

use std::path::Path;

use anyhow::{ensure, Result};
use ferry_e2e::{assert_same_contents, merge_patch, ControlPlane};

/// A Pod on `node` that mounts claim `data` (no kubelet runs here: the test sets its phase).
fn pod(name: &str, node: &str) -> String {
    format!("apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  nodeName: {node}\n  containers:\n  - {{name: pause, image: registry.k8s.io/pause:3.10, volumeMounts: [{{name: data, mountPath: /data}}]}}\n  volumes:\n  - {{name: data, persistentVolumeClaim: {{claimName: data}}}}\n")
}

#[test]
fn pvc_on_a_csi_pv_waits_for_a_mounting_pod_then_is_copied_on_that_pods_node() -> Result<()> {
    let Some(cp) = ControlPlane::start_or_skip()? else {
        return Ok(());
    };
    cp.install_crds()?;
    let (_ferry, hosts) = cp.start_ferry(&["node-a", "node-b"])?;
    let _binder = cp.start_volume_binder()?;
    // A CSI PV pre-bound to claim "data" (the PV controller binds them), and a destination
    // root on node-b.
    cp.apply(
        "apiVersion: v1\nkind: PersistentVolume\nmetadata:\n  name: pv-csi\nspec:\n  capacity: {storage: 1Gi}\n  accessModes: [ReadWriteOnce]\n  storageClassName: fake-csi\n  csi: {driver: fake.csi.ferry.dev, volumeHandle: vol-0001}\n  claimRef: {namespace: default, name: data}\n---\napiVersion: v1\nkind: PersistentVolumeClaim\nmetadata:\n  name: data\n  namespace: default\nspec:\n  accessModes: [ReadWriteOnce]\n  storageClassName: fake-csi\n  volumeName: pv-csi\n  resources: {requests: {storage: 1Gi}}\n---\napiVersion: ferry.dev/v1alpha1\nkind: StorageRoot\nmetadata:\n  name: backup\nspec:\n  path: /srv/backup\n  nodeSelector: {ferry.dev/node: node-b}\n  namespaces: {names: [default]}\n",
    )?;
    cp.wait_claim_bound("default", "data")?;
    // The admin made the destination root's directory on node-b.
    std::fs::create_dir_all(hosts.join("node-b/srv/backup"))?;
    // A finished pod on node-a that mounted the claim does not count: its volume is gone.
    cp.apply(&pod("done", "node-a"))?;
    cp.kubectl_ok(&merge_patch(
        "pod/done",
        "default",
        true,
        r#"{"status":{"phase":"Succeeded"}}"#,
    ))?;

    cp.apply("apiVersion: ferry.dev/v1alpha1\nkind: CopyJob\nmetadata:\n  name: from-csi\n  namespace: default\nspec:\n  source: {pvc: data, path: src}\n  destination: {root: backup, path: copy}\n")?;
    let out = cp.kubectl(&[
        "wait",
        "--for=jsonpath={.status.conditions[?(@.type==\"Resolved\")].reason}=VolumeNotMounted",
        "--timeout=60s",
        "copyjob/from-csi",
        "-n",
        "default",
    ])?;
    ensure!(
        out.status.success(),
        "a CSI claim no pod mounts was not refused with VolumeNotMounted: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let get = |path: &str| cp.get("copyjob/from-csi", "default", &format!("{{{path}}}"));
    let msg = get(".status.conditions[?(@.type==\"Resolved\")].message")?;
    for part in [
        "CSI volume \"pv-csi\"",
        "mounts claim \"data\"",
        "a pause pod is enough",
    ] {
        ensure!(msg.contains(part), "message lacks {part:?}: {msg}");
    }
    let (status, phase) = (
        get(".status.conditions[?(@.type==\"Resolved\")].status")?,
        get(".status.phase")?,
    );
    ensure!(
        (status.as_str(), phase.as_str()) == ("False", "Pending"),
        "Resolved={status}, phase {phase}"
    );

    // A pod scheduled to node-b mounts the claim; the kubelet would mount the volume at
    // <kubelet dir>/pods/<uid>/volumes/kubernetes.io~csi/<pv>/mount, so the test does.
    cp.apply(&pod("user", "node-b"))?;
    let uid = cp.get("pod/user", "default", "{.metadata.uid}")?;
    ensure!(!uid.is_empty(), "the pod has no uid");
    let mount = format!("/var/lib/kubelet/pods/{uid}/volumes/kubernetes.io~csi/pv-csi/mount");
    let tree = hosts
        .join("node-b")
        .join(mount.trim_start_matches('/'))
        .join("src");
    std::fs::create_dir_all(tree.join("nested/deeper"))?;
    for f in 0..12u64 {
        std::fs::write(
            tree.join(format!("nested/f{f}")),
            vec![(f * 7 % 251) as u8; (f * 1021) as usize],
        )?;
    }
    std::fs::write(
        tree.join("nested/deeper/readme"),
        b"through the kubelet mount\n",
    )?;
    std::os::unix::fs::symlink("../f3", tree.join("nested/deeper/link"))?;
    // Only now is the volume mounted: the kubelet reports the pod Running after that.
    cp.kubectl_ok(&merge_patch(
        "pod/user",
        "default",
        true,
        r#"{"status":{"phase":"Running"}}"#,
    ))?;

    cp.wait_succeeded("default", "from-csi", 90)?;
    let (node, source_root) = (
        get(".status.shards[0].node")?,
        get(".status.shards[0].sourceRoot")?,
    );
    ensure!(
        (node.as_str(), source_root.as_str()) == ("node-b", mount.as_str()),
        "shard on {node:?} from {source_root:?}, expected node-b and {mount:?}"
    );
    let copy = hosts.join("node-b/srv/backup/copy");
    assert_same_contents(&tree, &copy)?;
    // Nothing on node-a but the agent's own state directory (made when it started).
    let mut touched = Vec::new();
    let mut dirs = vec![hosts.join("node-a")];
    while let Some(dir) = dirs.pop() {
        for e in std::fs::read_dir(&dir)? {
            let path = e?.path();
            let rel = path.strip_prefix(hosts.join("node-a"))?.to_path_buf();
            if rel.starts_with("var/lib/ferry/agent") {
                continue;
            }
            if !["var", "var/lib", "var/lib/ferry"]
                .iter()
                .any(|d| rel == Path::new(d))
            {
                touched.push(rel.clone());
            }
            if path.is_dir() {
                dirs.push(path);
            }
        }
    }
    ensure!(
        touched.is_empty(),
        "the agent on node-a touched its host root: {touched:?}"
    );
    Ok(())
}
