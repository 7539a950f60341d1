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

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use ferry_e2e::{repo_root, ControlPlane, Proc};

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
    let diff = std::process::Command::new("diff")
        .arg("-r")
        .arg(&src)
        .arg(&copy)
        .output()?;
    ensure!(diff.status.success(), "the copy differs from the source");
    println!("copy on node-a is identical to the source (diff -r); manifest: /srv/demo/.ferry/default-demo.xxh128");
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

/// `apiserver_request_total` for PATCHes of CopyJob status, from the apiserver's metrics.
fn status_patches(cp: &ControlPlane) -> Result<u64> {
    let metrics = cp.kubectl_ok(&["get", "--raw", "/metrics"])?;
    Ok(metrics
        .lines()
        .filter(|l| {
            l.starts_with("apiserver_request_total{")
                && l.contains("resource=\"copyjobs\"")
                && l.contains("subresource=\"status\"")
                && (l.contains("verb=\"APPLY\"") || l.contains("verb=\"PATCH\""))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64)
}

fn peak_rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix("VmHWM:")
                    .map(|v| v.trim().trim_end_matches(" kB").trim().parse().unwrap_or(0))
            })
        })
        .unwrap_or(0)
}

/// The control-plane benchmark of the operator issue: apply -> Succeeded latency of
/// one-file CopyJobs (one at a time), then `burst` jobs applied at once: time until all
/// have Succeeded, status writes per job, operator peak RSS. Prints a Markdown report.
fn bench(sequential: usize, burst: usize) -> Result<()> {
    let (cp, procs, hosts) = bring_up()?;
    std::fs::create_dir_all(hosts.join("node-a/srv/bench/src"))?;
    std::fs::write(hosts.join("node-a/srv/bench/src/one"), b"one file")?;
    cp.apply("apiVersion: ferry.dev/v1alpha1\nkind: StorageRoot\nmetadata:\n  name: bench\nspec:\n  path: /srv/bench\n  nodeSelector: {ferry.dev/node: node-a}\n  namespaces: {names: [default]}\n")?;
    let job = |name: &str| {
        format!("apiVersion: ferry.dev/v1alpha1\nkind: CopyJob\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  source: {{root: bench, path: src/one}}\n  destination: {{root: bench, path: out/{name}}}\n")
    };
    let patches_before = status_patches(&cp)?;
    let mut latencies = Vec::new();
    for i in 0..sequential {
        let name = format!("seq-{i}");
        let start = Instant::now();
        cp.apply(&job(&name))?;
        cp.wait_succeeded("default", &name, 60)?;
        latencies.push(start.elapsed().as_secs_f64());
    }
    let seq_patches = status_patches(&cp)? - patches_before;
    latencies.sort_by(f64::total_cmp);
    let median = latencies[latencies.len() / 2];
    let p90 = latencies[latencies.len() * 9 / 10];
    let all: String = (0..burst)
        .map(|i| job(&format!("burst-{i}")))
        .collect::<Vec<_>>()
        .join("---\n");
    let before = status_patches(&cp)?;
    let start = Instant::now();
    cp.apply(&all)?;
    loop {
        let phases = cp.kubectl_ok(&[
            "get",
            "copyjobs",
            "-n",
            "default",
            "-o",
            "jsonpath={.items[*].status.phase}",
        ])?;
        let done = phases
            .split_whitespace()
            .filter(|p| *p == "Succeeded")
            .count();
        if done >= sequential + burst {
            break;
        }
        ensure!(
            start.elapsed() < Duration::from_secs(600),
            "only {done} of {} jobs succeeded after 600 s",
            sequential + burst
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let burst_secs = start.elapsed().as_secs_f64();
    let burst_patches = status_patches(&cp)? - before;
    let rss = peak_rss_kib(procs[0].id());
    println!("| measurement | value |\n|---|---|");
    println!("| one-file CopyJob, `kubectl apply` -> `Succeeded` (observed by `kubectl wait`), median of {sequential} | {median:.2} s (p90 {p90:.2} s) |");
    println!("| status writes per one-file job (apiserver_request_total, CopyJob status APPLY/PATCH) | {:.1} |", seq_patches as f64 / sequential as f64);
    println!("| {burst} CopyJobs applied at once, all `Succeeded` after | {burst_secs:.1} s |");
    println!(
        "| status writes per job in that burst | {:.1} |",
        burst_patches as f64 / burst as f64
    );
    println!(
        "| operator peak RSS (VmHWM) | {:.1} MiB |",
        rss as f64 / 1024.0
    );
    Ok(())
}

/// `bench/run.sh`'s 100k-file tree (`many`): `ftzz -e` with these arguments.
const TREE_100K: [&str; 8] = ["-n", "100000", "-b", "500000000", "-d", "5", "--seed", "1"];

/// The heading of the throughput section of `bench/CONTROL-PLANE.md`; everything from it to
/// the end of the file is that section (`make bench-control-plane` keeps it).
const THROUGHPUT_HEADING: &str = "## Throughput";

/// A tmpfs mounted for the benchmark, unmounted when dropped (also on error).
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, options: &str) -> Result<Self> {
        std::fs::create_dir_all(dir)?;
        let status = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", options, "ferry-throughput"])
            .arg(dir)
            .status()
            .context("run mount")?;
        ensure!(
            status.success(),
            "mount -t tmpfs on {} failed (root needed)",
            dir.display()
        );
        Ok(Self(dir.to_path_buf()))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let umount = |lazy: bool| {
            std::process::Command::new("umount")
                .args(lazy.then_some("-l"))
                .arg(&self.0)
                .status()
                .is_ok_and(|s| s.success())
        };
        if !umount(false) && !umount(true) {
            eprintln!("could not unmount the tmpfs at {}", self.0.display());
        }
    }
}

