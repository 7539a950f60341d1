//! What the benchmarks measure the machine with: a tmpfs of their own, tree counts,
//! medians, CPU seconds per process from `/proc`, and whether something else (a compiler)
//! was running, so a report can say how far to trust its numbers.

use std::path::Path;
use std::time::Duration;

use anyhow::{ensure, Context, Result};

/// The benchmark's own tmpfs (unmounted when dropped, also on error).
pub(crate) use ferry_e2e::Tmpfs;

/// What a tree holds, below its top directory.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TreeCount {
    pub(crate) files: u64,
    pub(crate) dirs: u64,
    pub(crate) other: u64,
    pub(crate) bytes: u64,
}

/// Count the entries of a tree (without following symlinks) and the bytes of its files.
pub(crate) fn count_tree(root: &Path) -> Result<TreeCount> {
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
pub(crate) fn median(values: &[f64]) -> f64 {
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

/// The mean and the sample standard deviation (n - 1, as hyperfine reports it) of the
/// finite values; NaN for what cannot be had (no values; one value's deviation).
pub(crate) fn mean_sd(values: &[f64]) -> (f64, f64) {
    let v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    let n = v.len() as f64;
    if v.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    let mean = v.iter().sum::<f64>() / n;
    if v.len() < 2 {
        return (mean, f64::NAN);
    }
    let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
    (mean, var.sqrt())
}

/// Is a compiler (a concurrent build) running on this machine now?
pub(crate) fn compiler_running() -> bool {
    const COMPILERS: [&str; 6] = ["rustc", "clippy-driver", "cc1", "cc1plus", "ld", "ld.lld"];
    std::fs::read_dir("/proc").is_ok_and(|dir| {
        dir.flatten().any(|e| {
            std::fs::read_to_string(e.path().join("comm"))
                .is_ok_and(|c| COMPILERS.contains(&c.trim()))
        })
    })
}

/// Samples, every 250 ms until stopped, whether a compiler runs: (samples, with a compiler).
pub(crate) struct LoadSampler {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<(u32, u32)>,
}

impl LoadSampler {
    pub(crate) fn start() -> Self {
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

    pub(crate) fn finish(self) -> (u32, u32) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.join().unwrap_or((0, 0))
    }
}

pub(crate) fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "?".into())
}

/// CPU seconds all CPUs of this machine have spent busy (not idle, iowait or stolen) since
/// boot, from the `cpu` line of `/proc/stat`.
pub(crate) fn machine_busy_secs() -> f64 {
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
pub(crate) struct RunCpu {
    pub(crate) copy: f64,
    pub(crate) cluster: f64,
    pub(crate) kubectl: f64,
}

pub(crate) fn shell_line(cmd: &str) -> String {
    std::process::Command::new("sh")
        .args(["-c", cmd])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

/// CPU seconds (user + system) process `pid` has used; with `children`, plus those of its
/// children it has waited for. 0 when it is gone.
/// A `kB` line of `/proc/PID/status` (VmRSS, VmHWM), in KiB; 0 when unreadable.
pub(crate) fn proc_status_kib(pid: u32, key: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

/// Reset process `pid`'s peak RSS to what it holds now (`echo 5 > /proc/PID/clear_refs`),
/// so that its `VmHWM` afterwards is the peak of what follows.
pub(crate) fn reset_peak_rss(pid: u32) -> Result<()> {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5")
        .with_context(|| format!("reset the peak RSS of process {pid} (clear_refs 5)"))
}

pub(crate) fn cpu_secs(pid: u32, children: bool) -> f64 {
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
pub(crate) fn pids_mentioning(needle: &str) -> Vec<u32> {
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
pub(crate) struct CpuSnapshot {
    pub(crate) agent: f64,
    pub(crate) cluster: f64,
    pub(crate) children: f64,
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

/// `sync`, then `echo <what> > /proc/sys/vm/drop_caches` (root): 1 the clean page cache, 3
/// with dentries and inodes too.
pub(crate) fn drop_caches(what: &str) -> Result<()> {
    let synced = std::process::Command::new("sync")
        .status()
        .context("run sync")?;
    ensure!(synced.success(), "sync failed");
    std::fs::write("/proc/sys/vm/drop_caches", what).context("drop the page cache (root needed)")
}
