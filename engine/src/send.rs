//! The source half of a copy between nodes: answers a receiver's requests (see
//! `ferry_transfer::frame`) about the tree beneath one source, and nothing else.
//!
//! The receiver drives: its walk, resume, overwrite and include/exclude decisions are the
//! local copy's, made on the destination's node. What this half does for it is what a
//! local copy does on the source side: resolve a path beneath the top (`openat2` with
//! `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`, never a symlink followed, never `..`), stat,
//! read extended attributes and symlink targets, list directories a buffer at a time, and
//! read files (data extents only: holes are not sent) while hashing what it read, and tell
//! whether a file changed while it was read; and count what a copy of the whole top would
//! carry (the receiver has no source of its own to count). FIFOs, sockets and devices are
//! never opened.
//!
//! Requests run on a pool of `workers` threads; a request waiting for the receiver (a
//! listing's next batch, a file's next credit) holds no thread, only its state: an open
//! descriptor and a cursor. So what one connection costs is bounded by
//! [`MAX_REQUESTS`] open requests (each one descriptor and at most a 64 KiB listing
//! buffer) and one data buffer per worker, whatever the receiver asks.

use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use ferry_transfer::frame::{
    self, Fingerprint, Frame, Inline, INLINE_BYTES, INLINE_MAX, LISTING_ENTRY_BYTES, MAX_DATA,
};
use ferry_transfer::{Buffers, Entry, Kind, Xattr};
use xxhash_rust::xxh3::{xxh3_128, Xxh3};

use crate::depth::Depth;
use crate::dirent::{DType, Listing};
use crate::ends::SrcAt;
use crate::record::{child, entry_of, fingerprint};
use crate::sys::{self, Stat};
use crate::{beneath, Error, Part, Totals};

/// Requests open at once on one connection; a receiver that opens more is cut off.
pub const MAX_REQUESTS: usize = 1024;
/// Credit one file may be granted beyond what it was sent: a receiver that grants more is
/// cut off (it would let the sender run that far ahead of what it can take).
pub const MAX_CREDIT: u64 = 64 << 20;
/// Entries in one listing batch, at most (the engine's local batch size).
const BATCH: usize = 512;
/// Bytes of the `getdents64` buffer a listing keeps between batches.
const DENTS: usize = 64 << 10;

/// What the source half is serving.
#[derive(Debug)]
pub enum SourceTop {
    /// A directory: paths are resolved beneath it.
    Dir(OwnedFd),
    /// One regular file (a shard that copies a file): only the path "" exists.
    File(OwnedFd),
}

impl SourceTop {
    /// Open `path` (a host path the caller resolved and trusts) as a top.
    pub fn open(path: &std::path::Path) -> io::Result<Self> {
        let c = CString::new(path.as_os_str().as_encoded_bytes())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in path"))?;
        // O_NOATIME where we may: serving a tree does not disturb its access times. Only
        // a directory or a regular file is opened (a device at the path never is).
        let flags = libc::O_RDONLY | libc::O_NOATIME;
        match sys::open_regular_path(&c, flags, true)? {
            sys::Opened::Open(fd, st) if st.st_mode & libc::S_IFMT == libc::S_IFDIR => {
                Ok(Self::Dir(fd))
            }
            sys::Opened::Open(fd, _) => Ok(Self::File(fd)),
            sys::Opened::Other(_) => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the source is neither a directory nor a regular file",
            )),
        }
    }

    /// Open `path` inside `root` (a tenant's path inside an admin's root) as a top,
    /// resolved as [`crate::copy_beneath`] resolves its source: relative, no `..`, no
    /// symlink at any depth (the last component included), access times left alone where
    /// the agent may. A FIFO, socket or device is refused without being opened.
    pub fn beneath(root: BorrowedFd<'_>, path: &Path) -> Result<Self, Error> {
        let parts = beneath::check_relative(path)?;
        let (parent, name) = match beneath::open_source_in(root, &parts, path)? {
            SrcAt::Dir { fd, .. } => return Ok(Self::Dir(fd)),
            SrcAt::Entry { parent, name } => (parent, name),
            SrcAt::Remote { .. } => {
                return Err(Error::Usage(format!(
                    "{}: internal: a local source resolved as a remote one",
                    path.display()
                )))
            }
        };
        // Opened only as the regular file it is (see `sys::open_regular`): a FIFO, device
        // or symlink at the name, there all along or put there since the source was
        // resolved, is refused unopened. O_NOATIME where the agent may.
        let flags = libc::O_RDONLY | libc::O_NOCTTY | libc::O_NOATIME;
        match sys::open_regular(parent.as_fd(), &name, flags)
            .map_err(|e| beneath::classify(e, path))?
        {
            sys::Opened::Open(fd, _) => Ok(Self::File(fd)),
            sys::Opened::Other(st) => Err(not_a_top(path, &st)),
        }
    }
}

