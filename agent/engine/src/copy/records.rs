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
//! The file: an 8-byte magic, then fixed 56-byte records, little-endian: xxh3-128 of the
//! path, xxh3-128 of the data, size, mtime seconds, mtime nanoseconds and 4 bytes of zero.
//! Paths are not stored: the re-run knows the path of the file it keeps.

use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use xxhash_rust::xxh3::xxh3_128;

use crate::sys::Stat;

pub(super) const MAGIC: &[u8; 8] = b"FERRYR1\n";
const RECORD: usize = 56;

/// At most this many records are read (56 bytes of memory each, and 4 of index: 240 MiB
/// at most). A
/// destination with more files lists the rest of the files it keeps only when they are
/// copied again or compared (`compare: Checksum`); nothing else changes.
pub const MAX_RECORDS: usize = 4 << 20;

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
            path: xxh3_128(path),
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

/// The records an earlier copy left, sorted by path, with an index of where each value
/// of the path hash's top bits starts: a lookup is one or two cache misses, where a binary
/// search of 100k records is 17 (measured: a third of the cost of listing kept files).
#[derive(Debug, Default)]
pub(super) struct Earlier {
    records: Vec<Record>,
    /// `starts[b]..starts[b + 1]` are the records whose path hash's top `bits` bits are b.
    starts: Vec<u32>,
    bits: u32,
}

impl Earlier {
    /// Read `path`: nothing when it does not exist. Only a regular file written by
    /// [`Records`] is read (opened without following a link, without waiting on a FIFO),
    /// and at most [`MAX_RECORDS`] of it; a cut-short last record is ignored.
    pub(super) fn read(path: &Path) -> io::Result<Self> {
        let file = match std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(path)
        {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Self::default()),
            Err(e) => return Err(e),
        };
        let meta = file.metadata()?;
        if !meta.is_file() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "not a regular file; records are one",
            ));
        }
        let count = ((meta.len().saturating_sub(8)) as usize / RECORD).min(MAX_RECORDS);
        // Read whole (at most MAX_RECORDS of it): one read, no per-record call.
        let mut bytes = Vec::with_capacity(8 + count * RECORD);
        file.take((8 + count * RECORD) as u64)
            .read_to_end(&mut bytes)?;
        if bytes.get(..8) != Some(MAGIC.as_slice()) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "not records Ferry wrote (wrong magic)",
            ));
        }
        let mut records = Vec::with_capacity(count);
        for chunk in bytes[8..].chunks_exact(RECORD) {
            let parsed = chunk.try_into().ok().and_then(Record::parse);
            let Some(r) = parsed else {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "a malformed record; not records Ferry wrote",
                ));
            };
            records.push(r);
        }
        Ok(Self::indexed(records))
    }

    /// Placed by bucket (the path hash's top bits; about one record per bucket, at most
    /// 2^22 buckets: 16 MiB of index) in two passes, in the order written within a bucket.
    fn indexed(records: Vec<Record>) -> Self {
        let bits = (records.len().max(1).ilog2() + 1).clamp(1, 22);
        let buckets = 1usize << bits;
        let mut starts = vec![0u32; buckets + 1];
        for r in &records {
            starts[Self::bucket(r.path, bits) + 1] += 1;
        }
        for b in 0..buckets {
            starts[b + 1] += starts[b];
        }
        let mut next = starts.clone();
        let mut placed = vec![None; records.len()];
        for r in records {
            let b = Self::bucket(r.path, bits);
            placed[next[b] as usize] = Some(r);
            next[b] += 1;
        }
        Self {
            records: placed.into_iter().flatten().collect(),
            starts,
            bits,
        }
    }

    fn bucket(path: u128, bits: u32) -> usize {
        (path >> (128 - bits)) as usize
    }

    /// The hash recorded for `path`, if its record has the size and mtime of `st` (the
    /// source's, which the kept destination file has too).
    pub(super) fn hash_of(&self, path: &[u8], st: &Stat) -> Option<u128> {
        if self.records.is_empty() {
            return None;
        }
        let want = Record::of(path, 0, st);
        let b = Self::bucket(want.path, self.bits);
        let (from, to) = (self.starts[b] as usize, self.starts[b + 1] as usize);
        // The last one written wins (a resumed run may have recorded a file twice).
        let r = self.records[from..to]
            .iter()
            .rev()
            .find(|r| r.path == want.path)?;
        (r.size == want.size && r.mtime == want.mtime).then_some(r.hash)
    }

    pub(super) fn is_empty(&self) -> bool {
        self.records.is_empty()
    }
}

/// Open the file this copy's records go to: created (never through a link planted at
/// its name), and appended to by a resumed copy, which keeps the interrupted run's.
pub(super) fn create(path: &Path, resume: bool) -> io::Result<File> {
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)?;
    let len = file.metadata()?.len();
    if resume && len >= 8 {
        let mut magic = [0u8; 8];
        file.read_exact(&mut magic)?;
        if &magic == MAGIC {
            // Drop a record cut short by the process that died writing it.
            let keep = 8 + (len - 8) / RECORD as u64 * RECORD as u64;
            file.set_len(keep)?;
            return append_from(file, keep);
        }
    }
    file.set_len(0)?;
    io::Write::write_all(&mut file, MAGIC)?;
    Ok(file)
}

fn append_from(file: File, at: u64) -> io::Result<File> {
    use std::io::Seek;
    let mut file = file;
    file.seek(io::SeekFrom::Start(at))?;
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;
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
