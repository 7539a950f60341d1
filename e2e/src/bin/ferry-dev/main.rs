//! `ferry-dev demo|up|down`: Ferry on a local control plane, for newcomers.
//!
//! - `demo`: etcd + kube-apiserver + the operator + two agents (simulated nodes node-a and
//!   node-b, each with its own host-root directory), applies `deploy/examples/` over a
//!   generated tree, shows progress, prints `kubectl get copyjobs -o wide` and exits 0 once
//!   the job has Succeeded; everything is stopped on exit.
//! - `up`: the same without the example, left running; prints the KUBECONFIG to export.
//! - `down`: stops what `up` started.
//! - `bench [SEQUENTIAL [BURST]]`: the control-plane benchmark (`make bench-control-plane`).
//! - `bench-throughput [RUNS [FILE]]`: a CopyJob against `ferry-agent copy` on the 100k-file
//!   tree of `bench/run.sh`, release builds, on a tmpfs (`make bench-throughput`); prints a
//!   Markdown section and, given FILE, puts it into FILE in place of the previous one.
//! - `bench-throughput-cold [RUNS [FILE]]`: the same on the disk, caches dropped before every
//!   run (`make bench-throughput-cold`, into `bench/COLD-COPYJOB.md`).
//! - `bench-rerun [RUNS [FILE]]`: re-runs over a destination that has the tree, Ferry (CLI
//!   and CopyJob) against `rsync -a`, no change and 1% touched (`make bench-rerun`).
//! - `bench-network [RUNS [FILE]]`: a CopyJob between two nodes against rsync, a tar pipe and
//!   Ferry on one node, and the agents' peak RSS over a 1M-file copy (`make bench-network`);
//!   writes FILE (bench/NETWORK.md).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use ferry_e2e::{assert_same_contents, repo_root, ControlPlane, Proc};

mod control_plane;
mod machine;
mod network;
mod rerun;
mod throughput;

const NODES: [&str; 2] = ["node-a", "node-b"];

fn state_file() -> PathBuf {
    std::env::temp_dir().join("ferry-dev.state")
}

