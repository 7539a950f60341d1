//! `ferry-dev bench-network` (`make bench-network`): Ferry's copy between nodes against the
//! tools trees are moved between nodes with today, in one run on one machine so that the
//! ratios compare like with like. On `bench/run.sh`'s trees `many` (100k files) and `large`
//! (2 x 1 GiB), each node's `/srv/vol` a tmpfs: a CopyJob from node-a to node-b (the process
//! tier with the chart's RBAC, as `e2e/tests/network.rs` sets it up: node-b's agent fetches
//! the tree from node-a's over their transfer ports on 127.0.0.2 and 127.0.0.3, mutual TLS),
//! `rsync -a` from an rsync daemon, a `tar | socat` pipe, and Ferry on one node
//! (`ferry-agent copy`, a CopyJob node-a -> node-a). One untimed warmup of each, then rounds
//! of one run of each; every copy counted, each tool's last copy checked by
//! `bench/check.py`. Then both agents' peak RSS over a cross-node CopyJob of a tree of a
//! million tiny files. Writes `bench/NETWORK.md`.
//!
//! This module: the benchmark's settings, tools, samples and results, the cluster it runs
//! on ([`Net`]) and the run from start to report. `setup` starts that cluster, `run` times
//! the tools on each tree (and profiles them), `memory` measures the agents' peak RSS over
//! the million-file copy, `report` writes `bench/NETWORK.md`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{ensure, Context, Result};
use ferry_e2e::{repo_root, ControlPlane, Proc};

use crate::machine::{loadavg, machine_busy_secs, shell_line, LoadSampler, Tmpfs, TreeCount};

pub(crate) mod cpus;
mod memory;
mod million;
mod patch;
mod report;
mod run;
mod setup;

pub use million::bench_million;
pub use patch::bench_patch;
use report::report;
pub(crate) use report::write_keeping_notes;
pub(crate) use run::generate;
pub(crate) use setup::rsync_daemon;

/// The namespace of the benchmark's jobs (Ferry's is the chart's, `ferry_e2e::CHART_NAMESPACE`).
const TEAM: &str = "bench";
/// The nodes, and the loopback address each one's transfer port listens on (as in
/// `e2e/tests/network.rs`): node-a serves the trees, node-b receives them.
const NODES: [(&str, &str); 2] = [("node-a", "127.0.0.2"), ("node-b", "127.0.0.3")];
/// Each node's `/srv/vol` is a tmpfs of its own. node-a's holds the trees (the memory
/// tree's tiny files take a page each: ~4 GiB for a million) and the copies made on one
/// node; node-b's the copies made across. Pages are taken as written, not at mount.
const TMPFS_A: &str = "size=12G,nr_inodes=4M,mode=0755";
const TMPFS_B: &str = "size=8G,nr_inodes=4M,mode=0755";
/// `bench/run.sh`'s `large` tree: `bench/gen_files.py large DIR 2 <1 GiB> 3`.
pub(crate) const LARGE: [&str; 3] = ["2", "1073741824", "3"];
/// `bench/run.sh`'s quick trees (BENCH_QUICK=1), for a try of the harness.
pub(crate) const QUICK_MANY: [&str; 8] = ["-n", "2000", "-b", "10000000", "-d", "5", "--seed", "1"];
pub(crate) const QUICK_LARGE: [&str; 3] = ["2", "16777216", "3"];
/// Files per directory of the memory benchmark's tree.
const PER_DIR: u64 = 1000;
/// How long a CopyJob of a timed tree, and of the memory tree, may take.
const JOB_TIMEOUT: u32 = 600;
const MEMORY_JOB_TIMEOUT: u32 = 3600;
/// The heading of the part of `bench/NETWORK.md` written by hand (an analysis of one run),
/// kept when the file is written again.
const HAND_HEADING: &str = "## Notes (by hand)";

/// What `make bench-network` sets: runs per tool and tree, the trees, the memory tree's files
/// (0: no memory benchmark), whether to profile the agents during one more copy, and
/// whether the trees are `bench/run.sh`'s quick ones (a try of the harness, not a result).
pub struct Settings {
    pub runs: usize,
    pub trees: Vec<String>,
    pub memory_files: u64,
    pub perf: bool,
    pub quick: bool,
}

impl Settings {
    /// From the environment: NET_TREES (default `many large`), NET_RSS_FILES (default
    /// 1,000,000; 10,000 quick), NET_PERF=1, NET_QUICK=1.
    pub fn from_env(runs: usize) -> Result<Self> {
        let quick = std::env::var("NET_QUICK").is_ok_and(|v| v == "1");
        let trees = std::env::var("NET_TREES")
            .unwrap_or_else(|_| "many large".into())
            .split_whitespace()
            .map(str::to_string)
            .collect();
        let memory_files = std::env::var("NET_RSS_FILES")
            .map_or(Ok(if quick { 10_000 } else { 1_000_000 }), |v| {
                v.trim().parse()
            })
            .context("NET_RSS_FILES must be a number")?;
        let perf = std::env::var("NET_PERF").is_ok_and(|v| v == "1");
        Ok(Self {
            runs,
            trees,
            memory_files,
            perf,
            quick,
        })
    }
}

