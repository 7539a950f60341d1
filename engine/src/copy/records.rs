//! Records of the files earlier copies into a destination wrote and verified, so that a
//! re-run which keeps a file by the quick check (two stats; the source is not opened) can
//! still list it in the manifest, with the hash an earlier run took of the source's bytes.
//! The manifest of a re-run is then the whole tree's, not only what the re-run copied.
//!
//! Where the records live is the caller's choice, and must be somewhere the destination's
//! owner cannot write: they are believed. (The agent keeps them in its own state
//! directory on the node, never in a tenant's volume; see `Options::records`.)
//!
//! A record is used only for a file the re-run keeps because the destination has the
//! source's type, size and mtime, and only when the record has that same size and mtime:
//! it then says what the bytes were when Ferry copied them from a source with that size and
//! mtime. A destination file changed in place since, with its size and mtime put back, fails
//! `xxh128sum -c` on that line: the manifest shows the change rather than hiding it.
//!
//! The file: an 8-byte magic, then fixed 56-byte records, little-endian: the path's key
//! (xxh3-64 of its directory's path, then xxh3-64 of its name: so the records of one
//! directory sit together in memory, and a walk that looks up a directory's files one
//! after another finds them in the cache), xxh3-128 of the data, size, mtime seconds,
//! mtime nanoseconds and 4 bytes of zero. Paths are not stored: the re-run knows the path
//! of the file it keeps.

use std::ffi::CString;
use std::fs::File;
use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::{Mutex, OnceLock};

use twox_hash::XxHash3_64;

use crate::sys::{self, Stat};

pub(super) const MAGIC: &[u8; 8] = b"FERRYR1\n";
const RECORD: usize = 56;

/// At most this many records are read (56 bytes of memory each, and 4 of index: 240 MiB
/// at most). A
/// destination with more files lists the rest of the files it keeps only when they are
/// copied again or compared (`compare: Checksum`); nothing else changes.
pub const MAX_RECORDS: usize = 4 << 20;

/// The key of `path` (from the copy's top): its directory's hash, then its name's.
fn key(path: &[u8]) -> u128 {
    let (dir, name) = match path.iter().rposition(|&b| b == b'/') {
        Some(i) => (&path[..i], &path[i + 1..]),
        None => (&b""[..], path),
    };
    (u128::from(XxHash3_64::oneshot(dir)) << 64) | u128::from(XxHash3_64::oneshot(name))
}

/// One file as an earlier copy left it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Record {
    path: u128,
    pub(super) hash: u128,
    size: i64,
    mtime: (i64, i64),
}

impl Record {
    /// The record of `path` (from the copy's top) with data hash `hash` and the size and
    /// mtime the destination was given from source stat `st`.
    pub(super) fn of(path: &[u8], hash: u128, st: &Stat) -> Self {
        Self {
            path: key(path),
            hash,
            size: st.st_size,
            mtime: (st.st_mtime, st.st_mtime_nsec),
        }
    }

    pub(super) fn bytes(&self) -> [u8; RECORD] {
        let mut out = [0u8; RECORD];
        out[0..16].copy_from_slice(&self.path.to_le_bytes());
        out[16..32].copy_from_slice(&self.hash.to_le_bytes());
        out[32..40].copy_from_slice(&self.size.to_le_bytes());
        out[40..48].copy_from_slice(&self.mtime.0.to_le_bytes());
        out[48..52].copy_from_slice(&(self.mtime.1 as u32).to_le_bytes());
        out
    }

    fn parse(b: &[u8; RECORD]) -> Option<Self> {
        let u128_at = |i: usize| u128::from_le_bytes(b[i..i + 16].try_into().unwrap_or_default());
        let i64_at = |i: usize| i64::from_le_bytes(b[i..i + 8].try_into().unwrap_or_default());
        let nsec = u32::from_le_bytes(b[48..52].try_into().unwrap_or_default());
        if nsec >= 1_000_000_000 || b[52..56] != [0; 4] {
            return None;
        }
        Some(Self {
            path: u128_at(0),
            hash: u128_at(16),
            size: i64_at(32),
            mtime: (i64_at(40), i64::from(nsec)),
        })
    }
}

