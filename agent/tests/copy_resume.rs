//! Crash-safe resume through `ferry-agent copy`: a copy SIGKILLed mid-way several times,
//! then resumed with the same staging tag, ends equal to the source with every file listed
//! once in its manifest, no staging names left, and nothing the killed runs committed copied
//! again; a resume replaces the file a killed run was writing. (The engine's side of
//! resuming is tested in `engine/tests/resume.rs`.)

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use common::*;

const TAG: &str = "5eed0fca11ed";

/// Directories two levels deep with distinct modes and times, files of varied sizes (3 in
/// each top directory, `files` in each of its `subs` subdirectories), a symlink and a FIFO
/// per top directory. Returns (regular files, their total bytes).
fn build_tree(src: &Path, tops: usize, subs: usize, files: usize) -> Result<(usize, u64)> {
    let (mut count, mut bytes) = (0, 0u64);
    mkdir(src)?;
    for t in 0..tops {
        let top = src.join(format!("top{t}"));
        mkdir(&top)?;
        let mut dirs = vec![top.clone()];
        for s in 0..subs {
            let sub = top.join(format!("sub{s}"));
            mkdir(&sub)?;
            dirs.push(sub);
        }
        for (i, dir) in dirs.iter().enumerate() {
            // Few files at the top, so the copy is soon inside (staged) subdirectories.
            let files = if i == 0 { 3 } else { files };
            for f in 0..files {
                let len = 500 + ((t * 7919 + i * 104_729 + f * 1_299_709) % 30_000) as u64;
                write_pattern_file(&dir.join(format!("file-{f:03}")), len)?;
                set_times(
                    &dir.join(format!("file-{f:03}")),
                    (1_600_000_000, 5),
                    (1_500_000_000 + f as i64, 123_456_789),
                )?;
                count += 1;
                bytes += len;
            }
        }
        symlink(format!("file-{:03}", 0), &top.join("link"))?;
        mkfifo(&top.join("fifo"), 0o640)?;
        for (i, dir) in dirs.iter().enumerate().rev() {
            chmod(dir, if i == 0 { 0o751 } else { 0o705 })?;
            set_times(dir, (1_400_000_000, 1), (1_300_000_000 + i as i64, 2))?;
        }
    }
    set_times(src, (1_400_000_000, 3), (1_300_000_000, 4))?;
    Ok((count, bytes))
}

/// Every finished regular file under `dir` (staging directories included): inode → size.
/// Inside a staging directory files are written under their final names, data first and
/// times last, so one a killed run was writing still has the time it was written, not its
/// source's (all before 2020 here), and is not counted.
fn files_under(dir: &Path, out: &mut BTreeMap<(u64, u64), u64>) -> Result<()> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Ok(());
    };
    for e in rd.flatten() {
        // Entries vanish while a copy runs (a staging directory renamed into place).
        let Ok(md) = e.path().symlink_metadata() else {
            continue;
        };
        if md.is_dir() {
            files_under(&e.path(), out)?;
        } else if md.is_file() && md.mtime() < 1_600_000_000 {
            out.insert((md.dev(), md.ino()), md.size());
        }
    }
    Ok(())
}

/// The regular files the copies have made so far: under `dst`, and under staging
/// directories next to it (a new destination is built under one).
fn copied_so_far(parent: &Path, dst: &Path) -> Result<BTreeMap<(u64, u64), u64>> {
    let mut out = BTreeMap::new();
    files_under(dst, &mut out)?;
    for e in std::fs::read_dir(parent)? {
        let e = e?;
        if e.file_name().as_bytes().starts_with(b".ferry-") {
            files_under(&e.path(), &mut out)?;
        }
    }
    Ok(out)
}

fn copy_args(src: &Path, dst: &Path, manifest: &Path, resume: bool) -> Vec<std::ffi::OsString> {
    let mut args: Vec<std::ffi::OsString> = vec![
        "--json".into(),
        "--workers".into(),
        "2".into(),
        "--verify".into(),
        "checksum".into(),
        "--staging-tag".into(),
        TAG.into(),
        "--manifest".into(),
        manifest.into(),
    ];
    if resume {
        args.push("--resume".into());
    }
    args.push(src.into());
    args.push(dst.into());
    args
}

