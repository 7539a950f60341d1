//! A directory's listing, a batch at a time as the receiver asks for it: its entries'
//! records, and the bytes of its small files inline (read whole and unchanged, or left for
//! the receiver to ask for), bounded in entries and bytes per batch.

use std::io::{self, Write};
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::Ordering;

use ferry_transfer::frame::{Frame, Inline, INLINE_BYTES, INLINE_MAX, LISTING_ENTRY_BYTES};
use ferry_transfer::{Entry, Kind};
use twox_hash::XxHash3_128;

use super::entries::DIR_FLAGS;
use super::half::{busy, lock, Half, Job, ListState, State};
use super::top::SourceTop;
use crate::dirent::Listing;
use crate::record::{child, fingerprint};
use crate::sys::{self, Stat};

/// Entries in one listing batch, at most (the engine's local batch size).
const BATCH: usize = 512;
/// Bytes of the `getdents64` buffer a listing keeps between batches.
const DENTS: usize = 64 << 10;

impl<W: Write + Send> Half<'_, W> {
    pub(super) fn open_listing(
        &self,
        path: &[u8],
        ino: u64,
        (inline, hash, attrs): (bool, bool, bool),
    ) -> Result<Box<ListState>, (&'static str, io::Error)> {
        let dir = match self.resolve(path).map_err(|e| ("open directory", e))? {
            None => match self.top {
                SourceTop::Dir(fd) => self.open_at(fd.as_fd(), c".", DIR_FLAGS),
                SourceTop::File(_) => Err(io::Error::from_raw_os_error(libc::ENOTDIR)),
                SourceTop::Device(_) => Err(super::entries::not_a_tree()),
            },
            Some((parent, name)) => self.open_at(parent.as_fd(), &name, DIR_FLAGS),
        }
        .map_err(|e| ("open directory", e))?;
        let st = sys::fstat(dir.as_fd()).map_err(|e| ("stat directory", e))?;
        if st.st_ino != ino {
            // ESTALE: what the receiver takes for "the source changed" (its message is
            // the sender's, in the failure).
            let e = io::Error::from_raw_os_error(libc::ESTALE);
            return Err((
                "the source directory was replaced or moved while it was copied",
                e,
            ));
        }
        Ok(Box::new(ListState {
            path: path.to_vec(),
            dir,
            dents: vec![0; DENTS],
            cursor: (0, 0),
            top: path.is_empty(),
            inline,
            hash,
            attrs,
        }))
    }

    /// Send the next batch of a listing; then its next step if the receiver asked for it
    /// meanwhile, or it waits for the next [`Frame::More`].
    pub(super) fn list(&self, req: u32, mut state: Box<ListState>) -> Option<Job> {
        let reserved = self.opts.reserved_top.as_deref().filter(|_| state.top);
        let mut entries = Vec::new();
        let mut inline = Vec::new();
        let (mut entry_bytes, mut inline_bytes) = (0usize, 0usize);
        let ListState {
            path,
            dir,
            dents,
            cursor,
            inline: want_inline,
            hash,
            attrs,
            ..
        } = &mut *state;
        // A regular file is opened (for its attributes, or its bytes inline) only when the
        // receiver asked for them: a re-run's listing that keeps most files by their stats
        // costs an `lstat` a file, as a re-run on one node does.
        let open_files = *attrs || *want_inline;
        let mut listing = Listing::resume(dir.as_fd(), dents, *cursor);
        // The small files' bytes are read into one buffer (reused from listing to listing),
        // each a slice of it.
        let mut arena = self.buffers.take(INLINE_BYTES);
        let result = loop {
            // Past every entry taken or skipped so far, in the buffer as it is now.
            *cursor = listing.cursor();
            if entries.len() == BATCH || entry_bytes >= LISTING_ENTRY_BYTES {
                break Ok(false);
            }
            let (name, dtype) = match listing.next_entry() {
                Ok(Some(e)) => e,
                Ok(None) => break Ok(true),
                Err(e) => break Err(("read directory", e)),
            };
            if reserved.is_some_and(|r| r == name) {
                continue;
            }
            let name = name.to_owned();
            let (st, fd) = match self.stat_hinted(dir.as_fd(), &name, dtype, open_files) {
                Ok(x) => x,
                // Gone since the listing: as if it had not been there.
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => continue,
                Err(e) => break Err(("stat", e)),
            };
            let target = match st.st_mode & libc::S_IFMT == libc::S_IFLNK {
                true => match sys::readlinkat(dir.as_fd(), &name) {
                    Ok(t) => Some(t),
                    Err(e) if e.raw_os_error() == Some(libc::ENOENT) => continue,
                    Err(e) => break Err(("read link", e)),
                },
                false => None,
            };
            let entry =
                match self.record(name.to_bytes(), &st, fd.as_ref().map(|f| f.as_fd()), target) {
                    Ok(e) => e,
                    Err(e) => break Err(("read attributes", e)),
                };
            let size = entry.size as usize;
            let small = entry.kind == Kind::Regular
                && size <= INLINE_MAX
                && (st.st_blocks as u64) * 512 >= st.st_size as u64;
            if *want_inline && small && inline_bytes + size > INLINE_BYTES && !entries.is_empty() {
                // Its bytes would not fit this batch: it starts the next one.
                *cursor = listing.cursor_before_last();
                break Ok(false);
            }
            entry_bytes += encoded_len(&entry);
            if *want_inline && small {
                let start = arena.len();
                if fd.is_some_and(|f| read_small(f.as_fd(), &st, &mut arena)) {
                    let data = &mut arena[start..];
                    if let Some(b) = &self.bucket {
                        b.take(data.len() as u64);
                    }
                    inline_bytes += data.len();
                    let hash = hash.then(|| XxHash3_128::oneshot(data));
                    if !data.is_empty() && self.corrupts(&child(path, name.to_bytes())) {
                        data[0] ^= 0xff;
                    }
                    inline.push((entries.len() as u32, hash, start..arena.len()));
                }
            }
            entries.push(entry);
        };
        let last = match result {
            Ok(last) => last,
            Err((op, e)) => {
                self.end(req);
                self.fail(req, op, &e);
                return None;
            }
        };
        let arena = self.buffers.share(arena);
        let inline: Vec<Inline> = inline
            .into_iter()
            .map(|(index, hash, range)| Inline {
                index,
                hash,
                data: arena.slice(range),
            })
            .collect();
        let files = inline.len() as u64;
        self.sent.fetch_add(inline_bytes as u64, Ordering::Relaxed);
        self.files.fetch_add(files, Ordering::Relaxed);
        if last {
            self.end(req);
        }
        self.send(&Frame::Listing {
            req,
            entries,
            inline,
            last,
        });
        if last {
            return None;
        }
        // Decided under the lock, so a `more` that arrives now is never lost.
        let mut requests = lock(&self.requests);
        match requests.get_mut(&req) {
            Some(
                s @ State::Busy {
                    more: true,
                    closed: false,
                    ..
                },
            ) => {
                *s = busy();
                Some(Job::List(req, state))
            }
            Some(s @ State::Busy { closed: false, .. }) => {
                *s = State::Listing(state);
                None
            }
            _ => {
                requests.remove(&req);
                None
            }
        }
    }
}

/// Append a small file's bytes to `arena`: `true` when they were read whole (as the size it
/// was opened with) and the file did not change meanwhile; else `arena` is as it was (the
/// receiver then asks for the file by itself, and sees the change).
fn read_small(fd: BorrowedFd<'_>, st: &Stat, arena: &mut Vec<u8>) -> bool {
    let (start, size) = (arena.len(), st.st_size as usize);
    arena.resize(start + size, 0);
    let mut got = 0;
    let whole = loop {
        if got == size {
            break true;
        }
        match sys::pread(fd, &mut arena[start + got..], got as u64) {
            Ok(0) => break false,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => break false,
        }
    };
    let unchanged = whole && sys::fstat(fd).is_ok_and(|now| fingerprint(&now) == fingerprint(st));
    if !unchanged {
        arena.truncate(start);
    }
    unchanged
}

/// About what `entry` takes in a listing, to size batches.
fn encoded_len(e: &Entry) -> usize {
    let target = match &e.kind {
        Kind::Symlink(t) => t.len(),
        _ => 0,
    };
    let xattrs: usize = e
        .xattrs
        .iter()
        .map(|x| 8 + x.name.len() + x.value.len())
        .sum();
    100 + e.name.len() + target + xattrs
}
