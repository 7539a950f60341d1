//! Raw block volumes: one device copied onto another in fixed chunks across workers. Each
//! chunk is hashed (xxHash3-128); a chunk of zeros is punched where the destination makes
//! punched ranges read back as zeros, written as zeros where it cannot; on a re-run only
//! the chunks whose hashes differ are written, the destination's hashes read from it or
//! from the manifest the last run kept. A device has no names, owners or times: its bytes
//! are all there is, so the whole device's hash is the hash of its chunk hashes.
//!
//! Workers claim chunks from one counter, each with its own buffers, so the number of
//! workers is the queue depth the devices see.

mod device;
mod journal;
mod manifest;

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use twox_hash::XxHash3_128;

pub use device::{Device, DeviceKind};
pub use manifest::{ChunkManifest, MAX_CHUNK, MAX_CHUNKS, MIN_CHUNK};

use crate::data::write_all_at;
use crate::error::{checksum_mismatch, Error};
use crate::progress::{Progress, Strategy};
use crate::sys::{self, AlignedBuf};

/// The default chunk: the unit of hashing, of a re-run's comparison and of resuming.
pub const CHUNK: u64 = 4 << 20;

/// Workers a block copy has unless told otherwise (see `bench/BLOCK.md`).
pub const BLOCK_WORKERS: usize = 4;

/// Which chunks a copy writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rerun {
    /// Every chunk (a first copy: what the destination holds is not looked at).
    WriteAll,
    /// Only chunks whose hash differs from the destination's (`overwrite: IfChanged` with
    /// `compare: Checksum`): the destination is read and hashed, or its hashes taken from
    /// [`BlockOptions::kept`].
    OnlyChanged,
}

/// How a chunk of zeros reaches the destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Zeros {
    /// Punched (`fallocate(PUNCH_HOLE)`: a discard or write-zeroes on a device, a hole in an
    /// image) where the destination can; written where it answers that it cannot.
    Punch,
    /// Always written.
    Write,
}

#[derive(Debug, Clone)]
pub struct BlockOptions {
    /// Bytes per chunk: a power of two from [`MIN_CHUNK`] to [`MAX_CHUNK`].
    pub chunk: u64,
    /// Workers (the queue depth); 0 means [`BLOCK_WORKERS`].
    pub workers: usize,
    pub rerun: Rerun,
    /// The destination's chunk hashes from the run that wrote it, for [`Rerun::OnlyChanged`]:
    /// used instead of reading the destination when its chunk size and size match this copy.
    /// Only the caller knows whether nothing else wrote the destination since; the engine
    /// trusts it (it is never read from the volume).
    pub kept: Option<ChunkManifest>,
    /// Changed-block tracking: one flag per chunk, false for a chunk the source's driver
    /// says did not change since the snapshot the destination holds. Such a chunk is not
    /// read on either side; its hash is taken from [`BlockOptions::kept`]. Used only with a
    /// usable `kept` (the caller also knows the destination holds that snapshot) and a
    /// length of exactly the copy's chunks; otherwise ignored, and every chunk is compared
    /// ([`BlockSummary::delta_used`] says which).
    pub changed: Option<Vec<bool>>,
    /// Read every written chunk back from the destination and compare its hash.
    pub verify: bool,
    /// With `verify`, also read back every punched chunk (a range of zeros made by discard
    /// or write-zeroes). Otherwise only the first one of the copy is: the kernel punches a
    /// device only with an operation the device guarantees reads back as zeros
    /// (`BLKDEV_ZERO_NOFALLBACK`), and that one read checks the device keeps it.
    pub verify_punched: bool,
    /// Whether both ends bypass the page cache.
    pub cache: Cache,
    pub zeros: Zeros,
    pub cancel: Option<Arc<AtomicBool>>,
    /// Where to keep the chunks finished so far while the copy runs (a file only the caller
    /// can write, never on a volume): a copy stopped before its end and run again with the
    /// same journal neither writes nor reads on the destination a chunk the journal lists
    /// with the hash the source still has. Removed when the copy completes.
    pub journal: Option<PathBuf>,
    /// Tests: sleep this long before each chunk, so that a copy runs long enough to be
    /// killed while it runs.
    pub delay_per_chunk: Option<Duration>,
}

