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

/// A copy with a manifest and records, the records renamed into place afterwards as the
/// agent does: what one run of a job into `dst` does.
fn with_records(
    src: &std::path::Path,
    dst: &std::path::Path,
    state: &std::path::Path,
    manifest: &std::path::Path,
) -> Result<ferry_engine::Summary> {
    let opts = Options {
        records: Some(ferry_engine::Records {
            earlier: state.join("records"),
            write: state.join("records.next"),
        }),
        ..rerun(Compare::SizeAndTime, Some(manifest.to_path_buf()))
    };
    let summary = ferry_engine::copy(src, dst, &opts, &NoProgress)?;
    std::fs::rename(state.join("records.next"), state.join("records"))?;
    Ok(summary)
}

/// `xxh128sum -c` of `manifest` in `dst`: the names of the lines that fail.
fn failing_lines(dst: &std::path::Path, manifest: &std::path::Path) -> Result<Vec<String>> {
    let out = std::process::Command::new("xxh128sum")
        .args(["--quiet", "-c"])
        .arg(manifest)
        .current_dir(dst)
        .output()?;
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.strip_suffix(": FAILED").map(str::to_string))
        .collect())
}

#[test]
fn a_rerun_lists_the_files_it_keeps_from_the_records_of_earlier_runs() -> Result<()> {
    if !require_tools(&["xxh128sum"]) {
        return Ok(());
    }
    let tmp = tempdir()?;
    let (src, dst, state) = (
        tmp.path().join("src"),
        tmp.path().join("dst"),
        tmp.path().join("state"),
    );
    mkdir(&state)?;
    for d in 0..4 {
        mkdir(&src.join(format!("d{d}")))?;
        for f in 0..25 {
            write(
                &src.join(format!("d{d}/f{f}")),
                format!("{d}/{f}").as_bytes(),
            )?;
        }
    }
    // A hard link across directories, and a name with a newline (an escaped line).
    std::fs::hard_link(src.join("d0/f0"), src.join("d1/link"))?;
    write(&src.join("d2/new\nline"), b"nl")?;
    let all = 102;
    let manifest = |i: u32| tmp.path().join(format!("manifest-{i}"));

    let first = with_records(&src, &dst, &state, &manifest(1))?;
    ensure!(first.files == all - 1 && first.hardlinks == 1, "{first:?}");
    ensure!(manifest_lines(&manifest(1))?.len() == all as usize);

    // Nothing changed: nothing copied, every file listed from the records, and the
    // manifest checks.
    let second = with_records(&src, &dst, &state, &manifest(2))?;
    ensure!(
        second.files == 0 && second.listed_from_records == all && second.unlisted == 0,
        "{second:?}"
    );
    let mut first_lines = manifest_lines(&manifest(1))?;
    let mut second_lines = manifest_lines(&manifest(2))?;
    first_lines.sort();
    second_lines.sort();
    ensure!(
        first_lines == second_lines,
        "the re-run's manifest is not the first's"
    );
    ensure!(failing_lines(&dst, &manifest(2))?.is_empty());

    // One file changed at the source: copied, listed with its new hash; the rest carried.
    write(&src.join("d3/f7"), b"changed, and longer")?;
    let third = with_records(&src, &dst, &state, &manifest(3))?;
    ensure!(
        third.files == 1 && third.listed_from_records == all - 1,
        "{third:?}"
    );
    ensure!(manifest_lines(&manifest(3))?.len() == all as usize);
    ensure!(failing_lines(&dst, &manifest(3))?.is_empty());

    // A destination file changed in place with its size and mtime put back: the quick
    // check keeps it (as rsync's does), and its carried line shows the change.
    let victim = dst.join("d1/f3");
    let m = std::fs::metadata(&victim)?;
    let (atime, mtime) = ((m.atime(), m.atime_nsec()), (m.mtime(), m.mtime_nsec()));
    write(&victim, b"X/3")?;
    set_times(&victim, atime, mtime)?;
    let fourth = with_records(&src, &dst, &state, &manifest(4))?;
    ensure!(fourth.files == 0, "{fourth:?}");
    ensure!(
        failing_lines(&dst, &manifest(4))? == ["d1/f3"],
        "the changed file must fail the check: {:?}",
        failing_lines(&dst, &manifest(4))?
    );

    // A file whose source and destination both changed behind Ferry's back (another tool
    // synced it): equal by the quick check, but no record of that size and mtime: kept,
    // not listed, and counted.
    write(&src.join("d0/f9"), b"both sides")?;
    write(&dst.join("d0/f9"), b"both sides")?;
    let s = std::fs::metadata(src.join("d0/f9"))?;
    set_times(
        &dst.join("d0/f9"),
        (s.atime(), s.atime_nsec()),
        (s.mtime(), s.mtime_nsec()),
    )?;
    let fifth = with_records(&src, &dst, &state, &manifest(5))?;
    ensure!(
        fifth.files == 0 && fifth.unlisted == 1 && fifth.listed_from_records == all - 1,
        "{fifth:?}"
    );
    ensure!(!manifest_lines(&manifest(5))?
        .iter()
        .any(|l| l.ends_with("  d0/f9")));

    // Without records (a destination another tool filled): every kept file is counted as
    // not listed, none is listed.
    std::fs::remove_file(state.join("records"))?;
    let sixth = with_records(&src, &dst, &state, &manifest(6))?;
    ensure!(
        sixth.files == 0 && sixth.unlisted == all && manifest_lines(&manifest(6))?.is_empty(),
        "{sixth:?}"
    );
    Ok(())
}
