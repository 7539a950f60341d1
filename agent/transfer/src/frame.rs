//! Frames: a kind byte, the payload's length (u32, little-endian) and the payload. The
//! length is checked against [`MAX_PAYLOAD`] before the payload is read, and the payload is
//! decoded completely (no trailing bytes) or refused.
//!
//! One connection carries one shard. The receiver opens it with [`Frame::Hello`] (which
//! shard, at which epoch, and the shard's ticket); the sender answers [`Frame::Welcome`] or
//! [`Frame::Refused`]. The sender then sends each batch of a directory's entries as a
//! [`Frame::Listing`]; the receiver answers every listing with a [`Frame::Want`] naming the
//! regular files whose data it needs (its resume and overwrite decisions), and the sender
//! sends their bytes as [`Frame::Data`] and closes each with [`Frame::FileEnd`]. Listings run
//! ahead of their answers by a bounded window and data moves only within the receiver's
//! [`Frame::Credit`], so neither side waits a round trip per file and neither buffers
//! without bound. [`Frame::Finished`] ends a walk; [`Frame::Abort`] ends a connection with a
//! reason.

use std::io::{self, Read, Write};

use crate::codec::{Reader, Writer};
use crate::entry::{self, check_name, Entry};
use crate::Error;

/// The protocol version a [`Frame::Hello`] and a [`Frame::Welcome`] carry.
pub const VERSION: u16 = 1;
/// Kind byte and payload length.
pub const HEADER: usize = 5;
/// The largest payload: a listing holding one entry with the most extended attributes an
/// entry may carry ([`entry::XATTR_BYTES_MAX`]) fits.
pub const MAX_PAYLOAD: usize = 2 << 20;
/// The most data bytes one [`Frame::Data`] carries (after decompression, too).
pub const MAX_DATA: usize = 1 << 20;
/// The most entries in one listing (the engine cuts directories into batches of 512).
pub const MAX_ENTRIES: usize = 4096;
/// Longest directory path in a listing (`PATH_MAX`).
pub const PATH_MAX: usize = 4096;
/// Longest reason in a refusal or an abort.
pub const REASON_MAX: usize = 1024;
/// Longest job identity (a Kubernetes UID is 36 bytes).
pub const JOB_MAX: usize = 128;

/// A regular file of a listing: the listing's batch and the entry's index in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FileId {
    pub batch: u64,
    pub index: u32,
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
    /// Sender to receiver: entries of the directory at `dir` (a relative path, `/`
    /// between components; empty for the shard's top).
    Listing {
        batch: u64,
        dir: Vec<u8>,
        entries: Vec<Entry>,
    },
    /// Receiver to sender: bit `i` (of byte `i / 8`, least significant first) set when the
    /// data of entry `i` of listing `batch` is wanted.
    Want { batch: u64, bits: Vec<u8> },
    /// Sender to receiver: bytes of a file at an offset; zstd-compressed when `zstd`.
    /// Bytes not sent between offsets are holes.
    Data {
        file: FileId,
        offset: u64,
        zstd: bool,
        data: Vec<u8>,
    },
    /// Sender to receiver: every byte of a file is sent. `len`: the file's length (holes
    /// at its end included); `hash`: xxh3-128 of what was read, when hashing; `changed`:
    /// the source changed while it was read (the receiver discards what it wrote).
    FileEnd {
        file: FileId,
        len: u64,
        hash: Option<u128>,
        changed: bool,
    },
    /// Receiver to sender: this many more data bytes may be in flight.
    Credit { bytes: u64 },
    /// Sender to receiver: the walk is over; nothing follows.
    Finished,
    /// Either way: the connection ends, for this reason.
    Abort { reason: String },
}