/// The records an earlier copy left, by key, with an index of where each value of the
/// key's top bits starts. A walk looks up one directory's files one after another: they are
/// one bucket, in the cache after the first, where a binary search over all the records
/// missed the cache at most of its 17 steps on 100k records (measured: the largest user-side
/// cost of a re-run's walk).
#[derive(Debug, Default)]
pub(super) struct Earlier {
    /// The records as read.
    bytes: Vec<u8>,
    /// Record numbers, by bucket and by key within one.
    order: Vec<u32>,
    /// `order[starts[b]..starts[b + 1]]` are the records whose key's top `bits` bits are b.
    starts: Vec<u32>,
    bits: u32,
}

impl Earlier {
    /// Open `path` and check it is records (nothing when it does not exist): only a
    /// regular file that starts as [`Records`] write them (opened without following a
    /// link, without waiting on a FIFO). The bulk is read by [`Lazy::get`], at most
    /// [`MAX_RECORDS`] of it; a cut-short last record is ignored.
    pub(super) fn open(path: &Path) -> io::Result<Lazy> {
        let mut file = match open_own_file(path, libc::O_RDONLY, false) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Lazy::none()),
            Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "not a regular file; records are one",
                ))
            }
            Err(e) => return Err(e),
        };
        let meta = file.metadata()?;
        let mut magic = [0u8; 8];
        file.read_exact(&mut magic)?;
        if &magic != MAGIC {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "not records Ferry wrote (wrong magic)",
            ));
        }
        let count = ((meta.len().saturating_sub(8)) as usize / RECORD).min(MAX_RECORDS);
        Ok(Lazy {
            cell: OnceLock::new(),
            file: Mutex::new(Some((file, count))),
        })
    }

    /// Read `count` records from `file` (past the magic) in one read, and index them.
    fn load(file: File, count: usize) -> io::Result<Self> {
        let mut bytes = Vec::with_capacity(count * RECORD);
        file.take((count * RECORD) as u64).read_to_end(&mut bytes)?;
        let n = bytes.len() / RECORD;
        // Each checked once; kept as read (a copy of 100k records, or of an index, is
        // thousands of page faults: the better part of the cost, measured).
        let mut keys = Vec::with_capacity(n);
        for chunk in bytes.chunks_exact(RECORD) {
            let parsed = chunk.try_into().ok().and_then(Record::parse);
            let Some(r) = parsed else {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "a malformed record; not records Ferry wrote",
                ));
            };
            keys.push(r.path);
        }
        let bits = (n.max(1).ilog2() + 1).clamp(1, 22);
        let buckets = 1usize << bits;
        let mut starts = vec![0u32; buckets + 1];
        for &k in &keys {
            starts[Self::bucket(k, bits) + 1] += 1;
        }
        for b in 0..buckets {
            starts[b + 1] += starts[b];
        }
        // Record numbers by bucket, in the order written within one (a counting sort).
        let mut next = starts.clone();
        let mut order = vec![0u32; n];
        for (i, &k) in keys.iter().enumerate() {
            let b = Self::bucket(k, bits);
            order[next[b] as usize] = i as u32;
            next[b] += 1;
        }
        // A bucket is about one directory's records (the key's top bits are its
        // directory's), which the walk wrote near each other: sorted by key (stably: the
        // last written of equal keys stays last), for a binary search inside it.
        for b in 0..buckets {
            order[starts[b] as usize..starts[b + 1] as usize].sort_by_key(|&i| keys[i as usize]);
        }
        Ok(Self {
            bytes,
            order,
            starts,
            bits,
        })
    }

    fn bucket(path: u128, bits: u32) -> usize {
        (path >> (128 - bits)) as usize
    }

    /// Record number `i`, checked when read.
    fn record(&self, i: u32) -> Option<Record> {
        let at = i as usize * RECORD;
        Record::parse(self.bytes.get(at..at + RECORD)?.try_into().ok()?)
    }

    /// The key of record number `i` alone (its first 16 bytes; every record was checked when
    /// read): what a binary search step needs.
    fn key_at(&self, i: u32) -> u128 {
        let at = i as usize * RECORD;
        self.bytes
            .get(at..at + 16)
            .and_then(|b| b.try_into().ok())
            .map_or(0, u128::from_le_bytes)
    }

    /// The hash recorded for `path`, if its record has the size and mtime of `st` (the
    /// source's, which the kept destination file has too).
    pub(super) fn hash_of(&self, path: &[u8], st: &Stat) -> Option<u128> {
        if self.order.is_empty() {
            return None;
        }
        let want = Record::of(path, 0, st);
        let b = Self::bucket(want.path, self.bits);
        let (from, to) = (self.starts[b] as usize, self.starts[b + 1] as usize);
        // The last one written wins (a resumed run may have recorded a file twice): the
        // last of the equal keys.
        let bucket = &self.order[from..to];
        let after = bucket.partition_point(|&i| self.key_at(i) <= want.path);
        let r = self.record(*bucket[..after].last()?)?;
        (r.path == want.path && r.size == want.size && r.mtime == want.mtime).then_some(r.hash)
    }

    pub(super) fn is_empty(&self) -> bool {
        self.order.is_empty()
    }
}

