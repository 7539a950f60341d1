//! The memory benchmark: both agents' peak RSS over a CopyJob from node-a to node-b of a
//! tree of tiny files (a million by default), their peaks reset just before it and sampled
//! meanwhile ([`RssSampler`]).

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;

use super::{Memory, Net, Tool, MEMORY_JOB_TIMEOUT, PER_DIR};
use crate::machine::{count_tree, proc_status_kib, reset_peak_rss};
use crate::throughput::check_copy;

impl Net {
    /// Both agents' peak RSS over a cross-node CopyJob of `files` tiny files.
    pub(super) fn memory(&self, files: u64) -> Result<Memory> {
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
            reset_peak_rss(p)?;
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
