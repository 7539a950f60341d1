//! Merging into an existing destination under each overwrite policy, refusing what must be
//! refused (exit 2), reporting what failed (exit 1), and the `--json` summary.

mod common;

use std::ffi::OsStr;
use std::path::Path;
use std::process::Command;

use anyhow::{ensure, Context, Result};
use common::*;

fn read(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("read {}", path.display()))
}

/// `ferry-agent copy` run as uid/gid 65534 with no supplementary groups.
fn copy_as_nobody(args: &[&OsStr]) -> Result<Option<Output>> {
    if !require_root("switching to uid 65534") || !require_tools(&["setpriv"]) {
        return Ok(None);
    }
    let mut cmd = Command::new("setpriv");
    cmd.args([
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        "--",
        BIN,
    ])
    .args(copy_args(
        std::iter::once(OsStr::new("--json")).chain(args.iter().copied()),
    ));
    run(cmd, COPY_TIMEOUT).map(Some)
}

/// A source with two files and a nested one, and a destination that already has older
/// versions of some of them plus a file of its own.
fn merge_setup(tmp: &Path) -> Result<(std::path::PathBuf, std::path::PathBuf)> {
    let src = tmp.join("src");
    mkdir(&src.join("sub"))?;
    write(&src.join("a"), b"new a from the source")?;
    write(&src.join("b"), b"new b")?;
    write(&src.join("sub/c"), b"new c, nested")?;
    write(&src.join("only_in_source"), b"fresh")?;
    let dst = tmp.join("dst");
    mkdir(&dst.join("sub"))?;
    write(&dst.join("a"), b"old a")?;
    write(&dst.join("sub/c"), b"old c")?;
    write(&dst.join("mine"), b"belongs to the destination")?;
    Ok((src, dst))
}

#[test]
fn overwrite_never_keeps_existing_files_and_counts_them_skipped() -> Result<()> {
    let tmp = tempdir()?;
    let (src, dst) = merge_setup(tmp.path())?;
    let json = copy_ok([&src, &dst])?;
    ensure!(
        read(&dst.join("a"))? == b"old a",
        "existing a was overwritten"
    );
    ensure!(
        read(&dst.join("sub/c"))? == b"old c",
        "existing sub/c was overwritten"
    );
    ensure!(read(&dst.join("b"))? == b"new b");
    ensure!(read(&dst.join("only_in_source"))? == b"fresh");
    ensure!(read(&dst.join("mine"))? == b"belongs to the destination");
    ensure!(num(&json, "skipped") == 2, "skipped: {json}");
    ensure!(staging_leftovers(&dst)?.is_empty());
    Ok(())
}

#[test]
fn overwrite_if_changed_replaces_only_files_whose_size_or_mtime_differ() -> Result<()> {
    let tmp = tempdir()?;
    let src = tmp.path().join("src");
    let dst = tmp.path().join("dst");
    mkdir(&src)?;
    mkdir(&dst)?;
    let t = (1_600_000_000, 123_456_789);
    // Same size and mtime: treated as unchanged, even though the bytes differ.
    write(&src.join("same"), b"AAAA")?;
    write(&dst.join("same"), b"BBBB")?;
    write(&src.join("other_size"), b"longer new content")?;
    write(&dst.join("other_size"), b"short")?;
    write(&src.join("other_mtime"), b"CCCC")?;
    write(&dst.join("other_mtime"), b"DDDD")?;
    for p in ["same", "other_size", "other_mtime"] {
        set_times(&src.join(p), t, t)?;
        set_times(&dst.join(p), t, t)?;
    }
    set_times(&dst.join("other_mtime"), t, (t.0, t.1 + 1))?;
    let json = copy_ok([
        "--overwrite".as_ref(),
        "if-changed".as_ref(),
        src.as_os_str(),
        dst.as_os_str(),
    ])?;
    ensure!(
        read(&dst.join("same"))? == b"BBBB",
        "unchanged (size+mtime) file was replaced"
    );
    ensure!(
        read(&dst.join("other_size"))? == b"longer new content",
        "file of another size kept"
    );
    ensure!(
        read(&dst.join("other_mtime"))? == b"CCCC",
        "file of another mtime kept"
    );
    ensure!(
        lstat(&dst.join("other_mtime"))?.st_mtime_nsec == t.1,
        "replacement lost the source mtime"
    );
    ensure!(num(&json, "skipped") == 1, "skipped: {json}");
    ensure!(staging_leftovers(&dst)?.is_empty());
    Ok(())
}

