//! Raw block copies (`ferry_engine::block`), checked the way a user would: the destination
//! read back byte for byte (or mounted and compared file by file), its allocation measured
//! where zeros were to be punched, and a re-run's writes counted. On image files without
//! root; on loop devices (over files on a tmpfs) as root.

mod common;

use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use anyhow::{ensure, Context, Result};
use common::{require_root, require_tools, sh, shm_tempdir, tempdir, Loop, Mount};
use ferry_engine::block::{
    copy_device, BlockOptions, BlockSummary, Cache, ChunkManifest, Device, DeviceKind, Rerun,
    ZeroWay, Zeros, CHUNK,
};
use ferry_engine::NoProgress;

const MIB: u64 = 1 << 20;

/// Bytes no two runs of a test share (xorshift), so no chunk equals another by chance.
fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// Write a source of `size` bytes: noise in the chunks `data` names, zeros written out in
/// the chunks `zeros` names, and holes everywhere else. Returns the chunks holding data.
fn build_source(path: &Path, size: u64, data: &[u64], zeros: &[u64]) -> Result<()> {
    let f = File::create(path)?;
    f.set_len(size)?;
    for &c in data {
        let len = CHUNK.min(size - c * CHUNK) as usize;
        f.write_all_at(&noise(c + 1, len), c * CHUNK)?;
    }
    for &c in zeros {
        let len = CHUNK.min(size - c * CHUNK) as usize;
        f.write_all_at(&vec![0; len], c * CHUNK)?;
    }
    f.sync_all()?;
    Ok(())
}

fn same_bytes(a: &Path, b: &Path, len: u64) -> Result<()> {
    let (mut fa, mut fb) = (File::open(a)?, File::open(b)?);
    let (mut ba, mut bb) = (vec![0; MIB as usize], vec![0; MIB as usize]);
    let mut off = 0;
    while off < len {
        let n = MIB.min(len - off) as usize;
        fa.read_exact(&mut ba[..n])?;
        fb.read_exact(&mut bb[..n])?;
        ensure!(
            ba[..n] == bb[..n],
            "{} and {} differ in the MiB at byte {off}",
            a.display(),
            b.display()
        );
        off += n as u64;
    }
    Ok(())
}

/// The manifest of `path`'s first `size` bytes, computed here from a plain read.
fn manifest_of(path: &Path, size: u64) -> Result<ChunkManifest> {
    let mut f = File::open(path)?;
    let mut hashes = Vec::new();
    let mut buf = vec![0; CHUNK as usize];
    let mut off = 0;
    while off < size {
        let n = CHUNK.min(size - off) as usize;
        f.read_exact(&mut buf[..n])?;
        hashes.push(twox_hash::XxHash3_128::oneshot(&buf[..n]));
        off += n as u64;
    }
    Ok(ChunkManifest {
        chunk: CHUNK,
        size,
        hashes,
    })
}

fn copy(src: &Path, dst: &Path, opts: &BlockOptions) -> Result<BlockSummary> {
    let s = Device::open(src, false, false)?;
    let mut d = Device::open(dst, true, true)?;
    Ok(copy_device(&s, &mut d, opts, &NoProgress)?)
}

fn allocated(path: &Path) -> Result<u64> {
    Ok(std::fs::metadata(path)?.blocks() * 512)
}

/// A scratch directory on a tmpfs where there is one (holes and punching work there).
fn scratch() -> tempfile::TempDir {
    shm_tempdir().unwrap_or_else(|| tempdir().expect("tempdir"))
}