/// `sync`, then drop the clean page cache (root). A failure only makes the runs noisier: it
/// is said, not fatal.
fn drop_page_cache() {
    if let Err(e) = crate::machine::drop_caches("1") {
        eprintln!("could not drop the page cache before a run: {e:#}");
    }
}

/// One way of moving a tree.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Tool {
    /// A CopyJob from vol-a (node-a) to vol-b (node-b) at the CRD's defaults (verify
    /// Checksum): node-b's agent fetches the tree from node-a's.
    Network,
    /// The same with `verify: None`: the peers hash nothing they write.
    NetworkNoVerify,
    /// `rsync -a` from an rsync daemon on node-a's address.
    Rsync,
    /// `tar c | socat` into a `socat | tar x` listener on node-b's address.
    TarSocat,
    /// A CopyJob from vol-a to vol-a at the CRD's defaults: node-a's agent copies alone.
    LocalJob,
    /// `ferry-agent copy --verify checksum --sync --manifest`: a CopyJob's engine work on one
    /// node without the control plane.
    Cli,
    /// `ferry-agent copy --verify none`.
    CliNoVerify,
}

const TOOLS: [Tool; 7] = [
    Tool::Network,
    Tool::NetworkNoVerify,
    Tool::Rsync,
    Tool::TarSocat,
    Tool::LocalJob,
    Tool::Cli,
    Tool::CliNoVerify,
];

impl Tool {
    fn name(self) -> &'static str {
        match self {
            Self::Network => "ferry-network",
            Self::NetworkNoVerify => "ferry-network, verify None",
            Self::Rsync => "rsync-daemon",
            Self::TarSocat => "tar-socat",
            Self::LocalJob => "ferry-local CopyJob",
            Self::Cli => "ferry-local CLI",
            Self::CliNoVerify => "ferry-local CLI, verify none",
        }
    }

    /// In job and directory names.
    fn slug(self) -> &'static str {
        match self {
            Self::Network => "net",
            Self::NetworkNoVerify => "net-none",
            Self::Rsync => "rsync",
            Self::TarSocat => "tar",
            Self::LocalJob => "local-job",
            Self::Cli => "cli",
            Self::CliNoVerify => "cli-none",
        }
    }

    fn is_job(self) -> bool {
        matches!(self, Self::Network | Self::NetworkNoVerify | Self::LocalJob)
    }
}

/// One timed run.
#[derive(Debug, Clone)]
struct Sample {
    secs: f64,
    /// CPU seconds the machine was busy during the run (every process, the kernel's too).
    machine_cpu: f64,
    /// CPU seconds of node-a's and of node-b's agent during the run.
    agent_cpu: [f64; 2],
    /// CPU seconds of the rest of the cluster (etcd, kube-apiserver, the operator, the rsync
    /// daemon) and of this harness with the children it waited for (the tools, kubectl).
    cluster_cpu: f64,
    harness_cpu: f64,
    /// A job's run: CPU seconds of each agent's threads during it, by thread name.
    threads: Option<[BTreeMap<String, f64>; 2]>,
    /// A job's shard as the copying agent logs it ("shard finished"): publishing Running,
    /// the copy, then the manifest and the flush; seconds.
    shard: Option<[f64; 3]>,
}

/// A copy a run made, removed (untimed) once counted and checked.
struct Made {
    dst: PathBuf,
    manifest: Option<PathBuf>,
}

impl Made {
    fn remove(&self) -> Result<()> {
        std::fs::remove_dir_all(&self.dst)
            .with_context(|| format!("remove {}", self.dst.display()))?;
        if let Some(m) = &self.manifest {
            match std::fs::remove_file(m) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(e).with_context(|| format!("remove {}", m.display()))
                }
                _ => {}
            }
        }
        Ok(())
    }
}

/// What one tree gave.
struct TreeResult {
    tree: String,
    count: TreeCount,
    samples: BTreeMap<Tool, Vec<Sample>>,
    /// Whether each tool's checked copy kept mode, owner and mtimes.
    meta_kept: BTreeMap<Tool, bool>,
    /// The agents' hottest symbols during one more ferry-network copy (NET_PERF=1).
    profile: Option<String>,
}

