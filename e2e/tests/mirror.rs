//! `spec.deleteExtraneous` through a CopyJob (the real kube-apiserver, the operator and an
//! agent as processes): a dry run names and counts what the mirror would remove and removes
//! nothing; the copy then removes what the source lacks, counts it in `progress.deleted`,
//! keeps what `exclude` leaves out, and never follows the symlinks a tenant planted in the
//! destination to a directory outside it.

use anyhow::{ensure, Result};
use ferry_e2e::ControlPlane;

#[test]
fn a_mirror_removes_what_the_source_lacks_only_beneath_the_destination_and_its_dry_run_lists_it(
) -> Result<()> {
    let Some(cp) = ControlPlane::start_or_skip()? else {
        return Ok(());
    };
    cp.install_crds()?;
    let (_ferry, hosts) = cp.start_ferry(&["node-a"])?;
    let data = hosts.join("node-a/srv/data");
    let (src, dst) = (data.join("src"), data.join("dst"));
    // Outside the root entirely: what a planted link points at.
    let outside = hosts.join("node-a/etc/secrets");
    std::fs::create_dir_all(&outside)?;
    std::fs::write(outside.join("key"), "do not delete")?;
    for root in [&src, &dst] {
        std::fs::create_dir_all(root.join("keep/sub"))?;
        std::fs::write(root.join("keep/sub/a"), "a")?;
        std::fs::write(root.join("b"), "b")?;
    }
    // Extraneous in the destination: a file, a directory with a file, a link to outside the
    // root, and, in a directory the source lacks, another one. Excluded: kept.
    std::fs::write(dst.join("stale"), "stale")?;
    std::fs::create_dir_all(dst.join("old/deeper"))?;
    std::fs::write(dst.join("old/deeper/c"), "c")?;
    std::os::unix::fs::symlink(&outside, dst.join("keep/escape"))?;
    std::os::unix::fs::symlink(&outside, dst.join("old/escape"))?;
    std::fs::write(dst.join("notes.local"), "excluded: kept")?;
    cp.apply("apiVersion: ferry.dev/v1alpha1\nkind: StorageRoot\nmetadata:\n  name: data\nspec:\n  path: /srv/data\n  nodeSelector: {ferry.dev/node: node-a}\n  namespaces: {names: [default]}\n")?;
    let job = |name: &str, extra: &str| {
        format!("apiVersion: ferry.dev/v1alpha1\nkind: CopyJob\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  source: {{root: data, path: src}}\n  destination: {{root: data, path: dst}}\n  overwrite: IfChanged\n  deleteExtraneous: true\n  exclude: ['*.local']\n{extra}")
    };

    cp.apply(&job("preview", "  dryRun: true\n"))?;
    cp.wait_succeeded("default", "preview", 90)?;
    let count = cp.get("copyjob/preview", "default", "{.status.plan.deletions}")?;
    let listed = cp.get("copyjob/preview", "default", "{.status.plan.toDelete}")?;
    // stale, old/ (with deeper/, c and escape), keep/escape.
    ensure!(count == "6", "the dry run counted {count} removals");
    for name in ["\"stale\"", "\"old/\"", "\"keep/escape\""] {
        ensure!(
            listed.contains(name),
            "the dry run does not list {name}: {listed}"
        );
    }
    ensure!(
        !listed.contains("notes.local"),
        "an excluded entry is listed: {listed}"
    );
    ensure!(dst.join("stale").exists(), "the dry run removed something");

    cp.apply(&job("mirror", ""))?;
    cp.wait_succeeded("default", "mirror", 90)?;
    let deleted = cp.get("copyjob/mirror", "default", "{.status.progress.deleted}")?;
    ensure!(deleted == "6", "progress.deleted is {deleted}");
    let message = cp.get(
        "copyjob/mirror",
        "default",
        "{.status.conditions[?(@.type==\"Complete\")].message}",
    )?;
    ensure!(
        message.contains("6 entries the source does not have were removed"),
        "{message}"
    );
    for gone in ["stale", "old", "keep/escape"] {
        ensure!(
            std::fs::symlink_metadata(dst.join(gone)).is_err(),
            "{gone} is still there"
        );
    }
    for kept in ["keep/sub/a", "b", "notes.local"] {
        ensure!(dst.join(kept).exists(), "{kept} was removed");
    }
    ensure!(
        std::fs::read_to_string(outside.join("key"))? == "do not delete",
        "the mirror reached outside the destination"
    );
    Ok(())
}

