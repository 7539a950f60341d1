//! Regular files: open the source, copy data and metadata into a staged file, check the
//! source did not change meanwhile, verify, commit; and the retries after a changed source
//! or an I/O error.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use twox_hash::XxHash3_128 as Xxh3;

use crate::data::{self, Caps, Clone, Moved, Range};
use crate::error::{
    checksum_mismatch, checksum_mismatch_msg, kind_of, source_changed, ReflinkRefused,
};
use crate::meta::{self, SrcXattrs};
use crate::options::{Overwrite, Reflink, Verify};
use crate::progress::Strategy;
use crate::sys::{self, Stat};
use crate::Reason;

use super::stage::Staged;
use super::{is_type, Ctx, Fail, Local, OpenDir, Rec, Skip, SrcEntry, SrcFile};

/// Files at least this large (and not cloned, sparse or hashed) are copied in chunks by
/// several workers.
const CHUNK_THRESHOLD: u64 = 128 << 20;

/// Attempts at a file whose source keeps changing while it is copied, in all.
const ATTEMPTS_WHILE_CHANGING: u32 = 3;

/// Fresh rewrites of a file after an I/O error reading its source or writing its copy.
const REWRITES_AFTER_IO_ERROR: u32 = 1;

/// Times a file from another node is sent again after its bytes arrived changed.
const RESENDS_AFTER_MISMATCH: u32 = 1;

/// How a regular file's source is opened, once it is known to be one (see
/// `sys::open_regular`: a FIFO or device swapped in since the listing is recreated, never
/// opened). (O_NONBLOCK, kept from when the check came after the open, is a no-op on a
/// regular file.)
const SOURCE_FLAGS: libc::c_int = libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY;

/// Earlier attempts at one regular file, by why they failed.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Tries {
    /// The source changed while it was copied.
    changed: u32,
    /// An I/O error reading the source or writing (or flushing) the copy.
    io: u32,
    /// From another node: the copy did not hash as what the sender read (changed in flight).
    mismatch: u32,
}

enum FillOutcome {
    Committed(Option<u128>),
    /// Large enough to be copied in chunks by several workers, with these capabilities.
    Chunk(Caps),
    Kept,
}

impl<'a> Ctx<'a> {
    /// Whether a file of `dir` the destination has is kept or not from the two stats alone
    /// (a merge by the quick check, not resumed): then the source is opened only for the
    /// files that are copied.
    pub(super) fn keeps_by_stats(&self, dir: &OpenDir) -> bool {
        !dir.fresh
            && !self.opts.resume
            && self.opts.overwrite != Overwrite::Always
            && !self.compares_content(dir)
    }

    pub(super) fn regular(
        &self,
        dir: &Arc<OpenDir>,
        src_name: &CStr,
        dst_name: &CStr,
        rec: Option<&Rec>,
        local: &mut Local,
    ) -> Result<Option<Skip>, Fail> {
        // One clock read per file, for the copy-time histogram; the commit reads it again.
        let started = Instant::now();
        // A merge that keeps what the destination has (never; if-changed by the quick
        // check) decides from two stats, without opening the source: a re-run over an
        // unchanged tree is a metadata walk. (A resumed copy, and compare: Checksum, need
        // the open file; whatever is not kept here is opened and decided below.)
        if self.keeps_by_stats(dir) {
            if let Ok(st) = self.src_lstat(dir, src_name, rec) {
                if is_type(&st, libc::S_IFREG) && self.keep_existing(dir, dst_name, &st)? {
                    self.list_kept(dir, dst_name, &st);
                    return Ok(Some(Skip::Kept));
                }
            }
        }
        let (src, st) = match self.src_open_file(dir, src_name, SOURCE_FLAGS, rec) {
            Ok(SrcEntry::File(src, st)) => (src, st),
            // It became a symlink, a FIFO or a device since the listing (never opened):
            // copied as what it is now.
            Ok(SrcEntry::Other(st)) => return self.non_regular(dir, src_name, dst_name, &st, rec),
            Err(e) => return Err(("open source", e)),
        };
        if self.compares_content(dir) {
            if self.kept_if_same(dir, dst_name, &src, &st, local)? {
                return Ok(Some(Skip::Kept));
            }
            // Not the same: replaced below. (Asked for its refusals only: a directory at
            // the name is a conflict, as under the quick check.)
            self.keep_existing(dir, dst_name, &st)?;
        } else if self.keep_existing_file(dir, dst_name, &st)? {
            let resumed_ours = self.opts.resume && dir.ours;
            let partial = resumed_ours && !self.may_be_finished(dir, dst_name, &st)?;
            if !partial {
                if self.opts.resume && self.opts.preserve.hard_links && st.st_nlink > 1 {
                    return self.adopt_linked(dir, &src, dst_name, &st, local);
                }
                let committed = match self.opts.resume {
                    true => self.committed_earlier(dir, dst_name, &src, &st, local)?,
                    false => true,
                };
                if committed || !resumed_ours {
                    return Ok(Some(Skip::Kept));
                }
            }
            // Our own file, not finished: the run that died was writing it.
            sys::unlinkat(dir.dst.as_fd(), dst_name, false)
                .map_err(|e| ("remove an unfinished file", e))?;
        }
        self.in_link_group(dir, dst_name, &st, || {
            let first = Tries::default();
            self.copy_regular(dir, src, src_name, &st, dst_name, started, local, first)
        })
    }