/// The memory benchmark's numbers.
struct Memory {
    count: TreeCount,
    secs: f64,
    shard: Option<[f64; 3]>,
    /// Per agent (node-a, node-b), KiB: the peak since it started (VmHWM before the reset:
    /// the timed copies' and warmups'), VmRSS when the peak was reset, VmHWM after the job,
    /// and the largest VmRSS sampled every 50 ms meanwhile.
    life_kib: [u64; 2],
    idle_kib: [u64; 2],
    hwm_kib: [u64; 2],
    sampled_kib: [u64; 2],
    meta_kept: bool,
}

/// The machine's load during the timed runs.
struct Load {
    samples: u32,
    busy: u32,
    others: f64,
    timed_secs: f64,
    before: String,
    after: String,
}

/// The control plane with the chart's manifests, the operator and node-a's and node-b's
/// agents on their ServiceAccounts' tokens, each node's `/srv/vol` on a tmpfs, and an rsync
/// daemon serving node-a's trees.
struct Net {
    // Fields drop in order: the processes stop before their tmpfs are unmounted, and those
    // before the control plane's directory (where they are mounted) is removed.
    agents: Vec<Proc>,
    _operator: Proc,
    _rsyncd: Proc,
    _tmpfs_b: Tmpfs,
    _tmpfs_a: Tmpfs,
    cp: ControlPlane,
    /// node-a's and node-b's `/srv/vol`, as this machine sees them.
    a: PathBuf,
    b: PathBuf,
    ferry: PathBuf,
    ftzz: PathBuf,
    rsync_port: u16,
    tar_port: u16,
    /// etcd, kube-apiserver and the operator: the cluster's processes other than the agents.
    cluster_pids: Vec<u32>,
    /// Which CPUs each node's processes run on (last: its cpusets go once they are empty).
    cpus: cpus::Cpus,
}

/// Ferry's copy between nodes against its peers, in one run; prints the report and, given
/// `out`, writes it there (keeping the part written by hand).
pub fn bench_network(settings: &Settings, out: Option<&Path>) -> Result<()> {
    ensure!(
        ferry_e2e::is_root(),
        "bench-network mounts tmpfs: run it as root"
    );
    for tool in ["rsync", "socat", "tar", "python3"] {
        ensure!(
            !shell_line(&format!("command -v {tool}")).is_empty(),
            "{tool} is missing: run bench/install-tools.sh"
        );
    }
    let build = built_from();
    let net = Net::start()?;
    let cpus = net.cpus.describe();
    let load_before = loadavg();
    let (machine_before, harness_before) = (machine_busy_secs(), net.harness_cpu());
    let timed = Instant::now();
    let sampler = LoadSampler::start();
    let mut results = Vec::new();
    let mut failed = None;
    for tree in &settings.trees {
        match net.bench_tree(tree, settings) {
            Ok(r) => results.push(r),
            Err(e) => {
                failed = Some(e.context(format!("the {tree} tree")));
                break;
            }
        }
    }
    let (samples, busy) = sampler.finish();
    let load = Load {
        samples,
        busy,
        others: (machine_busy_secs() - machine_before) - (net.harness_cpu() - harness_before),
        timed_secs: timed.elapsed().as_secs_f64(),
        before: load_before,
        after: loadavg(),
    };
    if let Some(e) = failed {
        // What was measured before, beside the report of the last run that finished (kept:
        // a failed run is no reference).
        let md = report(
            settings,
            &build,
            &results,
            &load,
            &Ok(None),
            Some(&e),
            &cpus,
        )?;
        print!("{md}");
        let file = repo_root().join("bench/work/NETWORK-failed.md");
        std::fs::create_dir_all(repo_root().join("bench/work"))?;
        std::fs::write(&file, md)?;
        eprintln!("this run failed: what it measured is in {}", file.display());
        return Err(e);
    }
    // The timed trees' report is written before the memory benchmark, which may fail on
    // its own.
    let write = |memory: &Result<Option<Memory>>| -> Result<()> {
        let md = report(settings, &build, &results, &load, memory, None, &cpus)?;
        print!("{md}");
        if let Some(file) = out {
            write_keeping_notes(file, &md)?;
            eprintln!("wrote {}", file.display());
        }
        Ok(())
    };
    write(&Ok(None))?;
    if settings.memory_files == 0 {
        return Ok(());
    }
    let memory = net.memory(settings.memory_files).map(Some);
    write(&memory)?;
    memory.map(drop)
}

/// The commit the binaries are built from, and whether the product's files differ from it.
pub(crate) fn built_from() -> String {
    let repo = repo_root();
    let git = |args: &str| shell_line(&format!("git -C '{}' {args}", repo.display()));
    let dirty = if git("status --porcelain -- agent operator crds Cargo.lock").is_empty() {
        ""
    } else {
        " with uncommitted changes to the product"
    };
    format!("commit {}{dirty}", git("rev-parse --short HEAD"))
}
