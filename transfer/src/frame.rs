//! Frames: a kind byte, the payload's length (u32, little-endian) and the payload. The
//! length is checked against [`MAX_PAYLOAD`] before the payload is read, and the payload is
//! decoded completely (no trailing bytes) or refused.
//!
//! One connection carries one shard, and the receiver drives it: the destination half
//! decides what it needs (its walk, its resume, overwrite and include/exclude decisions are
//! the local copy's), and the sender answers requests about the tree beneath the shard's
//! source, never anything else. The receiver opens with [`Frame::Hello`] (which shard, at
//! which epoch, and the shard's ticket); the sender answers [`Frame::Welcome`] or
//! [`Frame::Refused`]. Then every request carries a number the receiver chose (`req`), and
//! every answer names it, so one connection carries the requests of many workers at once:
//!
//! - [`Frame::Stat`] → [`Frame::Entry`]: one entry's record (the shard's top is path "").
//! - [`Frame::List`] → [`Frame::Listing`] batches, each after a [`Frame::More`] but the
//!   first: a directory's entries with their records, and, when asked, the bytes of its
//!   small files inline, so a fresh tree's small files cost no round trip of their own.
//! - [`Frame::Read`] → [`Frame::Data`] ... [`Frame::FileEnd`]: a file's data extents (holes
//!   are not sent) within the receiver's credit (the `credit` of the request, then each
//!   [`Frame::Credit`]), so a slow receiver stops the sender and neither side buffers more
//!   than the credit per request; the end carries the hash of what was read and whether the
//!   file changed meanwhile. `hash_only` reads without sending (compare by checksum).
//! - [`Frame::Count`] → [`Frame::Counted`]: the regular files (and their bytes) a copy of
//!   the whole top would carry, counted on the sender (a receiver has no local source to
//!   count for a dry run, an ETA or a full destination's message).
//! - [`Frame::Failed`]: a request failed (with the errno the sender's kernel gave).
//! - [`Frame::Close`]: the receiver no longer wants a request's answers.
//!
//! [`Frame::Abort`] ends a connection, either way, with a reason.

use bytes::Bytes;
use std::io::{self, Read, Write};

use crate::codec::{Reader, Writer};
use crate::entry::{self, check_name, Entry};
use crate::{Buffers, Error};

/// The protocol version a [`Frame::Hello`] and a [`Frame::Welcome`] carry.
pub const VERSION: u16 = 3;
/// Kind byte and payload length.
pub const HEADER: usize = 5;
/// The largest payload: a listing of entries up to [`LISTING_ENTRY_BYTES`] (one entry with
/// the most extended attributes a record may carry always fits alone) with up to
/// [`INLINE_BYTES`] of inline data.
pub const MAX_PAYLOAD: usize = 4 << 20;
/// Encoded entries a sender puts in one listing before it starts the next.
pub const LISTING_ENTRY_BYTES: usize = 1 << 20;
/// The most data bytes one [`Frame::Data`] carries.
pub const MAX_DATA: usize = 1 << 20;
/// The largest file whose bytes may travel inline in a listing.
pub const INLINE_MAX: usize = 64 << 10;
/// The most inline bytes one listing carries.
pub const INLINE_BYTES: usize = 1 << 20;
/// The most entries in one listing.
pub const MAX_ENTRIES: usize = 4096;
/// Longest relative path in a request: deeper than `PATH_MAX` (a tree may nest further
/// than one syscall can name; the sender resolves it a few components at a time).
pub const PATH_BYTES_MAX: usize = 1 << 20;
/// Longest reason in a refusal, a failure or an abort.
pub const REASON_MAX: usize = 1024;
/// Longest job identity (a Kubernetes UID is 36 bytes).
pub const JOB_MAX: usize = 128;

/// What a file is expected to be when its data is asked for (from its record): if the
/// sender finds it otherwise, it answers with `changed`, sending nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fingerprint {
    pub ino: u64,
    pub size: u64,
    pub mtime: entry::Time,
    pub ctime: entry::Time,
}

