//! A file's data, sent within the credit the receiver grants: data extents only (holes are
//! looked for, hashed as zeros and never sent), hashed as read, compressed where that
//! pays, and whether the file changed while it was read.

use std::io::{self, Write};
use std::os::fd::AsFd;
use std::sync::atomic::Ordering;

use ferry_transfer::frame::{Fingerprint, Frame, MAX_CHUNKS, MAX_DATA};
use twox_hash::XxHash3_128 as Xxh3;

use super::half::{busy, lock, Half, Job, ReadState, Shape, State};
use super::top::SourceTop;
use crate::record::fingerprint;
use crate::sums::{self, Sums};
use crate::sys;

std::thread_local! {
    /// Each worker's read buffer, kept between the chunks and files it sends: a fresh
    /// megabyte for every chunk cost a page fault per 4 KiB and the zeroing of each page.
    static READ_BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The worker's read buffer, [`MAX_DATA`] long, given back when dropped.
pub(super) struct ReadBuf(pub(super) Vec<u8>);

impl ReadBuf {
    pub(super) fn take() -> Self {
        let mut v = READ_BUF.with(|b| std::mem::take(&mut *b.borrow_mut()));
        v.resize(MAX_DATA, 0);
        Self(v)
    }
}

impl Drop for ReadBuf {
    fn drop(&mut self) {
        let v = std::mem::take(&mut self.0);
        READ_BUF.with(|b| *b.borrow_mut() = v);
    }
}

impl<W: Write + Send> Half<'_, W> {
    pub(super) fn open_read(
        &self,
        path: &[u8],
        expect: &Fingerprint,
        credit: u64,
        (hash, hash_only, zstd): (bool, bool, bool),
        shape: Shape,
    ) -> Result<Option<Box<ReadState>>, (&'static str, io::Error)> {
        let flags = libc::O_RDONLY | libc::O_NOCTTY;
        let (fd, st) = match self.resolve(path).map_err(|e| ("open", e))? {
            None => match self.top {
                // (A top file was opened as the regular file it is.)
                SourceTop::File(fd) => fd.try_clone().map_err(|e| ("open", e)).and_then(|fd| {
                    let st = sys::fstat(fd.as_fd()).map_err(|e| ("stat", e))?;
                    Ok((fd, st))
                })?,
                SourceTop::Dir(_) => {
                    return Err(("open", io::Error::from_raw_os_error(libc::EISDIR)))
                }
                SourceTop::Device(_) => return Err(("open", super::entries::not_a_tree())),
            },
            // Never opened unless it is a regular file: something else at the name now is
            // "not what was listed" (None), which the receiver reports as a change.
            Some((dir, name)) => match self
                .open_data_at(dir.as_fd(), &name, flags, false)
                .map_err(|e| ("open", e))?
            {
                sys::Opened::Open(fd, st) => (fd, st),
                sys::Opened::Other(_) => return Ok(None),
            },
        };
        if st.st_mode & libc::S_IFMT != libc::S_IFREG || fingerprint(&st) != *expect {
            return Ok(None);
        }
        let size = st.st_size as u64;
        let sparse = (st.st_blocks as u64) * 512 < size;
        let corrupt = !hash_only && self.corrupts(path);
        let (off, end, sums) = match shape {
            Shape::Whole => (0, size, None),
            Shape::Chunks(shift) => {
                if sums::chunks_of(size, shift) > MAX_CHUNKS as u64 {
                    let e = io::Error::other(format!(
                        "{size} bytes are more than {MAX_CHUNKS} chunks of {} bytes: ask for larger chunks",
                        1u64 << shift
                    ));
                    return Err(("hash chunks", e));
                }
                (0, size, Some(Box::new(Sums::new(shift, size))))
            }
            // (Checked not to overflow on decode.)
            Shape::Part { offset, len } => (offset.min(size), (offset + len).min(size), None),
        };
        Ok(Some(Box::new(ReadState {
            zstd,
            corrupt,
            fd,
            st,
            off,
            end,
            // A file with holes starts by looking for its first data extent.
            data_end: if sparse { off } else { end },
            hasher: (sums.is_none() && (hash || hash_only)).then(Xxh3::new),
            sums,
            part: matches!(shape, Shape::Part { .. }),
            credit,
            hash_only,
        })))
    }

    /// Send what the credit allows of a file; then go on if more credit came meanwhile,
    /// wait for it, or end the file.
    pub(super) fn read(&self, req: u32, mut r: Box<ReadState>) -> Option<Job> {
        let mut buf = ReadBuf::take();
        let buf = &mut buf.0;
        let size = r.st.st_size as u64;
        // Where this read stops: the file's end, or its part's.
        let stop = r.end;
        let mut shrank = false;
        while r.off < stop && (r.hash_only || r.credit > 0) {
            if r.off >= r.data_end {
                // Find the next data extent; what lies before it is a hole.
                let data = match sys::seek_data_or_hole(r.fd.as_fd(), r.off, true) {
                    Ok(found) => found.unwrap_or(size).min(stop),
                    Err(_) => r.off,
                };
                if let Some(h) = &mut r.hasher {
                    hash_zeros(h, data - r.off);
                }
                if let Some(s) = &mut r.sums {
                    s.zeros(data - r.off);
                }
                r.off = data;
                if r.off >= stop {
                    // A hole to the end.
                    break;
                }
                r.data_end = match sys::seek_data_or_hole(r.fd.as_fd(), r.off, false) {
                    Ok(hole) => hole.unwrap_or(size).clamp(r.off + 1, stop),
                    Err(_) => stop,
                };
                continue;
            }
            let mut want = (r.data_end - r.off).min(MAX_DATA as u64);
            if !r.hash_only {
                want = want.min(r.credit);
                if let Some(b) = &self.bucket {
                    b.take(want);
                }
            }
            let n = match sys::pread(r.fd.as_fd(), &mut buf[..want as usize], r.off) {
                Ok(0) => {
                    shrank = true;
                    break;
                }
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    self.end(req);
                    self.fail(req, "read", &e);
                    return None;
                }
            };
            let data = &buf[..n];
            if let Some(h) = &mut r.hasher {
                h.write(data);
            }
            if let Some(s) = &mut r.sums {
                s.write(data);
            }
            if !r.hash_only {
                // Sent from the read buffer itself (hashed already: a change now is one in
                // flight, as the test hook means it).
                let raw = &mut buf[..n];
                if std::mem::take(&mut r.corrupt) {
                    raw[0] ^= 0xff;
                }
                // Level 1: a link slow enough to want compression still wants the CPU.
                let packed = r
                    .zstd
                    .then(|| zstd::bulk::compress(raw, 1).ok())
                    .flatten()
                    .filter(|p| p.len() < raw.len());
                match &packed {
                    Some(p) => self.send_data((req, r.off, true), p),
                    None => self.send_data((req, r.off, false), raw),
                }
                self.sent.fetch_add(n as u64, Ordering::Relaxed);
                r.credit -= n as u64;
            }
            r.off += n as u64;
        }
        if r.off < stop && !shrank {
            // Out of credit. Decided under the lock, so credit that arrives now is never lost.
            let mut requests = lock(&self.requests);
            return match requests.get_mut(&req) {
                Some(s @ State::Busy { closed: false, .. }) => {
                    if let State::Busy { credit, .. } = s {
                        r.credit += *credit;
                    }
                    match r.credit > 0 {
                        true => {
                            *s = busy();
                            Some(Job::Read(req, r))
                        }
                        false => {
                            *s = State::Reading(r);
                            None
                        }
                    }
                }
                _ => {
                    requests.remove(&req);
                    None
                }
            };
        }
        let changed = shrank
            || sys::fstat(r.fd.as_fd())
                .map(|now| fingerprint(&now) != fingerprint(&r.st))
                .unwrap_or(true);
        if !r.hash_only && !r.part && !changed {
            self.files.fetch_add(1, Ordering::Relaxed);
        }
        self.end(req);
        let mut hash = r.hasher.take().map(|h| h.finish_128());
        if let Some(s) = r.sums.take() {
            let shift = s.shift();
            let (hashes, whole) = s.finish();
            if !changed {
                self.send(&Frame::ChunkHashes { req, shift, hashes });
                hash = Some(whole);
            }
        }
        self.send(&Frame::FileEnd {
            req,
            len: r.off,
            hash,
            changed,
        });
        None
    }
}

fn hash_zeros(h: &mut Xxh3, mut n: u64) {
    static ZEROS: [u8; 64 * 1024] = [0; 64 * 1024];
    while n > 0 {
        let k = n.min(ZEROS.len() as u64) as usize;
        h.write(&ZEROS[..k]);
        n -= k as u64;
    }
}
