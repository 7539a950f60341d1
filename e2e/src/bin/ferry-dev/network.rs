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

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use ferry_e2e::{repo_root, workspace_bin, ControlPlane, Proc};
use serde_json::Value;

use crate::machine::{
    count_tree, cpu_secs, loadavg, machine_busy_secs, mean_sd, pids_mentioning, shell_line,
    LoadSampler, Tmpfs, TreeCount,
};
use crate::throughput::{check_copy, ftzz, release_builds, TREE_100K};

/// Ferry's namespace (the chart's), and the namespace of the benchmark's jobs.
const NS: &str = "ferry-system";
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
const LARGE: [&str; 3] = ["2", "1073741824", "3"];
/// `bench/run.sh`'s quick trees (BENCH_QUICK=1), for a try of the harness.
const QUICK_MANY: [&str; 8] = ["-n", "2000", "-b", "10000000", "-d", "5", "--seed", "1"];
const QUICK_LARGE: [&str; 3] = ["2", "16777216", "3"];
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
        let md = report(settings, &build, &results, &load, &Ok(None), Some(&e))?;
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
        let md = report(settings, &build, &results, &load, memory, None)?;
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

impl Net {
    fn start() -> Result<Self> {
        release_builds();
        let ftzz = ftzz()?;
        let ferry = workspace_bin("ferry-agent", "ferry-agent")?;
        eprintln!("starting etcd and kube-apiserver, installing deploy/ferry.yaml ...");
        let cp = ControlPlane::start_required()?;
        cp.install_rendered(NS, "ferry.yaml")?;
        let mut roots = Vec::new();
        for (node, _) in NODES {
            roots.push(cp.add_node(node)?.join("srv/vol"));
        }
        let (a, b) = (roots[0].clone(), roots[1].clone());
        let tmpfs_a = Tmpfs::mount(&a, TMPFS_A)?;
        let tmpfs_b = Tmpfs::mount(&b, TMPFS_B)?;
        for dir in [a.join("src"), a.join("local")] {
            std::fs::create_dir_all(dir)?;
        }
        eprintln!("building and starting the operator and the agents (release) ...");
        let operator_kc = cp.service_account_kubeconfig(NS, "ferry-operator", None)?;
        let operator = cp.spawn_operator(
            "operator",
            &[
                ("KUBECONFIG", &operator_kc.to_string_lossy()),
                ("FERRY_NAMESPACE", NS),
                ("POD_NAME", "ferry-operator-0"),
            ],
        )?;
        cp.kubectl_ok(&["create", "namespace", TEAM])?;
        for (root, node) in [("vol-a", "node-a"), ("vol-b", "node-b")] {
            cp.apply(&format!(
                "apiVersion: ferry.dev/v1alpha1\nkind: StorageRoot\nmetadata:\n  name: {root}\nspec:\n  path: /srv/vol\n  nodeSelector: {{ferry.dev/node: {node}}}\n  namespaces: {{names: [{TEAM}]}}\n"
            ))?;
        }
        let mut agents = Vec::new();
        for (node, ip) in NODES {
            let kc = cp.service_account_kubeconfig(NS, "ferry-agent", Some(node))?;
            let listen = format!("{ip}:{}", ferry_e2e::free_port()?);
            agents.push(cp.spawn_agent(
                node,
                &[
                    ("KUBECONFIG", &kc.to_string_lossy()),
                    ("FERRY_TRANSFER_LISTEN", &listen),
                ],
            )?);
        }
        // Paired only once both advertise their transfer ports (after their certificates).
        for (node, _) in NODES {
            advertised(&cp, node)?;
        }
        let rsync_port = ferry_e2e::free_port()?;
        let conf = cp.dir().join("rsyncd.conf");
        std::fs::write(
            &conf,
            format!(
                "use chroot = no\nlog file = {}\n[src]\n    path = {}\n    read only = yes\n    uid = root\n    gid = root\n",
                cp.dir().join("rsyncd.log").display(),
                a.join("src").display()
            ),
        )?;
        let rsyncd = cp.spawn(
            Path::new("rsync"),
            &[
                "--daemon",
                "--no-detach",
                &format!("--config={}", conf.display()),
                &format!("--address={}", NODES[0].1),
                &format!("--port={rsync_port}"),
            ],
            &[],
            "rsyncd.out",
        )?;
        ferry_e2e::wait_for("the rsync daemon", Duration::from_secs(10), || {
            std::net::TcpStream::connect((NODES[0].1, rsync_port)).is_ok()
        })?;
        let tar_port = ferry_e2e::free_port()?;
        let agent_pids: Vec<u32> = agents.iter().map(Proc::id).collect();
        let mut cluster_pids = pids_mentioning(&cp.dir().to_string_lossy());
        cluster_pids.retain(|p| !agent_pids.contains(p) && *p != std::process::id());
        cluster_pids.push(operator.id());
        cluster_pids.sort_unstable();
        cluster_pids.dedup();
        Ok(Self {
            agents,
            _operator: operator,
            _rsyncd: rsyncd,
            _tmpfs_b: tmpfs_b,
            _tmpfs_a: tmpfs_a,
            cp,
            a,
            b,
            ferry,
            ftzz,
            rsync_port,
            tar_port,
            cluster_pids,
        })
    }

    fn agent_pids(&self) -> [u32; 2] {
        [self.agents[0].id(), self.agents[1].id()]
    }

    /// CPU seconds of everything this benchmark runs (itself and its waited-for children,
    /// the cluster, the agents, the rsync daemon and the connections it served), to tell the
    /// rest of the machine's load apart.
    fn harness_cpu(&self) -> f64 {
        cpu_secs(std::process::id(), true)
            + self
                .cluster_pids
                .iter()
                .chain(&self.agent_pids())
                .map(|p| cpu_secs(*p, true))
                .sum::<f64>()
    }

