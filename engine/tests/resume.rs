//! Resuming an interrupted copy through the engine: staging entries of our tag are swept
//! while those of other tags (or a tenant's look-alikes) survive; a staging tag that could
//! match other names is refused; kept files the manifest lacks are listed only when they
//! equal the source; a full destination stops the copy cleanly and a resume after space is
//! freed finishes it. (Killing and resuming the real process: `agent/tests/copy_resume.rs`.)

mod common;

use std::collections::BTreeMap;

use anyhow::{ensure, Result};
use common::*;
use ferry_engine::{NoProgress, Options, Reason, Verify};

const TAG: &str = "5eed0fca11ed";

#[test]
fn leftover_staging_files_of_our_tag_are_removed_and_every_other_name_survives() -> Result<()> {
    let tmp = tempdir()?;
    let src = tmp.path().join("src");
    mkdir(&src.join("a"))?;
    write(&src.join("a/f"), b"data")?;
    let dst = tmp.path().join("dst");
    mkdir(&dst.join("a"))?;
    let ours = [".ferry-5eed0fca11ed-1f.tmp", ".ferry-5eed0fca11ed-20.tmp"];
    let theirs = [
        ".ferry-other-1.tmp",
        ".ferry-5eed0fca11edff-1.tmp",
        ".ferry-5eed0fca11ed-1f",
        "ferry-5eed0fca11ed-1.tmp",
    ];
    write(&dst.join("a").join(ours[0]), b"half a file")?;
    symlink("nowhere", &dst.join("a").join(ours[1]))?;
    mkfifo(&dst.join(ours[0]), 0o600)?;
    for name in theirs {
        write(&dst.join("a").join(name), b"a tenant's")?;
    }
    // A directory with our tag whose final name exists: not ours to remove.
    mkdir(&dst.join(".ferry-5eed0fca11ed-d0000000000000000.tmp"))?;
    let opts = Options {
        resume: true,
        staging_tag: Some(TAG.into()),
        ..unverified()
    };
    let s = ferry_engine::copy(&src, &dst, &opts, &NoProgress)?;
    ensure!(s.failures.is_empty(), "{:?}", s.failures);
    for name in ours {
        ensure!(
            dst.join("a").join(name).symlink_metadata().is_err(),
            "{name} was left"
        );
    }
    ensure!(
        dst.join(ours[0]).symlink_metadata().is_err(),
        "the FIFO was left"
    );
    for name in theirs {
        ensure!(
            std::fs::read(dst.join("a").join(name))? == b"a tenant's",
            "{name} was touched"
        );
    }
    ensure!(dst
        .join(".ferry-5eed0fca11ed-d0000000000000000.tmp")
        .is_dir());
    ensure!(std::fs::read(dst.join("a/f"))? == b"data");
    Ok(())
}

#[test]
fn a_staging_tag_that_could_match_other_names_is_refused_before_anything_is_made() -> Result<()> {
    let tmp = tempdir()?;
    let src = tmp.path().join("src");
    mkdir(&src)?;
    write(&src.join("f"), b"x")?;
    let dst = tmp.path().join("dst");
    for bad in ["", "a-b", "a/b", "x.tmp", &"f".repeat(33)] {
        let opts = Options {
            staging_tag: Some(bad.into()),
            ..unverified()
        };
        let r = ferry_engine::copy(&src, &dst, &opts, &NoProgress);
        ensure!(
            matches!(&r, Err(ferry_engine::Error::Usage(m)) if m.contains("staging tag")),
            "tag {bad:?}: {r:?}"
        );
        ensure!(
            std::fs::read_dir(tmp.path())?.count() == 1,
            "tag {bad:?} made something"
        );
    }
    Ok(())
}