/// A small file's bytes in a listing: entry `index` of that listing, whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inline {
    pub index: u32,
    /// A slice of the listing's payload once decoded by [`read_frame`] (no copy per file).
    pub data: Bytes,
    /// xxh3-128 of `data`, when the receiver hashes.
    pub hash: Option<u128>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// Receiver to sender, first: the shard this connection carries and its credential.
    Hello {
        version: u16,
        /// The CopyJob's UID.
        job: Vec<u8>,
        shard: u32,
        epoch: u64,
        ticket: [u8; 32],
    },
    /// Sender to receiver: the hello is accepted.
    Welcome { version: u16 },
    /// Sender to receiver: it is not, and why (then the sender closes the connection).
    Refused { reason: String },
    /// Receiver: the record of the entry at `path` (relative to the shard's top, `/`
    /// between components; empty for the top itself).
    Stat { req: u32, path: Vec<u8> },
    /// Sender: the answer to a [`Frame::Stat`].
    Entry { req: u32, entry: Entry },
    /// Receiver: list directory `path`, which must still be inode `ino`; `inline`: send the
    /// bytes of its small files with it, `hash`: with their hashes.
    List {
        req: u32,
        path: Vec<u8>,
        ino: u64,
        inline: bool,
        hash: bool,
    },
    /// Sender: a batch of a listing's entries; `last` when the directory has no more.
    Listing {
        req: u32,
        entries: Vec<Entry>,
        inline: Vec<Inline>,
        last: bool,
    },
    /// Receiver: the next batch of listing `req`.
    More { req: u32 },
    /// Receiver: the data of regular file `path`, expected to be `expect`. `credit`: bytes
    /// (of the file, before any compression) the sender may send before a
    /// [`Frame::Credit`]; `hash`: hash what is read; `hash_only`: send no data, only the
    /// end (with the hash); `zstd`: compress the data where that makes it smaller.
    Read {
        req: u32,
        path: Vec<u8>,
        expect: Fingerprint,
        credit: u64,
        hash: bool,
        hash_only: bool,
        zstd: bool,
    },
    /// Sender: bytes of file `req` at `offset`. Bytes not sent below the end's `len` are
    /// holes. `zstd`: `data` is one zstd frame of at most [`MAX_DATA`] bytes when
    /// decompressed (the receiver decompresses into a buffer of that bound); sent only
    /// when asked for and smaller.
    Data {
        req: u32,
        offset: u64,
        zstd: bool,
        data: Bytes,
    },
    /// Sender: file `req` is sent. `len`: its length (holes at its end included); `hash`:
    /// xxh3-128 of what was read, holes as zeros; `changed`: the file was not what the
    /// request expected, or changed while it was read (the receiver discards what it
    /// wrote).
    FileEnd {
        req: u32,
        len: u64,
        hash: Option<u128>,
        changed: bool,
    },
    /// Receiver: this many more bytes of file `req` may be sent.
    Credit { req: u32, bytes: u64 },
    /// Sender: request `req` failed with this errno (0 when it is not the kernel's).
    Failed {
        req: u32,
        errno: i32,
        message: String,
    },
    /// Receiver: send nothing more for request `req`.
    Close { req: u32 },
    /// Either way: the connection ends, for this reason.
    Abort { reason: String },
    /// Receiver: count what a copy of the top would carry, as the sender's filter selects
    /// it; `links`: a hard-linked file counts once (as a copy that keeps hard links makes
    /// one file of it), not once per name.
    Count { req: u32, links: bool },
    /// Sender: the answer to a [`Frame::Count`]: regular files and their apparent bytes.
    Counted { req: u32, files: u64, bytes: u64 },
}

/// Check a relative path: empty, or components joined by single `/`s.
pub fn check_path(path: &[u8]) -> Result<(), Error> {
    if path.is_empty() {
        return Ok(());
    }
    path.split(|&b| b == b'/')
        .try_for_each(|c| check_name(c, "path component"))
}

fn reason(r: &mut Reader<'_>, what: &'static str) -> Result<String, Error> {
    let bytes = r.bytes(REASON_MAX, what)?;
    String::from_utf8(bytes.to_vec()).map_err(|_| Error::Invalid {
        what,
        why: "is not UTF-8",
    })
}

fn truncated_reason(s: &str) -> &[u8] {
    let mut end = s.len().min(REASON_MAX);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s.as_bytes()[..end]
}

fn path(r: &mut Reader<'_>) -> Result<Vec<u8>, Error> {
    let p = r.bytes(PATH_BYTES_MAX, "path")?;
    check_path(p)?;
    Ok(p.to_vec())
}

fn write_path(w: &mut Writer, p: &[u8]) -> Result<(), Error> {
    Error::at_most("path", p.len(), PATH_BYTES_MAX)?;
    check_path(p)?;
    w.bytes(p);
    Ok(())
}

fn flag(r: &mut Reader<'_>, what: &'static str) -> Result<bool, Error> {
    match r.u8(what)? {
        0 => Ok(false),
        1 => Ok(true),
        tag => Err(Error::Unknown { what, tag }),
    }
}

fn time(r: &mut Reader<'_>) -> Result<entry::Time, Error> {
    let t = entry::Time {
        secs: r.i64("timestamp")?,
        nanos: r.u32("timestamp")?,
    };
    match t.nanos < 1_000_000_000 {
        true => Ok(t),
        false => Err(Error::Invalid {
            what: "timestamp",
            why: "has nanoseconds of a second or more",
        }),
    }
}

fn optional_hash(r: &mut Reader<'_>) -> Result<Option<u128>, Error> {
    match flag(r, "hash present")? {
        true => Ok(Some(r.u128("hash")?)),
        false => Ok(None),
    }
}

fn write_optional_hash(w: &mut Writer, h: Option<u128>) {
    w.u8(u8::from(h.is_some()));
    if let Some(h) = h {
        w.u128(h);
    }
}

/// Each inline file is at least its index, its length prefix and its hash flag.
const INLINE_MIN_ENCODED: usize = 4 + 4 + 1;