    /// A regular file the quick check kept, in a copy that writes a manifest: listed with
    /// the hash an earlier copy recorded for it at its size and mtime, or counted as not
    /// listed. (Under `overwrite: Never` the destination was not compared: never listed.)
    fn list_kept(&self, dir: &OpenDir, name: &CStr, st: &Stat) {
        if self.manifest.is_none() || self.opts.overwrite != Overwrite::IfChanged {
            return;
        }
        let earlier = self.earlier.get();
        // (Without records, no path is built.)
        let path = (!earlier.is_empty()).then(|| dir.child_path(name));
        match path.and_then(|p| Some((earlier.hash_of(&p, st)?, p))) {
            Some((hash, path)) => {
                self.manifest_line(hash, &path, Some(st));
                self.counters
                    .listed_from_records
                    .fetch_add(1, Ordering::Relaxed);
            }
            None => {
                self.counters.unlisted.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Copy a regular file's data and metadata to a staged file, verify, and commit it.
    /// `Ok(Some(hash))` when committed (hash when hashing), `Ok(None)` when handed to
    /// chunk workers that will finish it. An attempt that fails because the source changed
    /// under it, or with an I/O error, is discarded and the file copied again from a fresh
    /// open of its source (see [`Ctx::retry`]); `tries` counts the attempts before this call.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn copy_regular(
        &self,
        dir: &Arc<OpenDir>,
        mut src: SrcFile,
        src_name: &CStr,
        st: &Stat,
        name: &CStr,
        started: Instant,
        local: &mut Local,
        mut tries: Tries,
    ) -> Result<Option<Option<u128>>, Fail> {
        if let Some(d) = self.opts.faults.delay_per_file {
            std::thread::sleep(d);
        }
        let mut st = *st;
        loop {
            let mut caps =
                local
                    .caps
                    .get(dir.src_dev, dir.dst_dev, dir.dst.as_fd(), self.opts.reflink);
            let mut staged = self.stage(dir, &st, name, &mut caps)?;
            let result = self.fill_regular(
                dir,
                &src,
                src_name,
                &mut staged,
                &st,
                name,
                started,
                &mut caps,
                local,
                tries,
            );
            local.caps.set(dir.src_dev, dir.dst_dev, caps);
            let err = match result {
                Ok(FillOutcome::Committed(hash)) => return Ok(Some(hash)),
                Ok(FillOutcome::Chunk(caps)) => {
                    let file = (src_name, name, caps, started, tries);
                    // (Only a local file is chunked: `fill_regular` says so.)
                    if let Some(fd) = src.fd() {
                        self.start_chunks(dir, fd, staged, &st, file, local);
                        return Ok(None);
                    }
                    (
                        "copy data",
                        io::Error::other("internal: a remote file to chunk"),
                    )
                }
                Ok(FillOutcome::Kept) => {
                    // An entry appeared at its name meanwhile, and the policy keeps it.
                    self.count_skipped();
                    return Ok(Some(None));
                }
                Err(err) => err,
            };
            self.discard(dir, &mut staged);
            drop(staged);
            (src, st) = self.retry(dir, src_name, &mut tries, err)?;
        }
    }

    /// After a failed attempt at a regular file (its staged copy already discarded): the
    /// source to copy it again from, or the error to report. A source that changed while
    /// it was copied is tried again, up to [`ATTEMPTS_WHILE_CHANGING`] attempts in all; an
    /// I/O error (reading the source, writing or flushing the copy) gets one fresh rewrite.
    /// Always from a new open of the source and into a new staged file: a handle that
    /// failed may keep failing (FUSE, NFS), and after a failed flush the kernel may have
    /// dropped the pages it could not write, so the old fd is never flushed again.
    pub(super) fn retry(
        &self,
        dir: &OpenDir,
        src_name: &CStr,
        tries: &mut Tries,
        (op, err): Fail,
    ) -> Result<(SrcFile, Stat), Fail> {
        if self.stopping() {
            return Err((op, err));
        }
        match kind_of(&err) {
            Reason::SourceChanged => {
                tries.changed += 1;
                if tries.changed >= ATTEMPTS_WHILE_CHANGING {
                    let msg = format!(
                        "{err}; gave up after {} attempts, the source changed during each",
                        tries.changed
                    );
                    return Err((op, source_changed(msg)));
                }
            }
            // Only errors the kernel reported: ours (a stopped copy...) are final.
            Reason::IOError if err.raw_os_error().is_some() => {
                if tries.io >= REWRITES_AFTER_IO_ERROR {
                    let msg = format!("{err} (again on a fresh rewrite from the source)");
                    return Err((op, io::Error::other(msg)));
                }
                tries.io += 1;
            }
            // Bytes from another node that do not hash as the sender read them were changed
            // on the way: sent once more, then reported. (Locally a mismatch is the
            // storage's, and a second read would not be more right: reported at once.)
            Reason::ChecksumMismatch if dir.src.fd().is_none() => {
                if tries.mismatch >= RESENDS_AFTER_MISMATCH {
                    let msg = format!("{err} (again when sent once more from the source's node)");
                    return Err((op, checksum_mismatch_msg(msg)));
                }
                tries.mismatch += 1;
                self.progress.resent();
            }
            _ => return Err((op, err)),
        }
        // (From another node: its record asked for again.)
        match self
            .src_open_file(dir, src_name, SOURCE_FLAGS, None)
            .map_err(|e| ("open source", e))?
        {
            SrcEntry::File(src, st) => Ok((src, st)),
            SrcEntry::Other(_) => {
                let msg = "the source stopped being a regular file while it was copied";
                Err(("open source", source_changed(msg.into())))
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn fill_regular(
        &self,
        dir: &Arc<OpenDir>,
        src: &SrcFile,
        src_name: &CStr,
        staged: &mut Staged,
        st: &Stat,
        name: &CStr,
        started: Instant,
        caps: &mut Caps,
        local: &mut Local,
        tries: Tries,
    ) -> Result<FillOutcome, Fail> {
        let opts = self.opts;
        let size = st.st_size as u64;
        let dst = staged.fd.as_fd();
        let mut moved = Moved::default();
        let mut cloned = false;
        // Bytes the destination holds once written (holes included).
        let mut logical_len = size;
        let src = match src {
            SrcFile::Fd(fd) => fd,
            SrcFile::Remote(remote) => {
                // From another node: its bytes as they arrive, the sender's hash of what it
                // read, and whether the file changed meanwhile (the sender's check).
                let (filled, patched) = match self.fill_patched(remote, dst, caps, local) {
                    Some(filled) => (filled?, true),
                    None => (self.fill_remote(remote, dst)?, false),
                };
                let file = (dir, name, staged, started);
                let outcome = self.finish_regular(
                    src_name,
                    src.xattrs(),
                    st,
                    file,
                    filled,
                    caps,
                    local,
                    tries,
                )?;
                if patched && matches!(outcome, FillOutcome::Committed(_)) {
                    self.counters.patched.fetch_add(1, Ordering::Relaxed);
                }
                return Ok(outcome);
            }
        };
        if caps.ficlone && size > 0 {
            match data::try_ficlone(dst, src.as_fd(), &opts.faults).map_err(|e| ("clone", e))? {
                Clone::Done => {
                    cloned = true;
                    moved = Moved {
                        bytes: size,
                        strategy: Some(Strategy::Reflink),
                        short: false,
                    };
                }
                Clone::Unsupported => caps.ficlone = false,
                Clone::NotThisFile => {}
            }
        }
        if !cloned && opts.reflink == Reflink::Always && size > 0 {
            return Err(("clone", io::Error::other(ReflinkRefused)));
        }
        let src_hash = if cloned {
            match self.hash {
                true => {
                    let (hash, n) = data::hash_fd(src.as_fd(), size, &mut local.buf, &self.guard())
                        .map_err(|e| ("read source", e))?;
                    if n != size {
                        return Err((
                            "read source",
                            source_changed(format!(
                                "source shrank from {size} to {n} bytes while copying"
                            )),
                        ));
                    }
                    Some(hash)
                }
                false => None,
            }
        } else {
            let sparse = opts.preserve.sparseness && (st.st_blocks as u64) * 512 < size;
            // Hard-linked files are copied whole so their followers can link at once.
            let linked = opts.preserve.hard_links && st.st_nlink > 1;
            if !sparse
                && !self.hash
                && !linked
                && size >= CHUNK_THRESHOLD
                && opts.workers_resolved() > 1
            {
                return Ok(FillOutcome::Chunk(*caps));
            }
            let mut hasher = self.hash.then(Xxh3::new);
            moved = if sparse {
                data::copy_sparse(
                    src.as_fd(),
                    dst,
                    size,
                    caps,
                    &mut local.buf,
                    hasher.as_mut(),
                    &self.guard(),
                )
            } else {
                // Size 0 may be a procfs file that lies: read to EOF.
                let len = (size > 0).then_some(size);
                let range = Range {
                    src: src.as_fd(),
                    dst,
                    off: 0,
                    len,
                };
                data::copy_range(range, caps, &mut local.buf, hasher.as_mut(), &self.guard())
            }
            .map_err(|e| ("copy data", e))?;
            if moved.short {
                let msg = format!("source shrank below its {size} bytes while copying");
                return Err(("copy data", source_changed(msg)));
            }
            if !sparse {
                // What was read, not what stat said: procfs files report size 0.
                logical_len = moved.bytes;
            }
            hasher.map(|h| h.finish_128())
        };
        if let Some((victim, times)) = &opts.faults.change_source {
            if victim.as_slice() == src_name.to_bytes() && tries.changed < *times {
                change_source(dir, src_name);
            }
        }
        check_unchanged(src.as_fd(), st)?;
        let file = (dir, name, staged, started);
        let moved = (moved, src_hash, logical_len, None);
        let xattrs = SrcXattrs::Fd(src.as_fd());
        self.finish_regular(src_name, xattrs, st, file, moved, caps, local, tries)
    }

    /// The end of a regular file's copy, its data written: verify, metadata, commit.
    /// `moved`: what moved, the source's hash (when hashing), the length written, and the
    /// hash of the bytes as they were written where that is what verifies them (a copy
    /// from another node under `verify: Checksum`; see `fill_remote`).
    #[allow(clippy::too_many_arguments)]
    fn finish_regular(
        &self,
        _src_name: &CStr,
        xattrs: SrcXattrs<'_>,
        st: &Stat,
        (dir, name, staged, started): (&Arc<OpenDir>, &CStr, &mut Staged, Instant),
        (moved, src_hash, logical_len, written): (Moved, Option<u128>, u64, Option<u128>),
        _caps: &mut Caps,
        local: &mut Local,
        tries: Tries,
    ) -> Result<FillOutcome, Fail> {
        let opts = self.opts;
        let dst = staged.fd.as_fd();
        if let Some(victim) = &opts.faults.corrupt_after_write {
            if victim.as_slice() == name.to_bytes() {
                let _ = sys::pwrite(dst, b"\xff", 0);
            }
        }
        let hash = match src_hash {
            Some(expected) => {
                let fail_flush =
                    opts.faults
                        .fdatasync_eio
                        .as_ref()
                        .is_some_and(|(victim, times)| {
                            victim.as_slice() == name.to_bytes() && tries.io < *times
                        });
                Some(match written {
                    Some(got) => self.verify_written(expected, got, logical_len)?,
                    None => self.verify_dst(dst, expected, logical_len, local, fail_flush)?,
                })
            }
            None => None,
        };
        meta::apply_fd(
            xattrs,
            dst,
            st,
            self.rules(),
            staged.mode_done,
            &mut local.xattrs,
        )?;
        // A file named directly (inside a staging directory) is finished by its times,
        // which come last: a copy that no longer owns the destination leaves it without.
        // The check comes right before them, with no other step between.
        self.may_finish()?;
        meta::apply_times(dst, st, &opts.preserve)?;
        if !self.commit_staged(dir, staged, name)? {
            return Ok(FillOutcome::Kept);
        }
        self.count_file(st, &moved, (dir, name), hash, started, local);
        Ok(FillOutcome::Committed(hash))
    }

    /// Re-read the destination and compare with the source's hash; with `Verify::Full`
    /// the destination is flushed and evicted first so the bytes come from the medium.
    /// (The source was checked unchanged before: a mix of two versions is never verified.)
    /// `fail_flush`: the `fdatasync_eio` fault.
    fn verify_dst(
        &self,
        dst: BorrowedFd<'_>,
        expected: u128,
        len: u64,
        local: &mut Local,
        fail_flush: bool,
    ) -> Result<u128, Fail> {
        if self.opts.verify == Verify::Full {
            match fail_flush {
                true => Err(io::Error::from_raw_os_error(libc::EIO)),
                false => sys::fdatasync(dst),
            }
            .map_err(|e| ("fdatasync", e))?;
            sys::fadvise_dontneed(dst).map_err(|e| ("fadvise", e))?;
        }
        if self.opts.verify != Verify::None {
            let (got, n) = data::hash_fd(dst, len, &mut local.buf, &self.guard())
                .map_err(|e| ("read back destination", e))?;
            if got != expected || n != len {
                return Err(("verify", checksum_mismatch(expected, got)));
            }
            self.counters.verified.fetch_add(1, Ordering::Relaxed);
            self.progress.bytes_verified(n);
        }
        Ok(expected)
    }

    /// Compare the hash of the bytes as they were written with the source's.
    fn verify_written(&self, expected: u128, got: u128, len: u64) -> Result<u128, Fail> {
        if got != expected {
            return Err(("verify", checksum_mismatch(expected, got)));
        }
        self.counters.verified.fetch_add(1, Ordering::Relaxed);
        self.progress.bytes_verified(len);
        Ok(expected)
    }

    pub(super) fn count_file(
        &self,
        st: &Stat,
        moved: &Moved,
        (dir, name): (&OpenDir, &CStr),
        hash: Option<u128>,
        started: Instant,
        local: &mut Local,
    ) {
        let size = st.st_size as u64;
        local.tally.files += 1;
        local.tally.bytes += size;
        if let Some(s) = moved.strategy {
            local.tally.by_strategy[s as usize] += moved.bytes;
            self.progress.bytes_copied(moved.bytes, s);
        }
        if let Some(h) = hash {
            self.manifest_line(h, &dir.child_path(name), Some(st));
        }
        self.progress.file_done(size, started.elapsed());
        self.progress.entry_done();
    }
}

/// Refuse a copy whose source moved while it was read: size, mtime or ctime (which also
/// catches a write that kept the size and reset the mtime) differ from when it was opened.
/// Its bytes may be a mix of two versions, and must never be committed or verified.
pub(super) fn check_unchanged(src: BorrowedFd<'_>, st: &Stat) -> Result<(), Fail> {
    let after = sys::fstat(src).map_err(|e| ("stat source", e))?;
    let fingerprint = |s: &Stat| {
        (
            s.st_size,
            (s.st_mtime, s.st_mtime_nsec),
            (s.st_ctime, s.st_ctime_nsec),
        )
    };
    if fingerprint(&after) != fingerprint(st) {
        let msg = "source was modified while it was copied".to_string();
        return Err(("copy data", source_changed(msg)));
    }
    Ok(())
}

/// The `change_source` fault: append a byte to source file `dir/name`, as a writer would.
fn change_source(dir: &OpenDir, name: &CStr) {
    let flags = libc::O_WRONLY | libc::O_APPEND;
    let Some(src) = dir.src.fd() else {
        return;
    };
    if let Ok(sys::Opened::Open(fd, _)) = sys::open_regular(src, name, flags) {
        let _ = sys::pwrite(fd.as_fd(), b"+", 0);
    }
}
