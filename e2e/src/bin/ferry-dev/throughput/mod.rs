//! `ferry-dev bench-throughput`: a CopyJob against `ferry-agent copy` on `bench/run.sh`'s
//! 100k-file tree (`make bench-throughput`): set up, warm up, timed runs alternating the
//! two, a byte-for-byte check of the last copies, and a Markdown report. In the process
//! tier (the agent a host process on the admin's credentials) or in the real one-node tier
//! (`make bench-throughput-kube`: the agent the chart's DaemonSet pod, from `make image`).
//!
//! This module: the benchmark's settings (tier, cache), its run from set-up to report, and
//! the helpers other benchmarks share (release builds, the tree generator, the copy check);
//! `bench` owns the running benchmark (set-up, the timed CLI and CopyJob runs), `report`
//! the Markdown section and its place in the file.

use std::path::{Path, PathBuf};

use anyhow::{ensure, Context, Result};
use ferry_e2e::kube::KubeTier;
use ferry_e2e::{repo_root, ControlPlane, Kubectl, Proc};

use crate::machine::RunCpu;

mod bench;
mod report;

pub(crate) use bench::Bench;
use report::{report, splice_section};

/// `bench/run.sh`'s 100k-file tree (`many`): `ftzz -e` with these arguments.
pub(crate) const TREE_100K: [&str; 8] =
    ["-n", "100000", "-b", "500000000", "-d", "5", "--seed", "1"];

/// The heading of the throughput section of `bench/CONTROL-PLANE.md`; everything from it to
/// the end of the file is that section (`make bench-control-plane` keeps it).
const THROUGHPUT_HEADING: &str = "## Throughput";

/// Size of the cold benchmark's ext4 image (sparse): the tree, two copies and their manifests.
const EXT4_SIZE: &str = "8G";

/// Mount options of the benchmark's tmpfs.
const TMPFS_OPTIONS: &str = "size=4G,nr_inodes=1M,mode=0755";

/// Whether the source is in the page cache when a run starts.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Cache {
    /// The tree on a tmpfs: always in memory.
    Warm,
    /// The tree on the disk, in a new journalled ext4 (a loop-mounted image file on `/`, as
    /// `bench/run.sh`'s cold `ext4`), with `sync` and `echo 3 > /proc/sys/vm/drop_caches`
    /// before every run, untimed: the data, the inodes and the directories are read from the
    /// device. Not `/` itself: on the machine this was written on it is ext4 without a
    /// journal, whose allocator rescans recently deleted inodes on every new file, so a run
    /// after the previous run's copy was deleted varied by 2x (bench/README.md).
    Cold,
}

/// Where the CopyJob runs.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    /// The process tier: etcd, kube-apiserver, the operator and two agents as host
    /// processes (debug or release builds from this workspace).
    Process,
    /// The real one-node tier (e2e/kube/up.sh): the agent a pod of the chart's DaemonSet.
    Kube,
}

/// The cluster a run uses; both are reached with kubectl.
enum Cluster {
    Process { cp: ControlPlane, _procs: Vec<Proc> },
    Kube(KubeTier),
}

impl std::ops::Deref for Cluster {
    type Target = Kubectl;
    fn deref(&self) -> &Kubectl {
        match self {
            Self::Process { cp, .. } => cp,
            Self::Kube(tier) => tier,
        }
    }
}