impl Frame {
    fn kind(&self) -> u8 {
        match self {
            Frame::Hello { .. } => 1,
            Frame::Welcome { .. } => 2,
            Frame::Refused { .. } => 3,
            Frame::Stat { .. } => 4,
            Frame::Entry { .. } => 5,
            Frame::List { .. } => 6,
            Frame::Listing { .. } => 7,
            Frame::More { .. } => 8,
            Frame::Read { .. } => 9,
            Frame::Data { .. } => DATA_KIND,
            Frame::FileEnd { .. } => 11,
            Frame::Credit { .. } => 12,
            Frame::Failed { .. } => 13,
            Frame::Close { .. } => 14,
            Frame::Abort { .. } => 15,
            Frame::Count { .. } => 16,
            Frame::Counted { .. } => 17,
        }
    }

    /// Append the frame, header first, to `out`. Refuses what the peer's decoder would
    /// refuse (a bad entry, a payload over [`MAX_PAYLOAD`]), so the error is the sender's,
    /// with the field it is about. Reasons longer than [`REASON_MAX`] are cut.
    pub fn encode(&self, out: &mut Vec<u8>) -> Result<(), Error> {
        let mut w = Writer {
            buf: std::mem::take(out),
        };
        let start = w.buf.len();
        w.buf.extend_from_slice(&[0; HEADER]);
        let result = self.payload(&mut w);
        let len = w.buf.len() - start - HEADER;
        let result = result.and_then(|()| {
            (len <= MAX_PAYLOAD)
                .then_some(())
                .ok_or(Error::FrameTooLarge {
                    len,
                    max: MAX_PAYLOAD,
                })
        });
        match result {
            Ok(()) => {
                w.buf[start] = self.kind();
                w.buf[start + 1..start + HEADER].copy_from_slice(&(len as u32).to_le_bytes());
            }
            Err(_) => w.buf.truncate(start),
        }
        *out = w.buf;
        result
    }

    fn payload(&self, w: &mut Writer) -> Result<(), Error> {
        match self {
            Frame::Hello {
                version,
                job,
                shard,
                epoch,
                ticket,
            } => {
                Error::at_most("job", job.len(), JOB_MAX)?;
                w.u16(*version);
                w.bytes(job);
                w.u32(*shard);
                w.u64(*epoch);
                w.buf.extend_from_slice(ticket);
            }
            Frame::Welcome { version } => w.u16(*version),
            Frame::Refused { reason } | Frame::Abort { reason } => {
                w.bytes(truncated_reason(reason))
            }
            Frame::Stat { req, path } => {
                w.u32(*req);
                write_path(w, path)?;
            }
            Frame::Entry { req, entry } => {
                entry.check()?;
                w.u32(*req);
                entry.encode(w);
            }
            Frame::List {
                req,
                path,
                ino,
                inline,
                hash,
            } => {
                w.u32(*req);
                write_path(w, path)?;
                w.u64(*ino);
                w.u8(u8::from(*inline));
                w.u8(u8::from(*hash));
            }
            Frame::Listing {
                req,
                entries,
                inline,
                last,
            } => {
                Error::few_enough("entries", entries.len(), MAX_ENTRIES)?;
                Error::few_enough("inline files", inline.len(), entries.len())?;
                w.u32(*req);
                w.u32(entries.len() as u32);
                for e in entries {
                    e.check()?;
                    e.encode(w);
                }
                w.u32(inline.len() as u32);
                let (mut total, mut prev) = (0, None);
                for f in inline {
                    Error::at_most("inline file", f.data.len(), INLINE_MAX)?;
                    total += f.data.len();
                    Error::at_most("inline data of a listing", total, INLINE_BYTES)?;
                    check_inline(f, &mut prev, entries)?;
                    w.u32(f.index);
                    w.bytes(&f.data);
                    write_optional_hash(w, f.hash);
                }
                w.u8(u8::from(*last));
            }
            Frame::More { req } | Frame::Close { req } => w.u32(*req),
            Frame::Read {
                req,
                path,
                expect,
                credit,
                hash,
                hash_only,
                zstd,
            } => {
                w.u32(*req);
                write_path(w, path)?;
                w.u64(expect.ino);
                w.u64(expect.size);
                for t in [expect.mtime, expect.ctime] {
                    w.i64(t.secs);
                    w.u32(t.nanos);
                }
                w.u64(*credit);
                w.u8(u8::from(*hash));
                w.u8(u8::from(*hash_only));
                w.u8(u8::from(*zstd));
            }
            Frame::Data {
                req,
                offset,
                zstd,
                data,
            } => {
                Error::at_most("data", data.len(), MAX_DATA)?;
                w.u32(*req);
                w.u64(*offset);
                w.u8(u8::from(*zstd));
                w.bytes(data);
            }
            Frame::FileEnd {
                req,
                len,
                hash,
                changed,
            } => {
                w.u32(*req);
                w.u64(*len);
                write_optional_hash(w, *hash);
                w.u8(u8::from(*changed));
            }
            Frame::Credit { req, bytes } => {
                w.u32(*req);
                w.u64(*bytes);
            }
            Frame::Failed {
                req,
                errno,
                message,
            } => {
                w.u32(*req);
                w.u32(*errno as u32);
                w.bytes(truncated_reason(message));
            }
            Frame::Count { req, links } => {
                w.u32(*req);
                w.u8(u8::from(*links));
            }
            Frame::Counted { req, files, bytes } => {
                w.u32(*req);
                w.u64(*files);
                w.u64(*bytes);
            }
        }
        Ok(())
    }

