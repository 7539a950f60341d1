//! What a run is measured by besides its wall time: the bytes on the wire each way
//! ([`Wire`]: iptables counters on the servers' ports, every packet of loopback passing
//! OUTPUT once) and the peak RSS of each side's processes ([`Peaks`]).

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{ensure, Context, Result};

use crate::machine::{proc_status_kib, reset_peak_rss};

/// The iptables chain of the counters, jumped to from OUTPUT and removed when dropped.
const CHAIN: &str = "FERRY-BENCH-WIRE";

/// Counters of the bytes sent from and to each server port.
pub(super) struct Wire {
    ports: Vec<u16>,
}

fn iptables(args: &[&str]) -> Result<String> {
    let out = Command::new("iptables")
        .arg("-w")
        .args(args)
        .output()
        .context("run iptables")?;
    ensure!(
        out.status.success(),
        "iptables {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

impl Wire {
    /// A chain with two counting rules a port: from it (the server's answers and data) and
    /// to it (what clients send). RETURN: they count and decide nothing.
    pub(super) fn start(ports: &[u16]) -> Result<Self> {
        // A chain left by a run that was killed goes first.
        let _ = iptables(&["-D", "OUTPUT", "-j", CHAIN]);
        let _ = iptables(&["-F", CHAIN]);
        let _ = iptables(&["-X", CHAIN]);
        iptables(&["-N", CHAIN])?;
        let wire = Self {
            ports: ports.to_vec(),
        };
        iptables(&["-I", "OUTPUT", "-j", CHAIN])?;
        for p in ports {
            let p = p.to_string();
            for way in ["--sport", "--dport"] {
                iptables(&["-A", CHAIN, "-p", "tcp", way, &p, "-j", "RETURN"])?;
            }
        }
        Ok(wire)
    }

    /// Counters to zero, before a run.
    pub(super) fn zero(&self) -> Result<()> {
        iptables(&["-Z", CHAIN]).map(drop)
    }

    /// The bytes (IP packets, headers included) sent from `port` and to it since the last
    /// [`Self::zero`].
    pub(super) fn bytes(&self, port: u16) -> Result<[u64; 2]> {
        ensure!(self.ports.contains(&port), "port {port} is not counted");
        let text = iptables(&["-L", CHAIN, "-v", "-x", "-n"])?;
        let mut got = [None, None];
        for line in text.lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            let Some(bytes) = f.get(1).and_then(|b| b.parse::<u64>().ok()) else {
                continue;
            };
            if f.contains(&format!("spt:{port}").as_str()) {
                got[0] = Some(bytes);
            } else if f.contains(&format!("dpt:{port}").as_str()) {
                got[1] = Some(bytes);
            }
        }
        match got {
            [Some(from), Some(to)] => Ok([from, to]),
            _ => anyhow::bail!("no counters for port {port} in:\n{text}"),
        }
    }
}

impl Drop for Wire {
    fn drop(&mut self) {
        let _ = iptables(&["-D", "OUTPUT", "-j", CHAIN]);
        let _ = iptables(&["-F", CHAIN]);
        let _ = iptables(&["-X", CHAIN]);
    }
}

/// The peak RSS of two sides' processes over a run: each side is some processes and all
/// their descendants (a daemon's forks for each connection, a client's helpers), looked up
/// every 20 ms. A side's peak is the sum of its processes' peaks (`VmHWM`, each read while
/// it lives; those that ran before the run had theirs reset first): an upper bound of what
/// the side held at once, and exactly the peak where a side is one process (an agent).
pub(super) struct Peaks {
    roots: Arc<Mutex<[Vec<u32>; 2]>>,
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<[BTreeMap<u32, u64>; 2]>,
}

/// Every process's parent.
fn parents() -> Vec<(u32, u32)> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let ppid = stat
                .rsplit_once(')')?
                .1
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()?;
            Some((pid, ppid))
        })
        .collect()
}

/// `roots` and their descendants.
fn tree_of(roots: &[u32], parents: &[(u32, u32)]) -> BTreeSet<u32> {
    let mut all: BTreeSet<u32> = roots.iter().copied().collect();
    loop {
        let before = all.len();
        for (pid, ppid) in parents {
            if all.contains(ppid) {
                all.insert(*pid);
            }
        }
        if all.len() == before {
            return all;
        }
    }
}

impl Peaks {
    /// Start watching `sides` (the sending side's processes, the receiving side's), their
    /// peaks reset to what they hold now.
    pub(super) fn start(sides: [Vec<u32>; 2]) -> Result<Self> {
        for pid in sides.iter().flatten() {
            reset_peak_rss(*pid)?;
        }
        let roots = Arc::new(Mutex::new(sides));
        let stop = Arc::new(AtomicBool::new(false));
        let (r, flag) = (roots.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let mut peaks: [BTreeMap<u32, u64>; 2] = Default::default();
            loop {
                let stopping = flag.load(Ordering::Relaxed);
                let parents = parents();
                let sides = r.lock().map(|s| s.clone()).unwrap_or_default();
                for (side, roots) in sides.iter().enumerate() {
                    for pid in tree_of(roots, &parents) {
                        let kib = proc_status_kib(pid, "VmHWM");
                        let peak = peaks[side].entry(pid).or_default();
                        *peak = (*peak).max(kib);
                    }
                }
                if stopping {
                    return peaks;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        Ok(Self {
            roots,
            stop,
            thread,
        })
    }

    /// A process started for the run (a client) joins side `side`.
    pub(super) fn add(&self, side: usize, pid: u32) {
        if let Ok(mut r) = self.roots.lock() {
            r[side].push(pid);
        }
    }

    /// Each side's peak, KiB.
    pub(super) fn finish(self) -> [u64; 2] {
        self.stop.store(true, Ordering::Relaxed);
        let peaks = self.thread.join().unwrap_or_default();
        [0, 1].map(|side| peaks[side].values().sum())
    }
}