    /// Make tree `tree` (`bench/run.sh`'s generator and seed) under node-a's `src/`.
    fn generate(&self, tree: &str, quick: bool) -> Result<PathBuf> {
        let dir = self.a.join("src").join(tree);
        eprintln!("generating {tree} at {} ...", dir.display());
        let mut cmd = match tree {
            "many" => {
                let mut c = Command::new(&self.ftzz);
                let spec = if quick { QUICK_MANY } else { TREE_100K };
                c.args(["-q", "-e"]).args(spec).arg(&dir);
                c
            }
            "large" => {
                let mut c = Command::new("python3");
                c.arg(repo_root().join("bench/gen_files.py"))
                    .arg("large")
                    .arg(&dir)
                    .args(if quick { QUICK_LARGE } else { LARGE });
                c
            }
            other => bail!("no tree {other}: NET_TREES takes many and large"),
        };
        let status = cmd
            .stdout(std::io::stderr())
            .status()
            .with_context(|| format!("generate {tree}"))?;
        ensure!(status.success(), "generating {tree} failed");
        Ok(dir)
    }

    /// The warmup, the timed rounds and the checks on one tree; the tree is removed after.
    fn bench_tree(&self, tree: &str, settings: &Settings) -> Result<TreeResult> {
        let runs = settings.runs;
        let src = self.generate(tree, settings.quick)?;
        let count = count_tree(&src)?;
        eprintln!("{tree}: {count:?}; warmup: one untimed run of each tool ...");
        for tool in TOOLS {
            let (_, made) = self.run(tool, tree, "w", JOB_TIMEOUT)?;
            self.counted(&made, &count)?;
            made.remove()?;
        }
        let mut samples: BTreeMap<Tool, Vec<Sample>> = BTreeMap::new();
        let mut meta_kept = BTreeMap::new();
        for i in 0..runs {
            // Each round runs every tool once, starting one further along each time.
            let mut order = TOOLS;
            order.rotate_left(i % TOOLS.len());
            for tool in order {
                let (s, made) = self.run(tool, tree, &i.to_string(), JOB_TIMEOUT)?;
                let shard = s.shard.map_or(String::new(), |[start, copy, settle]| {
                    format!(" (shard: start {start:.3}, copy {copy:.3}, settle {settle:.3})")
                });
                eprintln!(
                    "{tree} run {}/{runs}: {:<28} {:>8.3} s{shard}; CPU s: machine {:.2} = node-a {:.2} + node-b {:.2} + cluster {:.2} + harness and tools {:.2} + other {:.2}",
                    i + 1,
                    tool.name(),
                    s.secs,
                    s.machine_cpu,
                    s.agent_cpu[0],
                    s.agent_cpu[1],
                    s.cluster_cpu,
                    s.harness_cpu,
                    s.machine_cpu - s.agent_cpu[0] - s.agent_cpu[1] - s.cluster_cpu - s.harness_cpu
                );
                self.counted(&made, &count)?;
                if i + 1 == runs {
                    let report = self
                        .cp
                        .dir()
                        .join(format!("check-{tree}-{}.json", tool.slug()));
                    meta_kept.insert(tool, check_copy(&src, &made.dst, &report)?);
                }
                made.remove()?;
                samples.entry(tool).or_default().push(s);
            }
        }
        let profile = if settings.perf {
            Some(self.profile(tree)?)
        } else {
            None
        };
        std::fs::remove_dir_all(&src)?;
        Ok(TreeResult {
            tree: tree.to_string(),
            count,
            samples,
            meta_kept,
            profile,
        })
    }

    /// The copy made holds what the source does.
    fn counted(&self, made: &Made, count: &TreeCount) -> Result<()> {
        let got = count_tree(&made.dst)?;
        ensure!(
            got == *count,
            "{} holds {got:?}, the source {count:?}",
            made.dst.display()
        );
        Ok(())
    }

    /// One run of `tool` on `tree`, timed.
    fn run(&self, tool: Tool, tree: &str, tag: &str, timeout: u32) -> Result<(Sample, Made)> {
        let name = format!("{}-{tree}-{tag}", tool.slug());
        let src = self.a.join("src").join(tree);
        // Untimed: the clean page cache the runs before filled is dropped, so that no copy
        // pays for reclaiming it (on this machine the writer of a 2 GiB copy did, in direct
        // reclaim, in some runs and not others: 1.7 to 3.8 s for the same copy). The trees
        // are on tmpfs and stay in memory: the copies are as warm as before.
        drop_page_cache();
        let pids = self.agent_pids();
        let agents = || pids.map(|p| cpu_secs(p, false));
        let cluster = || {
            self.cluster_pids
                .iter()
                .map(|p| cpu_secs(*p, true))
                .sum::<f64>()
        };
        let harness = || cpu_secs(std::process::id(), true);
        let (machine_before, agents_before) = (machine_busy_secs(), agents());
        let (cluster_before, harness_before) = (cluster(), harness());
        let threads = tool.is_job().then(|| ThreadSampler::start(pids));
        let start = Instant::now();
        let made = match tool {
            Tool::Rsync => {
                let dst = self.b.join(&name);
                let url = format!("rsync://{}:{}/src/{tree}/", NODES[0].1, self.rsync_port);
                let mut c = Command::new("rsync");
                c.arg("-a").arg(url).arg(format!("{}/", dst.display()));
                ok(c, "rsync -a")?;
                Some(Made {
                    dst,
                    manifest: None,
                })
            }
            Tool::TarSocat => {
                let dst = self.b.join(&name);
                let (d, s, ip, port) = (dst.display(), src.display(), NODES[1].1, self.tar_port);
                // bench/network-peers.sh's pipe: 1 MiB records and socket buffers.
                let pipe = format!("mkdir -p {d}; socat -u -b 1048576 TCP-LISTEN:{port},bind={ip},reuseaddr - | tar x -b 2048 -B -C {d} & tar c -b 2048 -C {s} . | socat -u -b 1048576 - TCP:{ip}:{port},retry=200,interval=0.005; wait");
                let mut c = Command::new("bash");
                c.args(["-c", &pipe]);
                ok(c, "tar c | socat")?;
                Some(Made {
                    dst,
                    manifest: None,
                })
            }
            Tool::Cli | Tool::CliNoVerify => {
                let dst = self.a.join("local").join(&name);
                let mut c = Command::new(&self.ferry);
                c.args(["copy", "--no-progress"]);
                let manifest = if tool == Tool::Cli {
                    let m = self.a.join(format!("local/{name}.xxh128"));
                    c.args(["--verify", "checksum", "--sync", "--manifest"])
                        .arg(&m);
                    Some(m)
                } else {
                    c.args(["--verify", "none"]);
                    None
                };
                c.arg(&src).arg(&dst);
                ok(c, "ferry-agent copy")?;
                Some(Made { dst, manifest })
            }
            Tool::Network | Tool::NetworkNoVerify | Tool::LocalJob => {
                self.apply_job(tool, &name, tree)?;
                self.cp.wait_succeeded(TEAM, &name, timeout)?;
                None
            }
        };
        let secs = start.elapsed().as_secs_f64();
        let (machine_after, agents_after) = (machine_busy_secs(), agents());
        let (cluster_after, harness_after) = (cluster(), harness());
        let threads = threads.map(ThreadSampler::finish);
        let (made, shard) = match made {
            Some(made) => (made, None),
            None => {
                let made = self.inspect_job(tool, &name)?;
                let node = NODES[usize::from(tool != Tool::LocalJob)].0;
                let log = self.cp.dir().join(format!("agent-{node}.log"));
                let shard = shard_times(&log, &name);
                self.finish_job(&name)?;
                (made, shard)
            }
        };
        Ok((
            Sample {
                secs,
                machine_cpu: machine_after - machine_before,
                agent_cpu: [
                    agents_after[0] - agents_before[0],
                    agents_after[1] - agents_before[1],
                ],
                cluster_cpu: cluster_after - cluster_before,
                harness_cpu: harness_after - harness_before,
                threads,
                shard,
            },
            made,
        ))
    }