#[test]
fn overwrite_always_replaces_by_rename_never_writing_through_a_hard_link() -> Result<()> {
    let tmp = tempdir()?;
    let (src, dst) = merge_setup(tmp.path())?;
    // Another name of the destination's old inode: it must keep the old bytes.
    let outside = tmp.path().join("outside_link");
    std::fs::hard_link(dst.join("a"), &outside)?;
    chmod(&dst.join("sub/c"), 0o600)?;
    let t = (1_500_000_000, 5);
    set_times(&src.join("b"), t, t)?;
    write(&dst.join("b"), b"new b")?;
    set_times(&dst.join("b"), t, t)?;
    let json = copy_ok([
        "--overwrite".as_ref(),
        "always".as_ref(),
        src.as_os_str(),
        dst.as_os_str(),
    ])?;
    ensure!(read(&dst.join("a"))? == b"new a from the source");
    ensure!(read(&dst.join("sub/c"))? == b"new c, nested");
    ensure!(
        lstat(&dst.join("sub/c"))?.st_mode & 0o7777 == lstat(&src.join("sub/c"))?.st_mode & 0o7777,
        "replacement kept the old mode"
    );
    ensure!(read(&dst.join("mine"))? == b"belongs to the destination");
    ensure!(
        read(&outside)? == b"old a",
        "the old inode was written through instead of replaced"
    );
    ensure!(num(&json, "skipped") == 0, "always skips nothing: {json}");
    ensure!(staging_leftovers(&dst)?.is_empty());
    Ok(())
}

#[test]
fn destination_symlink_pointing_outside_is_replaced_and_its_target_untouched() -> Result<()> {
    for policy in ["always", "if-changed"] {
        let tmp = tempdir()?;
        let canary = tmp.path().join("canary");
        write(&canary, b"outside: must stay byte-identical")?;
        set_times(&canary, (1_000_000_000, 0), (1_000_000_000, 0))?;
        let src = tmp.path().join("src");
        mkdir(&src)?;
        write(&src.join("a"), b"source a, longer than nothing")?;
        let dst = tmp.path().join("dst");
        mkdir(&dst)?;
        symlink(&canary, &dst.join("a"))?;
        let watch = OpenWatch::new(&[&canary])?;
        copy_ok([
            "--overwrite".as_ref(),
            policy.as_ref(),
            src.as_os_str(),
            dst.as_os_str(),
        ])?;
        // Before this test reads the canary itself.
        ensure!(
            watch.touched().is_empty(),
            "{policy}: canary opened through the link"
        );
        ensure!(
            lstat(&canary)?.st_mtime == 1_000_000_000,
            "{policy}: canary modified"
        );
        ensure!(
            read(&canary)? == b"outside: must stay byte-identical",
            "{policy}: canary written through the link"
        );
        ensure!(
            std::fs::symlink_metadata(dst.join("a"))?.is_file(),
            "{policy}: the link was not replaced by the file"
        );
        ensure!(read(&dst.join("a"))? == b"source a, longer than nothing");
    }
    Ok(())
}

