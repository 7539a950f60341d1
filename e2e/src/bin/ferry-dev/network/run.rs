//! The timed runs on one tree: the tree made, one untimed warmup of every tool, the rounds
//! (each tool once a round, in rotated order), every copy counted and the last ones checked;
//! one run of a tool (a command, or a CopyJob applied, waited for and inspected); the CPU
//! the agents' threads used, by name ([`ThreadSampler`]); the optional `perf` profile.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use ferry_e2e::repo_root;
use serde_json::Value;

use super::{
    drop_page_cache, Made, Net, Sample, Settings, Tool, TreeResult, JOB_TIMEOUT, LARGE, NODES,
    QUICK_LARGE, QUICK_MANY, TEAM, TOOLS,
};
use crate::machine::{count_tree, cpu_secs, machine_busy_secs, TreeCount};
use crate::throughput::{check_copy, TREE_100K};

impl Net {
    /// Make tree `tree` (`bench/run.sh`'s generator and seed) under node-a's `src/`.
    fn generate(&self, tree: &str, quick: bool) -> Result<PathBuf> {
        let dir = self.a.join("src").join(tree);
        generate(&self.ftzz, tree, &dir, quick)?;
        Ok(dir)
    }

    /// The warmup, the timed rounds and the checks on one tree; the tree is removed after.
    pub(super) fn bench_tree(&self, tree: &str, settings: &Settings) -> Result<TreeResult> {
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
    pub(super) fn counted(&self, made: &Made, count: &TreeCount) -> Result<()> {
        let got = count_tree(&made.dst)?;
        ensure!(
            got == *count,
            "{} holds {got:?}, the source {count:?}",
            made.dst.display()
        );
        Ok(())
    }

    /// One run of `tool` on `tree`, timed.
    pub(super) fn run(
        &self,
        tool: Tool,
        tree: &str,
        tag: &str,
        timeout: u32,
    ) -> Result<(Sample, Made)> {
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
                let mut c = self.cpus.command(1, "rsync");
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
                // The receiving half on node-b's CPU, the sending half on node-a's.
                let recv = self.cpus.enter(1, &format!("socat -u -b 1048576 TCP-LISTEN:{port},bind={ip},reuseaddr - | tar x -b 2048 -B -C {d}"));
                let send = self.cpus.enter(0, &format!("tar c -b 2048 -C {s} . | socat -u -b 1048576 - TCP:{ip}:{port},retry=200,interval=0.005"));
                let pipe = format!("mkdir -p {d}; ({recv}) & ({send}); wait");
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
                let mut c = self.cpus.command(0, &self.ferry);
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
    pub(super) fn destination(&self, tool: Tool, name: &str) -> (&'static str, String, PathBuf) {
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
    pub(super) fn apply_job(&self, tool: Tool, name: &str, tree: &str) -> Result<()> {
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
    pub(super) fn inspect_job(&self, tool: Tool, name: &str) -> Result<Made> {
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
    pub(super) fn finish_job(&self, name: &str) -> Result<()> {
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
}

/// Make tree `tree` at `dir` with `bench/run.sh`'s generator and seed (`ftzz` for `many`,
/// `bench/gen_files.py` for `large`; their quick sizes with `quick`).
pub(crate) fn generate(ftzz: &Path, tree: &str, dir: &Path, quick: bool) -> Result<()> {
    eprintln!("generating {tree} at {} ...", dir.display());
    let mut cmd = match tree {
        "many" => {
            let mut c = Command::new(ftzz);
            let spec = if quick { QUICK_MANY } else { TREE_100K };
            c.args(["-q", "-e"]).args(spec).arg(dir);
            c
        }
        "large" => {
            let mut c = Command::new("python3");
            c.arg(repo_root().join("bench/gen_files.py"))
                .arg("large")
                .arg(dir)
                .args(if quick { QUICK_LARGE } else { LARGE });
            c
        }
        other => bail!("no tree {other}: the trees are many and large"),
    };
    let status = cmd
        .stdout(std::io::stderr())
        .status()
        .with_context(|| format!("generate {tree}"))?;
    ensure!(status.success(), "generating {tree} failed");
    Ok(())
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