    /// Where `tool`'s CopyJob writes: its StorageRoot, the path in it, and as seen here.
    fn destination(&self, tool: Tool, name: &str) -> (&'static str, String, PathBuf) {
        match tool {
            Tool::LocalJob => (
                "vol-a",
                format!("local/{name}"),
                self.a.join("local").join(name),
            ),
            _ => ("vol-b", name.to_string(), self.b.join(name)),
        }
    }

    /// Apply a CopyJob of `tree` as `tool` says.
    fn apply_job(&self, tool: Tool, name: &str, tree: &str) -> Result<()> {
        let (root, path, _) = self.destination(tool, name);
        let verify = if tool == Tool::NetworkNoVerify {
            "  verify: None\n"
        } else {
            ""
        };
        self.cp.apply(&format!(
            "apiVersion: ferry.dev/v1alpha1\nkind: CopyJob\nmetadata:\n  name: {name}\n  namespace: {TEAM}\nspec:\n  source: {{root: vol-a, path: src/{tree}}}\n  destination: {{root: {root}, path: {path}}}\n{verify}"
        ))
    }

    /// A Succeeded job's status says it ran as `tool` should (verify, mode, nodes); its copy.
    fn inspect_job(&self, tool: Tool, name: &str) -> Result<Made> {
        let job: Value = serde_json::from_str(
            &self
                .cp
                .kubectl_ok(&["get", "copyjob", name, "-n", TEAM, "-o", "json"])?,
        )?;
        let (spec, status) = (&job["spec"], &job["status"]);
        let want = if tool == Tool::NetworkNoVerify {
            "None"
        } else {
            "Checksum"
        };
        ensure!(spec["verify"] == want, "{name}: verify {}", spec["verify"]);
        let shard = &status["shards"][0];
        if tool == Tool::LocalJob {
            ensure!(
                status["mode"] != "Network" && shard["node"] == "node-a",
                "{name}: not a copy on node-a: mode {}, shard {shard}",
                status["mode"]
            );
        } else {
            ensure!(
                status["mode"] == "Network"
                    && shard["sender"] == "node-a"
                    && shard["node"] == "node-b",
                "{name}: not a copy from node-a to node-b: mode {}, shard {shard}",
                status["mode"]
            );
        }
        let (_, _, dst) = self.destination(tool, name);
        let root = if tool == Tool::LocalJob {
            &self.a
        } else {
            &self.b
        };
        let manifest = status["manifest"].as_str().map(|m| root.join(m));
        Ok(Made { dst, manifest })
    }

    /// Delete CopyJob `name` and wait until it is gone.
    fn finish_job(&self, name: &str) -> Result<()> {
        self.cp.kubectl_ok(&[
            "delete",
            "copyjob",
            name,
            "-n",
            TEAM,
            "--wait=true",
            "--timeout=120s",
        ])?;
        Ok(())
    }

