//! The engine features the agent builds CopyJobs on, through the library API: a tree split
//! into parts copied at the same time (then finished by one directories-only pass) equals a
//! whole copy; a cancelled copy leaves only whole files and no staging names, and a resumed
//! copy finishes it without recopying what was committed.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use common::*;
use ferry_engine::{Options, Overwrite, Part, Progress, Verify};

/// Nested directories with distinct modes and times, files, a symlink, a FIFO and hard
/// links across directories. Returns the number of regular file names.
fn build_tree(src: &Path, dirs: usize, files_per_dir: usize) -> Result<usize> {
    let mut names = 0;
    mkdir(src)?;
    for d in 0..dirs {
        let dir = src.join(format!("d{d:02}"));
        mkdir(&dir)?;
        mkdir(&dir.join("inner"))?;
        for f in 0..files_per_dir {
            let sub = if f % 4 == 0 {
                dir.join("inner")
            } else {
                dir.clone()
            };
            write(
                &sub.join(format!("f{f:03}")),
                &pattern((d * 1000 + f) as u64, 100 + f * 37),
            )?;
            names += 1;
        }
        symlink("../elsewhere", &dir.join("link"))?;
        chmod(&dir.join("inner"), 0o750)?;
        set_times(&dir.join("inner"), (1_000_000, 1), (1_500_000, 7))?;
        chmod(&dir, 0o705)?;
        set_times(&dir, (2_000_000, 3), (2_500_000, 9))?;
    }
    mkfifo(&src.join("fifo"), 0o640)?;
    // One file with three names in three directories: a link group crosses parts' paths.
    write(&src.join("shared"), b"one inode, three names")?;
    std::fs::hard_link(src.join("shared"), src.join("d00/shared-too"))?;
    std::fs::hard_link(src.join("shared"), src.join("d01/inner/shared-three"))?;
    names += 3;
    set_times(src, (3_000_000, 0), (3_500_000, 5))?;
    Ok(names)
}

/// Manifest lines (hash, path) of all these files.
fn manifest_paths(files: &[PathBuf]) -> Result<BTreeMap<String, usize>> {
    let mut seen = BTreeMap::new();
    for f in files {
        let text = std::fs::read_to_string(f).with_context(|| format!("read {}", f.display()))?;
        for line in text.lines() {
            let (_, path) = line
                .split_once("  ")
                .context("manifest line without a path")?;
            *seen.entry(path.to_string()).or_insert(0) += 1;
        }
    }
    Ok(seen)
}

/// Every regular file of `tree` has exactly one line in `manifests` together.
fn each_listed_once(manifests: &[PathBuf], tree: &Tree) -> Result<()> {
    let listed = manifest_paths(manifests)?;
    for p in regular_paths(tree) {
        ensure!(
            listed.get(&p) == Some(&1),
            "{p} is listed {:?} times in {manifests:?}",
            listed.get(&p)
        );
    }
    Ok(())
}

fn regular_paths(tree: &Tree) -> Vec<String> {
    tree.entries
        .iter()
        .filter(|(_, m)| m.kind == Kind::File)
        .map(|(p, _)| String::from_utf8_lossy(p).into_owned())
        .collect()
}

