//! What Ferry reports as copied and verified rests on nothing a tenant can write. A
//! tenant's pod can write anything in its volume, `.ferry/` included: manifests planted
//! there (under any name a job could use, FIFOs too) must neither make a job keep a file
//! it did not compare nor hang it; no job may read or write `.ferry/` as data; a job
//! re-created under the same name is a new job, and what it leaves as the destination had
//! it is reported as skipped, not as copied.

use std::path::Path;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use ferry_e2e::ControlPlane;

const ROOT: &str = "apiVersion: ferry.dev/v1alpha1\nkind: StorageRoot\nmetadata:\n  name: {name}\nspec:\n  path: {path}\n  nodeSelector: {ferry.dev/node: node-a}\n  namespaces: {names: [default]}\n";

fn root(name: &str, path: &str) -> String {
    ROOT.replace("{name}", name).replace("{path}", path)
}

fn job(name: &str, extra: &str, src: (&str, &str), dst: (&str, &str)) -> String {
    format!(
        "apiVersion: ferry.dev/v1alpha1\nkind: CopyJob\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  source: {{root: {}, path: '{}'}}\n  destination: {{root: {}, path: '{}'}}\n{extra}",
        src.0, src.1, dst.0, dst.1
    )
}

/// Phase and the Failed reason once the job is finished.
fn finished(cp: &ControlPlane, name: &str) -> Result<String> {
    cp.wait_until(
        &format!("copyjob/{name}"),
        "default",
        "{.status.phase} {.status.conditions[?(@.type==\"Failed\")].reason}",
        Duration::from_secs(90),
        |v| v.starts_with("Succeeded") || v.starts_with("Failed"),
    )
    .map(|v| v.trim().to_string())
    .with_context(|| cp.log_tail("agent-node-a.log", 20))
}

/// Same length and mtime as `f` has now, other bytes: what the rsync quick check cannot see.
fn overwrite_keeping_size_and_mtime(f: &Path, bytes: &[u8]) -> Result<()> {
    let mtime = std::fs::metadata(f)?.modified()?;
    ensure!(
        std::fs::metadata(f)?.len() == bytes.len() as u64,
        "same length"
    );
    std::fs::write(f, bytes)?;
    std::fs::File::options()
        .write(true)
        .open(f)?
        .set_times(std::fs::FileTimes::new().set_modified(mtime))?;
    Ok(())
}

fn mkfifo(p: &Path) -> Result<()> {
    let status = std::process::Command::new("mkfifo").arg(p).status()?;
    ensure!(status.success(), "mkfifo {}", p.display());
    Ok(())
}