    /// One more ferry-network copy of `tree`, untimed, with `perf record` on each agent: the
    /// hottest symbols of each, and the perf data kept under `bench/work/network-perf/`.
    fn profile(&self, tree: &str) -> Result<String> {
        let dir = repo_root().join("bench/work/network-perf");
        std::fs::create_dir_all(&dir)?;
        let mut recorders = Vec::new();
        for (i, pid) in self.agent_pids().into_iter().enumerate() {
            let data = dir.join(format!("{tree}-{}.data", NODES[i].0));
            let child = Command::new("perf")
                .args(["record", "-F", "999", "-o"])
                .arg(&data)
                .args(["-p", &pid.to_string()])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .context("run perf record")?;
            recorders.push((child, data));
        }
        std::thread::sleep(Duration::from_millis(500));
        let (s, made) = self.run(Tool::Network, tree, "perf", JOB_TIMEOUT)?;
        let mut out = format!(
            "One more ferry-network copy of `{tree}` under `perf record -F 999` of each agent: {:.3} s.\n\n",
            s.secs
        );
        for (mut child, data) in recorders {
            let _ = Command::new("kill")
                .args(["-INT", &child.id().to_string()])
                .status();
            child.wait()?;
            let top = Command::new("perf")
                .args(["report", "--stdio", "--no-children", "--sort", "dso,sym"])
                .args(["--percent-limit", "2", "-i"])
                .arg(&data)
                .output()
                .context("run perf report")?;
            let text = String::from_utf8_lossy(&top.stdout);
            std::fs::write(data.with_extension("txt"), text.as_bytes())?;
            let lines: Vec<&str> = text
                .lines()
                .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
                .take(12)
                .collect();
            let who = data.file_stem().map(|s| s.to_string_lossy().into_owned());
            writeln!(
                out,
                "`{}` (`perf report --no-children --sort dso,sym`, symbols over 2%):\n\n```\n{}\n```\n",
                who.unwrap_or_default(),
                lines.join("\n")
            )?;
        }
        made.remove()?;
        Ok(out)
    }

    /// Both agents' peak RSS over a cross-node CopyJob of `files` tiny files.
    fn memory(&self, files: u64) -> Result<Memory> {
        let src = self.a.join("src/rss");
        eprintln!(
            "memory: generating {files} tiny files in {} directories at {} ...",
            files.div_ceil(PER_DIR),
            src.display()
        );
        tiny_tree(&src, files)?;
        let count = count_tree(&src)?;
        let pids = self.agent_pids();
        let life_kib = pids.map(|p| proc_status_kib(p, "VmHWM"));
        let idle_kib = pids.map(|p| proc_status_kib(p, "VmRSS"));
        // Peaks since now: earlier runs' peaks are no part of this job's.
        for p in pids {
            std::fs::write(format!("/proc/{p}/clear_refs"), "5")
                .context("reset the agent's peak RSS (clear_refs 5)")?;
        }
        let sampler = RssSampler::start(pids);
        eprintln!("memory: a CopyJob of the tree from node-a to node-b ...");
        let run = self.run(Tool::Network, "rss", "0", MEMORY_JOB_TIMEOUT);
        let sampled_kib = sampler.finish();
        let hwm_kib = pids.map(|p| proc_status_kib(p, "VmHWM"));
        let (s, made) = run?;
        eprintln!(
            "memory: {:.1} s; peak RSS node-a {} KiB, node-b {} KiB",
            s.secs, hwm_kib[0], hwm_kib[1]
        );
        self.counted(&made, &count)?;
        let meta_kept = check_copy(&src, &made.dst, &self.cp.dir().join("check-rss.json"))?;
        made.remove()?;
        std::fs::remove_dir_all(&src)?;
        Ok(Memory {
            count,
            secs: s.secs,
            shard: s.shard,
            life_kib,
            idle_kib,
            hwm_kib,
            sampled_kib,
            meta_kept,
        })
    }
}

/// The commit the binaries are built from, and whether the product's files differ from it.
fn built_from() -> String {
    let repo = repo_root();
    let git = |args: &str| shell_line(&format!("git -C '{}' {args}", repo.display()));
    let dirty = if git("status --porcelain -- agent operator crds Cargo.lock").is_empty() {
        ""
    } else {
        " with uncommitted changes to the product"
    };
    format!("commit {}{dirty}", git("rev-parse --short HEAD"))
}

/// Run `cmd`, which must succeed.
fn ok(mut cmd: Command, what: &str) -> Result<()> {
    let out = cmd.output().with_context(|| format!("run {what}"))?;
    ensure!(
        out.status.success(),
        "{what} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// Wait until `node`'s agent advertises its transfer port in its heartbeat Lease.
fn advertised(cp: &ControlPlane, node: &str) -> Result<String> {
    let start = Instant::now();
    loop {
        let a = cp.get(
            &format!("lease/ferry-agent-{node}"),
            NS,
            "{.metadata.annotations.ferry\\.dev/transfer-address}",
        );
        match a {
            Ok(a) if !a.is_empty() => return Ok(a),
            _ if start.elapsed() > Duration::from_secs(120) => bail!(
                "{node}'s Lease has no transfer address after 120 s: {a:?}\n{}",
                cp.log_tail(&format!("agent-{node}.log"), 15)
            ),
            _ => std::thread::sleep(Duration::from_millis(200)),
        }
    }
}

/// The copying agent's account of job `job`'s shard, from its log's "shard finished" line:
/// `start_ms`, `copy_ms`, `settle_ms`, in seconds.
fn shard_times(log: &Path, job: &str) -> Option<[f64; 3]> {
    let text = std::fs::read_to_string(log).ok()?;
    let job = format!("job={TEAM}/{job}");
    let line = text
        .lines()
        .rev()
        .find(|l| l.contains("shard finished") && l.split_whitespace().any(|w| w == job))?;
    let field = |key: &str| -> Option<f64> {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))?
            .parse::<f64>()
            .ok()
            .map(|ms| ms / 1000.0)
    };
    Some([field("start_ms")?, field("copy_ms")?, field("settle_ms")?])
}

/// `files` files of a few bytes each, `PER_DIR` to a directory, under `root`.
fn tiny_tree(root: &Path, files: u64) -> Result<()> {
    for d in 0..files.div_ceil(PER_DIR) {
        let dir = root.join(format!("d{d:04}"));
        std::fs::create_dir_all(&dir)?;
        for f in 0..PER_DIR.min(files - d * PER_DIR) {
            std::fs::write(dir.join(format!("f{f:04}")), format!("{d}:{f}\n"))?;
        }
    }
    Ok(())
}