#[test]
fn a_tree_copied_in_four_concurrent_parts_then_a_directory_pass_equals_the_source() -> Result<()> {
    let tmp = tempdir()?;
    let src = tmp.path().join("src");
    let names = build_tree(&src, 12, 40)?;
    let before = snapshot(&src)?;
    let dst = tmp.path().join("dst");
    let count = 4;
    let summaries = std::thread::scope(|s| {
        let handles: Vec<_> = (0..count)
            .map(|index| {
                let (src, dst) = (&src, &dst);
                let manifest = tmp.path().join(format!("part-{index}.xxh128"));
                s.spawn(move || {
                    let opts = Options {
                        workers: 2,
                        verify: Verify::Checksum,
                        select: Part::Slice { index, count },
                        manifest: Some(manifest),
                        ..Options::default()
                    };
                    ferry_engine::copy(src, dst, &opts, &ferry_engine::NoProgress)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("part thread panicked"))
            .collect::<Vec<_>>()
    });
    let mut files_per_part = Vec::new();
    let mut links = 0;
    for (index, s) in summaries.into_iter().enumerate() {
        let s = s?;
        ensure!(s.failures.is_empty(), "a part failed: {:?}", s.failures);
        // A part's plan (its progress total) counts what the part copies.
        let planned = ferry_engine::plan_part(
            &src,
            Part::Slice {
                index: index as u32,
                count,
            },
            true,
            &Default::default(),
        )?;
        ensure!(
            (planned.files, planned.bytes) == (s.files, s.bytes),
            "part {index} planned {planned:?}, copied {} files, {} bytes",
            s.files,
            s.bytes
        );
        files_per_part.push(s.files);
        links += s.hardlinks;
    }
    // Every part did some of the work, and together exactly all of it, each name once.
    ensure!(
        files_per_part.iter().all(|&n| n > 0),
        "a part copied nothing: {files_per_part:?}"
    );
    ensure!(
        files_per_part.iter().sum::<u64>() + links == names as u64,
        "parts copied {files_per_part:?} files + {links} links, the source has {names} names"
    );
    let dirs = ferry_engine::copy(
        &src,
        &dst,
        &Options {
            select: Part::Directories,
            ..unverified()
        },
        &ferry_engine::NoProgress,
    )?;
    ensure!(dirs.failures.is_empty() && dirs.files == 0, "{dirs:?}");
    let got = compare(&before, &dst, Check::default())?;
    ensure!(
        got.link_groups() == before.link_groups(),
        "hard links differ"
    );
    ensure!(staging_leftovers(&dst)?.is_empty());
    let parts: Vec<_> = (0..count)
        .map(|i| tmp.path().join(format!("part-{i}.xxh128")))
        .collect();
    each_listed_once(&parts, &before)?;
    Ok(())
}

/// A temporary directory holding a source tree of 10 × 30 entries (`build_tree`): the
/// directory, the source, a destination and a manifest path beside it, the source's
/// snapshot and how many names `build_tree` made.
fn fixture() -> Result<(tempfile::TempDir, PathBuf, PathBuf, PathBuf, Tree, usize)> {
    let tmp = tempdir()?;
    let src = tmp.path().join("src");
    let names = build_tree(&src, 10, 30)?;
    let (dst, manifest) = (tmp.path().join("dst"), tmp.path().join("copy.xxh128"));
    Ok((tmp, src.clone(), dst, manifest, snapshot(&src)?, names))
}

/// Run a copy on its own thread and call `stop` once it has done `after` entries (or has
/// finished); returns its result and the entries done when `stop` was called.
fn copy_stopped_after(
    src: &Path,
    dst: &Path,
    opts: &Options,
    progress: &Count,
    after: u64,
    stop: impl FnOnce(),
) -> (Result<ferry_engine::Summary, ferry_engine::Error>, u64) {
    std::thread::scope(|s| {
        let copy = s.spawn(|| ferry_engine::copy(src, dst, opts, progress));
        while progress.0.load(Ordering::Relaxed) < after && !copy.is_finished() {
            std::thread::sleep(Duration::from_millis(1));
        }
        stop();
        let at = progress.0.load(Ordering::Relaxed);
        (copy.join().expect("copy thread panicked"), at)
    })
}

/// Copy `src` to `dst` under `overwrite` (two workers, checksums, a manifest at `manifest`,
/// 3 ms per file) and cancel it after 60 entries. Returns the cancelled run's summary and
/// the options that resume it (resume on, no delay, nothing cancelling).
fn cancelled_after_60(
    src: &Path,
    dst: &Path,
    manifest: &Path,
    overwrite: Overwrite,
) -> Result<(ferry_engine::Summary, Options)> {
    let cancel = Arc::new(AtomicBool::new(false));
    let mut opts = Options {
        workers: 2,
        verify: Verify::Checksum,
        overwrite,
        manifest: Some(manifest.to_path_buf()),
        cancel: Some(cancel.clone()),
        ..Options::default()
    };
    opts.faults.delay_per_file = Some(Duration::from_millis(3));
    let (first, _) = copy_stopped_after(src, dst, &opts, &Count::default(), 60, || {
        cancel.store(true, Ordering::Relaxed)
    });
    opts.cancel = None;
    opts.resume = true;
    opts.faults.delay_per_file = None;
    Ok((first?, opts))
}

#[derive(Default)]
struct Count(AtomicU64);

impl Progress for Count {
    fn entry_done(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

#[test]
fn a_cancelled_copy_leaves_whole_files_only_and_a_resumed_copy_finishes_it() -> Result<()> {
    let (_tmp, src, dst, manifest, before, names) = fixture()?;
    let (first, mut opts) = cancelled_after_60(&src, &dst, &manifest, Overwrite::default())?;
    ensure!(
        first.cancelled,
        "the copy did not report the cancel: {first:?}"
    );
    ensure!(first.failures.is_empty(), "{:?}", first.failures);
    ensure!(
        (first.files as usize) < names,
        "cancelled too late to test anything: {} of {names} files",
        first.files
    );
    // What is there is whole: each file equals its source byte for byte.
    let partial = snapshot(&dst)?;
    ensure!(staging_leftovers(&dst)?.is_empty(), "staging names left");
    let (mut present, mut non_dirs) = (0, 0);
    for (p, m) in &partial.entries {
        if m.kind != Kind::Dir {
            non_dirs += 1;
        }
        if m.kind == Kind::File {
            ensure!(
                read_rel(&dst, p)? == read_rel(&src, p)?,
                "{} differs from its source",
                show(p)
            );
            present += 1;
        }
    }
    ensure!(present as u64 == first.files + first.hardlinks);

    opts.overwrite = Overwrite::Never;
    let second = ferry_engine::copy(&src, &dst, &opts, &ferry_engine::NoProgress)?;
    ensure!(second.failures.is_empty(), "{:?}", second.failures);
    let got = snapshot(&dst)?;
    // Nothing committed by the first run was copied again: same inodes (a hard-linked name
    // may have been relinked to its group's leader instead).
    for (p, m) in &partial.entries {
        if m.kind != Kind::Dir && !linked_in(&before, p) {
            ensure!(
                got.get(p).map(|g| g.inode) == Some(m.inode),
                "{} was copied again by the resumed run",
                show(p)
            );
        }
    }
    ensure!(second.skipped > 0 && (second.skipped as usize) <= non_dirs);
    let got = compare(&before, &dst, Check::default())?;
    ensure!(
        got.link_groups() == before.link_groups(),
        "hard links differ"
    );
    each_listed_once(&[manifest], &before)?;
    Ok(())
}

/// A copy whose fence says no (the node agent lost its lease or its shard) makes nothing
/// more visible: no file linked after that moment, the staged top directory left under
/// its staging name for the next owner, no manifest lines; the next owner's resumed run
/// (same staging tag) adopts all of it and finishes with nothing copied twice.
#[test]
fn a_fenced_copy_makes_nothing_more_visible_and_the_next_owner_adopts_its_staging() -> Result<()> {
    let (tmp, src, dst, manifest, before, names) = fixture()?;
    let progress = Count::default();
    let owned = Arc::new(AtomicBool::new(true));
    let mut opts = Options {
        workers: 2,
        verify: Verify::Checksum,
        manifest: Some(manifest.clone()),
        staging_tag: Some("fencetest".into()),
        ..Options::default()
    };
    opts.fence = Some(ferry_engine::Fence(Arc::new({
        let owned = owned.clone();
        move || owned.load(Ordering::SeqCst)
    })));
    opts.faults.delay_per_file = Some(Duration::from_millis(3));
    let (first, at_fence) = copy_stopped_after(&src, &dst, &opts, &progress, 60, || {
        owned.store(false, Ordering::SeqCst)
    });
    let first = first?;
    ensure!(
        first.cancelled,
        "a fenced copy reports that it stopped: {first:?}"
    );
    ensure!(
        (at_fence as usize) < names,
        "fenced too late to test anything: {at_fence} of {names} entries"
    );
    // Nothing under the final name: the top directory is still staged.
    ensure!(
        !dst.exists(),
        "the fenced copy renamed its staging into place"
    );
    let staged: Vec<_> = std::fs::read_dir(tmp.path())?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".ferry-fencetest-d"))
        .collect();
    ensure!(staged.len() == 1, "the staging directory: {staged:?}");
    // At most the files already past their check when the fence flipped (one per worker).
    let files_there = snapshot(&tmp.path().join(&staged[0]))?
        .entries
        .values()
        .filter(|m| m.kind != Kind::Dir)
        .count();
    ensure!(
        files_there as u64 <= at_fence + 2,
        "{files_there} entries visible; {at_fence} were done when the fence flipped"
    );
    let lines = std::fs::read_to_string(&manifest)?.lines().count();
    ensure!(lines == 0, "a fenced copy wrote {lines} manifest lines");

    // The next owner: same tag, resumed, its own fence always yes.
    opts.fence = None;
    opts.resume = true;
    opts.faults.delay_per_file = None;
    let second = ferry_engine::copy(&src, &dst, &opts, &ferry_engine::NoProgress)?;
    ensure!(second.failures.is_empty(), "{:?}", second.failures);
    ensure!(
        second.files_resumed > 0
            && second.files + second.files_resumed == names as u64 - hard_extra(&before),
        "resumed {} + copied {} files for {names} names",
        second.files_resumed,
        second.files
    );
    compare(&before, &dst, Check::default())?;
    ensure!(staging_leftovers(&dst)?.is_empty(), "staging names left");
    each_listed_once(&[manifest], &before)?;
    Ok(())
}

/// Names of regular files beyond the first of each hard-link group.
/// Whether `rel` is one name of a hard-linked file in the source `tree`. (Not the partial
/// destination's link count: a group the cancelled run had made one name of has count 1
/// there.)
fn linked_in(tree: &Tree, rel: &[u8]) -> bool {
    tree.get(rel).is_none_or(|m| m.nlink > 1)
}

fn hard_extra(tree: &Tree) -> u64 {
    let files: Vec<_> = tree
        .entries
        .values()
        .filter(|m| m.kind == Kind::File)
        .collect();
    let inodes: std::collections::BTreeSet<(u64, u64)> = files.iter().map(|m| m.inode).collect();
    (files.len() - inodes.len()) as u64
}

/// `overwrite: Always` replaces what a destination has, but not what an earlier run of the
/// same copy committed and listed: a resumed copy keeps those (same inodes). A name of a
/// hard-linked source file is the exception: when the resumed run meets another name of
/// its group first, that one leads the group and the adopted name becomes a link to it
/// (`adopt_linked`), an identical copy under another inode.
#[test]
fn a_resumed_copy_under_overwrite_always_keeps_what_the_earlier_run_committed() -> Result<()> {
    let (_tmp, src, dst, manifest, before, _) = fixture()?;
    let (first, opts) = cancelled_after_60(&src, &dst, &manifest, Overwrite::Always)?;
    ensure!(first.cancelled && first.files > 0, "{first:?}");
    let partial = snapshot(&dst)?;
    let second = ferry_engine::copy(&src, &dst, &opts, &ferry_engine::NoProgress)?;
    ensure!(second.failures.is_empty(), "{:?}", second.failures);
    let got = snapshot(&dst)?;
    for (p, m) in &partial.entries {
        if m.kind == Kind::File && !linked_in(&before, p) {
            ensure!(
                got.get(p).map(|g| g.inode) == Some(m.inode),
                "{} was copied again under overwrite Always",
                show(p)
            );
        }
    }
    ensure!(second.files_resumed >= first.files - first.hardlinks.min(first.files));
    compare(&before, &dst, Check::default())?;
    each_listed_once(&[manifest], &before)?;
    Ok(())
}
