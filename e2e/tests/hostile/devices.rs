//! Hole 2: a tenant could make the agent open a device node as root. At 934c0cf a
//! `compare: Checksum` re-run (and a resume) opened whatever had a destination file's name
//! to read it, and only then looked at what it was; opening some devices acts (a watchdog
//! reboots the node when it is closed without its magic byte). Now nothing in a tenant's
//! volume is opened before it is known to be a regular file or a directory, through a
//! descriptor that cannot be swapped; and a source's device nodes are made in a
//! destination only where its StorageRoot allows privileged files. Here, with a CopyJob
//! between two paths of one root on the local control plane: the device a tenant planted
//! at a destination name is never opened (inotify sees every open of its inode, by any
//! process), the job replaces it with the source's file and says so; and a device node in
//! the source fails its entry, in the job's status, with the field that allows it.

use std::path::Path;
use std::time::Duration;

use anyhow::{ensure, Result};
use ferry_e2e::ControlPlane;

#[path = "../../../engine/tests/common/mod.rs"]
mod tree;

const ROOT: &str = "apiVersion: ferry.dev/v1alpha1\nkind: StorageRoot\nmetadata:\n  name: devices\nspec:\n  path: /srv/devices\n  nodeSelector: {ferry.dev/node: node-a}\n  namespaces: {names: [default]}\n";

fn job(name: &str, src: &str, dst: &str) -> String {
    format!("apiVersion: ferry.dev/v1alpha1\nkind: CopyJob\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  source: {{root: devices, path: {src}}}\n  destination: {{root: devices, path: {dst}}}\n  overwrite: IfChanged\n  compare: Checksum\n")
}

/// Wait for `name` to finish; its phase, the reason of its Failed condition, and its
/// progress counters (files done, skipped).
fn finished(cp: &ControlPlane, name: &str) -> Result<String> {
    cp.wait_until(
        &format!("copyjob/{name}"),
        "default",
        "{.status.phase} {.status.conditions[?(@.type==\"Failed\")].reason} files={.status.progress.filesDone} skipped={.status.progress.skipped}",
        Duration::from_secs(90),
        |v| v.starts_with("Failed") || v.starts_with("Succeeded"),
    )
}

fn is_char_device(p: &Path) -> Result<bool> {
    Ok(tree::lstat(p)?.st_mode & libc::S_IFMT == libc::S_IFCHR)
}

#[test]
fn a_device_at_a_destination_name_is_never_opened_and_a_source_device_needs_the_roots_consent(
) -> Result<()> {
    if !tree::require_root("mknod, and agents that run as root") {
        return Ok(());
    }
    let Some(cp) = ControlPlane::start_or_skip()? else {
        return Ok(());
    };
    cp.install_crds()?;
    let (_ferry, hosts) = cp.start_ferry(&["node-a"])?;
    let root = hosts.join("node-a/srv/devices");
    for d in ["data", "out"] {
        std::fs::create_dir_all(root.join(d))?;
    }
    std::fs::write(root.join("data/f"), b"tenant data")?;
    std::fs::write(root.join("data/same"), b"equal on both sides")?;
    std::fs::write(root.join("out/same"), b"equal on both sides")?;
    // The tenant's trap: a device node (/dev/null's numbers, which open without effect:
    // the point is that any open is seen) where the re-run reads the copy it compares.
    let trap = root.join("out/f");
    tree::mknod(&trap, 'c', 0o666, 1, 3)?;
    let watch = tree::OpenWatch::new(&[&trap])?;
    cp.apply(ROOT)?;

    cp.apply(&job("rerun", "data", "out"))?;
    let got = finished(&cp, "rerun")?;
    let touched = watch.touched();
    ensure!(
        touched.is_empty(),
        "the agent opened the tenant's device node: {touched:?} (job: {got})"
    );
    // Not the source's file: replaced by it, as a file that differs is; the equal one kept.
    ensure!(
        got.starts_with("Succeeded") && got.contains(" files=1 ") && got.ends_with(" skipped=1"),
        "rerun: {got:?}"
    );
    ensure!(std::fs::read(&trap)? == b"tenant data");
    ensure!(std::fs::read(root.join("out/same"))? == b"equal on both sides");

    // A device node in the source: not made where the root does not allow privileged
    // files, and the job's status says which entry and what would allow it.
    let dev = root.join("data/dev");
    tree::mknod(&dev, 'c', 0o666, 1, 3)?;
    let watch = tree::OpenWatch::new(&[&dev])?;
    cp.apply(&job("source-device", "data", "copy"))?;
    let got = finished(&cp, "source-device")?;
    ensure!(
        got.starts_with("Failed PartiallyFailed"),
        "source-device: {got:?}"
    );
    let failure = cp.get(
        "copyjob/source-device",
        "default",
        "{.status.failures[0].path} {.status.failures[0].reason} {.status.failures[0].message}",
    )?;
    ensure!(
        failure.starts_with("dev PermissionDenied ")
            && failure.contains("device (1:3) is not made")
            && failure.contains("spec.allowPrivilegedFiles"),
        "the failure does not say what happened: {failure}"
    );
    ensure!(!root.join("copy/dev").exists(), "the device was made");
    ensure!(std::fs::read(root.join("copy/f"))? == b"tenant data");

    // Once the admin allows privileged files on the root, it is made (never opened).
    cp.apply(&format!("{ROOT}  allowPrivilegedFiles: true\n"))?;
    cp.apply(&job("allowed", "data", "allowed"))?;
    let got = finished(&cp, "allowed")?;
    ensure!(got.starts_with("Succeeded"), "allowed: {got:?}");
    ensure!(
        is_char_device(&root.join("allowed/dev"))?,
        "the device was not made"
    );
    let touched = watch.touched();
    ensure!(
        touched.is_empty(),
        "a source device node was opened: {touched:?}"
    );
    Ok(())
}
