//! `ferry-dev demo|up|down` (`make demo`, `make dev-up`, `make dev-down`): Ferry on a local
//! control plane as its Helm chart runs it (`ferry_e2e`'s `start_ferry_as_chart`: the
//! chart's RBAC and admission policies, the operator and the agents on their
//! ServiceAccounts' tokens, each agent's bound to its Node, and each agent's transfer port on
//! a loopback address of its own), so that a copy between nodes runs as a local one does.
//! `demo` runs `deploy/examples/` (a copy on node-a and one from node-a to node-b) to
//! Succeeded and checks both copies; `up` leaves it all running, `down` stops it.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use ferry_e2e::{assert_same_contents, repo_root, transfer_ip, ControlPlane, Proc};
use serde_json::Value;

use crate::NODES;

/// How long the demo's jobs may take together.
const DEMO_TIMEOUT: Duration = Duration::from_secs(180);

/// The jobs of `deploy/examples/`: name, the node that has the destination, and what the
/// copy is, for the demo's last lines.
const JOBS: [(&str, &str, &str); 2] = [
    ("demo", "node-a", "a copy on node-a"),
    (
        "demo-between-nodes",
        "node-b",
        "a copy from node-a to node-b",
    ),
];

/// Where `up` records what `down` stops: `FERRY_DEV_STATE`, else `ferry-dev.state` in the
/// temporary directory.
fn state_file() -> PathBuf {
    std::env::var_os("FERRY_DEV_STATE").map_or_else(
        || std::env::temp_dir().join("ferry-dev.state"),
        PathBuf::from,
    )
}

/// Control plane, the chart's manifests with its policies in force, simulated nodes, the
/// operator and the agents as the chart runs them; returns once both agents can be paired.
fn bring_up() -> Result<(ControlPlane, Vec<Proc>, PathBuf)> {
    eprintln!("starting etcd and kube-apiserver ...");
    let cp = ControlPlane::start_required()?;
    eprintln!(
        "applying deploy/ferry.yaml (the chart's CRDs, RBAC and admission policies), building and starting the operator and {} agents with transfer ports ...",
        NODES.len()
    );
    let (procs, hosts) = cp.start_ferry_as_chart(&NODES)?;
    Ok((cp, procs, hosts))
}

/// A few thousand files of varied sizes, deterministic.
fn generate_tree(root: &Path) -> Result<(u64, u64)> {
    let (mut files, mut bytes) = (0, 0);
    for d in 0..40u64 {
        let dir = root.join(format!("dir{d:02}"));
        std::fs::create_dir_all(dir.join("nested"))?;
        for f in 0..75u64 {
            let len = (d * 7919 + f * 104_729) % 65_536;
            let body: Vec<u8> = (0..len).map(|i| (i ^ (d * 31 + f)) as u8).collect();
            let sub = if f % 3 == 0 {
                dir.join("nested")
            } else {
                dir.clone()
            };
            std::fs::write(sub.join(format!("file{f:03}.bin")), &body)?;
            files += 1;
            bytes += len;
        }
    }
    Ok((files, bytes))
}

/// The status of CopyJob `default/name` (null before the operator's first write).
fn status(cp: &ControlPlane, name: &str) -> Result<Value> {
    let out = cp.kubectl_ok(&["get", "copyjob", name, "-n", "default", "-o", "json"])?;
    Ok(serde_json::from_str::<Value>(&out)?["status"].clone())
}