#[test]
fn an_image_with_data_holes_and_written_zeros_copies_identical_and_as_sparse() -> Result<()> {
    let dir = scratch();
    let (src, dst) = (dir.path().join("src.img"), dir.path().join("dst.img"));
    // 16 chunks and a short tail: data in 5 (the tail among them), zeros written in 4,
    // holes in the rest.
    let size = 16 * CHUNK + 12_345;
    let data = [0, 3, 7, 8, 16];
    build_source(&src, size, &data, &[1, 2, 9, 15])?;
    let sum = copy(&src, &dst, &BlockOptions::default())?;

    same_bytes(&src, &dst, size)?;
    assert_eq!(
        std::fs::metadata(&dst)?.len(),
        size,
        "the image grew to the source's size"
    );
    assert_eq!(
        (sum.chunks, sum.written, sum.punched),
        (17, 5, 12),
        "{sum:?}"
    );
    assert_eq!(sum.holes, 8, "hole chunks known without a read: {sum:?}");
    assert_eq!(
        sum.bytes_read_source,
        4 * CHUNK + 12_345 + 4 * CHUNK,
        "{sum:?}"
    );
    // Read back: every written chunk and the first punched one (the rest are zeros by the
    // device's guarantee, the first checks it keeps it); all 17 when punched ones count.
    assert_eq!((sum.verified, sum.zeros), (5 + 1, ZeroWay::Punched));
    let every = BlockOptions {
        verify_punched: true,
        ..BlockOptions::default()
    };
    let again = copy(&src, &dir.path().join("again.img"), &every)?;
    assert_eq!((again.verified, again.punched), (17, 12), "{again:?}");
    let data_bytes = 4 * CHUNK + 12_345;
    let alloc = allocated(&dst)?;
    assert!(
        alloc >= data_bytes && alloc <= data_bytes + MIB,
        "the destination allocates its data only: {alloc} bytes for {data_bytes}"
    );
    let manifest = sum.manifest.expect("a finished copy has a manifest");
    assert_eq!(
        manifest,
        manifest_of(&dst, size)?,
        "the manifest is the destination's"
    );
    assert_eq!(
        ChunkManifest::read_from(manifest.to_text().as_bytes())?,
        manifest
    );
    Ok(())
}

#[test]
fn zeros_are_written_when_asked_and_the_result_is_the_same() -> Result<()> {
    let dir = scratch();
    let (src, dst) = (dir.path().join("src.img"), dir.path().join("dst.img"));
    let size = 6 * CHUNK;
    build_source(&src, size, &[2], &[4])?;
    // A destination full of noise first: punching or writing, the zeros must replace it.
    File::create(&dst)?.write_all(&noise(99, size as usize))?;
    let opts = BlockOptions {
        zeros: Zeros::Write,
        ..BlockOptions::default()
    };
    let sum = copy(&src, &dst, &opts)?;
    same_bytes(&src, &dst, size)?;
    assert_eq!((sum.written, sum.zeros_written, sum.punched), (1, 5, 0));
    assert_eq!(sum.zeros, ZeroWay::Written);
    Ok(())
}

#[test]
fn a_rerun_writes_only_the_chunks_that_changed() -> Result<()> {
    let dir = scratch();
    let (src, dst) = (dir.path().join("src.img"), dir.path().join("dst.img"));
    let size = 12 * CHUNK;
    build_source(&src, size, &(0..12).collect::<Vec<_>>(), &[])?;
    let first = copy(&src, &dst, &BlockOptions::default())?;
    let kept = first.manifest.clone().expect("manifest");

    // 1 MiB changed across the boundary of chunks 5 and 6.
    File::options()
        .write(true)
        .open(&src)?
        .write_all_at(&noise(7, MIB as usize), 6 * CHUNK - MIB / 2)?;
    let rerun = BlockOptions {
        rerun: Rerun::OnlyChanged,
        ..BlockOptions::default()
    };
    let sum = copy(&src, &dst, &rerun)?;
    same_bytes(&src, &dst, size)?;
    assert_eq!((sum.written, sum.unchanged), (2, 10), "{sum:?}");
    assert_eq!(sum.bytes_written, 2 * CHUNK);
    assert_eq!(
        sum.bytes_read_destination, size,
        "without a kept manifest the destination is read"
    );
    assert!(!sum.kept_used);

    // The same change again, with the manifest the first run kept: it stands in for the
    // destination, so nothing of it is read, and it says which two chunks differ.
    File::options()
        .write(true)
        .open(&src)?
        .write_all_at(&noise(8, MIB as usize), 6 * CHUNK - MIB / 2)?;
    let with_kept = BlockOptions {
        kept: sum.manifest.clone(),
        ..rerun.clone()
    };
    let sum = copy(&src, &dst, &with_kept)?;
    same_bytes(&src, &dst, size)?;
    assert_eq!(
        (sum.written, sum.unchanged, sum.bytes_read_destination),
        (2, 10, 0)
    );
    assert!(sum.kept_used);

    // A manifest of another shape (the first run's chunking differs) is not used.
    let other = ChunkManifest {
        chunk: 2 * CHUNK,
        size,
        hashes: vec![0; 6],
    };
    let sum = copy(
        &src,
        &dst,
        &BlockOptions {
            kept: Some(other),
            ..rerun.clone()
        },
    )?;
    assert!(!sum.kept_used);
    assert_eq!((sum.written, sum.unchanged), (0, 12));
    // Nor one of the right shape with a hash missing.
    let short = ChunkManifest {
        hashes: vec![0; 11],
        ..kept.clone()
    };
    let sum = copy(
        &src,
        &dst,
        &BlockOptions {
            kept: Some(short),
            ..rerun.clone()
        },
    )?;
    assert!(!sum.kept_used);
    assert_ne!(
        kept,
        sum.manifest.expect("manifest"),
        "the device changed since the first run"
    );
    Ok(())
}