/// What a tree holds, below its top directory.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct TreeCount {
    files: u64,
    dirs: u64,
    other: u64,
    bytes: u64,
}

/// Count the entries of a tree (without following symlinks) and the bytes of its files.
fn count_tree(root: &Path) -> Result<TreeCount> {
    let mut count = TreeCount::default();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).with_context(|| format!("read {}", dir.display()))? {
            let entry = entry?;
            let meta = entry.metadata()?;
            if meta.is_dir() {
                count.dirs += 1;
                stack.push(entry.path());
            } else if meta.is_file() {
                count.files += 1;
                count.bytes += meta.len();
            } else {
                count.other += 1;
            }
        }
    }
    Ok(count)
}

/// The median of the finite values (NaN: a run without that number); NaN when none.
fn median(values: &[f64]) -> f64 {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        f64::NAN
    } else if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Is a compiler (a concurrent build) running on this machine now?
fn compiler_running() -> bool {
    const COMPILERS: [&str; 6] = ["rustc", "clippy-driver", "cc1", "cc1plus", "ld", "ld.lld"];
    std::fs::read_dir("/proc").is_ok_and(|dir| {
        dir.flatten().any(|e| {
            std::fs::read_to_string(e.path().join("comm"))
                .is_ok_and(|c| COMPILERS.contains(&c.trim()))
        })
    })
}

/// Samples, every 250 ms until stopped, whether a compiler runs: (samples, with a compiler).
struct LoadSampler {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<(u32, u32)>,
}

impl LoadSampler {
    fn start() -> Self {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let (mut samples, mut busy) = (0, 0);
            while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                samples += 1;
                busy += u32::from(compiler_running());
                std::thread::sleep(Duration::from_millis(250));
            }
            (samples, busy)
        });
        Self { stop, thread }
    }

    fn finish(self) -> (u32, u32) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.join().unwrap_or((0, 0))
    }
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "?".into())
}

/// CPU seconds all CPUs of this machine have spent busy (not idle, iowait or stolen) since
/// boot, from the `cpu` line of `/proc/stat`.
fn machine_busy_secs() -> f64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let f: Vec<f64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .map(|v| v.parse().unwrap_or(0.0))
        .collect();
    let get = |i: usize| f.get(i).copied().unwrap_or(0.0);
    // user nice system idle iowait irq softirq steal (guest time is inside user); USER_HZ.
    (get(0) + get(1) + get(2) + get(5) + get(6)) / 100.0
}

/// CPU seconds used during one timed run by the copying process, by the rest of the local
/// cluster (etcd, kube-apiserver, the operator, the agents not copying) and by kubectl.
#[derive(Debug, Clone, Copy)]
struct RunCpu {
    copy: f64,
    cluster: f64,
    kubectl: f64,
}