/// Kill a copy of `src` to `dst` with SIGKILL three times, each time after it has committed
/// at least `step` more files, then let a resumed run finish; check what a user would.
fn killed_three_times_then_resumed(dst_exists: bool) -> Result<()> {
    let tmp = tempdir()?;
    let src = tmp.path().join("src");
    let (total_files, total_bytes) = build_tree(&src, 3, 2, 16)?;
    let before = snapshot(&src)?;
    let dst = tmp.path().join("dst");
    if dst_exists {
        // Merging into an existing directory: its new subdirectories are made in place and
        // theirs are staged, so the killed runs leave staging directories inside DST.
        mkdir(&dst)?;
    }
    let manifest = tmp.path().join("copy.xxh128");
    let step = 12;
    // Whether a killed run left a staging directory for the next one to adopt.
    let mut left_staging = false;
    for round in 0..3 {
        let start = copied_so_far(tmp.path(), &dst)?.len();
        let mut cmd = copy_command(copy_args(&src, &dst, &manifest, round > 0));
        cmd.arg("--fault-delay-per-file-ms")
            .arg("15")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().context("spawn ferry-agent copy")?;
        let deadline = Instant::now() + COPY_TIMEOUT;
        loop {
            if let Some(status) = child.try_wait()? {
                bail!("round {round}: the copy finished ({status}) before it could be killed; make the tree bigger");
            }
            if copied_so_far(tmp.path(), &dst)?.len() >= start + step {
                break;
            }
            ensure!(Instant::now() < deadline, "round {round}: no progress");
            std::thread::sleep(Duration::from_millis(2));
        }
        // Our own child, by its id: SIGKILL, the way a node loses an agent.
        child.kill()?;
        child.wait()?;
        let mut names = Vec::new();
        ferry_names(tmp.path(), &mut names)?;
        left_staging |= !names.is_empty();
    }
    // What the killed runs finished, wherever it is (staged or in place).
    let present = copied_so_far(tmp.path(), &dst)?;
    let (kept_files, kept_bytes) = (present.len(), present.values().sum::<u64>());
    ensure!(
        kept_files >= 3 * step && kept_files < total_files,
        "{kept_files} of {total_files} files before the final run: nothing left to test"
    );
    ensure!(
        left_staging,
        "no killed run left a staging directory to adopt"
    );

    let out = copy(copy_args(&src, &dst, &manifest, true))?;
    out.expect_code(0)?;
    let json = out.json()?;
    // The final run copied exactly what was missing, and counted the rest as resumed.
    ensure!(
        (num(&json, "files"), num(&json, "bytes"))
            == ((total_files - kept_files) as u64, total_bytes - kept_bytes),
        "the final run copied {} files, {} bytes; {} files, {} bytes were missing:\n{out}",
        num(&json, "files"),
        num(&json, "bytes"),
        total_files - kept_files,
        total_bytes - kept_bytes
    );
    ensure!(
        (num(&json, "files_resumed"), num(&json, "bytes_resumed"))
            == (kept_files as u64, kept_bytes),
        "resumed counts differ from what was there:\n{out}"
    );
    // Nothing committed before was copied again: every one of those inodes is in DST.
    let mut after = BTreeMap::new();
    files_under(&dst, &mut after)?;
    let missing: Vec<_> = present.keys().filter(|k| !after.contains_key(k)).collect();
    ensure!(
        missing.is_empty(),
        "{} files were copied again: {missing:?}",
        missing.len()
    );

    let check = Check {
        atime: false,
        ..Check::default()
    };
    compare(&before, &dst, check)?;
    let mut leftovers = Vec::new();
    ferry_names(tmp.path(), &mut leftovers)?;
    ensure!(leftovers.is_empty(), "staging names left: {leftovers:?}");

    let listed = manifest_counts(&manifest)?;
    let files: BTreeSet<Vec<u8>> = before
        .entries
        .iter()
        .filter(|(_, m)| m.kind == Kind::File)
        .map(|(p, _)| p.clone())
        .collect();
    let listed_paths: BTreeSet<Vec<u8>> = listed.keys().cloned().collect();
    ensure!(
        listed_paths == files,
        "the manifest does not list exactly the source's files"
    );
    let twice: Vec<_> = listed
        .iter()
        .filter(|(_, &n)| n != 1)
        .map(|(p, _)| show(p))
        .collect();
    ensure!(twice.is_empty(), "listed more than once: {twice:?}");
    xxh128sum_check(&dst, &manifest)
}

#[test]
fn a_new_copy_killed_three_times_then_resumed_equals_the_source_and_recopies_nothing() -> Result<()>
{
    killed_three_times_then_resumed(false)
}

#[test]
fn a_merge_killed_three_times_then_resumed_adopts_its_staged_subdirectories() -> Result<()> {
    killed_three_times_then_resumed(true)
}

/// Inside a staging directory of our tag, files are written under their final names, so a
/// run killed mid-file leaves one unfinished there. A resumed run must tell it from the
/// finished ones: it keeps a finished file (same inode), and replaces the unfinished one.
#[test]
fn a_resume_replaces_the_file_a_killed_run_was_writing_and_keeps_the_finished_ones() -> Result<()> {
    let tmp = tempdir()?;
    let src = tmp.path().join("src");
    mkdir(&src)?;
    for name in ["done", "half", "todo"] {
        write_pattern_file(&src.join(name), 20_000)?;
        set_times(&src.join(name), (1_600_000_000, 0), (1_500_000_000, 7))?;
    }
    let dst = tmp.path().join("dst");
    // What a killed run leaves: the top directory staged, one file finished (data, then
    // its times), one cut off mid-write (part of its data, the time it was written).
    let staged = tmp.path().join(format!(
        ".ferry-{TAG}-d{:016x}.tmp",
        twox_hash::XxHash3_64::oneshot(b"dst")
    ));
    mkdir(&staged)?;
    std::fs::copy(src.join("done"), staged.join("done"))?;
    set_times(&staged.join("done"), (1_600_000_000, 0), (1_500_000_000, 7))?;
    std::fs::write(
        staged.join("half"),
        &std::fs::read(src.join("half"))?[..8192],
    )?;
    let done_inode = std::fs::metadata(staged.join("done"))?.ino();

    let manifest = tmp.path().join("m.xxh128");
    let out = copy(copy_args(&src, &dst, &manifest, true))?;
    out.expect_code(0)?;
    let json = out.json()?;
    ensure!(
        (num(&json, "files"), num(&json, "files_resumed")) == (2, 1),
        "expected 2 files copied (half, todo) and 1 resumed (done):\n{out}"
    );
    for name in ["done", "half", "todo"] {
        ensure!(
            std::fs::read(dst.join(name))? == std::fs::read(src.join(name))?,
            "{name} differs from its source"
        );
    }
    ensure!(
        std::fs::metadata(dst.join("done"))?.ino() == done_inode,
        "the finished file was copied again"
    );
    ensure!(!staged.exists(), "the staging directory was not adopted");
    let lines = std::fs::read_to_string(&manifest)?.lines().count();
    ensure!(lines == 3, "the manifest has {lines} lines for 3 files");
    Ok(())
}