#[test]
fn destination_symlink_where_the_source_has_a_directory_is_refused_not_entered() -> Result<()> {
    let tmp = tempdir()?;
    let outside = tmp.path().join("outside");
    mkdir(&outside)?;
    let src = tmp.path().join("src");
    mkdir(&src.join("sub"))?;
    write(&src.join("sub/planted"), b"must not land outside")?;
    write(&src.join("ok"), b"fine")?;
    let dst = tmp.path().join("dst");
    mkdir(&dst)?;
    symlink(&outside, &dst.join("sub"))?;
    let out = copy([
        "--json".as_ref(),
        "--overwrite".as_ref(),
        "always".as_ref(),
        src.as_os_str(),
        dst.as_os_str(),
    ])?;
    ensure!(
        std::fs::read_dir(&outside)?.next().is_none(),
        "files were written through the destination symlink:\n{out}"
    );
    out.expect_code(1)?;
    let f = failures(&out.json()?);
    ensure!(
        f == vec![("sub".to_string(), "DestinationConflict".to_string())],
        "failures: {f:?}\n{out}"
    );
    ensure!(read(&dst.join("ok"))? == b"fine");
    ensure!(
        std::fs::symlink_metadata(dst.join("sub"))?
            .file_type()
            .is_symlink(),
        "the destination symlink was removed"
    );
    Ok(())
}

#[test]
fn dangling_symlink_as_destination_is_refused_with_exit_2() -> Result<()> {
    let tmp = tempdir()?;
    let src = tmp.path().join("src");
    mkdir(&src)?;
    write(&src.join("f"), b"x")?;
    let target = tmp.path().join("would_be_created");
    let dst = tmp.path().join("dst");
    symlink(&target, &dst)?;
    let out = copy([&src, &dst])?;
    out.expect_code(2)?;
    ensure!(
        out.stderr.contains("symlink"),
        "message does not say why:\n{out}"
    );
    ensure!(
        !target.exists(),
        "the copy followed the dangling link and created its target"
    );

    // The same for a single file.
    let out = copy([&src.join("f"), &dst])?;
    out.expect_code(2)?;
    ensure!(!target.exists(), "a file copy followed the dangling link");
    Ok(())
}

#[test]
fn missing_source_exits_2_with_a_message_naming_the_path() -> Result<()> {
    let tmp = tempdir()?;
    let src = tmp.path().join("no_such_source");
    let out = copy([&src, &tmp.path().join("dst")])?;
    out.expect_code(2)?;
    ensure!(
        out.stderr.contains(&*src.to_string_lossy()),
        "message does not name the path:\n{out}"
    );
    ensure!(
        !tmp.path().join("dst").exists(),
        "a destination was created"
    );
    Ok(())
}

#[test]
fn unknown_no_preserve_name_exits_2_listing_the_valid_names() -> Result<()> {
    let tmp = tempdir()?;
    let src = tmp.path().join("src");
    mkdir(&src)?;
    let out = copy([
        "--no-preserve".as_ref(),
        "mode,colour".as_ref(),
        src.as_os_str(),
        tmp.path().join("dst").as_os_str(),
    ])?;
    out.expect_code(2)?;
    ensure!(
        out.stderr.contains("colour"),
        "message does not name the bad value:\n{out}"
    );
    for name in [
        "mode",
        "ownership",
        "timestamps",
        "xattrs",
        "links",
        "sparse",
        "all",
    ] {
        ensure!(
            out.stderr.contains(name),
            "message does not list {name}:\n{out}"
        );
    }
    ensure!(!tmp.path().join("dst").exists());
    Ok(())
}

#[test]
fn copying_a_directory_into_itself_or_its_subdirectory_exits_2() -> Result<()> {
    let tmp = tempdir()?;
    let src = tmp.path().join("src");
    mkdir(&src.join("sub/deeper"))?;
    write(&src.join("f"), b"x")?;
    let before = snapshot(&src)?;
    for dst in [
        src.join("sub/new"),
        src.join("sub/deeper"),
        src.clone(),
        src.join("sub/../sub/new2"),
    ] {
        let out = copy([&src, &dst])?;
        out.expect_code(2)?;
        ensure!(
            out.stderr.contains("itself"),
            "message for {} does not say why:\n{out}",
            dst.display()
        );
    }
    compare(&before, &src, Check::default()).context("the refused copies changed the source")?;
    Ok(())
}

