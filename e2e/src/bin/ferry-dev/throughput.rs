//! `ferry-dev bench-throughput`: a CopyJob against `ferry-agent copy` on `bench/run.sh`'s
//! 100k-file tree (`make bench-throughput`): set up, warm up, timed runs alternating the
//! two, a byte-for-byte check of the last copies, and a Markdown report. In the process
//! tier (the agent a host process, as `make dev-up` runs it) or in the real one-node tier
//! (`make bench-throughput-kube`: the agent the chart's DaemonSet pod, from `make image`).

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{ensure, Context, Result};
use ferry_e2e::kube::{KubeTier, NETNS, NODE};
use ferry_e2e::{repo_root, ControlPlane, Kubectl, LoopExt4, Proc};

use crate::bring_up;
use crate::machine::{
    count_tree, cpu_secs, loadavg, machine_busy_secs, median, pids_mentioning, shell_line,
    CpuSnapshot, LoadSampler, RunCpu, Tmpfs, TreeCount,
};

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
    let md = report(tier, cache, &bench.tree, runs, &timed, &checked)?;
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

/// The running benchmark: a control plane with the operator and agents, and the tree on a
/// tmpfs at node-a's `/srv/throughput`.
pub(crate) struct Bench {
    // Fields drop in order: the tmpfs is unmounted before the processes stop.
    _tmpfs: Option<Tmpfs>,
    _ext4: Option<LoopExt4>,
    cache: Cache,
    cp: Cluster,
    agent: PathBuf,
    agent_pid: u32,
    cluster_pids: Vec<u32>,
    root: PathBuf,
    src: PathBuf,
    tree: TreeCount,
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

impl Bench {
    pub(crate) fn set_up(tier: Tier, cache: Cache) -> Result<Self> {
        ensure!(
            cache == Cache::Warm || tier == Tier::Process,
            "the cold throughput benchmark runs in the process tier only"
        );
        release_builds();
        let ftzz = ftzz()?;
        let (cp, agent, agent_pid, cluster_pids, root, selector) = match tier {
            Tier::Process => {
                let (cp, procs, hosts) = bring_up()?;
                let agent = ferry_e2e::workspace_bin("ferry-agent", "ferry-agent")?;
                // bring_up starts the operator, then one agent per node in NODES order.
                let (operator_pid, agent_pid) = (procs[0].id(), procs[1].id());
                let mut cluster_pids = pids_mentioning(&cp.dir().to_string_lossy());
                cluster_pids.retain(|p| *p != agent_pid && *p != std::process::id());
                cluster_pids.push(operator_pid);
                let root = hosts.join("node-a/srv/throughput");
                let cluster = Cluster::Process { cp, _procs: procs };
                (
                    cluster,
                    agent,
                    agent_pid,
                    cluster_pids,
                    root,
                    "ferry.dev/node: node-a".to_string(),
                )
            }
            Tier::Kube => {
                eprintln!("building the image and bringing up the real one-node tier ...");
                let tier = KubeTier::up_or_skip()?.context("the real one-node tier needs root")?;
                // The very binary the image holds (scripts/build-image.sh), run on the host.
                let agent = repo_root()
                    .join("target/image/cargo/x86_64-unknown-linux-gnu/release/ferry-agent");
                ensure!(
                    agent.exists(),
                    "{} is missing after make image",
                    agent.display()
                );
                let runs: Vec<u32> = pids_mentioning("ferry-agent\0run")
                    .into_iter()
                    .filter(|p| *p != std::process::id())
                    .collect();
                ensure!(
                    runs.len() == 1,
                    "expected one agent pod process, found {runs:?}"
                );
                let agent_pid = runs[0];
                // Everything in the tier's network namespace: etcd, kube-apiserver, the
                // controllers, kubelet, containerd and its shims, kube-proxy, the operators.
                let listed = std::process::Command::new("ip")
                    .args(["netns", "pids", NETNS])
                    .output()
                    .context("ip netns pids")?;
                let cluster_pids = String::from_utf8_lossy(&listed.stdout)
                    .split_whitespace()
                    .filter_map(|p| p.parse().ok())
                    .filter(|p| *p != agent_pid)
                    .collect();
                let root = PathBuf::from("/srv/throughput");
                let selector = format!("kubernetes.io/hostname: {NODE}");
                (
                    Cluster::Kube(tier),
                    agent,
                    agent_pid,
                    cluster_pids,
                    root,
                    selector,
                )
            }
        };
        let (tmpfs, ext4) = match cache {
            Cache::Warm => (Some(Tmpfs::mount(&root, TMPFS_OPTIONS)?), None),
            Cache::Cold => {
                let img = root.with_extension("ext4.img");
                (None, Some(LoopExt4::mount(&root, &img, EXT4_SIZE)?))
            }
        };
        let src = root.join("src");
        eprintln!(
            "generating the 100k-file tree at {} (ftzz) ...",
            root.display()
        );
        let generated = std::process::Command::new(&ftzz)
            .stdout(std::io::stderr())
            .args(["-q", "-e"])
            .args(TREE_100K)
            .arg(&src)
            .status()
            .context("run ftzz")?;
        ensure!(generated.success(), "ftzz failed");
        let tree = count_tree(&src)?;
        std::fs::create_dir_all(root.join("out"))?;
        std::fs::create_dir_all(root.join(".ferry"))?;
        cp.apply(&format!("apiVersion: ferry.dev/v1alpha1\nkind: StorageRoot\nmetadata:\n  name: throughput\nspec:\n  path: /srv/throughput\n  nodeSelector: {{{selector}}}\n  namespaces: {{names: [default]}}\n"))?;
        Ok(Self {
            _tmpfs: tmpfs,
            _ext4: ext4,
            cache,
            cp,
            agent,
            agent_pid,
            cluster_pids,
            root,
            src,
            tree,
        })
    }

