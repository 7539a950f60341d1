//! Adversarial trees and paths against `copy_beneath`, the entry point the node agent uses
//! for CopyJobs: nothing a tenant names or plants may make the copy read or write outside
//! its roots. Every case ends by checking canaries outside the roots: their bytes are
//! unchanged, nothing new appeared next to them, and (where the kernel records it) they
//! were not read: a canary's atime is set far in the past, so under `relatime` any read
//! would move it.

// Raw libc calls here: raw syscalls as an oracle independent of the engine.
#![allow(unsafe_code)]

mod common;

use std::ffi::CString;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{bail, ensure, Result};
use common::*;
use ferry_engine::{copy_beneath, Error, NoProgress, Options, Overwrite};

/// A sandbox: `roots/src` and `roots/dst` are the roots a job may use; `outside/` holds
/// the canaries it must never touch.
struct Sandbox {
    _tmp: tempfile::TempDir,
    src: PathBuf,
    dst: PathBuf,
    outside: PathBuf,
}

const CANARY: &[u8] = b"secret outside every root";
const OLD: (i64, i64) = (1_000_000, 0);

impl Sandbox {
    fn new() -> Result<Self> {
        let tmp = tempdir()?;
        let (src, dst, outside) = (
            tmp.path().join("roots/src"),
            tmp.path().join("roots/dst"),
            tmp.path().join("outside"),
        );
        for d in [&src, &dst, &outside] {
            std::fs::create_dir_all(d)?;
        }
        write(&outside.join("canary"), CANARY)?;
        mkdir(&outside.join("dir"))?;
        write(&outside.join("dir/canary"), CANARY)?;
        for f in ["canary", "dir/canary"] {
            set_times(&outside.join(f), OLD, (2_000_000, 0))?;
        }
        Ok(Self {
            _tmp: tmp,
            src,
            dst,
            outside,
        })
    }

    fn roots(&self) -> Result<(OwnedFd, OwnedFd)> {
        Ok((open_dir(&self.src)?, open_dir(&self.dst)?))
    }

    fn copy(&self, src: &str, dst: &str, opts: &Options) -> Result<ferry_engine::Summary, Error> {
        let (s, d) = self.roots().map_err(|e| Error::Usage(e.to_string()))?;
        copy_beneath(
            s.as_fd(),
            Path::new(src),
            d.as_fd(),
            Path::new(dst),
            opts,
            &NoProgress,
        )
    }

    /// The canaries are byte-identical, unread, and nothing was added outside.
    fn check_outside(&self) -> Result<()> {
        for f in ["canary", "dir/canary"] {
            let p = self.outside.join(f);
            ensure!(read_noatime(&p)? == CANARY, "{f} was changed");
        }
        let names: Vec<_> = std::fs::read_dir(&self.outside)?
            .map(|e| e.map(|e| e.file_name()))
            .collect::<std::io::Result<_>>()?;
        ensure!(
            names.len() == 2,
            "entries appeared outside the roots: {names:?}"
        );
        let inner: Vec<_> = std::fs::read_dir(self.outside.join("dir"))?
            .map(|e| e.map(|e| e.file_name()))
            .collect::<std::io::Result<_>>()?;
        ensure!(
            inner.len() == 1,
            "entries appeared outside the roots: {inner:?}"
        );
        Ok(())
    }

    /// The canaries were not read (their atime is still the old one).
    fn check_unread(&self) -> Result<()> {
        for f in ["canary", "dir/canary"] {
            let st = lstat(&self.outside.join(f))?;
            ensure!(
                (st.st_atime, st.st_atime_nsec) == OLD,
                "{f} was read (atime moved to {})",
                st.st_atime
            );
        }
        Ok(())
    }
}

/// Read a file without moving its atime (as root; the tests run as root in CI).
fn read_noatime(p: &Path) -> Result<Vec<u8>> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOATIME)
        .open(p)?;
    let mut v = Vec::new();
    f.read_to_end(&mut v)?;
    Ok(v)
}

