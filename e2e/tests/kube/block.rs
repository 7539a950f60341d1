//! Block claims on the tier's CSI driver (loop devices), reached the way a block CopyJob
//! reaches them (docs/copyjob.md, "Raw block claims"): a holder pod, restricted,
//! with the claim as `volumeDevices`, runs `ferry-agent hold-block`; the receiving side
//! finds its socket through the kubelet's pod directory, takes the descriptor, and accepts it
//! only if its `st_rdev` is the device node the kubelet made for that volume and that pod.
//! The first check makes such pods itself and takes the descriptors in the test process,
//! as the agent does (the process-tier test `agent/tests/handoff.rs` shows it working from
//! inside a device cgroup that refuses every block device); the others are CopyJobs, with
//! the operator's holders and the agent's block shard.

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
pub(super) fn volume(tier: &KubeTier, name: &str) -> Result<(PathBuf, String)> {
    let pv = tier.get(&format!("pvc/{name}"), "default", "{.spec.volumeName}")?;
    ensure!(!pv.is_empty(), "claim {name} has no volume");
    let handle = tier.get(&format!("pv/{pv}"), "", "{.spec.csi.volumeHandle}")?;
    let mode = tier.get(&format!("pv/{pv}"), "", "{.spec.volumeMode}")?;
    ensure!(mode == "Block", "volume {pv} is {mode:?}, not Block");
    Ok((tier.csi_volumes().join(handle), pv))
}

pub fn held_and_handed_over(tier: &KubeTier, _: &std::path::Path) -> Result<()> {
    block_claims(tier, &[("blk-src", "64Mi"), ("blk-dst", "64Mi")])?;
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
        // Every written chunk read back, and the first punched one.
        sum.verified == sum.written + 1 && sum.written > 0 && sum.punched > 0,
        "{sum:?}"
    );
    drop((src, dst));
    ensure!(
        std::fs::read(&src_file)? == std::fs::read(&dst_file)?,
        "the destination volume's bytes differ from the source's"
    );

    delete(
        tier,
        &["pod/hold-src", "pod/hold-dst", "pvc/blk-src", "pvc/blk-dst"],
    )
}

/// Block claims (`name`, `size`) on ferry-csi in `default`, bound.
pub(super) fn block_claims(tier: &KubeTier, claims: &[(&str, &str)]) -> Result<()> {
    for (name, size) in claims {
        tier.apply(&format!(
            "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  storageClassName: ferry-csi\n  volumeMode: Block\n  accessModes: [ReadWriteOnce]\n  resources: {{requests: {{storage: {size}}}}}\n"
        ))?;
    }
    for (name, _) in claims {
        tier.wait_claim_bound("default", name)?;
    }
    Ok(())
}

