//! `ferry-dev demo|up|down`: Ferry on a local control plane, for newcomers.
//!
//! - `demo`: etcd + kube-apiserver with the chart's manifests (`deploy/ferry.yaml`: RBAC,
//!   admission policies), the operator + two agents as the chart runs them (simulated nodes
//!   node-a and node-b, each with its own host-root directory, each agent with a transfer
//!   port on its own loopback address), applies `deploy/examples/` over a generated tree (a
//!   copy on node-a, and one from node-a to node-b), shows progress, prints `kubectl get
//!   copyjobs -o wide` and exits 0 once both jobs have Succeeded and both copies are
//!   identical to the source; everything is stopped on exit (`dev.rs`).
//! - `up`: the same without the example, left running; prints the KUBECONFIG to export,
//!   each node's host root and how to try a copy between nodes.
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
//! - `bench-patch [RUNS [FILE]]`: one large file changed in a few places, copied again
//!   between two nodes by a CopyJob by checksum and by `rsync -a` (`make bench-patch`,
//!   into `bench/PATCH.md`).
//! - `bench-clusters [RUNS [FILE]]`: Ferry between two clusters (a CopyExport read by a
//!   CopyJob of the other) against rsync from a daemon, rsync over ssh and Ferry between
//!   nodes; first copies, copies again after 0.1% of the files or a few bytes of a large
//!   file changed; bytes on the wire and peak RSS of both sides (`make bench-clusters`,
//!   into `bench/CLUSTERS.md`).
//! - `bench-million [FILE]`: a million files as CopyJobs on one node and between nodes, and
//!   a dry run of ten million (status size, peak RSS, API requests; `make bench-million-jobs`,
//!   into `bench/MILLION-COPYJOB.md`).

use std::path::PathBuf;

use anyhow::{bail, ensure, Context, Result};
use ferry_e2e::{ControlPlane, Proc};

mod clusters;
mod control_plane;
mod dev;
mod machine;
mod network;
mod rerun;
mod throughput;

const NODES: [&str; 2] = ["node-a", "node-b"];

/// The benchmarks' control plane (`bench`, `bench-throughput`): the CRDs, simulated nodes,
/// the operator and agents on the admin's credentials, without transfer ports: what they
/// have always measured (`make dev-up` and `make demo` run the chart's setup, `dev.rs`).
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
            let (runs, out) = runs_and_file(cmd)?;
            throughput::bench_throughput(tier, cache, runs, out.as_deref())
        }
        Some("bench-rerun") => {
            let (runs, out) = runs_and_file("bench-rerun")?;
            rerun::bench_rerun(runs, out.as_deref())
        }
        Some("bench-network") => {
            let (runs, out) = runs_and_file("bench-network")?;
            network::bench_network(&network::Settings::from_env(runs)?, out.as_deref())
        }
        Some("bench-patch") => {
            let (runs, out) = runs_and_file("bench-patch")?;
            network::bench_patch(runs, out.as_deref())
        }
        Some("bench-clusters") => {
            let (runs, out) = runs_and_file("bench-clusters")?;
            let out = out.unwrap_or_else(clusters::default_out);
            clusters::bench_clusters(&clusters::Settings::from_env(runs)?, Some(&out))
        }
        Some("bench-million") => {
            let out = std::env::args().nth(2).map(PathBuf::from);
            network::bench_million(out.as_deref())
        }
        Some("demo") => dev::demo(),
        Some("up") => dev::up(),
        Some("down") => dev::down(),
        _ => bail!(
            "usage: ferry-dev demo|up|down|bench [SEQUENTIAL [BURST]]|bench-throughput[-kube|-cold] [RUNS [FILE]]|bench-rerun [RUNS [FILE]]|bench-network [RUNS [FILE]]|bench-patch [RUNS [FILE]]|bench-clusters [RUNS [FILE]]|bench-million [FILE]"
        ),
    }
}

/// A bench command's `[RUNS [FILE]]`: RUNS (default 5, at least 1; empty is the default)
/// and FILE.
fn runs_and_file(cmd: &str) -> Result<(usize, Option<PathBuf>)> {
    let runs = std::env::args()
        .nth(2)
        .filter(|v| !v.is_empty())
        .map_or(Ok(5), |v| v.parse::<usize>())
        .with_context(|| format!("{cmd} RUNS must be a number"))?;
    ensure!(runs > 0, "{cmd} RUNS must be at least 1");
    Ok((runs, std::env::args().nth(3).map(PathBuf::from)))
}