fn shell_line(cmd: &str) -> String {
    std::process::Command::new("sh")
        .args(["-c", cmd])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

/// CPU seconds (user + system) process `pid` has used; with `children`, plus those of its
/// children it has waited for. 0 when it is gone.
fn cpu_secs(pid: u32, children: bool) -> f64 {
    // USER_HZ, the unit of /proc/PID/stat times, is 100 on every Linux architecture Ferry
    // runs on.
    const TICKS: f64 = 100.0;
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return 0.0;
    };
    // After "(comm)": state is field 3, so utime (14), stime (15), cutime (16) and cstime
    // (17) are at 11..=14.
    let f: Vec<f64> = rest
        .split_whitespace()
        .map(|v| v.parse().unwrap_or(0.0))
        .collect();
    let get = |i: usize| f.get(i).copied().unwrap_or(0.0);
    let own = get(11) + get(12);
    let waited = if children { get(13) + get(14) } else { 0.0 };
    (own + waited) / TICKS
}

/// Processes whose command line mentions `needle` (the control plane's directory: etcd,
/// kube-apiserver and the agents).
fn pids_mentioning(needle: &str) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .map(|dir| {
            dir.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
                .filter(|pid| {
                    std::fs::read(format!("/proc/{pid}/cmdline"))
                        .is_ok_and(|c| String::from_utf8_lossy(&c).contains(needle))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// CPU seconds used so far by: node-a's agent (the one that copies a CopyJob), the rest of
/// the local cluster (etcd, kube-apiserver, the operator, node-b's agent), and this
/// process's waited-for children (`ferry-agent copy`, kubectl).
#[derive(Debug, Clone, Copy, Default)]
struct CpuSnapshot {
    agent: f64,
    cluster: f64,
    children: f64,
}

impl std::ops::Sub for CpuSnapshot {
    type Output = Self;
    fn sub(self, o: Self) -> Self {
        Self {
            agent: self.agent - o.agent,
            cluster: self.cluster - o.cluster,
            children: self.children - o.children,
        }
    }
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

/// Throughput of a CopyJob against `ferry-agent copy` on `bench/run.sh`'s 100k-file tree,
/// both on one tmpfs mounted for the purpose at node-a's `/srv/throughput` (a StorageRoot),
/// release builds of the agent and the operator, the same engine options (verify Checksum,
/// the CRD default; a manifest; workers = CPUs). One untimed warmup each, then `runs`
/// alternating pairs. Prints a Markdown section; with `out`, also puts it into that file.
fn bench_throughput(runs: usize, out: Option<&Path>) -> Result<()> {
    // Release builds of ferry-agent and ferry-operator (ferry_e2e::workspace_bin).
    if std::env::var_os("FERRY_E2E_RELEASE").is_none_or(|v| v != "1") {
        std::env::set_var("FERRY_E2E_RELEASE", "1");
    }
    let tools = std::env::var_os("FERRY_TOOLS")
        .map_or_else(|| PathBuf::from("/var/cache/ferry-tools"), PathBuf::from);
    let ftzz = tools.join("cargo/bin/ftzz");
    ensure!(
        ftzz.exists(),
        "{} is missing: run bench/install-tools.sh",
        ftzz.display()
    );
    let (cp, procs, hosts) = bring_up()?;
    let agent = ferry_e2e::workspace_bin("ferry-agent", "ferry-agent")?;
    // bring_up starts the operator, then one agent per node in NODES order.
    let (operator_pid, agent_pid) = (procs[0].id(), procs[1].id());
    let mut cluster_pids = pids_mentioning(&cp.dir().to_string_lossy());
    cluster_pids.retain(|p| *p != agent_pid && *p != std::process::id());
    cluster_pids.push(operator_pid);
    let cpu = || CpuSnapshot {
        agent: cpu_secs(agent_pid, false),
        cluster: cluster_pids.iter().map(|p| cpu_secs(*p, false)).sum(),
        children: cpu_secs(std::process::id(), true) - cpu_secs(std::process::id(), false),
    };
    let root = hosts.join("node-a/srv/throughput");
    // Declared after the control plane and the processes, so unmounted before they stop.
    let tmpfs_options = "size=4G,nr_inodes=1M,mode=0755";
    let _tmpfs = Tmpfs::mount(&root, tmpfs_options)?;
    let src = root.join("src");
    eprintln!("generating the 100k-file tree on the tmpfs (ftzz) ...");
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
    cp.apply("apiVersion: ferry.dev/v1alpha1\nkind: StorageRoot\nmetadata:\n  name: throughput\nspec:\n  path: /srv/throughput\n  nodeSelector: {ferry.dev/node: node-a}\n  namespaces: {names: [default]}\n")?;

    let check = |dst: &Path| -> Result<()> {
        let got = count_tree(dst)?;
        ensure!(
            got == tree,
            "{} holds {got:?}, the source {tree:?}",
            dst.display()
        );
        Ok(())
    };
    let remove = |dst: &Path, manifest: &Path| -> Result<()> {
        std::fs::remove_dir_all(dst)?;
        std::fs::remove_file(manifest)?;
        Ok(())
    };
    // `ferry-agent copy` with the CopyJob's engine options: verify Checksum (the CRD
    // default) and a manifest; workers, reflink, overwrite, preserve at their defaults, as
    // the agent's (`run --workers 0` = CPUs).
    // Also the CPU seconds, during the run, of the copying process and of everything else.
    let cli = |tag: &str| -> Result<(f64, RunCpu, PathBuf, PathBuf)> {
        let dst = root.join(format!("out/cli-{tag}"));
        let manifest = root.join(format!(".ferry/cli-{tag}.xxh128"));
        let before = cpu();
        let start = Instant::now();
        let run = std::process::Command::new(&agent)
            .args([
                "copy",
                "--no-progress",
                "--verify",
                "checksum",
                "--manifest",
            ])
            .arg(&manifest)
            .arg(&src)
            .arg(&dst)
            .output()
            .context("run ferry-agent copy")?;
        let secs = start.elapsed().as_secs_f64();
        let used = cpu() - before;
        ensure!(
            run.status.success(),
            "ferry-agent copy failed: {}",
            String::from_utf8_lossy(&run.stderr)
        );
        check(&dst)?;
        let used = RunCpu {
            copy: used.children,
            cluster: used.agent + used.cluster,
            kubectl: 0.0,
        };
        Ok((secs, used, dst, manifest))
    };
    // A CopyJob at the CRD's defaults: apply -> Succeeded (kubectl wait) wall time, and the
    // agent's own copy time from the shard status (bytesDone / bytesPerSecond).
    let job = |tag: &str| -> Result<(f64, f64, RunCpu, PathBuf, PathBuf)> {
        let name = format!("tput-{tag}");
        let yaml = format!("apiVersion: ferry.dev/v1alpha1\nkind: CopyJob\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  source: {{root: throughput, path: src}}\n  destination: {{root: throughput, path: out/{name}}}\n");
        let before = cpu();
        let start = Instant::now();
        cp.apply(&yaml)?;
        cp.wait_succeeded("default", &name, 120)?;
        let secs = start.elapsed().as_secs_f64();
        let used = cpu() - before;
        let status = cp.kubectl_ok(&[
            "get",
            "copyjob",
            &name,
            "-n",
            "default",
            "-o",
            "jsonpath={.spec.verify} {.status.shards[0].bytesDone} {.status.shards[0].bytesPerSecond}",
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
        cp.kubectl_ok(&[
            "delete",
            "copyjob",
            &name,
            "-n",
            "default",
            "--wait=true",
            "--timeout=120s",
        ])?;
        let dst = root.join(format!("out/{name}"));
        check(&dst)?;
        let manifest = root.join(format!(".ferry/default-{name}.xxh128"));
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
    };

    eprintln!("warmup: one ferry-agent copy and one CopyJob, untimed ...");
    let (_, _, dst, manifest) = cli("warmup")?;
    remove(&dst, &manifest)?;
    let (_, _, _, dst, manifest) = job("warmup")?;
    remove(&dst, &manifest)?;

    // Everything this harness runs, to tell the rest of the machine's load apart.
    let harness = || {
        let c = cpu();
        cpu_secs(std::process::id(), true) + c.agent + c.cluster
    };
    let load_before = loadavg();
    let (machine_before, harness_before) = (machine_busy_secs(), harness());
    let timed = Instant::now();
    let sampler = LoadSampler::start();
    let (mut cli_secs, mut job_secs, mut agent_secs) = (Vec::new(), Vec::new(), Vec::new());
    // CPU seconds during each run, CLI and CopyJob.
    let (mut cli_cpu, mut job_cpu) = (Vec::new(), Vec::new());
    let mut last = Vec::new();
    for i in 0..runs {
        let (secs, used, dst, manifest) = cli(&i.to_string())?;
        eprintln!(
            "run {}/{runs}: ferry-agent copy {secs:.3} s (CPU s: copy {:.2}, cluster {:.2})",
            i + 1,
            used.copy,
            used.cluster
        );
        cli_secs.push(secs);
        cli_cpu.push(used);
        if i + 1 < runs {
            remove(&dst, &manifest)?;
        } else {
            last.push(dst);
        }
        let (secs, agent, used, dst, manifest) = job(&i.to_string())?;
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
            remove(&dst, &manifest)?;
        } else {
            last.push(dst);
        }
    }
    let (samples, busy) = sampler.finish();
    let timed_secs = timed.elapsed().as_secs_f64();
    let others = (machine_busy_secs() - machine_before) - (harness() - harness_before);
    let load_after = loadavg();

    // The last copy of each kind, byte for byte, by the file benchmark's correctness gate.
    let mut checked = Vec::new();
    for dst in &last {
        eprintln!("bench/check.py {} ...", dst.display());
        let report = cp.dir().join("check.json");
        let ok = std::process::Command::new("python3")
            .stdout(std::io::stderr())
            .arg(repo_root().join("bench/check.py"))
            .arg(&src)
            .arg(dst)
            .arg(&report)
            .status()
            .context("run bench/check.py")?;
        ensure!(ok.success(), "bench/check.py failed on {}", dst.display());
        let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&report)?)?;
        ensure!(
            json["ok"] == true,
            "{} differs from the source: {}",
            dst.display(),
            json["errors"]
        );
        checked.push(json["meta_preserved"] == true);
    }

    let (cli_med, job_med, agent_med) = (median(&cli_secs), median(&job_secs), median(&agent_secs));
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
    // The machine's CPU time outside this harness, as a share of what the CPUs could give
    // during the timed runs: more than 5% is a concurrent load worth saying.
    let others_share = others / (timed_secs * nproc as f64);
    let measured = format!("processes other than the benchmark's used {others:.1} CPU-seconds during the {timed_secs:.0} s of timed runs ({:.0}% of the {nproc} CPUs; `/proc/stat` busy time minus the harness's processes), a compiler (rustc, cc1 or ld) was running in {busy} of {samples} samples taken every 250 ms, 1-minute load average {load_before} before the timed runs and {load_after} after", others_share * 100.0);
    let loaded = others_share > 0.05 || busy > 0;
    let load_note = if loaded {
        let what = if busy > 0 {
            "a concurrent build"
        } else {
            "concurrent load"
        };
        format!("**taken with {what}**: {measured}. These numbers are noisier than on an idle machine; re-run `make bench-throughput` on an idle machine for reference figures")
    } else {
        format!("idle apart from the benchmark: {measured}")
    };
    let mut md = String::new();
    use std::fmt::Write as _;
    writeln!(
        md,
        "{THROUGHPUT_HEADING}: a CopyJob against `ferry-agent copy` on the 100k-file tree\n"
    )?;
    writeln!(md, "Generated by `make bench-throughput` on {date}; nproc {nproc} ({cpu}); **release** builds of ferry-agent and ferry-operator (`FERRY_E2E_RELEASE=1`); local etcd + kube-apiserver 1.35.4, the operator and two agents as for the rest of this file. Load: {load_note}.\n")?;
    writeln!(md, "Target: a CopyJob's throughput within 10% of `ferry-agent copy` on the same tree, i.e. CopyJob wall time / CLI wall time <= 1.10.\n")?;
    writeln!(md, "- Tree: `ftzz -e {}`, `bench/run.sh`'s `many` tree: {} files, {} directories, {} bytes, generated for the run on a tmpfs (`{tmpfs_options}`) mounted at node-a's host path `/srv/throughput` (the StorageRoot `throughput`) and unmounted after. Source and every destination are on that tmpfs.", TREE_100K.join(" "), tree.files, tree.dirs, tree.bytes)?;
    writeln!(md, "- CLI: `ferry-agent copy --no-progress --verify checksum --manifest /srv/throughput/.ferry/cli-N.xxh128 SRC DST`, wall time of the process as started by the harness.")?;
    writeln!(md, "- CopyJob: `source: {{root: throughput, path: src}}`, `destination: {{root: throughput, path: out/tput-N}}`, everything else at the CRD defaults, so the agent copies with verify Checksum and writes its manifest to `/srv/throughput/.ferry/`. Wall time from `kubectl apply` to `Succeeded` observed by `kubectl wait` (what a user sees; it includes the two kubectl processes, the operator's reconcile and the agent's watch and status writes). Agent copy time: the shard's `bytesDone / bytesPerSecond`, i.e. from the agent picking up the shard to its final status write.")?;
    writeln!(md, "- Same engine options both ways: verify Checksum, manifest, reflink auto, overwrite never, all metadata kept, workers = CPUs ({nproc}: `copy --workers` and `run --workers` both default to 0 = nproc).")?;
    writeln!(md, "- Protocol: one untimed warmup of each, then {runs} runs alternating CLI and CopyJob (a new job and a new destination each time); the destination, its manifest and the job are removed, untimed, between runs. The page cache needs no dropping on tmpfs.\n")?;
    writeln!(
        md,
        "| measurement | median (s) | min (s) | max (s) | runs |\n|---|---:|---:|---:|---:|"
    )?;
    writeln!(
        md,
        "| `ferry-agent copy`, wall | {cli_med:.3} | {} | {runs} |",
        range(&cli_secs)
    )?;
    writeln!(
        md,
        "| CopyJob, `kubectl apply` -> `Succeeded`, wall | {job_med:.3} | {} | {runs} |",
        range(&job_secs)
    )?;
    writeln!(
        md,
        "| CopyJob, agent copy time (shard status) | {agent_med:.3} | {} | {runs} |\n",
        range(&agent_secs)
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
            "the copy (the `ferry-agent copy` process / node-a's agent)",
            cpu_med(&cli_cpu, |c| c.copy),
            cpu_med(&job_cpu, |c| c.copy),
        ),
        (
            "etcd, kube-apiserver, the operator, the agents not copying",
            cpu_med(&cli_cpu, |c| c.cluster),
            cpu_med(&job_cpu, |c| c.cluster),
        ),
        (
            "kubectl (`apply`, `wait`)",
            cpu_med(&cli_cpu, |c| c.kubectl),
            cpu_med(&job_cpu, |c| c.kubectl),
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
        list(&cli_secs),
        list(&job_secs),
        list(&agent_secs)
    )?;
    writeln!(md, "- Correctness: every destination, CLI and CopyJob, has the source's {} files, {} directories and {} bytes (counted after each run); the last CLI copy and the last CopyJob copy were compared with the source byte for byte by `bench/check.py` (paths, types, sizes, contents): ok; mode, owner and mtimes kept: {}.", tree.files, tree.dirs, tree.bytes, if checked.iter().all(|k| *k) { "yes" } else { "no" })?;
    writeln!(
        md,
        "- Re-run (root; about 3 minutes plus the release builds): `make bench-throughput`."
    )?;
    print!("{md}");
    if let Some(file) = out {
        splice_section(file, &md)?;
        eprintln!("wrote the section into {}", file.display());
    }
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
            bench(arg(2, 20), arg(3, 500))
        }
        Some("bench-throughput") => {
            let runs = std::env::args()
                .nth(2)
                .map_or(Ok(5), |v| v.parse::<usize>())
                .context("bench-throughput RUNS must be a number")?;
            ensure!(runs > 0, "bench-throughput RUNS must be at least 1");
            let out = std::env::args().nth(3).map(PathBuf::from);
            bench_throughput(runs, out.as_deref())
        }
        Some("demo") => demo(),
        Some("up") => up(),
        Some("down") => down(),
        _ => bail!(
            "usage: ferry-dev demo|up|down|bench [SEQUENTIAL [BURST]]|bench-throughput [RUNS [FILE]]"
        ),
    }
}
