//! Nothing in a tenant's volume is opened for reading or writing before it is known to be a
//! regular file or a directory, with no window for a swap: the agent runs as root, and
//! opening some device nodes acts (a watchdog reboots the node when it is closed without
//! its magic byte). Each case plants a device node whose opens inotify reports (a copy of
//! /dev/null, 1:3, which opens without effect) where the engine used to open what it found
//! before it looked: at a destination name a `compare: Checksum` re-run or a resume reads,
//! at the manifest's and the records' paths, and in a source, renamed over a regular file
//! in a loop while the copy (local, or through the two halves of a copy between nodes)
//! runs. The device must never be opened, and nothing else may be lost.

// Raw libc calls here: renameat2(RENAME_EXCHANGE), which std does not offer.
#![allow(unsafe_code)]

mod common;

use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{ensure, Context, Result};
use common::*;
use ferry_engine::recv::Connection;
use ferry_engine::send::{serve, SendOptions, SourceTop};
use ferry_engine::{
    copy_beneath, copy_from_beneath, Compare, NoProgress, Options, Overwrite, Privileged, Records,
    Summary, Verify,
};

/// `roots/src`, `roots/dst` and `state` (for manifests and records) in one directory.
struct Case {
    tmp: tempfile::TempDir,
}

impl Case {
    fn new() -> Result<Self> {
        let tmp = tempdir()?;
        for d in ["roots/src", "roots/dst", "state"] {
            std::fs::create_dir_all(tmp.path().join(d))?;
        }
        Ok(Self { tmp })
    }

    fn src(&self) -> PathBuf {
        self.tmp.path().join("roots/src")
    }

    fn dst(&self) -> PathBuf {
        self.tmp.path().join("roots/dst")
    }

    fn state(&self) -> PathBuf {
        self.tmp.path().join("state")
    }

    /// `copy_beneath` of `src` into `dst`, as the agent copies a shard.
    fn copy(&self, src: &str, dst: &str, opts: &Options) -> Result<Summary> {
        let (s, d) = (open_dir(&self.src())?, open_dir(&self.dst())?);
        Ok(copy_beneath(
            s.as_fd(),
            Path::new(src),
            d.as_fd(),
            Path::new(dst),
            opts,
            &NoProgress,
        )?)
    }

    /// The same copy through the two halves of a copy between nodes (a sender serving
    /// `src` over a socket pair, the receiver writing `dst`).
    fn copy_halves(&self, src: &str, dst: &str, opts: &Options) -> Result<Summary> {
        let root = open_dir(&self.src())?;
        let top = SourceTop::beneath(root.as_fd(), Path::new(src))?;
        let (ours, theirs) = UnixStream::pair()?;
        let send = SendOptions {
            workers: 2,
            ..SendOptions::default()
        };
        let sender = {
            let r = theirs.try_clone()?;
            std::thread::spawn(move || serve(&top, r, theirs, &send))
        };
        let conn = Connection::start(ours.try_clone()?, ours.try_clone()?)?;
        let d = open_dir(&self.dst())?;
        let summary = copy_from_beneath(
            &conn,
            Path::new(src),
            d.as_fd(),
            Path::new(dst),
            opts,
            &NoProgress,
        );
        drop(conn);
        ours.shutdown(std::net::Shutdown::Both)?;
        let served = sender
            .join()
            .map_err(|_| anyhow::anyhow!("the sender panicked"))?;
        served.map_err(|e| anyhow::anyhow!("sender: {e}"))?;
        Ok(summary?)
    }
}

/// A character device that opens without effect (/dev/null's numbers), watched for opens.
fn device(path: &Path) -> Result<OpenWatch> {
    mknod(path, 'c', 0o666, 1, 3)?;
    OpenWatch::new(&[path])
}

fn never_opened(watch: &OpenWatch) -> Result<()> {
    let touched = watch.touched();
    ensure!(
        touched.is_empty(),
        "a device node was opened: {touched:?} (inotify IN_OPEN)"
    );
    Ok(())
}

fn checksum_rerun() -> Options {
    Options {
        overwrite: Overwrite::IfChanged,
        compare: Compare::Checksum,
        ..Options::default()
    }
}

#[test]
fn a_device_at_a_destination_name_is_never_opened_by_a_checksum_rerun() -> Result<()> {
    if !require_root("mknod") {
        return Ok(());
    }
    let case = Case::new()?;
    let (src, dst) = (case.src().join("tree"), case.dst().join("tree"));
    mkdir(&src)?;
    mkdir(&dst)?;
    write(&src.join("f"), b"tenant data")?;
    write(&src.join("same"), b"kept as it is")?;
    write(&dst.join("same"), b"kept as it is")?;
    let watch = device(&dst.join("f"))?;
    let s = case.copy("tree", "tree", &checksum_rerun())?;
    never_opened(&watch)?;
    // The device is not the source's file: replaced by it, as a file that differs is.
    ensure!(s.failures.is_empty(), "{:?}", s.failures);
    ensure!(s.files == 1 && s.skipped == 1, "{s:?}");
    ensure!(std::fs::read(dst.join("f"))? == b"tenant data");
    ensure!(std::fs::read(dst.join("same"))? == b"kept as it is");

    // The same between nodes: the destination half decides, on its own node.
    let watch = device(&dst.join("g"))?;
    write(&src.join("g"), b"more tenant data")?;
    let s = case.copy_halves("tree", "tree", &checksum_rerun())?;
    never_opened(&watch)?;
    ensure!(s.failures.is_empty(), "{:?}", s.failures);
    ensure!(std::fs::read(dst.join("g"))? == b"more tenant data");
    Ok(())
}