    /// Cold: write back and drop the page cache, dentries and inodes, so that the run reads
    /// the tree from the device. Warm: nothing.
    fn drop_caches(&self) -> Result<()> {
        if self.cache == Cache::Cold {
            crate::machine::drop_caches("3")?;
        }
        Ok(())
    }

    fn cpu(&self) -> CpuSnapshot {
        CpuSnapshot {
            agent: cpu_secs(self.agent_pid, false),
            cluster: self.cluster_pids.iter().map(|p| cpu_secs(*p, false)).sum(),
            children: cpu_secs(std::process::id(), true) - cpu_secs(std::process::id(), false),
        }
    }

    /// Everything this harness runs, to tell the rest of the machine's load apart.
    fn harness(&self) -> f64 {
        let c = self.cpu();
        cpu_secs(std::process::id(), true) + c.agent + c.cluster
    }

    fn check(&self, dst: &Path) -> Result<()> {
        let got = count_tree(dst)?;
        ensure!(
            got == self.tree,
            "{} holds {got:?}, the source {:?}",
            dst.display(),
            self.tree
        );
        Ok(())
    }

    pub(crate) fn remove(dst: &Path, manifest: &Path) -> Result<()> {
        std::fs::remove_dir_all(dst)?;
        std::fs::remove_file(manifest)?;
        Ok(())
    }

    /// `ferry-agent copy` with the CopyJob's engine options: verify Checksum (the CRD
    /// default) and a manifest; workers, reflink, overwrite, preserve at their defaults, as
    /// the agent's (`run --workers 0` = CPUs). Also the CPU seconds, during the run, of the
    /// copying process and of everything else.
    pub(crate) fn cli(&self, tag: &str) -> Result<(f64, RunCpu, PathBuf, PathBuf)> {
        let dst = self.root.join(format!("out/cli-{tag}"));
        let manifest = self.root.join(format!(".ferry/cli-{tag}.xxh128"));
        self.drop_caches()?;
        let before = self.cpu();
        let start = Instant::now();
        let run = std::process::Command::new(&self.agent)
            // --sync: a CopyJob reports Succeeded only once the destination is on stable
            // storage (a syncfs); the CLI is timed to the same point. Free on a tmpfs, and
            // a cold copy's writeback otherwise (the job pays it, the CLI would not).
            .args([
                "copy",
                "--no-progress",
                "--verify",
                "checksum",
                "--sync",
                "--manifest",
            ])
            .arg(&manifest)
            .arg(&self.src)
            .arg(&dst)
            .output()
            .context("run ferry-agent copy")?;
        let secs = start.elapsed().as_secs_f64();
        let used = self.cpu() - before;
        ensure!(
            run.status.success(),
            "ferry-agent copy failed: {}",
            String::from_utf8_lossy(&run.stderr)
        );
        self.check(&dst)?;
        let used = RunCpu {
            copy: used.children,
            cluster: used.agent + used.cluster,
            kubectl: 0.0,
        };
        Ok((secs, used, dst, manifest))
    }

