//! A file's chunk hashes, computed the same way on both halves of a copy between nodes so
//! that a file the destination already has, changed in a few places, is mended by sending
//! only the chunks whose hashes differ (`compare: Checksum`): chunk `i` is bytes
//! `[i << shift, (i + 1) << shift)`, the last one what is left, each hashed with
//! xxh3-128, holes as the zeros a reader sees; the whole file's hash is computed in the
//! same pass. Nothing here is trusted from the volume: both sides hash their bytes anew.

use std::io;
use std::os::fd::BorrowedFd;

use ferry_transfer::frame::{CHUNK_SHIFT_MIN, MAX_CHUNKS};
use twox_hash::XxHash3_128 as Xxh3;

use crate::data::{self, Feed, Guard};

/// Files smaller than this are sent whole when they differ: a few round trips cost more
/// than their bytes.
pub(crate) const MIN_PATCHED: u64 = 4 << 20;

/// The chunk size (as a shift) for a file of `size` bytes: 64 KiB, or the smallest power
/// of two that keeps its chunks within [`MAX_CHUNKS`].
pub(crate) fn shift_for(size: u64) -> u8 {
    let mut shift = CHUNK_SHIFT_MIN;
    while size.div_ceil(1u64 << shift) > MAX_CHUNKS as u64 {
        shift += 1;
    }
    shift
}

/// The chunks of a file of `size` bytes with chunks of `1 << shift`.
pub(crate) fn chunks_of(size: u64, shift: u8) -> u64 {
    size.div_ceil(1u64 << shift)
}

/// Hashes a file's bytes, fed in order, per chunk and whole.
pub(crate) struct Sums {
    shift: u8,
    /// Bytes fed so far.
    off: u64,
    chunk: Xxh3,
    whole: Xxh3,
    pub hashes: Vec<u128>,
}

impl Sums {
    pub(crate) fn new(shift: u8, size: u64) -> Sums {
        Sums {
            shift,
            off: 0,
            chunk: Xxh3::new(),
            whole: Xxh3::new(),
            hashes: Vec::with_capacity(chunks_of(size, shift).min(MAX_CHUNKS as u64) as usize),
        }
    }

    pub(crate) fn shift(&self) -> u8 {
        self.shift
    }

    /// The next bytes of the file.
    pub(crate) fn write(&mut self, mut data: &[u8]) {
        while !data.is_empty() {
            let boundary = ((self.off >> self.shift) + 1) << self.shift;
            let k = (boundary - self.off).min(data.len() as u64) as usize;
            self.chunk.write(&data[..k]);
            self.whole.write(&data[..k]);
            self.off += k as u64;
            data = &data[k..];
            if self.off == boundary {
                self.end_chunk();
            }
        }
    }

    /// The next `n` bytes of the file are a hole (zeros).
    pub(crate) fn zeros(&mut self, mut n: u64) {
        static ZEROS: [u8; 64 * 1024] = [0; 64 * 1024];
        while n > 0 {
            let k = n.min(ZEROS.len() as u64) as usize;
            self.write(&ZEROS[..k]);
            n -= k as u64;
        }
    }

    fn end_chunk(&mut self) {
        let h = std::mem::replace(&mut self.chunk, Xxh3::new()).finish_128();
        self.hashes.push(h);
    }

    /// The chunk hashes and the whole file's hash.
    pub(crate) fn finish(mut self) -> (Vec<u128>, u128) {
        if self.off & ((1u64 << self.shift) - 1) != 0 {
            self.end_chunk();
        }
        (self.hashes, self.whole.finish_128())
    }
}

impl Feed for Sums {
    fn data(&mut self, bytes: &[u8]) {
        self.write(bytes);
    }

    /// A hole, fed 64 MiB at a time with the stop signal asked between (an 8 TiB sparse
    /// image stops as its whole hash would).
    fn zeros(&mut self, mut n: u64, guard: &Guard<'_>) -> io::Result<()> {
        const STEP: u64 = 64 << 20;
        while n > 0 {
            let k = n.min(STEP);
            Sums::zeros(self, k);
            n -= k;
            if n > 0 {
                guard.check()?;
            }
        }
        Ok(())
    }
}

