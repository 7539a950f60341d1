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
//! - [`Frame::ReadRange`] → [`Frame::Data`] ... [`Frame::FileEnd`]: a range of a raw block
//!   device (a shard whose top is a device, not a tree): the same answers as a file's, at
//!   absolute offsets within the range, bytes not sent being zeros; `hash_only` sends only
//!   the end, with the range's hash (a re-run compares hashes, not data).
//! - [`Frame::HashChunks`] → [`Frame::ChunkHashes`] then [`Frame::FileEnd`]: the hash of
//!   each fixed-size chunk of a file and of the whole (one read on the sender), so that a
//!   receiver whose copy differs in a few places asks only for those places, with
//!   [`Frame::ReadPart`] → [`Frame::Data`] ... [`Frame::FileEnd`] (a read of a range).
//! - [`Frame::Count`] → [`Frame::Counted`]: the regular files (and their bytes) a copy of
//!   the whole top would carry, counted on the sender (a receiver has no local source to
//!   count for a dry run, an ETA or a full destination's message).
//! - [`Frame::Failed`]: a request failed (with the errno the sender's kernel gave).
//! - [`Frame::Close`]: the receiver no longer wants a request's answers.
//!
//! [`Frame::Abort`] ends a connection, either way, with a reason. On the peering port (a
//! reader of another install), [`Frame::ExportHello`] takes the hello's place.

use bytes::Bytes;

use crate::codec::{Reader, Writer};
use crate::entry::{self, Entry};
pub use crate::export_hello::ExportHello;
pub use crate::fields::{check_path, JOB_MAX, MAX_RANGE, PATH_BYTES_MAX, REASON_MAX};
use crate::fields::{
    check_range, flag, optional_hash, path, reason, time, truncated_reason, write_optional_hash,
    write_path,
};
use crate::Error;

