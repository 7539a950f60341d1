//! CSI claims on the tier's real CSI driver (`e2e/csi`, StorageClasses `ferry-csi` and
//! `ferry-csi-wffc`, provisioned by csi-provisioner, attached by csi-attacher, staged and
//! published by the kubelet): Ferry copies claims that no pod mounts through holder pods of
//! its own, a claim in use where its user mounts it, and leaves nothing behind.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use ferry_e2e::kube::KubeTier;
use ferry_e2e::{assert_same_tree, tree_meta, wait_for};

use super::{dated_tree, rich_tree, NS};

/// The label every holder pod has.
const HOLDER: &str = "app.kubernetes.io/name=ferry-holder";

/// A claim of `size` on `class` in `ns`, with `modes` (e.g. `ReadWriteOnce`).
pub(super) fn claim(tier: &KubeTier, ns: &str, name: &str, class: &str, modes: &str) -> Result<()> {
    tier.apply(&format!(
        "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {{name: {name}, namespace: {ns}}}\nspec:\n  storageClassName: {class}\n  accessModes: [{modes}]\n  resources: {{requests: {{storage: 1Gi}}}}\n"
    ))
}

/// Where the driver keeps the volume bound to claim `ns/name`, on the host: the test
/// writes a source there and reads a destination back.
pub(super) fn volume_dir(tier: &KubeTier, ns: &str, name: &str) -> Result<PathBuf> {
    let pv = tier.get(&format!("pvc/{name}"), ns, "{.spec.volumeName}")?;
    ensure!(!pv.is_empty(), "claim {ns}/{name} has no volume");
    let handle = tier.get(&format!("pv/{pv}"), "", "{.spec.csi.volumeHandle}")?;
    ensure!(!handle.is_empty(), "volume {pv} is not a CSI volume");
    Ok(tier.csi_volumes().join(handle))
}

/// The image the operator's holder pods run (Ferry's own), from its FERRY_HOLDER_IMAGE.
pub(super) fn holder_image(tier: &KubeTier) -> Result<String> {
    let image = tier.get(
        "deploy/ferry-operator",
        NS,
        "{.spec.template.spec.containers[0].env[?(@.name==\"FERRY_HOLDER_IMAGE\")].value}",
    )?;
    ensure!(!image.is_empty(), "the operator has no FERRY_HOLDER_IMAGE");
    Ok(image)
}

/// A user's pod that mounts `claim` read-write and does nothing (the Ferry image's pause,
/// under the restricted Pod Security profile).
pub(super) fn user_pod(tier: &KubeTier, ns: &str, name: &str, claim: &str) -> Result<()> {
    let image = holder_image(tier)?;
    tier.apply(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: {ns}}}\nspec:\n  terminationGracePeriodSeconds: 1\n  automountServiceAccountToken: false\n  securityContext: {{runAsNonRoot: true, runAsUser: 65534, seccompProfile: {{type: RuntimeDefault}}}}\n  containers:\n  - name: app\n    image: {image}\n    args: [pause]\n    securityContext: {{allowPrivilegeEscalation: false, capabilities: {{drop: [ALL]}}}}\n    volumeMounts: [{{name: data, mountPath: /data}}]\n  volumes:\n  - {{name: data, persistentVolumeClaim: {{claimName: {claim}}}}}\n"
    ))?;
    tier.wait_pod_ready(ns, name, 90)
}

/// A CopyJob in `default` from claim `src` (path `data`) to claim `dst` (path `copy`).
fn job(tier: &KubeTier, name: &str, src: &str, dst: &str) -> Result<()> {
    tier.apply(&format!(
        "apiVersion: ferry.dev/v1alpha1\nkind: CopyJob\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  source: {{pvc: {src}, path: data}}\n  destination: {{pvc: {dst}, path: copy}}\n"
    ))
}

/// The holder pods in `ns`, a `pod/NAME` line each.
pub(super) fn holder_pods(tier: &KubeTier, ns: &str) -> Result<String> {
    tier.kubectl_ok(&["get", "pods", "-n", ns, "-l", HOLDER, "-o", "name"])
}