#[test]
fn planted_state_in_dot_ferry_neither_fakes_a_verified_copy_nor_hangs_the_job() -> Result<()> {
    let Some(cp) = ControlPlane::start_or_skip()? else {
        return Ok(());
    };
    cp.install_crds()?;
    let (_ferry, hosts) = cp.start_ferry(&["node-a"])?;
    let node = hosts.join("node-a");
    let (src, dst) = (node.join("srv/src"), node.join("srv/dst"));
    std::fs::create_dir_all(src.join("data"))?;
    std::fs::create_dir_all(dst.join("copy"))?;
    std::fs::write(src.join("data/f"), b"the source's bytes")?;
    // The tenant's destination already has `f`, same size and mtime, other bytes.
    std::fs::write(dst.join("copy/f"), b"the source's bytes")?;
    let mtime = std::fs::metadata(src.join("data/f"))?.modified()?;
    std::fs::File::options()
        .write(true)
        .open(dst.join("copy/f"))?
        .set_times(std::fs::FileTimes::new().set_modified(mtime))?;
    overwrite_keeping_size_and_mtime(&dst.join("copy/f"), b"the tenant's bytes")?;
    cp.apply(&root("src", "/srv/src"))?;
    cp.apply(&root("dst", "/srv/dst"))?;

    // 1. A manifest planted under every name the job's state could have (its uid, read
    // from the API while it is suspended, and the `<namespace>-<name>` older versions
    // used) listing `f`, and a FIFO under the name of a second job's: neither job may
    // keep `f` without comparing it, nor hang.
    let extra = "  overwrite: Always\n  verify: Checksum\n  suspend: true\n";
    cp.apply(&job("planted", extra, ("src", "data"), ("dst", "copy")))?;
    cp.apply(&job("fifo", extra, ("src", "data"), ("dst", "copy-fifo")))?;
    let state = dst.join(".ferry");
    std::fs::create_dir_all(&state)?;
    let hash = "0123456789abcdef0123456789abcdef";
    for name in ["planted", "fifo"] {
        let uid = cp.get(&format!("copyjob/{name}"), "default", "{.metadata.uid}")?;
        ensure!(!uid.is_empty(), "{name} has no uid");
        for file in [format!("{uid}.xxh128"), format!("default-{name}.xxh128")] {
            match name {
                "planted" => std::fs::write(state.join(file), format!("{hash}  f\n"))?,
                _ => mkfifo(&state.join(file))?,
            }
        }
    }
    for name in ["planted", "fifo"] {
        cp.kubectl_ok(&[
            "patch",
            "copyjob",
            name,
            "-n",
            "default",
            "--type=merge",
            "-p",
            r#"{"spec":{"suspend":false}}"#,
        ])?;
    }
    let got = finished(&cp, "planted")?;
    ensure!(got == "Succeeded", "planted: {got}");
    ensure!(
        std::fs::read(dst.join("copy/f"))? == b"the source's bytes",
        "overwrite: Always with verify: Checksum kept the tenant's bytes because a planted \
         manifest listed the file: {:?}",
        String::from_utf8_lossy(&std::fs::read(dst.join("copy/f"))?)
    );
    let got = finished(&cp, "fifo")?;
    ensure!(got == "Succeeded", "fifo: {got}");
    let skipped = cp.get("copyjob/planted", "default", "{.status.progress.skipped}")?;
    ensure!(
        skipped == "0",
        "nothing was kept, yet skipped is {skipped:?}"
    );
    // The tenant's manifest is Ferry's now, a regular file that checks.
    for name in ["planted", "fifo"] {
        let manifest = cp.get(&format!("copyjob/{name}"), "default", "{.status.manifest}")?;
        let m = dst.join(&manifest);
        ensure!(
            std::fs::symlink_metadata(&m)?.is_file(),
            "{name}: {manifest} is not a file"
        );
        let text = std::fs::read_to_string(&m)?;
        ensure!(
            !text.contains(hash),
            "{name}: the planted line survived: {text}"
        );
        let out = std::process::Command::new("xxh128sum")
            .arg("-c")
            .arg(&m)
            .current_dir(dst.join(if name == "planted" {
                "copy"
            } else {
                "copy-fifo"
            }))
            .output()
            .context("run xxh128sum")?;
        ensure!(
            out.status.success(),
            "{name}: xxh128sum -c {manifest}: {out:?}"
        );
    }

    // 2. `.ferry` is no job's data: refused at admission on either end...
    for (name, s, d) in [
        ("into-state", ("src", "data"), ("dst", ".ferry")),
        ("below-state", ("src", "data"), ("dst", "./.ferry/x")),
        ("from-state", ("dst", ".ferry"), ("dst", "stolen")),
    ] {
        let err = cp
            .apply(&job(name, "", s, d))
            .err()
            .with_context(|| format!("{name}: a job reaching .ferry was admitted"))?;
        ensure!(err.to_string().contains(".ferry"), "{name}: {err:#}");
    }
    // ...and a copy of a whole root neither reads its `.ferry/` nor writes the other's.
    std::fs::create_dir_all(src.join(".ferry"))?;
    std::fs::write(src.join(".ferry/planted.xxh128"), format!("{hash}  f\n"))?;
    cp.apply(&job("whole", "", ("src", "."), ("dst", ".")))?;
    ensure!(finished(&cp, "whole")? == "Succeeded", "whole-root copy");
    ensure!(dst.join("data/f").exists(), "the root's data was copied");
    ensure!(
        !dst.join(".ferry/planted.xxh128").exists(),
        "a whole-root copy wrote the source's .ferry/ into the destination's"
    );

    // 3. A root that holds the agent's own state (its journals) is refused on the node.
    cp.apply(&root("var", "/var/lib"))?;
    cp.apply(&job("into-agent", "", ("src", "data"), ("var", "stolen")))?;
    let got = finished(&cp, "into-agent")?;
    ensure!(
        got == "Failed CannotStart",
        "a root holding the agent's state: {got}"
    );
    let msg = cp.get(
        "copyjob/into-agent",
        "default",
        "{.status.failures[0].message}",
    )?;
    ensure!(msg.contains("agent's own state"), "{msg}");
    ensure!(
        !node.join("var/lib/stolen").exists(),
        "something was written"
    );
    Ok(())
}

#[test]
fn a_re_created_job_reports_what_it_kept_as_skipped_not_as_copied() -> Result<()> {
    let Some(cp) = ControlPlane::start_or_skip()? else {
        return Ok(());
    };
    cp.install_crds()?;
    let (_ferry, hosts) = cp.start_ferry(&["node-a"])?;
    let node = hosts.join("node-a");
    std::fs::create_dir_all(node.join("srv/data/src"))?;
    for (name, body) in [("a", "first file"), ("b", "second file")] {
        std::fs::write(node.join("srv/data/src").join(name), body)?;
    }
    cp.apply(&root("data", "/srv/data"))?;
    let spec = job(
        "sync",
        "  overwrite: IfChanged\n",
        ("data", "src"),
        ("data", "out"),
    );
    cp.apply(&spec)?;
    ensure!(finished(&cp, "sync")? == "Succeeded", "first run");
    // The destination's `a` changes behind Ferry's back, size and mtime restored.
    overwrite_keeping_size_and_mtime(&node.join("srv/data/out/a"), b"tampered!!")?;
    cp.kubectl_ok(&["delete", "copyjob", "sync", "-n", "default", "--wait=true"])?;
    cp.apply(&spec)?;
    ensure!(finished(&cp, "sync")? == "Succeeded", "second run");
    let got = cp.get(
        "copyjob/sync",
        "default",
        "{.status.progress.filesDone} {.status.progress.skipped}",
    )?;
    ensure!(
        got == "0 2",
        "the re-created job copied nothing and kept both files: filesDone skipped = {got:?}"
    );
    let msg = cp.get(
        "copyjob/sync",
        "default",
        "{.status.conditions[?(@.type==\"Complete\")].message}",
    )?;
    ensure!(
        msg.contains("0 files")
            && msg.contains("2 entries")
            && msg.contains("not copied or verified"),
        "the Complete condition says what was kept: {msg}"
    );
    Ok(())
}