impl Default for BlockOptions {
    fn default() -> Self {
        BlockOptions {
            chunk: CHUNK,
            workers: 0,
            rerun: Rerun::WriteAll,
            kept: None,
            changed: None,
            verify: true,
            verify_punched: false,
            cache: Cache::Auto,
            zeros: Zeros::Punch,
            cancel: None,
            journal: None,
            delay_per_chunk: None,
        }
    }
}

/// Whether a copy goes through the page cache. Measured (bench/BLOCK.md): direct I/O on
/// both ends was faster warm and cold, and used a fifth of the CPU (no page copies, no
/// dirty pages for the final flush), so it is the default where the devices allow it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cache {
    /// Direct where both ends take `O_DIRECT` and the size is a multiple of 4096 bytes;
    /// buffered otherwise.
    Auto,
    /// `O_DIRECT` on both ends (set on their open descriptions), or the copy is refused.
    Direct,
    Buffered,
}

/// How zeros reached the destination in one copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ZeroWay {
    /// No chunk of zeros had to be written.
    None,
    Punched,
    /// Written as zeros: asked to, or the destination could not punch.
    Written,
}

/// What a block copy did (counts are chunks unless they say bytes).
#[derive(Debug, Clone)]
pub struct BlockSummary {
    pub size: u64,
    pub chunk: u64,
    pub chunks: u64,
    /// Chunks of data written.
    pub written: u64,
    /// Chunks of zeros punched.
    pub punched: u64,
    /// Chunks of zeros written as zeros.
    pub zeros_written: u64,
    /// Chunks the destination already held ([`Rerun::OnlyChanged`]).
    pub unchanged: u64,
    /// Source chunks inside a hole of an image, known to be zeros without a read.
    pub holes: u64,
    pub bytes_read_source: u64,
    pub bytes_read_destination: u64,
    pub bytes_written: u64,
    /// Chunks read back from the destination with the source's hash.
    pub verified: u64,
    /// Whether [`BlockOptions::kept`] stood in for reading the destination.
    pub kept_used: bool,
    /// Whether [`BlockOptions::changed`] spared reading the chunks it says did not change.
    pub delta_used: bool,
    /// Chunks an earlier, stopped run finished, found in the journal with the source's
    /// hash: not written again (see [`BlockOptions::journal`]).
    pub resumed: u64,
    /// Whether the copy bypassed the page cache (see [`Cache`]).
    pub direct: bool,
    pub zeros: ZeroWay,
    /// Every chunk's hash (the destination's content now); `None` when cancelled.
    pub manifest: Option<ChunkManifest>,
    pub cancelled: bool,
    pub elapsed: Duration,
}

/// Where a block copy reads its source.
#[derive(Debug)]
pub enum Source<'a> {
    /// A device (or image) on this node.
    Local(&'a Device),
    /// The device another node's agent serves (`send::SourceTop::Device`), read by range
    /// over `conn`: on a re-run, or where the journal lists the chunk, its hash crosses
    /// first and its data only where the hashes differ; pieces of zeros never cross. Every
    /// chunk that crosses is hashed here and compared with the sender's hash.
    Remote {
        conn: &'a Arc<crate::recv::Connection>,
        /// The device's size, as the sender counts it ([`Source::remote`]).
        size: u64,
        zstd: bool,
    },
}

impl<'a> Source<'a> {
    /// The device `conn`'s sender serves, its size asked for.
    pub fn remote(conn: &'a Arc<crate::recv::Connection>, zstd: bool) -> io::Result<Self> {
        let size = conn.count(false)?.bytes;
        Ok(Source::Remote { conn, size, zstd })
    }

    pub fn size(&self) -> u64 {
        match self {
            Source::Local(d) => d.size(),
            Source::Remote { size, .. } => *size,
        }
    }

    fn name(&self) -> &Path {
        match self {
            Source::Local(d) => d.name(),
            Source::Remote { .. } => Path::new("the source's device on its node"),
        }
    }
}

/// Copy `src`'s bytes onto `dst`'s first `src.size()` bytes. An image destination grows to
/// the source's size; a device destination must be at least that large, and its bytes past
/// it are left as they are. Ends with `fdatasync` of the destination.
pub fn copy_device(
    src: &Device,
    dst: &mut Device,
    opts: &BlockOptions,
    progress: &dyn Progress,
) -> Result<BlockSummary, Error> {
    copy_from(&Source::Local(src), dst, opts, progress)
}

