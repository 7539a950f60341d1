//! include/exclude in the engine's walk and plan (gitignore syntax; `ferry_crds::filter`):
//! what is selected is copied, counted and listed in the manifest, and nothing else; an
//! excluded directory is not entered; names with glob metacharacters, dotfiles, hard links
//! whose names a filter splits, a filter that excludes everything, and a split copy.

mod common;

use std::collections::BTreeSet;
use std::os::unix::fs::MetadataExt;

use anyhow::{ensure, Result};
use common::*;
use ferry_engine::{Filter, NoProgress, Options, Part, Verify};

fn filter(include: &[&str], exclude: &[&str]) -> Filter {
    let s = |v: &[&str]| v.iter().map(|p| p.to_string()).collect::<Vec<_>>();
    Filter::new(&s(include), &s(exclude)).expect("valid patterns")
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

#[test]
fn include_and_exclude_select_what_they_say_and_plan_and_manifest_count_only_that() -> Result<()> {
    let tmp = tempdir()?;
    let src = tmp.path().join("src");
    for d in [
        "data/deep",
        "cache",
        "x/cache",
        "keep/sub",
        ".hidden",
        "empty",
    ] {
        std::fs::create_dir_all(src.join(d))?;
    }
    for (f, body) in [
        ("a.csv", "a"),
        ("a.txt", "at"),
        (".env", "secret"),
        (".hidden/x.csv", "hidden"),
        ("data/b.csv", "bb"),
        ("data/deep/c.csv", "ccc"),
        ("data/deep/c.txt", "no"),
        ("cache/big.csv", "cached"),
        ("x/cache/y.csv", "cached too"),
        ("keep/notes.txt", "kept"),
        ("keep/sub/more.bin", "kept too"),
        ("[draft] *?.txt", "brackets"),
        ("[draft]", "not a match: nothing after ]"),
        ("star*name", "a star"),
    ] {
        write(&src.join(f), body.as_bytes())?;
    }
    write(&bytes_path(&src, b"\xff\xfe.csv"), b"not utf-8")?;
    symlink("a.txt", &src.join("link.csv"))?;
    mkfifo(&src.join("pipe.csv"), 0o644)?;
    let f = filter(
        &["*.csv", "keep/", "\\[draft\\]?*", "star\\*name"],
        &["cache/", ".*", "!.env"],
    );
    let dst = tmp.path().join("dst");
    let manifest = tmp.path().join("manifest.xxh128");
    let opts = Options {
        filter: f.clone(),
        verify: Verify::Checksum,
        manifest: Some(manifest.clone()),
        ..Options::default()
    };
    let s = ferry_engine::copy(&src, &dst, &opts, &NoProgress)?;
    ensure!(s.failures.is_empty(), "{:?}", s.failures);
    let copied = names_beneath(&dst)?;
    let want = set(&[
        "a.csv",
        "data/",
        "data/b.csv",
        "data/deep/",
        "data/deep/c.csv",
        // Walked and made although nothing in them is selected (rsync's --include='*/').
        "empty/",
        "x/",
        "keep/",
        "keep/notes.txt",
        "keep/sub/",
        "keep/sub/more.bin",
        "[draft] *?.txt",
        "star*name",
        "\u{fffd}\u{fffd}.csv",
        "link.csv",
        "pipe.csv",
    ]);
    // Not .env: `!.env` takes back `.*` in exclude, but include does not select it.
    ensure!(copied == want, "copied {copied:#?}\nwant {want:#?}");
    ensure!(
        std::fs::read(dst.join("data/deep/c.csv"))? == b"ccc",
        "contents"
    );
    // What the plan counts is what was copied; the manifest lists exactly those files.
    let plan = ferry_engine::plan_part(&src, Part::All, true, &f)?;
    ensure!(
        plan.files == s.files && plan.bytes == s.bytes && plan.dirs == s.dirs,
        "plan {plan:?} vs summary files {} bytes {} dirs {}",
        s.files,
        s.bytes,
        s.dirs
    );
    ensure!(s.files == 8 && s.symlinks == 1 && s.specials == 1, "{s:?}");
    // (Bytes: one name is not UTF-8.)
    let text = String::from_utf8_lossy(&std::fs::read(&manifest)?).into_owned();
    let lines: Vec<&str> = text.lines().collect();
    ensure!(lines.len() as u64 == s.files, "manifest {lines:#?}");
    ensure!(
        !lines
            .iter()
            .any(|l| l.contains("cache") || l.ends_with("a.txt") || l.contains(".env")),
        "{lines:#?}"
    );
    Ok(())
}

#[test]
fn an_excluded_directory_is_not_entered() -> Result<()> {
    // The FUSE tree of the I/O-error tests: reading `bad-0` (top) or `sub/bad-1` fails.
    let tmp = tempdir()?;
    let Some((_base, mnt)) = eio_source(tmp.path())? else {
        return Ok(());
    };
    let out = tempdir()?;
    let all = ferry_engine::copy(
        &mnt.dir,
        &out.path().join("all"),
        &Options::default(),
        &NoProgress,
    )?;
    ensure!(
        all.failures.len() == 2,
        "an unfiltered copy should fail both bad files: {:?}",
        all.failures
    );
    // `/bad-0` is anchored: only `sub/` being left unentered keeps `sub/bad-1` unread.
    let opts = Options {
        filter: filter(&[], &["sub/", "/bad-0"]),
        ..Options::default()
    };
    let s = ferry_engine::copy(&mnt.dir, &out.path().join("filtered"), &opts, &NoProgress)?;
    ensure!(
        s.failures.is_empty(),
        "excluded, yet read: {:?}",
        s.failures
    );
    ensure!(!out.path().join("filtered/sub").exists());
    Ok(())
}

#[test]
fn hard_links_whose_names_a_filter_splits_stay_linked_among_the_selected() -> Result<()> {
    let tmp = tempdir()?;
    let src = tmp.path().join("src");
    for d in ["a", "b", "c"] {
        mkdir(&src.join(d))?;
    }
    write(&src.join("a/f"), b"linked")?;
    std::fs::hard_link(src.join("a/f"), src.join("b/f"))?;
    std::fs::hard_link(src.join("a/f"), src.join("c/f"))?;
    // Two of three names selected: one file, one link, linked to each other.
    let dst = tmp.path().join("two");
    let opts = Options {
        filter: filter(&[], &["b/"]),
        ..Options::default()
    };
    let s = ferry_engine::copy(&src, &dst, &opts, &NoProgress)?;
    ensure!(s.failures.is_empty(), "{:?}", s.failures);
    ensure!(!dst.join("b").exists(), "b was copied");
    let (a, c) = (
        std::fs::metadata(dst.join("a/f"))?,
        std::fs::metadata(dst.join("c/f"))?,
    );
    ensure!(
        a.ino() == c.ino() && a.nlink() == 2,
        "a/f and c/f not linked"
    );
    ensure!(s.files == 1 && s.hardlinks == 1, "{s:?}");
    let plan = ferry_engine::plan_part(&src, Part::All, true, &opts.filter)?;
    ensure!(plan.files == 1, "plan {plan:?}");
    // One name selected: a plain file.
    let dst = tmp.path().join("one");
    let opts = Options {
        filter: filter(&["a/"], &[]),
        ..Options::default()
    };
    let s = ferry_engine::copy(&src, &dst, &opts, &NoProgress)?;
    ensure!(s.failures.is_empty(), "{:?}", s.failures);
    ensure!(std::fs::metadata(dst.join("a/f"))?.nlink() == 1);
    ensure!(names_beneath(&dst)? == set(&["a/", "a/f", "b/", "c/"]));
    Ok(())
}

#[test]
fn a_filter_that_excludes_everything_copies_an_empty_top_directory() -> Result<()> {
    let tmp = tempdir()?;
    let src = tmp.path().join("src");
    mkdir(&src.join("d"))?;
    write(&src.join("d/f"), b"x")?;
    write(&src.join("g"), b"y")?;
    let dst = tmp.path().join("dst");
    let opts = Options {
        filter: filter(&[], &["*"]),
        ..Options::default()
    };
    let s = ferry_engine::copy(&src, &dst, &opts, &NoProgress)?;
    ensure!(
        s.failures.is_empty() && s.files == 0 && s.dirs == 1,
        "{s:?}"
    );
    ensure!(
        names_beneath(&dst)?.is_empty(),
        "{:?}",
        names_beneath(&dst)?
    );
    let plan = ferry_engine::plan_part(&src, Part::All, true, &opts.filter)?;
    ensure!(
        plan.files == 0 && plan.bytes == 0 && plan.dirs == 1,
        "{plan:?}"
    );
    Ok(())
}

#[test]
fn the_parts_of_a_split_copy_with_a_filter_copy_the_selection_once() -> Result<()> {
    let tmp = tempdir()?;
    let src = tmp.path().join("src");
    for d in 0..6 {
        mkdir(&src.join(format!("d{d}")))?;
        for f in 0..20 {
            let ext = if f % 3 == 0 { "log" } else { "dat" };
            write(
                &src.join(format!("d{d}/f{f}.{ext}")),
                format!("{d}-{f}").as_bytes(),
            )?;
        }
    }
    let f = filter(&[], &["*.log", "d5/"]);
    let dst = tmp.path().join("dst");
    let count = 3;
    let mut files = 0;
    for index in 0..count {
        let opts = Options {
            filter: f.clone(),
            select: Part::Slice { index, count },
            ..Options::default()
        };
        let s = ferry_engine::copy(&src, &dst, &opts, &NoProgress)?;
        ensure!(s.failures.is_empty(), "{:?}", s.failures);
        let plan = ferry_engine::plan_part(&src, Part::Slice { index, count }, true, &f)?;
        ensure!(
            plan.files == s.files,
            "part {index}: plan {plan:?}, copied {}",
            s.files
        );
        files += s.files;
    }
    let copied = names_beneath(&dst)?;
    ensure!(files == 5 * 13, "copied {files} files");
    ensure!(copied
        .iter()
        .all(|p| !p.ends_with(".log") && !p.starts_with("d5")));
    ensure!(copied.iter().filter(|p| p.ends_with(".dat")).count() == 5 * 13);
    Ok(())
}