#[test]
fn directory_source_onto_an_existing_file_exits_2() -> Result<()> {
    let tmp = tempdir()?;
    let src = tmp.path().join("src");
    mkdir(&src)?;
    write(&src.join("f"), b"x")?;
    let dst = tmp.path().join("file");
    write(&dst, b"keep me")?;
    let out = copy([&src, &dst])?;
    out.expect_code(2)?;
    ensure!(out.stderr.contains("not a directory"), "{out}");
    ensure!(read(&dst)? == b"keep me");
    Ok(())
}

#[test]
fn bad_flag_values_exit_2() -> Result<()> {
    let tmp = tempdir()?;
    for bad in [
        &["--verify", "sometimes"][..],
        &["--reflink", "maybe"],
        &["--overwrite", "yes"],
        &["--workers", "many"],
    ] {
        let mut args: Vec<&OsStr> = bad.iter().map(OsStr::new).collect();
        args.extend([tmp.path().as_os_str(), OsStr::new("/nonexistent/dst")]);
        copy(args)?.expect_code(2)?;
    }
    Ok(())
}

#[test]
fn a_file_source_copies_to_a_new_name_or_into_an_existing_directory() -> Result<()> {
    let tmp = tempdir()?;
    let src = tmp.path().join("file");
    write(&src, b"single file")?;
    chmod(&src, 0o640)?;
    set_times(&src, (1_400_000_000, 1), (1_300_000_000, 2))?;
    let new = tmp.path().join("renamed");
    copy_ok([&src, &new])?;
    ensure!(read(&new)? == b"single file");
    let (a, b) = (lstat(&src)?, lstat(&new)?);
    ensure!(
        (a.st_mode, a.st_mtime, a.st_mtime_nsec) == (b.st_mode, b.st_mtime, b.st_mtime_nsec),
        "metadata of a single-file copy"
    );
    let dir = tmp.path().join("dir");
    mkdir(&dir)?;
    copy_ok([&src, &dir])?;
    ensure!(read(&dir.join("file"))? == b"single file");
    ensure!(staging_leftovers(&dir)?.is_empty());
    Ok(())
}

/// Run without any `--verify` (not through `copy_args`, which turns it off): the CLI's
/// default is a CopyJob's, `Checksum`.
#[test]
fn the_cli_verifies_by_default_as_a_copyjob_does() -> Result<()> {
    let tmp = tempdir()?;
    let src = tmp.path().join("src");
    mkdir(&src)?;
    write(&src.join("small"), b"abc")?;
    write(&src.join("large"), &pattern(1, 300_000))?;
    let mut cmd = Command::new(BIN);
    cmd.args(["copy", "--no-progress", "--json"])
        .arg(&src)
        .arg(tmp.path().join("dst"));
    let out = run(cmd, COPY_TIMEOUT)?;
    out.expect_code(0)?;
    let json = out.json()?;
    ensure!(num(&json, "verified") == 2, "both files verified: {json}");
    Ok(())
}

