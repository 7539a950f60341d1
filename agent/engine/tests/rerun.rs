//! Re-runs into a destination that has the tree already (`overwrite: IfChanged`): an
//! unchanged tree copies nothing; a changed file is copied; with `compare: Checksum` a change
//! that kept size and mtime is found by its bytes, and a file found equal is kept, listed in
//! the manifest and given the source's metadata.

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};

use anyhow::{ensure, Result};
use common::*;
use ferry_engine::{Compare, NoProgress, Options, Overwrite, Verify};

fn rerun(compare: Compare, manifest: Option<std::path::PathBuf>) -> Options {
    Options {
        overwrite: Overwrite::IfChanged,
        compare,
        verify: Verify::Checksum,
        manifest,
        ..Options::default()
    }
}

#[test]
fn an_unchanged_tree_copies_nothing_and_a_changed_file_is_copied() -> Result<()> {
    let tmp = tempdir()?;
    let (src, dst) = (tmp.path().join("src"), tmp.path().join("dst"));
    for d in 0..5 {
        mkdir(&src.join(format!("d{d}")))?;
        for f in 0..20 {
            write(
                &src.join(format!("d{d}/f{f}")),
                format!("{d}/{f}").as_bytes(),
            )?;
        }
    }
    let first = ferry_engine::copy(&src, &dst, &Options::default(), &NoProgress)?;
    ensure!(first.files == 100, "{first:?}");
    let again = ferry_engine::copy(&src, &dst, &rerun(Compare::SizeAndTime, None), &NoProgress)?;
    ensure!(again.files == 0 && again.skipped == 100, "{again:?}");
    // One file changed (new size, new mtime): that one is copied.
    write(&src.join("d3/f7"), b"changed, and longer")?;
    let third = ferry_engine::copy(&src, &dst, &rerun(Compare::SizeAndTime, None), &NoProgress)?;
    ensure!(third.files == 1 && third.skipped == 99, "{third:?}");
    ensure!(std::fs::read(dst.join("d3/f7"))? == b"changed, and longer");
    Ok(())
}

#[test]
fn compare_checksum_finds_a_change_that_kept_size_and_mtime_and_lists_equal_files() -> Result<()> {
    let tmp = tempdir()?;
    let (src, dst) = (tmp.path().join("src"), tmp.path().join("dst"));
    mkdir(&src)?;
    write(&src.join("same"), b"same bytes")?;
    write(&src.join("sneaky"), b"version 2!")?;
    write(&src.join("retimed"), b"equal data")?;
    ferry_engine::copy(&src, &dst, &Options::default(), &NoProgress)?;
    // `sneaky` changed in the destination with its size and mtime kept (what the quick
    // check cannot see); `retimed` has the same bytes but another mtime and mode.
    let sneaky = dst.join("sneaky");
    let (atime, mtime) = {
        let m = std::fs::metadata(&sneaky)?;
        ((m.atime(), m.atime_nsec()), (m.mtime(), m.mtime_nsec()))
    };
    write(&sneaky, b"version 1!")?;
    set_times(&sneaky, atime, mtime)?;
    set_times(&dst.join("retimed"), (1_000_000_000, 0), (1_000_000_000, 0))?;
    chmod(&dst.join("retimed"), 0o600)?;

    let quick = ferry_engine::copy(&src, &dst, &rerun(Compare::SizeAndTime, None), &NoProgress)?;
    ensure!(
        std::fs::read(&sneaky)? == b"version 1!",
        "the quick check was expected to miss it"
    );
    ensure!(
        quick.files == 1,
        "only `retimed` (mtime differs) is copied: {quick:?}"
    );
    // Put `retimed` back the way it was, to see what checksum does with it.
    set_times(&dst.join("retimed"), (1_000_000_000, 0), (1_000_000_000, 0))?;
    chmod(&dst.join("retimed"), 0o600)?;
    let ino = std::fs::metadata(dst.join("retimed"))?.ino();

    let manifest = tmp.path().join("m.xxh128");
    let sum = ferry_engine::copy(
        &src,
        &dst,
        &rerun(Compare::Checksum, Some(manifest.clone())),
        &NoProgress,
    )?;
    ensure!(sum.failures.is_empty(), "{:?}", sum.failures);
    ensure!(
        std::fs::read(&sneaky)? == b"version 2!",
        "the change was not found"
    );
    ensure!(sum.files == 1 && sum.skipped == 2, "{sum:?}");
    // Kept (same inode, not rewritten), with the source's mtime and mode.
    let (s, d) = (
        std::fs::metadata(src.join("retimed"))?,
        std::fs::metadata(dst.join("retimed"))?,
    );
    ensure!(d.ino() == ino, "an equal file was rewritten");
    ensure!(
        (d.mtime(), d.mtime_nsec()) == (s.mtime(), s.mtime_nsec())
            && d.permissions().mode() == s.permissions().mode(),
        "metadata not refreshed"
    );
    // The manifest lists all three: the copied file and both found equal, and checks.
    let lines = manifest_lines(&manifest)?;
    ensure!(lines.len() == 3, "{lines:#?}");
    let check = std::process::Command::new("xxh128sum")
        .args(["--quiet", "-c"])
        .arg(&manifest)
        .current_dir(&dst)
        .output();
    if let Ok(out) = check {
        ensure!(out.status.success(), "manifest does not check: {out:?}");
    }
    Ok(())
}
