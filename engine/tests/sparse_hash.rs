//! A sparse file is hashed without reading its holes, on both ends of a verified copy: the
//! holes of the source and of the copy are hashed as the zeros a reader sees, and the
//! manifest still matches `xxh128sum`. Its own test binary: it measures the bytes this
//! process reads (`rchar`), which another test running beside it would add to.

mod common;

use anyhow::{ensure, Result};
use common::*;
use ferry_engine::{NoProgress, Options, Verify};

/// Bytes this process has read through read(2)-like calls so far (`/proc/self/io`).
fn bytes_read() -> Result<u64> {
    let io = std::fs::read_to_string("/proc/self/io")?;
    io.lines()
        .find_map(|l| l.strip_prefix("rchar: "))
        .and_then(|n| n.trim().parse().ok())
        .ok_or_else(|| anyhow::anyhow!("no rchar in /proc/self/io"))
}

#[test]
fn a_verified_copy_of_a_sparse_file_reads_its_data_not_its_holes() -> Result<()> {
    let tmp = tempdir()?;
    let src = tmp.path().join("src");
    mkdir(&src)?;
    // 1 GiB with 2 MiB of data in two extents (at the start and in the middle).
    let sparse = src.join("disk.img");
    write_pattern_file(&sparse, 1 << 20)?;
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(&sparse)?;
        f.write_all_at(&pattern(0, 1 << 20), 512 << 20)?;
        f.set_len(1 << 30)?;
    }
    let dst = tmp.path().join("dst");
    let manifest = tmp.path().join("copy.xxh128");
    let opts = Options {
        verify: Verify::Checksum,
        manifest: Some(manifest.clone()),
        ..Options::default()
    };
    let before = bytes_read()?;
    let s = ferry_engine::copy(&src, &dst, &opts, &NoProgress)?;
    let read = bytes_read()? - before;
    ensure!(s.failures.is_empty() && s.verified == 1, "{s:?}");
    // Source and copy: 2 MiB of data each, and a little besides (the manifest is written,
    // not read). Reading the holes would be 2 GiB.
    ensure!(
        read < 64 << 20,
        "the copy read {read} bytes for 2 MiB of data: holes were read"
    );
    xxh128sum_check(&dst, &manifest)?;
    let allocated = lstat(&dst.join("disk.img"))?.st_blocks as u64 * 512;
    ensure!(
        allocated < 16 << 20,
        "the copy is not sparse: {allocated} bytes allocated"
    );
    Ok(())
}
