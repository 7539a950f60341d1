//! The destination half's side of a connection to a source half (see `send`): one
//! connection carries the requests of every worker at once, each under its own number,
//! and a reader thread hands each answer to the worker that asked.
//!
//! What waits in memory is bounded by the protocol, not by this side's speed: a listing's
//! next batch is asked for only when the last one is taken, and a file's data comes only
//! within the credit its reader grants as it writes ([`CREDIT`] at a time).

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex, PoisonError};

use ferry_transfer::frame::{self, Frame};

/// Data bytes a file may have in flight towards this side.
pub const CREDIT: u64 = 4 << 20;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One stream's reading and writing ends.
pub type Stream = (Box<dyn Read + Send>, Box<dyn Write + Send>);

/// A stream's writing end and the buffer its frames are encoded in.
type Out = Mutex<(Box<dyn Write + Send>, Vec<u8>)>;

/// A connection to a source half, shared by a copy's workers: one stream or several (TLS
/// connections, in an agent), each request and everything about it (its `more`, credit and
/// close, and the sender's answers) on one of them, the requests spread over all (request
/// `n` on stream `n % streams`). Several streams spread the encryption, decryption and
/// socket copies over as many threads on both nodes (one reader thread each here, one serve
/// loop each on the sender), and over as many TCP flows on the network.
pub struct Connection {
    outs: Vec<Out>,
    waiting: Mutex<HashMap<u32, Sender<Frame>>>,
    next: AtomicU32,
    /// Why the connection is over, once it is.
    lost: Mutex<Option<String>>,
    /// `lost` is set: read without the lock, as every worker asks before every entry.
    is_lost: std::sync::atomic::AtomicBool,
    /// File bytes that arrived, data and inline (for the summary and metrics).
    received: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("lost", &*lock(&self.lost))
            .finish()
    }
}

impl Connection {
    /// Start serving the answers that come on `reader` (on a thread of its own, which ends
    /// with the connection); requests go out on `writer`. The hello is the caller's, before.
    pub fn start(
        reader: impl Read + Send + 'static,
        writer: impl Write + Send + 'static,
    ) -> io::Result<Arc<Self>> {
        Self::start_streams(vec![(Box::new(reader), Box::new(writer))])
    }