/// A `kB` line of `/proc/PID/status` (VmRSS, VmHWM), in KiB; 0 when unreadable.
fn proc_status_kib(pid: u32, key: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

/// The largest VmRSS of two processes, sampled every 50 ms until stopped.
struct RssSampler {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<[u64; 2]>,
}

impl RssSampler {
    fn start(pids: [u32; 2]) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut max = [0; 2];
            while !flag.load(Ordering::Relaxed) {
                for (m, p) in max.iter_mut().zip(pids) {
                    *m = (*m).max(proc_status_kib(p, "VmRSS"));
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            max
        });
        Self { stop, thread }
    }

    fn finish(self) -> [u64; 2] {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap_or([0; 2])
    }
}

/// The CPU seconds of each thread of two processes while it runs, sampled every 50 ms (a
/// thread that ends between two samples loses its last moments), summed by thread name
/// without its number (`ferry-copy-3` -> `ferry-copy`): where in an agent a copy's CPU goes.
struct ThreadSampler {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<[BTreeMap<String, f64>; 2]>,
}

/// Each thread of `pid`: its id, its name and the CPU seconds it has used.
fn threads_of(pid: u32) -> Vec<(u32, String, f64)> {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| {
            let tid: u32 = e.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
            let (head, rest) = stat.rsplit_once(')')?;
            let name = head.split_once('(')?.1.to_string();
            let f: Vec<f64> = rest
                .split_whitespace()
                .map(|v| v.parse().unwrap_or(0.0))
                .collect();
            // utime and stime (fields 14 and 15), as in machine::cpu_secs.
            let cpu =
                (f.get(11).copied().unwrap_or(0.0) + f.get(12).copied().unwrap_or(0.0)) / 100.0;
            Some((tid, name, cpu))
        })
        .collect()
}

impl ThreadSampler {
    fn start(pids: [u32; 2]) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let before: Vec<BTreeMap<u32, f64>> = pids
                .iter()
                .map(|p| threads_of(*p).into_iter().map(|(t, _, c)| (t, c)).collect())
                .collect();
            let mut last: Vec<BTreeMap<u32, (String, f64)>> = vec![BTreeMap::new(); 2];
            loop {
                let stopping = flag.load(Ordering::Relaxed);
                for (i, p) in pids.iter().enumerate() {
                    for (tid, name, cpu) in threads_of(*p) {
                        last[i].insert(tid, (name, cpu));
                    }
                }
                if stopping {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let mut by_name: [BTreeMap<String, f64>; 2] = Default::default();
            for i in 0..2 {
                for (tid, (name, cpu)) in &last[i] {
                    let used = cpu - before[i].get(tid).copied().unwrap_or(0.0);
                    let group = name.trim_end_matches(|c: char| c.is_ascii_digit());
                    let group = group.strip_suffix('-').unwrap_or(group);
                    *by_name[i].entry(group.to_string()).or_default() += used;
                }
                by_name[i].retain(|_, v| *v > 0.0);
            }
            by_name
        });
        Self { stop, thread }
    }

    fn finish(self) -> [BTreeMap<String, f64>; 2] {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap_or_default()
    }
}