    /// Decode the payload of a frame of kind `kind` (its header already checked by
    /// [`check_header`]).
    pub fn decode(kind: u8, payload: &[u8]) -> Result<Frame, Error> {
        Self::decode_in(kind, payload, None)
    }

    /// [`Frame::decode`] of a payload held in `payload`: a listing's inline files are
    /// slices of it, sharing its buffer, not copies.
    pub fn decode_shared(kind: u8, payload: &Bytes) -> Result<Frame, Error> {
        Self::decode_in(kind, payload, Some(payload))
    }

    fn decode_in(kind: u8, payload: &[u8], shared: Option<&Bytes>) -> Result<Frame, Error> {
        if payload.len() > MAX_PAYLOAD {
            return Err(Error::FrameTooLarge {
                len: payload.len(),
                max: MAX_PAYLOAD,
            });
        }
        let mut r = Reader::new(payload);
        let frame = match kind {
            1 => {
                let version = r.u16("version")?;
                let job = r.bytes(JOB_MAX, "job")?.to_vec();
                let (shard, epoch) = (r.u32("shard")?, r.u64("epoch")?);
                let ticket = r.array("ticket")?;
                Frame::Hello {
                    version,
                    job,
                    shard,
                    epoch,
                    ticket,
                }
            }
            2 => Frame::Welcome {
                version: r.u16("version")?,
            },
            3 => Frame::Refused {
                reason: reason(&mut r, "refusal")?,
            },
            4 => Frame::Stat {
                req: r.u32("request")?,
                path: path(&mut r)?,
            },
            5 => Frame::Entry {
                req: r.u32("request")?,
                entry: Entry::decode(&mut r)?,
            },
            6 => Frame::List {
                req: r.u32("request")?,
                path: path(&mut r)?,
                ino: r.u64("inode")?,
                inline: flag(&mut r, "inline")?,
                hash: flag(&mut r, "hash")?,
            },
            7 => {
                let req = r.u32("request")?;
                let n = r.count(MAX_ENTRIES, entry::MIN_ENCODED, "entries")?;
                let mut entries = Vec::with_capacity(n);
                for _ in 0..n {
                    entries.push(Entry::decode(&mut r)?);
                }
                let m = r.count(n, INLINE_MIN_ENCODED, "inline files")?;
                let mut inline = Vec::with_capacity(m);
                let (mut total, mut prev) = (0, None);
                for _ in 0..m {
                    let index = r.u32("inline index")?;
                    let data = r.bytes(INLINE_MAX, "inline file")?;
                    let data = match shared {
                        Some(b) => b.slice_ref(data),
                        None => Bytes::copy_from_slice(data),
                    };
                    total += data.len();
                    Error::at_most("inline data of a listing", total, INLINE_BYTES)?;
                    let f = Inline {
                        index,
                        data,
                        hash: optional_hash(&mut r)?,
                    };
                    check_inline(&f, &mut prev, &entries)?;
                    inline.push(f);
                }
                Frame::Listing {
                    req,
                    entries,
                    inline,
                    last: flag(&mut r, "last")?,
                }
            }
            8 => Frame::More {
                req: r.u32("request")?,
            },
            9 => {
                let req = r.u32("request")?;
                let path = path(&mut r)?;
                let (ino, size) = (r.u64("inode")?, r.u64("size")?);
                let (mtime, ctime) = (time(&mut r)?, time(&mut r)?);
                Frame::Read {
                    req,
                    path,
                    expect: Fingerprint {
                        ino,
                        size,
                        mtime,
                        ctime,
                    },
                    credit: r.u64("credit")?,
                    hash: flag(&mut r, "hash")?,
                    hash_only: flag(&mut r, "hash only")?,
                    zstd: flag(&mut r, "compression")?,
                }
            }
            10 => {
                let req = r.u32("request")?;
                let offset = r.u64("offset")?;
                let zstd = flag(&mut r, "compression")?;
                let data = r.bytes(MAX_DATA, "data")?;
                let data = match shared {
                    Some(b) => b.slice_ref(data),
                    None => Bytes::copy_from_slice(data),
                };
                // (Compressed data is checked once decompressed, by the receiver.)
                if offset.checked_add(data.len() as u64).is_none() {
                    return Err(Error::Invalid {
                        what: "data offset",
                        why: "overflows with its length",
                    });
                }
                Frame::Data {
                    req,
                    offset,
                    zstd,
                    data,
                }
            }
            11 => Frame::FileEnd {
                req: r.u32("request")?,
                len: r.u64("length")?,
                hash: optional_hash(&mut r)?,
                changed: flag(&mut r, "changed")?,
            },
            12 => Frame::Credit {
                req: r.u32("request")?,
                bytes: r.u64("credit")?,
            },
            13 => Frame::Failed {
                req: r.u32("request")?,
                errno: r.u32("errno")? as i32,
                message: reason(&mut r, "failure")?,
            },
            14 => Frame::Close {
                req: r.u32("request")?,
            },
            15 => Frame::Abort {
                reason: reason(&mut r, "abort reason")?,
            },
            16 => Frame::Count {
                req: r.u32("request")?,
                links: flag(&mut r, "links")?,
            },
            17 => Frame::Counted {
                req: r.u32("request")?,
                files: r.u64("files")?,
                bytes: r.u64("bytes")?,
            },
            tag => {
                return Err(Error::Unknown {
                    what: "frame kind",
                    tag,
                })
            }
        };
        r.finish("frame")?;
        Ok(frame)
    }
}