/// Until no holder pod is left in `ns`.
pub(super) fn all_let_go(tier: &KubeTier, ns: &str) -> Result<()> {
    wait_for("no holder pod left", Duration::from_secs(60), || {
        holder_pods(tier, ns).is_ok_and(|p| p.trim().is_empty())
    })
    .with_context(|| {
        format!(
            "holders: {:?}",
            tier.kubectl_ok(&["get", "pods", "-n", ns, "-l", HOLDER])
        )
    })
}

/// Until no VolumeAttachment is left for the volumes of `claims` in `default` (those
/// csi-attacher made are gone once nothing mounts the volumes).
fn detached(tier: &KubeTier, claims: &[&str]) -> Result<()> {
    let pvs = claims
        .iter()
        .map(|c| tier.get(&format!("pvc/{c}"), "default", "{.spec.volumeName}"))
        .collect::<Result<Vec<_>>>()?;
    let attached = || -> Result<Vec<String>> {
        let all = tier.kubectl_ok(&[
            "get",
            "volumeattachments",
            "-o",
            "jsonpath={range .items[*]}{.spec.source.persistentVolumeName}{\"\\n\"}{end}",
        ])?;
        Ok(all
            .lines()
            .filter(|pv| pvs.iter().any(|p| p == pv))
            .map(String::from)
            .collect())
    };
    wait_for("the volumes detached", Duration::from_secs(90), || {
        attached().is_ok_and(|a| a.is_empty())
    })
    .with_context(|| format!("still attached: {:?}", attached()))
}

/// Until job `name` in `default` waits with `reason`; its condition's message.
fn waits_with(tier: &KubeTier, name: &str, reason: &str) -> Result<String> {
    condition_with(tier, name, "Resolved", reason)
}

/// Until job `name` in `default` has condition `type_` with `reason`; its message.
pub(super) fn condition_with(
    tier: &KubeTier,
    name: &str,
    type_: &str,
    reason: &str,
) -> Result<String> {
    let said = tier.wait_until(
        &format!("copyjob/{name}"),
        "default",
        &format!("{{.status.conditions[?(@.type==\"{type_}\")].reason}}: {{.status.conditions[?(@.type==\"{type_}\")].message}}"),
        Duration::from_secs(60),
        |m| m.starts_with(&format!("{reason}: ")),
    )?;
    Ok(said[reason.len() + 2..].to_string())
}

/// Two claims no pod mounts, one Immediate, one WaitForFirstConsumer (not even provisioned
/// until a pod is scheduled): the operator holds both, the copy is exact, and afterwards no
/// holder is left and the volumes are detached. No pod is made by the test.
pub fn claims_no_pod_mounts(tier: &KubeTier, _: &Path) -> Result<()> {
    claim(tier, "default", "held-src", "ferry-csi", "ReadWriteOnce")?;
    claim(
        tier,
        "default",
        "held-dst",
        "ferry-csi-wffc",
        "ReadWriteOnce",
    )?;
    tier.wait_claim_bound("default", "held-src")?;
    let src = volume_dir(tier, "default", "held-src")?.join("data");
    rich_tree(&src)?;
    ensure!(
        tier.get("pvc/held-dst", "default", "{.status.phase}")? == "Pending",
        "the WaitForFirstConsumer claim was bound before any pod used it"
    );
    // Every holder pod the operator makes, as it is made.
    let holders = tier.watch_labelled("pods", "default", HOLDER, "{.object.metadata.name}")?;
    std::thread::sleep(Duration::from_millis(500));
    job(tier, "held", "held-src", "held-dst")?;
    tier.wait_succeeded("default", "held", 180)?;
    assert_same_tree(&src, &volume_dir(tier, "default", "held-dst")?.join("copy"))?;
    let uid = tier.get("copyjob/held", "default", "{.metadata.uid}")?;
    let short = uid.replace('-', "");
    let seen = holders.seen();
    for end in ["source", "destination"] {
        let name = format!("ferry-holder-{}-{end}", &short[..8]);
        ensure!(
            seen.iter().any(|s| s.contains(&name)),
            "no {end} holder {name} was seen: {seen:?}"
        );
    }
    all_let_go(tier, "default")?;
    detached(tier, &["held-src", "held-dst"])?;
    Ok(())
}