#[test]
fn changed_block_tracking_reads_only_the_chunks_it_names_and_trusts_it_for_the_rest() -> Result<()>
{
    let dir = scratch();
    let (src, dst) = (dir.path().join("src.img"), dir.path().join("dst.img"));
    let size = 12 * CHUNK;
    build_source(&src, size, &(0..12).collect::<Vec<_>>(), &[])?;
    let first = copy(&src, &dst, &BlockOptions::default())?;
    let change = |chunk: u64, seed: u64| -> Result<()> {
        File::options()
            .write(true)
            .open(&src)?
            .write_all_at(&noise(seed, MIB as usize), chunk * CHUNK + 4096)?;
        Ok(())
    };
    change(3, 31)?;
    change(9, 91)?;
    let flags = |set: &[usize]| (0..12).map(|i| set.contains(&i)).collect::<Vec<_>>();
    let delta = |changed: Vec<bool>, kept: Option<ChunkManifest>| BlockOptions {
        rerun: Rerun::OnlyChanged,
        kept,
        changed: Some(changed),
        ..BlockOptions::default()
    };
    // The driver's account names both chunks: only they are read, of either side.
    let sum = copy(&src, &dst, &delta(flags(&[3, 9]), first.manifest.clone()))?;
    same_bytes(&src, &dst, size)?;
    assert!(sum.delta_used && sum.kept_used, "{sum:?}");
    assert_eq!((sum.written, sum.unchanged), (2, 10), "{sum:?}");
    assert_eq!(
        (sum.bytes_read_source, sum.bytes_read_destination),
        (2 * CHUNK, 0)
    );
    assert_eq!(
        sum.manifest,
        Some(manifest_of(&src, size)?),
        "the manifest is whole: read chunks hashed, the rest kept"
    );

    // An account that leaves a changed chunk out is believed: that chunk is not copied.
    // (Why the agent uses one only for a snapshot's driver, and verify Full refuses it.)
    let kept = sum.manifest.clone();
    change(3, 32)?;
    change(9, 92)?;
    let sum = copy(&src, &dst, &delta(flags(&[3]), kept.clone()))?;
    assert_eq!((sum.written, sum.bytes_read_source), (1, CHUNK), "{sum:?}");
    let (s, d) = (std::fs::read(&src)?, std::fs::read(&dst)?);
    let at = |i: u64| (i * CHUNK) as usize..((i + 1) * CHUNK) as usize;
    assert_eq!(s[at(3)], d[at(3)]);
    assert_ne!(s[at(9)], d[at(9)], "chunk 9 was left out of the account");

    // Not used without a kept manifest (the unchanged chunks' hashes would be unknown) or
    // with a list of another length: every chunk is compared, and the copy is whole.
    for (changed, kept) in [(flags(&[3]), None), (vec![true; 11], kept)] {
        let sum = copy(&src, &dst, &delta(changed, kept))?;
        assert!(!sum.delta_used, "{sum:?}");
        same_bytes(&src, &dst, size)?;
    }
    Ok(())
}

