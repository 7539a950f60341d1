//! The source half's workers: a first-in first-out queue of jobs and the threads that run
//! them, as many at once as the depth lets run (see `depth`), each job a request's steps.

use std::io::Write;
use std::sync::{Mutex, PoisonError};

use ferry_transfer::frame::Frame;

use super::half::{lock, Half, Job};
use crate::depth::Depth;

/// The jobs waiting for a worker, first in first out, and whether more may come.
#[derive(Default)]
pub(super) struct Queue {
    jobs: Mutex<(std::collections::VecDeque<Job>, bool)>,
    ready: std::sync::Condvar,
}

impl Queue {
    pub(super) fn push(&self, job: Job) {
        lock(&self.jobs).0.push_back(job);
        self.ready.notify_one();
    }

    /// No more jobs: the workers end once the queue is empty.
    pub(super) fn close(&self) {
        lock(&self.jobs).1 = true;
        self.ready.notify_all();
    }

    pub(super) fn closed(&self) -> bool {
        lock(&self.jobs).1
    }

    /// The next job, waiting for one; `None` once the queue is closed and empty.
    pub(super) fn take(&self) -> Option<Job> {
        let mut jobs = lock(&self.jobs);
        loop {
            if let Some(job) = jobs.0.pop_front() {
                return Some(job);
            }
            if jobs.1 {
                return None;
            }
            jobs = self
                .ready
                .wait(jobs)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }
}

/// One worker: runs jobs while the depth lets it (past the depth it rests, taking none, and
/// looks again), until the queue is closed and empty. An idle worker sleeps on the queue's
/// condition variable: a job wakes one worker, which runs it. (A work-stealing pool spun
/// and yielded between requests, and bounced jobs between workers past the depth: a
/// quarter of the sender's CPU on a warm tree.)
pub(super) fn work<W: Write + Send>(
    half: &Half<'_, W>,
    depth: &Depth,
    queue: &Queue,
    index: usize,
) {
    loop {
        if !depth.runs(index) {
            if queue.closed() {
                return;
            }
            depth.rest(index);
            continue;
        }
        let Some(job) = queue.take() else {
            return;
        };
        let run = std::panic::AssertUnwindSafe(|| half.run(job));
        if std::panic::catch_unwind(run).is_err() {
            // The receiver must not wait for an answer that never comes.
            half.send(&Frame::Abort {
                reason: "the source half failed (an internal error)".into(),
            });
        }
    }
}
