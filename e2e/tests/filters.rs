//! `spec.include` and `spec.exclude` through a CopyJob (the real kube-apiserver, the operator
//! and an agent as processes): a dry run counts only what they select, a copy carries only
//! that and its manifest lists only that, and a pattern that does not compile is refused
//! with `InvalidSpec`, naming it, before anything runs.

use std::process::Command;

use anyhow::{ensure, Result};
use ferry_e2e::ControlPlane;

#[test]
fn include_and_exclude_select_what_a_copyjob_plans_copies_and_lists_and_bad_patterns_are_refused(
) -> Result<()> {
    let Some(cp) = ControlPlane::start_or_skip()? else {
        return Ok(());
    };
    cp.install_crds()?;
    let (_ferry, hosts) = cp.start_ferry(&["node-a"])?;
    let data = hosts.join("node-a/srv/data");
    let tree = data.join("src");
    // Selected: the CSV files outside cache/ (4 files, 10 bytes each). Not: the rest.
    for (path, body) in [
        ("a.csv", "0123456789"),
        ("b/c.csv", "0123456789"),
        ("b/d/e.csv", "0123456789"),
        ("f.csv", "0123456789"),
        ("notes.txt", "not a csv"),
        ("b/log.txt", "not a csv"),
        ("cache/big.csv", "excluded with its directory"),
        ("b/cache/x.csv", "excluded with its directory"),
    ] {
        let p = tree.join(path);
        std::fs::create_dir_all(p.parent().expect("a parent"))?;
        std::fs::write(p, body)?;
    }
    cp.apply("apiVersion: ferry.dev/v1alpha1\nkind: StorageRoot\nmetadata:\n  name: data\nspec:\n  path: /srv/data\n  nodeSelector: {ferry.dev/node: node-a}\n  namespaces: {names: [default]}\n")?;
    let job = |name: &str, extra: &str| {
        format!("apiVersion: ferry.dev/v1alpha1\nkind: CopyJob\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  source: {{root: data, path: src}}\n  destination: {{root: data, path: {name}}}\n  include: ['*.csv']\n  exclude: ['cache/']\n{extra}")
    };

    cp.apply(&job("plan", "  dryRun: true\n"))?;
    cp.wait_succeeded("default", "plan", 90)?;
    let plan = cp.get(
        "copyjob/plan",
        "default",
        "{.status.plan.files} {.status.plan.bytes}",
    )?;
    ensure!(
        plan == "4 40",
        "the dry run planned {plan:?}, want 4 files of 40 bytes"
    );

    cp.apply(&job("copy", ""))?;
    cp.wait_succeeded("default", "copy", 90)?;
    let mut copied = Vec::new();
    let dst = data.join("copy");
    let mut stack = vec![dst.clone()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(dir)? {
            let p = e?.path();
            if p.is_dir() {
                stack.push(p);
            } else if !p.starts_with(data.join("copy/.ferry")) {
                copied.push(p.strip_prefix(&dst)?.to_string_lossy().into_owned());
            }
        }
    }
    copied.sort();
    ensure!(
        copied == ["a.csv", "b/c.csv", "b/d/e.csv", "f.csv"],
        "copied {copied:?}"
    );
    ensure!(!dst.join("cache").exists() && !dst.join("b/cache").exists());
    let done = cp.get("copyjob/copy", "default", "{.status.progress.filesDone}")?;
    ensure!(done == "4", "progress counts {done} files");
    let manifest = cp.get("copyjob/copy", "default", "{.status.manifest}")?;
    let text = std::fs::read_to_string(data.join(&manifest))?;
    ensure!(text.lines().count() == 4, "manifest {manifest}:\n{text}");
    let check = Command::new("xxh128sum")
        .args(["--quiet", "-c"])
        .arg(data.join(&manifest))
        .current_dir(&dst)
        .output()?;
    ensure!(check.status.success(), "manifest does not check: {check:?}");

    // A pattern that does not compile: refused with its name, nothing made.
    cp.apply("apiVersion: ferry.dev/v1alpha1\nkind: CopyJob\nmetadata:\n  name: bad\n  namespace: default\nspec:\n  source: {root: data, path: src}\n  destination: {root: data, path: bad}\n  exclude: ['ok/', 'a[z-a]']\n")?;
    let path = "{.status.conditions[?(@.type==\"Accepted\")].reason}";
    cp.wait_until(
        "copyjob/bad",
        "default",
        path,
        std::time::Duration::from_secs(60),
        |r| r == "InvalidSpec",
    )?;
    let message = cp.get(
        "copyjob/bad",
        "default",
        "{.status.conditions[?(@.type==\"Accepted\")].message}",
    )?;
    ensure!(
        message.contains("spec.exclude: pattern \"a[z-a]\" is not a valid glob"),
        "message {message:?}"
    );
    ensure!(
        !data.join("bad").exists(),
        "a refused job made its destination"
    );
    Ok(())
}