    /// [`Connection::start`] over several streams to the same source half (each already
    /// past its hello): a reader thread each. At least one.
    pub fn start_streams(streams: Vec<Stream>) -> io::Result<Arc<Self>> {
        if streams.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a connection needs at least one stream",
            ));
        }
        let (readers, writers): (Vec<_>, Vec<_>) = streams.into_iter().unzip();
        let conn = Arc::new(Self {
            outs: writers
                .into_iter()
                .map(|w| Mutex::new((w, Vec::new())))
                .collect(),
            waiting: Mutex::new(HashMap::new()),
            next: AtomicU32::new(1),
            lost: Mutex::new(None),
            is_lost: Default::default(),
            received: Default::default(),
        });
        for reader in readers {
            let weak = Arc::downgrade(&conn);
            std::thread::Builder::new()
                .name("ferry-recv".into())
                .spawn(move || answers(reader, weak))?;
        }
        Ok(conn)
    }

    /// Why the connection ended, if it has.
    pub fn lost(&self) -> Option<String> {
        if !self.is_lost.load(Ordering::Acquire) {
            return None;
        }
        lock(&self.lost).clone()
    }

    /// File bytes received so far (data, inline, and chunk hashes).
    pub fn bytes_received(&self) -> u64 {
        self.received.load(Ordering::Relaxed)
    }

    fn lose(&self, why: String) {
        lock(&self.lost).get_or_insert(why);
        self.is_lost.store(true, Ordering::Release);
        // Every worker waiting on an answer wakes to a closed channel.
        lock(&self.waiting).clear();
    }

    fn error(&self) -> io::Error {
        let why = self.lost().unwrap_or_else(|| "closed".into());
        io::Error::new(
            io::ErrorKind::ConnectionAborted,
            format!("the connection to the source's node was lost: {why}"),
        )
    }

    /// Send a request made by `make` with a fresh number; its answers arrive on the
    /// returned [`Request`].
    pub(crate) fn request(
        self: &Arc<Self>,
        make: impl FnOnce(u32) -> Frame,
    ) -> io::Result<Request> {
        let mut req = self.next.fetch_add(1, Ordering::Relaxed);
        if req == 0 {
            req = self.next.fetch_add(1, Ordering::Relaxed);
        }
        let (tx, rx) = channel();
        {
            let mut waiting = lock(&self.waiting);
            if lock(&self.lost).is_some() {
                return Err(self.error());
            }
            waiting.insert(req, tx);
        }
        let request = Request {
            conn: self.clone(),
            req,
            rx,
            done: false,
        };
        self.send(&make(req))?;
        Ok(request)
    }

    /// The sender's record of the entry at `path` (from its top; empty: the top itself).
    pub(crate) fn stat(self: &Arc<Self>, path: &[u8]) -> io::Result<ferry_transfer::Entry> {
        let mut req = self.request(|req| Frame::Stat {
            req,
            path: path.to_vec(),
        })?;
        match req.next()? {
            Frame::Entry { entry, .. } => Ok(entry),
            _ => Err(io::Error::other(
                "the sender answered a stat with something else",
            )),
        }
    }

    /// What a copy of the sender's whole top would carry, counted on its node (this side
    /// has no source to count, for a dry run, an ETA or a full destination's message): the
    /// regular files its filter (`SendOptions::filter`) selects, a hard-linked one once
    /// when `links`, and their bytes. Only files and bytes travel: `dirs` and `others` are
    /// 0. A lost connection, or a count that failed on the sender, is the error.
    pub fn count(self: &Arc<Self>, links: bool) -> io::Result<crate::Totals> {
        let mut req = self.request(|req| Frame::Count { req, links })?;
        match req.next()? {
            Frame::Counted { files, bytes, .. } => Ok(crate::Totals {
                files,
                bytes,
                ..Default::default()
            }),
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "the sender answered a count with something else",
            )),
        }
    }

    /// Bytes `[offset, offset + buf.len())` of the sender's raw block device, into `buf`
    /// (what the sender did not send is zeros), or only their hash when `hash_only` (`buf`
    /// is left as it is). Returns the sender's xxHash3-128 of the range as it read it; the
    /// caller compares it with the hash of what arrived.
    pub fn read_range(
        self: &Arc<Self>,
        offset: u64,
        buf: &mut [u8],
        hash_only: bool,
        zstd: bool,
    ) -> io::Result<u128> {
        let bad = |why: String| io::Error::new(io::ErrorKind::InvalidData, why);
        let len = u32::try_from(buf.len())
            .ok()
            .filter(|l| (1..=frame::MAX_RANGE).contains(l))
            .ok_or_else(|| bad(format!("a range of {} bytes", buf.len())))?;
        if !hash_only {
            buf.fill(0);
        }
        let mut req = self.request(|req| Frame::ReadRange {
            req,
            offset,
            len,
            hash_only,
            zstd,
        })?;
        loop {
            match req.next()? {
                Frame::Data {
                    offset: at,
                    zstd: packed,
                    data,
                    ..
                } if !hash_only => {
                    let start = at
                        .checked_sub(offset)
                        .filter(|s| *s < u64::from(len))
                        .ok_or_else(|| {
                            bad(format!(
                                "data at {at}, outside the range asked for at {offset}"
                            ))
                        })? as usize;
                    let room = buf.len().min(start + frame::MAX_DATA);
                    let room = &mut buf[start..room];
                    if packed {
                        // Never more than the range's room (and a frame's) once decompressed.
                        zstd::bulk::decompress_to_buffer(&data, room).map_err(|e| {
                            bad(format!("the sender's compressed data does not decompress within the range: {e}"))
                        })?;
                    } else {
                        room.get_mut(..data.len())
                            .ok_or_else(|| bad(format!("data at {at} runs past the range")))?
                            .copy_from_slice(&data);
                    }
                }
                Frame::FileEnd {
                    len: got,
                    hash: Some(hash),
                    ..
                } if got == u64::from(len) => return Ok(hash),
                _ => return Err(bad("the sender answered a range with something else".into())),
            }
        }
    }

    pub(crate) fn send(&self, f: &Frame) -> io::Result<()> {
        // Everything about a request goes on its stream (the sender keeps its state there).
        let req = match f {
            Frame::Stat { req, .. }
            | Frame::List { req, .. }
            | Frame::More { req }
            | Frame::Close { req }
            | Frame::Read { req, .. }
            | Frame::Credit { req, .. }
            | Frame::Count { req, .. }
            | Frame::ReadRange { req, .. }
            | Frame::HashChunks { req, .. }
            | Frame::ReadPart { req, .. } => *req,
            _ => 0,
        };
        let mut out = lock(&self.outs[req as usize % self.outs.len()]);
        let (w, buf) = &mut *out;
        let sent = ferry_transfer::stream::write_frame(w, f, buf).and_then(|()| w.flush());
        drop(out);
        if let Err(e) = sent {
            self.lose(format!("writing: {e}"));
            return Err(self.error());
        }
        Ok(())
    }
}