/// Why `path` (of stat `st`) cannot be a [`SourceTop`].
fn not_a_top(path: &Path, st: &Stat) -> Error {
    let what = match st.st_mode & libc::S_IFMT {
        libc::S_IFIFO => "a FIFO",
        libc::S_IFSOCK => "a socket",
        libc::S_IFCHR | libc::S_IFBLK => "a device",
        libc::S_IFDIR => "a directory now (it changed while it was opened)",
        _ => "not a regular file",
    };
    Error::Usage(format!(
        "{} is {what}; the source of a copy between nodes must be a directory or a regular file",
        path.display()
    ))
}

/// How the source half serves.
#[derive(Debug, Clone)]
pub struct SendOptions {
    /// Threads that run requests; 0: the engine's default pool, of which only as many as
    /// CPUs run while the source is read from the page cache (as a local copy's pool).
    pub workers: usize,
    /// A name at the top that is never listed nor served (Ferry's `.ferry` state).
    pub reserved_top: Option<CString>,
    /// Extended attributes are read and sent.
    pub xattrs: bool,
    /// At most this many file bytes a second on this connection (data and inline), or
    /// unlimited. What is over the rate waits in the sender, before it is read.
    pub bandwidth_limit: Option<u64>,
    /// Test only: flip a byte of what is sent of the file at this path (after it was
    /// hashed), as a network that changes bytes in flight would, this many times.
    pub corrupt_in_flight: Option<(Vec<u8>, u32)>,
    /// The include/exclude lists of the copy, for [`Frame::Count`]: a count is of what the
    /// receiver's copy would carry. (Listings and reads are not filtered: the receiver
    /// filters its own walk.)
    pub filter: crate::Filter,
    /// Also counted here as they are sent, for a caller that shows a live rate (the
    /// summary counts them too): file bytes sent, data and inline.
    pub sent: Option<std::sync::Arc<AtomicU64>>,
}

impl Default for SendOptions {
    fn default() -> Self {
        Self {
            workers: 0,
            reserved_top: Some(c".ferry".into()),
            xattrs: true,
            bandwidth_limit: None,
            corrupt_in_flight: None,
            filter: crate::Filter::default(),
            sent: None,
        }
    }
}

/// What a connection's source half did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SendSummary {
    pub requests: u64,
    /// File bytes sent (data frames and inline), not counting holes.
    pub bytes_sent: u64,
    /// Files whose data was sent whole (by a read or inline).
    pub files_sent: u64,
}