/// A claim a user's pod mounts is copied where that pod has it: Ferry makes no holder for
/// it (a second mount of a ReadWriteOnce volume), only for the destination, and the pod
/// runs on undisturbed.
pub fn claim_in_use(tier: &KubeTier, _: &Path) -> Result<()> {
    claim(tier, "default", "app-data", "ferry-csi", "ReadWriteOnce")?;
    claim(tier, "default", "app-copy", "ferry-csi", "ReadWriteOnce")?;
    tier.wait_claim_bound("default", "app-data")?;
    let src = volume_dir(tier, "default", "app-data")?.join("data");
    dated_tree(&src, 200)?;
    user_pod(tier, "default", "app", "app-data")?;
    let app_uid = tier.get("pod/app", "default", "{.metadata.uid}")?;
    let holders = tier.watch_labelled(
        "pods",
        "default",
        HOLDER,
        "{.object.metadata.name} {.object.metadata.labels.ferry\\.dev/holds}",
    )?;
    std::thread::sleep(Duration::from_millis(500));
    job(tier, "from-app", "app-data", "app-copy")?;
    tier.wait_succeeded("default", "from-app", 180)?;
    assert_same_tree(&src, &volume_dir(tier, "default", "app-copy")?.join("copy"))?;
    let seen = holders.seen();
    ensure!(
        !seen.iter().any(|s| s.ends_with(" source")),
        "a holder was made for a claim the user's pod mounts: {seen:?}"
    );
    ensure!(
        seen.iter().any(|s| s.ends_with(" destination")),
        "no holder was made for the destination no pod mounts: {seen:?}"
    );
    let (phase, uid) = (
        tier.get("pod/app", "default", "{.status.phase}")?,
        tier.get("pod/app", "default", "{.metadata.uid}")?,
    );
    ensure!(
        phase == "Running" && uid == app_uid,
        "the user's pod is {phase} (uid {uid}, was {app_uid})"
    );
    all_let_go(tier, "default")?;
    tier.kubectl_ok(&["delete", "pod", "app", "-n", "default", "--wait=true"])?;
    Ok(())
}

/// A ReadWriteOncePod claim in use by a user's pod is not shared: the job waits with
/// `VolumeInUse`, naming the pod to stop; once it stops, a holder mounts the claim and the
/// copy is made.
pub fn exclusive_claim_in_use(tier: &KubeTier, _: &Path) -> Result<()> {
    claim(tier, "default", "solo", "ferry-csi", "ReadWriteOncePod")?;
    claim(tier, "default", "solo-copy", "ferry-csi", "ReadWriteOnce")?;
    tier.wait_claim_bound("default", "solo")?;
    let src = volume_dir(tier, "default", "solo")?.join("data");
    dated_tree(&src, 50)?;
    user_pod(tier, "default", "solo-user", "solo")?;
    job(tier, "from-solo", "solo", "solo-copy")?;
    let message = waits_with(tier, "from-solo", "VolumeInUse")?;
    ensure!(
        message.contains("pod \"solo-user\"") && message.contains("stop that pod"),
        "the message does not say which pod to stop: {message}"
    );
    ensure!(
        tier.get(
            "copyjob/from-solo",
            "default",
            "{.status.progress.filesDone}"
        )?
        .parse::<u64>()
        .unwrap_or(0)
            == 0,
        "files were copied while the claim's one user had it"
    );
    tier.kubectl_ok(&["delete", "pod", "solo-user", "-n", "default", "--wait=true"])?;
    tier.wait_succeeded("default", "from-solo", 180)?;
    assert_same_tree(
        &src,
        &volume_dir(tier, "default", "solo-copy")?.join("copy"),
    )?;
    all_let_go(tier, "default")
}