#[test]
fn json_summary_counts_match_the_tree() -> Result<()> {
    let tmp = tempdir()?;
    let src = tmp.path().join("src");
    mkdir(&src.join("d1/d2"))?;
    let sizes = [0usize, 1, 4096, 100_000, 3 << 20];
    for (i, n) in sizes.iter().enumerate() {
        write(&src.join(format!("d1/f{i}")), &pattern(i as u64, *n))?;
    }
    std::fs::hard_link(src.join("d1/f3"), src.join("d1/d2/f3_again"))?;
    symlink("f1", &src.join("d1/l1"))?;
    symlink("/nonexistent", &src.join("l2"))?;
    symlink("d1", &src.join("l3"))?;
    mkfifo(&src.join("fifo"), 0o644)?;
    let json = copy_ok([&src, &tmp.path().join("dst")])?;
    let total: u64 = sizes.iter().map(|&n| n as u64).sum();
    for field in [
        "ok",
        "files",
        "dirs",
        "symlinks",
        "specials",
        "hardlinks",
        "skipped",
        "verified",
        "bytes",
        "bytes_reflinked",
        "bytes_copy_file_range",
        "bytes_read_write",
        "elapsed_seconds",
        "bytes_per_second",
        "failed",
        "failures",
        "aborted",
    ] {
        ensure!(json.get(field).is_some(), "summary lacks {field}: {json}");
    }
    let want = [
        ("files", 5),
        ("dirs", 3),
        ("symlinks", 3),
        ("specials", 1),
        ("hardlinks", 1),
        ("skipped", 0),
        ("verified", 0),
        ("bytes", total),
        ("failed", 0),
    ];
    for (field, n) in want {
        ensure!(num(&json, field) == n, "{field} should be {n}: {json}");
    }
    let moved = num(&json, "bytes_reflinked")
        + num(&json, "bytes_copy_file_range")
        + num(&json, "bytes_read_write");
    ensure!(
        moved == total,
        "bytes by strategy add up to {moved}, not {total}: {json}"
    );
    ensure!(
        json["failures"].as_array().is_some_and(|a| a.is_empty()) && json["aborted"].is_null(),
        "{json}"
    );
    ensure!(
        json["elapsed_seconds"].as_f64().is_some_and(|s| s >= 0.0),
        "{json}"
    );
    ensure!(
        json["bytes_per_second"].as_f64().is_some_and(|s| s >= 0.0),
        "{json}"
    );
    Ok(())
}

#[test]
fn unreadable_source_file_is_reported_permission_denied_and_the_rest_is_copied() -> Result<()> {
    let tmp = tempdir()?;
    let src = tmp.path().join("src");
    mkdir(&src.join("sub"))?;
    for p in ["a", "b", "sub/c", "sub/d"] {
        write(&src.join(p), p.as_bytes())?;
        chmod(&src.join(p), 0o644)?;
    }
    write(&src.join("sub/secret"), b"root only")?;
    chmod(&src.join("sub/secret"), 0o000)?;
    let out_dir = tmp.path().join("out");
    mkdir(&out_dir)?;
    lchown(&out_dir, 65534, 65534)?;
    let dst = out_dir.join("copy");
    let mut before = snapshot(&src)?;
    let Some(out) = copy_as_nobody(&[src.as_os_str(), dst.as_os_str()])? else {
        return Ok(());
    };
    out.expect_code(1)?;
    let f = failures(&out.json()?);
    ensure!(
        f == vec![("sub/secret".to_string(), "PermissionDenied".to_string())],
        "failures: {f:?}\n{out}"
    );
    ensure!(
        out.failure_lines()
            .iter()
            .any(|l| l.starts_with("failed [PermissionDenied]: sub/secret")),
        "stderr does not list the unreadable file:\n{out}"
    );
    before.entries.remove(b"sub/secret".as_slice());
    compare(
        &before,
        &dst,
        Check {
            owner: false,
            ..Check::default()
        },
    )?;
    Ok(())
}

#[test]
fn read_only_directories_and_files_are_copied_by_an_unprivileged_user() -> Result<()> {
    let tmp = tempdir()?;
    let src = tmp.path().join("src");
    mkdir(&src.join("ro/sub"))?;
    write(&src.join("ro/child"), b"child of a 0555 directory")?;
    write(&src.join("ro/sub/grandchild"), b"grandchild")?;
    write(&src.join("readonly_with_xattr"), b"0444 with a user xattr")?;
    set_xattr(&src.join("readonly_with_xattr"), "user.note", b"kept")?;
    chmod(&src.join("readonly_with_xattr"), 0o444)?;
    chmod(&src.join("ro/sub"), 0o555)?;
    chmod(&src.join("ro"), 0o555)?;
    let out_dir = tmp.path().join("out");
    mkdir(&out_dir)?;
    lchown(&out_dir, 65534, 65534)?;
    let dst = out_dir.join("copy");
    let before = snapshot(&src)?;
    let Some(out) = copy_as_nobody(&[src.as_os_str(), dst.as_os_str()])? else {
        return Ok(());
    };
    out.expect_code(0)?;
    compare(
        &before,
        &dst,
        Check {
            owner: false,
            ..Check::default()
        },
    )?;
    Ok(())
}

