//! The running throughput benchmark ([`Bench`]): the cluster (the process tier or the real
//! one-node tier) with the 100k-file tree on a tmpfs or a cold ext4 at node-a's
//! `/srv/throughput`, and its timed runs of `ferry-agent copy` and of a CopyJob, with the CPU
//! each used and the checks of what they made; `ferry-dev bench-rerun` runs its jobs too.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{ensure, Context, Result};
use ferry_e2e::kube::{KubeTier, NETNS, NODE};
use ferry_e2e::{repo_root, LoopExt4};

use super::{
    check_copy, ftzz, release_builds, Cache, Cluster, JobTimes, Tier, Timed, EXT4_SIZE,
    TMPFS_OPTIONS, TREE_100K,
};
use crate::bring_up;
use crate::machine::{
    count_tree, cpu_secs, loadavg, machine_busy_secs, pids_mentioning, CpuSnapshot, LoadSampler,
    RunCpu, Tmpfs, TreeCount,
};

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
    pub(super) fn job(&self, tag: &str) -> Result<(f64, f64, RunCpu, PathBuf, PathBuf)> {
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
    pub(super) fn timed_runs(&self, runs: usize) -> Result<Timed> {
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
    pub(super) fn check_byte_for_byte(&self, last: &[PathBuf]) -> Result<Vec<bool>> {
        last.iter()
            .map(|dst| check_copy(&self.src, dst, &self.root.join("check.json")))
            .collect()
    }
}