/// [`copy_device`] from a [`Source`] on this node or another.
pub fn copy_from(
    src: &Source<'_>,
    dst: &mut Device,
    opts: &BlockOptions,
    progress: &dyn Progress,
) -> Result<BlockSummary, Error> {
    let start = Instant::now();
    let (size, chunk) = (src.size(), opts.chunk);
    ChunkManifest::check_shape(size, chunk).map_err(Error::Usage)?;
    dst.grow_image(size)?;
    if dst.size() < size {
        return Err(Error::Refused {
            reason: ferry_crds::Reason::DestinationTooSmall,
            message: format!(
                "{} holds {} bytes, less than the {size} bytes of {}: the destination must be at least as large as the source",
                dst.name().display(),
                dst.size(),
                src.name().display()
            ),
        });
    }
    let direct = match opts.cache {
        Cache::Buffered => false,
        Cache::Auto => size % AlignedBuf::ALIGN as u64 == 0 && set_direct(src, dst).is_ok(),
        Cache::Direct => {
            let align = AlignedBuf::ALIGN as u64;
            if size % align != 0 {
                return Err(Error::Usage(format!(
                    "direct I/O moves whole {align}-byte blocks, and {} holds {size} bytes: copy it without direct I/O",
                    src.name().display()
                )));
            }
            set_direct(src, dst)?;
            true
        }
    };
    let chunks = ChunkManifest::chunks(size, chunk);
    // A manifest of another shape says nothing about these chunks (and one built by hand
    // with a hash too few is not indexed past its end).
    let kept = opts.kept.as_ref().filter(|k| {
        opts.rerun == Rerun::OnlyChanged
            && (k.chunk, k.size, k.hashes.len() as u64) == (chunk, size, chunks)
    });
    let changed = opts
        .changed
        .as_deref()
        .filter(|c| kept.is_some() && c.len() as u64 == chunks);
    let (journal, done) = match &opts.journal {
        Some(path) => {
            let (j, done) = journal::Journal::open(path, chunk, size, chunks)?;
            (Some(j), done)
        }
        None => (None, Vec::new()),
    };
    let run = Run {
        src,
        dst,
        opts,
        kept,
        changed,
        journal: journal.as_ref(),
        done,
        progress,
        size,
        chunks,
        zero_hash: XxHash3_128::oneshot(&AlignedBuf::zeroed(chunk as usize)),
        zeros: AlignedBuf::zeroed(chunk as usize),
        next: AtomicU64::new(0),
        stop: AtomicBool::new(false),
        punch: AtomicU8::new(PUNCH_UNKNOWN),
        punch_checked: AtomicBool::new(false),
        n: Counters::default(),
        hashes: Mutex::new(vec![None; chunks as usize]),
        error: Mutex::new(None),
    };
    let workers = match opts.workers {
        0 => BLOCK_WORKERS,
        n => n,
    }
    .min(chunks.max(1) as usize);
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| run.worker());
        }
    });
    // What finished is listed even when the copy stops here, so a re-run resumes it.
    let listed = journal.as_ref().map_or(Ok(()), |j| j.flush(dst.as_fd()));
    if let Some(e) = run.error.into_inner().unwrap_or_else(|p| p.into_inner()) {
        return Err(e);
    }
    listed?;
    let n = &run.n;
    if n.written.load(Relaxed) + n.punched.load(Relaxed) + n.zeros_written.load(Relaxed) > 0 {
        sys::fdatasync(dst.as_fd()).map_err(|e| Error::io("fdatasync", dst.name(), e))?;
    }
    let hashes = run.hashes.into_inner().unwrap_or_else(|p| p.into_inner());
    let cancelled = hashes.iter().any(Option::is_none);
    let manifest = (!cancelled).then(|| ChunkManifest {
        chunk,
        size,
        hashes: hashes.into_iter().flatten().collect(),
    });
    if let (Some(j), false) = (journal, cancelled) {
        j.remove()?;
    }
    let zeros = match (n.punched.load(Relaxed), n.zeros_written.load(Relaxed)) {
        (0, 0) => ZeroWay::None,
        (_, 0) => ZeroWay::Punched,
        _ => ZeroWay::Written,
    };
    Ok(BlockSummary {
        size,
        chunk,
        chunks,
        written: n.written.load(Relaxed),
        punched: n.punched.load(Relaxed),
        zeros_written: n.zeros_written.load(Relaxed),
        unchanged: n.unchanged.load(Relaxed),
        holes: n.holes.load(Relaxed),
        bytes_read_source: n.read_source.load(Relaxed),
        bytes_read_destination: n.read_destination.load(Relaxed),
        bytes_written: n.bytes_written.load(Relaxed),
        verified: n.verified.load(Relaxed),
        kept_used: kept.is_some(),
        delta_used: changed.is_some(),
        resumed: n.resumed.load(Relaxed),
        direct,
        zeros,
        manifest,
        cancelled,
        elapsed: start.elapsed(),
    })
}

