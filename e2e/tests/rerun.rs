//! A re-run through CopyJobs (`overwrite: IfChanged`): the second job into a destination
//! copies only what changed, and its manifest lists the whole tree, the files it kept
//! taken from the records the first job left on the node. Nothing a tenant writes in the
//! volume (`.ferry/` included) feeds those lines; without records, the kept files are
//! counted as not listed, and the job says so.

use std::path::Path;

use anyhow::{ensure, Context, Result};
use ferry_e2e::ControlPlane;

fn job(name: &str, extra: &str) -> String {
    format!("apiVersion: ferry.dev/v1alpha1\nkind: CopyJob\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  source: {{root: data, path: src}}\n  destination: {{root: data, path: 'out//copy/'}}\n{extra}")
}

/// The lines of job `name`'s manifest (from the destination root), and whether
/// `xxh128sum -c` passes on them in the destination.
fn manifest(cp: &ControlPlane, root: &Path, name: &str) -> Result<(Vec<String>, bool)> {
    let rel = cp.get(&format!("copyjob/{name}"), "default", "{.status.manifest}")?;
    let path = root.join(&rel);
    let text = std::fs::read_to_string(&path).with_context(|| format!("{name}: read {rel}"))?;
    let check = std::process::Command::new("xxh128sum")
        .args(["--quiet", "-c"])
        .arg(&path)
        .current_dir(root.join("out/copy"))
        .output()
        .context("run xxh128sum")?;
    Ok((
        text.lines().map(str::to_string).collect(),
        check.status.success(),
    ))
}

#[test]
fn a_rerun_copies_what_changed_and_its_manifest_lists_the_whole_tree() -> Result<()> {
    let Some(cp) = ControlPlane::start_or_skip()? else {
        return Ok(());
    };
    cp.install_crds()?;
    let (_ferry, hosts) = cp.start_ferry(&["node-a"])?;
    let root = hosts.join("node-a/srv/data");
    let src = root.join("src");
    for d in 0..4 {
        std::fs::create_dir_all(src.join(format!("d{d}")))?;
        for f in 0..10u64 {
            std::fs::write(
                src.join(format!("d{d}/f{f}")),
                vec![(f + d) as u8; (f * 97) as usize],
            )?;
        }
    }
    cp.apply("apiVersion: ferry.dev/v1alpha1\nkind: StorageRoot\nmetadata:\n  name: data\nspec:\n  path: /srv/data\n  nodeSelector: {ferry.dev/node: node-a}\n  namespaces: {names: [default]}\n")?;
    cp.apply(&job("first", ""))?;
    cp.wait_succeeded("default", "first", 90)?;
    let (first, ok) = manifest(&cp, &root, "first")?;
    ensure!(first.len() == 40 && ok, "first manifest: {first:?}");
    let records = hosts.join("node-a/var/lib/ferry/agent/records");
    ensure!(
        std::fs::read_dir(&records)?.count() == 1,
        "the first job left no records on the node"
    );

    // One file changed at the source; the tenant rewrites every manifest in `.ferry/`
    // with lines of its own (which nothing may believe).
    std::fs::write(src.join("d2/f3"), b"changed at the source")?;
    for entry in std::fs::read_dir(root.join(".ferry"))? {
        let path = entry?.path();
        let forged: String = first
            .iter()
            .map(|l| format!("{}{}\n", "0".repeat(32), &l[32..]))
            .collect();
        std::fs::write(path, forged)?;
    }
    cp.apply(&job("second", "  overwrite: IfChanged\n"))?;
    cp.wait_succeeded("default", "second", 90)?;
    let progress = cp.get(
        "copyjob/second",
        "default",
        "{.status.progress.filesDone} {.status.progress.skipped} {.status.progress.unlisted}",
    )?;
    ensure!(
        progress == "1 39 0",
        "filesDone skipped unlisted: {progress}"
    );
    let (second, ok) = manifest(&cp, &root, "second")?;
    ensure!(second.len() == 40 && ok, "second manifest: {second:?}");
    ensure!(
        !second.iter().any(|l| l.starts_with(&"0".repeat(32))),
        "a forged line from .ferry/ was believed"
    );
    let changed = second
        .iter()
        .filter(|l| !first.contains(l))
        .collect::<Vec<_>>();
    ensure!(
        changed.len() == 1 && changed[0].ends_with("  d2/f3"),
        "only the changed file's line differs: {changed:?}"
    );

    // Without the node's records (a destination another tool filled, or records aged
    // out), the kept files are counted as not listed, and the job says so.
    std::fs::remove_dir_all(&records)?;
    std::fs::create_dir(&records)?;
    cp.apply(&job("third", "  overwrite: IfChanged\n"))?;
    cp.wait_succeeded("default", "third", 90)?;
    let unlisted = cp.get("copyjob/third", "default", "{.status.progress.unlisted}")?;
    ensure!(unlisted == "40", "unlisted: {unlisted}");
    let message = cp.get(
        "copyjob/third",
        "default",
        "{.status.conditions[?(@.type==\"Complete\")].message}",
    )?;
    ensure!(
        message.contains("the manifest does not list 40 of the kept files"),
        "{message}"
    );
    // (An empty manifest, which `xxh128sum -c` calls improperly formatted.)
    let (third, _) = manifest(&cp, &root, "third")?;
    ensure!(third.is_empty(), "third manifest: {third:?}");
    // A run that compares by checksum reads them, lists them and records them again: the
    // next quick re-run lists everything.
    cp.apply(&job(
        "fourth",
        "  overwrite: IfChanged\n  compare: Checksum\n",
    ))?;
    cp.wait_succeeded("default", "fourth", 90)?;
    let (fourth, ok) = manifest(&cp, &root, "fourth")?;
    ensure!(fourth.len() == 40 && ok, "fourth manifest: {fourth:?}");
    cp.apply(&job("fifth", "  overwrite: IfChanged\n"))?;
    cp.wait_succeeded("default", "fifth", 90)?;
    let progress = cp.get(
        "copyjob/fifth",
        "default",
        "{.status.progress.filesDone} {.status.progress.unlisted}",
    )?;
    ensure!(progress == "0 0", "filesDone unlisted: {progress}");
    let (fifth, ok) = manifest(&cp, &root, "fifth")?;
    ensure!(fifth.len() == 40 && ok, "fifth manifest: {fifth:?}");
    Ok(())
}