fn reason(r: Result<ferry_engine::Summary, Error>) -> Result<(&'static str, String)> {
    match r {
        Err(Error::Refused { reason, message }) => Ok((reason.as_str(), message)),
        Err(e) => bail!(
            "expected a refusal, got the error {:#}",
            anyhow::Error::from(e)
        ),
        Ok(s) => bail!("expected a refusal, the copy ran: {s:?}"),
    }
}

#[test]
fn dotdot_absolute_and_nul_paths_are_refused_as_path_escape() -> Result<()> {
    let sb = Sandbox::new()?;
    write(&sb.src.join("f"), b"x")?;
    for (src, dst) in [
        ("../../outside", "copy"),
        ("f", "../../outside/dir"),
        ("a/../../..", "copy"),
        ("/etc", "copy"),
        ("f", "/tmp/x"),
    ] {
        let (why, msg) = reason(sb.copy(src, dst, &unverified()))?;
        ensure!(why == "PathEscape", "{src} -> {dst}: {why}: {msg}");
    }
    let nul = Path::new(std::ffi::OsStr::from_bytes(b"f\0x"));
    let (s, d) = sb.roots()?;
    let r = copy_beneath(
        s.as_fd(),
        nul,
        d.as_fd(),
        Path::new("c"),
        &unverified(),
        &NoProgress,
    );
    ensure!(reason(r)?.0 == "PathEscape");
    sb.check_unread()?;
    sb.check_outside()
}

#[test]
fn a_symlinked_component_in_the_source_or_destination_path_is_refused() -> Result<()> {
    let sb = Sandbox::new()?;
    // A tenant-writable root holds links to the outside, at several depths.
    symlink(&sb.outside, &sb.src.join("escape"))?;
    mkdir(&sb.src.join("real"))?;
    symlink(sb.outside.join("dir"), &sb.src.join("real/deeper"))?;
    symlink(&sb.outside, &sb.dst.join("escape"))?;
    symlink("../../outside/dir", &sb.dst.join("rel"))?;
    for (src, dst) in [
        ("escape", "copy"),
        ("escape/dir", "copy"),
        ("real/deeper", "copy"),
        ("real/deeper/canary", "copy"),
        ("real", "escape/new"),
        ("real", "rel/new"),
        ("real", "escape"),
    ] {
        let (why, msg) = reason(sb.copy(src, dst, &unverified()))?;
        ensure!(
            why == "SymlinkRejected",
            "{src} -> {dst} should be SymlinkRejected, got {why}: {msg}"
        );
        ensure!(msg.contains("symlink"), "message does not say why: {msg}");
    }
    sb.check_unread()?;
    sb.check_outside()
}

#[test]
fn symlinks_inside_the_tree_are_copied_as_links_and_never_followed() -> Result<()> {
    let sb = Sandbox::new()?;
    let tree = sb.src.join("tree");
    mkdir(&tree)?;
    write(&tree.join("ok"), b"fine")?;
    symlink(sb.outside.join("canary"), &tree.join("abs"))?;
    symlink("../../../outside/dir", &tree.join("rel"))?;
    let s = sb
        .copy("tree", "copy", &unverified())
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    ensure!(s.failures.is_empty(), "{:?}", s.failures);
    ensure!(
        std::fs::read_link(sb.dst.join("copy/abs"))? == sb.outside.join("canary"),
        "the link was not copied as a link"
    );
    ensure!(
        std::fs::symlink_metadata(sb.dst.join("copy/rel"))?
            .file_type()
            .is_symlink(),
        "the directory link was followed"
    );
    sb.check_unread()?;
    sb.check_outside()
}

