//! Files that fail while they are copied: a source that changes under the copy is copied
//! again (three attempts in all, then `SourceChanged`); a source whose reads fail with EIO
//! (a FUSE filesystem, tests/fuse/eiofs.py) is rewritten once from a fresh open, then
//! reported as `IOError`, and so is a file whose flush fails (simulated); a failed
//! `syncfs` fails the copy. Never a partial file under a final name, never a manifest line
//! or a "verified" for a file that was not copied whole.

mod common;

use std::collections::BTreeSet;
use std::path::Path;

use anyhow::{ensure, Result};
use common::*;
use ferry_engine::{NoProgress, Options, Reason, Verify};

fn source_tree(src: &Path) -> Result<()> {
    mkdir(&src.join("sub"))?;
    write(&src.join("a"), b"first file")?;
    write(&src.join("sub/b"), b"second file")?;
    write_pattern_file(&src.join("sub/victim"), 300_000)?;
    Ok(())
}

#[test]
fn a_source_changed_once_while_copied_is_copied_again_with_its_final_content() -> Result<()> {
    for verify in [Verify::None, Verify::Checksum] {
        let tmp = tempdir()?;
        let src = tmp.path().join("src");
        source_tree(&src)?;
        let dst = tmp.path().join("dst");
        let manifest = tmp.path().join("m.xxh128");
        let mut opts = Options {
            verify,
            manifest: (verify != Verify::None).then(|| manifest.clone()),
            ..Options::default()
        };
        opts.faults.change_source = Some((b"victim".to_vec(), 1));
        let s = ferry_engine::copy(&src, &dst, &opts, &NoProgress)?;
        ensure!(s.failures.is_empty(), "{verify:?}: {:?}", s.failures);
        let now = std::fs::read(src.join("sub/victim"))?;
        ensure!(
            now.len() == 300_001,
            "the fault did not change the source once"
        );
        ensure!(
            std::fs::read(dst.join("sub/victim"))? == now,
            "{verify:?}: the copy is not the source's final content"
        );
        ensure!(s.files == 3, "{verify:?}: {s:?}");
        if verify != Verify::None {
            ensure!(s.verified == 3, "{s:?}");
            let lines = manifest_lines(&manifest)?;
            ensure!(
                lines.iter().filter(|l| l.ends_with("  sub/victim")).count() == 1,
                "{lines:?}"
            );
        }
        ensure!(staging_leftovers(&dst)?.is_empty());
    }
    Ok(())
}

#[test]
fn a_source_changing_on_every_attempt_fails_source_changed_after_three_attempts() -> Result<()> {
    for (verify, merge) in [(Verify::None, false), (Verify::Checksum, true)] {
        let tmp = tempdir()?;
        let src = tmp.path().join("src");
        source_tree(&src)?;
        let dst = tmp.path().join("dst");
        if merge {
            mkdir(&dst.join("sub"))?;
        }
        let manifest = tmp.path().join("m.xxh128");
        let mut opts = Options {
            verify,
            manifest: Some(manifest.clone()),
            ..Options::default()
        };
        opts.faults.change_source = Some((b"victim".to_vec(), u32::MAX));
        let s = ferry_engine::copy(&src, &dst, &opts, &NoProgress)?;
        let failed: Vec<_> = s
            .failures
            .iter()
            .map(|f| (f.path.to_string_lossy().into_owned(), f.kind))
            .collect();
        ensure!(
            failed == [("sub/victim".to_string(), Reason::SourceChanged)],
            "{verify:?}: {:?}",
            s.failures
        );
        ensure!(
            s.failures[0].message.contains("3 attempts"),
            "the message does not say how often it was tried: {}",
            s.failures[0]
        );
        // Three attempts, each disturbed once: no more.
        ensure!(std::fs::metadata(src.join("sub/victim"))?.len() == 300_003);
        ensure!(
            dst.join("sub/victim").symlink_metadata().is_err(),
            "something is under the failed file's final name"
        );
        ensure!(std::fs::read(dst.join("a"))? == b"first file");
        ensure!(std::fs::read(dst.join("sub/b"))? == b"second file");
        ensure!(s.files == 2 && s.verified == if verify == Verify::None { 0 } else { 2 });
        ensure!(
            s.aborted.is_none(),
            "one changing file stops nothing: {s:?}"
        );
        let lines = manifest_lines(&manifest)?;
        ensure!(
            lines.len() == 2 && !lines.iter().any(|l| l.contains("victim")),
            "{lines:?}"
        );
        ensure!(staging_leftovers(&dst)?.is_empty());
    }
    Ok(())
}