/// Records read on another thread while the walk starts (reading and indexing 100k of
/// them is a few tens of milliseconds the walk need not wait for): the first lookup waits
/// until they are in.
#[derive(Debug, Default)]
pub(super) struct Lazy {
    cell: OnceLock<Earlier>,
    file: Mutex<Option<(File, usize)>>,
}

impl Lazy {
    /// No records.
    pub(super) fn none() -> Self {
        Self::default()
    }

    /// The records, read now by whichever thread asks first (the others wait). Records that
    /// turn out malformed past their magic count as none: every kept file is then reported
    /// as not listed, never listed from a bad record.
    pub(super) fn get(&self) -> &Earlier {
        self.cell.get_or_init(|| {
            let taken = self.file.lock().map(|mut f| f.take()).unwrap_or(None);
            match taken {
                Some((file, count)) => Earlier::load(file, count).unwrap_or_default(),
                None => Earlier::default(),
            }
        })
    }
}

/// Open the file this copy's records go to: created (never through a link planted at
/// its name), and appended to by a resumed copy, which keeps the interrupted run's.
pub(super) fn create(path: &Path, resume: bool) -> io::Result<File> {
    let mut file = open_own_file(path, libc::O_RDWR, true)?;
    let len = file.metadata()?.len();
    if resume && len >= 8 {
        let mut magic = [0u8; 8];
        file.read_exact(&mut magic)?;
        if &magic == MAGIC {
            // Drop a record cut short by the process that died writing it.
            let keep = 8 + (len - 8) / RECORD as u64 * RECORD as u64;
            file.set_len(keep)?;
            io::Seek::seek(&mut file, io::SeekFrom::Start(keep))?;
            return Ok(file);
        }
    }
    file.set_len(0)?;
    io::Write::write_all(&mut file, MAGIC)?;
    Ok(file)
}

