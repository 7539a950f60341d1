//! A connection's source half: its shared state (the writer, the open requests, counters),
//! each request's state between its steps ([`State`], [`ListState`], [`ReadState`]), the
//! jobs a worker runs, and what each frame from the receiver does to them: a request
//! opened, more asked of a listing, credit granted to a read, a request closed.

use std::collections::HashMap;
use std::io::{self, Write};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use ferry_transfer::frame::{Fingerprint, Frame};
use ferry_transfer::Buffers;
use twox_hash::XxHash3_128 as Xxh3;

use super::bucket::Bucket;
use super::options::{SendError, SendOptions, MAX_CREDIT, MAX_REQUESTS};
use super::top::SourceTop;
use crate::sys::Stat;

pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

pub(super) struct Out<W> {
    pub(super) w: W,
    pub(super) buf: Vec<u8>,
    /// The first write that failed: the connection is over.
    pub(super) failed: Option<io::Error>,
}

/// A request between its steps.
pub(super) enum State {
    /// A worker is on it; what arrived for it meanwhile.
    Busy {
        closed: bool,
        more: bool,
        credit: u64,
    },
    /// A listing waiting for [`Frame::More`].
    Listing(Box<ListState>),
    /// A read waiting for [`Frame::Credit`].
    Reading(Box<ReadState>),
}

pub(super) struct ListState {
    /// Its path from the top.
    pub(super) path: Vec<u8>,
    pub(super) dir: OwnedFd,
    pub(super) dents: Vec<u8>,
    /// Bytes of records in `dents` and how far they are parsed (see `Listing::resume`).
    pub(super) cursor: (usize, usize),
    pub(super) top: bool,
    pub(super) inline: bool,
    pub(super) hash: bool,
    /// Whether regular files are opened for their extended attributes (see
    /// [`Frame::List`]); without it they are only `lstat`ed.
    pub(super) attrs: bool,
}

/// What of a file a read sends: all of it, its chunk hashes only, or one part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Shape {
    Whole,
    /// [`Frame::HashChunks`]: chunks of `1 << shift`.
    Chunks(u8),
    /// [`Frame::ReadPart`].
    Part {
        offset: u64,
        len: u64,
    },
}

pub(super) struct ReadState {
    pub(super) fd: OwnedFd,
    pub(super) st: Stat,
    pub(super) off: u64,
    /// Where the read stops: the file's size, or a part's end within it.
    pub(super) end: u64,
    /// The chunk hashes being computed ([`Shape::Chunks`]; then `hasher` is `None`).
    pub(super) sums: Option<Box<crate::sums::Sums>>,
    /// A part of the file, not all of it: not counted as a file sent.
    pub(super) part: bool,
    /// Where the data extent being read ends (past it, the next is looked for).
    pub(super) data_end: u64,
    pub(super) hasher: Option<Xxh3>,
    pub(super) credit: u64,
    pub(super) hash_only: bool,
    /// The `corrupt_in_flight` test hook is to change its next data frame.
    pub(super) corrupt: bool,
    /// Compress data frames (where that makes them smaller).
    pub(super) zstd: bool,
}

/// A step for a worker.
pub(super) enum Job {
    Stat(u32, Vec<u8>),
    List(u32, Box<ListState>),
    ListStart {
        req: u32,
        path: Vec<u8>,
        ino: u64,
        inline: bool,
        hash: bool,
        attrs: bool,
    },
    Read(u32, Box<ReadState>),
    ReadStart {
        req: u32,
        path: Vec<u8>,
        expect: Fingerprint,
        credit: u64,
        hash: bool,
        hash_only: bool,
        zstd: bool,
        shape: Shape,
    },
    Count {
        req: u32,
        links: bool,
    },
    Range {
        req: u32,
        offset: u64,
        len: u32,
        hash_only: bool,
        zstd: bool,
    },
}

pub(super) struct Half<'a, W> {
    pub(super) top: &'a SourceTop,
    pub(super) opts: &'a SendOptions,
    pub(super) out: Mutex<Out<W>>,
    pub(super) requests: Mutex<HashMap<u32, State>>,
    pub(super) sent: std::sync::Arc<AtomicU64>,
    pub(super) files: AtomicU64,
    /// Corruptions the test hook has made.
    pub(super) corrupted: std::sync::atomic::AtomicU32,
    pub(super) bucket: Option<Bucket>,
    /// Buffers for the small files of listings, reused once sent.
    pub(super) buffers: Buffers,
    /// Root may open without moving access times (`O_NOATIME`): asked once, not per file.
    pub(super) root: bool,
}

pub(super) fn protocol<T>(why: impl Into<String>) -> Result<T, SendError> {
    Err(SendError::Protocol(why.into()))
}

