//! Descriptors by tree shape (issue 19, item 11): a copy's open descriptors are bounded
//! independently of the tree's depth and of how many directories hold hard-link leaders.
//! Its own test binary, because RLIMIT_NOFILE is process-wide (as `fd_limit.rs`); the tests
//! take turns, so each copy has the whole budget.

// Raw libc calls here: setrlimit, to give the copy few fds, and a remover for chains deeper
// than std's `remove_dir_all` can take with few fds.
#![allow(unsafe_code)]

mod common;

use std::ffi::CStr;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::Path;
use std::sync::Mutex;

use anyhow::{ensure, Context, Result};
use common::*;
use ferry_engine::{NoProgress, Options};

static TURN: Mutex<()> = Mutex::new(());

/// Soft and hard, so the engine cannot raise it back. Idempotent: every test sets the same.
fn limit_descriptors(n: u64) -> Result<()> {
    let lim = libc::rlimit {
        rlim_cur: n,
        rlim_max: n,
    };
    // SAFETY: setrlimit reads an initialised struct; only this test binary is affected.
    ensure!(
        unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } == 0,
        "setrlimit: {}",
        std::io::Error::last_os_error()
    );
    Ok(())
}

const LIMIT: u64 = 64;

/// Remove a chain made by `build_deep_tree` with a few descriptors: move each grandchild up
/// into the top, then empty and remove the child it was in (std's `remove_dir_all` holds a
/// descriptor per level).
fn remove_chain(top: &Path, name: &CStr) -> Result<()> {
    let dir_flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW;
    let top_fd = open_dir(top)?;
    let moved = c"moved-up";
    loop {
        let child: OwnedFd = match openat(top_fd.as_fd(), name, dir_flags, 0) {
            Ok(fd) => fd,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(()),
            Err(e) => return Err(e).context("open chain"),
        };
        // SAFETY: live descriptors and NUL-terminated names, for the calls below.
        let up = unsafe {
            libc::renameat(
                child.as_raw_fd(),
                name.as_ptr(),
                top_fd.as_raw_fd(),
                moved.as_ptr(),
            )
        };
        let has_grandchild = up == 0;
        for entry in list_dir(child.as_fd())? {
            // SAFETY: as above.
            let is_dir = unsafe {
                libc::unlinkat(child.as_raw_fd(), entry.as_ptr(), 0) != 0
                    && libc::unlinkat(child.as_raw_fd(), entry.as_ptr(), libc::AT_REMOVEDIR) != 0
            };
            ensure!(!is_dir, "cannot remove {entry:?}");
        }
        drop(child);
        // SAFETY: as above.
        unsafe {
            ensure!(
                libc::unlinkat(top_fd.as_raw_fd(), name.as_ptr(), libc::AT_REMOVEDIR) == 0,
                "rmdir: {}",
                std::io::Error::last_os_error()
            );
            if has_grandchild {
                ensure!(
                    libc::renameat(
                        top_fd.as_raw_fd(),
                        moved.as_ptr(),
                        top_fd.as_raw_fd(),
                        name.as_ptr()
                    ) == 0,
                    "rename: {}",
                    std::io::Error::last_os_error()
                );
            }
        }
    }
}

/// Open every level of a chain in the source and its copy side by side, comparing the bytes
/// of each level's file; a few descriptors at a time.
fn check_chain(src: &Path, dst: &Path, name: &CStr, depth: usize) -> Result<()> {
    let dir_flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW;
    let (mut s, mut d) = (open_dir(src)?, open_dir(dst)?);
    for level in 0..depth {
        s = openat(s.as_fd(), name, dir_flags, 0)?;
        d = openat(d.as_fd(), name, dir_flags, 0)
            .with_context(|| format!("copy lacks level {level}"))?;
        let (sf, df) = (
            openat(s.as_fd(), c"f", libc::O_RDONLY, 0)?,
            openat(d.as_fd(), c"f", libc::O_RDONLY, 0)
                .with_context(|| format!("copy lacks level {level}'s file"))?,
        );
        compare_files(sf, df).with_context(|| format!("level {level}"))?;
        ensure!(
            list_dir(d.as_fd())?.len() == list_dir(s.as_fd())?.len(),
            "level {level}: extra or missing entries"
        );
    }
    Ok(())
}

