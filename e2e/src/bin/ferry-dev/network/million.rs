//! `ferry-dev bench-million` (`make bench-million-jobs`): a million files as CopyJobs, and a
//! dry run of ten million (issue 35, item 2). On the benchmark's cluster ([`Net`]: the chart's
//! RBAC, node-a and node-b each with its tmpfs and, by default, a CPU of its own): a CopyJob
//! of `ftzz -n 1000000 -b 200000000 --seed 3` on node-a, then the same tree from node-a to
//! node-b; then a `dryRun` CopyJob of ten million empty files on the machine's disk. For
//! each: the time from `kubectl apply` to `Succeeded`, the job's size as the API serves it,
//! the operator's and each agent's peak RSS over the job, the API requests made meanwhile
//! (all of them, and those on CopyJobs), and the agents' own state on each node afterwards
//! (journals and records, `/var/lib/ferry/agent`). Writes `bench/MILLION-COPYJOB.md`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{ensure, Context, Result};
use ferry_e2e::ControlPlane;
use serde_json::Value;

use super::{Net, Tool, TEAM};
use crate::control_plane::requests_in;
use crate::machine::{count_tree, loadavg, proc_status_kib, reset_peak_rss, shell_line, TreeCount};
use crate::throughput::check_copy;

/// The million-file tree, as issue 35 gives it.
const MILLION: [&str; 6] = ["-n", "1000000", "-b", "200000000", "--seed", "3"];
/// Ten million empty files, kept between runs (making them takes minutes): on the disk, as
/// a tmpfs of ten million inodes would hold ~10 GB of the machine's memory.
const TEN_MILLION_FILES: &str = "10000000";
const TEN_MILLION_CACHE: &str = "/var/cache/ferry-bench/ten-million";
/// How long each job may take.
const TIMEOUT: u32 = 3600;

/// What one job measured.
struct Job {
    what: String,
    count: TreeCount,
    secs: f64,
    /// `kubectl get copyjob -o json` and its `.status`, bytes.
    object_bytes: usize,
    status_bytes: usize,
    shards: usize,
    /// Peak RSS over the job, KiB: the operator, node-a's agent, node-b's agent.
    hwm_kib: [u64; 3],
    /// apiserver requests during the job: all, and those on CopyJobs (any verb).
    requests: (u64, u64),
    /// Bytes of each agent's own state (`/var/lib/ferry/agent` under its host root) after it.
    state_bytes: [u64; 2],
    plan: Option<String>,
}

impl Net {
    fn host_root(&self, node: usize) -> PathBuf {
        let vol = if node == 0 { &self.a } else { &self.b };
        // `<host root>/srv/vol`
        vol.parent()
            .and_then(Path::parent)
            .map(Path::to_path_buf)
            .unwrap_or_default()
    }

    fn pids3(&self) -> [u32; 3] {
        let [a, b] = self.agent_pids();
        [self._operator.id(), a, b]
    }

    /// Make job `name` (`apply`), wait until it Succeeded, and measure it.
    fn measured_job(
        &self,
        what: &str,
        name: &str,
        apply: impl FnOnce() -> Result<()>,
        count: TreeCount,
    ) -> Result<Job> {
        let pids = self.pids3();
        for p in pids {
            reset_peak_rss(p)?;
        }
        let before = api_requests(&self.cp)?;
        eprintln!("million: {what} ...");
        let start = Instant::now();
        apply()?;
        self.cp.wait_succeeded(TEAM, name, TIMEOUT)?;
        let secs = start.elapsed().as_secs_f64();
        let after = api_requests(&self.cp)?;
        let hwm_kib = pids.map(|p| proc_status_kib(p, "VmHWM"));
        let object = self
            .cp
            .kubectl_ok(&["get", "copyjob", name, "-n", TEAM, "-o", "json"])?;
        let job: Value = serde_json::from_str(&object)?;
        let status = &job["status"];
        let plan = status
            .get("plan")
            .filter(|p| !p.is_null())
            .map(|p| serde_json::to_string(p).unwrap_or_default());
        let state_bytes = [0, 1].map(|n| dir_bytes(&self.host_root(n).join("var/lib/ferry/agent")));
        eprintln!("million: {what}: {secs:.1} s");
        Ok(Job {
            what: what.to_string(),
            count,
            secs,
            object_bytes: object.trim().len(),
            status_bytes: serde_json::to_string(status)?.len(),
            shards: status["shards"].as_array().map_or(0, Vec::len),
            hwm_kib,
            requests: (after.0 - before.0, after.1 - before.1),
            state_bytes,
            plan,
        })
    }

