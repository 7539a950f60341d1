//! A file from another node that the destination already has, at the same size or (under
//! `compare: Checksum`) another, compared by checksum and found different: mended from the
//! destination's own copy and only the chunks whose hashes differ, instead of sent whole.
//! A file that grew is its old chunks compared and its new ones sent; one that was cut,
//! its remaining chunks compared and the copy cut to its length.
//!
//! The comparison asks the sender for the file's chunk hashes and its whole hash
//! ([`Frame::HashChunks`], one read there) while this side hashes its copy the same way
//! ([`sums::of_fd`]); the same whole hash keeps the file, as before. Otherwise, when at
//! most half the chunks differ, the copy stages a clone (or a copy) of the destination
//! file, asks for each run of differing chunks ([`Frame::ReadPart`]), writes them in place
//! (holes in them punched), and then hashes the whole staged file against the sender's
//! whole hash before it commits: a mended file is verified whole whatever `verify` says,
//! and one that does not match (the destination changed under it, a chunk-hash collision)
//! is sent whole on the retry. Nothing of the comparison is kept on the volume: both sides
//! hash anew each time.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::{Mutex, PoisonError};

use ferry_transfer::frame::{Frame, CHUNK_SHIFT_MAX};

use crate::data::{self, Clone, Moved};
use crate::error::source_changed;
use crate::progress::Strategy;
use crate::record::fingerprint;
use crate::recv::{Request, CREDIT};
use crate::sums::{self, MIN_PATCHED};
use crate::sys;
use crate::Verify;

use super::remote::{decompressed, RemoteFile};
use super::{Ctx, Fail, Local};

/// A filled staged file: what moved, the source's hash, the length, the hash as made.
type Filled = (Moved, Option<u128>, u64, Option<u128>);

/// What the comparison learned of a file that differs, for the copy that follows it.
pub(super) struct Patch {
    /// The destination file that was hashed, open read-only, and its length.
    base: OwnedFd,
    base_len: u64,
    shift: u8,
    /// Runs of differing chunks, `(first, count)`.
    runs: Vec<(u64, u64)>,
    /// The sender's hash of the whole file.
    whole: u128,
}

/// Where a [`RemoteFile`] keeps its [`Patch`] between the comparison and the copy (taken
/// by the first attempt: a retry sends the file whole).
#[derive(Default)]
pub(super) struct PatchSlot(Mutex<Option<Patch>>);

impl PatchSlot {
    fn put(&self, p: Patch) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Some(p);
    }

    fn take(&self) -> Option<Patch> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).take()
    }
}

/// Whether a file of `size` bytes is compared by its chunks (else by its whole hash). A
/// file small enough to travel inline in a listing never is.
pub(super) fn by_chunks(size: u64) -> bool {
    size >= MIN_PATCHED && sums::shift_for(size) <= CHUNK_SHIFT_MAX
}