#[test]
fn a_destination_name_planted_as_a_link_to_the_outside_is_never_written_through() -> Result<()> {
    let sb = Sandbox::new()?;
    write(&sb.src.join("f"), b"tenant data")?;
    mkdir(&sb.src.join("tree"))?;
    write(&sb.src.join("tree/canary"), b"tenant data")?;
    // A symlink at the destination name itself: refused whatever the policy.
    symlink(sb.outside.join("canary"), &sb.dst.join("f"))?;
    for overwrite in [Overwrite::Never, Overwrite::IfChanged, Overwrite::Always] {
        let opts = Options {
            overwrite,
            ..unverified()
        };
        let (why, _) = reason(sb.copy("f", "f", &opts))?;
        ensure!(why == "SymlinkRejected", "{overwrite:?}: {why}");
    }
    // A hard link to an outside file planted inside the merge target (same filesystem):
    // replaced by rename, or kept, never written through.
    mkdir(&sb.dst.join("merge"))?;
    std::fs::hard_link(sb.outside.join("canary"), sb.dst.join("merge/canary"))?;
    // A symlink planted where the tree has a file.
    symlink(sb.outside.join("dir/canary"), &sb.dst.join("merge/other"))?;
    write(&sb.src.join("tree/other"), b"tenant data")?;
    for overwrite in [Overwrite::Never, Overwrite::IfChanged, Overwrite::Always] {
        let opts = Options {
            overwrite,
            ..unverified()
        };
        let s = sb
            .copy("tree", "merge", &opts)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        ensure!(s.failures.is_empty(), "{overwrite:?}: {:?}", s.failures);
        sb.check_outside()?;
    }
    // The last run (Always) replaced both names with the tenant's files.
    ensure!(std::fs::read(sb.dst.join("merge/canary"))? == b"tenant data");
    ensure!(!std::fs::symlink_metadata(sb.dst.join("merge/other"))?
        .file_type()
        .is_symlink());
    Ok(())
}

/// `renameat2(RENAME_EXCHANGE)` of two names in one directory, in a loop until `stop`.
fn swap_loop(dir: &Path, a: &str, b: &str, stop: &AtomicBool) -> Result<u64> {
    let d = CString::new(dir.as_os_str().as_bytes())?;
    let (a, b) = (CString::new(a)?, CString::new(b)?);
    let mut swaps = 0;
    while !stop.load(Ordering::Relaxed) {
        // SAFETY: valid NUL-terminated paths; AT_FDCWD with absolute paths.
        let r = unsafe {
            libc::syscall(
                libc::SYS_renameat2,
                libc::AT_FDCWD,
                CString::new([d.as_bytes(), b"/", a.as_bytes()].concat())?.as_ptr(),
                libc::AT_FDCWD,
                CString::new([d.as_bytes(), b"/", b.as_bytes()].concat())?.as_ptr(),
                libc::RENAME_EXCHANGE,
            )
        };
        if r == 0 {
            swaps += 1;
        }
    }
    Ok(swaps)
}

/// A tree of `dirs` directories of a few files each.
fn small_tree(root: &Path, dirs: usize) -> Result<()> {
    for d in 0..dirs {
        let dir = root.join(format!("d{d:03}"));
        mkdir(&dir)?;
        for f in 0..5 {
            write(&dir.join(format!("f{f}")), b"tenant data")?;
        }
    }
    Ok(())
}

