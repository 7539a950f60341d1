//! A file's bytes: the strategy ladder `FICLONE` → `copy_file_range` → sparse extents →
//! `pread`/`pwrite`, with errno-driven fallbacks whose filesystem-level answers are cached
//! per (source device, destination device) pair; and their xxHash3, holes hashed unread.
//! Every loop asks the copy's stop signal ([`Guard`]) between blocks.

use std::io;
use std::os::fd::BorrowedFd;

use twox_hash::XxHash3_128 as Xxh3;

use crate::options::{Faults, Reflink};
use crate::progress::Strategy;
use crate::sys;

/// Filesystems on which `copy_file_range` may share extents instead of copying them, so
/// `reflink: never` must not use it there (xcp#20, coreutils 9.4).
const CLONING_FS: [i64; 8] = [
    0x5846_5342, // XFS
    0x9123_683e, // btrfs
    0x6969,      // NFS (server-side clone)
    0xfe53_4d42, // SMB2
    0xff53_4d42, // CIFS
    0x7461_636f, // OCFS2
    0xca45_1a4e, // bcachefs
    0x2fc1_2fc1, // ZFS (block cloning)
];

/// What one (source device, destination device) pair has shown it can do.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Caps {
    pub ficlone: bool,
    pub copy_file_range: bool,
    /// The destination filesystem supports `O_TMPFILE`.
    pub tmpfile: bool,
}

/// Per-worker cache, so the hot path takes no lock. A list, not a map: a copy meets one
/// or a few (source, destination) device pairs, and a scan of those costs less per file
/// than hashing the key.
#[derive(Debug, Default)]
pub(crate) struct CapsCache(Vec<((u64, u64), Caps)>);

impl CapsCache {
    /// The capabilities of a pair, probing the destination filesystem type on first sight.
    pub fn get(
        &mut self,
        src_dev: u64,
        dst_dev: u64,
        dst: BorrowedFd<'_>,
        reflink: Reflink,
    ) -> Caps {
        let key = (src_dev, dst_dev);
        if let Some((_, caps)) = self.0.iter().find(|(k, _)| *k == key) {
            return *caps;
        }
        let clones = sys::fs_type(dst)
            .map(|t| CLONING_FS.contains(&t))
            .unwrap_or(true);
        let caps = Caps {
            ficlone: reflink != Reflink::Never,
            copy_file_range: !(reflink == Reflink::Never && clones),
            tmpfile: true,
        };
        self.0.push((key, caps));
        caps
    }

    pub fn set(&mut self, src_dev: u64, dst_dev: u64, caps: Caps) {
        let key = (src_dev, dst_dev);
        match self.0.iter_mut().find(|(k, _)| *k == key) {
            Some((_, c)) => *c = caps,
            None => self.0.push((key, caps)),
        }
    }
}

/// Whether the copy a file belongs to is stopping (cancelled, fenced, or stopped by a full
/// destination).
pub(crate) trait Stop {
    fn should_stop(&self) -> bool;
}

/// What a file's data loops consult besides the file: the test faults, and the copy's stop
/// signal, asked between blocks so that one large file (an 8 TiB sparse image being
/// hashed, a source that never ends) never holds a suspend or a delete for its whole length.
#[derive(Clone, Copy)]
pub(crate) struct Guard<'a> {
    pub faults: &'a Faults,
    pub stop: &'a dyn Stop,
}

impl Guard<'_> {
    /// `Err(Stopped)` once the copy is stopping.
    pub(crate) fn check(&self) -> io::Result<()> {
        match self.stop.should_stop() {
            true => Err(io::Error::other(Stopped)),
            false => Ok(()),
        }
    }
}

/// A file's copy was cut off because the whole copy is stopping: not a failure of that
/// file (the copy's summary says why it stopped), and never retried.
#[derive(Debug, thiserror::Error)]
#[error("the copy stopped before this file was complete")]
pub(crate) struct Stopped;

/// Whether `err` is [`Stopped`].
pub(crate) fn is_stopped(err: &io::Error) -> bool {
    err.get_ref().is_some_and(|e| e.is::<Stopped>())
}

/// The most a source whose size reads as 0 (procfs, some FUSE files) may give before it is
/// taken for a file that never ends and refused, rather than filling the destination.
pub(crate) const UNSIZED_LIMIT: u64 = 1 << 30;