pub(super) fn busy() -> State {
    State::Busy {
        closed: false,
        more: false,
        credit: 0,
    }
}

impl<W: Write + Send> Half<'_, W> {
    /// Write one frame; after a failed write nothing more is written (the reader loop
    /// sees the failure at its next frame).
    pub(super) fn send(&self, frame: &Frame) {
        let mut out = lock(&self.out);
        if out.failed.is_some() {
            return;
        }
        let Out { w, buf, failed } = &mut *out;
        // Flushed frame by frame: a TLS writer may keep what it encrypted until asked, and
        // a request's last frame left there would have both sides wait for each other.
        if let Err(e) = ferry_transfer::stream::write_frame(w, frame, buf).and_then(|()| w.flush())
        {
            *failed = Some(e);
        }
    }

    /// [`Half::send`] of a [`Frame::Data`], its data written from where it is.
    pub(super) fn send_data(&self, head: (u32, u64, bool), data: &[u8]) {
        let mut out = lock(&self.out);
        if out.failed.is_some() {
            return;
        }
        let Out { w, failed, .. } = &mut *out;
        if let Err(e) = ferry_transfer::stream::write_data(w, head, data).and_then(|()| w.flush()) {
            *failed = Some(e);
        }
    }

    pub(super) fn fail(&self, req: u32, op: &str, e: &io::Error) {
        self.send(&Frame::Failed {
            req,
            errno: e.raw_os_error().unwrap_or(0),
            message: format!("{op}: {e}"),
        });
    }

    /// The `corrupt_in_flight` test hook: whether to change a byte of `path`'s data now.
    pub(super) fn corrupts(&self, path: &[u8]) -> bool {
        match &self.opts.corrupt_in_flight {
            Some((victim, times)) if victim == path => {
                self.corrupted.fetch_add(1, Ordering::Relaxed) < *times
            }
            _ => false,
        }
    }

    /// A new request under `req`: refused when the number is in use or too many are open.
    pub(super) fn open_request(&self, req: u32) -> Result<(), SendError> {
        let mut requests = lock(&self.requests);
        if requests.contains_key(&req) {
            return protocol(format!("request {req} is already open"));
        }
        if requests.len() >= MAX_REQUESTS {
            return protocol(format!("more than {MAX_REQUESTS} requests open"));
        }
        requests.insert(req, busy());
        Ok(())
    }

    /// A read of `path` (whole, its chunk hashes, or a part) opened as request `req`, its
    /// credit within the bound.
    fn read_start(
        &self,
        req: u32,
        path: Vec<u8>,
        expect: Fingerprint,
        credit: u64,
        (hash, hash_only, zstd): (bool, bool, bool),
        shape: Shape,
    ) -> Result<Job, SendError> {
        if credit > MAX_CREDIT {
            return protocol(format!("a credit of {credit} bytes (at most {MAX_CREDIT})"));
        }
        self.open_request(req)?;
        Ok(Job::ReadStart {
            req,
            path,
            expect,
            credit,
            hash,
            hash_only,
            zstd,
            shape,
        })
    }

    /// What a frame from the receiver asks for: a step for a worker, or nothing more.
    pub(super) fn dispatch(&self, frame: Frame) -> Result<Option<Job>, SendError> {
        Ok(Some(match frame {
            Frame::Stat { req, path } => {
                self.open_request(req)?;
                Job::Stat(req, path)
            }
            Frame::List {
                req,
                path,
                ino,
                inline,
                hash,
                attrs,
            } => {
                self.open_request(req)?;
                Job::ListStart {
                    req,
                    path,
                    ino,
                    inline,
                    hash,
                    attrs,
                }
            }
            Frame::Read {
                req,
                path,
                expect,
                credit,
                hash,
                hash_only,
                zstd,
            } => self.read_start(
                req,
                path,
                expect,
                credit,
                (hash, hash_only, zstd),
                Shape::Whole,
            )?,
            Frame::HashChunks {
                req,
                path,
                expect,
                shift,
            } => self.read_start(
                req,
                path,
                expect,
                0,
                (false, true, false),
                Shape::Chunks(shift),
            )?,
            Frame::ReadPart {
                req,
                path,
                expect,
                offset,
                len,
                credit,
                zstd,
            } => {
                let shape = Shape::Part { offset, len };
                self.read_start(req, path, expect, credit, (false, false, zstd), shape)?
            }
            Frame::Count { req, links } => {
                self.open_request(req)?;
                Job::Count { req, links }
            }
            Frame::ReadRange {
                req,
                offset,
                len,
                hash_only,
                zstd,
            } => {
                if !matches!(self.top, SourceTop::Device(_)) {
                    return protocol("a range of a source that is not a raw block device");
                }
                self.open_request(req)?;
                Job::Range {
                    req,
                    offset,
                    len,
                    hash_only,
                    zstd,
                }
            }
            Frame::More { req } => {
                let mut requests = lock(&self.requests);
                match requests.get_mut(&req) {
                    Some(State::Busy {
                        more: m @ false, ..
                    }) => {
                        *m = true;
                        return Ok(None);
                    }
                    Some(s @ State::Listing(_)) => match std::mem::replace(s, busy()) {
                        State::Listing(l) => Job::List(req, l),
                        _ => return protocol("internal: listing state"),
                    },
                    _ => return protocol(format!("'more' for request {req}, not a listing")),
                }
            }
            Frame::Credit { req, bytes } => {
                let mut requests = lock(&self.requests);
                let over = |have: u64| have.saturating_add(bytes) > MAX_CREDIT;
                match requests.get_mut(&req) {
                    Some(State::Busy { credit, .. }) if !over(*credit) => {
                        *credit += bytes;
                        return Ok(None);
                    }
                    Some(s @ State::Reading(_)) => match std::mem::replace(s, busy()) {
                        State::Reading(mut r) if !over(r.credit) => {
                            r.credit += bytes;
                            Job::Read(req, r)
                        }
                        _ => return protocol(format!("credit over {MAX_CREDIT} bytes")),
                    },
                    // A request that ended while the credit was on its way.
                    None => return Ok(None),
                    _ => {
                        return protocol(format!(
                            "credit for request {req}: not a read, or over {MAX_CREDIT} bytes"
                        ))
                    }
                }
            }
            Frame::Close { req } => {
                let mut requests = lock(&self.requests);
                match requests.get_mut(&req) {
                    Some(State::Busy { closed, .. }) => *closed = true,
                    Some(_) => drop(requests.remove(&req)),
                    None => {}
                }
                return Ok(None);
            }
            Frame::Abort { reason } => return Err(SendError::Aborted(reason)),
            other => return protocol(format!("a receiver does not send {}", name(&other))),
        }))
    }

    /// Run a request's steps for as long as the receiver has asked for them.
    pub(super) fn run(&self, job: Job) {
        let mut next = Some(job);
        while let Some(job) = next {
            next = self.step(job);
        }
    }

    pub(super) fn step(&self, job: Job) -> Option<Job> {
        match job {
            Job::Stat(req, path) => {
                let answer = self.stat(&path);
                self.end(req);
                match answer {
                    Ok(entry) => self.send(&Frame::Entry { req, entry }),
                    Err((op, e)) => self.fail(req, op, &e),
                }
                None
            }
            Job::ListStart {
                req,
                path,
                ino,
                inline,
                hash,
                attrs,
            } => match self.open_listing(&path, ino, (inline, hash, attrs)) {
                Ok(state) => self.list(req, state),
                Err((op, e)) => {
                    self.end(req);
                    self.fail(req, op, &e);
                    None
                }
            },
            Job::List(req, state) => self.list(req, state),
            Job::ReadStart {
                req,
                path,
                expect,
                credit,
                hash,
                hash_only,
                zstd,
                shape,
            } => match self.open_read(&path, &expect, credit, (hash, hash_only, zstd), shape) {
                Ok(Some(state)) => self.read(req, state),
                Ok(None) => {
                    self.end(req);
                    self.send(&Frame::FileEnd {
                        req,
                        len: 0,
                        hash: None,
                        changed: true,
                    });
                    None
                }
                Err((op, e)) => {
                    self.end(req);
                    self.fail(req, op, &e);
                    None
                }
            },
            Job::Read(req, state) => self.read(req, state),
            Job::Range {
                req,
                offset,
                len,
                hash_only,
                zstd,
            } => {
                self.range(req, offset, len, (hash_only, zstd));
                None
            }
            Job::Count { req, links } => {
                let counted = self.count(links);
                self.end(req);
                match counted {
                    Ok(t) => self.send(&Frame::Counted {
                        req,
                        files: t.files,
                        bytes: t.bytes,
                    }),
                    Err((op, e)) => self.fail(req, op, &e),
                }
                None
            }
        }
    }

    /// Request `req` is answered in full (called before its last frame is sent: once the
    /// receiver has that frame, it may use the number again).
    pub(super) fn end(&self, req: u32) {
        lock(&self.requests).remove(&req);
    }
}

fn name(f: &Frame) -> &'static str {
    match f {
        Frame::Hello { .. } => "hello",
        Frame::Welcome { .. } => "welcome",
        Frame::Refused { .. } => "refused",
        Frame::Entry { .. } => "entry",
        Frame::Listing { .. } => "listing",
        Frame::Data { .. } => "data",
        Frame::FileEnd { .. } => "file end",
        Frame::Failed { .. } => "failed",
        Frame::Counted { .. } => "counted",
        _ => "this frame",
    }
}
