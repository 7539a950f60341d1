//! Changed-block tracking in the tier: the `csi-snapshot-metadata` sidecar (started by
//! `e2e/kube/up.sh` beside ferry-csi, advertised by its SnapshotMetadataService) asked
//! through `ferry-cbt`, the client Ferry's operator uses, with the tokens a ServiceAccount
//! gets from the API server.

use std::os::unix::fs::FileExt;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use ferry_cbt::{ranges, token, Error, Limits, Query, Ranges, Service};
use ferry_e2e::kube::KubeTier;

const MIB: u64 = 1 << 20;
/// ferry-csi compares snapshots in blocks of this size (e2e/csi/snapmeta.go).
const BLOCK: u64 = 64 << 10;

const LIMITS: Limits = Limits {
    deadline: Duration::from_secs(30),
    ranges: 4096,
};

/// Does `r` cover `[off, off + len)` and, apart from that, at most `slack` bytes?
fn covers(r: &Ranges, off: u64, len: u64, slack: u64) -> bool {
    let covered: u64 = r
        .ranges
        .iter()
        .map(|&(o, l)| (o + l).min(off + len).saturating_sub(o.max(off)))
        .sum();
    covered == len && r.bytes() <= len + slack
}

/// A snapshot's allocated ranges and the ranges changed between two snapshots, as the
/// driver knows them, reach a caller that may read the namespace's VolumeSnapshots; a
/// caller that may not, or whose token is for another audience, gets nothing.
pub fn changed_blocks_through_the_sidecar(tier: &KubeTier, _: &std::path::Path) -> Result<()> {
    super::block::block_claims(tier, &[("cbt-src", "64Mi")])?;
    let (file, _) = super::block::volume(tier, "cbt-src")?;
    let f = std::fs::OpenOptions::new().write(true).open(&file)?;
    f.write_all_at(&vec![0x33; 3 * MIB as usize], 8 * MIB)?;
    f.sync_all()?;
    let base = super::csi::snapshot(tier, "cbt-1", "cbt-src")?;
    // 1 MiB, not on a block boundary: two blocks at its ends are partly changed.
    f.write_all_at(&vec![0x77; MIB as usize], 40 * MIB + 4096)?;
    f.sync_all()?;
    super::csi::snapshot(tier, "cbt-2", "cbt-src")?;
    let base_handle = base
        .file_name()
        .and_then(|n| n.to_str())
        .context("the base snapshot's handle")?
        .to_owned();

    // Who may read the snapshots, and who may not.
    tier.apply("apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: cbt-reader, namespace: default}\n---\napiVersion: v1\nkind: ServiceAccount\nmetadata: {name: cbt-stranger, namespace: default}\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {name: cbt-reader, namespace: default}\nrules:\n- apiGroups: [snapshot.storage.k8s.io]\n  resources: [volumesnapshots]\n  verbs: [get]\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {name: cbt-reader, namespace: default}\nroleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: cbt-reader}\nsubjects:\n- {kind: ServiceAccount, name: cbt-reader, namespace: default}\n")?;

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let result = runtime.block_on(async {
        let config = kube::Config::from_custom_kubeconfig(
            kube::config::Kubeconfig::read_from(&tier.kubeconfig)?,
            &kube::config::KubeConfigOptions::default(),
        )
        .await?;
        let client = kube::Client::try_from(config)?;
        let service = Service::of_driver(&client, "csi.ferry.dev")
            .await?
            .context("ferry-csi's SnapshotMetadataService is not there")?;
        let ttl = Duration::from_secs(600);
        let reader = token(&client, "default", "cbt-reader", &service.audience, ttl).await?;

        let allocated = ranges(
            &service,
            &reader,
            "default",
            Query::Allocated { snapshot: "cbt-1" },
            LIMITS,
        )
        .await?;
        ensure!(
            allocated.capacity == 64 * MIB,
            "capacity {} of a 64 MiB claim",
            allocated.capacity
        );
        // The file's data extents: the 3 MiB written (the filesystem's blocks round it).
        ensure!(
            covers(&allocated, 8 * MIB, 3 * MIB, 2 * BLOCK),
            "the first snapshot's data is 3 MiB at 8 MiB, the sidecar says {:?}",
            allocated.ranges
        );

        let delta = ranges(
            &service,
            &reader,
            "default",
            Query::Delta {
                base_handle: &base_handle,
                snapshot: "cbt-2",
            },
            LIMITS,
        )
        .await?;
        ensure!(
            covers(&delta, 40 * MIB + 4096, MIB, 2 * BLOCK),
            "1 MiB changed at 40 MiB + 4 KiB, the sidecar says {:?}",
            delta.ranges
        );

        // A caller that may not get the namespace's snapshots, and a token for another
        // audience: refused by the sidecar, with nothing sent.
        let stranger = token(&client, "default", "cbt-stranger", &service.audience, ttl).await?;
        let elsewhere = token(&client, "default", "cbt-reader", "another-audience", ttl).await?;
        for (who, token) in [("stranger", &stranger), ("other audience", &elsewhere)] {
            match ranges(
                &service,
                token,
                "default",
                Query::Allocated { snapshot: "cbt-1" },
                LIMITS,
            )
            .await
            {
                Err(Error::Refused {
                    code: tonic::Code::PermissionDenied | tonic::Code::Unauthenticated,
                    ..
                }) => {}
                other => anyhow::bail!("{who}: expected a refusal, got {other:?}"),
            }
        }
        Ok(())
    });
    super::block::delete(
        tier,
        &[
            "volumesnapshot/cbt-1",
            "volumesnapshot/cbt-2",
            "pvc/cbt-src",
            "rolebinding/cbt-reader",
            "role/cbt-reader",
            "serviceaccount/cbt-reader",
            "serviceaccount/cbt-stranger",
        ],
    )?;
    result
}