/// Write `md` to `file`, followed by the part of the old file written by hand, if any.
fn write_keeping_notes(file: &Path, md: &str) -> Result<()> {
    let old = std::fs::read_to_string(file).unwrap_or_default();
    let notes = old
        .find(&format!("\n{HAND_HEADING}"))
        .map(|i| old[i..].trim())
        .unwrap_or_default();
    let text = if notes.is_empty() {
        md.to_string()
    } else {
        format!("{}\n\n{notes}\n", md.trim_end())
    };
    let tmp = file.with_extension("md.tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, file)?;
    Ok(())
}

/// `mean ± σ` of some seconds.
fn pm(v: &[f64]) -> String {
    let (mean, sd) = mean_sd(v);
    if sd.is_finite() {
        format!("{mean:.3} ± {sd:.3}")
    } else {
        format!("{mean:.3}")
    }
}

fn mean(v: &[f64]) -> f64 {
    mean_sd(v).0
}

/// KiB as MB (10^6 bytes).
fn mb(kib: u64) -> f64 {
    kib as f64 * 1024.0 / 1e6
}

/// The report, `bench/NETWORK.md` (without the part written by hand).
fn report(
    settings: &Settings,
    build: &str,
    results: &[TreeResult],
    load: &Load,
    memory: &Result<Option<Memory>>,
    failed: Option<&anyhow::Error>,
) -> Result<String> {
    let nproc = std::thread::available_parallelism().map_or(0, std::num::NonZeroUsize::get);
    let cpu = shell_line("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'");
    let date = shell_line("date -u '+%Y-%m-%d %H:%M UTC'");
    let kernel = shell_line("uname -r");
    let versions = format!(
        "{}; {}; {}",
        shell_line("rsync --version | head -n1"),
        shell_line("socat -V | grep -m1 'socat version'"),
        shell_line("tar --version | head -n1")
    );
    let runs = settings.runs;
    let others_share = load.others / (load.timed_secs * nproc.max(1) as f64);
    let measured = format!(
        "processes other than the benchmark's used {:.1} CPU-seconds during the {:.0} s of warmups and timed runs ({:.0}% of the {nproc} CPUs), a compiler was running in {} of {} samples taken every 250 ms, 1-minute load average {} before and {} after",
        load.others,
        load.timed_secs,
        others_share * 100.0,
        load.busy,
        load.samples,
        load.before,
        load.after
    );
    let loaded = others_share > 0.05 || load.busy > 0;
    let load_note = if loaded {
        format!("**taken under concurrent load**: {measured}; re-run `make bench-network` on an idle machine for reference figures")
    } else {
        format!("idle apart from the benchmark: {measured}")
    };
    let mut md = String::new();
    writeln!(
        md,
        "# Moving a tree between nodes: Ferry and its peers (issue 14)\n"
    )?;
    if let Some(e) = failed {
        writeln!(
            md,
            "**This run did not finish**: {e:#}. What follows is what it measured before.\n"
        )?;
    }
    if settings.quick {
        writeln!(md, "**NET_QUICK=1: `bench/run.sh`'s quick trees (2,000 files; 2 x 16 MiB), a try of the harness, not a result.**\n")?;
    }
    writeln!(md, "Generated by `make bench-network` on {date}; nproc {nproc} ({cpu}); Linux {kernel}; **release** builds of ferry-agent and ferry-operator at {build}; {versions}. Every tool in one run on this machine, their runs interleaved, so the ratios compare like with like. Load: {load_note}.\n")?;
    writeln!(md, "Sender and receiver are on one machine and talk over loopback: node-a is 127.0.0.2, node-b 127.0.0.3, and not one packet leaves the machine, so the numbers are the protocols' and the programs' cost, not a network's. Each node's `/srv/vol` is a tmpfs of its own (`{TMPFS_A}` on node-a, `{TMPFS_B}` on node-b), so the trees are warm and no disk is timed: the trees are made on node-a's, every copy between nodes goes to node-b's and every copy on one node to node-a's.\n")?;
    writeln!(md, "## How each tool was run\n")?;
    writeln!(md, "- `ferry-network`: a CopyJob `source: {{root: vol-a, path: src/TREE}}`, `destination: {{root: vol-b, path: NAME}}`, StorageRoot `vol-a` being `/srv/vol` on node-a only and `vol-b` the same path on node-b only, everything else at the CRD's defaults: **verify Checksum** (the API's default: `Verify::Checksum` is the `#[default]` in `crds/src/policy.rs`, and the CRD says `default: Checksum`), a manifest, no compression, no bandwidth limit. The operator pairs node-a's agent (the sender) with node-b's (the receiver), which fetches the tree over node-a's transfer port: TLS 1.3, both sides authenticated by certificates from the operator's signer, the shard's ticket in the hello. The control plane is the process tier as `e2e/tests/network.rs` runs it: etcd and kube-apiserver 1.35.4, `deploy/ferry.yaml` applied (the chart's RBAC), the operator and the agents as processes on their ServiceAccounts' tokens (each agent's bound to its Node), `FERRY_TRANSFER_LISTEN` 127.0.0.2:PORT for node-a and 127.0.0.3:PORT for node-b. Timed from the start of `kubectl apply` until `kubectl wait --for=jsonpath={{.status.phase}}=Succeeded` returns, as `make bench-throughput` times a CopyJob: the two kubectl processes, the operator's reconcile and pairing, the ticket, the agents' watches, the receiver's syncfs and status writes are in it. After each run (untimed) its status is checked: mode `Network`, shard sender node-a, node node-b. The agents' own state (each job's journal and the records of what it listed, `/var/lib/ferry/agent` under each node's host root) is on the machine's disk, as a node's is, not on the tmpfs.")?;
    writeln!(md, "- `ferry-network, verify None`: the same with `verify: None`, as no peer hashes what it wrote. Both are timed; the default (`ferry-network`) is the one the targets are judged on.")?;
    writeln!(md, "- `rsync-daemon`: `rsync -a rsync://127.0.0.2:PORT/src/TREE/ DST/` from an `rsync --daemon` (`--address=127.0.0.2`, module `path` node-a's `src/`, read only, `uid = root`), writing to node-b's tmpfs: what pv-migrate and VolSync run, over ssh or stunnel, without the encryption. rsync checks every file it transferred against a whole-file checksum.")?;
    writeln!(md, "- `tar-socat`: `tar c -b 2048 | socat -u -b 1048576` into a `socat -u -b 1048576 TCP-LISTEN` on 127.0.0.3 piped to `tar x -b 2048 -B` (1 MiB records and buffers: with the defaults, 10 KiB and 8 KiB, the large files took 4.2 s in the peers-only run): one stream, no xattrs, no verification, no resume; the naive stream. Its top directory is made by `mkdir`, hence 'metadata lost' below. On 2 CPUs its four processes copy every byte through two pipes and a socket.")?;
    writeln!(md, "- `ferry-local CopyJob`: a CopyJob `vol-a:src/TREE` -> `vol-a:local/NAME` at the CRD's defaults: node-a's agent copies on its own (the local fast path, `copy_file_range`), timed as `ferry-network`.")?;
    writeln!(md, "- `ferry-local CLI`: `ferry-agent copy --no-progress --verify checksum --sync --manifest M SRC DST` on node-a's tmpfs: a CopyJob's engine work without the control plane (`make bench-throughput`'s CLI).")?;
    writeln!(md, "- `ferry-local CLI, verify none`: `ferry-agent copy --no-progress --verify none SRC DST` (the `ferry-local` of the peers-only table this file held before).")?;
    writeln!(md, "\nProtocol: each tree is made for the run with `bench/run.sh`'s generator and seed (the same bytes as its `many` and `large`), one untimed warmup of every tool, then {runs} rounds (`NET_RUNS`), each running every tool once, the order rotated by one each round; before each run (untimed) the clean page cache is dropped (`sync; echo 1 > /proc/sys/vm/drop_caches`: the trees are on tmpfs and stay in memory, but without it a copy's writer sometimes paid for reclaiming the cache earlier runs filled, 1.7 to 3.8 s for the same 2 GiB copy). The wall time of each command is taken by the harness around the process, as `hyperfine -N` does. After every run, untimed: the copy's files, directories and bytes are counted against the source's, a job is deleted (`kubectl delete --wait`), the copy and its manifest are removed. In the last round every tool's copy is compared with the source by `bench/check.py` (paths, types, sizes, bytes; then whether mode, owner and mtimes were kept). Machine CPU: the CPU-seconds the whole machine was busy during a run (`/proc/stat`; every process, the control plane's and the kernel's included).\n")?;

    writeln!(md, "## Results\n")?;
    writeln!(md, "Mean ± σ (sample standard deviation) of {runs} runs.\n")?;
    writeln!(
        md,
        "| tree | tool | wall (s) | min (s) | max (s) | MB/s | machine CPU (s) | check |\n|---|---|---:|---:|---:|---:|---:|---|"
    )?;
    for r in results {
        for (tool, samples) in &r.samples {
            let secs: Vec<f64> = samples.iter().map(|s| s.secs).collect();
            let cpu: Vec<f64> = samples.iter().map(|s| s.machine_cpu).collect();
            let min = secs.iter().copied().fold(f64::INFINITY, f64::min);
            let max = secs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let check = match r.meta_kept.get(tool) {
                Some(true) => "ok, metadata kept",
                Some(false) => "ok, metadata lost",
                None => "not checked",
            };
            writeln!(
                md,
                "| {} | {} | {} | {min:.3} | {max:.3} | {:.0} | {} | {check} |",
                r.tree,
                tool.name(),
                pm(&secs),
                r.count.bytes as f64 / 1e6 / mean(&secs),
                pm(&cpu)
            )?;
        }
    }
    writeln!(md)?;
    for r in results {
        writeln!(
            md,
            "- `{}`: {} files, {} directories, {} bytes.",
            r.tree, r.count.files, r.count.dirs, r.count.bytes
        )?;
    }
    writeln!(md, "\nCPU seconds of a run by whom (means; `/proc/PID/stat` of each process, the machine's from `/proc/stat`): the agents; the processes the harness started and waited for (`ferry-agent copy`, the rsync client, `tar` and `socat`, kubectl); the rest of the cluster and the rsync daemon with the connections it forked (etcd, kube-apiserver, the operator, `rsync --daemon`).\n")?;
    writeln!(md, "| tree | tool | node-a agent | node-b agent | harness's children | cluster, rsync daemon | machine |\n|---|---|---:|---:|---:|---:|---:|")?;
    for r in results {
        for (tool, samples) in &r.samples {
            let col = |f: &dyn Fn(&Sample) -> f64| mean(&samples.iter().map(f).collect::<Vec<_>>());
            writeln!(
                md,
                "| {} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |",
                r.tree,
                tool.name(),
                col(&|s: &Sample| s.agent_cpu[0]),
                col(&|s: &Sample| s.agent_cpu[1]),
                col(&|s: &Sample| s.harness_cpu),
                col(&|s: &Sample| s.cluster_cpu),
                col(&|s: &Sample| s.machine_cpu)
            )?;
        }
    }
    let m = |r: &TreeResult, tool: Tool| {
        r.samples.get(&tool).map_or(f64::NAN, |v| {
            mean(&v.iter().map(|s| s.secs).collect::<Vec<_>>())
        })
    };
    writeln!(md, "\n## Ratios and targets\n")?;
    writeln!(md, "Ratios of mean wall times; a ratio above 1 means Ferry's copy between nodes is the faster.\n")?;
    writeln!(md, "| tree | rsync / ferry-network | tar-socat / ferry-network | rsync / ferry-network (verify None) | tar-socat / ferry-network (verify None) | ferry-network / ferry-local CopyJob | ferry-network / ferry-local CLI |\n|---|---:|---:|---:|---:|---:|---:|")?;
    for r in results {
        let (net, none) = (m(r, Tool::Network), m(r, Tool::NetworkNoVerify));
        let (rsync, tar) = (m(r, Tool::Rsync), m(r, Tool::TarSocat));
        writeln!(
            md,
            "| {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |",
            r.tree,
            rsync / net,
            tar / net,
            rsync / none,
            tar / none,
            net / m(r, Tool::LocalJob),
            net / m(r, Tool::Cli)
        )?;
    }
    writeln!(md)?;
    let met = |b: bool| if b { "**met**" } else { "**not met**" };
    for r in results {
        let (net, none) = (m(r, Tool::Network), m(r, Tool::NetworkNoVerify));
        match r.tree.as_str() {
            "many" => {
                let (rsync, ratio) = (m(r, Tool::Rsync), m(r, Tool::Rsync) / net);
                writeln!(md, "- Target on the 100k-file tree: a CopyJob between nodes at least 3x as fast as rsync, i.e. at most {:.3} s (rsync's {rsync:.3} s / 3). ferry-network (verify Checksum, the default): {net:.3} s, rsync / ferry-network = {ratio:.2}: {}. With verify None: {none:.3} s, {:.2}x: {}.", rsync / 3.0, met(ratio >= 3.0), rsync / none, met(rsync / none >= 3.0))?;
            }
            "large" => {
                let (tar, speed) = (m(r, Tool::TarSocat), m(r, Tool::TarSocat) / net);
                writeln!(md, "- Target on the large files: a CopyJob between nodes at least 0.9x the tar pipe's speed, i.e. at most {:.3} s (tar-socat's {tar:.3} s / 0.9). ferry-network (verify Checksum, the default): {net:.3} s, its speed {speed:.2}x the tar pipe's: {}. With verify None: {none:.3} s, {:.2}x: {}.", tar / 0.9, met(speed >= 0.9), tar / none, met(tar / none >= 0.9))?;
            }
            _ => {}
        }
    }
    if loaded {
        writeln!(
            md,
            "- These were taken under concurrent load (see above): not conclusive."
        )?;
    }

    writeln!(md, "\n## Where a CopyJob's time goes\n")?;
    writeln!(md, "Means over the timed runs. The shard's parts are the copying agent's own account (its log's `shard finished` line: `start_ms` publishing Running, `copy_ms` the copy, `settle_ms` the manifest, the syncfs and the records); the rest of the wall time is the control plane's (kubectl, the operator's reconcile and pairing, the watches, the final status write). CPU: seconds of each agent's process during the run (`/proc/PID/stat`).\n")?;
    writeln!(md, "| tree | job | wall (s) | shard start (s) | shard copy (s) | shard settle (s) | rest (s) | node-a agent CPU (s) | node-b agent CPU (s) | machine CPU (s) |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")?;
    for r in results {
        for (tool, samples) in r.samples.iter().filter(|(t, _)| t.is_job()) {
            let col = |f: &dyn Fn(&Sample) -> f64| mean(&samples.iter().map(f).collect::<Vec<_>>());
            let shard = |i: usize| col(&|s: &Sample| s.shard.map_or(f64::NAN, |p| p[i]));
            let wall = col(&|s: &Sample| s.secs);
            let parts = shard(0) + shard(1) + shard(2);
            writeln!(
                md,
                "| {} | {} | {wall:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {:.2} | {:.2} | {:.2} |",
                r.tree,
                tool.name(),
                shard(0),
                shard(1),
                shard(2),
                wall - parts,
                col(&|s: &Sample| s.agent_cpu[0]),
                col(&|s: &Sample| s.agent_cpu[1]),
                col(&|s: &Sample| s.machine_cpu)
            )?;
        }
    }
    writeln!(md, "\nThe agents' CPU by thread during the jobs (means over the timed runs, CPU seconds; sampled every 50 ms from `/proc/PID/task/*/stat`, threads summed by name without their number; the four busiest of each agent). The names: `ferry-shard` runs a shard, `ferry-copy-N` are the receiver's (or a local copy's) workers, `ferry-recv` the receiver's one reader of the connection (every answer frame; the TLS stream is read, and so decrypted, on it through `SyncIoBridge`), `ferry-send-N` the sender's workers (which write, and so encrypt, their answers), `tokio-rt-worker` the async runtime's threads and its blocking pool (where the sender serves a connection).\n")?;
    writeln!(
        md,
        "| tree | job | node-a agent | node-b agent |\n|---|---|---|---|"
    )?;
    for r in results {
        for (tool, samples) in r.samples.iter().filter(|(t, _)| t.is_job()) {
            let busiest = |i: usize| {
                let mut sum: BTreeMap<&str, f64> = BTreeMap::new();
                for s in samples {
                    for (name, cpu) in s.threads.iter().flat_map(|t| &t[i]) {
                        *sum.entry(name.as_str()).or_default() += cpu / samples.len() as f64;
                    }
                }
                let mut v: Vec<(&str, f64)> = sum.into_iter().filter(|(_, c)| *c >= 0.01).collect();
                v.sort_by(|a, b| b.1.total_cmp(&a.1));
                v.iter()
                    .take(4)
                    .map(|(n, c)| format!("`{n}` {c:.2}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            writeln!(
                md,
                "| {} | {} | {} | {} |",
                r.tree,
                tool.name(),
                busiest(0),
                busiest(1)
            )?;
        }
    }
    for r in results {
        if let Some(p) = &r.profile {
            writeln!(md, "\n### Profile: {}\n\n{p}", r.tree)?;
        }
    }

    if settings.memory_files == 0 {
        writeln!(md, "\n## Memory\n")?;
    } else {
        writeln!(
            md,
            "\n## Memory: both agents' peak RSS over a copy between nodes of {} files\n",
            settings.memory_files
        )?;
    }
    match memory {
        Ok(None) if settings.memory_files == 0 => {
            writeln!(md, "Not measured in this run (`NET_RSS_FILES=0`).")?;
        }
        Ok(None) if failed.is_some() => writeln!(md, "Not measured: the run stopped before.")?,
        Ok(None) => writeln!(md, "(measuring ...)")?,
        Err(e) => writeln!(md, "**Failed**: {e:#}")?,
        Ok(Some(mem)) => {
            let target = 200e6;
            writeln!(md, "A tree of {} files of a few bytes each (`d0000/f0000` holds `0:0\\n`), {PER_DIR} to a directory ({} directories, {} bytes), made on node-a's tmpfs, copied by a `ferry-network` CopyJob (verify Checksum, the default) to node-b's tmpfs: {:.1} s from `kubectl apply` to `Succeeded` ({:.0} files/s; the receiver's shard copy {}). Peak RSS: each agent's `VmHWM` from `/proc/PID/status` after the job, its peak reset (`echo 5 > /proc/PID/clear_refs`) just before `kubectl apply`, so the timed trees' copies before it do not count; also the largest `VmRSS` sampled every 50 ms during the job. The same two agents that ran the timed copies above: their peak over everything before (the warmups, the timed copies of both trees, the profiled copies), read just before the reset, is shown too. MB = 10^6 bytes.\n",
                mem.count.files, mem.count.dirs, mem.count.bytes, mem.secs, mem.count.files as f64 / mem.secs,
                mem.shard.map_or("not logged".to_string(), |p| format!("{:.1} s", p[1])))?;
            writeln!(md, "| agent | peak RSS over the timed copies before (MB) | RSS when the job started (MB) | peak RSS during the job, VmHWM (MB) | largest sampled VmRSS (MB) | target < 200 MB (the job's peak) |\n|---|---:|---:|---:|---:|---|")?;
            for (i, (node, _)) in NODES.iter().enumerate() {
                let role = if i == 0 { "sender" } else { "receiver" };
                writeln!(
                    md,
                    "| {node} ({role}) | {:.1} | {:.1} | {:.1} | {:.1} | {} |",
                    mb(mem.life_kib[i]),
                    mb(mem.idle_kib[i]),
                    mb(mem.hwm_kib[i]),
                    mb(mem.sampled_kib[i]),
                    met((mem.hwm_kib[i] as f64 * 1024.0) < target)
                )?;
            }
            writeln!(md, "\nCheck: the copy has the source's files, directories and bytes, and `bench/check.py` found it identical (metadata {}).", if mem.meta_kept { "kept" } else { "lost" })?;
        }
    }
    writeln!(md, "\n## Re-run\n")?;
    writeln!(md, "`make bench-network` (root; builds release binaries; `NET_RUNS` runs, default 5; `NET_TREES`, default `many large`; `NET_RSS_FILES`, default 1000000, 0 for none; `NET_PERF=1` adds a `perf record` of both agents during one more ferry-network copy of each tree). `make bench-network-peers` runs the peers alone with hyperfine (`bench/network-peers.sh`, into `bench/work/NETWORK-peers.md`).")?;
    Ok(md)
}