    /// The million-file tree copied on node-a, then from node-a to node-b; each copy
    /// counted and checked, then removed with its job.
    fn million_jobs(&self) -> Result<Vec<Job>> {
        let src = self.a.join("src/million");
        eprintln!("million: generating {} ...", src.display());
        let status = Command::new(&self.ftzz)
            .arg("-q")
            .args(MILLION)
            .arg(&src)
            .stdout(std::io::stderr())
            .status()
            .context("ftzz")?;
        ensure!(status.success(), "generating the million-file tree failed");
        let count = count_tree(&src)?;
        let mut jobs = Vec::new();
        for (tool, what) in [
            (Tool::LocalJob, "1M files, a CopyJob on node-a"),
            (Tool::Network, "1M files, a CopyJob from node-a to node-b"),
        ] {
            let name = format!("million-{}", tool.slug());
            let apply = || self.apply_job(tool, &name, "million");
            jobs.push(self.measured_job(what, &name, apply, count)?);
            let made = self.inspect_job(tool, &name)?;
            self.counted(&made, &count)?;
            let report = self.cp.dir().join(format!("check-{name}.json"));
            ensure!(
                check_copy(&src, &made.dst, &report)?,
                "{}: metadata not kept",
                made.dst.display()
            );
            made.remove()?;
            self.finish_job(&name)?;
        }
        std::fs::remove_dir_all(&src)?;
        Ok(jobs)
    }

    /// A dry run over ten million empty files (made once, kept in [`TEN_MILLION_CACHE`] and
    /// bind-mounted as node-a's `/srv/big`, a StorageRoot of its own).
    fn ten_million_dry_run(&self) -> Result<Job> {
        let cache = Path::new(TEN_MILLION_CACHE);
        let done = cache.with_extension("done");
        if !done.exists() {
            eprintln!(
                "million: making ten million empty files in {} (once; minutes) ...",
                cache.display()
            );
            if cache.exists() {
                std::fs::remove_dir_all(cache)?;
            }
            let status = Command::new(&self.ftzz)
                .args(["-q", "-n", TEN_MILLION_FILES, "-b", "0", "--seed", "3"])
                .arg(cache)
                .stdout(std::io::stderr())
                .status()
                .context("ftzz")?;
            ensure!(status.success(), "making the ten-million-file tree failed");
            std::fs::write(&done, "")?;
        }
        let count = count_tree(cache)?;
        let big = self.host_root(0).join("srv/big");
        std::fs::create_dir_all(&big)?;
        let _bind = Bind::mount(cache, &big)?;
        self.cp.apply(&format!("apiVersion: ferry.dev/v1alpha1\nkind: StorageRoot\nmetadata:\n  name: big\nspec:\n  path: /srv/big\n  nodeSelector: {{ferry.dev/node: node-a}}\n  namespaces: {{names: [{TEAM}]}}\n"))?;
        let name = "ten-million-dry-run";
        let yaml = format!("apiVersion: ferry.dev/v1alpha1\nkind: CopyJob\nmetadata:\n  name: {name}\n  namespace: {TEAM}\nspec:\n  source: {{root: big, path: .}}\n  destination: {{root: vol-a, path: local/dry}}\n  dryRun: true\n");
        let what = "10M empty files, a dry run on node-a";
        let job = self.measured_job(what, name, || self.cp.apply(&yaml), count)?;
        ensure!(
            !self.a.join("local/dry").exists(),
            "the dry run made its destination"
        );
        self.finish_job(name)?;
        Ok(job)
    }
}

/// `apiserver_request_total`, summed: every request, and those on CopyJobs.
fn api_requests(cp: &ControlPlane) -> Result<(u64, u64)> {
    let metrics = cp.kubectl_ok(&["get", "--raw", "/metrics"])?;
    Ok((
        requests_in(&metrics, |_| true),
        requests_in(&metrics, |l| l.contains("resource=\"copyjobs\"")),
    ))
}