/// A job cannot name another namespace's claim or snapshot: a claim (or VolumeSnapshot) of
/// namespace `other-team` with the name the job gives is not used (`PVCNotFound`,
/// `SnapshotNotFound`), nothing is restored from it, and no holder mounts it.
pub fn other_namespaces_claim(tier: &KubeTier, _: &Path) -> Result<()> {
    tier.kubectl_ok(&["create", "namespace", "other-team"])?;
    claim(tier, "other-team", "secrets", "ferry-csi", "ReadWriteOnce")?;
    claim(tier, "default", "stolen", "ferry-csi", "ReadWriteOnce")?;
    tier.wait_claim_bound("other-team", "secrets")?;
    job(tier, "steal", "secrets", "stolen")?;
    tier.apply("apiVersion: snapshot.storage.k8s.io/v1\nkind: VolumeSnapshot\nmetadata: {name: theirs, namespace: other-team}\nspec: {source: {persistentVolumeClaimName: secrets}}\n")?;
    tier.apply("apiVersion: ferry.dev/v1alpha1\nkind: CopyJob\nmetadata: {name: steal-snapshot, namespace: default}\nspec:\n  source: {snapshot: theirs}\n  destination: {pvc: stolen, path: copy}\n")?;
    let message = waits_with(tier, "steal-snapshot", "SnapshotNotFound")?;
    ensure!(
        message.contains("snapshots of other namespaces cannot be used"),
        "{message}"
    );
    let uid = tier.get("copyjob/steal-snapshot", "default", "{.metadata.uid}")?;
    ensure!(
        tier.get(
            &format!("pvc/ferry-restore-{uid}"),
            "default",
            "{.metadata.name}"
        )?
        .is_empty(),
        "a claim was restored from another namespace's snapshot"
    );
    tier.kubectl_ok(&[
        "delete",
        "copyjob",
        "steal-snapshot",
        "-n",
        "default",
        "--wait=true",
    ])?;
    let message = waits_with(tier, "steal", "PVCNotFound")?;
    ensure!(
        message.contains("other namespaces cannot be used"),
        "{message}"
    );
    for ns in ["default", "other-team"] {
        let pods = holder_pods(tier, ns)?;
        ensure!(pods.trim().is_empty(), "holders in {ns}: {pods}");
    }
    tier.kubectl_ok(&["delete", "copyjob", "steal", "-n", "default", "--wait=true"])?;
    Ok(())
}

/// Deleting a job mid-copy (a `copyMethod: Snapshot` one) removes its holders, the snapshot
/// it took and the claim it restored, and releases the volumes (run while the agent is
/// slowed down, so the copy is still going when the job is deleted); the source is
/// untouched and the claims stay.
pub fn deleted_mid_copy(tier: &KubeTier, _: &Path) -> Result<()> {
    claim(tier, "default", "slow-src", "ferry-csi", "ReadWriteOnce")?;
    claim(
        tier,
        "default",
        "slow-dst",
        "ferry-csi-wffc",
        "ReadWriteOnce",
    )?;
    tier.wait_claim_bound("default", "slow-src")?;
    let src = volume_dir(tier, "default", "slow-src")?.join("data");
    dated_tree(&src, 400)?;
    let before = tree_meta(&src)?;
    tier.apply("apiVersion: ferry.dev/v1alpha1\nkind: CopyJob\nmetadata: {name: slow, namespace: default}\nspec:\n  source: {pvc: slow-src, path: data, copyMethod: Snapshot}\n  destination: {pvc: slow-dst, path: copy}\n")?;
    let uid = tier.get("copyjob/slow", "default", "{.metadata.uid}")?;
    tier.wait_until(
        "copyjob/slow",
        "default",
        "{.status.progress.filesDone}",
        Duration::from_secs(120),
        |n| n.parse::<u64>().is_ok_and(|n| n >= 20),
    )?;
    let holders = holder_pods(tier, "default")?;
    ensure!(
        holders.lines().count() == 2,
        "mid-copy, the holders are: {holders:?}"
    );
    tier.kubectl_ok(&[
        "delete",
        "copyjob",
        "slow",
        "-n",
        "default",
        "--wait=true",
        "--timeout=60s",
    ])?;
    all_let_go(tier, "default")?;
    snapshot_objects_gone(tier, &uid)?;
    detached(tier, &["slow-src", "slow-dst"])?;
    ensure!(tree_meta(&src)? == before, "the source changed");
    for c in ["slow-src", "slow-dst"] {
        ensure!(
            tier.get(&format!("pvc/{c}"), "default", "{.status.phase}")? == "Bound",
            "claim {c} is not Bound any more"
        );
    }
    Ok(())
}