/// Why a connection ended before the receiver closed it.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    #[error("reading from the receiver: {0}")]
    Read(#[source] io::Error),
    #[error("writing to the receiver: {0}")]
    Write(#[source] io::Error),
    #[error("the receiver broke the protocol: {0}")]
    Protocol(String),
    #[error("the receiver aborted: {0}")]
    Aborted(String),
    #[error("starting the source half's threads: {0}")]
    Threads(String),
}

/// Serve one connection's requests until the receiver closes it (end of stream between
/// frames: `Ok`) or breaks the protocol (an [`Frame::Abort`] is sent, then `Err`). The
/// hello and its ticket are the caller's, before this.
pub fn serve<R: Read, W: Write + Send>(
    top: &SourceTop,
    mut reader: R,
    writer: W,
    opts: &SendOptions,
) -> Result<SendSummary, SendError> {
    let workers = match opts.workers {
        0 => crate::default_workers(),
        n => n,
    };
    // Warm, more threads than CPUs only contend (16 against 2 sender threads: 1.35 s
    // against 1.10 s for 100k files over loopback); cold, they keep reads in flight.
    let depth = match opts.workers {
        0 => {
            let fd = match top {
                SourceTop::Dir(fd) | SourceTop::File(fd) => fd,
            };
            Depth::adaptive(workers, &[sys::fs_type(fd.as_fd()).unwrap_or(0)])
        }
        _ => Depth::fixed(),
    };
    let sent_before = opts.sent.as_ref().map_or(0, |s| s.load(Ordering::Relaxed));
    let half = Half {
        top,
        opts,
        out: Mutex::new(Out {
            w: writer,
            buf: Vec::new(),
            failed: None,
        }),
        requests: Mutex::new(HashMap::new()),
        sent: opts.sent.clone().unwrap_or_default(),
        files: AtomicU64::new(0),
        corrupted: Default::default(),
        bucket: opts.bandwidth_limit.map(Bucket::new),
        root: sys::geteuid() == 0,
        buffers: Buffers::default(),
    };
    let mut requests = 0u64;
    let queue = Queue::default();
    let ended = std::thread::scope(|scope| {
        for index in 0..workers {
            let (half, depth, queue) = (&half, &depth, &queue);
            let started = std::thread::Builder::new()
                .name(format!("ferry-send-{index}"))
                .spawn_scoped(scope, move || work(half, depth, queue, index));
            if let Err(e) = started {
                queue.close();
                return Err(SendError::Threads(e.to_string()));
            }
        }
        let mut buf = Vec::new();
        let ended = loop {
            let frame = match frame::read_frame(&mut reader, &mut buf) {
                Ok(f) => f,
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => break Ok(()),
                Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                    break Err(SendError::Protocol(e.to_string()))
                }
                Err(e) => break Err(SendError::Read(e)),
            };
            if let Some(e) = lock(&half.out).failed.take() {
                break Err(SendError::Write(e));
            }
            requests += 1;
            match half.dispatch(frame) {
                Ok(Some(job)) => queue.push(job),
                Ok(None) => {}
                Err(e) => break Err(e),
            }
        };
        // The jobs queued are still run (the receiver may wait for their answers); then the
        // workers end.
        queue.close();
        ended
    });
    if let Err(SendError::Protocol(why) | SendError::Aborted(why)) = &ended {
        half.send(&Frame::Abort {
            reason: why.clone(),
        });
    }
    ended?;
    if let Some(e) = lock(&half.out).failed.take() {
        return Err(SendError::Write(e));
    }
    Ok(SendSummary {
        requests,
        bytes_sent: half.sent.load(Ordering::Relaxed) - sent_before,
        files_sent: half.files.load(Ordering::Relaxed),
    })
}

/// The jobs waiting for a worker, first in first out, and whether more may come.
#[derive(Default)]
struct Queue {
    jobs: Mutex<(std::collections::VecDeque<Job>, bool)>,
    ready: std::sync::Condvar,
}

impl Queue {
    fn push(&self, job: Job) {
        lock(&self.jobs).0.push_back(job);
        self.ready.notify_one();
    }

    /// No more jobs: the workers end once the queue is empty.
    fn close(&self) {
        lock(&self.jobs).1 = true;
        self.ready.notify_all();
    }

    fn closed(&self) -> bool {
        lock(&self.jobs).1
    }

