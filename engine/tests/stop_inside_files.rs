//! A copy stops inside one large file, not only between files: a cancel during an 8 TiB
//! sparse file being hashed, or during a source that never ends (FUSE), is heard within
//! seconds, the file is discarded (never visible, never reported failed), and nothing more
//! is written. A source whose size reads as 0 but never ends is refused after 1 GiB
//! instead of filling the destination.

mod common;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Result};
use common::*;
use ferry_engine::{NoProgress, Options, Reason, Summary, Verify};

/// Whether a file `name` exists in a staging directory (`.ferry-*`) of `parent`: the copy
/// has started on it.
fn staged_in(parent: &Path, name: &str) -> bool {
    std::fs::read_dir(parent).is_ok_and(|entries| {
        entries.flatten().any(|e| {
            e.file_name().to_string_lossy().starts_with(".ferry-") && e.path().join(name).exists()
        })
    })
}

/// Copy `src` to `dst` with `opts` on a thread of its own, cancel it once it is inside the
/// file `name`, and return its summary and how long it took to stop after the cancel. Fails
/// when it never gets to the file, or does not stop within 30 s of the cancel (the thread is
/// then left running: it may run for hours).
fn cancel_inside(
    src: &Path,
    dst: &Path,
    mut opts: Options,
    name: &str,
) -> Result<(Summary, Duration)> {
    let cancel = Arc::new(AtomicBool::new(false));
    opts.cancel = Some(cancel.clone());
    let (s, d): (PathBuf, PathBuf) = (src.into(), dst.into());
    let copy = std::thread::spawn(move || ferry_engine::copy(&s, &d, &opts, &NoProgress));
    let parent = dst.parent().expect("dst has a parent");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !staged_in(parent, name) {
        if copy.is_finished() {
            bail!(
                "the copy ended before it started on {name}: {:?}",
                copy.join()
            );
        }
        ensure!(
            Instant::now() < deadline,
            "the copy never started on {name}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // Well inside it: past its first blocks.
    std::thread::sleep(Duration::from_millis(300));
    cancel.store(true, Ordering::Relaxed);
    let cancelled_at = Instant::now();
    while !copy.is_finished() {
        if cancelled_at.elapsed() > Duration::from_secs(30) {
            bail!("the copy did not stop within 30 s of its cancel: still inside {name}");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let took = cancelled_at.elapsed();
    match copy.join() {
        Ok(summary) => Ok((summary?, took)),
        Err(_) => bail!("the copy panicked"),
    }
}

/// A stopped copy's state: cancelled, nothing failed, `name` nowhere at the destination
/// (neither under its final name nor left in a staging directory's file).
fn check_stopped(s: &Summary, dst: &Path, name: &str) -> Result<()> {
    ensure!(s.cancelled, "not reported cancelled: {s:?}");
    ensure!(
        s.failures.is_empty(),
        "a cut-off file was reported as a failure: {:?}",
        s.failures
    );
    ensure!(
        !dst.join(name).exists(),
        "{name} is visible at the destination"
    );
    Ok(())
}

#[test]
fn a_cancel_stops_a_copy_inside_an_8_tib_sparse_file_being_hashed() -> Result<()> {
    let tmp = tempdir()?;
    let src = tmp.path().join("src");
    mkdir(&src)?;
    write(&src.join("small"), b"copied first or not at all")?;
    // 1 MiB of data, then 8 TiB of hole: its hash covers 8 TiB of zeros.
    let huge = src.join("huge");
    write_pattern_file(&huge, 1 << 20)?;
    std::fs::OpenOptions::new()
        .write(true)
        .open(&huge)?
        .set_len(8 << 40)?;
    let dst = tmp.path().join("dst");
    let opts = Options {
        workers: 2,
        verify: Verify::Checksum,
        ..Options::default()
    };
    let (s, took) = cancel_inside(&src, &dst, opts, "huge")?;
    check_stopped(&s, &dst, "huge")?;
    eprintln!("stopped {took:?} after the cancel");
    Ok(())
}

#[test]
fn a_cancel_stops_a_copy_inside_a_source_that_never_ends() -> Result<()> {
    let tmp = tempdir()?;
    let base = tmp.path().join("base");
    mkdir(&base)?;
    write(&base.join("endless-1"), b"")?;
    let Some(mnt) = FuseMount::eiofs(&base, &tmp.path().join("mnt"))? else {
        return Ok(());
    };
    // Checksum: one worker reads and hashes it; None: chunks across workers.
    for verify in [Verify::Checksum, Verify::None] {
        // A destination that fills in seconds, were the copy to go on.
        let out = tmp.path().join(format!("out-{verify:?}"));
        mkdir(&out)?;
        let _small = Mount::tmpfs(&out, "512M")?;
        let dst = out.join("dst");
        let opts = Options {
            workers: 2,
            verify,
            ..Options::default()
        };
        let (s, took) = cancel_inside(&mnt.dir, &dst, opts, "endless-1")?;
        check_stopped(&s, &dst, "endless-1").map_err(|e| e.context(format!("{verify:?}")))?;
        eprintln!("{verify:?}: stopped {took:?} after the cancel");
    }
    Ok(())
}

#[test]
fn a_source_whose_size_reads_as_zero_but_never_ends_is_refused_after_a_gibibyte() -> Result<()> {
    let tmp = tempdir()?;
    let base = tmp.path().join("base");
    mkdir(&base)?;
    write(&base.join("endless-1"), b"")?;
    write(&base.join("normal"), b"a file that ends")?;
    let Some(mnt) = FuseMount::eiofs_with(&base, &tmp.path().join("mnt"), true)? else {
        return Ok(());
    };
    // Room for the gibibyte it may give, so the copy stops at the limit and not because
    // the destination is full.
    let out = tmp.path().join("out");
    mkdir(&out)?;
    let _room = Mount::tmpfs(&out, "1200M")?;
    let dst = out.join("dst");
    let s = ferry_engine::copy(&mnt.dir, &dst, &Options::default(), &NoProgress)?;
    ensure!(s.failures.len() == 1, "{:?}", s.failures);
    let f = &s.failures[0];
    ensure!(
        f.path == Path::new("endless-1") && f.kind == Reason::IOError,
        "{f:?}"
    );
    ensure!(f.message.contains("never ends"), "unclear message: {f}");
    ensure!(!dst.join("endless-1").exists(), "a partial copy is visible");
    ensure!(std::fs::read(dst.join("normal"))? == b"a file that ends");
    ensure!(staging_leftovers(&dst)?.is_empty());
    Ok(())
}
