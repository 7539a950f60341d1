//! The seam between the engine and whoever watches it (a terminal bar, Prometheus).
//!
//! Called from worker threads, so implementations must be cheap and thread-safe: counters
//! and atomics, no locks held across I/O. Per-file calls, but never per system call.

use std::time::Duration;

use crate::error::Failure;

/// How a file's bytes reached the destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Strategy {
    /// Extents shared with `FICLONE` (or cloned by `copy_file_range` on a CoW filesystem).
    Reflink,
    /// In-kernel `copy_file_range`.
    CopyFileRange,
    /// `pread`/`pwrite` through a user-space buffer (the path that can hash the bytes).
    ReadWrite,
}

impl Strategy {
    pub const ALL: [Strategy; 3] = [
        Strategy::Reflink,
        Strategy::CopyFileRange,
        Strategy::ReadWrite,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Strategy::Reflink => "reflink",
            Strategy::CopyFileRange => "copy_file_range",
            Strategy::ReadWrite => "read_write",
        }
    }
}

/// Receives the copy's events. Every method has an empty default.
pub trait Progress: Sync {
    /// `bytes` of file data reached the destination by `strategy` (a whole small file, or
    /// one chunk of a large one).
    fn bytes_copied(&self, _bytes: u64, _strategy: Strategy) {}
    /// One entry (file, directory, link, special file) is complete under its final name.
    fn entry_done(&self) {}
    /// A regular file of `size` bytes (apparent size) is committed under its final name
    /// (also reported as an entry). Extra names of hard-linked files are entries only.
    /// `took`: from opening its source to its commit (chunk workers included for a large
    /// file; the test-only per-file delay excluded).
    fn file_done(&self, _size: u64, _took: Duration) {}
    /// `bytes` of a file's destination were read back and matched the source's hash
    /// (before its commit; `verify: checksum` or `full`).
    fn bytes_verified(&self, _bytes: u64) {}
    /// A check (`check_beneath`) read a file of `size` bytes and it matched its manifest.
    fn file_checked(&self, _size: u64) {}
    /// One entry was left as the destination has it: the overwrite policy keeps it (or a
    /// resumed run finds it committed by the run before). Counted in `Summary::skipped`.
    fn skipped(&self) {}
    /// A resumed copy found a regular file of `size` bytes committed by an earlier attempt
    /// (listed in the manifest, or verified equal to its source; without a manifest, any
    /// file it keeps). Also reported as [`Progress::skipped`]. Files done in all attempts are
    /// the `file_done` calls plus these.
    fn resumed(&self, _size: u64) {}
    /// One entry failed; the copy goes on.
    fn failed(&self, _failure: &Failure) {}
    /// A file from another node arrived changed (its bytes did not hash as the sender
    /// read them) and is asked for once more.
    fn resent(&self) {}
}

/// A [`Progress`] that ignores everything.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoProgress;

impl Progress for NoProgress {}
