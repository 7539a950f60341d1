//! Block claims on the tier's CSI driver (loop devices), reached the way the design says a
//! block CopyJob will reach them (docs/design/block-volumes.md): a holder pod, restricted,
//! with the claim as `volumeDevices`, runs `ferry-agent hold-block`; the receiving side
//! finds its socket through the kubelet's pod directory, takes the descriptor, and accepts it
//! only if its `st_rdev` is the device node the kubelet made for that volume and that pod.
//! The operator does not make these pods yet and the agent does not run block shards yet:
//! here the test makes the pods, and the test process takes the descriptors as the agent will
//! (the process-tier test `agent/tests/handoff.rs` shows it working from inside a device
//! cgroup that refuses every block device).

use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use ferry_agent::handoff::{claim_rdev, fetch, Expect, HandoffError, SOCKET};
use ferry_e2e::kube::KubeTier;
use ferry_e2e::wait_for;
use ferry_engine::block::{copy_device, BlockOptions};
use ferry_engine::NoProgress;

const MIB: u64 = 1 << 20;

/// The pod the operator will make to hold a block claim: restricted, the claim as a device.
fn holder(tier: &KubeTier, name: &str, claim: &str, write: bool) -> Result<String> {
    let image = super::csi::holder_image(tier)?;
    let write = if write { ", --write" } else { "" };
    tier.apply(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  terminationGracePeriodSeconds: 1\n  automountServiceAccountToken: false\n  securityContext: {{runAsNonRoot: true, runAsUser: 65534, runAsGroup: 65534, seccompProfile: {{type: RuntimeDefault}}}}\n  containers:\n  - name: hold\n    image: {image}\n    args: [hold-block, --device, /dev/ferry-block, --dir, /ferry-fd{write}]\n    securityContext: {{allowPrivilegeEscalation: false, capabilities: {{drop: [ALL]}}}}\n    volumeDevices: [{{name: data, devicePath: /dev/ferry-block}}]\n    volumeMounts: [{{name: ferry-fd, mountPath: /ferry-fd}}]\n  volumes:\n  - {{name: data, persistentVolumeClaim: {{claimName: {claim}}}}}\n  - {{name: ferry-fd, emptyDir: {{}}}}\n"
    ))?;
    tier.wait_pod_ready("default", name, 90)?;
    tier.get(&format!("pod/{name}"), "default", "{.metadata.uid}")
}

/// The volume's file on the host and its PV's name, for block claim `name`.
fn volume(tier: &KubeTier, name: &str) -> Result<(PathBuf, String)> {
    let pv = tier.get(&format!("pvc/{name}"), "default", "{.spec.volumeName}")?;
    ensure!(!pv.is_empty(), "claim {name} has no volume");
    let handle = tier.get(&format!("pv/{pv}"), "", "{.spec.csi.volumeHandle}")?;
    let mode = tier.get(&format!("pv/{pv}"), "", "{.spec.volumeMode}")?;
    ensure!(mode == "Block", "volume {pv} is {mode:?}, not Block");
    Ok((tier.csi_volumes().join(handle), pv))
}

pub fn held_and_handed_over(tier: &KubeTier, _: &std::path::Path) -> Result<()> {
    for name in ["blk-src", "blk-dst"] {
        tier.apply(&format!(
            "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  storageClassName: ferry-csi\n  volumeMode: Block\n  accessModes: [ReadWriteOnce]\n  resources: {{requests: {{storage: 64Mi}}}}\n"
        ))?;
    }
    for name in ["blk-src", "blk-dst"] {
        tier.wait_claim_bound("default", name)?;
    }
    let ((src_file, src_pv), (dst_file, dst_pv)) =
        (volume(tier, "blk-src")?, volume(tier, "blk-dst")?);
    // The source's bytes, written into its volume's file before anything holds it.
    let f = std::fs::OpenOptions::new().write(true).open(&src_file)?;
    for i in 0..8u64 {
        f.write_all_at(&vec![0x40 + i as u8; MIB as usize], i * 8 * MIB + 12_345)?;
    }
    f.sync_all()?;

    let src_uid = holder(tier, "hold-src", "blk-src", false)?;
    let dst_uid = holder(tier, "hold-dst", "blk-dst", true)?;
    let kubelet = tier.kubelet_dir();
    let socket_dir = |uid: &str| {
        kubelet.join(format!(
            "pods/{uid}/volumes/kubernetes.io~empty-dir/ferry-fd"
        ))
    };
    // The node the kubelet made for this volume and this pod: what the design checks against.
    let node = |pv: &str, uid: &str| {
        kubelet.join(format!(
            "plugins/kubernetes.io/csi/volumeDevices/{pv}/dev/{uid}"
        ))
    };
    for uid in [&src_uid, &dst_uid] {
        let sock = socket_dir(uid).join(SOCKET);
        wait_for(
            &format!("{}", sock.display()),
            Duration::from_secs(30),
            || sock.exists(),
        )?;
    }
    let (src_rdev, dst_rdev) = (
        claim_rdev(&node(&src_pv, &src_uid)).context("the kubelet's node for the source")?,
        claim_rdev(&node(&dst_pv, &dst_uid)).context("the kubelet's node for the destination")?,
    );
    ensure!(
        src_rdev != dst_rdev,
        "two claims, one device number {src_rdev}"
    );

    let src = fetch(
        &socket_dir(&src_uid),
        Expect {
            rdev: src_rdev,
            write: false,
        },
    )?;
    match fetch(
        &socket_dir(&src_uid),
        Expect {
            rdev: dst_rdev,
            write: false,
        },
    ) {
        Err(HandoffError::NotTheClaimsDevice { .. }) => {}
        other => anyhow::bail!("the source's device taken for the destination's: {other:?}"),
    }
    let mut dst = fetch(
        &socket_dir(&dst_uid),
        Expect {
            rdev: dst_rdev,
            write: true,
        },
    )?;
    ensure!(
        src.size() == 64 * MIB && dst.size() == 64 * MIB,
        "sizes {} {}",
        src.size(),
        dst.size()
    );
    let sum = copy_device(&src, &mut dst, &BlockOptions::default(), &NoProgress)?;
    ensure!(
        sum.verified == sum.chunks && sum.written > 0 && sum.punched > 0,
        "{sum:?}"
    );
    drop((src, dst));
    ensure!(
        std::fs::read(&src_file)? == std::fs::read(&dst_file)?,
        "the destination volume's bytes differ from the source's"
    );

    for what in ["pod/hold-src", "pod/hold-dst", "pvc/blk-src", "pvc/blk-dst"] {
        tier.kubectl_ok(&[
            "delete",
            what,
            "-n",
            "default",
            "--wait=true",
            "--timeout=60s",
        ])?;
    }
    Ok(())
}