#[test]
fn what_is_not_a_device_or_too_small_is_refused_and_nothing_is_written() -> Result<()> {
    let dir = scratch();
    let src = dir.path().join("src.img");
    build_source(&src, 4 * CHUNK, &[0, 1], &[])?;
    let fifo = dir.path().join("fifo");
    sh("mkfifo", &[fifo.as_os_str()])?;
    for (path, says) in [
        (dir.path().to_path_buf(), "is a directory"),
        (fifo.clone(), "is a FIFO"),
        (PathBuf::from("/dev/null"), "is a character device"),
    ] {
        // A FIFO opened for reading would wait here for a writer: it is never opened.
        let err = Device::open(&path, false, false).expect_err("refused");
        assert!(err.to_string().contains(says), "{}: {err}", path.display());
        let err = Device::open(&path, true, true).expect_err("refused as a destination");
        assert!(
            err.to_string().contains("block device or an image"),
            "{err}"
        );
    }

    // A destination smaller than the source: a device cannot grow, so it is refused whole.
    // (An image grows; a device is what the loop test below uses.)
    let s = Device::open(&src, false, false)?;
    assert_eq!(
        (s.kind(), s.size(), s.rdev()),
        (DeviceKind::Image, 4 * CHUNK, None)
    );

    let odd = dir.path().join("odd.img");
    build_source(&odd, CHUNK + 1, &[0], &[])?;
    let opts = BlockOptions {
        cache: Cache::Direct,
        ..BlockOptions::default()
    };
    let err = copy(&odd, &dir.path().join("d.img"), &opts).expect_err("unaligned direct");
    assert!(format!("{err:#}").contains("without direct I/O"), "{err:#}");
    let opts = BlockOptions {
        chunk: 3000,
        ..BlockOptions::default()
    };
    let err = copy(&src, &dir.path().join("e.img"), &opts).expect_err("odd chunk");
    assert!(format!("{err:#}").contains("power of two"), "{err:#}");
    Ok(())
}

#[test]
fn a_cancelled_copy_has_no_manifest() -> Result<()> {
    let dir = scratch();
    let (src, dst) = (dir.path().join("src.img"), dir.path().join("dst.img"));
    build_source(&src, 8 * CHUNK, &[0, 1, 2], &[])?;
    let cancel = Arc::new(AtomicBool::new(true));
    let sum = copy(
        &src,
        &dst,
        &BlockOptions {
            cancel: Some(cancel),
            ..BlockOptions::default()
        },
    )?;
    assert!(sum.cancelled && sum.manifest.is_none(), "{sum:?}");
    assert_eq!(sum.written, 0);
    Ok(())
}

/// Cancels the copy once `after` chunks have been written.
struct CancelAfter {
    after: u64,
    seen: std::sync::atomic::AtomicU64,
    cancel: Arc<AtomicBool>,
}

impl ferry_engine::Progress for CancelAfter {
    fn bytes_copied(&self, _bytes: u64, _strategy: ferry_engine::Strategy) {
        use std::sync::atomic::Ordering::Relaxed;
        if self.seen.fetch_add(1, Relaxed) + 1 >= self.after {
            self.cancel.store(true, Relaxed);
        }
    }
}