/// The outcome of a `FICLONE` attempt.
#[derive(Debug)]
pub(crate) enum Clone {
    Done,
    /// The filesystem pair cannot clone at all: remember it.
    Unsupported,
    /// This file cannot be cloned (NODATACOW, swap file, ...): copy it, try the next one.
    NotThisFile,
}

pub(crate) fn try_ficlone(
    dst: BorrowedFd<'_>,
    src: BorrowedFd<'_>,
    faults: &Faults,
) -> io::Result<Clone> {
    let res = match faults.ficlone_errno {
        Some(errno) => Err(io::Error::from_raw_os_error(errno)),
        None => sys::ficlone(dst, src),
    };
    match res {
        Ok(()) => Ok(Clone::Done),
        Err(e) => match e.raw_os_error() {
            Some(libc::EOPNOTSUPP)
            | Some(libc::ENOTTY)
            | Some(libc::ENOSYS)
            | Some(libc::EXDEV) => Ok(Clone::Unsupported),
            Some(libc::EINVAL) | Some(libc::ETXTBSY) | Some(libc::EPERM) | Some(libc::EISDIR)
            | Some(libc::EBADF) | Some(libc::EACCES) => Ok(Clone::NotThisFile),
            // EIO, ENOSPC, EDQUOT, ENOMEM: real errors (coreutils `is_terminal_error`).
            _ => Err(e),
        },
    }
}

/// One contiguous range to copy, and how.
#[derive(Debug)]
pub(crate) struct Range<'a> {
    pub src: BorrowedFd<'a>,
    pub dst: BorrowedFd<'a>,
    pub off: u64,
    /// Bytes to copy; `None` means "until the source's end of file" (procfs files report
    /// size 0, so their size is never trusted).
    pub len: Option<u64>,
}

/// Bytes moved and by which strategy (the last one used, if the ladder stepped down).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Moved {
    pub bytes: u64,
    pub strategy: Option<Strategy>,
    /// The source ended before the expected length: it shrank while being copied.
    pub short: bool,
}

/// Copy one range: `copy_file_range` when allowed, `pread`/`pwrite` otherwise or when the
/// kernel declines. A hasher forces the user-space path, since the bytes must be seen.
/// Stops early (short count) when the source ends before `len`: the caller decides
/// whether that is a change of the source.
pub(crate) fn copy_range(
    r: Range<'_>,
    caps: &mut Caps,
    buf: &mut Vec<u8>,
    mut hasher: Option<&mut Xxh3>,
    guard: &Guard<'_>,
) -> io::Result<Moved> {
    let faults = guard.faults;
    let mut done = 0u64;
    if caps.copy_file_range && hasher.is_none() {
        // 128 MiB per call: clear of the 2 GiB glibc/NFS limits (coreutils 9.8,
        // KarpelesLab/reflink#3), and short enough that the stop signal, asked between
        // calls, is heard within a second on a slow disk; a small file takes one call.
        const MAX_CALL: u64 = 128 << 20;
        let mut fall_back = false;
        loop {
            let want = match r.len {
                Some(len) if done >= len => break,
                Some(len) => (len - done).min(MAX_CALL),
                None => unsized_room(done)?.min(MAX_CALL),
            };
            if done > 0 {
                guard.check()?;
            }
            let res = if faults.copy_file_range_returns_zero {
                Ok(0)
            } else if let Some(errno) = faults.copy_file_range_errno {
                Err(io::Error::from_raw_os_error(errno))
            } else {
                sys::copy_file_range(r.src, r.off + done, r.dst, r.off + done, want as usize)
            };
            match res {
                // 0 with nothing copied: procfs, sysfs, some overlayfs. Read it instead.
                Ok(0) if done == 0 => {
                    fall_back = true;
                    break;
                }
                Ok(0) => break,
                Ok(n) => done += n as u64,
                Err(e) if done == 0 => match e.raw_os_error() {
                    Some(libc::ENOSYS) | Some(libc::EOPNOTSUPP) | Some(libc::EXDEV) => {
                        caps.copy_file_range = false;
                        fall_back = true;
                        break;
                    }
                    Some(libc::EINVAL) | Some(libc::EPERM) | Some(libc::EACCES)
                    | Some(libc::EBADF) | Some(libc::ETXTBSY) | Some(libc::ENOENT)
                    | Some(libc::EFBIG) => {
                        fall_back = true;
                        break;
                    }
                    _ => return Err(e),
                },
                Err(e) => return Err(e),
            }
        }
        if !fall_back {
            return Ok(Moved {
                bytes: done,
                strategy: Some(Strategy::CopyFileRange),
                short: r.len.is_some_and(|len| done < len),
            });
        }
    }
    // Read/write with the worker's reusable buffer (never a file-sized one: xcp pitfall).
    if buf.is_empty() {
        buf.resize(BUF_SIZE, 0);
    }
    loop {
        let want = match r.len {
            Some(len) if done >= len => break,
            Some(len) => (len - done).min(buf.len() as u64) as usize,
            None => unsized_room(done)?.min(buf.len() as u64) as usize,
        };
        if done > 0 {
            guard.check()?;
        }
        let n = match sys::pread(r.src, &mut buf[..want], r.off + done) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if let Some(h) = hasher.as_deref_mut() {
            h.write(&buf[..n]);
        }
        write_all_at(r.dst, &buf[..n], r.off + done)?;
        done += n as u64;
    }
    Ok(Moved {
        bytes: done,
        strategy: Some(Strategy::ReadWrite),
        short: r.len.is_some_and(|len| done < len),
    })
}