/// The reader thread: every answer to the worker waiting for it; answers to requests no
/// one waits for any more (closed) are dropped.
fn answers(mut reader: impl Read, conn: std::sync::Weak<Connection>) {
    let (mut buf, pool) = (Vec::new(), ferry_transfer::Buffers::default());
    loop {
        let frame = ferry_transfer::stream::read_frame_pooled(&mut reader, &mut buf, &pool);
        let Some(conn) = conn.upgrade() else {
            return;
        };
        let frame = match frame {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                return conn.lose("the source's node closed it".into())
            }
            Err(e) => return conn.lose(format!("reading: {e}")),
        };
        let req = match &frame {
            Frame::Entry { req, .. }
            | Frame::Listing { req, .. }
            | Frame::Data { req, .. }
            | Frame::FileEnd { req, .. }
            | Frame::Counted { req, .. }
            | Frame::ChunkHashes { req, .. }
            | Frame::Failed { req, .. } => *req,
            Frame::Abort { reason } => return conn.lose(format!("the sender aborted: {reason}")),
            _ => return conn.lose("the sender broke the protocol".into()),
        };
        let bytes = match &frame {
            Frame::Data { data, .. } => data.len(),
            Frame::Listing { inline, .. } => inline.iter().map(|f| f.data.len()).sum(),
            // (What a file that differs in places costs besides its changed chunks.)
            Frame::ChunkHashes { hashes, .. } => hashes.len() * 16,
            _ => 0,
        };
        conn.received.fetch_add(bytes as u64, Ordering::Relaxed);
        let tx = lock(&conn.waiting).get(&req).cloned();
        if let Some(tx) = tx {
            let _ = tx.send(frame);
        }
    }
}

/// One request's answers.
pub(crate) struct Request {
    conn: Arc<Connection>,
    req: u32,
    rx: Receiver<Frame>,
    /// Its last answer came: nothing to close.
    done: bool,
}

impl Request {
    pub(crate) fn id(&self) -> u32 {
        self.req
    }

    /// The next answer; a [`Frame::Failed`] as the error it carries.
    pub(crate) fn next(&mut self) -> io::Result<Frame> {
        let frame = self.rx.recv().map_err(|_| self.conn.error())?;
        match frame {
            Frame::Failed { errno, message, .. } => {
                self.end();
                Err(match errno {
                    0 => io::Error::other(format!("on the source's node: {message}")),
                    // A directory replaced, or a symlink or file where the path had a
                    // directory: the source changed under the copy, as locally.
                    libc::ESTALE | libc::ELOOP | libc::ENOTDIR => {
                        crate::error::source_changed(format!("on the source's node: {message}"))
                    }
                    // The kernel's own errors keep their errno, so they are told apart
                    // (not found, permission denied) as a local copy's are.
                    n => io::Error::from_raw_os_error(n),
                })
            }
            f @ (Frame::Entry { .. } | Frame::FileEnd { .. } | Frame::Counted { .. }) => {
                self.end();
                Ok(f)
            }
            f @ Frame::Listing { last: true, .. } => {
                self.end();
                Ok(f)
            }
            f => Ok(f),
        }
    }

    /// Its last answer came.
    fn end(&mut self) {
        self.done = true;
        lock(&self.conn.waiting).remove(&self.req);
    }

    pub(crate) fn send(&self, f: &Frame) -> io::Result<()> {
        self.conn.send(f)
    }
}

impl Drop for Request {
    fn drop(&mut self) {
        if !self.done {
            lock(&self.conn.waiting).remove(&self.req);
            let _ = self.conn.send(&Frame::Close { req: self.req });
        }
    }
}
