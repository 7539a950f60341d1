//! The agent's capabilities, as the chart gives them (charts/ferry/values.yaml: not
//! privileged, every capability dropped, a list added): a tree with everything `cp -a`
//! keeps, and what only root keeps, is copied identical by `ferry-agent copy` holding
//! exactly that list; and each capability of the list is needed: without it, the same copy
//! loses something (or fails). `ferry-agent confinement` names the same losses.
//!
//! The process runs as root under `setpriv`, with its bounding set cut to the list (root's
//! capabilities after exec are its bounding set) and no_new_privs, as the container's are.
//! The runtime's seccomp profile and device cgroup are the real-node tier's part
//! (`e2e/tests/kube.rs`, "the agent's confinement").

#[path = "../../engine/tests/common/mod.rs"]
mod tree;

use std::path::Path;
use std::process::{Command, Output};

use anyhow::{ensure, Context, Result};
use ferry_e2e::{agent_capabilities, setpriv_holding, workspace_bin};

/// `ferry-agent ARGS` as root holding exactly `caps` (Kubernetes names: CHOWN, ...).
fn agent_with(caps: &[&str], args: &[&Path]) -> Result<Output> {
    let wrapper = setpriv_holding(caps);
    Command::new(&wrapper[0])
        .args(&wrapper[1..])
        .arg(workspace_bin("ferry-agent", "ferry-agent")?)
        .args(args)
        .output()
        .context("run setpriv")
}

/// Copy a fresh tree holding `caps`: `Ok(())` when the copy succeeded and is identical,
/// otherwise what differs or failed. (A fresh tree each time: a copy without FOWNER reads
/// the source without O_NOATIME and so moves its access times.)
fn copy_holding(caps: &[&str]) -> Result<std::result::Result<(), String>> {
    let dir = tree::tempdir()?;
    let (src, dst) = (dir.path().join("src"), dir.path().join("dst"));
    tree::adversarial_tree(&src)?;
    tree::root_only_tree(&src)?;
    let before = tree::snapshot(&src)?;
    let copy: &Path = "copy".as_ref();
    let keep: &Path = "--keep-privileged-files".as_ref();
    let out = agent_with(caps, &[copy, keep, &src, &dst])?;
    if !out.status.success() {
        return Ok(Err(format!(
            "the copy failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(tree::compare(&before, &dst, tree::Check::default())
        .map(drop)
        .map_err(|e| format!("{e:#}")))
}

#[test]
fn the_charts_capabilities_keep_everything_cp_a_keeps_and_each_one_is_needed() -> Result<()> {
    if !tree::require_root("capabilities to drop, owners and device nodes to copy")
        || !tree::require_tools(&["setpriv", "setfacl"])
    {
        return Ok(());
    }
    let caps = agent_capabilities()?;
    let all: Vec<&str> = caps.iter().map(String::as_str).collect();
    if let Err(lost) = copy_holding(&all)? {
        anyhow::bail!("holding exactly the chart's {all:?}, the copy is not identical: {lost}");
    }
    // The agent's own account of it agrees.
    let confinement: &Path = "confinement".as_ref();
    let report = agent_with(&all, &[confinement])?;
    let report = String::from_utf8_lossy(&report.stdout).into_owned();
    ensure!(
        report.contains("lost from copies: nothing\n") && report.contains("no_new_privs: yes"),
        "ferry-agent confinement with the chart's capabilities:\n{report}"
    );

    let mut unneeded = Vec::new();
    for cap in &all {
        let fewer: Vec<&str> = all.iter().copied().filter(|c| c != cap).collect();
        match copy_holding(&fewer)? {
            Ok(()) => unneeded.push(*cap),
            Err(lost) => eprintln!(
                "without {cap}: {}",
                lost.lines().take(3).collect::<Vec<_>>().join(" / ")
            ),
        }
        let report = agent_with(&fewer, &[confinement])?;
        let report = String::from_utf8_lossy(&report.stdout).into_owned();
        ensure!(
            report.contains(&format!("lost from copies without {cap}: ")),
            "ferry-agent confinement without {cap} does not say what copies lose:\n{report}"
        );
    }
    ensure!(
        unneeded.is_empty(),
        "the chart adds {unneeded:?}, but the copy is identical without each: drop them"
    );
    Ok(())
}
