//! `ferry-dev bench-clusters` (`make bench-clusters`): Ferry between two clusters against
//! what the peers run between clusters, in one run on one machine so that the ratios compare
//! like with like. Two control planes (east and west, the process tier, release builds),
//! each with the chart rendered with peering on and trusting the other; east has two nodes
//! (east-a holds the trees, east-b receives the copies between nodes) and west one (west-a).
//! Each node's `/srv/vol` is a tmpfs of its own; each node's agent listens on its own
//! loopback address. The tools, each writing its own destination:
//!
//! - `ferry-clusters`: a CopyJob of west whose source is a CopyExport of east (west-a's
//!   agent reads east-a's over its peering port, mutual TLS between the installs);
//! - `ferry-nodes`: a CopyJob of east from east-a to east-b (the transfer port);
//! - `rsync-daemon`: `rsync -a` from an rsync daemon on east-a's address, into west-a's;
//! - `rsync-ssh`: `rsync -a` over ssh to an sshd on east-a's address (what pv-migrate runs
//!   between clusters), into west-a's.
//!
//! On `bench/run.sh`'s trees: `many` (100k files) is copied, then 0.1% of its files change
//! and every tool copies again into its copy; `large` (2 x 1 GiB) is copied, then one of
//! its files gets 16 bytes written at 8 places and every tool copies again (Ferry with
//! `compare: Checksum`). One untimed warmup round, then rounds of every tool, the order
//! rotated. Each run: its wall time, the bytes on the wire each way (iptables counters on
//! the tool's server port: IP packets, headers included), and the peak RSS of each side's
//! processes. Every copy is counted, and the last round's are checked by `bench/check.py`.
//! Writes `bench/CLUSTERS.md`.
//!
//! This module: the settings, tools, samples and the run from start to report. `setup`
//! starts the two clusters and the peers' servers, `measure` counts the wire and the
//! memory, `run` times one tool, `report` writes the Markdown.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{ensure, Context, Result};
use ferry_e2e::{repo_root, ControlPlane, Proc};

use crate::machine::{count_tree, loadavg, shell_line, Tmpfs, TreeCount};
use crate::network::cpus::Cpus;
use crate::network::write_keeping_notes;
use crate::throughput::check_copy;

mod measure;
mod report;
mod run;
mod setup;

/// The namespace of the source and of the jobs between nodes on east; the reader's on west.
const TEAM: &str = "bench";
const READER: &str = "bench-dr";
/// The export of east's `src/` (the trees), and the Secret the operator writes for it.
const EXPORT: &str = "trees";
const EXPORT_SECRET: &str = "trees-ferry-export";
/// The nodes, each with its agent's loopback address.
const EAST_A: (&str, &str) = ("east-a", "127.0.0.2");
const EAST_B: (&str, &str) = ("east-b", "127.0.0.3");
const WEST_A: (&str, &str) = ("west-a", "127.0.0.4");
/// How long a timed CopyJob may take.
const JOB_TIMEOUT: u32 = 900;
/// Of the `many` tree, one file in this many changes between the copy and the re-run: 0.1%.
const CHANGED_ONE_IN: usize = 1000;
/// The `large` tree's changed file: this many writes of 16 bytes.
const PATCHES: usize = 8;

/// What `make bench-clusters` sets: rounds, the trees, and whether they are `bench/run.sh`'s
/// quick ones (a try of the harness, not a result).
pub struct Settings {
    pub runs: usize,
    pub trees: Vec<String>,
    pub quick: bool,
}

impl Settings {
    /// From the environment: CLUSTER_TREES (default `many large`), CLUSTER_QUICK=1.
    pub fn from_env(runs: usize) -> Result<Self> {
        ensure!(runs >= 1, "at least one run");
        let trees: Vec<String> = std::env::var("CLUSTER_TREES")
            .unwrap_or_else(|_| "many large".into())
            .split_whitespace()
            .map(str::to_string)
            .collect();
        for t in &trees {
            ensure!(
                t == "many" || t == "large",
                "CLUSTER_TREES takes many and large, not {t:?}"
            );
        }
        Ok(Self {
            runs,
            trees,
            quick: std::env::var("CLUSTER_QUICK").is_ok_and(|v| v == "1"),
        })
    }
}

/// One way of moving a tree from east-a.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Tool {
    Clusters,
    Nodes,
    RsyncDaemon,
    RsyncSsh,
}

const TOOLS: [Tool; 4] = [
    Tool::Clusters,
    Tool::Nodes,
    Tool::RsyncDaemon,
    Tool::RsyncSsh,
];

impl Tool {
    fn name(self) -> &'static str {
        match self {
            Self::Clusters => "ferry-clusters",
            Self::Nodes => "ferry-nodes",
            Self::RsyncDaemon => "rsync-daemon",
            Self::RsyncSsh => "rsync-ssh",
        }
    }

    fn slug(self) -> &'static str {
        match self {
            Self::Clusters => "clusters",
            Self::Nodes => "nodes",
            Self::RsyncDaemon => "rsyncd",
            Self::RsyncSsh => "ssh",
        }
    }
}