    pub(crate) fn root(&self) -> &Path {
        &self.root
    }

    pub(crate) fn src(&self) -> &Path {
        &self.src
    }

    pub(crate) fn tree(&self) -> &TreeCount {
        &self.tree
    }

    pub(crate) fn agent(&self) -> &Path {
        &self.agent
    }

    /// A CopyJob into `dest` (a path in the StorageRoot) with `extra` spec lines, kept
    /// there: its destination, the wall time from apply to Succeeded, and the files it
    /// copied (`progress.filesDone`). The job is deleted after.
    /// A CopyJob of the source into `dest` (with `extra` spec lines): its destination,
    /// its time from creation to `Succeeded` as a watcher sees them, the same from the start
    /// of `kubectl apply` (kubectl's start-up and discovery included), and the files it
    /// copied.
    pub(crate) fn job_into(
        &self,
        tag: &str,
        dest: &str,
        extra: &str,
    ) -> Result<(PathBuf, JobTimes, u64)> {
        let cp = &self.cp;
        let name = format!("rerun-{tag}");
        let yaml = format!("apiVersion: ferry.dev/v1alpha1\nkind: CopyJob\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  source: {{root: throughput, path: src}}\n  destination: {{root: throughput, path: {dest}}}\n{extra}");
        let watch = cp.watch(
            "copyjobs",
            "default",
            &name,
            "{.type} {.object.status.phase} {.object.status.shards[*].state}",
        )?;
        std::thread::sleep(std::time::Duration::from_millis(500));
        let start = Instant::now();
        cp.apply(&yaml)?;
        let phase = |l: &str| l.split(' ').nth(1).unwrap_or_default().to_string();
        let finished = |l: &str| matches!(phase(l).as_str(), "Succeeded" | "Failed");
        let events = watch.until(finished, std::time::Duration::from_secs(300))?;
        let (created, (done, last)) = match (events.first(), events.last()) {
            (Some((c, first)), Some(last)) if first.starts_with("ADDED") => (*c, last),
            _ => anyhow::bail!("{name}: events {events:?}"),
        };
        ensure!(phase(last) == "Succeeded", "{name}: {last}");
        // The job's timeline (phase, then each shard's state), for a look at where the
        // time goes: each change as a watcher saw it, from the job's creation.
        let timeline: Vec<String> = events
            .iter()
            .map(|(at, l)| format!("+{:.3} {l}", at.duration_since(created).as_secs_f64()))
            .collect();
        eprintln!("{name}: {}", timeline.join(" | "));
        let times = JobTimes {
            created_to_done: done.duration_since(created).as_secs_f64(),
            apply_to_done: done.duration_since(start).as_secs_f64(),
        };
        let progress = cp.get(
            &format!("copyjob/{name}"),
            "default",
            "{.status.progress.filesDone} {.status.progress.unlisted}",
        )?;
        self.delete_job(&name)?;
        let (done_files, unlisted) = progress.split_once(' ').unwrap_or((&progress, ""));
        // Its manifest lists every file, those it kept included (from the node's records).
        ensure!(
            matches!(unlisted, "" | "0"),
            "{name}: the manifest does not list {unlisted} kept files"
        );
        let files = done_files
            .parse()
            .with_context(|| format!("{name}: filesDone {done_files:?}"))?;
        Ok((self.root.join(dest), times, files))
    }

