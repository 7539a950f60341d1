//! Memory by tree shape (issue 19, item 11): the heap a copy holds must not grow with the
//! square of a tree's depth, nor with the width of one directory. A counting allocator (this
//! test binary's global allocator) measures the heap a copy holds at its peak, above what
//! was held when it started; the tests take turns, so a peak is one copy's.
//! (Descriptors by shape, under a low RLIMIT_NOFILE: `tree_shapes_fd_limit.rs`.)

// A global allocator is an `unsafe impl`: it forwards to the system allocator and counts.
#![allow(unsafe_code)]

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::ffi::CString;
use std::os::fd::AsFd;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use anyhow::{ensure, Context, Result};
use common::*;
use ferry_engine::{NoProgress, Options, Part, Summary};

struct Counting;

static HELD: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn grew(by: usize) {
    let now = HELD.fetch_add(by, Ordering::Relaxed) + by;
    PEAK.fetch_max(now, Ordering::Relaxed);
}

// SAFETY: every call is forwarded unchanged to the system allocator; only counters change.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract for `alloc` is passed on as is.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by `System` with `layout` (see `alloc`).
        unsafe { System.dealloc(ptr, layout) };
        HELD.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as in `alloc`.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as in `alloc`; `ptr` came from `System` with `layout`.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            HELD.fetch_sub(layout.size(), Ordering::Relaxed);
            grew(new_size);
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// One measured copy at a time: the counters are the process's.
static TURN: Mutex<()> = Mutex::new(());

/// Run a copy and return its summary and the most heap it held above what was held before.
fn peak_heap_of(copy: impl FnOnce() -> Result<Summary>) -> Result<(Summary, usize)> {
    let before = HELD.load(Ordering::Relaxed);
    PEAK.store(before, Ordering::Relaxed);
    let summary = copy()?;
    let peak = PEAK.load(Ordering::Relaxed).saturating_sub(before);
    Ok((summary, peak))
}

const MIB: usize = 1 << 20;

fn opts() -> Options {
    Options {
        // Two workers, as on the machine the bounds were measured on: the per-worker
        // buffers (1 MiB for data, 64 KiB for listings) are part of the bound.
        workers: 2,
        ..unverified()
    }
}

/// Walk a chain made by `build_deep_tree` in the source and its copy side by side (one
/// level's descriptors at a time: the paths are longer than PATH_MAX), comparing each
/// level's entries, its file's bytes, and the directories' modes and mtimes.
fn check_chain(src: &Path, dst: &Path, name: &[u8], depth: usize) -> Result<()> {
    let n = cname(name);
    let f = cname(b"f");
    let dir_flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW;
    let (mut s, mut d) = (open_dir(src)?, open_dir(dst)?);
    for level in 0..depth {
        s = openat(s.as_fd(), &n, dir_flags, 0).with_context(|| format!("source level {level}"))?;
        d = openat(d.as_fd(), &n, dir_flags, 0)
            .with_context(|| format!("copy lacks level {level}"))?;
        let (sl, dl) = (list_dir(s.as_fd())?, list_dir(d.as_fd())?);
        let sorted = |mut v: Vec<CString>| {
            v.sort();
            v
        };
        ensure!(
            sorted(sl) == sorted(dl),
            "level {level}: the copy's entries differ"
        );
        let (sf, df) = (
            openat(s.as_fd(), &f, libc::O_RDONLY, 0)?,
            openat(d.as_fd(), &f, libc::O_RDONLY, 0)?,
        );
        compare_files(sf, df).with_context(|| format!("level {level}: f"))?;
        let stat = |fd: &std::os::fd::OwnedFd| -> Result<(u32, i64, i64)> {
            let m = std::fs::File::from(fd.try_clone()?).metadata()?;
            use std::os::unix::fs::MetadataExt;
            Ok((m.mode(), m.mtime(), m.mtime_nsec()))
        };
        ensure!(
            stat(&s)? == stat(&d)?,
            "level {level}: mode or mtime differ"
        );
    }
    Ok(())
}

#[test]
fn a_chain_of_1000_directories_with_255_byte_names_is_copied_in_memory_that_does_not_grow_with_depth_squared(
) -> Result<()> {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = shm_tempdir().map_or_else(tempdir, Ok)?;
    let src = tmp.path().join("src");
    mkdir(&src)?;
    let name = [b'n'; 255];
    let depth = 1000;
    build_deep_tree(&src, &name, depth)?;
    let dst = tmp.path().join("dst");
    let (s, peak) = peak_heap_of(|| Ok(ferry_engine::copy(&src, &dst, &opts(), &NoProgress)?))?;
    ensure!(
        s.failed == 0,
        "{} failures, e.g. {:?}",
        s.failed,
        s.failures.first()
    );
    ensure!(
        s.files == depth as u64 && s.dirs == depth as u64 + 1,
        "{s:?}"
    );
    check_chain(&src, &dst, &name, depth)?;
    // The full path of every level (256 bytes more each) would be 1000²/2 × 256 ≈ 122 MiB.
    ensure!(
        peak < 8 * MIB,
        "the copy held {:.1} MiB at its peak",
        peak as f64 / MIB as f64
    );
    eprintln!("chain: peak heap {:.2} MiB", peak as f64 / MIB as f64);
    Ok(())
}

#[test]
fn a_directory_of_50k_long_names_is_never_held_whole_by_a_copy_a_resume_or_the_directories_pass(
) -> Result<()> {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = shm_tempdir().map_or_else(tempdir, Ok)?;
    let src = tmp.path().join("src");
    mkdir(&src)?;
    let entries = 50_000;
    // 200-byte names: listed whole, the directory's names alone are ~10 MiB.
    for i in 0..entries {
        let name = format!("{i:0>200}");
        std::fs::File::create(src.join(name))?;
    }
    let dst = tmp.path().join("dst");
    let limit = 6 * MIB;
    let mib = |b: usize| b as f64 / MIB as f64;

    let (s, copy_peak) =
        peak_heap_of(|| Ok(ferry_engine::copy(&src, &dst, &opts(), &NoProgress)?))?;
    ensure!(s.failed == 0 && s.files == entries, "{s:?}");

    // A resumed copy into it sweeps the destination directory for its leftovers as well.
    let resumed = Options {
        resume: true,
        staging_tag: Some("5ca1ab1e".into()),
        ..opts()
    };
    let (s, resume_peak) =
        peak_heap_of(|| Ok(ferry_engine::copy(&src, &dst, &resumed, &NoProgress)?))?;
    ensure!(s.failed == 0 && s.skipped == entries, "{s:?}");

    // The last pass of a split copy lists every directory for its subdirectories.
    let dirs_only = Options {
        select: Part::Directories,
        ..opts()
    };
    let (s, dirs_peak) =
        peak_heap_of(|| Ok(ferry_engine::copy(&src, &dst, &dirs_only, &NoProgress)?))?;
    ensure!(s.failed == 0, "{s:?}");

    eprintln!(
        "50k entries: peak heap {:.2} MiB (copy), {:.2} MiB (resume), {:.2} MiB (directories)",
        mib(copy_peak),
        mib(resume_peak),
        mib(dirs_peak)
    );
    ensure!(
        copy_peak < limit && resume_peak < limit && dirs_peak < limit,
        "peak heap {:.1} MiB (copy), {:.1} MiB (resume), {:.1} MiB (directories), over {:.0} MiB",
        mib(copy_peak),
        mib(resume_peak),
        mib(dirs_peak),
        mib(limit)
    );
    let got = std::fs::read_dir(&dst)?.count();
    ensure!(got == entries as usize, "{got} entries in the copy");
    Ok(())
}