/// The chunk hashes and whole hash of the first `size` bytes of `fd` (a destination file,
/// opened as the regular file it is), and how many bytes it had (less than `size` if it
/// is shorter): read as [`data::read_fd`] reads, holes fed unread.
pub(crate) fn of_fd(
    fd: BorrowedFd<'_>,
    size: u64,
    shift: u8,
    buf: &mut Vec<u8>,
    guard: &Guard<'_>,
) -> io::Result<(Vec<u128>, u128, u64)> {
    let mut sums = Sums::new(shift, size);
    let read = data::read_fd(fd, size, buf, guard, &mut sums)?;
    let (hashes, whole) = sums.finish();
    Ok((hashes, whole, read))
}

/// The chunks of `theirs` (the source's chunk hashes) that differ from `ours` (the
/// destination's, at the same chunk size), as runs `(first, count)`. A chunk `ours` lacks
/// (the destination is shorter) differs; chunks `ours` has beyond (it is longer) are not
/// the source's, and not counted.
pub(crate) fn differing_runs(ours: &[u128], theirs: &[u128]) -> Vec<(u64, u64)> {
    let mut runs: Vec<(u64, u64)> = Vec::new();
    for (i, b) in theirs.iter().enumerate() {
        if ours.get(i) == Some(b) {
            continue;
        }
        let i = i as u64;
        match runs.last_mut() {
            Some((first, n)) if *first + *n == i => *n += 1,
            _ => runs.push((i, 1)),
        }
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_and_whole_hash_as_separate_hashes_of_the_same_bytes_would() {
        let shift = 16;
        let size = (3u64 << shift) + 100;
        let data: Vec<u8> = (0..size).map(|i| (i * 7 % 251) as u8).collect();
        let mut s = Sums::new(shift, size);
        // Fed in pieces that straddle chunk boundaries, with a "hole" of zeros inside.
        let hole = (70_000u64, 5_000u64);
        let mut with_hole = data.clone();
        with_hole[hole.0 as usize..(hole.0 + hole.1) as usize].fill(0);
        s.write(&with_hole[..hole.0 as usize]);
        s.zeros(hole.1);
        for piece in with_hole[(hole.0 + hole.1) as usize..].chunks(33_333) {
            s.write(piece);
        }
        let (hashes, whole) = s.finish();
        let want: Vec<u128> = with_hole.chunks(1 << shift).map(Xxh3::oneshot).collect();
        assert_eq!(hashes, want);
        assert_eq!(whole, Xxh3::oneshot(&with_hole));
        assert_eq!(hashes.len(), 4);
        // A file of whole chunks has no empty last chunk; an empty file has none.
        let (h, _) = {
            let mut s = Sums::new(shift, 2 << shift);
            s.zeros(2 << shift);
            s.finish()
        };
        assert_eq!(h.len(), 2);
        assert!(Sums::new(shift, 0).finish().0.is_empty());
    }

    #[test]
    fn the_chunk_size_keeps_any_file_within_the_bound() {
        assert_eq!(shift_for(0), CHUNK_SHIFT_MIN);
        assert_eq!(shift_for(4 << 30), CHUNK_SHIFT_MIN);
        assert_eq!(shift_for((4 << 30) + 1), CHUNK_SHIFT_MIN + 1);
        for size in [1u64 << 40, 27_850_000_000, 1 << 56] {
            let shift = shift_for(size);
            assert!(chunks_of(size, shift) <= MAX_CHUNKS as u64, "{size}");
            assert!(chunks_of(size, shift - 1) > MAX_CHUNKS as u64, "{size}");
        }
    }

    #[test]
    fn a_chunk_the_destination_lacks_differs_and_one_beyond_the_source_is_not_counted() {
        let theirs = [1u128, 2, 3, 4, 5];
        assert_eq!(differing_runs(&[1, 2, 9], &theirs), vec![(2, 3)]);
        assert_eq!(differing_runs(&[1, 2, 3, 4, 5, 6, 7], &theirs), Vec::new());
        assert_eq!(differing_runs(&[], &theirs), vec![(0, 5)]);
    }

    #[test]
    fn differing_chunks_come_as_runs() {
        let a = [1, 2, 3, 4, 5, 6];
        let b = [1, 9, 9, 4, 9, 6];
        assert_eq!(differing_runs(&a, &b), vec![(1, 2), (4, 1)]);
        assert!(differing_runs(&a, &a).is_empty());
    }
}