#[test]
fn type_conflicts_when_merging_are_reported_and_the_existing_entries_kept() -> Result<()> {
    let tmp = tempdir()?;
    let src = tmp.path().join("src");
    mkdir(&src.join("x"))?;
    write(&src.join("x/inside"), b"source dir x")?;
    write(&src.join("y"), b"source file y")?;
    write(&src.join("z"), b"no conflict")?;
    let dst = tmp.path().join("dst");
    mkdir(&dst.join("y"))?;
    write(&dst.join("x"), b"destination file x")?;
    write(&dst.join("y/kept"), b"destination dir y")?;
    let out = copy([
        "--json".as_ref(),
        "--overwrite".as_ref(),
        "always".as_ref(),
        src.as_os_str(),
        dst.as_os_str(),
    ])?;
    out.expect_code(1)?;
    let mut f = failures(&out.json()?);
    f.sort();
    let want = vec![
        ("x".to_string(), "DestinationConflict".to_string()),
        ("y".to_string(), "DestinationConflict".to_string()),
    ];
    ensure!(f == want, "failures: {f:?}\n{out}");
    ensure!(read(&dst.join("x"))? == b"destination file x");
    ensure!(read(&dst.join("y/kept"))? == b"destination dir y");
    ensure!(read(&dst.join("z"))? == b"no conflict");
    ensure!(staging_leftovers(&dst)?.is_empty());
    Ok(())
}

#[test]
fn rerun_with_if_changed_skips_everything_already_copied() -> Result<()> {
    let tmp = tempdir()?;
    let src = tmp.path().join("src");
    mkdir(&src.join("a/b"))?;
    for i in 0..50u64 {
        write(
            &src.join(format!("a/b/f{i}")),
            &pattern(i, 1000 + i as usize),
        )?;
    }
    write(&src.join("top"), b"top")?;
    // Taken before the first copy: that copy reads the source and moves its atimes.
    let before = snapshot(&src)?;
    let dst = tmp.path().join("dst");
    copy_ok([&src, &dst])?;
    compare(&before, &dst, Check::default())?;
    let json = copy_ok([
        "--overwrite".as_ref(),
        "if-changed".as_ref(),
        src.as_os_str(),
        dst.as_os_str(),
    ])?;
    ensure!(
        num(&json, "skipped") == 51,
        "finished files were not skipped: {json}"
    );
    let moved = num(&json, "bytes_reflinked")
        + num(&json, "bytes_copy_file_range")
        + num(&json, "bytes_read_write");
    ensure!(
        moved == 0 && num(&json, "files") == 0,
        "finished files were copied again: {json}"
    );
    compare(&before, &dst, Check::default())?;
    Ok(())
}

#[test]
fn rerun_with_if_changed_over_a_complete_copy_leaves_it_identical_to_the_source() -> Result<()> {
    let tmp = tempdir()?;
    let src = tmp.path().join("src");
    mkdir(&src.join("sub"))?;
    write(&src.join("sub/file"), b"file")?;
    symlink("file", &src.join("sub/link"))?;
    mkfifo(&src.join("sub/fifo"), 0o600)?;
    set_times(&src.join("sub"), (1_400_000_000, 1), (1_300_000_000, 2))?;
    set_times(&src, (1_400_000_000, 3), (1_300_000_000, 4))?;
    let before = snapshot(&src)?;
    let dst = tmp.path().join("dst");
    copy_ok([&src, &dst])?;
    compare(&before, &dst, Check::default())?;
    let json = copy_ok([
        "--overwrite".as_ref(),
        "if-changed".as_ref(),
        src.as_os_str(),
        dst.as_os_str(),
    ])?;
    // Replacing the link and the FIFO is allowed; leaving their directory with another
    // mtime than the source's is not: the copy is no longer faithful.
    compare(&before, &dst, Check::default())
        .with_context(|| format!("after the re-run ({json})"))?;
    Ok(())
}