#[test]
fn a_source_directory_swapped_with_a_symlink_during_the_copy_never_leads_outside() -> Result<()> {
    let sb = Sandbox::new()?;
    let tree = sb.src.join("tree");
    mkdir(&tree)?;
    small_tree(&tree, 200)?;
    // "flip" is a directory one moment and a link to the outside the next.
    mkdir(&tree.join("flip"))?;
    write(&tree.join("flip/inside"), b"tenant data")?;
    symlink(&sb.outside, &tree.join("flop"))?;
    let stop = AtomicBool::new(false);
    for round in 0..5 {
        let dst = format!("copy{round}");
        let (swaps, result) = std::thread::scope(|s| {
            let swapper = s.spawn(|| swap_loop(&tree, "flip", "flop", &stop));
            let r = sb.copy(
                "tree",
                &dst,
                &Options {
                    workers: 2,
                    ..unverified()
                },
            );
            stop.store(true, Ordering::Relaxed);
            let swaps = swapper.join().expect("swapper panicked");
            stop.store(false, Ordering::Relaxed);
            (swaps, r)
        });
        ensure!(swaps? > 0, "the swapper never ran");
        result.map_err(|e| anyhow::anyhow!("{e}"))?;
        // Whatever it saw at each moment, it copied a directory or a link, nothing else.
        for name in ["flip", "flop"] {
            let p = sb.dst.join(&dst).join(name);
            if let Ok(m) = std::fs::symlink_metadata(&p) {
                if m.is_dir() {
                    for e in std::fs::read_dir(&p)? {
                        let n = e?.file_name();
                        ensure!(n == "inside", "{name} holds {n:?}: the copy went outside");
                    }
                }
            }
        }
        sb.check_unread()?;
        sb.check_outside()?;
    }
    Ok(())
}

#[test]
fn a_destination_directory_swapped_with_a_symlink_during_a_merge_never_writes_outside() -> Result<()>
{
    let sb = Sandbox::new()?;
    let tree = sb.src.join("tree");
    mkdir(&tree)?;
    small_tree(&tree, 200)?;
    mkdir(&tree.join("flip"))?;
    small_tree(&tree.join("flip"), 20)?;
    // The merge target has "flip" as a directory, and a link to the outside next to it.
    let merge = sb.dst.join("merge");
    mkdir(&merge)?;
    mkdir(&merge.join("flip"))?;
    symlink(sb.outside.join("dir"), &merge.join("flop"))?;
    let stop = AtomicBool::new(false);
    for overwrite in [Overwrite::Never, Overwrite::Always] {
        let (swaps, result) = std::thread::scope(|s| {
            let swapper = s.spawn(|| swap_loop(&merge, "flip", "flop", &stop));
            let r = sb.copy(
                "tree",
                "merge",
                &Options {
                    workers: 2,
                    overwrite,
                    ..unverified()
                },
            );
            stop.store(true, Ordering::Relaxed);
            let swaps = swapper.join().expect("swapper panicked");
            stop.store(false, Ordering::Relaxed);
            (swaps, r)
        });
        ensure!(swaps? > 0, "the swapper never ran");
        // Failures are fine (a name that was a link when it was reached); writing through
        // the link is not.
        result.map_err(|e| anyhow::anyhow!("{e}"))?;
        sb.check_outside()?;
    }
    sb.check_unread()
}

#[test]
fn a_file_swapped_for_a_fifo_mid_walk_is_recreated_never_opened_for_reading() -> Result<()> {
    let sb = Sandbox::new()?;
    let tree = sb.src.join("tree");
    mkdir(&tree)?;
    small_tree(&tree, 100)?;
    write(&tree.join("file"), b"tenant data")?;
    mkfifo(&tree.join("fifo"), 0o644)?;
    let stop = AtomicBool::new(false);
    let (swaps, result) = std::thread::scope(|s| {
        let swapper = s.spawn(|| swap_loop(&tree, "file", "fifo", &stop));
        // A FIFO opened for reading with no writer would block forever: the copy
        // finishing at all is the check (the test harness would time out otherwise).
        let r = sb.copy("tree", "copy", &unverified());
        stop.store(true, Ordering::Relaxed);
        (swapper.join().expect("swapper panicked"), r)
    });
    ensure!(swaps? > 0, "the swapper never ran");
    let s = result.map_err(|e| anyhow::anyhow!("{e}"))?;
    ensure!(s.failures.len() <= 2, "{:?}", s.failures);
    sb.check_unread()?;
    sb.check_outside()
}