    /// The next job, waiting for one; `None` once the queue is closed and empty.
    fn take(&self) -> Option<Job> {
        let mut jobs = lock(&self.jobs);
        loop {
            if let Some(job) = jobs.0.pop_front() {
                return Some(job);
            }
            if jobs.1 {
                return None;
            }
            jobs = self
                .ready
                .wait(jobs)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }
}

/// One worker: runs jobs while the depth lets it (past the depth it rests, taking none, and
/// looks again), until the queue is closed and empty. An idle worker sleeps on the queue's
/// condition variable: a job wakes one worker, which runs it. (A work-stealing pool spun
/// and yielded between requests, and bounced jobs between workers past the depth: a
/// quarter of the sender's CPU on a warm tree.)
fn work<W: Write + Send>(half: &Half<'_, W>, depth: &Depth, queue: &Queue, index: usize) {
    loop {
        if !depth.runs(index) {
            if queue.closed() {
                return;
            }
            depth.rest(index);
            continue;
        }
        let Some(job) = queue.take() else {
            return;
        };
        let run = std::panic::AssertUnwindSafe(|| half.run(job));
        if std::panic::catch_unwind(run).is_err() {
            // The receiver must not wait for an answer that never comes.
            half.send(&Frame::Abort {
                reason: "the source half failed (an internal error)".into(),
            });
        }
    }
}

std::thread_local! {
    /// Each worker's read buffer, kept between the chunks and files it sends: a fresh
    /// megabyte for every chunk cost a page fault per 4 KiB and the zeroing of each page.
    static READ_BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The worker's read buffer, [`MAX_DATA`] long, given back when dropped.
struct ReadBuf(Vec<u8>);

impl ReadBuf {
    fn take() -> Self {
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

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

struct Out<W> {
    w: W,
    buf: Vec<u8>,
    /// The first write that failed: the connection is over.
    failed: Option<io::Error>,
}

/// A request between its steps.
enum State {
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

struct ListState {
    /// Its path from the top.
    path: Vec<u8>,
    dir: OwnedFd,
    dents: Vec<u8>,
    /// Bytes of records in `dents` and how far they are parsed (see `Listing::resume`).
    cursor: (usize, usize),
    top: bool,
    inline: bool,
    hash: bool,
}

struct ReadState {
    fd: OwnedFd,
    st: Stat,
    off: u64,
    /// Where the data extent being read ends (past it, the next is looked for).
    data_end: u64,
    hasher: Option<Xxh3>,
    credit: u64,
    hash_only: bool,
    /// The `corrupt_in_flight` test hook is to change its next data frame.
    corrupt: bool,
    /// Compress data frames (where that makes them smaller).
    zstd: bool,
}

/// A step for a worker.
enum Job {
    Stat(u32, Vec<u8>),
    List(u32, Box<ListState>),
    ListStart {
        req: u32,
        path: Vec<u8>,
        ino: u64,
        inline: bool,
        hash: bool,
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
    },
    Count {
        req: u32,
        links: bool,
    },
}

struct Half<'a, W> {
    top: &'a SourceTop,
    opts: &'a SendOptions,
    out: Mutex<Out<W>>,
    requests: Mutex<HashMap<u32, State>>,
    sent: std::sync::Arc<AtomicU64>,
    files: AtomicU64,
    /// Corruptions the test hook has made.
    corrupted: std::sync::atomic::AtomicU32,
    bucket: Option<Bucket>,
    /// Buffers for the small files of listings, reused once sent.
    buffers: Buffers,
    /// Root may open without moving access times (`O_NOATIME`): asked once, not per file.
    root: bool,
}

/// A token bucket for the bandwidth limit, shared by a connection's requests: every send
/// takes its bytes, going into debt if it must, and waits until the debt is paid at the
/// rate. It starts empty (no burst), so the rate holds from the first byte.
struct Bucket {
    rate: u64,
    /// Bytes that may be sent now (negative: owed) and when that was computed.
    state: Mutex<(f64, std::time::Instant)>,
}

impl Bucket {
    fn new(rate: u64) -> Self {
        Self {
            rate: rate.max(1),
            state: Mutex::new((0.0, std::time::Instant::now())),
        }
    }

    fn take(&self, n: u64) {
        let wait = {
            let mut s = lock(&self.state);
            let now = std::time::Instant::now();
            let rate = self.rate as f64;
            // Unused allowance is kept for at most 100 ms: an idle connection does not
            // bank a burst.
            let tokens = (s.0 + now.duration_since(s.1).as_secs_f64() * rate).min(rate / 10.0);
            *s = (tokens - n as f64, now);
            match s.0 < 0.0 {
                true => std::time::Duration::from_secs_f64(-s.0 / rate),
                false => std::time::Duration::ZERO,
            }
        };
        if !wait.is_zero() {
            std::thread::sleep(wait);
        }
    }
}

fn protocol<T>(why: impl Into<String>) -> Result<T, SendError> {
    Err(SendError::Protocol(why.into()))
}

fn busy() -> State {
    State::Busy {
        closed: false,
        more: false,
        credit: 0,
    }
}

impl<W: Write + Send> Half<'_, W> {
    /// Write one frame; after a failed write nothing more is written (the reader loop
    /// sees the failure at its next frame).
    fn send(&self, frame: &Frame) {
        let mut out = lock(&self.out);
        if out.failed.is_some() {
            return;
        }
        let Out { w, buf, failed } = &mut *out;
        // Flushed frame by frame: a TLS writer may keep what it encrypted until asked, and
        // a request's last frame left there would have both sides wait for each other.
        if let Err(e) = frame::write_frame(w, frame, buf).and_then(|()| w.flush()) {
            *failed = Some(e);
        }
    }

    /// [`Half::send`] of a [`Frame::Data`], its data written from where it is.
    fn send_data(&self, head: (u32, u64, bool), data: &[u8]) {
        let mut out = lock(&self.out);
        if out.failed.is_some() {
            return;
        }
        let Out { w, failed, .. } = &mut *out;
        if let Err(e) = frame::write_data(w, head, data).and_then(|()| w.flush()) {
            *failed = Some(e);
        }
    }

    fn fail(&self, req: u32, op: &str, e: &io::Error) {
        self.send(&Frame::Failed {
            req,
            errno: e.raw_os_error().unwrap_or(0),
            message: format!("{op}: {e}"),
        });
    }

    /// The `corrupt_in_flight` test hook: whether to change a byte of `path`'s data now.
    fn corrupts(&self, path: &[u8]) -> bool {
        match &self.opts.corrupt_in_flight {
            Some((victim, times)) if victim == path => {
                self.corrupted.fetch_add(1, Ordering::Relaxed) < *times
            }
            _ => false,
        }
    }

    /// A new request under `req`: refused when the number is in use or too many are open.
    fn open_request(&self, req: u32) -> Result<(), SendError> {
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

    /// What a frame from the receiver asks for: a step for a worker, or nothing more.
    fn dispatch(&self, frame: Frame) -> Result<Option<Job>, SendError> {
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
            } => {
                self.open_request(req)?;
                Job::ListStart {
                    req,
                    path,
                    ino,
                    inline,
                    hash,
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
            } => {
                if credit > MAX_CREDIT {
                    return protocol(format!("a credit of {credit} bytes (at most {MAX_CREDIT})"));
                }
                self.open_request(req)?;
                Job::ReadStart {
                    req,
                    path,
                    expect,
                    credit,
                    hash,
                    hash_only,
                    zstd,
                }
            }
            Frame::Count { req, links } => {
                self.open_request(req)?;
                Job::Count { req, links }
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
    fn run(&self, job: Job) {
        let mut next = Some(job);
        while let Some(job) = next {
            next = self.step(job);
        }
    }

    fn step(&self, job: Job) -> Option<Job> {
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
            } => match self.open_listing(&path, ino, inline, hash) {
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
            } => match self.open_read(&path, &expect, credit, (hash, hash_only, zstd)) {
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

    /// What a copy of the whole top would carry, counted as `plan_beneath` counts it (the
    /// files the filter selects, a hard-linked one once when `links`), Ferry's own state at
    /// the top left out as it is never served.
    fn count(&self, links: bool) -> Result<Totals, (&'static str, io::Error)> {
        match self.top {
            SourceTop::File(fd) => {
                let st = sys::fstat(fd.as_fd()).map_err(|e| ("stat", e))?;
                Ok(Totals {
                    files: 1,
                    bytes: st.st_size as u64,
                    ..Default::default()
                })
            }
            SourceTop::Dir(fd) => {
                // A descriptor of its own: a listing moves the offset of every descriptor
                // that shares the top's.
                let dir = self
                    .open_at(fd.as_fd(), c".", DIR_FLAGS)
                    .map_err(|e| ("open directory", e))?;
                let reserved = self.opts.reserved_top.as_deref();
                Ok(crate::plan::count_dir(
                    dir,
                    Part::All,
                    links,
                    &self.opts.filter,
                    reserved,
                ))
            }
        }
    }

    /// Request `req` is answered in full (called before its last frame is sent: once the
    /// receiver has that frame, it may use the number again).
    fn end(&self, req: u32) {
        lock(&self.requests).remove(&req);
    }

    /// Resolve `path` to its parent directory (opened, no symlink on the way, never above
    /// the top) and its last name; `None` for the top itself.
    fn resolve(&self, path: &[u8]) -> io::Result<Option<(OwnedFd, CString)>> {
        let SourceTop::Dir(top) = self.top else {
            return match path.is_empty() {
                true => Ok(None),
                false => Err(io::Error::from_raw_os_error(libc::ENOTDIR)),
            };
        };
        if path.is_empty() {
            return Ok(None);
        }
        let mut parts: Vec<&[u8]> = path.split(|&b| b == b'/').collect();
        if let Some(r) = &self.opts.reserved_top {
            if parts[0] == r.to_bytes() {
                return Err(io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    "Ferry's own state is not served",
                ));
            }
        }
        let last = parts.pop().unwrap_or_default();
        let name = CString::new(last).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        let mut dir = sys::open_beneath(top.as_fd(), c".", DIR_PATH)?;
        // A few components per openat2: a path longer than PATH_MAX is walked in pieces.
        let mut piece = Vec::new();
        for (i, part) in parts.iter().enumerate() {
            if !piece.is_empty() {
                piece.push(b'/');
            }
            piece.extend_from_slice(part);
            let end = i + 1 == parts.len() || piece.len() + parts[i + 1].len() + 1 > 3072;
            if end {
                let c = CString::new(std::mem::take(&mut piece))
                    .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
                dir = sys::openat2_beneath(dir.as_fd(), &c, DIR_PATH)?;
            }
        }
        Ok(Some((dir, name)))
    }

    /// Open a directory (`flags` has `O_DIRECTORY`, which refuses anything else before it
    /// is opened), without changing its access time where we may.
    fn open_at(&self, dir: BorrowedFd<'_>, name: &CStr, flags: libc::c_int) -> io::Result<OwnedFd> {
        debug_assert!(flags & libc::O_DIRECTORY != 0);
        if self.root {
            match sys::open_beneath(dir, name, flags | libc::O_NOATIME) {
                Err(e) if e.raw_os_error() == Some(libc::EPERM) => {}
                other => return other,
            }
        }
        sys::open_beneath(dir, name, flags)
    }

    /// Open an entry for reading only if it is a regular file (`dirs`: or a directory),
    /// with no window for a swap (see `sys::open_regular`): a device, FIFO, socket or
    /// symlink comes back as its stat, never opened. Access times as [`Half::open_at`].
    fn open_data_at(
        &self,
        dir: BorrowedFd<'_>,
        name: &CStr,
        flags: libc::c_int,
        dirs: bool,
    ) -> io::Result<sys::Opened> {
        let flags = if self.root {
            flags | libc::O_NOATIME
        } else {
            flags
        };
        match dirs {
            true => sys::open_regular_or_dir(dir, name, flags),
            false => sys::open_regular(dir, name, flags),
        }
    }

    /// The record of the entry at `path`.
    fn stat(&self, path: &[u8]) -> Result<Entry, (&'static str, io::Error)> {
        let name = path.rsplit(|&b| b == b'/').next().unwrap_or_default();
        match self.resolve(path).map_err(|e| ("open", e))? {
            None => {
                let fd = match self.top {
                    SourceTop::Dir(fd) | SourceTop::File(fd) => fd,
                };
                let st = sys::fstat(fd.as_fd()).map_err(|e| ("stat", e))?;
                // The top has no name of its own in the shard.
                self.record(b"-", &st, Some(fd.as_fd()), None)
                    .map_err(|e| ("read attributes", e))
            }
            Some((dir, c)) => {
                let (st, fd) = self.stat_at(dir.as_fd(), &c).map_err(|e| ("stat", e))?;
                let target = match st.st_mode & libc::S_IFMT == libc::S_IFLNK {
                    true => Some(sys::readlinkat(dir.as_fd(), &c).map_err(|e| ("read link", e))?),
                    false => None,
                };
                self.record(name, &st, fd.as_ref().map(|f| f.as_fd()), target)
                    .map_err(|e| ("read attributes", e))
            }
        }
    }

    /// Stat `name` in `dir`, and for a directory or regular file open it (its attributes
    /// are read through the descriptor, and its stat is then the descriptor's).
    fn stat_at(&self, dir: BorrowedFd<'_>, name: &CStr) -> io::Result<(Stat, Option<OwnedFd>)> {
        self.stat_hinted(dir, name, DType::Unknown)
    }

    /// [`Half::stat_at`] with the listing's type: an entry it says is a regular file or a
    /// directory is opened straight away (its stat is then the descriptor's: one `lstat`
    /// less per file). As a local copy opens a listed file: only once it is known to be a
    /// regular file or a directory (see `sys::open_regular`), so a FIFO or device swapped
    /// in meanwhile is never opened.
    fn stat_hinted(
        &self,
        dir: BorrowedFd<'_>,
        name: &CStr,
        hint: DType,
    ) -> io::Result<(Stat, Option<OwnedFd>)> {
        let opens = |kind: u32| kind == libc::S_IFREG || kind == libc::S_IFDIR;
        if !self.opts.xattrs {
            return Ok((sys::lstatat(dir, name)?, None));
        }
        if !matches!(hint, DType::Regular | DType::Dir) {
            let st = sys::lstatat(dir, name)?;
            if !opens(st.st_mode & libc::S_IFMT) {
                return Ok((st, None));
            }
        }
        let flags = libc::O_RDONLY | libc::O_NOCTTY;
        match self.open_data_at(dir, name, flags, true) {
            Ok(sys::Opened::Open(fd, st)) => Ok((st, Some(fd))),
            // Something else since the listing (a symlink, FIFO, socket or device): its
            // record as its own stat has it.
            Ok(sys::Opened::Other(st)) => Ok((st, None)),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Err(e),
            // A file or directory this agent may not open: its record as `lstat` has it.
            // (The receiver's read or listing of it then fails by itself, with the reason.)
            Err(_) => Ok((sys::lstatat(dir, name)?, None)),
        }
    }

    /// The record of entry `name` of stat `st` (`fd`: its descriptor, to read its extended
    /// attributes through, when it was opened).
    fn record(
        &self,
        name: &[u8],
        st: &Stat,
        fd: Option<BorrowedFd<'_>>,
        target: Option<CString>,
    ) -> io::Result<Entry> {
        let xattrs = match fd.filter(|_| self.opts.xattrs) {
            Some(fd) => read_xattrs(fd)?,
            None => Vec::new(),
        };
        Ok(entry_of(name, st, target, xattrs))
    }

    fn open_listing(
        &self,
        path: &[u8],
        ino: u64,
        inline: bool,
        hash: bool,
    ) -> Result<Box<ListState>, (&'static str, io::Error)> {
        let dir = match self.resolve(path).map_err(|e| ("open directory", e))? {
            None => match self.top {
                SourceTop::Dir(fd) => self.open_at(fd.as_fd(), c".", DIR_FLAGS),
                SourceTop::File(_) => Err(io::Error::from_raw_os_error(libc::ENOTDIR)),
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
        }))
    }

    /// Send the next batch of a listing; then its next step if the receiver asked for it
    /// meanwhile, or it waits for the next [`Frame::More`].
    fn list(&self, req: u32, mut state: Box<ListState>) -> Option<Job> {
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
            ..
        } = &mut *state;
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
            let (st, fd) = match self.stat_hinted(dir.as_fd(), &name, dtype) {
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
                    let hash = hash.then(|| xxh3_128(data));
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

    fn open_read(
        &self,
        path: &[u8],
        expect: &Fingerprint,
        credit: u64,
        (hash, hash_only, zstd): (bool, bool, bool),
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
        Ok(Some(Box::new(ReadState {
            zstd,
            corrupt,
            fd,
            st,
            off: 0,
            // A file with holes starts by looking for its first data extent.
            data_end: if sparse { 0 } else { size },
            hasher: (hash || hash_only).then(Xxh3::new),
            credit,
            hash_only,
        })))
    }

    /// Send what the credit allows of a file; then go on if more credit came meanwhile,
    /// wait for it, or end the file.
    fn read(&self, req: u32, mut r: Box<ReadState>) -> Option<Job> {
        let mut buf = ReadBuf::take();
        let buf = &mut buf.0;
        let size = r.st.st_size as u64;
        let mut shrank = false;
        while r.off < size && (r.hash_only || r.credit > 0) {
            if r.off >= r.data_end {
                // Find the next data extent; what lies before it is a hole.
                let data = match sys::seek_data_or_hole(r.fd.as_fd(), r.off, true) {
                    Ok(found) => found.unwrap_or(size).min(size),
                    Err(_) => r.off,
                };
                if let Some(h) = &mut r.hasher {
                    hash_zeros(h, data - r.off);
                }
                r.off = data;
                if r.off >= size {
                    // A hole to the end.
                    break;
                }
                r.data_end = match sys::seek_data_or_hole(r.fd.as_fd(), r.off, false) {
                    Ok(hole) => hole.unwrap_or(size).clamp(r.off + 1, size),
                    Err(_) => size,
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
                h.update(data);
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
        if r.off < size && !shrank {
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
        if !r.hash_only && !changed {
            self.files.fetch_add(1, Ordering::Relaxed);
        }
        self.end(req);
        self.send(&Frame::FileEnd {
            req,
            len: r.off,
            hash: r.hasher.take().map(|h| h.digest128()),
            changed,
        });
        None
    }
}

const DIR_FLAGS: libc::c_int = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW;
const DIR_PATH: libc::c_int = libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW;

/// A small file's bytes, whole, if it reads as the size it was opened with and did not
/// change meanwhile (otherwise the receiver asks for it by itself, and sees the change).
/// Append a small file's bytes to `arena`: `true` when they were read whole and the file
/// did not change meanwhile; else `arena` is as it was.
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

fn hash_zeros(h: &mut Xxh3, mut n: u64) {
    static ZEROS: [u8; 64 * 1024] = [0; 64 * 1024];
    while n > 0 {
        let k = n.min(ZEROS.len() as u64) as usize;
        h.update(&ZEROS[..k]);
        n -= k as u64;
    }
}

/// Every extended attribute of the open `fd`.
fn read_xattrs(fd: BorrowedFd<'_>) -> io::Result<Vec<Xattr>> {
    let mut names = Vec::new();
    match sys::flistxattr(fd, &mut names) {
        Ok(()) => {}
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOTSUP) | Some(libc::ENOSYS)) => {
            return Ok(Vec::new())
        }
        Err(e) => return Err(e),
    }
    let mut out = Vec::new();
    let mut value = Vec::new();
    for name in names.split_inclusive(|&b| b == 0) {
        let Ok(c) = CStr::from_bytes_with_nul(name) else {
            continue;
        };
        match sys::fgetxattr(fd, c, &mut value) {
            Ok(()) => out.push(Xattr {
                name: c.to_bytes().to_vec(),
                value: value.clone(),
            }),
            // Removed since the listing.
            Err(e) if e.raw_os_error() == Some(libc::ENODATA) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(out)
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