/// `O_DIRECT` on both ends (the local ones), or on neither: an end that refuses it (a
/// filesystem without direct I/O) has the other's flag taken back.
fn set_direct(src: &Source<'_>, dst: &Device) -> Result<(), Error> {
    let local = match src {
        Source::Local(d) => Some(*d),
        Source::Remote { .. } => None,
    };
    if let Some(s) = local {
        sys::set_direct(s.as_fd(), true).map_err(|e| Error::io("O_DIRECT on", s.name(), e))?;
    }
    sys::set_direct(dst.as_fd(), true).map_err(|e| {
        if let Some(s) = local {
            let _ = sys::set_direct(s.as_fd(), false);
        }
        Error::io("O_DIRECT on", dst.name(), e)
    })
}

const PUNCH_UNKNOWN: u8 = 0;
const PUNCH_WORKS: u8 = 1;
const PUNCH_CANNOT: u8 = 2;

#[derive(Default)]
struct Counters {
    written: AtomicU64,
    punched: AtomicU64,
    zeros_written: AtomicU64,
    unchanged: AtomicU64,
    holes: AtomicU64,
    resumed: AtomicU64,
    read_source: AtomicU64,
    read_destination: AtomicU64,
    bytes_written: AtomicU64,
    verified: AtomicU64,
}

/// One copy's shared state.
struct Run<'a> {
    src: &'a Source<'a>,
    dst: &'a Device,
    opts: &'a BlockOptions,
    kept: Option<&'a ChunkManifest>,
    /// [`BlockOptions::changed`], when it is used.
    changed: Option<&'a [bool]>,
    journal: Option<&'a journal::Journal>,
    /// The journal's chunks (their hashes when finished by an earlier run); empty without one.
    done: Vec<Option<u128>>,
    progress: &'a dyn Progress,
    size: u64,
    chunks: u64,
    /// The hash of a whole chunk of zeros, and the zeros written where punching cannot.
    zero_hash: u128,
    zeros: AlignedBuf,
    next: AtomicU64,
    stop: AtomicBool,
    punch: AtomicU8,
    /// The first punched chunk was read back (see `BlockOptions::verify_punched`).
    punch_checked: AtomicBool,
    n: Counters,
    hashes: Mutex<Vec<Option<u128>>>,
    error: Mutex<Option<Error>>,
}

