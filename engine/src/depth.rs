//! How many of the pool's workers copy at once: all of them while the copy waits on storage,
//! as many as there are CPUs while everything it reads is in memory. Asked by a local copy's
//! pool (`copy`) and by the source half's workers (`send`) alike.
//!
//! The pool is large (16 workers by default) because a worker blocks in every read of data
//! that is not cached, and a cold copy needs many reads in flight to keep a disk busy. When
//! nothing waits on the disk the extra workers only contend: on XFS, 16 workers creating
//! files sleep on their allocation group's inode-btree lock (`xfs_read_agi` under
//! `xfs_create`), and a warm copy of 100k files took 3.1 s against 2.0 s with 2 workers.
//! A counting gate that admitted 2 of the 16 per file (or per task) recovered only part of
//! that (2.2-2.4 s): every admission handed the slot to another sleeping thread. So the
//! workers that run are the first `limit` of the pool, by index; a worker past the limit
//! hands the task it picked up back to the pool (a running worker steals it) and rests an
//! interval. Running workers never wait here, and the limit takes effect between tasks
//! (a directory, or a batch of a large one's entries).
//!
//! The signal is the process's storage reads (`read_bytes` of `/proc/self/io`, counted by
//! the kernel when a read is submitted to a block device, data and metadata alike, in the
//! task that waits for it), sampled every [`INTERVAL`]: reads in the last interval mean the
//! copy waits on the disk and every worker runs; [`WARM_SAMPLES`] intervals without mean
//! it reads from the page cache and as many workers as CPUs run. A copy starts with all.
//! Filesystems whose reads that counter does not see (NFS, FUSE, anything not in
//! [`COUNTED`]) keep every worker running, as do a kernel without the counter and a worker
//! count the caller chose. The counter is the process's: in the agent, a shard that
//! reads from the disk keeps the others' workers running too.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// How often the storage reads are sampled, and the longest a resting worker waits.
const INTERVAL: Duration = Duration::from_millis(20);

/// Bytes read from storage in one interval that make it a cold one (a warm copy reads
/// none; a cold small-file copy from this machine's disk reads about 6 MB per interval).
const COLD_BYTES: u64 = 128 << 10;

/// Warm intervals in a row before the workers beyond the CPUs rest: one cold interval
/// wakes them all at once (resting while the disk waits is the costlier mistake).
const WARM_SAMPLES: u32 = 3;

/// Filesystem magics (`statfs.f_type`) whose reads go through the block layer in the
/// reading task (or that have no storage), so `read_bytes` sees every wait on storage.
const COUNTED: [i64; 7] = [
    0xEF53,      // ext2/3/4
    0x5846_5342, // xfs
    0x9123_683E, // btrfs
    0xF2F5_2010, // f2fs
    0x0102_1994, // tmpfs
    0x8584_58F6, // ramfs
    0x794C_7630, // overlayfs: its reads pass to the layers below, in the same task
];

/// Which of a copy's pool workers run.
pub(crate) struct Depth {
    /// Unset when every worker always runs.
    adapt: Option<Adapt>,
}

struct Adapt {
    /// Workers in the pool: the limit while the copy waits on storage.
    pool: usize,
    /// The limit while it does not.
    cpus: usize,
    limit: AtomicUsize,
    /// Taken to raise the limit and to rest, so a rest never misses a raise.
    lock: Mutex<()>,
    raised: Condvar,
    /// `/proc/self/io`, read at offset 0 for every sample.
    io: File,
    start: Instant,
    /// When the next sample is due, in ns since `start`.
    next: AtomicU64,
    last_read: AtomicU64,
    /// Warm samples in a row.
    warm: AtomicU32,
}

impl std::fmt::Debug for Depth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let limit = self.adapt.as_ref().map(|a| a.limit.load(SeqCst));
        f.debug_struct("Depth").field("limit", &limit).finish()
    }
}

impl Depth {
    /// Every worker always runs.
    pub(crate) fn fixed() -> Self {
        Self { adapt: None }
    }