/// Open Ferry's own file at `path` (a manifest, records) only if it is a regular file, or
/// with `create` make it (mode 0666 less the umask) when nothing has the name. Whatever
/// else is there (a device, a FIFO, a symlink) is refused unopened (InvalidData; see
/// `sys::open_regular`).
pub(super) fn open_own_file(path: &Path, flags: libc::c_int, create: bool) -> io::Result<File> {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in path"))?;
    let opened = match create {
        true => sys::create_or_open_regular(&c, flags, 0o666)?,
        false => sys::open_regular_path(&c, flags, false)?,
    };
    match opened {
        sys::Opened::Open(fd, _) => Ok(File::from(fd)),
        sys::Opened::Other(_) => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "not a regular file (Ferry never opens anything else as its own file)",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl Earlier {
        fn read(path: &Path) -> io::Result<Self> {
            let lazy = Self::open(path)?;
            let (file, count) = lazy
                .file
                .lock()
                .expect("lock")
                .take()
                .unwrap_or_else(|| (tempfile::tempfile().expect("tempfile"), 0));
            Self::load(file, count)
        }
    }
    use std::io::Write;

    /// A real file's stat with the size and mtime a record looks at set.
    fn stat(size: i64, mtime: (i64, i64)) -> Stat {
        let file = tempfile::tempfile().expect("tempfile");
        let mut st = crate::sys::fstat(std::os::fd::AsFd::as_fd(&file)).expect("fstat");
        st.st_size = size;
        st.st_mtime = mtime.0;
        st.st_mtime_nsec = mtime.1;
        st
    }

    #[test]
    fn a_record_is_used_only_for_the_size_and_mtime_it_has() -> io::Result<()> {
        let tmp = tempfile::tempdir()?;
        let path = tmp.path().join("records");
        let mut f = create(&path, false)?;
        let st = stat(5, (1_600_000_000, 7));
        f.write_all(&Record::of(b"a/b", 42, &st).bytes())?;
        f.write_all(&Record::of(b"a/c", 43, &st).bytes())?;
        drop(f);
        let earlier = Earlier::read(&path)?;
        assert_eq!(earlier.hash_of(b"a/b", &st), Some(42));
        assert_eq!(earlier.hash_of(b"a/c", &st), Some(43));
        assert_eq!(earlier.hash_of(b"a/d", &st), None);
        assert_eq!(earlier.hash_of(b"a/b", &stat(6, (1_600_000_000, 7))), None);
        assert_eq!(earlier.hash_of(b"a/b", &stat(5, (1_600_000_000, 8))), None);
        Ok(())
    }

    #[test]
    fn a_resumed_copy_appends_and_drops_a_record_cut_short() -> io::Result<()> {
        let tmp = tempfile::tempdir()?;
        let path = tmp.path().join("records");
        let st = stat(1, (1, 0));
        let mut f = create(&path, false)?;
        f.write_all(&Record::of(b"one", 1, &st).bytes())?;
        f.write_all(&Record::of(b"two", 2, &st).bytes()[..20])?;
        drop(f);
        let mut f = create(&path, true)?;
        f.write_all(&Record::of(b"two", 3, &st).bytes())?;
        drop(f);
        let earlier = Earlier::read(&path)?;
        assert_eq!(earlier.hash_of(b"one", &st), Some(1));
        assert_eq!(earlier.hash_of(b"two", &st), Some(3));
        // Not resumed: a new file.
        drop(create(&path, false)?);
        assert!(Earlier::read(&path)?.is_empty());
        Ok(())
    }

    #[test]
    fn anything_but_records_is_refused() -> io::Result<()> {
        let tmp = tempfile::tempdir()?;
        let path = tmp.path().join("records");
        assert!(Earlier::read(&path)?.is_empty(), "missing: no records");
        std::fs::write(&path, b"0123456789abcdef0123456789abcdef  a\n")?;
        assert!(Earlier::read(&path).is_err());
        let mut bad = MAGIC.to_vec();
        let mut rec = Record::of(b"x", 1, &stat(1, (1, 0))).bytes();
        rec[52] = 1;
        bad.extend_from_slice(&rec);
        std::fs::write(&path, &bad)?;
        assert!(Earlier::read(&path).is_err());
        std::fs::remove_file(&path)?;
        std::os::unix::fs::symlink(tmp.path().join("elsewhere"), &path)?;
        assert!(Earlier::read(&path).is_err(), "a link is not followed");
        Ok(())
    }
}