#[test]
fn a_failed_syncfs_fails_the_copy_with_an_ioerror_for_the_destination() -> Result<()> {
    let tmp = tempdir()?;
    let src = tmp.path().join("src");
    source_tree(&src)?;
    let mut opts = Options {
        sync: true,
        ..unverified()
    };
    let ok = ferry_engine::copy(&src, &tmp.path().join("synced"), &opts, &NoProgress)?;
    ensure!(ok.failures.is_empty() && ok.aborted.is_none(), "{ok:?}");

    opts.faults.syncfs_errno = Some(libc::EIO);
    let s = ferry_engine::copy(&src, &tmp.path().join("dst"), &opts, &NoProgress)?;
    ensure!(s.files == 3, "{s:?}");
    ensure!(
        s.failures.len() == 1
            && s.failures[0].kind == Reason::IOError
            && s.failures[0].op == "syncfs"
            && s.failures[0].path == Path::new("."),
        "{:?}",
        s.failures
    );
    ensure!(
        s.aborted
            .as_deref()
            .is_some_and(|a| a.contains("stable storage")),
        "{s:?}"
    );
    Ok(())
}

#[test]
fn eio_reading_a_source_is_retried_once_then_reported_through_the_engine() -> Result<()> {
    let tmp = tempdir()?;
    let Some((base, mnt)) = eio_source(tmp.path())? else {
        return Ok(());
    };
    // Into an existing directory (files staged unnamed and linked in), without hashing
    // (the kernel's copy paths, not only read/write).
    let dst = tmp.path().join("dst");
    mkdir(&dst)?;
    let opts = Options {
        workers: 2,
        ..unverified()
    };
    let s = ferry_engine::copy(&mnt.dir, &dst, &opts, &NoProgress)?;
    let failed: BTreeSet<_> = s
        .failures
        .iter()
        .map(|f| (f.path.to_string_lossy().into_owned(), f.kind.as_str()))
        .collect();
    let expected: BTreeSet<_> = [
        ("bad-0".to_string(), Reason::IOError.as_str()),
        ("sub/bad-1".to_string(), Reason::IOError.as_str()),
    ]
    .into_iter()
    .collect();
    ensure!(failed == expected, "{:?}", s.failures);
    ensure!(s.files == 11 && s.aborted.is_none(), "{s:?}");
    check_eio_copy(&base, &dst)?;
    drop(mnt);
    Ok(())
}

#[test]
fn a_failed_flush_is_followed_by_one_fresh_rewrite_then_reported_as_ioerror() -> Result<()> {
    for (times, should_fail) in [(1, false), (2, true)] {
        let tmp = tempdir()?;
        let src = tmp.path().join("src");
        source_tree(&src)?;
        let dst = tmp.path().join("dst");
        let manifest = tmp.path().join("m.xxh128");
        let mut opts = Options {
            verify: Verify::Full,
            manifest: Some(manifest.clone()),
            ..Options::default()
        };
        opts.faults.fdatasync_eio = Some((b"victim".to_vec(), times));
        let s = ferry_engine::copy(&src, &dst, &opts, &NoProgress)?;
        let lines = manifest_lines(&manifest)?;
        if should_fail {
            ensure!(
                s.failures.len() == 1
                    && s.failures[0].kind == Reason::IOError
                    && s.failures[0].op == "fdatasync"
                    && s.failures[0].path == Path::new("sub/victim")
                    && s.failures[0].message.contains("again"),
                "{:?}",
                s.failures
            );
            ensure!(dst.join("sub/victim").symlink_metadata().is_err());
            ensure!(
                s.files == 2 && s.verified == 2 && lines.len() == 2,
                "{s:?} {lines:?}"
            );
        } else {
            ensure!(s.failures.is_empty(), "{:?}", s.failures);
            ensure!(
                std::fs::read(dst.join("sub/victim"))? == std::fs::read(src.join("sub/victim"))?
            );
            ensure!(
                s.files == 3 && s.verified == 3 && lines.len() == 3,
                "{s:?} {lines:?}"
            );
        }
        ensure!(staging_leftovers(&dst)?.is_empty());
    }
    Ok(())
}