/// A block CopyJob from a VolumeSnapshot onto a claim that holds an earlier snapshot of the
/// same volume reads only the chunks the driver says changed since (the agent asks the
/// sidecar with its own token: the chart's `changedBlockTracking`, on in this tier); the
/// result is the later snapshot's bytes exactly. `verify: Full` reads the whole source.
pub fn a_rerun_from_a_later_snapshot_reads_only_what_changed(
    tier: &KubeTier,
    _: &std::path::Path,
) -> Result<()> {
    use super::block::{block_claims, delete, field, finished, volume};
    block_claims(tier, &[("cbt-a", "64Mi"), ("cbt-b", "64Mi")])?;
    let (a_file, _) = volume(tier, "cbt-a")?;
    let (b_file, _) = volume(tier, "cbt-b")?;
    let f = std::fs::OpenOptions::new().write(true).open(&a_file)?;
    for i in 0..6u64 {
        let data: Vec<u8> = (0..2 * MIB).map(|b| (b as u8) ^ (i as u8 * 29)).collect();
        f.write_all_at(&data, i * 10 * MIB + 12_345)?;
    }
    f.sync_all()?;
    let job = |name: &str, snapshot: &str, extra: &str| {
        tier.apply(&format!(
            "apiVersion: ferry.dev/v1alpha1\nkind: CopyJob\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  source: {{snapshot: {snapshot}}}\n  destination: {{pvc: cbt-b}}\n{extra}"
        ))?;
        finished(tier, name)
    };
    let rerun = "  overwrite: IfChanged\n  compare: Checksum\n";

    super::csi::snapshot(tier, "cbt-s1", "cbt-a")?;
    let first = job("cbt-first", "cbt-s1", "  overwrite: Always\n")?;
    ensure!(
        std::fs::read(&b_file)? == std::fs::read(&a_file)?,
        "the first copy is not the snapshot's bytes"
    );
    ensure!(
        !first.contains("delta=true"),
        "a first copy used a delta: {first}"
    );

    // 1 MiB changed inside chunk 10 (40..44 MiB), then a later snapshot copied by checksums.
    f.write_all_at(&vec![0x6B; MIB as usize], 40 * MIB + 4096)?;
    f.sync_all()?;
    super::csi::snapshot(tier, "cbt-s2", "cbt-a")?;
    let line = job("cbt-delta", "cbt-s2", rerun)?;
    ensure!(
        std::fs::read(&b_file)? == std::fs::read(&a_file)?,
        "the copy by changed blocks is not the later snapshot's bytes"
    );
    let (read, written) = (field(&line, "read_source"), field(&line, "written"));
    ensure!(
        line.contains("delta=true") && read == Some(4 * MIB) && written == Some(1),
        "one changed chunk: read {read:?} bytes of the source, wrote {written:?} chunks: {line}\nwhat the agents said of snapshots:\n{}",
        said_of_snapshots(tier)?
    );

    // A snapshot with nothing changed since: the driver's answer has no range, and
    // nothing of the source is read.
    super::csi::snapshot(tier, "cbt-s2b", "cbt-a")?;
    let line = job("cbt-same", "cbt-s2b", rerun)?;
    let (read, written) = (field(&line, "read_source"), field(&line, "written"));
    ensure!(
        line.contains("delta=true") && read == Some(0) && written == Some(0),
        "nothing changed: read {read:?} bytes of the source, wrote {written:?} chunks: {line}\nwhat the agents said of snapshots:\n{}",
        said_of_snapshots(tier)?
    );

    // verify Full: the whole source is read, whatever the driver says.
    f.write_all_at(&vec![0x6C; MIB as usize], 20 * MIB)?;
    f.sync_all()?;
    super::csi::snapshot(tier, "cbt-s3", "cbt-a")?;
    let line = job("cbt-full", "cbt-s3", &format!("{rerun}  verify: Full\n"))?;
    ensure!(
        std::fs::read(&b_file)? == std::fs::read(&a_file)?,
        "the verify Full copy is not the snapshot's bytes"
    );
    let read = field(&line, "read_source");
    ensure!(
        line.contains("delta=false") && read == Some(64 * MIB),
        "verify Full read {read:?} bytes of a 64 MiB source: {line}"
    );
    delete(
        tier,
        &[
            "copyjob/cbt-first",
            "copyjob/cbt-delta",
            "copyjob/cbt-same",
            "copyjob/cbt-full",
            "volumesnapshot/cbt-s1",
            "volumesnapshot/cbt-s2",
            "volumesnapshot/cbt-s2b",
            "volumesnapshot/cbt-s3",
            "pvc/cbt-a",
            "pvc/cbt-b",
        ],
    )
}