    /// Delete CopyJob `name` and wait until it is gone.
    fn delete_job(&self, name: &str) -> Result<()> {
        self.cp.kubectl_ok(&[
            "delete",
            "copyjob",
            name,
            "-n",
            "default",
            "--wait=true",
            "--timeout=120s",
        ])?;
        Ok(())
    }

    /// `dst` equals the source: contents, modes, owners, mtimes (bench/check.py).
    pub(crate) fn check_same(&self, dst: &Path) -> Result<()> {
        let checked = self.check_byte_for_byte(&[dst.to_path_buf()])?;
        ensure!(
            checked.iter().all(|kept| *kept),
            "{}: metadata not kept",
            dst.display()
        );
        Ok(())
    }

    /// A CopyJob at the CRD's defaults: apply -> Succeeded (kubectl wait) wall time, and the
    /// agent's own copy time from the shard status (bytesDone / bytesPerSecond).
    fn job(&self, tag: &str) -> Result<(f64, f64, RunCpu, PathBuf, PathBuf)> {
        let cp = &self.cp;
        let name = format!("tput-{tag}");
        let yaml = format!("apiVersion: ferry.dev/v1alpha1\nkind: CopyJob\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  source: {{root: throughput, path: src}}\n  destination: {{root: throughput, path: out/{name}}}\n");
        self.drop_caches()?;
        let before = self.cpu();
        let start = Instant::now();
        cp.apply(&yaml)?;
        cp.wait_succeeded("default", &name, 120)?;
        let secs = start.elapsed().as_secs_f64();
        let used = self.cpu() - before;
        let status = cp.kubectl_ok(&[
            "get",
            "copyjob",
            &name,
            "-n",
            "default",
            "-o",
            "jsonpath={.spec.verify} {.status.shards[0].bytesDone} {.status.shards[0].bytesPerSecond} {.status.manifest}",
        ])?;
        let fields: Vec<&str> = status.split_whitespace().collect();
        ensure!(
            fields.first() == Some(&"Checksum"),
            "{name}: verify is not Checksum: {status}"
        );
        let num = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok());
        let agent_secs = match (num(1), num(2)) {
            (Some(bytes), Some(rate)) if rate > 0.0 => bytes / rate,
            _ => f64::NAN,
        };
        self.delete_job(&name)?;
        let dst = self.root.join(format!("out/{name}"));
        self.check(&dst)?;
        // Named by the job's uid, as its status says.
        let manifest = self.root.join(fields.get(3).copied().unwrap_or_default());
        Ok((
            secs,
            agent_secs,
            RunCpu {
                copy: used.agent,
                cluster: used.cluster,
                kubectl: used.children,
            },
            dst,
            manifest,
        ))
    }

    /// `runs` runs alternating CLI and CopyJob, with the machine's load watched meanwhile.
    fn timed_runs(&self, runs: usize) -> Result<Timed> {
        let load_before = loadavg();
        let (machine_before, harness_before) = (machine_busy_secs(), self.harness());
        let timed = Instant::now();
        let sampler = LoadSampler::start();
        let (mut cli_secs, mut job_secs, mut agent_secs) = (Vec::new(), Vec::new(), Vec::new());
        let (mut cli_cpu, mut job_cpu) = (Vec::new(), Vec::new());
        let mut last = Vec::new();
        for i in 0..runs {
            let (secs, used, dst, manifest) = self.cli(&i.to_string())?;
            eprintln!(
                "run {}/{runs}: ferry-agent copy {secs:.3} s (CPU s: copy {:.2}, cluster {:.2})",
                i + 1,
                used.copy,
                used.cluster
            );
            cli_secs.push(secs);
            cli_cpu.push(used);
            if i + 1 < runs {
                Self::remove(&dst, &manifest)?;
            } else {
                last.push(dst);
            }
            let (secs, agent, used, dst, manifest) = self.job(&i.to_string())?;
            eprintln!(
                "run {}/{runs}: CopyJob {secs:.3} s (agent copy {agent:.3} s; CPU s: copy {:.2}, cluster {:.2}, kubectl {:.2})",
                i + 1,
                used.copy,
                used.cluster,
                used.kubectl
            );
            job_secs.push(secs);
            job_cpu.push(used);
            agent_secs.push(agent);
            if i + 1 < runs {
                Self::remove(&dst, &manifest)?;
            } else {
                last.push(dst);
            }
        }
        let (samples, busy) = sampler.finish();
        let timed_secs = timed.elapsed().as_secs_f64();
        let others = (machine_busy_secs() - machine_before) - (self.harness() - harness_before);
        Ok(Timed {
            cli_secs,
            job_secs,
            agent_secs,
            cli_cpu,
            job_cpu,
            last,
            samples,
            busy,
            others,
            timed_secs,
            load_before,
            load_after: loadavg(),
        })
    }