#[test]
fn a_stopped_copy_resumes_by_chunk_from_its_journal() -> Result<()> {
    let dir = scratch();
    let (src, dst) = (dir.path().join("src.img"), dir.path().join("dst.img"));
    let journal = dir.path().join("journal");
    let size = 40 * CHUNK;
    build_source(
        &src,
        size,
        &(0..40).filter(|c| c % 3 != 0).collect::<Vec<_>>(),
        &[],
    )?;
    let cancel = Arc::new(AtomicBool::new(false));
    let opts = BlockOptions {
        journal: Some(journal.clone()),
        cancel: Some(cancel.clone()),
        ..BlockOptions::default()
    };
    let stop = CancelAfter {
        after: 10,
        seen: Default::default(),
        cancel: cancel.clone(),
    };
    let s = Device::open(&src, false, false)?;
    let mut d = Device::open(&dst, true, true)?;
    let first = copy_device(&s, &mut d, &opts, &stop)?;
    assert!(first.cancelled && first.manifest.is_none(), "{first:?}");
    let finished = first.written + first.punched;
    assert!((10..40).contains(&finished), "{first:?}");
    assert!(journal.exists(), "a stopped copy keeps its journal");

    // A line cut by a kill, at the end: ignored, the lines before it kept.
    std::fs::OpenOptions::new()
        .append(true)
        .open(&journal)?
        .write_all(b"39 00ab")?;
    cancel.store(false, std::sync::atomic::Ordering::Relaxed);
    let opts = BlockOptions {
        cancel: None,
        ..opts
    };
    let second = copy_device(&s, &mut d, &opts, &NoProgress)?;
    same_bytes(&src, &dst, size)?;
    assert_eq!(
        second.resumed, finished,
        "every chunk the first run finished: {second:?}"
    );
    assert_eq!(second.written + second.punched, 40 - finished, "{second:?}");
    assert_eq!(second.bytes_read_destination, 0);
    assert!(!journal.exists(), "a complete copy removes its journal");
    assert_eq!(second.manifest.expect("manifest"), manifest_of(&dst, size)?);

    // A journal of another copy (another size) is started over, not believed.
    let other = format!(
        "# ferry block journal v1\nchunk {CHUNK}\nsize 4096\n0 {:032x}\n",
        0
    );
    std::fs::write(&journal, other)?;
    let third = copy_device(&s, &mut d, &opts, &NoProgress)?;
    assert_eq!((third.resumed, third.written + third.punched), (0, 40));
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Loop devices (root)
// ---------------------------------------------------------------------------------------

fn sparse_file(path: &Path, size: u64) -> Result<()> {
    File::create(path)?.set_len(size)?;
    Ok(())
}

fn loop_ready() -> bool {
    require_root("a copy between loop devices")
        && require_tools(&["losetup", "mkfs.ext4", "mount", "diff"])
}

#[test]
fn loop_devices_copy_identical_with_zeros_punched_direct_or_buffered() -> Result<()> {
    if !loop_ready() {
        return Ok(());
    }
    let dir = scratch();
    let size = 32 * CHUNK;
    let (src_file, dst_file) = (dir.path().join("src"), dir.path().join("dst"));
    let data: Vec<u64> = (0..32).filter(|c| c % 4 == 1).collect();
    build_source(&src_file, size, &data, &[0, 2])?;
    // The destination starts full of noise: a punched chunk must read back as zeros.
    File::create(&dst_file)?.write_all(&noise(5, (size + 4 * CHUNK) as usize))?;
    let (src, dst) = (Loop::over(&src_file)?, Loop::over(&dst_file)?);

    let s = Device::open(&src.dev, false, false)?;
    let meta = std::fs::metadata(&src.dev)?;
    assert_eq!(
        (s.kind(), s.size(), s.rdev()),
        (DeviceKind::Block, size, Some(meta.rdev()))
    );
    let mut d = Device::open(&dst.dev, true, false)?;
    assert_eq!(d.size(), size + 4 * CHUNK);
    let sum = copy_device(&s, &mut d, &BlockOptions::default(), &NoProgress)?;
    same_bytes(&src.dev, &dst.dev, size)?;
    assert_eq!(
        (sum.written, sum.punched, sum.zeros),
        (8, 24, ZeroWay::Punched),
        "{sum:?}"
    );
    assert_eq!(sum.holes, 0, "a device has no holes to ask about");
    assert!(
        sum.direct,
        "two loop devices take direct I/O, the default where it can"
    );
    let alloc = allocated(&dst_file)?;
    assert!(
        alloc <= 8 * CHUNK + 4 * CHUNK + MIB,
        "punched chunks freed the backing file's blocks: {alloc} bytes allocated"
    );
    // The bytes past the source's size are left as they were.
    let mut tail = vec![0; CHUNK as usize];
    File::open(&dst.dev)?.read_exact_at(&mut tail, size)?;
    let before = noise(5, (size + 4 * CHUNK) as usize);
    assert!(
        tail[..] == before[size as usize..][..CHUNK as usize],
        "the bytes past the source's size are as they were"
    );

    // Through the page cache, the same bytes; and a re-run over it finds nothing to write.
    let (direct_file, direct_dev);
    direct_file = dir.path().join("buffered");
    sparse_file(&direct_file, size)?;
    direct_dev = Loop::over(&direct_file)?;
    let opts = BlockOptions {
        cache: Cache::Buffered,
        ..BlockOptions::default()
    };
    let s = Device::open(&src.dev, false, false)?;
    let mut d = Device::open(&direct_dev.dev, true, false)?;
    let sum = copy_device(&s, &mut d, &opts, &NoProgress)?;
    same_bytes(&src.dev, &direct_dev.dev, size)?;
    assert_eq!((sum.verified, sum.direct), (8 + 1, false));
    let rerun = BlockOptions {
        rerun: Rerun::OnlyChanged,
        ..opts
    };
    let sum = copy_device(&s, &mut d, &rerun, &NoProgress)?;
    assert_eq!(
        (sum.written, sum.punched, sum.unchanged),
        (0, 0, 32),
        "{sum:?}"
    );

    // A device smaller than the source is refused before a byte is written.
    let small_file = dir.path().join("small");
    File::create(&small_file)?.write_all(&noise(6, (8 * CHUNK) as usize))?;
    let small = Loop::over(&small_file)?;
    let mut d = Device::open(&small.dev, true, false)?;
    let err =
        copy_device(&s, &mut d, &BlockOptions::default(), &NoProgress).expect_err("too small");
    assert!(
        err.to_string().contains("at least as large as the source"),
        "{err}"
    );
    // With its reason, which a block shard reports as the job's.
    assert!(
        matches!(
            err,
            ferry_engine::Error::Refused {
                reason: ferry_crds::Reason::DestinationTooSmall,
                ..
            }
        ),
        "{err:?}"
    );
    let mut head = vec![0; (8 * CHUNK) as usize];
    File::open(&small.dev)?.read_exact(&mut head)?;
    assert!(
        head == noise(6, (8 * CHUNK) as usize),
        "nothing written to a refused destination"
    );
    Ok(())
}

#[test]
fn a_filesystem_on_a_loop_device_mounts_from_the_copy_with_every_file() -> Result<()> {
    if !loop_ready() {
        return Ok(());
    }
    let dir = scratch();
    let size = 64 * MIB;
    let (src_file, dst_file) = (dir.path().join("src"), dir.path().join("dst"));
    sparse_file(&src_file, size)?;
    sparse_file(&dst_file, size)?;
    let (src, dst) = (Loop::over(&src_file)?, Loop::over(&dst_file)?);
    sh(
        "mkfs.ext4",
        &["-q".as_ref(), "-F".as_ref(), src.dev.as_os_str()],
    )?;
    {
        let m = Mount::device(&src.dev, &dir.path().join("m"), "rw")?;
        for i in 0..50u64 {
            let sub = m.dir.join(format!("d{}", i % 5));
            std::fs::create_dir_all(&sub)?;
            std::fs::write(
                sub.join(format!("f{i}")),
                noise(100 + i, (i * 7919 % 300_000) as usize),
            )?;
        }
        std::os::unix::fs::symlink("d0/f0", m.dir.join("link"))?;
    }
    let sum = copy(&src.dev, &dst.dev, &BlockOptions::default())?;
    assert!(sum.punched > 0 && sum.written > 0, "{sum:?}");
    let (a, b) = (
        Mount::device(&src.dev, &dir.path().join("a"), "ro")?,
        Mount::device(&dst.dev, &dir.path().join("b"), "ro")?,
    );
    let out = std::process::Command::new("diff")
        .args(["-r", "--no-dereference"])
        .args([&a.dir, &b.dir])
        .output()
        .context("diff")?;
    ensure!(
        out.status.success(),
        "the copy's files differ: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(std::fs::read_dir(b.dir.join("d3"))?.count(), 10);
    Ok(())
}

#[test]
fn a_loop_device_names_its_backing_file_and_nothing_else_does() -> Result<()> {
    if !loop_ready() {
        return Ok(());
    }
    let dir = scratch();
    let file = dir.path().join("backing");
    sparse_file(&file, 4 * MIB)?;
    let dev = Loop::over(&file)?;
    let meta = std::fs::metadata(&file)?;
    let d = Device::open(&dev.dev, false, false)?;
    assert_eq!(d.loop_backing()?, Some((meta.dev(), meta.ino())));
    // An image is its own file, with no device in front of it.
    assert_eq!(Device::open(&file, false, false)?.loop_backing()?, None);
    Ok(())
}