#[test]
fn after_a_full_destination_a_rerun_with_if_changed_finishes_a_faithful_copy() -> Result<()> {
    if !require_root("mounting a small tmpfs") {
        return Ok(());
    }
    let tmp = tempdir()?;
    let src = tmp.path().join("src");
    more_than_a_megabyte(&src)?;
    chmod(&src, 0o750)?;
    let before = snapshot(&src)?;
    let mnt = Mount::tmpfs(&tmp.path().join("mnt"), "1m")?;
    let dst = mnt.dir.join("dst");
    let first = copy(["--json".as_ref(), src.as_os_str(), dst.as_os_str()])?;
    first.expect_code(1)?;
    ensure!(
        first.stderr.contains("--overwrite if-changed"),
        "the message does not say how to finish:\n{first}"
    );
    mnt.resize("64m")?;
    copy_ok([
        "--overwrite".as_ref(),
        "if-changed".as_ref(),
        src.as_os_str(),
        dst.as_os_str(),
    ])?;
    // atime is left out: the first run read some sources, moving their atimes, and the
    // second run copies what it finds.
    let check = Check {
        atime: false,
        ..Check::default()
    };
    compare(&before, &dst, check).context("the resumed copy is not the copy a single run makes")?;
    Ok(())
}

#[test]
fn include_and_exclude_flags_select_what_is_copied_and_a_bad_pattern_exits_2() -> Result<()> {
    let tmp = tempdir()?;
    let src = tmp.path().join("src");
    mkdir(&src)?;
    mkdir(&src.join("cache"))?;
    for f in ["a.csv", "b.txt", "cache/c.csv", ".d.csv"] {
        std::fs::write(src.join(f), f)?;
    }
    let dst = tmp.path().join("dst");
    let out = copy([
        "--json".as_ref(),
        "--include".as_ref(),
        "*.csv".as_ref(),
        "--exclude".as_ref(),
        "cache/".as_ref(),
        "--exclude".as_ref(),
        ".*".as_ref(),
        src.as_os_str(),
        dst.as_os_str(),
    ])?;
    out.expect_code(0)?;
    ensure!(num(&out.json()?, "files") == 1, "{out}");
    let mut names: Vec<_> = std::fs::read_dir(&dst)?
        .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect::<Result<_, _>>()?;
    names.sort();
    ensure!(names == ["a.csv"], "copied {names:?}");

    let out = copy([
        "--exclude".as_ref(),
        "#notes".as_ref(),
        src.as_os_str(),
        tmp.path().join("bad").as_os_str(),
    ])?;
    out.expect_code(2)?;
    ensure!(
        out.stderr
            .contains("--exclude: pattern \"#notes\" would be a comment"),
        "{out}"
    );
    ensure!(!tmp.path().join("bad").exists());
    Ok(())
}