/// A file rewritten over and over under `dir` (write then rename, so each version is
/// whole) until the returned guard is dropped: an application that keeps writing.
struct Writer {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<u64>>,
}

impl Writer {
    fn start(dir: &Path) -> Writer {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (flag, dir) = (stop.clone(), dir.to_path_buf());
        let thread = std::thread::spawn(move || {
            let mut n = 0u64;
            while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                n += 1;
                let tmp = dir.join(".writing");
                let _ = std::fs::write(&tmp, format!("version {n}\n").repeat(100));
                let _ = std::fs::rename(&tmp, dir.join(format!("d{}/live-{}", n % 10, n % 50)));
                std::thread::sleep(Duration::from_millis(5));
            }
            n
        });
        Writer {
            stop,
            thread: Some(thread),
        }
    }

    /// Stop writing; how many versions were written.
    fn stop(mut self) -> u64 {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.take().and_then(|t| t.join().ok()).unwrap_or(0)
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// A VolumeSnapshot of claim `claim` in `default`, ready; the driver's directory holding it.
pub(super) fn snapshot(tier: &KubeTier, name: &str, claim: &str) -> Result<PathBuf> {
    tier.apply(&format!(
        "apiVersion: snapshot.storage.k8s.io/v1\nkind: VolumeSnapshot\nmetadata: {{name: {name}, namespace: default}}\nspec: {{source: {{persistentVolumeClaimName: {claim}}}}}\n"
    ))?;
    snapshot_dir(tier, name)
}

/// The driver's directory of VolumeSnapshot `name` in `default`, once it is ready.
fn snapshot_dir(tier: &KubeTier, name: &str) -> Result<PathBuf> {
    tier.wait_until(
        &format!("volumesnapshot/{name}"),
        "default",
        "{.status.readyToUse}",
        Duration::from_secs(60),
        |r| r == "true",
    )?;
    let content = tier.get(
        &format!("volumesnapshot/{name}"),
        "default",
        "{.status.boundVolumeSnapshotContentName}",
    )?;
    let handle = tier.get(
        &format!("volumesnapshotcontent/{content}"),
        "",
        "{.status.snapshotHandle}",
    )?;
    ensure!(
        !handle.is_empty(),
        "content {content} has no snapshot handle"
    );
    Ok(tier.csi_snapshots().join(handle))
}

/// The job's restored claim and the snapshot it took are gone.
pub(super) fn snapshot_objects_gone(tier: &KubeTier, uid: &str) -> Result<()> {
    gone(tier, &format!("pvc/ferry-restore-{uid}"))?;
    gone(tier, &format!("volumesnapshot/ferry-snapshot-{uid}"))
}

/// Wait (up to 60 s) until object `what` (`kind/name`) of `default` is gone.
pub(super) fn gone(tier: &KubeTier, what: &str) -> Result<()> {
    tier.wait_until(
        what,
        "default",
        "{.metadata.name}",
        Duration::from_secs(60),
        str::is_empty,
    )
    .map(drop)
}

/// A copy from a VolumeSnapshot the user took, while an application keeps writing to the
/// snapshotted claim: the copy is the snapshot's contents exactly, not a mix with what was
/// written since. The user's snapshot stays; the claim it was restored to is deleted.
pub fn snapshot_while_writing(tier: &KubeTier, _: &Path) -> Result<()> {
    claim(tier, "default", "busy", "ferry-csi", "ReadWriteOnce")?;
    claim(
        tier,
        "default",
        "busy-copy",
        "ferry-csi-wffc",
        "ReadWriteOnce",
    )?;
    tier.wait_claim_bound("default", "busy")?;
    let src = volume_dir(tier, "default", "busy")?.join("data");
    dated_tree(&src, 300)?;
    let writer = Writer::start(&src);
    std::thread::sleep(Duration::from_millis(300));
    let taken = snapshot(tier, "busy-at-noon", "busy")?;
    tier.apply("apiVersion: ferry.dev/v1alpha1\nkind: CopyJob\nmetadata: {name: from-snapshot, namespace: default}\nspec:\n  source: {snapshot: busy-at-noon, path: data}\n  destination: {pvc: busy-copy, path: copy}\n")?;
    tier.wait_succeeded("default", "from-snapshot", 180)?;
    let versions = writer.stop();
    let copy = volume_dir(tier, "default", "busy-copy")?.join("copy");
    assert_same_tree(&taken.join("data"), &copy)
        .context("the copy is not the snapshot's contents")?;
    ensure!(
        assert_same_tree(&src, &copy).is_err(),
        "the live source equals the copy: the writer ({versions} versions) changed nothing after the snapshot"
    );
    let uid = tier.get("copyjob/from-snapshot", "default", "{.metadata.uid}")?;
    snapshot_objects_gone(tier, &uid)?;
    ensure!(
        tier.get(
            "volumesnapshot/busy-at-noon",
            "default",
            "{.status.readyToUse}"
        )? == "true",
        "the user's snapshot was touched"
    );
    all_let_go(tier, "default")
}

/// `copyMethod: Snapshot` on a claim a running application has: the operator snapshots it,
/// copies the snapshot, and deletes what it made; what the application writes after the
/// snapshot is not in the copy, and the application runs on undisturbed.
pub fn copy_method_snapshot(tier: &KubeTier, data: &Path) -> Result<()> {
    claim(tier, "default", "db", "ferry-csi", "ReadWriteOnce")?;
    claim(tier, "default", "db-copy", "ferry-csi", "ReadWriteOnce")?;
    tier.wait_claim_bound("default", "db")?;
    let src = volume_dir(tier, "default", "db")?.join("data");
    dated_tree(&src, 200)?;
    // What the source is at the snapshot (cp -a keeps what the comparison looks at).
    let before = data.join("db-before");
    let st = std::process::Command::new("cp")
        .arg("-a")
        .arg(&src)
        .arg(&before)
        .status()?;
    ensure!(st.success(), "cp -a");
    user_pod(tier, "default", "db-app", "db")?;
    tier.apply("apiVersion: ferry.dev/v1alpha1\nkind: CopyJob\nmetadata: {name: point-in-time, namespace: default}\nspec:\n  source: {pvc: db, path: data, copyMethod: Snapshot}\n  destination: {pvc: db-copy, path: copy}\n")?;
    let uid = tier.get("copyjob/point-in-time", "default", "{.metadata.uid}")?;
    let taken = format!("ferry-snapshot-{uid}");
    snapshot_dir(tier, &taken)?;
    // After the snapshot: changed, added and removed files.
    std::fs::write(src.join("d1/f1"), "written after the snapshot\n")?;
    std::fs::write(src.join("after"), "new\n")?;
    std::fs::remove_file(src.join("d2/f2"))?;
    tier.wait_succeeded("default", "point-in-time", 180)?;
    let copy = volume_dir(tier, "default", "db-copy")?.join("copy");
    assert_same_tree(&before, &copy).context("the copy is not the source at the snapshot")?;
    snapshot_objects_gone(tier, &uid)?;
    let (phase, app) = (
        tier.get("pod/db-app", "default", "{.status.phase}")?,
        tier.get(
            "pod/db-app",
            "default",
            "{.status.containerStatuses[0].restartCount}",
        )?,
    );
    ensure!(
        phase == "Running" && app == "0",
        "the application is {phase} after {app} restarts"
    );
    all_let_go(tier, "default")?;
    tier.kubectl_ok(&["delete", "pod", "db-app", "-n", "default", "--wait=true"])?;
    Ok(())
}
