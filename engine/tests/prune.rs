//! Mirroring (`prune`): what the destination has and the source lacks is removed, beneath
//! the destination only, never through a link, never Ferry's state or staging names, never
//! what the filter leaves out unless asked; a dry run names and counts without removing; a
//! removal that fails is listed and the rest goes on.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use anyhow::{ensure, Result};
use common::*;
use ferry_engine::{prune, Filter, PruneOptions};

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

/// Source: a/f, a/b/g, keep.txt. Destination: those, plus extraneous entries of every kind,
/// planted symlinks to `outside`, Ferry's state and a staging name.
fn fixture(base: &Path) -> Result<(PathBuf, PathBuf, PathBuf)> {
    let (src, dst, outside) = (base.join("src"), base.join("dst"), base.join("outside"));
    for root in [&src, &dst] {
        std::fs::create_dir_all(root.join("a/b"))?;
        write(&root.join("a/f"), b"f")?;
        write(&root.join("a/b/g"), b"g")?;
        write(&root.join("keep.txt"), b"k")?;
    }
    // Outside the destination: must survive whatever the links say.
    mkdir(&outside)?;
    write(&outside.join("precious"), b"p")?;
    // Extraneous: a file, a nested directory with a link to outside, a symlink to outside,
    // a dangling symlink, a FIFO.
    write(&dst.join("old.txt"), b"o")?;
    std::fs::create_dir_all(dst.join("gone/deeper"))?;
    write(&dst.join("gone/deeper/x"), b"x")?;
    symlink(&outside, &dst.join("gone/to-outside"))?;
    symlink(&outside, &dst.join("a/outlink"))?;
    symlink("nowhere", &dst.join("a/b/dangling"))?;
    mkfifo(&dst.join("a/pipe"), 0o644)?;
    // The source has `linked` as a directory; the destination a symlink to outside there:
    // a conflict the copy reported, left as it is, never entered.
    mkdir(&src.join("linked"))?;
    write(&src.join("linked/inner"), b"i")?;
    symlink(&outside, &dst.join("linked"))?;
    // Ferry's own: the state directory at the top, a staging name anywhere.
    mkdir(&dst.join(".ferry"))?;
    write(&dst.join(".ferry/job.xxh128"), b"manifest")?;
    write(&dst.join("a/.ferry-abc123-7.tmp"), b"being written")?;
    Ok((src, dst, outside))
}

fn opts() -> PruneOptions {
    PruneOptions {
        reserved_top: Some(c".ferry".to_owned()),
        ..PruneOptions::default()
    }
}

#[test]
fn what_the_source_lacks_is_removed_and_nothing_outside_or_of_ferrys_is_touched() -> Result<()> {
    let tmp = tempdir()?;
    let (src, dst, outside) = fixture(tmp.path())?;
    // A dry run first: it names and counts what the real run removes, and removes nothing.
    let before = names_beneath(&dst)?;
    let dry = prune(
        &src,
        &dst,
        &PruneOptions {
            dry_run: true,
            ..opts()
        },
    )?;
    ensure!(
        names_beneath(&dst)? == before,
        "a dry run removed something"
    );
    let real = prune(&src, &dst, &opts())?;
    ensure!(real.failures.is_empty(), "{:?}", real.failures);
    ensure!(
        names_beneath(&dst)?
            == set(&[
                ".ferry/",
                ".ferry/job.xxh128",
                "a/",
                "a/.ferry-abc123-7.tmp",
                "a/b/",
                "a/b/g",
                "a/f",
                "keep.txt",
                "linked",
            ]),
        "left {:#?}",
        names_beneath(&dst)?
    );
    // old.txt, gone/ (+ deeper/, x, to-outside), a/outlink, a/pipe, a/b/dangling.
    ensure!(real.deleted == 8, "deleted {}", real.deleted);
    ensure!(
        dry.deleted == real.deleted,
        "dry run counted {}",
        dry.deleted
    );
    let listed: BTreeSet<String> = dry
        .listed
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    ensure!(
        listed == set(&["old.txt", "gone/", "a/outlink", "a/pipe", "a/b/dangling"]),
        "dry run listed {listed:?}"
    );
    ensure!(
        names_beneath(&outside)? == set(&["precious"]),
        "outside changed"
    );
    ensure!(std::fs::read(outside.join("precious"))? == b"p");
    Ok(())
}