impl Run<'_> {
    fn worker(&self) {
        let len = self.opts.chunk as usize;
        let (mut src_buf, mut dst_buf) = (AlignedBuf::zeroed(len), AlignedBuf::zeroed(len));
        loop {
            let cancelled = self.opts.cancel.as_ref().is_some_and(|c| c.load(Relaxed));
            if cancelled || self.stop.load(Relaxed) {
                return;
            }
            let i = self.next.fetch_add(1, Relaxed);
            if i >= self.chunks {
                return;
            }
            if let Some(d) = self.opts.delay_per_chunk {
                std::thread::sleep(d);
            }
            match self.chunk(i, &mut src_buf, &mut dst_buf) {
                Ok(h) => {
                    self.hashes.lock().unwrap_or_else(|p| p.into_inner())[i as usize] = Some(h)
                }
                Err(e) => {
                    self.stop.store(true, Relaxed);
                    self.error
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .get_or_insert(e);
                    return;
                }
            }
        }
    }

    /// Chunk `i`: read (or known zeros), hashed, compared, written or punched, read back.
    fn chunk(&self, i: u64, src_buf: &mut [u8], dst_buf: &mut [u8]) -> Result<u128, Error> {
        let off = i * self.opts.chunk;
        let len = (self.size - off).min(self.opts.chunk) as usize;
        let at = |what: &'static str, d: &Device, e: io::Error| {
            Error::io(
                what,
                format!("{} (chunk {i}, byte {off})", d.name().display()),
                e,
            )
        };
        let from_src = |what: &'static str, e: io::Error| {
            Error::io(
                what,
                format!("{} (chunk {i}, byte {off})", self.src.name().display()),
                e,
            )
        };
        // Unchanged by the driver's account: neither end is read, the kept hash stands.
        if let (Some(changed), Some(kept)) = (self.changed, self.kept) {
            if !changed[i as usize] {
                self.n.unchanged.fetch_add(1, Relaxed);
                self.progress.skipped();
                return self.finished(i, kept.hashes[i as usize]);
            }
        }
        // From another node, where only the hash may be needed (a re-run, or a chunk the
        // journal lists), the hash crosses first.
        let hash_first = matches!(self.src, Source::Remote { .. })
            && (self.opts.rerun == Rerun::OnlyChanged
                || self.done.get(i as usize).copied().flatten().is_some());
        let mut got = self
            .read_source(off, &mut src_buf[..len], hash_first)
            .map_err(|e| from_src("read", e))?;
        let hash = got.hash;
        if self.done.get(i as usize).copied().flatten() == Some(hash) {
            self.n.resumed.fetch_add(1, Relaxed);
            self.progress.resumed(len as u64);
            return Ok(hash);
        }
        if self.opts.rerun == Rerun::OnlyChanged {
            let old = match self.kept {
                Some(k) => k.hashes[i as usize],
                None => {
                    let data = &mut dst_buf[..len];
                    read_exact_at(self.dst, data, off).map_err(|e| at("read", self.dst, e))?;
                    self.n.read_destination.fetch_add(len as u64, Relaxed);
                    XxHash3_128::oneshot(data)
                }
            };
            if old == hash {
                self.n.unchanged.fetch_add(1, Relaxed);
                self.progress.skipped();
                return self.finished(i, hash);
            }
        }
        if !got.data {
            got = self
                .read_source(off, &mut src_buf[..len], false)
                .map_err(|e| from_src("read", e))?;
        }
        let (zero, hash) = (got.zero, got.hash);
        let dst = self.dst.as_fd();
        let punched = if zero {
            self.zero(off, len).map_err(|e| at("zero", self.dst, e))?
        } else {
            write_all_at(dst, &src_buf[..len], off).map_err(|e| at("write", self.dst, e))?;
            self.n.written.fetch_add(1, Relaxed);
            self.n.bytes_written.fetch_add(len as u64, Relaxed);
            false
        };
        self.progress.bytes_copied(len as u64, Strategy::ReadWrite);
        // A punched chunk past the first is zeros by the device's guarantee (see
        // `BlockOptions::verify_punched`).
        let read_back = self.opts.verify
            && !(punched && !self.opts.verify_punched && self.punch_checked.swap(true, Relaxed));
        if read_back {
            let back = &mut dst_buf[..len];
            read_exact_at(self.dst, back, off).map_err(|e| at("read back", self.dst, e))?;
            let got = XxHash3_128::oneshot(back);
            if got != hash {
                return Err(at("verify", self.dst, checksum_mismatch(hash, got)));
            }
            self.n.verified.fetch_add(1, Relaxed);
            self.progress.bytes_verified(len as u64);
        }
        self.finished(i, hash)
    }

    /// Chunk `i` holds `hash` on the destination: journaled (once flushed), if there is one.
    fn finished(&self, i: u64, hash: u128) -> Result<u128, Error> {
        if let Some(j) = self.journal {
            j.record(i, hash, self.dst.as_fd())?;
        }
        Ok(hash)
    }

    /// The source's chunk at `off` (`buf` is its length): its data in `buf` and its hash,
    /// or, from another node with `hash_only`, only the hash.
    fn read_source(&self, off: u64, buf: &mut [u8], hash_only: bool) -> io::Result<Got> {
        let len = buf.len();
        match self.src {
            Source::Local(d) => {
                if self.in_hole(d, off, len)? {
                    self.n.holes.fetch_add(1, Relaxed);
                    return Ok(Got {
                        hash: self.hash_of_zeros(len),
                        zero: true,
                        data: true,
                    });
                }
                read_exact_at(d, buf, off)?;
                self.n.read_source.fetch_add(len as u64, Relaxed);
            }
            Source::Remote { conn, zstd, .. } => {
                let theirs = conn.read_range(off, buf, hash_only, *zstd)?;
                if hash_only {
                    return Ok(Got {
                        hash: theirs,
                        zero: false,
                        data: false,
                    });
                }
                self.n.read_source.fetch_add(len as u64, Relaxed);
                let ours = XxHash3_128::oneshot(buf);
                if ours != theirs {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("the bytes received (xxh3-128 {ours:032x}) are not those the source's node read ({theirs:032x})"),
                    ));
                }
                return Ok(Got {
                    hash: ours,
                    zero: is_zero(buf),
                    data: true,
                });
            }
        }
        Ok(match is_zero(buf) {
            true => Got {
                hash: self.hash_of_zeros(len),
                zero: true,
                data: true,
            },
            false => Got {
                hash: XxHash3_128::oneshot(buf),
                zero: false,
                data: true,
            },
        })
    }

    /// Whether `[off, off + len)` of an image source is all hole (zeros without a read).
    /// A block device has no holes to ask about.
    fn in_hole(&self, src: &Device, off: u64, len: usize) -> io::Result<bool> {
        if src.kind() != DeviceKind::Image {
            return Ok(false);
        }
        Ok(match sys::seek_data_or_hole(src.as_fd(), off, true)? {
            None => true,
            Some(data) => data >= off + len as u64,
        })
    }

    fn hash_of_zeros(&self, len: usize) -> u128 {
        if len as u64 == self.opts.chunk {
            self.zero_hash
        } else {
            XxHash3_128::oneshot(&self.zeros[..len])
        }
    }

    /// Make `[off, off + len)` of the destination zeros: punched once the destination has
    /// shown it can (the first zero chunk asks), written otherwise. `true`: punched.
    fn zero(&self, off: u64, len: usize) -> io::Result<bool> {
        if self.opts.zeros == Zeros::Punch && self.punch.load(Relaxed) != PUNCH_CANNOT {
            match sys::punch_hole(self.dst.as_fd(), off, len as u64) {
                Ok(()) => {
                    self.punch.store(PUNCH_WORKS, Relaxed);
                    self.n.punched.fetch_add(1, Relaxed);
                    return Ok(true);
                }
                // The device has no discard or write-zeroes that reads back as zeros
                // (BLKDEV_ZERO_NOFALLBACK), or the filesystem no holes.
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::EOPNOTSUPP | libc::ENOSYS | libc::EINVAL | libc::ENODEV)
                    ) && self.punch.load(Relaxed) == PUNCH_UNKNOWN =>
                {
                    self.punch.store(PUNCH_CANNOT, Relaxed)
                }
                Err(e) => return Err(e),
            }
        }
        write_all_at(self.dst.as_fd(), &self.zeros[..len], off)?;
        self.n.zeros_written.fetch_add(1, Relaxed);
        self.n.bytes_written.fetch_add(len as u64, Relaxed);
        Ok(false)
    }
}