/// The agents' log lines about a source's snapshot or changed-block tracking: why a delta
/// was or was not used.
fn said_of_snapshots(tier: &KubeTier) -> Result<String> {
    let lines = super::block::agent_lines(tier, |l| {
        l.contains("changed-block tracking") || l.contains("snapshot is not known")
    })?;
    Ok(lines.join("\n"))
}

/// `copyMethod: Snapshot` of a block claim onto a claim, as a CopySchedule runs it night
/// after night: the snapshot the operator takes stays after a successful copy (owned by the
/// destination claim too, labelled as its base), so the next run asks the driver what
/// changed since and reads only that; the older base goes once the newer is kept, and the
/// last one goes with the destination claim.
pub fn copymethod_snapshot_keeps_its_base_for_the_next_run(
    tier: &KubeTier,
    _: &std::path::Path,
) -> Result<()> {
    use super::block::{block_claims, delete, field, finished, volume};
    block_claims(tier, &[("cbt-live", "64Mi"), ("cbt-copy", "64Mi")])?;
    let (live, _) = volume(tier, "cbt-live")?;
    let (copy, _) = volume(tier, "cbt-copy")?;
    let f = std::fs::OpenOptions::new().write(true).open(&live)?;
    for i in 0..5u64 {
        let data: Vec<u8> = (0..3 * MIB).map(|b| (b as u8) ^ (i as u8 * 41)).collect();
        f.write_all_at(&data, i * 12 * MIB + 777)?;
    }
    f.sync_all()?;
    let copy_uid = tier.get("pvc/cbt-copy", "default", "{.metadata.uid}")?;
    let run = |name: &str| -> Result<(String, String)> {
        tier.apply(&format!(
            "apiVersion: ferry.dev/v1alpha1\nkind: CopyJob\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  source: {{pvc: cbt-live, copyMethod: Snapshot}}\n  destination: {{pvc: cbt-copy}}\n  overwrite: IfChanged\n  compare: Checksum\n"
        ))?;
        let line = finished(tier, name)?;
        let uid = tier.get(&format!("copyjob/{name}"), "default", "{.metadata.uid}")?;
        Ok((format!("ferry-snapshot-{uid}"), line))
    };
    let base_of = |snapshot: &str| {
        tier.get(
            &format!("volumesnapshot/{snapshot}"),
            "default",
            "{.metadata.labels.ferry\\.dev/base-for} {.metadata.ownerReferences[*].kind}",
        )
    };
    let gone = |snapshot: &str, why: &str| {
        super::csi::gone(tier, &format!("volumesnapshot/{snapshot}"))
            .with_context(|| format!("snapshot {snapshot} stayed {why}"))
    };

    let (first, line) = run("cbt-night-1")?;
    ensure!(
        std::fs::read(&copy)? == std::fs::read(&live)?,
        "the first copy is not the claim's bytes"
    );
    ensure!(
        !line.contains("delta=true"),
        "a first copy used a delta: {line}"
    );
    let kept = base_of(&first)?;
    ensure!(
        kept == format!("{copy_uid} CopyJob PersistentVolumeClaim"),
        "after a successful copy the taken snapshot is kept as the base of claim {copy_uid} (label, and owned by job and claim): {kept:?}"
    );
    // The job goes (a schedule's history limit, a TTL): the base stays, the claim owns it.
    delete(tier, &["copyjob/cbt-night-1"])?;
    std::thread::sleep(Duration::from_secs(2));
    ensure!(
        base_of(&first)?.starts_with(&copy_uid),
        "the base went with its job"
    );

    // The next night: 1 MiB changed inside chunk 7 (28..32 MiB).
    f.write_all_at(&vec![0x5A; MIB as usize], 29 * MIB)?;
    f.sync_all()?;
    let (second, line) = run("cbt-night-2")?;
    ensure!(
        std::fs::read(&copy)? == std::fs::read(&live)?,
        "the copy by changed blocks is not the claim's bytes"
    );
    let (read, written) = (field(&line, "read_source"), field(&line, "written"));
    ensure!(
        line.contains("delta=true") && read == Some(4 * MIB) && written == Some(1),
        "one changed chunk since the kept base: read {read:?} bytes of the source, wrote {written:?} chunks: {line}\nwhat the agents said of snapshots:\n{}",
        said_of_snapshots(tier)?
    );
    // The job's status says so too, for whoever does not read the agents' logs.
    let status = tier.get(
        "copyjob/cbt-night-2",
        "default",
        "{.status.shards[0].block.changedBlocksOnly} {.status.shards[0].block.sourceBytesRead} {.status.shards[0].block.written} {.status.shards[0].block.unchanged}",
    )?;
    ensure!(
        status == format!("true {} 1 15", 4 * MIB),
        "status.shards[0].block: changed blocks only, read, written, unchanged: {status:?}"
    );
    gone(&first, "after a newer base was kept")?;
    ensure!(
        base_of(&second)?.starts_with(&copy_uid),
        "the newer base is not kept"
    );

    // The destination claim deleted (its job first, the base's other owner): its base goes.
    delete(tier, &["copyjob/cbt-night-2", "pvc/cbt-copy"])?;
    gone(&second, "after its claim was deleted")?;
    delete(tier, &["pvc/cbt-live"])
}