#[test]
fn a_device_at_a_destination_name_is_never_opened_by_a_resume() -> Result<()> {
    if !require_root("mknod") {
        return Ok(());
    }
    let case = Case::new()?;
    let (src, dst) = (case.src().join("tree"), case.dst().join("tree"));
    mkdir(&src)?;
    mkdir(&dst)?;
    for n in ["f", "g", "h"] {
        write(&src.join(n), b"tenant data")?;
    }
    write(&dst.join("g"), b"tenant data")?;
    let watch = device(&dst.join("f"))?;
    // A resumed copy with a manifest reads each kept file its interrupted run did not list,
    // to tell its own finished copies from what else is there.
    for (overwrite, compare) in [
        (Overwrite::Never, Compare::SizeAndTime),
        (Overwrite::IfChanged, Compare::Checksum),
    ] {
        let opts = Options {
            resume: true,
            staging_tag: Some("resume1".into()),
            manifest: Some(case.state().join(format!("{overwrite}.xxh128"))),
            overwrite,
            compare,
            ..Options::default()
        };
        let s = case.copy("tree", "tree", &opts)?;
        never_opened(&watch)?;
        ensure!(s.failures.is_empty(), "{overwrite}: {:?}", s.failures);
        match overwrite {
            // Kept, as never keeps what is there; not counted as a finished copy.
            Overwrite::Never => {
                ensure!(is_device(&dst.join("f"))?, "the device was replaced");
                ensure!(s.files_resumed == 1, "only g is a finished copy: {s:?}");
            }
            // Not the source's bytes: replaced.
            _ => ensure!(std::fs::read(dst.join("f"))? == b"tenant data"),
        }
        ensure!(std::fs::read(dst.join("h"))? == b"tenant data");
    }
    Ok(())
}

fn is_device(p: &Path) -> Result<bool> {
    Ok(lstat(p)?.st_mode & libc::S_IFMT == libc::S_IFCHR)
}

#[test]
fn a_device_at_the_manifest_or_records_path_is_never_opened() -> Result<()> {
    if !require_root("mknod") {
        return Ok(());
    }
    let case = Case::new()?;
    mkdir(&case.src().join("tree"))?;
    write(&case.src().join("tree/f"), b"tenant data")?;
    let manifest = case.state().join("manifest");
    let watch = device(&manifest)?;
    for resume in [false, true] {
        let opts = Options {
            manifest: Some(manifest.clone()),
            resume,
            ..Options::default()
        };
        let e = case
            .copy("tree", &format!("m{resume}"), &opts)
            .err()
            .context("a device as the manifest was taken")?;
        ensure!(format!("{e:#}").contains("manifest"), "{e:#}");
        never_opened(&watch)?;
    }
    // The records: the earlier copies' (read) and this one's (written).
    let (earlier, write_to) = (case.state().join("earlier"), case.state().join("write"));
    mknod(&earlier, 'c', 0o666, 1, 3)?;
    mknod(&write_to, 'c', 0o666, 1, 3)?;
    let watch = OpenWatch::new(&[&earlier, &write_to])?;
    for (earlier, write) in [
        (earlier.clone(), case.state().join("fine")),
        (case.state().join("none"), write_to.clone()),
    ] {
        let opts = Options {
            manifest: Some(case.state().join("m.xxh128")),
            records: Some(Records { earlier, write }),
            overwrite: Overwrite::IfChanged,
            ..Options::default()
        };
        let e = case
            .copy("tree", "r", &opts)
            .err()
            .context("a device as records was taken")?;
        ensure!(format!("{e:#}").contains("records"), "{e:#}");
        never_opened(&watch)?;
    }
    Ok(())
}

/// Exchange `a` and `b` in `dir` (`renameat2(RENAME_EXCHANGE)`), pair after pair, until
/// `stop`; returns how many exchanges were made.
fn swap_loop(dir: &Path, pairs: &[(String, String)], stop: &AtomicBool) -> Result<u64> {
    let mut swaps = 0;
    while !stop.load(Ordering::Relaxed) {
        for (a, b) in pairs {
            let (a, b) = (cpath(&dir.join(a)), cpath(&dir.join(b)));
            // SAFETY: valid NUL-terminated absolute paths.
            let r = unsafe {
                libc::syscall(
                    libc::SYS_renameat2,
                    libc::AT_FDCWD,
                    a.as_ptr(),
                    libc::AT_FDCWD,
                    b.as_ptr(),
                    libc::RENAME_EXCHANGE,
                )
            };
            if r == 0 {
                swaps += 1;
            }
        }
    }
    Ok(swaps)
}