#[test]
fn delete_mirrors_the_source_and_keeps_what_exclude_leaves_out() -> Result<()> {
    let tmp = tempdir()?;
    let (src, dst) = (tmp.path().join("src"), tmp.path().join("dst"));
    for d in [&src, &dst] {
        mkdir(d)?;
        std::fs::write(d.join("same"), "same")?;
    }
    std::fs::write(dst.join("extra"), "not in src")?;
    std::fs::write(dst.join("mine.local"), "excluded")?;
    mkdir(&dst.join("gone"))?;
    std::fs::write(dst.join("gone/f"), "f")?;
    let run = |extra: &[&str]| {
        let mut args: Vec<&std::ffi::OsStr> = vec![
            "--json".as_ref(),
            "--overwrite".as_ref(),
            "if-changed".as_ref(),
        ];
        args.extend(extra.iter().map(std::ffi::OsStr::new));
        args.extend([src.as_os_str(), dst.as_os_str()]);
        copy(args)
    };
    let out = run(&["--delete", "--exclude", "*.local"])?;
    out.expect_code(0)?;
    ensure!(num(&out.json()?, "deleted") == 3, "{out}");
    ensure!(!dst.join("extra").exists() && !dst.join("gone").exists());
    ensure!(dst.join("mine.local").exists() && dst.join("same").exists());
    // --delete-excluded: the excluded entry goes too; it needs --delete.
    let out = run(&["--delete", "--delete-excluded", "--exclude", "*.local"])?;
    out.expect_code(0)?;
    ensure!(
        num(&out.json()?, "deleted") == 1 && !dst.join("mine.local").exists(),
        "{out}"
    );
    run(&["--delete-excluded"])?.expect_code(2)?;
    Ok(())
}

#[test]
fn compare_checksum_without_overwrite_if_changed_exits_2() -> Result<()> {
    let tmp = tempdir()?;
    let src = tmp.path().join("src");
    mkdir(&src)?;
    let out = copy([
        "--compare".as_ref(),
        "checksum".as_ref(),
        src.as_os_str(),
        tmp.path().join("dst").as_os_str(),
    ])?;
    out.expect_code(2)?;
    ensure!(out.stderr.contains("add --overwrite if-changed"), "{out}");
    ensure!(!tmp.path().join("dst").exists());
    Ok(())
}

#[test]
fn rerun_with_records_lists_the_files_it_keeps_in_its_manifest() -> Result<()> {
    let tmp = tempdir()?;
    let src = tmp.path().join("src");
    mkdir(&src.join("a"))?;
    for i in 0..30u64 {
        write(&src.join(format!("a/f{i}")), &pattern(i, 100 + i as usize))?;
    }
    let (dst, records) = (tmp.path().join("dst"), tmp.path().join("records"));
    let run = |manifest: &Path| {
        copy_ok([
            "--overwrite".as_ref(),
            "if-changed".as_ref(),
            "--manifest".as_ref(),
            manifest.as_os_str(),
            "--records".as_ref(),
            records.as_os_str(),
            src.as_os_str(),
            dst.as_os_str(),
        ])
    };
    let first = run(&tmp.path().join("m1"))?;
    ensure!(num(&first, "files") == 30, "{first}");
    write(&src.join("a/f4"), b"changed")?;
    let second = run(&tmp.path().join("m2"))?;
    ensure!(
        num(&second, "files") == 1
            && num(&second, "listed_from_records") == 29
            && num(&second, "unlisted") == 0,
        "{second}"
    );
    let lines = std::fs::read_to_string(tmp.path().join("m2"))?;
    ensure!(lines.lines().count() == 30, "{lines}");
    if which("xxh128sum").is_some() {
        let check = Command::new("xxh128sum")
            .args(["--quiet", "-c"])
            .arg(tmp.path().join("m2"))
            .current_dir(&dst)
            .status()?;
        ensure!(check.success(), "the re-run's manifest does not check");
    }
    // Without the records, the kept files are counted, not listed.
    let third = copy_ok([
        "--overwrite".as_ref(),
        "if-changed".as_ref(),
        "--manifest".as_ref(),
        tmp.path().join("m3").as_os_str(),
        src.as_os_str(),
        dst.as_os_str(),
    ])?;
    ensure!(num(&third, "unlisted") == 30, "{third}");
    // --records alone is refused: it records manifest lines.
    let out = Command::new(env!("CARGO_BIN_EXE_ferry-agent"))
        .args(["copy", "--records"])
        .arg(&records)
        .arg(&src)
        .arg(tmp.path().join("dst2"))
        .output()?;
    ensure!(out.status.code() == Some(2), "{out:?}");
    Ok(())
}