/// The protocol version a [`Frame::Hello`] and a [`Frame::Welcome`] carry.
pub const VERSION: u16 = 5;
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
/// The smallest and largest chunk a [`Frame::HashChunks`] may ask for, as the power of
/// two its `shift` is.
pub const CHUNK_SHIFT_MIN: u8 = 16;
pub const CHUNK_SHIFT_MAX: u8 = 40;
/// The most chunk hashes one file has: a receiver picks the chunk size its file needs to
/// fit (a sender refuses a file larger than that), so they travel in one frame.
pub const MAX_CHUNKS: usize = 1 << 16;

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
    /// A reader of another install to the peering port, first: which export, with what
    /// credential, for which job (see [`ExportHello`]).
    ExportHello(ExportHello),
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
    /// bytes of its small files with it, `hash`: with their hashes; `attrs`: each regular
    /// file's extended attributes with its record. Without `attrs` (nor `inline`) a regular
    /// file is only `lstat`ed, never opened, and its record carries no attributes: what a
    /// re-run that keeps most files by their stats needs, the receiver asking a file's
    /// record again ([`Frame::Stat`]) when it copies it.
    List {
        req: u32,
        path: Vec<u8>,
        ino: u64,
        inline: bool,
        hash: bool,
        attrs: bool,
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
    /// Receiver: bytes `[offset, offset + len)` of the device the shard's top is. Answered
    /// with [`Frame::Data`] inside the range (none for zeros) and a [`Frame::FileEnd`] of
    /// `len` with the range's hash; `hash_only`: only the end; `zstd` as for a read.
    ReadRange {
        req: u32,
        offset: u64,
        len: u32,
        hash_only: bool,
        zstd: bool,
    },
    /// Receiver: the xxh3-128 of each chunk of regular file `path` (chunk `i` is bytes
    /// `[i << shift, (i + 1) << shift)`, the last one what is left; holes hashed as zeros),
    /// expected to be `expect`. Answered with [`Frame::ChunkHashes`] and then a
    /// [`Frame::FileEnd`] with the whole file's hash (or only the end, `changed`).
    HashChunks {
        req: u32,
        path: Vec<u8>,
        expect: Fingerprint,
        shift: u8,
    },
    /// Sender: the chunk hashes of file `req`, in order, at most [`MAX_CHUNKS`].
    ChunkHashes {
        req: u32,
        shift: u8,
        hashes: Vec<u128>,
    },
    /// Receiver: bytes `[offset, offset + len)` of regular file `path`, expected to be
    /// `expect`: answered as a [`Frame::Read`] is (data inside the range, holes not sent,
    /// within `credit`), the end's `len` where the range ends (sooner if the file does),
    /// without a hash (the receiver hashes the whole file it made).
    ReadPart {
        req: u32,
        path: Vec<u8>,
        expect: Fingerprint,
        offset: u64,
        len: u64,
        credit: u64,
        zstd: bool,
    },
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
            Frame::ReadRange { .. } => 18,
            Frame::HashChunks { .. } => 19,
            Frame::ChunkHashes { .. } => 20,
            Frame::ReadPart { .. } => 21,
            Frame::ExportHello(_) => 22,
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
            Frame::ExportHello(h) => h.encode(w)?,
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
                attrs,
            } => {
                w.u32(*req);
                write_path(w, path)?;
                w.u64(*ino);
                w.u8(u8::from(*inline));
                w.u8(u8::from(*hash));
                w.u8(u8::from(*attrs));
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
                write_fingerprint(w, expect);
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
            Frame::ReadRange {
                req,
                offset,
                len,
                hash_only,
                zstd,
            } => {
                check_range(*offset, *len)?;
                w.u32(*req);
                w.u64(*offset);
                w.u32(*len);
                w.u8(u8::from(*hash_only));
                w.u8(u8::from(*zstd));
            }
            Frame::Counted { req, files, bytes } => {
                w.u32(*req);
                w.u64(*files);
                w.u64(*bytes);
            }
            Frame::HashChunks {
                req,
                path,
                expect,
                shift,
            } => {
                check_shift(*shift)?;
                w.u32(*req);
                write_path(w, path)?;
                write_fingerprint(w, expect);
                w.u8(*shift);
            }
            Frame::ChunkHashes { req, shift, hashes } => {
                check_shift(*shift)?;
                Error::few_enough("chunk hashes", hashes.len(), MAX_CHUNKS)?;
                w.u32(*req);
                w.u8(*shift);
                w.u32(hashes.len() as u32);
                for h in hashes {
                    w.u128(*h);
                }
            }
            Frame::ReadPart {
                req,
                path,
                expect,
                offset,
                len,
                credit,
                zstd,
            } => {
                check_part(*offset, *len)?;
                w.u32(*req);
                write_path(w, path)?;
                write_fingerprint(w, expect);
                w.u64(*offset);
                w.u64(*len);
                w.u64(*credit);
                w.u8(u8::from(*zstd));
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
            22 => Frame::ExportHello(ExportHello::decode(&mut r)?),
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
                attrs: flag(&mut r, "attrs")?,
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
                Frame::Read {
                    req,
                    path,
                    expect: fingerprint(&mut r)?,
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
            18 => {
                let (req, offset, len) = (r.u32("request")?, r.u64("offset")?, r.u32("length")?);
                check_range(offset, len)?;
                Frame::ReadRange {
                    req,
                    offset,
                    len,
                    hash_only: flag(&mut r, "hash only")?,
                    zstd: flag(&mut r, "compression")?,
                }
            }
            19 => {
                let (req, path, expect) = (r.u32("request")?, path(&mut r)?, fingerprint(&mut r)?);
                let shift = r.u8("chunk shift")?;
                check_shift(shift)?;
                Frame::HashChunks {
                    req,
                    path,
                    expect,
                    shift,
                }
            }
            20 => {
                let (req, shift) = (r.u32("request")?, r.u8("chunk shift")?);
                check_shift(shift)?;
                let n = r.count(MAX_CHUNKS, 16, "chunk hashes")?;
                let mut hashes = Vec::with_capacity(n);
                for _ in 0..n {
                    hashes.push(r.u128("chunk hash")?);
                }
                Frame::ChunkHashes { req, shift, hashes }
            }
            21 => {
                let (req, path, expect) = (r.u32("request")?, path(&mut r)?, fingerprint(&mut r)?);
                let (offset, len) = (r.u64("offset")?, r.u64("length")?);
                check_part(offset, len)?;
                Frame::ReadPart {
                    req,
                    path,
                    expect,
                    offset,
                    len,
                    credit: r.u64("credit")?,
                    zstd: flag(&mut r, "compression")?,
                }
            }
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

fn write_fingerprint(w: &mut Writer, f: &Fingerprint) {
    w.u64(f.ino);
    w.u64(f.size);
    for t in [f.mtime, f.ctime] {
        w.i64(t.secs);
        w.u32(t.nanos);
    }
}

fn fingerprint(r: &mut Reader<'_>) -> Result<Fingerprint, Error> {
    let (ino, size) = (r.u64("inode")?, r.u64("size")?);
    let (mtime, ctime) = (time(r)?, time(r)?);
    Ok(Fingerprint {
        ino,
        size,
        mtime,
        ctime,
    })
}

/// A chunk size a [`Frame::HashChunks`] may ask for.
fn check_shift(shift: u8) -> Result<(), Error> {
    match (CHUNK_SHIFT_MIN..=CHUNK_SHIFT_MAX).contains(&shift) {
        true => Ok(()),
        false => Err(Error::Invalid {
            what: "chunk shift",
            why: "is outside 16..=40 (chunks of 64 KiB to 1 TiB)",
        }),
    }
}

/// A part of a file: not empty, ending before 2^64.
fn check_part(offset: u64, len: u64) -> Result<(), Error> {
    let invalid = |why| Error::Invalid { what: "part", why };
    if len == 0 {
        return Err(invalid("is empty"));
    }
    offset
        .checked_add(len)
        .map(drop)
        .ok_or(invalid("ends past the largest offset"))
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

/// The frame kind of [`Frame::Listing`].
pub(crate) const LISTING_KIND: u8 = 7;
/// The frame kind of [`Frame::Data`].
pub(crate) const DATA_KIND: u8 = 10;

#[cfg(test)]
mod tests;