/// The first copy into an empty destination, or the copy again after the source changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Phase {
    First,
    Again,
}

/// One timed run.
#[derive(Debug, Clone)]
struct Sample {
    secs: f64,
    /// Bytes on the wire (IP packets on the tool's server port): to the receiving side, and
    /// back to the sending side.
    wire: [u64; 2],
    /// Peak RSS of each side's processes, KiB: the sending side (east-a), the receiving one.
    rss_kib: [u64; 2],
    /// A CopyJob's `status.progress` (what it copied, kept, mended).
    progress: Option<serde_json::Value>,
}

/// What one tree gave.
struct TreeResult {
    tree: String,
    count: TreeCount,
    /// What changed before the copy again, in words.
    change: String,
    /// Bytes of the file that was patched (the `large` tree), for the ratio.
    patched_file: Option<u64>,
    samples: BTreeMap<(Tool, Phase), Vec<Sample>>,
    /// Whether each tool's checked copy kept mode, owner and mtimes.
    meta_kept: BTreeMap<Tool, bool>,
}

/// The two clusters, the peers' servers and the counters.
struct Clusters {
    // Fields drop in order: the processes stop before their tmpfs are unmounted, those
    // before the control planes' directories (where they are mounted) are removed.
    agents: [Proc; 3],
    _servers: Vec<Proc>,
    wire: measure::Wire,
    _tmpfs: Vec<Tmpfs>,
    _operators: Vec<Proc>,
    east: ControlPlane,
    west: ControlPlane,
    /// east-a's, east-b's and west-a's `/srv/vol`, as this machine sees them.
    east_a: PathBuf,
    east_b: PathBuf,
    west_a: PathBuf,
    ftzz: PathBuf,
    /// The servers' ports on east-a: its agent's peering port (read from west) and transfer
    /// port (read from east-b), the rsync daemon's and sshd's.
    peering_port: u16,
    transfer_port: u16,
    rsync_port: u16,
    ssh_port: u16,
    ssh_key: PathBuf,
    /// The rsync daemon and sshd (whose forks serve the connections), on east-a.
    server_pids: [u32; 2],
    cpus: Cpus,
}

impl Clusters {
    /// east-a's, east-b's and west-a's agents.
    fn agent_pids(&self) -> [u32; 3] {
        [
            self.agents[0].id(),
            self.agents[1].id(),
            self.agents[2].id(),
        ]
    }

    /// Where `tool` writes `tree`, as this machine sees it.
    fn destination(&self, tool: Tool, tree: &str) -> PathBuf {
        let name = format!("{}-{tree}", tool.slug());
        match tool {
            Tool::Nodes => self.east_b.join(name),
            _ => self.west_a.join(name),
        }
    }
}

/// Ferry between clusters against its peers, in one run; prints the report and, given
/// `out`, writes it there (keeping the part written by hand).
pub fn bench_clusters(settings: &Settings, out: Option<&Path>) -> Result<()> {
    ensure!(
        ferry_e2e::is_root(),
        "bench-clusters mounts tmpfs and counts with iptables: run it as root"
    );
    for tool in [
        "rsync",
        "ssh",
        "/usr/sbin/sshd",
        "ssh-keygen",
        "iptables",
        "python3",
    ] {
        ensure!(
            !shell_line(&format!("command -v {tool}")).is_empty(),
            "{tool} is missing: run bench/install-tools.sh"
        );
    }
    let build = crate::network::built_from();
    let load_before = loadavg();
    let clusters = Clusters::start()?;
    let mut results = Vec::new();
    for tree in &settings.trees {
        results.push(
            clusters
                .bench_tree(tree, settings)
                .with_context(|| format!("the {tree} tree"))?,
        );
    }
    let md = report::report(
        settings,
        &build,
        &results,
        &clusters.cpus,
        &load_before,
        &loadavg(),
    )?;
    print!("{md}");
    if let Some(file) = out {
        write_keeping_notes(file, &md)?;
        eprintln!("wrote {}", file.display());
    }
    Ok(())
}