#[test]
fn a_resume_lists_kept_files_its_manifest_lacks_only_when_they_equal_the_source() -> Result<()> {
    let tmp = tempdir()?;
    let src = tmp.path().join("src");
    mkdir(&src)?;
    for name in ["listed", "ours-unlisted", "tenants", "missing", "new\nline"] {
        write(&src.join(name), format!("source {name}").as_bytes())?;
    }
    let dst = tmp.path().join("dst");
    mkdir(&dst)?;
    let manifest = tmp.path().join("m.xxh128");
    // An earlier attempt committed "listed" and wrote its line; it also committed
    // "ours-unlisted" and "new\nline" but died before their lines reached the file (the
    // last one cut short). "tenants" was there before with other bytes.
    let first = Options {
        verify: Verify::Checksum,
        manifest: Some(manifest.clone()),
        ..Options::default()
    };
    ferry_engine::copy(&src.join("listed"), &dst, &first, &NoProgress)?;
    std::fs::copy(src.join("ours-unlisted"), dst.join("ours-unlisted"))?;
    std::fs::copy(src.join("new\nline"), dst.join("new\nline"))?;
    write(&dst.join("tenants"), b"tenant's own bytes")?;
    let mut text = std::fs::read(&manifest)?;
    text.extend_from_slice(b"0123456789abcdef01234567");
    std::fs::write(&manifest, &text)?;

    let opts = Options {
        verify: Verify::Checksum,
        manifest: Some(manifest.clone()),
        resume: true,
        ..Options::default()
    };
    let s = ferry_engine::copy(&src, &dst, &opts, &NoProgress)?;
    ensure!(s.failures.is_empty(), "{:?}", s.failures);
    ensure!(s.files == 1, "only \"missing\" is copied: {s:?}");
    ensure!(
        s.files_resumed == 3 && s.skipped == 4,
        "listed, ours-unlisted and new\\nline were the earlier attempt's, tenants not: {s:?}"
    );
    let listed = manifest_counts(&manifest)?;
    let expected: BTreeMap<Vec<u8>, usize> = [
        b"listed".to_vec(),
        b"ours-unlisted".to_vec(),
        b"missing".to_vec(),
    ]
    .into_iter()
    .map(|p| (p, 1))
    .collect();
    let plain: BTreeMap<Vec<u8>, usize> = listed
        .into_iter()
        .filter(|(p, _)| !p.contains(&b'\\'))
        .collect();
    ensure!(plain == expected, "manifest lists {plain:?}");
    let raw = std::fs::read(&manifest)?;
    ensure!(
        raw.split(|&b| b == b'\n')
            .filter(|l| l.starts_with(b"\\"))
            .count()
            == 1,
        "the name with a newline is listed once, escaped:\n{}",
        String::from_utf8_lossy(&raw)
    );
    ensure!(std::fs::read(dst.join("tenants"))? == b"tenant's own bytes");
    xxh128sum_check(&dst, &manifest)
}

#[test]
fn a_full_destination_stops_cleanly_and_a_resume_after_freeing_space_recopies_nothing() -> Result<()>
{
    if !require_root("mounting a small tmpfs") {
        return Ok(());
    }
    let tmp = tempdir()?;
    let src = tmp.path().join("src");
    more_than_a_megabyte(&src)?;
    let before = snapshot(&src)?;
    let mnt = Mount::tmpfs(&tmp.path().join("mnt"), "1m")?;
    let dst = mnt.dir.join("dst");
    let manifest = tmp.path().join("m.xxh128");
    let mut opts = Options {
        workers: 2,
        verify: Verify::Checksum,
        manifest: Some(manifest.clone()),
        staging_tag: Some(TAG.into()),
        ..Options::default()
    };
    let first = ferry_engine::copy(&src, &dst, &opts, &NoProgress)?;
    ensure!(
        first.aborted.as_deref().is_some_and(|a| a.contains("full")),
        "not aborted as full: {first:?}"
    );
    ensure!(
        first
            .failures
            .iter()
            .any(|f| f.kind == Reason::DestinationFull),
        "no NoSpace failure: {:?}",
        first.failures
    );
    ensure!(
        first.files > 0,
        "nothing fitted: the test needs some files committed"
    );
    // Every file under a final name is whole.
    let partial = snapshot(&dst)?;
    for (p, m) in &partial.entries {
        if m.kind == Kind::File {
            ensure!(
                read_rel(&dst, p)? == read_rel(&src, p)?,
                "{} is partial",
                show(p)
            );
        }
    }
    let present: BTreeMap<Vec<u8>, (u64, u64)> = partial
        .entries
        .iter()
        .filter(|(_, m)| m.kind == Kind::File)
        .map(|(p, m)| (p.clone(), m.inode))
        .collect();
    ensure!(present.len() as u64 == first.files);

    mnt.resize("64m")?;
    opts.resume = true;
    let second = ferry_engine::copy(&src, &dst, &opts, &NoProgress)?;
    ensure!(
        second.failures.is_empty() && second.aborted.is_none(),
        "{second:?}"
    );
    ensure!(
        second.files_resumed == first.files && second.files + first.files == 16,
        "{second:?}"
    );
    let got = compare(
        &before,
        &dst,
        Check {
            atime: false,
            ..Check::default()
        },
    )?;
    for (p, inode) in &present {
        ensure!(
            got.get(p).map(|m| m.inode) == Some(*inode),
            "{} was copied again",
            show(p)
        );
    }
    let mut leftovers = Vec::new();
    ferry_names(&mnt.dir, &mut leftovers)?;
    ensure!(leftovers.is_empty(), "staging names left: {leftovers:?}");
    let listed = manifest_counts(&manifest)?;
    ensure!(
        listed.len() == 16 && listed.values().all(|&n| n == 1),
        "{listed:?}"
    );
    Ok(())
}
