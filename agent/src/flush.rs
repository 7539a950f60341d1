//! Group commit for `syncfs`. A shard reports `Succeeded` only once its files are on stable
//! storage, and one `syncfs` per shard is what made a burst of small jobs slow (it forces a
//! journal commit and a device flush each time). Shards finishing together on one
//! filesystem share a flush instead: a flush covers what was written before it started, so
//! a shard that finishes while one runs waits for the next, and all who wait share it.

use std::collections::{HashMap, VecDeque};
use std::sync::{Condvar, Mutex, PoisonError};

/// The flushes of each filesystem (by device number).
#[derive(Debug, Default)]
pub struct Flushes {
    by_dev: Mutex<HashMap<u64, Rounds>>,
    finished: Condvar,
}

#[derive(Debug, Default)]
struct Rounds {
    /// Flushes started, and the last one finished (they run one at a time).
    started: u64,
    finished: u64,
    running: bool,
    /// Recent failed rounds and why (never retried: after a failed writeback the kernel may
    /// have dropped the pages, and a second flush could succeed without them).
    failed: VecDeque<(u64, String)>,
}

impl Flushes {
    /// Return once a flush of device `dev` that started after this call has finished, and
    /// say how it went; `flush` runs it (one caller runs it for all who wait).
    pub fn flush(
        &self,
        dev: u64,
        flush: impl FnOnce() -> std::io::Result<()>,
    ) -> Result<(), String> {
        let mut flush = Some(flush);
        let mut all = self.by_dev.lock().unwrap_or_else(PoisonError::into_inner);
        let ticket = all.entry(dev).or_default().started + 1;
        loop {
            let rounds = all.entry(dev).or_default();
            if rounds.finished >= ticket {
                return match rounds.failed.iter().find(|(round, _)| *round >= ticket) {
                    Some((_, why)) => Err(why.clone()),
                    None => Ok(()),
                };
            }
            // No flush running: run one (at most one per caller: the round it runs
            // started after it arrived, so it returns above when the round is over).
            if !rounds.running {
                if let Some(f) = flush.take() {
                    rounds.running = true;
                    rounds.started += 1;
                    let round = rounds.started;
                    drop(all);
                    let result = f();
                    all = self.by_dev.lock().unwrap_or_else(PoisonError::into_inner);
                    let rounds = all.entry(dev).or_default();
                    rounds.running = false;
                    rounds.finished = round;
                    if let Err(e) = result {
                        rounds.failed.push_back((round, e.to_string()));
                        if rounds.failed.len() > 64 {
                            rounds.failed.pop_front();
                        }
                    }
                    self.finished.notify_all();
                    continue;
                }
            }
            // Someone else's round: wait for it (ours comes after it, if it is not ours).
            all = self
                .finished
                .wait(all)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn shards_finishing_together_share_a_flush_that_started_after_them() {
        let flushes = Arc::new(Flushes::default());
        let runs = Arc::new(AtomicU32::new(0));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let (flushes, runs) = (flushes.clone(), runs.clone());
                std::thread::spawn(move || {
                    flushes.flush(7, || {
                        runs.fetch_add(1, Ordering::SeqCst);
                        std::thread::sleep(Duration::from_millis(200));
                        Ok(())
                    })
                })
            })
            .collect();
        for t in threads {
            assert_eq!(t.join().expect("thread"), Ok(()));
        }
        // The first flush may have started before some callers arrived: they need a
        // second one, which they all share.
        let n = runs.load(Ordering::SeqCst);
        assert!((1..=2).contains(&n), "{n} flushes for 8 callers");
        // Each call needs a flush that starts after it: alone, one of its own.
        flushes.flush(7, || Ok(())).expect("flush");
        assert_eq!(
            flushes.by_dev.lock().expect("lock")[&7].started,
            u64::from(n) + 1
        );
    }

    #[test]
    fn a_failed_flush_fails_everyone_who_waited_for_it_and_is_not_retried() {
        let flushes = Flushes::default();
        let err = flushes.flush(1, || Err(std::io::Error::from_raw_os_error(libc::EIO)));
        assert!(err.is_err_and(|e| e.contains("Input/output error")));
        // The next caller gets a new flush, whose own result counts.
        assert_eq!(flushes.flush(1, || Ok(())), Ok(()));
        // Other filesystems are not affected.
        assert_eq!(flushes.flush(2, || Ok(())), Ok(()));
    }
}