impl Clusters {
    /// The warmup round and the timed rounds on one tree: each round every tool's first copy,
    /// the change, every tool's copy again; the last round's copies checked. The tree and
    /// the copies are removed after.
    fn bench_tree(&self, tree: &str, settings: &Settings) -> Result<TreeResult> {
        let src = self.east_a.join("src").join(tree);
        crate::network::generate(&self.ftzz, tree, &src, settings.quick)?;
        let mut samples: BTreeMap<(Tool, Phase), Vec<Sample>> = BTreeMap::new();
        let mut meta_kept = BTreeMap::new();
        let mut change = String::new();
        let mut patched_file = None;
        // Round 0 is the warmup: run, counted, not kept.
        for round in 0..=settings.runs {
            let mut order = TOOLS;
            order.rotate_left(round % TOOLS.len());
            let count = count_tree(&src)?;
            for tool in order {
                let dst = self.destination(tool, tree);
                if dst.exists() {
                    std::fs::remove_dir_all(&dst)
                        .with_context(|| format!("remove {}", dst.display()))?;
                }
                let s = self.run(tool, tree, Phase::First, round)?;
                self.counted(&dst, &count)?;
                self.say(tree, round, tool, Phase::First, &s);
                if round > 0 {
                    samples.entry((tool, Phase::First)).or_default().push(s);
                }
            }
            (change, patched_file) = change_source(&src, tree, round)?;
            let count = count_tree(&src)?;
            for tool in order {
                let s = self.run(tool, tree, Phase::Again, round)?;
                self.counted(&self.destination(tool, tree), &count)?;
                self.say(tree, round, tool, Phase::Again, &s);
                if round > 0 {
                    samples.entry((tool, Phase::Again)).or_default().push(s);
                }
            }
            if round == settings.runs {
                for tool in TOOLS {
                    let report = self
                        .east
                        .dir()
                        .join(format!("check-{tree}-{}.json", tool.slug()));
                    let kept = check_copy(&src, &self.destination(tool, tree), &report)?;
                    meta_kept.insert(tool, kept);
                }
            }
        }
        for tool in TOOLS {
            std::fs::remove_dir_all(self.destination(tool, tree))?;
        }
        let count = count_tree(&src)?;
        std::fs::remove_dir_all(&src)?;
        Ok(TreeResult {
            tree: tree.to_string(),
            count,
            change,
            patched_file,
            samples,
            meta_kept,
        })
    }

    /// The copy at `dst` holds what the source does.
    fn counted(&self, dst: &Path, count: &TreeCount) -> Result<()> {
        let got = count_tree(dst)?;
        ensure!(
            got == *count,
            "{} holds {got:?}, the source {count:?}",
            dst.display()
        );
        Ok(())
    }

    fn say(&self, tree: &str, round: usize, tool: Tool, phase: Phase, s: &Sample) {
        let round = if round == 0 {
            "warmup".to_string()
        } else {
            format!("run {round}")
        };
        eprintln!(
            "{tree} {round} {:<14} {:<5} {:>8.3} s, wire {} / {} bytes, peak RSS {} / {} KiB{}",
            tool.name(),
            if phase == Phase::First {
                "first"
            } else {
                "again"
            },
            s.secs,
            s.wire[0],
            s.wire[1],
            s.rss_kib[0],
            s.rss_kib[1],
            s.progress
                .as_ref()
                .map_or(String::new(), |p| format!(", progress {p}"))
        );
    }
}

/// Change the source between a copy and the copy again: of `many`, one file in
/// [`CHANGED_ONE_IN`] (a different set each round) gets 16 new bytes at its start; of
/// `large`, its first file gets 16 bytes at [`PATCHES`] places, its size kept. What was
/// done, in words, and the patched file's size.
fn change_source(src: &Path, tree: &str, round: usize) -> Result<(String, Option<u64>)> {
    use std::os::unix::fs::FileExt;
    let mut files = Vec::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d)? {
            let e = e?;
            if e.file_type()?.is_dir() {
                stack.push(e.path());
            } else if e.file_type()?.is_file() {
                files.push(e.path());
            }
        }
    }
    files.sort();
    let mut seed = 0x2545_f491_4f6c_dd1d_u64 ^ (round as u64 + 1);
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    if tree == "large" {
        let file = files.first().context("the large tree has no file")?;
        let size = std::fs::metadata(file)?.len();
        ensure!(size > 16, "{} is too small to patch", file.display());
        let f = std::fs::OpenOptions::new().write(true).open(file)?;
        for _ in 0..PATCHES {
            let at = next() % (size - 16);
            f.write_all_at(&next().to_le_bytes().repeat(2), at)?;
        }
        return Ok((
            format!(
                "16 bytes written at {PATCHES} random places of one of its files ({size} bytes, its size kept)"
            ),
            Some(size),
        ));
    }
    let mut changed = 0;
    for f in files
        .iter()
        .skip(round % CHANGED_ONE_IN)
        .step_by(CHANGED_ONE_IN)
    {
        let file = std::fs::OpenOptions::new().write(true).open(f)?;
        file.write_all_at(&next().to_le_bytes().repeat(2), 0)?;
        changed += 1;
    }
    Ok((
        format!(
            "{changed} of its {} files (one in {CHANGED_ONE_IN}) got 16 new bytes at their start",
            files.len()
        ),
        None,
    ))
}

/// The versions of the tools compared, for the report.
fn versions() -> String {
    let rsync = shell_line("rsync --version | head -1");
    let ssh = shell_line("ssh -V 2>&1");
    format!("{rsync}; {ssh}")
}

/// Where the report goes by default.
pub fn default_out() -> PathBuf {
    repo_root().join("bench/CLUSTERS.md")
}