/// An inline file must be a regular file of its listing, whole, and listed once: indexes
/// rise strictly.
fn check_inline(f: &Inline, prev: &mut Option<u32>, entries: &[Entry]) -> Result<(), Error> {
    let invalid = |why| {
        Err(Error::Invalid {
            what: "inline file",
            why,
        })
    };
    if prev.is_some_and(|p| f.index <= p) {
        return invalid("does not follow the one before it");
    }
    *prev = Some(f.index);
    match entries.get(f.index as usize) {
        None => invalid("names no entry of its listing"),
        Some(e) if e.kind != entry::Kind::Regular => invalid("is not a regular file"),
        Some(e) if e.size != f.data.len() as u64 => invalid("is not its file's size"),
        Some(_) => Ok(()),
    }
}

/// The kind and payload length of a frame header, refused when the length is over
/// [`MAX_PAYLOAD`]: checked before anything is allocated for the payload.
pub fn check_header(header: [u8; HEADER]) -> Result<(u8, usize), Error> {
    let len = u32::from_le_bytes([header[1], header[2], header[3], header[4]]) as usize;
    if len > MAX_PAYLOAD {
        return Err(Error::FrameTooLarge {
            len,
            max: MAX_PAYLOAD,
        });
    }
    Ok((header[0], len))
}

/// Read one frame; `buf` is reused for payloads (it grows to at most [`MAX_PAYLOAD`]). A
/// malformed frame is an `InvalidData` error; a connection closed between frames is
/// `UnexpectedEof` from the header's read. (A connection's reader uses
/// [`read_frame_pooled`], which reuses the buffers of file bytes too.)
pub fn read_frame(r: &mut impl Read, buf: &mut Vec<u8>) -> io::Result<Frame> {
    read_frame_pooled(r, buf, &Buffers::default())
}

/// [`read_frame`], a data frame's bytes and a listing's payload (with its inline files)
/// read into a buffer from `pool`, which gets it back when they are dropped.
pub fn read_frame_pooled(
    r: &mut impl Read,
    buf: &mut Vec<u8>,
    pool: &Buffers,
) -> io::Result<Frame> {
    let mut header = [0u8; HEADER];
    r.read_exact(&mut header)?;
    let (kind, len) =
        check_header(header).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    let invalid = |e: Error| io::Error::new(io::ErrorKind::InvalidData, e);
    // File data, most of what crosses: read straight into the frame's own buffer (one copy,
    // no zeroing), checked as `decode` checks it.
    if kind == DATA_KIND && len >= DATA_PREFIX {
        let mut prefix = [0u8; DATA_PREFIX];
        r.read_exact(&mut prefix)?;
        let mut p = Reader::new(&prefix);
        let (req, offset) = (
            p.u32("request").map_err(invalid)?,
            p.u64("offset").map_err(invalid)?,
        );
        let zstd = flag(&mut p, "compression").map_err(invalid)?;
        let n = p.u32("data").map_err(invalid)? as usize;
        Error::at_most("data", n, MAX_DATA).map_err(invalid)?;
        if DATA_PREFIX + n != len {
            let e = match DATA_PREFIX + n > len {
                true => Error::Truncated("data"),
                false => Error::Trailing {
                    what: "data",
                    n: len - DATA_PREFIX - n,
                },
            };
            return Err(invalid(e));
        }
        if offset.checked_add(n as u64).is_none() {
            return Err(invalid(Error::Invalid {
                what: "data offset",
                why: "overflows with its length",
            }));
        }
        let mut data = pool.take(n);
        read_exactly(r, &mut data, n)?;
        return Ok(Frame::Data {
            req,
            offset,
            zstd,
            data: pool.share(data),
        });
    }
    // A listing's payload is kept whole, its inline files slices of it (one allocation per
    // listing, not a copy per file).
    if kind == LISTING_KIND {
        let mut payload = pool.take(len);
        read_exactly(r, &mut payload, len)?;
        return Frame::decode_shared(kind, &pool.share(payload)).map_err(invalid);
    }
    read_exactly(r, buf, len)?;
    Frame::decode(kind, buf).map_err(invalid)
}

/// The frame kind of [`Frame::Listing`].
const LISTING_KIND: u8 = 7;

/// The frame kind of [`Frame::Data`], and the bytes of its payload before the data: the
/// request (u32), the offset (u64), the compression flag (u8), the data's length (u32).
const DATA_KIND: u8 = 10;
const DATA_PREFIX: usize = 4 + 8 + 1 + 4;