/// A source chunk as read: its hash, whether it is all zeros, and whether its data is in
/// the buffer (not for a hash that crossed alone).
struct Got {
    hash: u128,
    zero: bool,
    data: bool,
}

/// Read exactly `buf.len()` bytes at `off`; a device that ends sooner has shrunk since it
/// was measured, which is an error, not a short chunk.
pub(crate) fn read_exact_at(d: &Device, buf: &mut [u8], mut off: u64) -> io::Result<()> {
    let mut at = 0;
    while at < buf.len() {
        match sys::pread(d.as_fd(), &mut buf[at..], off) {
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("ended at byte {off}, before the size it had when opened"),
                ))
            }
            Ok(n) => {
                at += n;
                off += n as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Whether every byte is zero: 4 KiB at a time, each block's bytes OR-ed together (a
/// reduction the compiler vectorises), so random data is told apart within its first block.
pub(crate) fn is_zero(buf: &[u8]) -> bool {
    buf.chunks(4096)
        .all(|block| block.iter().fold(0u8, |acc, &b| acc | b) == 0)
}

#[cfg(test)]
mod tests {
    use super::is_zero;

    #[test]
    fn zeros_are_told_from_data_anywhere_in_the_buffer() {
        let mut buf = vec![0u8; 3 * 4096 + 13];
        assert!(is_zero(&buf));
        for at in [0, 4095, 4096, 3 * 4096 + 12] {
            buf[at] = 1;
            assert!(!is_zero(&buf), "a byte at {at}");
            buf[at] = 0;
        }
    }
}