/// Why a job is not done yet, from its conditions (e.g. `Scheduled=False NoAgent: ...`).
fn conditions(status: &Value) -> String {
    status["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            format!(
                "{}={} {}: {}",
                c["type"].as_str().unwrap_or_default(),
                c["status"].as_str().unwrap_or_default(),
                c["reason"].as_str().unwrap_or_default(),
                c["message"].as_str().unwrap_or_default()
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// Wait until every job of [`JOBS`] has Succeeded, showing their progress on one line.
fn wait_for_jobs(cp: &ControlPlane, files: u64) -> Result<()> {
    let start = Instant::now();
    loop {
        let mut line = Vec::new();
        let mut waiting = Vec::new();
        for (name, _, _) in JOBS {
            let s = status(cp, name)?;
            let phase = s["phase"].as_str().unwrap_or("Pending").to_string();
            let done_files = s["progress"]["filesDone"].as_u64().unwrap_or(0);
            line.push(format!("{name}: {phase:<9} {done_files}/{files} files"));
            match phase.as_str() {
                "Succeeded" => {}
                "Failed" => {
                    eprintln!();
                    bail!(
                        "CopyJob {name} failed:\n{}",
                        cp.kubectl_ok(&["get", "copyjob", name, "-n", "default", "-o", "yaml"])?
                    );
                }
                _ => waiting.push(format!("{name} is still {phase}: {}", conditions(&s))),
            }
        }
        eprint!(
            "\r\x1b[K{}  {:.1}s",
            line.join("  |  "),
            start.elapsed().as_secs_f64()
        );
        if waiting.is_empty() {
            eprintln!();
            return Ok(());
        }
        if start.elapsed() > DEMO_TIMEOUT {
            eprintln!();
            bail!(
                "after {DEMO_TIMEOUT:?}:\n{}\noperator log:\n{}\nnode-a's agent:\n{}\nnode-b's agent:\n{}",
                waiting.join("\n"),
                cp.log_tail("operator.log", 10),
                cp.log_tail("agent-node-a.log", 5),
                cp.log_tail("agent-node-b.log", 5)
            );
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

pub fn demo() -> Result<()> {
    let (cp, _procs, hosts) = bring_up()?;
    let src = hosts.join("node-a/srv/demo/src");
    let (files, bytes) = generate_tree(&src)?;
    // node-b's StorageRoot (deploy/examples/between-nodes.yaml): the same path, empty.
    std::fs::create_dir_all(hosts.join("node-b/srv/demo"))?;
    eprintln!("generated {files} files ({bytes} bytes) on node-a under /srv/demo/src");
    let examples = repo_root().join("deploy/examples");
    println!("$ kubectl apply -f deploy/examples/");
    print!(
        "{}",
        cp.kubectl_ok(&["apply", "-f", &examples.to_string_lossy()])?
    );
    wait_for_jobs(&cp, files)?;
    println!("$ kubectl get copyjobs -o wide");
    print!(
        "{}",
        cp.kubectl_ok(&["get", "copyjobs", "-A", "-o", "wide"])?
    );
    for (name, node, what) in JOBS {
        let s = status(&cp, name)?;
        let copy = hosts.join(node).join("srv/demo/copy");
        assert_same_contents(&src, &copy).with_context(|| format!("CopyJob {name}"))?;
        let shard = &s["shards"][0];
        let how = if node == "node-a" {
            ensure!(
                s["mode"] != "Network" && shard["node"] == "node-a",
                "{name} was not copied on node-a: mode {}, shard {shard}",
                s["mode"]
            );
            "by node-a's agent".to_string()
        } else {
            ensure!(
                s["mode"] == "Network" && shard["sender"] == "node-a" && shard["node"] == node,
                "{name} was not copied from node-a to {node}: mode {}, shard {shard}",
                s["mode"]
            );
            format!("by {node}'s agent from node-a's over their transfer ports (mutual TLS)")
        };
        println!(
            "{name}: {what} {how}; the copy on {node} is identical to the source (diff -r); manifest: {node}:/srv/demo/{}",
            s["manifest"].as_str().unwrap_or("(none)")
        );
    }
    Ok(())
}

pub fn up() -> Result<()> {
    let (cp, procs, hosts) = bring_up()?;
    // The examples' StorageRoots: /srv/demo on node-a (with src/ for the tree to copy) and
    // on node-b.
    std::fs::create_dir_all(hosts.join("node-a/srv/demo/src"))?;
    std::fs::create_dir_all(hosts.join("node-b/srv/demo"))?;
    let kubeconfig = cp.kubeconfig.clone();
    let mut endpoints = vec![format!(
        "  operator: http://127.0.0.1:{}/metrics (and /healthz, /readyz)",
        cp.operator_port()?
    )];
    for node in NODES {
        endpoints.push(format!(
            "  agent {node}: http://127.0.0.1:{}/metrics, transfer port {}",
            cp.agent_port(node)?,
            cp.advertised_transfer_address(node, ferry_e2e::ADVERTISED_WITHIN)?
        ));
    }
    let mut pids: Vec<u32> = procs.into_iter().map(Proc::detach).collect();
    let (dir, cp_pids) = cp.detach();
    pids.extend(cp_pids);
    let pid_list: Vec<String> = pids.iter().map(u32::to_string).collect();
    std::fs::write(
        state_file(),
        format!("{}\n{}\n", dir.display(), pid_list.join(" ")),
    )?;
    println!("Ferry is running on a local control plane, as its Helm chart runs it (deploy/ferry.yaml: RBAC, admission policies; each agent on its node's token with a transfer port).");
    println!("  export KUBECONFIG={}", kubeconfig.display());
    for (i, node) in NODES.iter().enumerate() {
        println!(
            "  node {node}: host root {} (its agent at {})",
            hosts.join(node).display(),
            transfer_ip(i)
        );
    }
    for line in &endpoints {
        println!("{line}");
    }
    println!("  logs: {}", dir.display());
    let examples = repo_root().join("deploy/examples");
    println!("Try a copy on node-a and one between nodes (node-a -> node-b):");
    println!(
        "  cp -r {}/. {}/",
        repo_root().join("charts").display(),
        hosts.join("node-a/srv/demo/src").display()
    );
    println!("  kubectl apply -f {}/", examples.display());
    println!("  kubectl get copyjobs -o wide -w");
    println!(
        "  (demo-between-nodes, MODE Network, writes {}; demo writes {})",
        hosts.join("node-b/srv/demo/copy").display(),
        hosts.join("node-a/srv/demo/copy").display()
    );
    println!("Stop it with: make dev-down");
    Ok(())
}

pub fn down() -> Result<()> {
    let state = std::fs::read_to_string(state_file())
        .context("nothing to stop (no state from make dev-up)")?;
    let mut lines = state.lines();
    let dir = lines.next().unwrap_or_default().to_string();
    let pids: Vec<&str> = lines
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    // TERM, a grace period, then KILL for whatever still runs (a zombie counts as gone).
    let alive = |pid: &str| {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "))
    };
    for pid in &pids {
        let _ = std::process::Command::new("kill").arg(pid).status();
    }
    let deadline = Instant::now() + Duration::from_secs(15);
    while pids.iter().any(|p| alive(p)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    for pid in pids.iter().filter(|p| alive(p)) {
        let _ = std::process::Command::new("kill")
            .args(["-9", pid])
            .status();
    }
    std::fs::remove_file(state_file())?;
    if !dir.is_empty() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    println!("stopped");
    Ok(())
}