/// Throughput of a CopyJob against `ferry-agent copy` on `bench/run.sh`'s 100k-file tree,
/// both on one tmpfs mounted for the purpose at node-a's `/srv/throughput` (a StorageRoot),
/// release builds of the agent and the operator, the same engine options (verify Checksum,
/// the CRD default; a manifest; workers = CPUs). One untimed warmup each, then `runs`
/// alternating pairs. Prints a Markdown section; with `out`, also puts it into that file.
pub fn bench_throughput(tier: Tier, cache: Cache, runs: usize, out: Option<&Path>) -> Result<()> {
    let bench = Bench::set_up(tier, cache)?;
    eprintln!("warmup: one ferry-agent copy and one CopyJob, untimed ...");
    let (_, _, dst, manifest) = bench.cli("warmup")?;
    Bench::remove(&dst, &manifest)?;
    let (_, _, _, dst, manifest) = bench.job("warmup")?;
    Bench::remove(&dst, &manifest)?;
    let timed = bench.timed_runs(runs)?;
    let checked = bench.check_byte_for_byte(&timed.last)?;
    let md = report(tier, cache, bench.tree(), runs, &timed, &checked)?;
    print!("{md}");
    if let Some(file) = out {
        if tier == Tier::Kube && !file.exists() {
            std::fs::write(file, "# Throughput through the real agent pod\n\nWhat the agent as a pod of the chart's DaemonSet (the real one-node tier, `make kube-up`) costs next to the same binary run on the host; the process tier's figures are in `CONTROL-PLANE.md`.\n")?;
        }
        if cache == Cache::Cold && !file.exists() {
            std::fs::write(file, "# A CopyJob on cold data\n\nA CopyJob through the agent next to `ferry-agent copy`, on a tree read from the disk with the page cache dropped before every run; the warm (tmpfs) figures are in `CONTROL-PLANE.md`, the CLI against the other tools cold in `COLD.md`.\n")?;
        }
        splice_section(file, &md)?;
        eprintln!("wrote the section into {}", file.display());
    }
    Ok(())
}

/// What the timed runs measured.
struct Timed {
    cli_secs: Vec<f64>,
    job_secs: Vec<f64>,
    agent_secs: Vec<f64>,
    /// CPU seconds during each run, CLI and CopyJob.
    cli_cpu: Vec<RunCpu>,
    job_cpu: Vec<RunCpu>,
    /// The last destination of each kind, kept for the byte-for-byte check.
    last: Vec<PathBuf>,
    /// Load during the timed runs: (samples, samples with a compiler running), CPU seconds
    /// of processes other than the harness's, wall time, load averages before and after.
    samples: u32,
    busy: u32,
    others: f64,
    timed_secs: f64,
    load_before: String,
    load_after: String,
}

/// Release builds of ferry-agent and ferry-operator from here on (`ferry_e2e::workspace_bin`
/// reads `FERRY_E2E_RELEASE`): a benchmark of debug builds measures the compiler.
pub(crate) fn release_builds() {
    if std::env::var_os("FERRY_E2E_RELEASE").is_none_or(|v| v != "1") {
        std::env::set_var("FERRY_E2E_RELEASE", "1");
    }
}

/// `ftzz`, the benchmark's tree generator, as `bench/install-tools.sh` installs it.
pub(crate) fn ftzz() -> Result<PathBuf> {
    let tools = std::env::var_os("FERRY_TOOLS")
        .map_or_else(|| PathBuf::from("/var/cache/ferry-tools"), PathBuf::from);
    let ftzz = tools.join("cargo/bin/ftzz");
    ensure!(
        ftzz.exists(),
        "{} is missing: run bench/install-tools.sh",
        ftzz.display()
    );
    Ok(ftzz)
}

/// `dst` against `src` by the file benchmark's correctness gate (`bench/check.py`: paths,
/// types, sizes, bytes), its JSON report written to `report`; an error when they differ,
/// else whether mode, owner and mtimes were kept.
pub(crate) fn check_copy(src: &Path, dst: &Path, report: &Path) -> Result<bool> {
    eprintln!("bench/check.py {} ...", dst.display());
    let ok = std::process::Command::new("python3")
        .stdout(std::io::stderr())
        .arg(repo_root().join("bench/check.py"))
        .arg(src)
        .arg(dst)
        .arg(report)
        .status()
        .context("run bench/check.py")?;
    ensure!(ok.success(), "bench/check.py failed on {}", dst.display());
    let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(report)?)?;
    ensure!(
        json["ok"] == true,
        "{} differs from the source: {}",
        dst.display(),
        json["errors"]
    );
    Ok(json["meta_preserved"] == true)
}

/// How long one CopyJob took (see [`Bench::job_into`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct JobTimes {
    /// From the watcher seeing it created to seeing it `Succeeded`: the job's own time.
    pub created_to_done: f64,
    /// From the start of `kubectl apply` to the watcher seeing it `Succeeded`.
    pub apply_to_done: f64,
}