/// Bytes of the files under `dir` (0 when it does not exist).
fn dir_bytes(dir: &Path) -> u64 {
    count_tree(dir).map_or(0, |c| c.bytes)
}

/// A bind mount, unmounted when dropped.
struct Bind(PathBuf);

impl Bind {
    fn mount(from: &Path, to: &Path) -> Result<Self> {
        let status = Command::new("mount")
            .arg("--bind")
            .arg(from)
            .arg(to)
            .status()
            .context("mount --bind")?;
        ensure!(
            status.success(),
            "mount --bind {} {}",
            from.display(),
            to.display()
        );
        Ok(Self(to.to_path_buf()))
    }
}

impl Drop for Bind {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

fn mb(kib: u64) -> f64 {
    kib as f64 * 1024.0 / 1e6
}

/// The million-file CopyJobs and the ten-million dry run; prints the report and writes it
/// to `out`.
pub fn bench_million(out: Option<&Path>) -> Result<()> {
    ensure!(
        ferry_e2e::is_root(),
        "bench-million mounts tmpfs: run it as root"
    );
    let build = super::built_from();
    let net = Net::start()?;
    let load_before = loadavg();
    let mut jobs = net.million_jobs()?;
    jobs.push(net.ten_million_dry_run()?);
    let mut md = String::new();
    let nproc = std::thread::available_parallelism().map_or(0, std::num::NonZeroUsize::get);
    let date = shell_line("date -u '+%Y-%m-%d %H:%M UTC'");
    writeln!(
        md,
        "# A million files as CopyJobs, ten million as a dry run\n"
    )?;
    writeln!(md, "Generated by `make bench-million-jobs` (`ferry-dev bench-million`) on {date}; nproc {nproc}; release builds at {build}; 1-minute load average {load_before} before and {} after. The cluster is `make bench-network`'s (the process tier with the chart's RBAC; node-a's and node-b's `/srv/vol` each a tmpfs; {}). The million-file tree is `ftzz -n 1000000 -b 200000000 --seed 3` on node-a's tmpfs, copied by a CopyJob at the CRD's defaults (verify Checksum, a manifest) on node-a, then from node-a to node-b; each copy counted and checked by `bench/check.py`. The dry run is a `dryRun: true` CopyJob over ten million empty files (`ftzz -n 10000000 -b 0 --seed 3`) on the machine's disk (ext4), bind-mounted as node-a's StorageRoot `big`. Peak RSS: `VmHWM` after the job, reset (`clear_refs` 5) just before it. API requests: the apiserver's `apiserver_request_total` over the job (every client: kubectl, the operator, both agents). Agent state: the bytes each agent keeps under `/var/lib/ferry/agent` (journals, records) after the job. MB = 10^6 bytes.\n", loadavg(), net.cpus.describe())?;
    writeln!(md, "| job | files | dirs | apply -> Succeeded (s) | files/s | object (KB) | status (KB) | shards | operator peak RSS (MB) | node-a agent (MB) | node-b agent (MB) | API requests (on CopyJobs) | agent state node-a / node-b (MB) |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")?;
    for j in &jobs {
        writeln!(
            md,
            "| {} | {} | {} | {:.1} | {:.0} | {:.1} | {:.1} | {} | {:.1} | {:.1} | {:.1} | {} ({}) | {:.1} / {:.1} |",
            j.what,
            j.count.files,
            j.count.dirs,
            j.secs,
            j.count.files as f64 / j.secs,
            j.object_bytes as f64 / 1e3,
            j.status_bytes as f64 / 1e3,
            j.shards,
            mb(j.hwm_kib[0]),
            mb(j.hwm_kib[1]),
            mb(j.hwm_kib[2]),
            j.requests.0,
            j.requests.1,
            j.state_bytes[0] as f64 / 1e6,
            j.state_bytes[1] as f64 / 1e6,
        )?;
    }
    for j in jobs.iter().filter(|j| j.plan.is_some()) {
        writeln!(
            md,
            "\nThe dry run's `status.plan`: `{}`",
            j.plan.as_deref().unwrap_or("")
        )?;
    }
    print!("{md}");
    if let Some(file) = out {
        std::fs::write(file, &md)?;
        eprintln!("wrote {}", file.display());
    }
    Ok(())
}
