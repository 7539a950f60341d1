//! The progress seam reports what the agent's metrics count: each committed file with its
//! size and copy time, the bytes that verification read back, the entries a merge kept,
//! and failures with their kind; and it agrees with the summary.

use std::fs;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use ferry_engine::{copy, Failure, Faults, Options, Progress, Reason, Strategy, Verify};

#[derive(Default)]
struct Recorder {
    files: AtomicU64,
    file_bytes: AtomicU64,
    moved: AtomicU64,
    verified: AtomicU64,
    skipped: AtomicU64,
    times: Mutex<Vec<Duration>>,
    failures: Mutex<Vec<Reason>>,
}

impl Progress for Recorder {
    fn bytes_copied(&self, bytes: u64, _strategy: Strategy) {
        self.moved.fetch_add(bytes, Ordering::Relaxed);
    }
    fn file_done(&self, size: u64, took: Duration) {
        self.files.fetch_add(1, Ordering::Relaxed);
        self.file_bytes.fetch_add(size, Ordering::Relaxed);
        self.times
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(took);
    }
    fn bytes_verified(&self, bytes: u64) {
        self.verified.fetch_add(bytes, Ordering::Relaxed);
    }
    fn skipped(&self) {
        self.skipped.fetch_add(1, Ordering::Relaxed);
    }
    fn failed(&self, failure: &Failure) {
        self.failures
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(failure.kind);
    }
}

/// 3 directories of 40 files (sizes 0 to ~60 KiB) and a symlink. Returns the data bytes.
fn tree(root: &Path) -> std::io::Result<u64> {
    let mut bytes = 0;
    for d in 0..3u64 {
        let dir = root.join(format!("d{d}"));
        fs::create_dir_all(&dir)?;
        for f in 0..40u64 {
            let len = (d * 7919 + f * 1543) % 61_000;
            let body: Vec<u8> = (0..len).map(|i| (i ^ f) as u8).collect();
            fs::write(dir.join(format!("f{f:02}")), body)?;
            bytes += len;
        }
    }
    std::os::unix::fs::symlink("d0/f01", root.join("link"))?;
    Ok(bytes)
}

fn options(verify: Verify) -> Options {
    Options {
        verify,
        workers: 2,
        ..Options::default()
    }
}

#[test]
fn every_committed_file_reports_its_size_and_copy_time_and_verified_bytes_add_up() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let src = tmp.path().join("src");
    let bytes = tree(&src).expect("build tree");
    let progress = Recorder::default();
    let s = copy(
        &src,
        &tmp.path().join("dst"),
        &options(Verify::Checksum),
        &progress,
    )
    .expect("copy starts");
    assert_eq!(s.failed, 0, "{:?}", s.failures);
    assert_eq!(progress.files.load(Ordering::Relaxed), 120);
    assert_eq!(progress.files.load(Ordering::Relaxed), s.files);
    assert_eq!(progress.file_bytes.load(Ordering::Relaxed), bytes);
    assert_eq!(progress.moved.load(Ordering::Relaxed), bytes);
    // Checksum verification read every destination byte back.
    assert_eq!(progress.verified.load(Ordering::Relaxed), bytes);
    assert_eq!(s.verified, 120);
    assert_eq!(progress.skipped.load(Ordering::Relaxed), 0);
    let times = progress
        .times
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    assert_eq!(times.len(), 120);
    assert!(
        times.iter().all(|t| *t > Duration::ZERO && *t < s.elapsed),
        "a file's copy time lies within the copy: {times:?} (copy {:?})",
        s.elapsed
    );
}

#[test]
fn without_verification_no_bytes_are_reported_verified() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let src = tmp.path().join("src");
    tree(&src).expect("build tree");
    let progress = Recorder::default();
    let s = copy(
        &src,
        &tmp.path().join("dst"),
        &options(Verify::None),
        &progress,
    )
    .expect("copy starts");
    assert_eq!(s.failed, 0, "{:?}", s.failures);
    assert_eq!(progress.files.load(Ordering::Relaxed), 120);
    assert_eq!(progress.verified.load(Ordering::Relaxed), 0);
}

#[test]
fn a_merge_that_keeps_every_entry_reports_them_skipped_and_no_file_done() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (src, dst) = (tmp.path().join("src"), tmp.path().join("dst"));
    tree(&src).expect("build tree");
    copy(&src, &dst, &options(Verify::None), &Recorder::default()).expect("first copy");
    let progress = Recorder::default();
    // Overwrite::Never (the default): everything is already there and kept.
    let s = copy(&src, &dst, &options(Verify::None), &progress).expect("second copy");
    assert_eq!(s.failed, 0, "{:?}", s.failures);
    assert_eq!(progress.files.load(Ordering::Relaxed), 0);
    // 120 files and the symlink; directories are merged into, not skipped.
    assert_eq!(progress.skipped.load(Ordering::Relaxed), 121);
    assert_eq!(progress.skipped.load(Ordering::Relaxed), s.skipped);
}

#[test]
fn a_checksum_mismatch_is_reported_as_such_and_the_file_is_not_reported_done() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let src = tmp.path().join("src");
    tree(&src).expect("build tree");
    let progress = Recorder::default();
    let opts = Options {
        faults: Faults {
            corrupt_after_write: Some(b"f07".to_vec()),
            ..Faults::default()
        },
        ..options(Verify::Checksum)
    };
    let s = copy(&src, &tmp.path().join("dst"), &opts, &progress).expect("copy starts");
    // f07 in each of the 3 directories.
    assert_eq!(s.failed, 3, "{:?}", s.failures);
    let failures = progress
        .failures
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    assert_eq!(failures, vec![Reason::ChecksumMismatch; 3]);
    assert_eq!(progress.files.load(Ordering::Relaxed), 117);
}
