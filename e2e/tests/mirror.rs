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