pub(crate) const BUF_SIZE: usize = 1 << 20;

/// How much more an unsized source may give after `done` bytes: up to [`UNSIZED_LIMIT`],
/// and one byte past it, so that reaching the limit with more to come is seen (a source
/// of exactly the limit ends there and is copied).
fn unsized_room(done: u64) -> io::Result<u64> {
    match UNSIZED_LIMIT.checked_sub(done) {
        Some(room) => Ok(room + 1),
        None => Err(io::Error::new(
            io::ErrorKind::FileTooLarge,
            format!(
                "the source's size reads as 0 but it gave more than {} GiB without ending \
                 (a file that never ends, as a FUSE or procfs file can); not copied",
                UNSIZED_LIMIT >> 30
            ),
        )),
    }
}

pub(crate) fn write_all_at(fd: BorrowedFd<'_>, mut data: &[u8], mut off: u64) -> io::Result<()> {
    while !data.is_empty() {
        match sys::pwrite(fd, data, off) {
            Ok(0) => return Err(io::Error::from(io::ErrorKind::WriteZero)),
            Ok(n) => {
                data = &data[n..];
                off += n as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Copy a sparse file extent by extent (`SEEK_DATA`/`SEEK_HOLE`), leaving holes as holes,
/// then set the final size so a trailing hole survives. Holes are hashed as the zeros a
/// reader sees, so the hash matches `xxh128sum` of the file.
pub(crate) fn copy_sparse(
    src: BorrowedFd<'_>,
    dst: BorrowedFd<'_>,
    size: u64,
    caps: &mut Caps,
    buf: &mut Vec<u8>,
    mut hasher: Option<&mut Xxh3>,
    guard: &Guard<'_>,
) -> io::Result<Moved> {
    let mut moved = Moved::default();
    let mut off = 0u64;
    // Each turn of the loop moves `off` forward or ends it (coreutils 9.10 fixed an
    // infinite loop here when SEEK_HOLE answered inconsistently).
    while off < size {
        guard.check()?;
        let Some(data) = sys::seek_data_or_hole(src, off, true)? else {
            break;
        };
        if data >= size {
            break;
        }
        let hole = sys::seek_data_or_hole(src, data, false)?
            .unwrap_or(size)
            .min(size);
        if hole <= data {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "SEEK_HOLE went backwards",
            ));
        }
        if let Some(h) = hasher.as_deref_mut() {
            hash_zeros(h, data - off, guard)?;
        }
        let m = copy_range(
            Range {
                src,
                dst,
                off: data,
                len: Some(hole - data),
            },
            caps,
            buf,
            hasher.as_deref_mut(),
            guard,
        )?;
        moved.bytes += m.bytes;
        moved.strategy = m.strategy.or(moved.strategy);
        if m.short {
            // The source shrank under us; the caller reports it.
            moved.short = true;
            return Ok(moved);
        }
        off = hole;
    }
    if let Some(h) = hasher {
        hash_zeros(h, size.saturating_sub(off), guard)?;
    }
    sys::ftruncate(dst, size)?;
    Ok(moved)
}

/// Hash `n` zero bytes (a hole) without reading them, asking the stop signal every 64 MiB.
pub(crate) fn hash_zeros(h: &mut Xxh3, mut n: u64, guard: &Guard<'_>) -> io::Result<()> {
    static ZEROS: [u8; 64 * 1024] = [0; 64 * 1024];
    let mut since_check = 0u64;
    while n > 0 {
        let k = n.min(ZEROS.len() as u64) as usize;
        h.write(&ZEROS[..k]);
        n -= k as u64;
        since_check += k as u64;
        if since_check >= 64 << 20 {
            since_check = 0;
            guard.check()?;
        }
    }
    Ok(())
}

/// Files at least this long are looked at for holes before they are hashed (one `fstat`,
/// which small files are spared).
const HOLE_CHECK_MIN: u64 = 1 << 20;

/// What reading a file's bytes feeds: its data as read, and its holes as runs of the zeros
/// a reader sees (never read).
pub(crate) trait Feed {
    fn data(&mut self, bytes: &[u8]);
    fn zeros(&mut self, n: u64, guard: &Guard<'_>) -> io::Result<()>;
}

impl Feed for Xxh3 {
    fn data(&mut self, bytes: &[u8]) {
        self.write(bytes);
    }

    fn zeros(&mut self, n: u64, guard: &Guard<'_>) -> io::Result<()> {
        hash_zeros(self, n, guard)
    }
}

/// xxHash3-128 of the first `len` bytes of `fd` (fewer if it ends sooner), and how many
/// bytes that was (see [`read_fd`]).
pub(crate) fn hash_fd(
    fd: BorrowedFd<'_>,
    len: u64,
    buf: &mut Vec<u8>,
    guard: &Guard<'_>,
) -> io::Result<(u128, u64)> {
    let mut h = Xxh3::new();
    let off = read_fd(fd, len, buf, guard, &mut h)?;
    Ok((h.finish_128(), off))
}

/// Feed `sink` the first `len` bytes of `fd` (fewer if it ends sooner); how many bytes that
/// was. Reading exactly `len` saves the end-of-file read on every small file. A sparse
/// file's holes, where the filesystem reports them (`SEEK_DATA`/`SEEK_HOLE`), are fed as
/// the zeros a reader sees without being read.
pub(crate) fn read_fd(
    fd: BorrowedFd<'_>,
    len: u64,
    buf: &mut Vec<u8>,
    guard: &Guard<'_>,
    sink: &mut impl Feed,
) -> io::Result<u64> {
    if buf.is_empty() {
        buf.resize(BUF_SIZE, 0);
    }
    // Holes are looked for only up to the file's size now: past it, a file that shrank
    // must read short, not as a hole.
    let holes_until = match len >= HOLE_CHECK_MIN {
        true => {
            let st = sys::fstat(fd)?;
            let size = st.st_size as u64;
            ((st.st_blocks as u64) * 512 < size).then_some(size.min(len))
        }
        false => None,
    };
    // The end of the data extent being read: past it, the next hole is fed unread.
    let mut data_end = match holes_until {
        Some(_) => 0,
        None => len,
    };
    let mut off = 0u64;
    while off < len {
        if off > 0 {
            guard.check()?;
        }
        if off >= data_end {
            let end = holes_until.unwrap_or(len);
            data_end = len;
            if off < end {
                // Where the filesystem cannot say, everything is data (read it all).
                if let Ok(found) = sys::seek_data_or_hole(fd, off, true) {
                    let data = found.unwrap_or(end).min(end);
                    sink.zeros(data - off, guard)?;
                    off = data;
                    if off < end {
                        data_end = match sys::seek_data_or_hole(fd, off, false) {
                            Ok(hole) => hole.unwrap_or(end).clamp(off + 1, end),
                            Err(_) => len,
                        };
                    }
                }
            }
            continue;
        }
        let want = (data_end.min(len) - off).min(buf.len() as u64) as usize;
        match sys::pread(fd, &mut buf[..want], off) {
            Ok(0) => break,
            Ok(n) => {
                sink.data(&buf[..n]);
                off += n as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(off)
}
