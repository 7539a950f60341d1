//! The local default as a new user tries it: `make demo` and `make dev-up` / `make dev-down`
//! (the `ferry-dev` binary itself, `demo`, `up` and `down`). Both must show a copy between
//! nodes as well as one on a node: before issue 32 their agents had no transfer ports, and a
//! CopyJob from node-a to node-b waited `NoAgent` for ever there.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use anyhow::{bail, ensure, Context, Result};
use ferry_e2e::{assert_same_contents, control_plane_installed_or_skip, Kubectl};

const FERRY_DEV: &str = env!("CARGO_BIN_EXE_ferry-dev");

/// The last lines of a process's stderr before any backtrace, for a failure message.
fn stderr_tail(out: &Output) -> String {
    let err = String::from_utf8_lossy(&out.stderr);
    let err = err.split("\nStack backtrace:").next().unwrap_or_default();
    // A progress line is rewritten in place (`\r`): its last state.
    let lines: Vec<&str> = err
        .lines()
        .map(|l| l.rsplit('\r').next().unwrap_or_default())
        .collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

/// `ferry-dev ARGS` with `envs`, which must succeed; its stdout.
fn ferry_dev(args: &[&str], envs: &[(&str, &Path)]) -> Result<String> {
    let out = Command::new(FERRY_DEV)
        .args(args)
        .envs(envs.iter().copied())
        .output()
        .with_context(|| format!("run ferry-dev {}", args.join(" ")))?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    ensure!(
        out.status.success(),
        "ferry-dev {} failed ({}):\nstdout:\n{stdout}\nstderr:\n{}",
        args.join(" "),
        out.status,
        stderr_tail(&out)
    );
    Ok(stdout)
}

/// The cell of `column` in job `name`'s row of `kubectl get copyjobs -A -o wide` output,
/// found by where the column's heading starts (cells may hold spaces: `82.5 MiB/s`).
fn cell<'a>(table: &'a str, name: &str, column: &str) -> Result<&'a str> {
    let header = table.lines().next().unwrap_or_default();
    let at = header
        .find(&format!(" {column} "))
        .map(|i| i + 1)
        .or_else(|| header.find(column))
        .with_context(|| format!("no column {column} in {header:?}"))?;
    let row = table
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some(name))
        .with_context(|| format!("no row for {name} in:\n{table}"))?;
    Ok(row
        .get(at..)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_default())
}

#[test]
fn make_demo_copies_on_one_node_and_between_nodes_and_both_copies_are_identical() -> Result<()> {
    if !control_plane_installed_or_skip()? {
        return Ok(());
    }
    let out = ferry_dev(&["demo"], &[])?;
    // Both jobs Succeeded in the table the demo prints: the local one on node-a, and the
    // one from node-a to node-b in mode Network.
    let table = out
        .split("$ kubectl get copyjobs -o wide\n")
        .nth(1)
        .context("no `kubectl get copyjobs -o wide` in the output")?;
    ensure!(
        cell(table, "demo", "PHASE")? == "Succeeded",
        "demo:\n{table}"
    );
    ensure!(
        cell(table, "demo-between-nodes", "PHASE")? == "Succeeded"
            && cell(table, "demo-between-nodes", "MODE")? == "Network",
        "demo-between-nodes:\n{table}"
    );
    // The demo compared each copy with the source (diff -r) and said so.
    for (job, node) in [("demo", "node-a"), ("demo-between-nodes", "node-b")] {
        let said = format!("the copy on {node} is identical to the source (diff -r)");
        ensure!(
            out.lines()
                .any(|l| l.starts_with(&format!("{job}: ")) && l.contains(&said)),
            "the demo did not check {job}'s copy on {node}:\n{out}"
        );
    }
    Ok(())
}

/// Runs `ferry-dev down` with the state of one `up` when dropped, whatever the test found.
struct Down(PathBuf);