/// Control plane, CRDs, simulated nodes, operator and agents.
fn bring_up() -> Result<(ControlPlane, Vec<Proc>, PathBuf)> {
    eprintln!("starting etcd and kube-apiserver ...");
    let cp = ControlPlane::start_required()?;
    cp.install_crds()?;
    eprintln!(
        "building and starting the operator and {} agents ...",
        NODES.len()
    );
    let (procs, hosts) = cp.start_ferry(&NODES)?;
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

fn demo() -> Result<()> {
    let (cp, _procs, hosts) = bring_up()?;
    let src = hosts.join("node-a/srv/demo/src");
    let (files, bytes) = generate_tree(&src)?;
    eprintln!("generated {files} files ({bytes} bytes) on node-a under /srv/demo/src");
    let examples = repo_root().join("deploy/examples");
    println!("$ kubectl apply -f deploy/examples/");
    print!(
        "{}",
        cp.kubectl_ok(&["apply", "-f", &examples.to_string_lossy()])?
    );
    let start = Instant::now();
    loop {
        let status = cp.kubectl_ok(&[
            "get",
            "copyjob",
            "demo",
            "-n",
            "default",
            "-o",
            "jsonpath={.status.phase} {.status.progress.filesDone} {.status.progress.bytesDone}",
        ])?;
        let mut parts = status.split_whitespace();
        let phase = parts.next().unwrap_or("Pending").to_string();
        let done_files: u64 = parts.next().and_then(|v| v.parse().ok()).unwrap_or(0);
        let done_bytes: u64 = parts.next().and_then(|v| v.parse().ok()).unwrap_or(0);
        eprint!(
            "\r\x1b[K{phase:<10} {done_files}/{files} files  {done_bytes}/{bytes} bytes  {:.1}s",
            start.elapsed().as_secs_f64()
        );
        match phase.as_str() {
            "Succeeded" => break,
            "Failed" => {
                eprintln!();
                bail!(
                    "the CopyJob failed:\n{}",
                    cp.kubectl_ok(&["get", "copyjob", "demo", "-n", "default", "-o", "yaml"])?
                );
            }
            _ if start.elapsed() > Duration::from_secs(180) => {
                eprintln!();
                bail!(
                    "no success after 180 s; operator log:\n{}",
                    cp.log_tail("operator.log", 10)
                );
            }
            _ => std::thread::sleep(Duration::from_millis(250)),
        }
    }
    eprintln!();
    println!("$ kubectl get copyjobs -o wide");
    print!(
        "{}",
        cp.kubectl_ok(&["get", "copyjobs", "-A", "-o", "wide"])?
    );
    let copy = hosts.join("node-a/srv/demo/copy");
    assert_same_contents(&src, &copy)?;
    let manifest = cp.kubectl_ok(&[
        "get",
        "copyjob",
        "demo",
        "-n",
        "default",
        "-o",
        "jsonpath={.status.manifest}",
    ])?;
    println!("copy on node-a is identical to the source (diff -r); manifest: /srv/demo/{manifest}");
    Ok(())
}

fn up() -> Result<()> {
    let (cp, procs, hosts) = bring_up()?;
    let kubeconfig = cp.kubeconfig.clone();
    let mut endpoints = vec![format!(
        "  operator: http://127.0.0.1:{}/metrics (and /healthz, /readyz)",
        cp.operator_port()?
    )];
    for node in NODES {
        endpoints.push(format!(
            "  agent {node}: http://127.0.0.1:{}/metrics",
            cp.agent_port(node)?
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
    println!("Ferry is running on a local control plane.");
    println!("  export KUBECONFIG={}", kubeconfig.display());
    for node in NODES {
        println!("  node {node}: host root {}", hosts.join(node).display());
    }
    for line in &endpoints {
        println!("{line}");
    }
    println!("  logs: {}", dir.display());
    println!("Stop it with: make dev-down");
    Ok(())
}

fn down() -> Result<()> {
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

fn main() -> Result<()> {
    match std::env::args().nth(1).as_deref() {
        Some("bench") => {
            let arg = |i: usize, d: usize| {
                std::env::args()
                    .nth(i)
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(d)
            };
            control_plane::bench(arg(2, 20), arg(3, 500))
        }
        Some(cmd @ ("bench-throughput" | "bench-throughput-kube" | "bench-throughput-cold")) => {
            let (tier, cache) = match cmd {
                "bench-throughput" => (throughput::Tier::Process, throughput::Cache::Warm),
                "bench-throughput-cold" => (throughput::Tier::Process, throughput::Cache::Cold),
                _ => (throughput::Tier::Kube, throughput::Cache::Warm),
            };
            let runs = std::env::args()
                .nth(2)
                .map_or(Ok(5), |v| v.parse::<usize>())
                .with_context(|| format!("{cmd} RUNS must be a number"))?;
            ensure!(runs > 0, "{cmd} RUNS must be at least 1");
            let out = std::env::args().nth(3).map(PathBuf::from);
            throughput::bench_throughput(tier, cache, runs, out.as_deref())
        }
        Some("bench-rerun") => {
            let runs = std::env::args()
                .nth(2)
                .map_or(Ok(5), |v| v.parse::<usize>())
                .context("bench-rerun RUNS must be a number")?;
            ensure!(runs > 0, "bench-rerun RUNS must be at least 1");
            let out = std::env::args().nth(3).map(PathBuf::from);
            rerun::bench_rerun(runs, out.as_deref())
        }
        Some("bench-network") => {
            let runs = std::env::args()
                .nth(2)
                .filter(|v| !v.is_empty())
                .map_or(Ok(5), |v| v.parse::<usize>())
                .context("bench-network RUNS must be a number")?;
            ensure!(runs > 0, "bench-network RUNS must be at least 1");
            let out = std::env::args().nth(3).map(PathBuf::from);
            network::bench_network(&network::Settings::from_env(runs)?, out.as_deref())
        }
        Some("demo") => demo(),
        Some("up") => up(),
        Some("down") => down(),
        _ => bail!(
            "usage: ferry-dev demo|up|down|bench [SEQUENTIAL [BURST]]|bench-throughput[-kube|-cold] [RUNS [FILE]]|bench-rerun [RUNS [FILE]]|bench-network [RUNS [FILE]]"
        ),
    }
}