/// Delete each of `objects` (`kind/name`) in `default`, waiting until it is gone.
pub(super) fn delete(tier: &KubeTier, objects: &[&str]) -> Result<()> {
    for what in objects {
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

/// A CopyJob in `default` between claims, with `extra` spec lines (two spaces in).
fn block_job(tier: &KubeTier, name: &str, src: &str, dst: &str, extra: &str) -> Result<()> {
    tier.apply(&format!(
        "apiVersion: ferry.dev/v1alpha1\nkind: CopyJob\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  source: {{pvc: {src}}}\n  destination: {{pvc: {dst}}}\n{extra}"
    ))
}

/// `file` (a disk image) mounted read-only at a new directory while the guard lives.
struct Mounted {
    dir: tempfile::TempDir,
}

impl Mounted {
    fn image(file: &std::path::Path, options: &str) -> Result<Self> {
        let dir = tempfile::tempdir()?;
        run(
            "mount",
            &[
                "-o",
                options,
                &file.to_string_lossy(),
                &dir.path().to_string_lossy(),
            ],
        )?;
        Ok(Self { dir })
    }
    fn path(&self) -> &std::path::Path {
        self.dir.path()
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = run("umount", &[&self.dir.path().to_string_lossy()]);
    }
}

fn run(program: &str, args: &[&str]) -> Result<()> {
    let out = std::process::Command::new(program).args(args).output()?;
    ensure!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// Until job `name`'s Accepted condition is False with `reason`; its message.
fn refused_with(tier: &KubeTier, name: &str, reason: &str) -> Result<String> {
    super::csi::condition_with(tier, name, "Accepted", reason)
}

/// The agents' log lines (each prefixed with its pod) that `keep` accepts.
pub(super) fn agent_lines(tier: &KubeTier, keep: impl Fn(&str) -> bool) -> Result<Vec<String>> {
    let logs = tier.kubectl_ok(&[
        "logs",
        "-n",
        super::NS,
        "-l",
        "app.kubernetes.io/component=agent",
        "--tail=-1",
        "--prefix",
    ])?;
    Ok(logs.lines().filter(|l| keep(l)).map(String::from).collect())
}

/// The agents' log lines that say job `default/<job>` copied a device.
pub(super) fn copied_lines(tier: &KubeTier, job: &str) -> Result<Vec<String>> {
    agent_lines(tier, |l| {
        l.contains("block shard copied") && l.contains(&format!("default/{job}\""))
    })
}

/// Run block job `name` from claim `src` onto `dst` (with `extra` spec lines) to success,
/// its holders let go; the agent's one "block shard copied" line for it.
fn copied(tier: &KubeTier, name: &str, src: &str, dst: &str, extra: &str) -> Result<String> {
    block_job(tier, name, src, dst, extra)?;
    finished(tier, name)
}

/// Block job `name` (applied) run to success, its holders let go; the agent's one "block
/// shard copied" line for it.
pub(super) fn finished(tier: &KubeTier, name: &str) -> Result<String> {
    tier.wait_succeeded("default", name, 180)?;
    super::csi::all_let_go(tier, "default")?;
    copied_lines(tier, name)?
        .into_iter()
        .next()
        .with_context(|| format!("no block copy logged for job {name}"))
}

/// `key=<number>` in a log line.
pub(super) fn field(line: &str, key: &str) -> Option<u64> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{key}=")))
        .and_then(|v| v.parse().ok())
}

/// A block CopyJob, as a user writes it: a claim holding an ext4 filesystem and large zero
/// runs copied onto another by the operator's holders and the agent (no pod made by the
/// test), mounted afterwards and compared file by file, the destination's image sparse; a
/// re-run after 1 MiB in the middle changed writes one or two chunks; and what a user can
/// get wrong refused by name before any pod is made.
pub fn copyjob_between_claims(tier: &KubeTier, _: &std::path::Path) -> Result<()> {
    block_claims(
        tier,
        &[
            ("disk-a", "128Mi"),
            ("disk-b", "128Mi"),
            ("disk-small", "64Mi"),
        ],
    )?;
    tier.apply("apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {name: disk-fs, namespace: default}\nspec:\n  storageClassName: ferry-csi\n  accessModes: [ReadWriteOnce]\n  resources: {requests: {storage: 64Mi}}\n")?;
    tier.wait_claim_bound("default", "disk-fs")?;
    let (a_file, _) = volume(tier, "disk-a")?;
    let (b_file, _) = volume(tier, "disk-b")?;
    // An ext4 filesystem on the source, with a tree and 8 MiB of random data; the rest of
    // the 128 MiB is zeros.
    run(
        "mkfs.ext4",
        &[
            "-q",
            "-F",
            "-E",
            "lazy_itable_init=0,lazy_journal_init=0",
            &a_file.to_string_lossy(),
        ],
    )?;
    {
        let fs = Mounted::image(&a_file, "loop")?;
        super::rich_tree(&fs.path().join("data"))?;
        let noise: Vec<u8> = (0..8 * MIB)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        std::fs::write(fs.path().join("data/noise.bin"), noise)?;
    }

    // What a user can get wrong: refused by name, and no holder made for it.
    block_job(tier, "disk-default", "disk-a", "disk-b", "")?;
    let why = refused_with(tier, "disk-default", "NotForBlock")?;
    ensure!(why.contains("overwrite: Always"), "{why}");
    block_job(
        tier,
        "disk-small",
        "disk-a",
        "disk-small",
        "  overwrite: Always\n",
    )?;
    let why = refused_with(tier, "disk-small", "DestinationTooSmall")?;
    ensure!(why.contains(&(128 * MIB).to_string()), "{why}");
    block_job(
        tier,
        "disk-to-fs",
        "disk-a",
        "disk-fs",
        "  overwrite: Always\n",
    )?;
    refused_with(tier, "disk-to-fs", "VolumeModeMismatch")?;
    block_job(
        tier,
        "disk-path",
        "disk-a",
        "disk-b",
        "  overwrite: Always\n  exclude: [\"*.tmp\"]\n",
    )?;
    let why = refused_with(tier, "disk-path", "NotForBlock")?;
    ensure!(why.contains("spec.exclude"), "{why}");
    for job in ["disk-default", "disk-small", "disk-to-fs", "disk-path"] {
        tier.kubectl_ok(&["delete", "copyjob", job, "-n", "default", "--wait=true"])?;
    }
    let holders = super::csi::holder_pods(tier, "default")?;
    ensure!(
        holders.trim().is_empty(),
        "holders made for refused jobs: {holders}"
    );

    // The copy.
    block_job(tier, "disk", "disk-a", "disk-b", "  overwrite: Always\n")?;
    tier.wait_succeeded("default", "disk", 180)?;
    let bytes = tier.get("copyjob/disk", "default", "{.status.progress.bytesDone}")?;
    ensure!(bytes == (128 * MIB).to_string(), "bytesDone {bytes}");
    let manifest = tier.get("copyjob/disk", "default", "{.status.manifest}")?;
    ensure!(
        manifest.is_empty() || manifest == "null",
        "a manifest named on the device: {manifest}"
    );
    super::csi::all_let_go(tier, "default")?;
    ensure!(
        std::fs::read(&a_file)? == std::fs::read(&b_file)?,
        "the destination's bytes differ from the source's"
    );
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(&b_file)?;
    ensure!(
        meta.blocks() * 512 < 64 * MIB,
        "the destination's image is not sparse: {} bytes allocated of {}",
        meta.blocks() * 512,
        meta.len()
    );
    {
        let (a, b) = (
            Mounted::image(&a_file, "loop,ro,noload")?,
            Mounted::image(&b_file, "loop,ro,noload")?,
        );
        ferry_e2e::assert_same_tree(&a.path().join("data"), &b.path().join("data"))?;
    }
    let first = copied_lines(tier, "disk")?;
    ensure!(
        first.len() == 1,
        "one block copy logged for the job: {first:?}"
    );

    // 1 MiB in the middle changed; a re-run by hashes writes only its chunk(s).
    let f = std::fs::OpenOptions::new().write(true).open(&a_file)?;
    f.write_all_at(&vec![0xA5; MIB as usize], 64 * MIB - MIB / 2)?;
    f.sync_all()?;
    let by_hashes = "  overwrite: IfChanged\n  compare: Checksum\n";
    let line = &copied(tier, "disk-again", "disk-a", "disk-b", by_hashes)?;
    ensure!(
        std::fs::read(&a_file)? == std::fs::read(&b_file)?,
        "the re-run left the destination different"
    );
    let (written, unchanged) = (field(line, "written"), field(line, "unchanged"));
    ensure!(written == Some(2) && unchanged == Some(30), "the re-run wrote {written:?} chunks and kept {unchanged:?} (1 MiB across a chunk boundary: 2 of 32): {line}");
    // Nothing wrote the destination since the first copy (its loop device's backing file is
    // as that copy left it): its hashes came from the manifest the agent kept, unread.
    ensure!(
        line.contains("kept=true") && field(line, "read_destination") == Some(0),
        "the re-run read the destination instead of trusting the kept manifest: {line}"
    );

    // Someone writes the destination's file behind Ferry's back: the kept manifest no longer
    // stands for it, so the next re-run reads the destination and puts the chunk right.
    let g = std::fs::OpenOptions::new().write(true).open(&b_file)?;
    g.write_all_at(&vec![0x3C; MIB as usize], 16 * MIB)?;
    g.sync_all()?;
    let line = &copied(tier, "disk-third", "disk-a", "disk-b", by_hashes)?;
    ensure!(
        std::fs::read(&a_file)? == std::fs::read(&b_file)?,
        "a write to the destination after the kept manifest was not undone"
    );
    ensure!(
        line.contains("kept=false")
            && field(line, "read_destination") == Some(128 * MIB)
            && field(line, "written") == Some(1),
        "after the destination was written behind Ferry's back, the re-run should read it whole and write the one changed chunk: {line}"
    );

    delete(
        tier,
        &[
            "copyjob/disk",
            "copyjob/disk-again",
            "copyjob/disk-third",
            "pvc/disk-a",
            "pvc/disk-b",
            "pvc/disk-small",
            "pvc/disk-fs",
        ],
    )
}

/// The agent killed in the middle of a block copy (slowed by FERRY_FAULT_CHUNK_DELAY_MS:
/// run from the slowed phase): the next agent resumes at the chunks the journal lacks, not
/// from the start, and the destination is the source's bytes.
pub fn agent_killed_mid_copy(tier: &KubeTier, _: &std::path::Path) -> Result<()> {
    block_claims(tier, &[("kill-a", "256Mi"), ("kill-b", "256Mi")])?;
    let (a_file, _) = volume(tier, "kill-a")?;
    let (b_file, _) = volume(tier, "kill-b")?;
    let f = std::fs::OpenOptions::new().write(true).open(&a_file)?;
    for i in 0..32u64 {
        let chunk: Vec<u8> = (0..4 * MIB).map(|b| (b as u8) ^ (i as u8 * 7)).collect();
        f.write_all_at(&chunk, i * 8 * MIB)?;
    }
    f.sync_all()?;
    block_job(tier, "kill", "kill-a", "kill-b", "  overwrite: Always\n")?;
    tier.wait_until(
        "copyjob/kill",
        "default",
        "{.status.progress.bytesDone}",
        Duration::from_secs(120),
        |n| n.parse::<u64>().is_ok_and(|n| n >= 128 * MIB),
    )?;
    let agents = super::pods(tier, "agent")?;
    let agent = agents.first().context("no agent pod")?;
    tier.kubectl_ok(&["delete", "pod", agent, "-n", super::NS, "--wait=false"])?;
    tier.wait_succeeded("default", "kill", 240)?;
    super::csi::all_let_go(tier, "default")?;
    ensure!(
        std::fs::read(&a_file)? == std::fs::read(&b_file)?,
        "after the agent was killed mid-copy the destination's bytes differ from the source's"
    );
    let lines = copied_lines(tier, "kill")?;
    let line = lines
        .first()
        .context("the new agent logged no block copy for the job")?;
    let resumed = field(line, "resumed").unwrap_or(0);
    ensure!(
        (16..64).contains(&resumed),
        "the new agent resumed {resumed} of 64 chunks (at least the 16 flushed before the kill, not all): {line}"
    );
    delete(tier, &["copyjob/kill", "pvc/kill-a", "pvc/kill-b"])
}

/// A user's pod that has block claim `claim` as a device and does nothing (the Ferry
/// image's pause, restricted): the claim is in use.
fn block_user(tier: &KubeTier, name: &str, claim: &str) -> Result<()> {
    let image = super::csi::holder_image(tier)?;
    tier.apply(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  terminationGracePeriodSeconds: 1\n  automountServiceAccountToken: false\n  securityContext: {{runAsNonRoot: true, runAsUser: 65534, seccompProfile: {{type: RuntimeDefault}}}}\n  containers:\n  - name: app\n    image: {image}\n    args: [pause]\n    securityContext: {{allowPrivilegeEscalation: false, capabilities: {{drop: [ALL]}}}}\n    volumeDevices: [{{name: data, devicePath: /dev/data}}]\n  volumes:\n  - {{name: data, persistentVolumeClaim: {{claimName: {claim}}}}}\n"
    ))?;
    tier.wait_pod_ready("default", name, 90)
}

/// A block claim's snapshot as a CopyJob's source, as a user writes it: `copyMethod:
/// Snapshot` of a block claim a running pod has (a direct copy would wait for it), restored
/// as a block claim and copied onto a block claim; a VolumeSnapshot the user took, restored
/// and copied after the claim changed (the copy is the snapshot's bytes, re-run by chunk
/// hashes); a filesystem destination refused before anything is snapshotted or restored;
/// what the jobs made deleted after them, but for the snapshot `copyMethod: Snapshot` took,
/// kept as the destination's base (changed-block tracking is on here) until it is deleted.
pub fn copyjob_from_block_snapshot(tier: &KubeTier, _: &std::path::Path) -> Result<()> {
    block_claims(tier, &[("snap-a", "64Mi"), ("snap-b", "64Mi")])?;
    tier.apply("apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {name: snap-fs, namespace: default}\nspec:\n  storageClassName: ferry-csi\n  accessModes: [ReadWriteOnce]\n  resources: {requests: {storage: 64Mi}}\n")?;
    tier.wait_claim_bound("default", "snap-fs")?;
    let (a_file, _) = volume(tier, "snap-a")?;
    let (b_file, _) = volume(tier, "snap-b")?;
    let f = std::fs::OpenOptions::new().write(true).open(&a_file)?;
    for i in 0..6u64 {
        let chunk: Vec<u8> = (0..2 * MIB).map(|b| (b as u8) ^ (i as u8 * 31)).collect();
        f.write_all_at(&chunk, i * 10 * MIB)?;
    }
    f.sync_all()?;
    let first = std::fs::read(&a_file)?;
    block_user(tier, "snap-user", "snap-a")?;

    // A filesystem destination: refused before a snapshot is taken.
    let snapshot_job = |name: &str, dst: &str, extra: &str| {
        tier.apply(&format!(
            "apiVersion: ferry.dev/v1alpha1\nkind: CopyJob\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  source: {{pvc: snap-a, copyMethod: Snapshot}}\n  destination: {{pvc: {dst}}}\n{extra}"
        ))
    };
    snapshot_job("snap-to-fs", "snap-fs", "  overwrite: Always\n")?;
    let why = refused_with(tier, "snap-to-fs", "VolumeModeMismatch")?;
    ensure!(why.contains("snapshot"), "{why}");
    let uid = tier.get("copyjob/snap-to-fs", "default", "{.metadata.uid}")?;
    for made in [
        format!("volumesnapshot/ferry-snapshot-{uid}"),
        format!("pvc/ferry-restore-{uid}"),
    ] {
        let name = tier.get(&made, "default", "{.metadata.name}")?;
        ensure!(name.is_empty(), "{made} was made for a refused job");
    }

    // copyMethod Snapshot while the user's pod has the claim.
    snapshot_job("snap-copy", "snap-b", "  overwrite: Always\n")?;
    tier.wait_succeeded("default", "snap-copy", 180)?;
    let uid = tier.get("copyjob/snap-copy", "default", "{.metadata.uid}")?;
    super::csi::all_let_go(tier, "default")?;
    ensure!(
        std::fs::read(&b_file)? == first,
        "the copy from the claim's snapshot differs from the claim's bytes"
    );
    let lines = copied_lines(tier, "snap-copy")?;
    // Logged by a block shard only: the restored claim was a block claim.
    ensure!(lines.len() == 1, "one block copy logged: {lines:?}");
    // The restored claim goes; the snapshot stays as snap-b's base (changed-block
    // tracking is on in this tier: cbt.rs), until snap-b goes.
    super::csi::gone(tier, &format!("pvc/ferry-restore-{uid}"))?;
    let base = format!("volumesnapshot/ferry-snapshot-{uid}");
    let b_uid = tier.get("pvc/snap-b", "default", "{.metadata.uid}")?;
    let label = tier.get(&base, "default", "{.metadata.labels.ferry\\.dev/base-for}")?;
    ensure!(
        label == b_uid,
        "the taken snapshot is not kept as snap-b's base: {label:?}"
    );

    // The user's own snapshot, then the claim changes: the copy is the snapshot's bytes,
    // and the destination (a copy of the same bytes) has nothing to write.
    super::csi::snapshot(tier, "snap-a-then", "snap-a")?;
    f.write_all_at(&vec![0x5A; MIB as usize], 40 * MIB)?;
    f.sync_all()?;
    tier.apply("apiVersion: ferry.dev/v1alpha1\nkind: CopyJob\nmetadata: {name: snap-named, namespace: default}\nspec:\n  source: {snapshot: snap-a-then}\n  destination: {pvc: snap-b}\n  overwrite: IfChanged\n  compare: Checksum\n")?;
    tier.wait_succeeded("default", "snap-named", 180)?;
    super::csi::all_let_go(tier, "default")?;
    ensure!(
        std::fs::read(&b_file)? == first,
        "the copy from the user's snapshot is not the snapshot's bytes"
    );
    let lines = copied_lines(tier, "snap-named")?;
    let line = lines
        .first()
        .context("no block copy logged for the snapshot's job")?;
    let (written, unchanged) = (field(line, "written"), field(line, "unchanged"));
    ensure!(
        written == Some(0) && unchanged == Some(16),
        "the destination already held the snapshot's bytes, yet {written:?} chunks were written ({unchanged:?} kept): {line}"
    );
    let snap = tier.get("volumesnapshot/snap-a-then", "default", "{.metadata.name}")?;
    ensure!(snap == "snap-a-then", "the user's snapshot was deleted");
    let uid = tier.get("copyjob/snap-named", "default", "{.metadata.uid}")?;
    super::csi::snapshot_objects_gone(tier, &uid)?;

    delete(
        tier,
        &[
            "copyjob/snap-to-fs",
            "copyjob/snap-copy",
            "copyjob/snap-named",
            "volumesnapshot/snap-a-then",
            "pod/snap-user",
            "pvc/snap-a",
            "pvc/snap-b",
            "pvc/snap-fs",
        ],
    )?;
    super::csi::gone(tier, &base).context("snap-b's base stayed after snap-b was deleted")
}