/// A source with many small files, and `PAIRS` names that are a regular file one moment
/// and a device node the next while `copy` runs, `rounds` times (each into a new
/// destination). Every device is watched; what was copied is checked: each name is the
/// file or the device (recreated or reported), and every other file is there.
fn swapped_source(copy: impl Fn(&Case, &str) -> Result<Summary>, rounds: usize) -> Result<()> {
    const PAIRS: usize = 8;
    let case = Case::new()?;
    let tree = case.src().join("tree");
    mkdir(&tree)?;
    for d in 0..40 {
        let dir = tree.join(format!("d{d:02}"));
        mkdir(&dir)?;
        for f in 0..20 {
            write(&dir.join(format!("f{f}")), b"tenant data")?;
        }
    }
    // Files listed beside the swapped names, so that a name waits a while between its
    // listing and its open (the window a swap needs).
    for f in 0..400 {
        write(&tree.join(format!("top{f}")), b"tenant data")?;
    }
    let mut pairs = Vec::new();
    let mut devices = Vec::new();
    for i in 0..PAIRS {
        let (file, dev) = (format!("file{i}"), format!("dev{i}"));
        write(&tree.join(&file), b"a regular file")?;
        mknod(&tree.join(&dev), 'c', 0o666, 1, 3)?;
        devices.push(tree.join(&dev));
        pairs.push((file, dev));
    }
    let watch = OpenWatch::new(&devices.iter().map(|p| p.as_path()).collect::<Vec<_>>())?;
    let stop = AtomicBool::new(false);
    let mut total_swaps = 0;
    for round in 0..rounds {
        let dst = format!("copy{round}");
        let (swaps, result) = std::thread::scope(|s| {
            let swapper = s.spawn(|| swap_loop(&tree, &pairs, &stop));
            let r = copy(&case, &dst);
            stop.store(true, Ordering::Relaxed);
            let swaps = swapper.join().expect("the swapper panicked");
            stop.store(false, Ordering::Relaxed);
            (swaps, r)
        });
        total_swaps += swaps?;
        let s = result?;
        never_opened(&watch).with_context(|| format!("round {round}"))?;
        // Nothing else lost: every other file is there, whole.
        let out = case.dst().join(&dst);
        for f in 0..400 {
            let p = out.join(format!("top{f}"));
            ensure!(std::fs::read(&p)? == b"tenant data", "{}", p.display());
        }
        for d in 0..40 {
            for f in 0..20 {
                let p = out.join(format!("d{d:02}/f{f}"));
                ensure!(std::fs::read(&p)? == b"tenant data", "{}", p.display());
            }
        }
        // Each swapped name is what the copy saw: the file, or a device (made, as these
        // copies keep privileged files), or a failure that says why it is not there.
        for (a, b) in &pairs {
            for name in [a, b] {
                let p = out.join(name);
                let failed = s.failures.iter().any(|f| f.path == Path::new(name));
                match std::fs::symlink_metadata(&p) {
                    Ok(m) if m.is_file() => {
                        ensure!(std::fs::read(&p)? == b"a regular file", "{name}")
                    }
                    Ok(_) => ensure!(is_device(&p)?, "{name} is neither a file nor a device"),
                    Err(_) => ensure!(failed, "{name} is missing and no failure says why"),
                }
            }
        }
        ensure!(
            s.failures.iter().all(|f| pairs
                .iter()
                .any(|(a, b)| f.path == Path::new(a) || f.path == Path::new(b))),
            "failures beyond the swapped names: {:?}",
            s.failures
        );
    }
    ensure!(total_swaps > 0, "the swapper never ran");
    Ok(())
}

fn keeping() -> Options {
    Options {
        workers: 2,
        privileged: Privileged::Keep,
        verify: Verify::None,
        ..Options::default()
    }
}

#[test]
fn a_device_renamed_over_a_source_file_during_the_copy_is_never_opened() -> Result<()> {
    if !require_root("mknod") {
        return Ok(());
    }
    swapped_source(|case, dst| case.copy("tree", dst, &keeping()), 5)
}

#[test]
fn a_device_renamed_over_a_source_file_is_never_opened_by_the_sending_half() -> Result<()> {
    if !require_root("mknod") {
        return Ok(());
    }
    swapped_source(|case, dst| case.copy_halves("tree", dst, &keeping()), 5)
}

/// The agent reads manifests in a tenant's `.ferry/` through this: a device planted there
/// is reported as not a regular file, never opened.
#[test]
fn a_device_in_place_of_a_state_file_is_never_opened_to_be_read() -> Result<()> {
    if !require_root("mknod") {
        return Ok(());
    }
    let case = Case::new()?;
    let dev = case.state().join("part-0.xxh128");
    let watch = device(&dev)?;
    ensure!(ferry_engine::volume::open_regular_to_read(&dev)?.is_none());
    never_opened(&watch)?;
    write(&case.state().join("file"), b"lines")?;
    let (_, len) = ferry_engine::volume::open_regular_to_read(&case.state().join("file"))?
        .context("a regular file")?;
    ensure!(len == 5);
    Ok(())
}