impl Ctx<'_> {
    /// Compare remote file `src` with destination file `dst` (a regular file of
    /// `dst_size` bytes) by their chunk hashes, at the source's chunk size: the whole hash
    /// when they are the same; `None` when they differ, with a [`Patch`] left in `src` when
    /// mending it pays.
    pub(super) fn same_by_chunks(
        &self,
        src: &RemoteFile,
        dst: OwnedFd,
        dst_size: u64,
        local: &mut Local,
    ) -> Result<Option<u128>, Fail> {
        let size = src.st.st_size as u64;
        let shift = sums::shift_for(size);
        let conn = self.conn().map_err(|e| ("read source", e))?;
        let mut req = conn
            .request(|req| Frame::HashChunks {
                req,
                path: src.path.clone(),
                expect: fingerprint(&src.st),
                shift,
            })
            .map_err(|e| ("read source", e))?;
        // Both sides read at once: the sender its file, this side its copy.
        let (ours, our_whole, read) =
            sums::of_fd(dst.as_fd(), dst_size, shift, &mut local.buf, &self.guard())
                .map_err(|e| ("read destination", e))?;
        let bad = |what: &str| {
            let e = io::Error::other(format!("the sender answered chunk hashes with {what}"));
            ("read source", e)
        };
        let changed = || {
            let msg = "source was modified while it was compared".to_string();
            ("read source", source_changed(msg))
        };
        let theirs = match req.next().map_err(|e| ("read source", e))? {
            Frame::ChunkHashes {
                shift: s, hashes, ..
            } => {
                if s != shift || hashes.len() as u64 != sums::chunks_of(size, shift) {
                    return Err(bad("another chunk size or count"));
                }
                hashes
            }
            Frame::FileEnd { changed: true, .. } => return Err(changed()),
            _ => return Err(bad("something else")),
        };
        let whole = match req.next().map_err(|e| ("read source", e))? {
            Frame::FileEnd { changed: true, .. } => return Err(changed()),
            Frame::FileEnd {
                hash: Some(h), len, ..
            } if len == size => h,
            _ => return Err(bad("an end that is not the file's")),
        };
        if read != dst_size {
            // The destination shrank while it was read: not the same, copied whole.
            return Ok(None);
        }
        if dst_size == size && our_whole == whole {
            return Ok(Some(whole));
        }
        let runs = sums::differing_runs(&ours, &theirs);
        let differ: u64 = runs.iter().map(|r| r.1).sum();
        if differ * 2 <= theirs.len() as u64 {
            src.patch.put(Patch {
                base: dst,
                base_len: dst_size,
                shift,
                runs,
                whole,
            });
        }
        Ok(None)
    }

    /// Fill staged file `dst` from the destination's copy and the differing chunks of
    /// `src`, if the comparison left a patch: what moved, the sender's whole hash, the
    /// length, and the hash of the staged file as made (none under `verify: Full`, which
    /// re-reads it from the medium itself).
    pub(super) fn fill_patched(
        &self,
        src: &RemoteFile,
        dst: BorrowedFd<'_>,
        caps: &mut data::Caps,
        local: &mut Local,
    ) -> Option<Result<Filled, Fail>> {
        let p = src.patch.take()?;
        Some(self.patch(src, dst, p, caps, local))
    }

    fn patch(
        &self,
        src: &RemoteFile,
        dst: BorrowedFd<'_>,
        p: Patch,
        caps: &mut data::Caps,
        local: &mut Local,
    ) -> Result<Filled, Fail> {
        let size = src.st.st_size as u64;
        let guard = self.guard();
        // The destination's own bytes first: shared extents where the filesystem clones,
        // else copied (holes kept).
        let mut cloned = false;
        if caps.ficlone {
            match data::try_ficlone(dst, p.base.as_fd(), &self.opts.faults)
                .map_err(|e| ("clone", e))?
            {
                Clone::Done => cloned = true,
                Clone::Unsupported => caps.ficlone = false,
                Clone::NotThisFile => {}
            }
        }
        if !cloned {
            data::copy_sparse(
                p.base.as_fd(),
                dst,
                size.min(p.base_len),
                caps,
                &mut local.buf,
                None,
                &guard,
            )
            .map_err(|e| ("copy the destination's copy", e))?;
        }
        // To the source's length: a file cut loses its end, one that grew gets a hole
        // there until its new chunks (every one differs) are written.
        sys::ftruncate(dst, size).map_err(|e| ("truncate", e))?;
        let conn = self.conn().map_err(|e| ("read source", e))?;
        let mut received = 0u64;
        // The parts are asked for ahead of the one being written, as many as fit in one
        // file's credit together (each granted its own length, up to all of it), so that
        // a file with many scattered changes pays one round trip, not one per part, and
        // what waits here is still at most one file's credit.
        let parts = p.runs.iter().map(|&(first, n)| {
            let offset = first << p.shift;
            (offset, ((first + n) << p.shift).min(size))
        });
        let mut parts = parts.peekable();
        // Each part asked for, with its range and the credit it was granted.
        let mut asked: VecDeque<(Request, u64, u64, u64)> = VecDeque::new();
        let mut in_flight = 0u64;
        loop {
            while let Some(&(offset, end)) = parts.peek() {
                let credit = (end - offset).min(CREDIT);
                if !asked.is_empty() && in_flight + credit > CREDIT {
                    break;
                }
                parts.next();
                let req = conn
                    .request(|req| Frame::ReadPart {
                        req,
                        path: src.path.clone(),
                        expect: fingerprint(&src.st),
                        offset,
                        len: end - offset,
                        credit,
                        zstd: self.opts.compress,
                    })
                    .map_err(|e| ("read source", e))?;
                in_flight += credit;
                asked.push_back((req, offset, end, credit));
            }
            let Some((req, offset, end, credit)) = asked.pop_front() else {
                break;
            };
            received += self.write_part(req, dst, offset, end)?;
            in_flight -= credit;
        }
        self.counters
            .bytes_received
            .fetch_add(received, Ordering::Relaxed);
        let moved = Moved {
            bytes: received,
            strategy: Some(Strategy::ReadWrite),
            short: false,
        };
        // Verified whole against the sender's hash, whatever `verify` says (`Full`:
        // flushed and read back from the medium by the usual check).
        let made = match self.opts.verify {
            Verify::Full => None,
            _ => {
                let (got, _) = data::hash_fd(dst, size, &mut local.buf, &guard)
                    .map_err(|e| ("read back destination", e))?;
                Some(got)
            }
        };
        Ok((moved, Some(p.whole), size, made))
    }

    /// The answers to the part `[offset, end)` asked for in `req`, written in place in
    /// `dst` (gaps between them punched): the bytes that came.
    fn write_part(
        &self,
        mut req: Request,
        dst: BorrowedFd<'_>,
        offset: u64,
        end: u64,
    ) -> Result<u64, Fail> {
        // Where the bytes written so far end: a gap before the next extent is a hole.
        let mut at = offset;
        let mut received = 0;
        loop {
            if self.stopping() {
                return Err(("copy data", io::Error::other(data::Stopped)));
            }
            match req.next().map_err(|e| ("read source", e))? {
                Frame::Data {
                    offset: o,
                    zstd,
                    data,
                    ..
                } => {
                    let data = decompressed(zstd, data)?;
                    let n = data.len() as u64;
                    if o < at || o.checked_add(n).is_none_or(|e| e > end) {
                        let e = io::Error::other(
                            "the sender sent data outside the part asked for, or overlapping",
                        );
                        return Err(("read source", e));
                    }
                    self.hole(dst, at, o - at)?;
                    data::write_all_at(dst, &data, o).map_err(|e| ("write", e))?;
                    at = o + n;
                    received += n;
                    req.send(&Frame::Credit {
                        req: req.id(),
                        bytes: n,
                    })
                    .map_err(|e| ("read source", e))?;
                }
                Frame::FileEnd { changed: true, .. } => {
                    let msg = "source was modified while it was copied".to_string();
                    return Err(("copy data", source_changed(msg)));
                }
                Frame::FileEnd { len, .. } if len == end => {
                    self.hole(dst, at, end - at)?;
                    return Ok(received);
                }
                _ => {
                    let e = io::Error::other("the sender answered a part with something else");
                    return Err(("read source", e));
                }
            }
        }
    }

    /// Bytes `[off, off + n)` of a mended file are a hole in the source: punched (zeros
    /// written where sparseness is not kept, or the filesystem cannot punch).
    fn hole(&self, dst: BorrowedFd<'_>, off: u64, n: u64) -> Result<(), Fail> {
        if n == 0 {
            return Ok(());
        }
        if self.opts.preserve.sparseness && sys::punch_hole(dst, off, n).is_ok() {
            return Ok(());
        }
        super::remote::write_zeros(dst, off, n).map_err(|e| ("write", e))
    }
}
