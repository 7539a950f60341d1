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
fn claim(tier: &KubeTier, ns: &str, name: &str, class: &str, modes: &str) -> Result<()> {
    tier.apply(&format!(
        "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {{name: {name}, namespace: {ns}}}\nspec:\n  storageClassName: {class}\n  accessModes: [{modes}]\n  resources: {{requests: {{storage: 1Gi}}}}\n"
    ))
}

/// Where the driver keeps the volume bound to claim `ns/name`, on the host: the test
/// writes a source there and reads a destination back.
fn volume_dir(tier: &KubeTier, ns: &str, name: &str) -> Result<PathBuf> {
    let pv = tier.get(&format!("pvc/{name}"), ns, "{.spec.volumeName}")?;
    ensure!(!pv.is_empty(), "claim {ns}/{name} has no volume");
    let handle = tier.get(&format!("pv/{pv}"), "", "{.spec.csi.volumeHandle}")?;
    ensure!(!handle.is_empty(), "volume {pv} is not a CSI volume");
    Ok(tier.csi_volumes().join(handle))
}

/// A user's pod that mounts `claim` read-write and does nothing (the Ferry image's pause,
/// under the restricted Pod Security profile).
fn user_pod(tier: &KubeTier, ns: &str, name: &str, claim: &str) -> Result<()> {
    let image = tier.get(
        "deploy/ferry-operator",
        NS,
        "{.spec.template.spec.containers[0].env[?(@.name==\"FERRY_HOLDER_IMAGE\")].value}",
    )?;
    ensure!(!image.is_empty(), "the operator has no FERRY_HOLDER_IMAGE");
    tier.apply(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: {ns}}}\nspec:\n  terminationGracePeriodSeconds: 1\n  automountServiceAccountToken: false\n  securityContext: {{runAsNonRoot: true, runAsUser: 65534, seccompProfile: {{type: RuntimeDefault}}}}\n  containers:\n  - name: app\n    image: {image}\n    args: [pause]\n    securityContext: {{allowPrivilegeEscalation: false, capabilities: {{drop: [ALL]}}}}\n    volumeMounts: [{{name: data, mountPath: /data}}]\n  volumes:\n  - {{name: data, persistentVolumeClaim: {{claimName: {claim}}}}}\n"
    ))?;
    tier.kubectl_ok(&[
        "wait",
        "--for=condition=Ready",
        &format!("pod/{name}"),
        "-n",
        ns,
        "--timeout=90s",
    ])
    .map(drop)
}

/// A CopyJob in `default` from claim `src` (path `data`) to claim `dst` (path `copy`).
fn job(tier: &KubeTier, name: &str, src: &str, dst: &str) -> Result<()> {
    tier.apply(&format!(
        "apiVersion: ferry.dev/v1alpha1\nkind: CopyJob\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  source: {{pvc: {src}, path: data}}\n  destination: {{pvc: {dst}, path: copy}}\n"
    ))
}

/// Until no holder pod is left in `ns` and no volume is attached anywhere (the
/// VolumeAttachments csi-attacher made are gone once nothing mounts the volumes).
fn all_let_go(tier: &KubeTier, ns: &str) -> Result<()> {
    wait_for("no holder pod left", Duration::from_secs(60), || {
        tier.kubectl_ok(&["get", "pods", "-n", ns, "-l", HOLDER, "-o", "name"])
            .is_ok_and(|p| p.trim().is_empty())
    })
    .with_context(|| {
        format!(
            "holders: {:?}",
            tier.kubectl_ok(&["get", "pods", "-n", ns, "-l", HOLDER])
        )
    })
}

/// Until no VolumeAttachment is left whose volume is in `pvs`.
fn detached(tier: &KubeTier, pvs: &[&str]) -> Result<()> {
    let attached = || -> Result<Vec<String>> {
        let all = tier.kubectl_ok(&[
            "get",
            "volumeattachments",
            "-o",
            "jsonpath={range .items[*]}{.spec.source.persistentVolumeName}{\"\\n\"}{end}",
        ])?;
        Ok(all
            .lines()
            .filter(|pv| pvs.contains(pv))
            .map(String::from)
            .collect())
    };
    wait_for("the volumes detached", Duration::from_secs(90), || {
        attached().is_ok_and(|a| a.is_empty())
    })
    .with_context(|| format!("still attached: {:?}", attached()))
}

fn pv_of(tier: &KubeTier, ns: &str, claim: &str) -> Result<String> {
    tier.get(&format!("pvc/{claim}"), ns, "{.spec.volumeName}")
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
    let pvs = [
        pv_of(tier, "default", "held-src")?,
        pv_of(tier, "default", "held-dst")?,
    ];
    detached(tier, &[&pvs[0], &pvs[1]])?;
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
    let message = tier.wait_until(
        "copyjob/from-solo",
        "default",
        "{.status.conditions[?(@.type==\"Resolved\")].reason}: {.status.conditions[?(@.type==\"Resolved\")].message}",
        Duration::from_secs(60),
        |m| m.starts_with("VolumeInUse: "),
    )?;
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

/// A job cannot name another namespace's claim: a claim of namespace `other-team` with the
/// name the job gives is not used (`PVCNotFound`), and no holder mounts it.
pub fn other_namespaces_claim(tier: &KubeTier, _: &Path) -> Result<()> {
    tier.kubectl_ok(&["create", "namespace", "other-team"])?;
    claim(tier, "other-team", "secrets", "ferry-csi", "ReadWriteOnce")?;
    claim(tier, "default", "stolen", "ferry-csi", "ReadWriteOnce")?;
    tier.wait_claim_bound("other-team", "secrets")?;
    job(tier, "steal", "secrets", "stolen")?;
    let message = tier.wait_until(
        "copyjob/steal",
        "default",
        "{.status.conditions[?(@.type==\"Resolved\")].reason}: {.status.conditions[?(@.type==\"Resolved\")].message}",
        Duration::from_secs(60),
        |m| m.starts_with("PVCNotFound: "),
    )?;
    ensure!(
        message.contains("other namespaces cannot be used"),
        "{message}"
    );
    for ns in ["default", "other-team"] {
        let pods = tier.kubectl_ok(&["get", "pods", "-n", ns, "-l", HOLDER, "-o", "name"])?;
        ensure!(pods.trim().is_empty(), "holders in {ns}: {pods}");
    }
    tier.kubectl_ok(&["delete", "copyjob", "steal", "-n", "default", "--wait=true"])?;
    Ok(())
}

/// Deleting a job mid-copy removes its holders and releases the volumes (run while the agent
/// is slowed down, so the copy is still going when the job is deleted); the source is
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
    job(tier, "slow", "slow-src", "slow-dst")?;
    tier.wait_until(
        "copyjob/slow",
        "default",
        "{.status.progress.filesDone}",
        Duration::from_secs(120),
        |n| n.parse::<u64>().is_ok_and(|n| n >= 20),
    )?;
    let holders = tier.kubectl_ok(&["get", "pods", "-n", "default", "-l", HOLDER, "-o", "name"])?;
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
    let pvs = [
        pv_of(tier, "default", "slow-src")?,
        pv_of(tier, "default", "slow-dst")?,
    ];
    detached(tier, &[&pvs[0], &pvs[1]])?;
    ensure!(tree_meta(&src)? == before, "the source changed");
    for c in ["slow-src", "slow-dst"] {
        ensure!(
            tier.get(&format!("pvc/{c}"), "default", "{.status.phase}")? == "Bound",
            "claim {c} is not Bound any more"
        );
    }
    Ok(())
}