#[test]
fn excluded_entries_are_kept_unless_delete_excluded() -> Result<()> {
    let tmp = tempdir()?;
    let (src, dst, _) = fixture(tmp.path())?;
    let filter = Filter::new(&[], &["old.txt".into(), "gone/".into(), "keep.txt".into()])?;
    let kept = prune(
        &src,
        &dst,
        &PruneOptions {
            filter: filter.clone(),
            ..opts()
        },
    )?;
    ensure!(kept.failures.is_empty(), "{:?}", kept.failures);
    let left = names_beneath(&dst)?;
    ensure!(
        left.contains("old.txt") && left.contains("gone/deeper/x") && left.contains("keep.txt"),
        "an excluded entry was removed: {left:#?}"
    );
    ensure!(
        !left.contains("a/outlink"),
        "a selected extraneous entry was kept"
    );
    // With delete_excluded, excluded entries go, even one the source has (keep.txt).
    let all = prune(
        &src,
        &dst,
        &PruneOptions {
            filter,
            delete_excluded: true,
            ..opts()
        },
    )?;
    ensure!(all.failures.is_empty(), "{:?}", all.failures);
    let left = names_beneath(&dst)?;
    ensure!(
        !left.contains("old.txt") && !left.contains("gone/") && !left.contains("keep.txt"),
        "{left:#?}"
    );
    ensure!(left.contains("a/f") && left.contains(".ferry/"));
    Ok(())
}

#[test]
fn a_removal_that_fails_is_listed_and_the_rest_is_removed() -> Result<()> {
    if !require_root("a read-only bind mount inside the destination") {
        return Ok(());
    }
    let tmp = tempdir()?;
    let (src, dst, _) = fixture(tmp.path())?;
    // `ro/` is extraneous and a read-only mount: what is in it cannot be removed.
    let ro = dst.join("ro");
    mkdir(&ro)?;
    write(&ro.join("stuck"), b"s")?;
    sh(
        "mount",
        &["--bind".as_ref(), ro.as_os_str(), ro.as_os_str()],
    )?;
    let remount = sh(
        "mount",
        &["-o".as_ref(), "remount,bind,ro".as_ref(), ro.as_os_str()],
    );
    let result = remount.and_then(|_| Ok(prune(&src, &dst, &opts())?));
    let _ = sh("umount", &["-l".as_ref(), ro.as_os_str()]);
    let out = result?;
    ensure!(out.failed >= 1, "no failure: {out:?}");
    ensure!(
        out.failures
            .iter()
            .any(|f| f.path == Path::new("ro/stuck") && f.op == "remove"),
        "{:?}",
        out.failures
    );
    ensure!(!dst.join("old.txt").exists() && !dst.join("gone").exists());
    Ok(())
}

#[test]
fn a_mirror_leaves_the_destination_directories_atimes_as_the_copy_gave_them() -> Result<()> {
    // The final sync of a claim migration mirrors a tree the copy has just given its times:
    // its listing of each directory must not move them.
    let tmp = tempdir()?;
    let (src, dst) = (tmp.path().join("src"), tmp.path().join("dst"));
    for root in [&src, &dst] {
        std::fs::create_dir_all(root.join("k/sub"))?;
        write(&root.join("k/sub/f"), b"f")?;
    }
    let old = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000_000);
    for dir in ["k", "k/sub"] {
        std::fs::File::open(dst.join(dir))?.set_times(
            std::fs::FileTimes::new()
                .set_accessed(old)
                .set_modified(old),
        )?;
    }
    prune(&src, &dst, &opts())?;
    for dir in ["k", "k/sub"] {
        let atime = std::fs::metadata(dst.join(dir))?.accessed()?;
        ensure!(atime == old, "{dir}: atime moved to {atime:?}");
    }
    Ok(())
}
