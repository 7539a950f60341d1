//! The default worker pool runs every worker only while the copy waits on storage: a copy
//! whose reads all come from memory settles to as many workers as CPUs, the others rest,
//! and everything is still copied. (Its own test binary: the signal is the process's
//! storage reads, which tests running beside it in one process would add to.)

mod common;

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{ensure, Result};
use common::*;
use ferry_engine::Progress;

/// Which worker committed each file, and when.
struct Committers {
    start: Instant,
    seen: Mutex<Vec<(Duration, usize)>>,
}

impl Progress for Committers {
    fn file_done(&self, _size: u64, _took: Duration) {
        let name = std::thread::current()
            .name()
            .unwrap_or_default()
            .to_string();
        let index = name
            .strip_prefix("ferry-copy-")
            .and_then(|i| i.parse().ok())
            .unwrap_or(usize::MAX);
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        seen.push((self.start.elapsed(), index));
    }
}

#[test]
fn a_copy_that_reads_nothing_from_storage_settles_to_one_worker_per_cpu() -> Result<()> {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cpus >= ferry_engine::IO_WORKERS {
        eprintln!("skipped: {cpus} CPUs, the default pool has no more workers than CPUs");
        return Ok(());
    }
    if std::fs::read_to_string("/proc/self/io").is_err() {
        eprintln!("skipped: no /proc/self/io (the pool then keeps every worker running)");
        return Ok(());
    }
    let base = shm_tempdir().map_or_else(tempdir, Ok)?;
    let (src, dst) = (base.path().join("src"), base.path().join("dst"));
    // 150 directories of 4 files. Each file waits 5 ms (the per-file delay hook: a sleep,
    // no storage read), so a task (a directory) takes ~20 ms and the copy over a second.
    mkdir(&src)?;
    for d in 0..150 {
        let dir = src.join(format!("d{d:03}"));
        mkdir(&dir)?;
        for f in 0..4 {
            write(&dir.join(format!("f{f}")), &pattern(d * 10 + f, 300))?;
        }
    }
    let before = snapshot(&src)?;
    let mut opts = unverified();
    assert_eq!(opts.workers, 0, "the default pool");
    opts.faults.delay_per_file = Some(Duration::from_millis(5));
    let progress = Committers {
        start: Instant::now(),
        seen: Mutex::new(Vec::new()),
    };
    let summary = ferry_engine::copy(&src, &dst, &opts, &progress)?;
    ensure!(summary.files == 600 && summary.failed == 0, "{summary:?}");
    compare(&before, &dst, Check::default())?;

    let seen = progress
        .seen
        .into_inner()
        .unwrap_or_else(|e| e.into_inner());
    // Every worker starts (a copy may begin cold); after three 20 ms samples without a
    // read the limit drops, and a worker past it finishes the directory it has (~20 ms).
    let settled = Duration::from_millis(300);
    let mut late: BTreeMap<usize, usize> = BTreeMap::new();
    for &(_, index) in seen.iter().filter(|(at, _)| *at >= settled) {
        *late.entry(index).or_default() += 1;
    }
    let early: std::collections::BTreeSet<usize> = seen
        .iter()
        .filter(|(at, _)| *at < settled)
        .map(|&(_, i)| i)
        .collect();
    let late_files: usize = late.values().sum();
    ensure!(
        late_files >= 100,
        "the copy was over before it settled ({late_files} files after {settled:?}): the test proves nothing"
    );
    ensure!(
        late.keys().all(|&i| i < cpus),
        "after {settled:?} only workers 0..{cpus} should commit files, got files by worker: {late:?}"
    );
    ensure!(
        early.len() > cpus,
        "a copy starts with every worker of the pool; before {settled:?} only {early:?} committed"
    );
    Ok(())
}