#[test]
fn a_chain_of_1000_directories_with_255_byte_names_copies_under_a_64_descriptor_limit() -> Result<()>
{
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = shm_tempdir().map_or_else(tempdir, Ok)?;
    let src = tmp.path().join("src");
    let dst = tmp.path().join("dst");
    mkdir(&src)?;
    let name = [b'x'; 255];
    let depth = 1000;
    build_deep_tree(&src, &name, depth)?;
    limit_descriptors(LIMIT)?;
    let opts = Options {
        workers: 4,
        ..unverified()
    };
    let result = ferry_engine::copy(&src, &dst, &opts, &NoProgress);
    let checked = result.map_err(anyhow::Error::from).and_then(|s| {
        ensure!(
            s.failed == 0,
            "{} failures under the descriptor limit, e.g. {:?}",
            s.failed,
            s.failures.first().map(|f| (f.op, &f.message))
        );
        ensure!(s.files == depth as u64, "{s:?}");
        check_chain(&src, &dst, &cname(&name), depth)
    });
    let n = cname(&name);
    remove_chain(&src, &n)?;
    if dst.exists() {
        remove_chain(&dst, &n)?;
    }
    checked
}

/// Every pair is one inode in the copy, with its source's bytes, and no two pairs share one.
/// By path and one file at a time: `compare` holds a descriptor per pending directory.
fn check_links(dst: &Path) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let mut inodes = std::collections::BTreeSet::new();
    for d in 0..200 {
        for f in 0..10 {
            let first = dst.join(format!("a/d{d}/f{f}"));
            let second = dst.join(format!("b/d{d}/g{f}"));
            let (m1, m2) = (first.symlink_metadata()?, second.symlink_metadata()?);
            ensure!(
                m1.ino() == m2.ino() && m1.nlink() == 2,
                "{} and {} are not one file",
                first.display(),
                second.display()
            );
            ensure!(
                inodes.insert(m1.ino()),
                "{} shares an inode",
                first.display()
            );
            ensure!(std::fs::read(&first)? == format!("{d}/{f}").as_bytes());
        }
    }
    Ok(())
}

#[test]
fn hard_link_pairs_across_200_directories_copy_under_a_64_descriptor_limit_with_their_groups_kept(
) -> Result<()> {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = shm_tempdir().map_or_else(tempdir, Ok)?;
    let src = tmp.path().join("src");
    // Each file of a/dN has its second name in b/dN: whichever side is walked first holds
    // the leaders, in 200 directories.
    for d in 0..200 {
        mkdir(&src.join(format!("a/d{d}")))?;
        mkdir(&src.join(format!("b/d{d}")))?;
        for f in 0..10 {
            let first = src.join(format!("a/d{d}/f{f}"));
            write(&first, format!("{d}/{f}").as_bytes())?;
            std::fs::hard_link(&first, src.join(format!("b/d{d}/g{f}")))?;
        }
    }
    limit_descriptors(LIMIT)?;
    // Into an existing directory: `a` and `b` are then built under staging names and renamed
    // into place when complete, so followers may link to leaders whose directory has been
    // renamed since. One worker finishes one side before it starts the other.
    for workers in [1, 4] {
        let dst = tmp.path().join(format!("dst-{workers}"));
        mkdir(&dst)?;
        let opts = Options {
            workers,
            ..unverified()
        };
        let s = ferry_engine::copy(&src, &dst, &opts, &NoProgress)?;
        ensure!(
            s.failed == 0,
            "{workers} workers: {} failures under the descriptor limit, e.g. {:?}",
            s.failed,
            s.failures.first().map(|f| (&f.path, f.op, &f.message))
        );
        ensure!(
            s.files == 2000 && s.hardlinks == 2000,
            "{workers} workers: {s:?}"
        );
        check_links(&dst).with_context(|| format!("{workers} workers"))?;
        // No staging name left (`staging_leftovers` holds a descriptor per directory).
        for dir in ["", "a", "b"] {
            for e in std::fs::read_dir(dst.join(dir))? {
                let name = e?.file_name();
                ensure!(
                    !is_staging(name.as_encoded_bytes()),
                    "{name:?} left in {dir}"
                );
            }
        }
        for e in std::fs::read_dir(tmp.path())? {
            let name = e?.file_name();
            ensure!(!is_staging(name.as_encoded_bytes()), "{name:?} left");
        }
    }
    Ok(())
}