/// Check a listing's directory: empty, or components joined by single `/`s.
fn check_dir(dir: &[u8]) -> Result<(), Error> {
    if dir.is_empty() {
        return Ok(());
    }
    dir.split(|&b| b == b'/')
        .try_for_each(|c| check_name(c, "directory path component"))
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

impl Frame {
    fn kind(&self) -> u8 {
        match self {
            Frame::Hello { .. } => 1,
            Frame::Welcome { .. } => 2,
            Frame::Refused { .. } => 3,
            Frame::Listing { .. } => 4,
            Frame::Want { .. } => 5,
            Frame::Data { .. } => 6,
            Frame::FileEnd { .. } => 7,
            Frame::Credit { .. } => 8,
            Frame::Finished => 9,
            Frame::Abort { .. } => 10,
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
            Frame::Listing {
                batch,
                dir,
                entries,
            } => {
                Error::at_most("directory path", dir.len(), PATH_MAX)?;
                check_dir(dir)?;
                Error::few_enough("entries", entries.len(), MAX_ENTRIES)?;
                w.u64(*batch);
                w.bytes(dir);
                w.u32(entries.len() as u32);
                for e in entries {
                    e.check()?;
                    e.encode(w);
                }
            }
            Frame::Want { batch, bits } => {
                Error::at_most("wanted bits", bits.len(), MAX_ENTRIES.div_ceil(8))?;
                w.u64(*batch);
                w.bytes(bits);
            }
            Frame::Data {
                file,
                offset,
                zstd,
                data,
            } => {
                Error::at_most("data", data.len(), MAX_DATA)?;
                w.u64(file.batch);
                w.u32(file.index);
                w.u64(*offset);
                w.u8(u8::from(*zstd));
                w.bytes(data);
            }
            Frame::FileEnd {
                file,
                len,
                hash,
                changed,
            } => {
                w.u64(file.batch);
                w.u32(file.index);
                w.u64(*len);
                w.u8(u8::from(hash.is_some()) | (u8::from(*changed) << 1));
                if let Some(h) = hash {
                    w.u128(*h);
                }
            }
            Frame::Credit { bytes } => w.u64(*bytes),
            Frame::Finished => {}
        }
        Ok(())
    }

    /// Decode the payload of a frame of kind `kind` (its header already checked by
    /// [`check_header`]).
    pub fn decode(kind: u8, payload: &[u8]) -> Result<Frame, Error> {
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
            4 => {
                let batch = r.u64("batch")?;
                let dir = r.bytes(PATH_MAX, "directory path")?.to_vec();
                check_dir(&dir)?;
                let n = r.count(MAX_ENTRIES, entry::MIN_ENCODED, "entries")?;
                let mut entries = Vec::with_capacity(n);
                for _ in 0..n {
                    entries.push(Entry::decode(&mut r)?);
                }
                Frame::Listing {
                    batch,
                    dir,
                    entries,
                }
            }
            5 => Frame::Want {
                batch: r.u64("batch")?,
                bits: r.bytes(MAX_ENTRIES.div_ceil(8), "wanted bits")?.to_vec(),
            },
            6 => {
                let file = FileId {
                    batch: r.u64("batch")?,
                    index: r.u32("index")?,
                };
                let offset = r.u64("offset")?;
                let zstd = match r.u8("compression")? {
                    0 => false,
                    1 => true,
                    tag => {
                        return Err(Error::Unknown {
                            what: "compression",
                            tag,
                        })
                    }
                };
                let data = r.bytes(MAX_DATA, "data")?.to_vec();
                if offset.checked_add(data.len() as u64).is_none() {
                    return Err(Error::Invalid {
                        what: "data offset",
                        why: "overflows with its length",
                    });
                }
                Frame::Data {
                    file,
                    offset,
                    zstd,
                    data,
                }
            }
            7 => {
                let file = FileId {
                    batch: r.u64("batch")?,
                    index: r.u32("index")?,
                };
                let len = r.u64("length")?;
                let flags = r.u8("flags")?;
                if flags & !0b11 != 0 {
                    return Err(Error::Unknown {
                        what: "file end flags",
                        tag: flags,
                    });
                }
                let hash = match flags & 1 {
                    1 => Some(r.u128("hash")?),
                    _ => None,
                };
                Frame::FileEnd {
                    file,
                    len,
                    hash,
                    changed: flags & 0b10 != 0,
                }
            }
            8 => Frame::Credit {
                bytes: r.u64("credit")?,
            },
            9 => Frame::Finished,
            10 => Frame::Abort {
                reason: reason(&mut r, "abort reason")?,
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
/// `UnexpectedEof` from the header's read.
pub fn read_frame(r: &mut impl Read, buf: &mut Vec<u8>) -> io::Result<Frame> {
    let mut header = [0u8; HEADER];
    r.read_exact(&mut header)?;
    let (kind, len) =
        check_header(header).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    buf.clear();
    buf.resize(len, 0);
    r.read_exact(buf)?;
    Frame::decode(kind, buf).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// Write one frame; `buf` is reused for its encoding.
pub fn write_frame(w: &mut impl Write, frame: &Frame, buf: &mut Vec<u8>) -> io::Result<()> {
    buf.clear();
    frame
        .encode(buf)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    w.write_all(buf)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::entry::tests::sample;
    use crate::entry::{Kind, Xattr, XATTR_BYTES_MAX, XATTR_VALUE_MAX};

    fn every_kind() -> Vec<Frame> {
        let file = FileId {
            batch: 3,
            index: 511,
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
            Frame::Listing {
                batch: 3,
                dir: b"a/b c/\xff".to_vec(),
                entries: vec![
                    sample(b"f", Kind::Regular),
                    sample(b"d", Kind::Directory),
                    sample(b"l", Kind::Symlink(b"/etc/shadow".to_vec())),
                ],
            },
            Frame::Listing {
                batch: 0,
                dir: vec![],
                entries: vec![],
            },
            Frame::Want {
                batch: 3,
                bits: vec![0b101],
            },
            Frame::Data {
                file,
                offset: 1 << 40,
                zstd: true,
                data: vec![1, 2, 3],
            },
            Frame::FileEnd {
                file,
                len: 1 << 40,
                hash: Some(u128::MAX - 3),
                changed: false,
            },
            Frame::FileEnd {
                file,
                len: 0,
                hash: None,
                changed: true,
            },
            Frame::Credit { bytes: 8 << 20 },
            Frame::Finished,
            Frame::Abort {
                reason: "destination full".into(),
            },
        ]
    }

    #[test]
    fn every_frame_round_trips_through_a_stream() {
        let frames = every_kind();
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
        let mut header = [4u8, 0, 0, 0, 0];
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
    fn listing_paths_must_be_relative_components() {
        for dir in [&b"/abs"[..], b"a//b", b"a/", b"../x", b"a/./b", b"a/\0"] {
            let f = Frame::Listing {
                batch: 0,
                dir: dir.to_vec(),
                entries: vec![],
            };
            assert!(f.encode(&mut Vec::new()).is_err(), "{dir:?} encoded");
            // Encoded by hand, as a hostile sender would.
            let mut w = Writer::default();
            w.u64(0);
            w.bytes(dir);
            w.u32(0);
            assert!(
                matches!(Frame::decode(4, &w.buf), Err(Error::Invalid { .. })),
                "{dir:?} decoded"
            );
        }
    }

    #[test]
    fn a_count_larger_than_the_frame_allocates_nothing() {
        let mut w = Writer::default();
        w.u64(0);
        w.bytes(b"");
        w.u32(MAX_ENTRIES as u32);
        assert_eq!(Frame::decode(4, &w.buf), Err(Error::Truncated("entries")));
        let mut w = Writer::default();
        w.u64(0);
        w.bytes(b"");
        w.u32(u32::MAX);
        assert!(matches!(
            Frame::decode(4, &w.buf),
            Err(Error::TooMany { .. })
        ));
    }

    #[test]
    fn the_largest_entry_fits_one_listing() {
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
        // The longest path of the longest names: 16 components of 255 bytes.
        let f = Frame::Listing {
            batch: 1,
            dir: vec![[b'd'; 255].as_slice(); 16].join(&b'/'),
            entries: vec![e],
        };
        let mut wire = Vec::new();
        f.encode(&mut wire).expect("fits");
        assert_eq!(Frame::decode(wire[0], &wire[HEADER..]), Ok(f));
    }

    #[test]
    fn oversized_fields_are_refused_when_sent_and_when_received() {
        let data = Frame::Data {
            file: FileId { batch: 0, index: 0 },
            offset: 0,
            zstd: false,
            data: vec![0; MAX_DATA + 1],
        };
        assert!(data.encode(&mut Vec::new()).is_err());
        let mut w = Writer::default();
        w.u64(0);
        w.u32(0);
        w.u64(u64::MAX);
        w.u8(0);
        w.bytes(&[1]);
        assert!(
            matches!(Frame::decode(6, &w.buf), Err(Error::Invalid { .. })),
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
    }
}