    /// A pool of `pool` workers copying between filesystems `fs` (source's and
    /// destination's `f_type`): every one runs while the copy waits on storage, as many as
    /// the machine has CPUs while it does not.
    pub(crate) fn adaptive(pool: usize, fs: &[i64]) -> Self {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        Self::with(pool, cpus, fs, File::open("/proc/self/io").ok())
    }

    fn with(pool: usize, cpus: usize, fs: &[i64], io: Option<File>) -> Self {
        if pool <= cpus || !fs.iter().all(|t| COUNTED.contains(t)) {
            return Self::fixed();
        }
        let Some((io, read)) = io.and_then(|f| read_bytes(&f).map(|r| (f, r))) else {
            return Self::fixed();
        };
        Self {
            adapt: Some(Adapt {
                pool,
                cpus,
                limit: AtomicUsize::new(pool),
                lock: Mutex::new(()),
                raised: Condvar::new(),
                io,
                start: Instant::now(),
                next: AtomicU64::new(INTERVAL.as_nanos() as u64),
                last_read: AtomicU64::new(read),
                warm: AtomicU32::new(0),
            }),
        }
    }

    /// Whether pool worker `index` runs the task it picked up. When not, it hands the task
    /// back to the pool and calls [`Depth::rest`].
    pub(crate) fn runs(&self, index: usize) -> bool {
        match &self.adapt {
            None => true,
            Some(a) => {
                a.sample();
                index < a.limit.load(SeqCst)
            }
        }
    }

    /// A worker past the limit waits until the limit is raised, at most an interval (then
    /// it looks at the pool again, and samples: reads may have begun while every running
    /// worker waits on them).
    pub(crate) fn rest(&self, index: usize) {
        if let Some(a) = &self.adapt {
            let guard = a.lock.lock().unwrap_or_else(PoisonError::into_inner);
            if index >= a.limit.load(SeqCst) {
                let _ = a
                    .raised
                    .wait_timeout(guard, INTERVAL)
                    .unwrap_or_else(PoisonError::into_inner);
            }
        }
    }

    /// Between two entries of a task: take a sample when one is due.
    pub(super) fn between(&self) {
        if let Some(a) = &self.adapt {
            a.sample();
        }
    }
}

impl Adapt {
    /// Take a sample if one is due (one worker takes it; the others go on).
    fn sample(&self) {
        let now = self.start.elapsed().as_nanos() as u64;
        let due = self.next.load(SeqCst);
        let next = now + INTERVAL.as_nanos() as u64;
        if now < due
            || self
                .next
                .compare_exchange(due, next, SeqCst, SeqCst)
                .is_err()
        {
            return;
        }
        if let Some(read) = read_bytes(&self.io) {
            self.observe(read);
        }
    }

    /// Set the limit from the counter's value at a sample.
    fn observe(&self, read: u64) {
        let delta = read.saturating_sub(self.last_read.swap(read, SeqCst));
        if delta >= COLD_BYTES {
            self.warm.store(0, SeqCst);
            if self.limit.load(SeqCst) != self.pool {
                let _guard = self.lock.lock().unwrap_or_else(PoisonError::into_inner);
                self.limit.store(self.pool, SeqCst);
                self.raised.notify_all();
            }
        } else if self.warm.fetch_add(1, SeqCst) + 1 >= WARM_SAMPLES {
            self.limit.store(self.cpus, SeqCst);
        }
    }
}