impl Drop for Down {
    fn drop(&mut self) {
        if self.0.exists() {
            if let Err(e) = ferry_dev(&["down"], &[("FERRY_DEV_STATE", &self.0)]) {
                eprintln!("{e:#}");
            }
        }
    }
}

/// The value after `prefix` on the first line of `out` that has it.
fn after<'a>(out: &'a str, prefix: &str) -> Result<&'a str> {
    out.lines()
        .find_map(|l| l.trim_start().strip_prefix(prefix))
        .with_context(|| format!("no line with {prefix:?} in:\n{out}"))
}

#[test]
fn make_dev_up_runs_a_copy_between_nodes_as_it_says_and_make_dev_down_stops_everything(
) -> Result<()> {
    if !control_plane_installed_or_skip()? {
        return Ok(());
    }
    let state_dir = tempfile::tempdir()?;
    let state = state_dir.path().join("ferry-dev.state");
    let down = Down(state.clone());
    let out = ferry_dev(&["up"], &[("FERRY_DEV_STATE", &state)])?;
    let pids: Vec<String> = std::fs::read_to_string(&state)?
        .lines()
        .nth(1)
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_string)
        .collect();
    // etcd, kube-apiserver, the operator and two agents.
    ensure!(pids.len() == 5, "up recorded {pids:?}");

    // What it prints: the KUBECONFIG, each node's host root and its agent's transfer port.
    let kubeconfig = PathBuf::from(after(&out, "export KUBECONFIG=")?);
    let logs = PathBuf::from(after(&out, "logs: ")?);
    let mut roots = Vec::new();
    for (node, ip) in [("node-a", "127.0.0.2"), ("node-b", "127.0.0.3")] {
        let root = after(&out, &format!("node {node}: host root "))?;
        roots.push(PathBuf::from(root.split(" (").next().unwrap_or_default()));
        let transfer = after(&out, &format!("agent {node}: "))?;
        ensure!(
            transfer.contains(&format!("transfer port {ip}:")),
            "{node}: {transfer}"
        );
    }

    // The copy between nodes it says how to try, run as printed.
    let tried: Vec<&str> = out
        .lines()
        .skip_while(|l| !l.starts_with("Try a copy"))
        .map(str::trim)
        .filter(|l| l.starts_with("cp ") || l.starts_with("kubectl apply "))
        .collect();
    ensure!(
        tried.len() == 2,
        "no cp and kubectl apply to try in:\n{out}"
    );
    let kc = Kubectl::installed(kubeconfig.clone(), logs)?;
    let bin_dir = kc.bin().parent().context("kubectl's directory")?;
    for line in &tried {
        let path = format!(
            "{}:{}",
            bin_dir.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let ran = Command::new("bash")
            .args(["-c", line])
            .env("KUBECONFIG", &kubeconfig)
            .env("PATH", path)
            .output()?;
        ensure!(
            ran.status.success(),
            "{line}: {}",
            String::from_utf8_lossy(&ran.stderr)
        );
    }
    let src = roots[0].join("srv/demo/src");
    for (job, root) in [("demo", &roots[0]), ("demo-between-nodes", &roots[1])] {
        kc.wait_succeeded("default", job, 120)?;
        assert_same_contents(&src, &root.join("srv/demo/copy"))
            .with_context(|| format!("CopyJob {job}"))?;
    }
    let mode = kc.get("copyjob/demo-between-nodes", "default", "{.status.mode}")?;
    ensure!(mode == "Network", "demo-between-nodes ran in mode {mode:?}");

    // make dev-down: every process gone, the state removed.
    drop(down);
    ensure!(!state.exists(), "down left {}", state.display());
    let alive: Vec<&String> = pids
        .iter()
        .filter(|p| {
            std::fs::read_to_string(format!("/proc/{p}/stat")).is_ok_and(|s| !s.contains(") Z "))
        })
        .collect();
    if !alive.is_empty() {
        bail!("still running after down: {alive:?}");
    }
    ensure!(!kubeconfig.exists(), "down left {}", kubeconfig.display());
    Ok(())
}