/// Read exactly `n` bytes into `buf` (cleared first), without zeroing it beforehand.
fn read_exactly(r: &mut impl Read, buf: &mut Vec<u8>, n: usize) -> io::Result<()> {
    buf.clear();
    buf.reserve(n);
    r.by_ref().take(n as u64).read_to_end(buf)?;
    match buf.len() == n {
        true => Ok(()),
        false => Err(io::ErrorKind::UnexpectedEof.into()),
    }
}

/// Write one frame; `buf` is reused for its encoding.
pub fn write_frame(w: &mut impl Write, frame: &Frame, buf: &mut Vec<u8>) -> io::Result<()> {
    buf.clear();
    frame
        .encode(buf)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    w.write_all(buf)
}

/// Write a [`Frame::Data`] of `data` as [`write_frame`] would, without copying the data
/// into a frame first (a sender's chunk goes from its read buffer to the writer).
pub fn write_data(
    w: &mut impl Write,
    (req, offset, zstd): (u32, u64, bool),
    data: &[u8],
) -> io::Result<()> {
    Error::at_most("data", data.len(), MAX_DATA)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let mut head = [0u8; HEADER + DATA_PREFIX];
    head[0] = DATA_KIND;
    head[1..5].copy_from_slice(&((DATA_PREFIX + data.len()) as u32).to_le_bytes());
    head[5..9].copy_from_slice(&req.to_le_bytes());
    head[9..17].copy_from_slice(&offset.to_le_bytes());
    head[17] = u8::from(zstd);
    head[18..22].copy_from_slice(&(data.len() as u32).to_le_bytes());
    w.write_all(&head)?;
    w.write_all(data)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::entry::tests::sample;
    use crate::entry::{Kind, Time, Xattr, XATTR_BYTES_MAX, XATTR_VALUE_MAX};

    fn small(name: &[u8], data: &[u8]) -> Entry {
        Entry {
            size: data.len() as u64,
            ..sample(name, Kind::Regular)
        }
    }

    fn every_kind() -> Vec<Frame> {
        let t = Time {
            secs: -1,
            nanos: 999_999_999,
        };
        vec![
            Frame::Hello {
                version: VERSION,
                job: b"0b5e2c1e-6a4c-4a5e-9d51-1f0e7c9c2d10".to_vec(),
                shard: 2,
                epoch: 7,
                ticket: [0xab; 32],
            },
            Frame::Welcome { version: VERSION },
            Frame::Refused {
                reason: "ticket is not this shard's".into(),
            },
            Frame::Stat {
                req: 1,
                path: vec![],
            },
            Frame::Entry {
                req: 1,
                entry: sample(b"top", Kind::Directory),
            },
            Frame::List {
                req: 2,
                path: b"a/b c/\xff".to_vec(),
                ino: 77,
                inline: true,
                hash: false,
            },
            Frame::Listing {
                req: 2,
                entries: vec![
                    small(b"f", b"hello"),
                    sample(b"d", Kind::Directory),
                    sample(b"l", Kind::Symlink(b"/etc/shadow".to_vec())),
                    small(b"g", b""),
                ],
                inline: vec![
                    Inline {
                        index: 0,
                        data: Bytes::from_static(b"hello"),
                        hash: Some(5),
                    },
                    Inline {
                        index: 3,
                        data: Bytes::new(),
                        hash: None,
                    },
                ],
                last: true,
            },
            Frame::Listing {
                req: 0,
                entries: vec![],
                inline: vec![],
                last: false,
            },
            Frame::More { req: 2 },
            Frame::Read {
                req: 3,
                path: b"a/f".to_vec(),
                expect: Fingerprint {
                    ino: 9,
                    size: 1 << 40,
                    mtime: t,
                    ctime: Time::default(),
                },
                credit: 8 << 20,
                hash: true,
                hash_only: false,
                zstd: true,
            },
            Frame::Data {
                req: 3,
                offset: 1 << 40,
                zstd: false,
                data: vec![1, 2, 3].into(),
            },
            Frame::Data {
                req: 3,
                offset: 0,
                zstd: true,
                data: vec![0x28, 0xb5, 0x2f, 0xfd].into(),
            },
            Frame::FileEnd {
                req: 3,
                len: 1 << 40,
                hash: Some(u128::MAX - 3),
                changed: false,
            },
            Frame::FileEnd {
                req: 3,
                len: 0,
                hash: None,
                changed: true,
            },
            Frame::Credit {
                req: 3,
                bytes: 8 << 20,
            },
            Frame::Failed {
                req: 4,
                errno: 2, // ENOENT
                message: "no such file".into(),
            },
            Frame::Close { req: 4 },
            Frame::Abort {
                reason: "destination full".into(),
            },
            Frame::Count {
                req: 5,
                links: true,
            },
            Frame::Count {
                req: 6,
                links: false,
            },
            Frame::Counted {
                req: 5,
                files: u64::MAX,
                bytes: 1 << 50,
            },
            Frame::Counted {
                req: 6,
                files: 0,
                bytes: 0,
            },
        ]
    }

    #[test]
    fn every_frame_round_trips_through_a_stream() {
        let frames = every_kind();
        // Every kind is here, so the round trip and truncation tests cover each decoder;
        // the next kind byte is unknown.
        let kinds: std::collections::BTreeSet<u8> = frames.iter().map(Frame::kind).collect();
        assert_eq!(kinds, (1..=17).collect());
        assert!(matches!(
            Frame::decode(18, &[]),
            Err(Error::Unknown {
                what: "frame kind",
                tag: 18
            })
        ));
        let mut wire = Vec::new();
        let mut buf = Vec::new();
        for f in &frames {
            write_frame(&mut wire, f, &mut buf).expect("encode");
        }
        let mut r = &wire[..];
        for f in &frames {
            assert_eq!(&read_frame(&mut r, &mut buf).expect("decode"), f);
        }
        let end = read_frame(&mut r, &mut buf).expect_err("end");
        assert_eq!(end.kind(), io::ErrorKind::UnexpectedEof);
    }

    #[test]
    fn a_header_claiming_more_than_the_bound_is_refused_before_reading() {
        let mut header = [7u8, 0, 0, 0, 0];
        header[1..].copy_from_slice(&((MAX_PAYLOAD + 1) as u32).to_le_bytes());
        assert!(matches!(
            check_header(header),
            Err(Error::FrameTooLarge { .. })
        ));
        // read_frame refuses it without waiting for (or allocating) the payload.
        let mut buf = Vec::new();
        let err = read_frame(&mut &header[..], &mut buf).expect_err("too large");
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        assert!(buf.capacity() < MAX_PAYLOAD);
    }

    #[test]
    fn every_truncation_of_every_frame_is_refused() {
        for f in every_kind() {
            let mut wire = Vec::new();
            f.encode(&mut wire).expect("encode");
            let payload = &wire[HEADER..];
            for cut in 0..payload.len() {
                assert!(
                    Frame::decode(wire[0], &payload[..cut]).is_err(),
                    "{f:?} cut at {cut} decoded"
                );
            }
            let mut longer = payload.to_vec();
            longer.push(0);
            assert!(
                matches!(Frame::decode(wire[0], &longer), Err(Error::Trailing { .. })),
                "{f:?} with a trailing byte"
            );
        }
    }

    #[test]
    fn request_paths_must_be_relative_components() {
        for path in [
            &b"/abs"[..],
            b"a//b",
            b"a/",
            b"../x",
            b"a/./b",
            b"a/\0",
            b"..",
        ] {
            let f = Frame::Stat {
                req: 0,
                path: path.to_vec(),
            };
            assert!(f.encode(&mut Vec::new()).is_err(), "{path:?} encoded");
            // Encoded by hand, as a hostile receiver would.
            let mut w = Writer::default();
            w.u32(0);
            w.bytes(path);
            assert!(
                matches!(Frame::decode(4, &w.buf), Err(Error::Invalid { .. })),
                "{path:?} decoded"
            );
        }
    }

    #[test]
    fn a_count_larger_than_the_frame_allocates_nothing() {
        let mut w = Writer::default();
        w.u32(0);
        w.u32(MAX_ENTRIES as u32);
        assert_eq!(Frame::decode(7, &w.buf), Err(Error::Truncated("entries")));
        let mut w = Writer::default();
        w.u32(0);
        w.u32(u32::MAX);
        assert!(matches!(
            Frame::decode(7, &w.buf),
            Err(Error::TooMany { .. })
        ));
    }

    #[test]
    fn inline_files_must_be_whole_regular_entries_of_their_listing_in_order() {
        let entries = vec![small(b"f", b"abc"), sample(b"d", Kind::Directory)];
        let listing = |inline: Vec<Inline>| Frame::Listing {
            req: 0,
            entries: entries.clone(),
            inline,
            last: true,
        };
        let one = |index: u32, data: &[u8]| Inline {
            index,
            data: Bytes::copy_from_slice(data),
            hash: None,
        };
        for (inline, why) in [
            (vec![one(2, b"abc")], "an index past the listing"),
            (vec![one(1, b"")], "a directory"),
            (vec![one(0, b"ab")], "shorter than its file"),
            (vec![one(0, b"abc"), one(0, b"abc")], "the same file twice"),
        ] {
            let f = listing(inline);
            assert!(f.encode(&mut Vec::new()).is_err(), "encoded: {why}");
            // The same bytes made without the check, as a hostile sender would.
            let Frame::Listing { inline, .. } = &f else {
                unreachable!()
            };
            let mut w = Writer::default();
            w.u32(0);
            w.u32(entries.len() as u32);
            entries.iter().for_each(|e| e.encode(&mut w));
            w.u32(inline.len() as u32);
            for i in inline {
                w.u32(i.index);
                w.bytes(&i.data);
                w.u8(0);
            }
            w.u8(1);
            assert!(Frame::decode(7, &w.buf).is_err(), "decoded: {why}");
        }
        assert!(listing(vec![one(0, b"abc")])
            .encode(&mut Vec::new())
            .is_ok());
    }

    #[test]
    fn the_largest_entry_fits_one_listing_with_the_most_inline_data() {
        let mut e = sample(&[b'n'; 255], Kind::Symlink(vec![b't'; 4095]));
        let per = XATTR_VALUE_MAX;
        let n = (XATTR_BYTES_MAX - 8 * 255) / per;
        e.xattrs = (0..n)
            .map(|i| Xattr {
                name: format!("user.{i:0>250}").into_bytes(),
                value: vec![7; per],
            })
            .collect();
        e.check().expect("within the per-entry bound");
        let files = INLINE_BYTES / INLINE_MAX;
        let mut entries = vec![e];
        entries.extend((0..files).map(|i| small(format!("f{i}").as_bytes(), &[1; INLINE_MAX])));
        let inline = (1..=files as u32)
            .map(|index| Inline {
                index,
                data: vec![1; INLINE_MAX].into(),
                hash: Some(1),
            })
            .collect();
        let f = Frame::Listing {
            req: 1,
            entries,
            inline,
            last: false,
        };
        let mut wire = Vec::new();
        f.encode(&mut wire).expect("fits");
        assert_eq!(Frame::decode(wire[0], &wire[HEADER..]), Ok(f));
    }

    #[test]
    fn oversized_fields_are_refused_when_sent_and_when_received() {
        let data = Frame::Data {
            req: 0,
            offset: 0,
            zstd: false,
            data: vec![0; MAX_DATA + 1].into(),
        };
        assert!(data.encode(&mut Vec::new()).is_err());
        let mut w = Writer::default();
        w.u32(0);
        w.u64(u64::MAX);
        w.u8(0);
        w.bytes(&[1]);
        assert!(
            matches!(Frame::decode(10, &w.buf), Err(Error::Invalid { .. })),
            "an offset that overflows"
        );
        assert!(matches!(
            Frame::decode(42, &[]),
            Err(Error::Unknown { tag: 42, .. })
        ));
        let long = "é".repeat(REASON_MAX);
        let mut wire = Vec::new();
        Frame::Abort { reason: long }
            .encode(&mut wire)
            .expect("cut");
        match Frame::decode(wire[0], &wire[HEADER..]) {
            Ok(Frame::Abort { reason }) => assert!(reason.len() <= REASON_MAX),
            other => panic!("{other:?}"),
        }
        // A flag is 0 or 1.
        let mut w = Writer::default();
        w.u32(0);
        w.bytes(b"");
        w.u64(0);
        w.u8(2);
        w.u8(0);
        assert!(matches!(
            Frame::decode(6, &w.buf),
            Err(Error::Unknown { what: "inline", .. })
        ));
        let mut w = Writer::default();
        w.u32(0);
        w.u8(2);
        assert!(matches!(
            Frame::decode(16, &w.buf),
            Err(Error::Unknown { what: "links", .. })
        ));
    }

    #[test]
    fn data_frames_are_written_from_a_slice_and_read_into_their_own_buffer_as_any_frame() {
        for (req, offset, zstd, len) in [
            (3u32, 0u64, false, 0usize),
            (9, 1 << 40, true, 5),
            (1, 7, false, MAX_DATA),
        ] {
            let data: Vec<u8> = (0..len).map(|i| (i * 31 + 7) as u8).collect();
            let frame = Frame::Data {
                req,
                offset,
                zstd,
                data: data.clone().into(),
            };
            let mut framed = Vec::new();
            write_frame(&mut framed, &frame, &mut Vec::new()).expect("write_frame");
            let mut sliced = Vec::new();
            write_data(&mut sliced, (req, offset, zstd), &data).expect("write_data");
            assert_eq!(sliced, framed, "{len} bytes");
            let read = read_frame(&mut sliced.as_slice(), &mut Vec::new()).expect("read");
            assert_eq!(read, frame);
            // Cut anywhere: an error, never a frame.
            for cut in [1, HEADER + 3, HEADER + DATA_PREFIX, sliced.len() - 1] {
                if cut < sliced.len() {
                    assert!(
                        read_frame(&mut &sliced[..cut], &mut Vec::new()).is_err(),
                        "cut at {cut}"
                    );
                }
            }
            // A payload longer than its data says: refused as a trailing byte.
            let mut long = sliced.clone();
            long.push(0);
            let plen = u32::from_le_bytes([long[1], long[2], long[3], long[4]]) + 1;
            long[1..5].copy_from_slice(&plen.to_le_bytes());
            let e = read_frame(&mut long.as_slice(), &mut Vec::new()).expect_err("trailing");
            assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
        }
        // A compression flag other than 0 or 1, and an offset that overflows with the length.
        let mut bad = Vec::new();
        write_data(&mut bad, (1, 0, false), b"xyz").expect("write");
        bad[HEADER + 12] = 2;
        assert!(read_frame(&mut bad.as_slice(), &mut Vec::new()).is_err());
        let mut over = Vec::new();
        write_data(&mut over, (1, u64::MAX - 1, false), b"xyz").expect("write");
        assert!(read_frame(&mut over.as_slice(), &mut Vec::new()).is_err());
        assert!(write_data(&mut Vec::new(), (1, 0, false), &vec![0; MAX_DATA + 1]).is_err());
    }
}