#[test]
fn a_job_split_across_two_agents_mirrors_once_in_its_directories_pass() -> Result<()> {
    let Some(cp) = ControlPlane::start_or_skip()? else {
        return Ok(());
    };
    if !ferry_e2e::is_root() {
        eprintln!(
            "skipped: a shared root is a bind mount into both nodes' host roots (needs root)"
        );
        return Ok(());
    }
    cp.install_crds()?;
    let nodes = ["node-a", "node-b"];
    let (_ferry, hosts) = cp.start_ferry(&nodes)?;
    // One filesystem, mounted at /srv/shared on both nodes (NFS on a real cluster).
    let shared = cp.dir().join("nfs");
    let (src, dst) = (shared.join("src"), shared.join("copy"));
    for d in 0..8 {
        for root in [&src, &dst] {
            std::fs::create_dir_all(root.join(format!("d{d}")))?;
        }
        for f in 0..10 {
            std::fs::write(src.join(format!("d{d}/f{f}")), format!("{d}/{f}"))?;
        }
        // Extraneous in every directory of the destination, and one directory more.
        std::fs::write(dst.join(format!("d{d}/stale")), "not in the source")?;
    }
    std::fs::create_dir_all(dst.join("gone/deeper"))?;
    std::fs::write(dst.join("gone/deeper/x"), "x")?;
    let _mounts: Vec<ferry_e2e::BindMount> = nodes
        .iter()
        .map(|n| ferry_e2e::BindMount::new(&shared, &hosts.join(n).join("srv/shared")))
        .collect::<Result<_>>()?;
    cp.apply("apiVersion: ferry.dev/v1alpha1\nkind: StorageRoot\nmetadata:\n  name: nfs\nspec:\n  path: /srv/shared\n  shared: true\n  namespaces: {names: [default]}\n---\napiVersion: ferry.dev/v1alpha1\nkind: CopyJob\nmetadata:\n  name: split-mirror\n  namespace: default\nspec:\n  source: {root: nfs, path: src}\n  destination: {root: nfs, path: copy}\n  overwrite: IfChanged\n  deleteExtraneous: true\n  parallelism: {maxAgents: 2, workersPerAgent: 1}\n")?;
    cp.wait_succeeded("default", "split-mirror", 120)?;
    let shards = cp.get(
        "copyjob/split-mirror",
        "default",
        "{.status.shards[*].part}",
    )?;
    ensure!(
        shards.contains("directories") && shards.split_whitespace().count() > 2,
        "the job was not split: parts {shards}"
    );
    // 8 stale files + gone/, deeper/, x: removed once, by the directories pass alone.
    let deleted = cp.get(
        "copyjob/split-mirror",
        "default",
        "{.status.progress.deleted}",
    )?;
    ensure!(deleted == "11", "progress.deleted is {deleted}");
    let by_part = cp.get(
        "copyjob/split-mirror",
        "default",
        "{range .status.shards[*]}{.part}={.deleted} {end}",
    )?;
    ensure!(
        by_part
            .split_whitespace()
            .filter(|p| !p.ends_with("=0"))
            .count()
            == 1
            && by_part.contains("directories=11"),
        "removals by part: {by_part}"
    );
    ensure!(!dst.join("gone").exists() && !dst.join("d3/stale").exists());
    ensure!(std::fs::read_to_string(dst.join("d3/f4"))? == "3/4");
    Ok(())
}