/// `read_bytes` of a `/proc/<pid>/io` file.
fn read_bytes(io: &File) -> Option<u64> {
    let mut buf = [0u8; 512];
    let n = io.read_at(&mut buf, 0).ok()?;
    let text = std::str::from_utf8(&buf[..n]).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("read_bytes:"))
        .and_then(|v| v.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXT4: i64 = 0xEF53;
    const NFS: i64 = 0x6969;

    fn io() -> Option<File> {
        File::open("/proc/self/io").ok()
    }

    /// The adaptive state, or None (the test then skips) on a kernel without the counter.
    fn adapt(d: &Depth) -> Option<&Adapt> {
        if d.adapt.is_none() {
            eprintln!("skipped: no /proc/self/io to sample");
        }
        d.adapt.as_ref()
    }

    fn running(d: &Depth, pool: usize) -> usize {
        (0..pool).filter(|&i| index_runs(d, i)).count()
    }

    /// `runs` without sampling (the tests feed the samples).
    fn index_runs(d: &Depth, i: usize) -> bool {
        d.adapt.as_ref().is_none_or(|a| i < a.limit.load(SeqCst))
    }

    #[test]
    fn the_counter_is_read_from_proc() {
        let Some(f) = io() else {
            eprintln!("skipped: no /proc/self/io (a kernel without CONFIG_TASK_IO_ACCOUNTING)");
            return;
        };
        assert!(
            read_bytes(&f).is_some(),
            "no read_bytes line in /proc/self/io"
        );
    }

    #[test]
    fn starts_with_every_worker_then_cpus_after_warm_samples() {
        let d = Depth::with(16, 2, &[EXT4, EXT4], io());
        let Some(a) = adapt(&d) else { return };
        let base = a.last_read.load(SeqCst);
        assert_eq!(running(&d, 16), 16, "a copy starts with every worker");
        a.observe(base);
        a.observe(base + 1000);
        assert_eq!(running(&d, 16), 16, "two warm samples are not yet enough");
        a.observe(base + 2000);
        assert_eq!(
            running(&d, 16),
            2,
            "three warm samples in a row: CPUs workers"
        );
        assert!(index_runs(&d, 0) && index_runs(&d, 1) && !index_runs(&d, 2));
    }

    #[test]
    fn one_cold_sample_runs_every_worker_again() {
        let d = Depth::with(16, 2, &[EXT4, EXT4], io());
        let Some(a) = adapt(&d) else { return };
        let base = a.last_read.load(SeqCst);
        for _ in 0..WARM_SAMPLES {
            a.observe(base);
        }
        assert_eq!(running(&d, 16), 2);
        a.observe(base + COLD_BYTES);
        assert_eq!(running(&d, 16), 16, "reads from storage: every worker");
        // And the warm streak starts over.
        a.observe(base + COLD_BYTES);
        a.observe(base + COLD_BYTES);
        assert_eq!(running(&d, 16), 16);
        a.observe(base + COLD_BYTES);
        assert_eq!(running(&d, 16), 2);
    }

    #[test]
    fn a_resting_worker_wakes_when_the_limit_is_raised() {
        let d = Depth::with(16, 2, &[EXT4, EXT4], io());
        let Some(a) = adapt(&d) else { return };
        let base = a.last_read.load(SeqCst);
        for _ in 0..WARM_SAMPLES {
            a.observe(base);
        }
        std::thread::scope(|s| {
            let rested = s.spawn(|| {
                let t = Instant::now();
                while !index_runs(&d, 9) {
                    d.rest(9);
                }
                t.elapsed()
            });
            std::thread::sleep(Duration::from_millis(5));
            a.observe(base + COLD_BYTES);
            let waited = rested.join().expect("rest");
            assert!(waited < Duration::from_secs(5), "rested {waited:?}");
        });
    }

    #[test]
    fn every_worker_runs_where_the_counter_cannot_tell() {
        let cases = [
            (Depth::with(16, 2, &[EXT4, NFS], io()), "NFS destination"),
            (Depth::with(16, 2, &[NFS, EXT4], io()), "NFS source"),
            (
                Depth::with(16, 16, &[EXT4, EXT4], io()),
                "no more workers than CPUs",
            ),
            (Depth::with(16, 2, &[EXT4, EXT4], None), "no /proc/self/io"),
        ];
        for (d, why) in cases {
            assert!(d.adapt.is_none(), "{why}: adaptive");
            assert!((0..16).all(|i| d.runs(i)), "{why}: a worker rests");
        }
    }
}