    /// The last copy of each kind, byte for byte, by the file benchmark's correctness gate:
    /// whether each kept mode, owner and mtimes.
    fn check_byte_for_byte(&self, last: &[PathBuf]) -> Result<Vec<bool>> {
        last.iter()
            .map(|dst| check_copy(&self.src, dst, &self.root.join("check.json")))
            .collect()
    }
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

/// The Markdown section for `bench/CONTROL-PLANE.md`.
fn report(
    tier: Tier,
    cache: Cache,
    tree: &TreeCount,
    runs: usize,
    t: &Timed,
    checked: &[bool],
) -> Result<String> {
    let Timed {
        cli_secs,
        job_secs,
        agent_secs,
        cli_cpu,
        job_cpu,
        samples,
        busy,
        others,
        timed_secs,
        load_before,
        load_after,
        ..
    } = t;
    let (samples, busy, others, timed_secs) = (*samples, *busy, *others, *timed_secs);
    let tmpfs_options = TMPFS_OPTIONS;
    let (cli_med, job_med, agent_med) = (median(cli_secs), median(job_secs), median(agent_secs));
    let ratio = job_med / cli_med;
    let agent_ratio = agent_med / cli_med;
    let met = ratio <= 1.10;
    let nproc = std::thread::available_parallelism().map_or(0, std::num::NonZeroUsize::get);
    let cpu = shell_line("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'");
    let date = shell_line("date -u '+%Y-%m-%d %H:%M UTC'");
    let list = |v: &[f64]| {
        v.iter()
            .map(|s| format!("{s:.3}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let range = |v: &[f64]| {
        let min = v.iter().copied().fold(f64::INFINITY, f64::min);
        let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        format!("{min:.3} | {max:.3}")
    };
    // What differs between the tiers, as the report says it.
    let (make, setting, at, agent, cli, cluster) = match tier {
        Tier::Process => (
            match cache {
                Cache::Warm => "make bench-throughput",
                Cache::Cold => "make bench-throughput-cold",
            },
            "local etcd + kube-apiserver 1.35.4, the operator and two agents as for the rest of this file",
            "node-a's host path `/srv/throughput`",
            "node-a's agent",
            "`ferry-agent copy`",
            "etcd, kube-apiserver, the operator, the agents not copying",
        ),
        Tier::Kube => (
            "make bench-throughput-kube",
            "the real one-node tier of `make kube-up` (etcd, kube-apiserver, controller manager, scheduler, kubelet 1.35.4 with containerd, kube-proxy; the chart's operator Deployment and agent DaemonSet running the image of `make image`)",
            "the node's (this host's) `/srv/throughput`, which the agent pod sees through its `/host` mount",
            "the agent pod",
            "`ferry-agent copy` (the image's own static binary, run on the host)",
            "everything else in the tier: etcd, kube-apiserver, controllers, kubelet, containerd, kube-proxy, the operator pods",
        ),
    };
    // The machine's CPU time outside this harness, as a share of what the CPUs could give
    // during the timed runs: more than 5% is a concurrent load worth saying.
    let others_share = others / (timed_secs * nproc as f64);
    let cold = cache == Cache::Cold;
    let kernel = if cold {
        " (cold: these include the kernel's writeback, discard and reclaim threads the runs set off)"
    } else {
        ""
    };
    let measured = format!("processes other than the benchmark's{kernel} used {others:.1} CPU-seconds during the {timed_secs:.0} s of timed runs ({:.0}% of the {nproc} CPUs; `/proc/stat` busy time minus the harness's processes), a compiler (rustc, cc1 or ld) was running in {busy} of {samples} samples taken every 250 ms, 1-minute load average {load_before} before the timed runs and {load_after} after", others_share * 100.0);
    let loaded = others_share > 0.05 || busy > 0;
    let load_note = if loaded {
        let what = if busy > 0 {
            "a concurrent build"
        } else {
            "concurrent load"
        };
        format!("**taken with {what}**: {measured}. These numbers are noisier than on an idle machine; re-run `{make}` on an idle machine for reference figures")
    } else {
        format!("idle apart from the benchmark: {measured}")
    };
    let mut md = String::new();
    use std::fmt::Write as _;
    writeln!(
        md,
        "{THROUGHPUT_HEADING}: a CopyJob against `ferry-agent copy` on the 100k-file tree{}\n",
        if cold { ", cold" } else { "" }
    )?;
    writeln!(md, "Generated by `{make}` on {date}; nproc {nproc} ({cpu}); **release** builds of ferry-agent and ferry-operator; {setting}. Load: {load_note}.\n")?;
    writeln!(md, "Target: a CopyJob's throughput within 10% of `ferry-agent copy` on the same tree, i.e. CopyJob wall time / CLI wall time <= 1.10.\n")?;
    let place = if cold {
        let fs = shell_line("findmnt -no SOURCE,FSTYPE,OPTIONS -T /tmp");
        format!("on the disk: a new ext4 (`mkfs.ext4` defaults, with a journal as on a node's disk) in a sparse {EXT4_SIZE} image file on `/` (`{fs}`), loop-mounted with direct I/O on the image file (`losetup --direct-io=on`) at {at} (the StorageRoot `throughput`), unmounted and deleted after. Source and every destination are on it")
    } else {
        format!("on a tmpfs (`{tmpfs_options}`) mounted at {at} (the StorageRoot `throughput`) and unmounted after. Source and every destination are on that tmpfs")
    };
    writeln!(md, "- Tree: `ftzz -e {}`, `bench/run.sh`'s `many` tree: {} files, {} directories, {} bytes, generated for the run {place}.", TREE_100K.join(" "), tree.files, tree.dirs, tree.bytes)?;
    writeln!(md, "- CLI: {cli}: `ferry-agent copy --no-progress --verify checksum --sync --manifest /srv/throughput/.ferry/cli-N.xxh128 SRC DST`, wall time of the process as started by the harness. `--sync` flushes the destination filesystem (syncfs) before it exits, as the agent does before a job is `Succeeded`.")?;
    writeln!(md, "- CopyJob: `source: {{root: throughput, path: src}}`, `destination: {{root: throughput, path: out/tput-N}}`, everything else at the CRD defaults, so the agent copies with verify Checksum and writes its manifest to `/srv/throughput/.ferry/`. Wall time from `kubectl apply` to `Succeeded` observed by `kubectl wait` (what a user sees; it includes the two kubectl processes, the operator's reconcile and the agent's watch and status writes). Agent copy time: the shard's `bytesDone / bytesPerSecond`, i.e. from the agent picking up the shard to its final status write.")?;
    writeln!(md, "- Same engine options both ways: verify Checksum, manifest, reflink auto, overwrite never, all metadata kept, workers at the default of both (`copy --workers` and `run --workers` unset: 16, or the CPUs if more).")?;
    let caches = if cold {
        "Before every run, untimed: `sync` and `echo 3 > /proc/sys/vm/drop_caches` (the source's data, inodes and directories are read from the device)"
    } else {
        "The page cache needs no dropping on tmpfs"
    };
    writeln!(md, "- Protocol: one untimed warmup of each, then {runs} runs alternating CLI and CopyJob (a new job and a new destination each time); the destination, its manifest and the job are removed, untimed, between runs. {caches}.\n")?;
    writeln!(
        md,
        "| measurement | median (s) | min (s) | max (s) | runs |\n|---|---:|---:|---:|---:|"
    )?;
    writeln!(
        md,
        "| `ferry-agent copy`, wall | {cli_med:.3} | {} | {runs} |",
        range(cli_secs)
    )?;
    writeln!(
        md,
        "| CopyJob, `kubectl apply` -> `Succeeded`, wall | {job_med:.3} | {} | {runs} |",
        range(job_secs)
    )?;
    writeln!(
        md,
        "| CopyJob, agent copy time (shard status) | {agent_med:.3} | {} | {runs} |\n",
        range(agent_secs)
    )?;
    let cpu_med =
        |v: &[RunCpu], part: fn(&RunCpu) -> f64| median(&v.iter().map(part).collect::<Vec<_>>());
    writeln!(md, "CPU seconds (user + system, from `/proc/PID/stat`) used during the timed window of a run, medians:\n")?;
    writeln!(
        md,
        "| process | during a `ferry-agent copy` run | during a CopyJob run |\n|---|---:|---:|"
    )?;
    let rows = [
        (
            format!("the copy (the `ferry-agent copy` process / {agent})"),
            cpu_med(cli_cpu, |c| c.copy),
            cpu_med(job_cpu, |c| c.copy),
        ),
        (
            cluster.to_string(),
            cpu_med(cli_cpu, |c| c.cluster),
            cpu_med(job_cpu, |c| c.cluster),
        ),
        (
            "kubectl (`apply`, `wait`)".to_string(),
            cpu_med(cli_cpu, |c| c.kubectl),
            cpu_med(job_cpu, |c| c.kubectl),
        ),
    ];
    for (what, cli_part, job_part) in rows {
        writeln!(md, "| {what} | {cli_part:.2} | {job_part:.2} |")?;
    }
    writeln!(
        md,
        "| CPU available (median wall x {nproc} CPUs) | {:.2} | {:.2} |\n",
        cli_med * nproc as f64,
        job_med * nproc as f64
    )?;
    writeln!(
        md,
        "- **Ratio CopyJob / CLI (wall, medians): {ratio:.2}**; target <= 1.10: **{}**{}.",
        if met { "met" } else { "not met" },
        if loaded {
            " (under concurrent load, see above: not conclusive)"
        } else {
            ""
        }
    )?;
    writeln!(md, "- Agent copy time / CLI wall (medians): {agent_ratio:.2}. CopyJob wall - agent copy time (median; the control plane's fixed cost per job): {:.3} s.", job_med - agent_med)?;
    writeln!(
        md,
        "- Per run (s), CLI: {}; CopyJob: {}; agent copy: {}.",
        list(cli_secs),
        list(job_secs),
        list(agent_secs)
    )?;
    writeln!(md, "- Correctness: every destination, CLI and CopyJob, has the source's {} files, {} directories and {} bytes (counted after each run); the last CLI copy and the last CopyJob copy were compared with the source byte for byte by `bench/check.py` (paths, types, sizes, contents): ok; mode, owner and mtimes kept: {}.", tree.files, tree.dirs, tree.bytes, if checked.iter().all(|k| *k) { "yes" } else { "no" })?;
    writeln!(
        md,
        "- Re-run (root; about 3 minutes plus the release builds): `{make}`."
    )?;
    Ok(md)
}

/// Replace the throughput section of `file` (from its heading to the end) with `section`,
/// or append it; the rest of the file is kept.
fn splice_section(file: &Path, section: &str) -> Result<()> {
    let old = std::fs::read_to_string(file).unwrap_or_default();
    let keep = if old.starts_with(THROUGHPUT_HEADING) {
        ""
    } else {
        old.find(&format!("\n{THROUGHPUT_HEADING}"))
            .map_or(old.as_str(), |i| &old[..i])
            .trim_end()
    };
    let text = if keep.is_empty() {
        section.to_string()
    } else {
        format!("{keep}\n\n{section}")
    };
    let tmp = file.with_extension("md.tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, file)?;
    Ok(())
}

/// How long one CopyJob took (see [`Bench::job_into`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct JobTimes {
    /// From the watcher seeing it created to seeing it `Succeeded`: the job's own time.
    pub created_to_done: f64,
    /// From the start of `kubectl apply` to the watcher seeing it `Succeeded`.
    pub apply_to_done: f64,
}
