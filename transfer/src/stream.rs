//! Frames on a byte stream: a header checked before its payload is read, a data frame
//! read straight into a pooled buffer and written from the sender's own, and the rest
//! decoded by [`Frame::decode`].

use std::io::{self, Read, Write};

use crate::codec::Reader;
use crate::fields::flag;
use crate::frame::{Frame, DATA_KIND, HEADER, LISTING_KIND, MAX_DATA, MAX_PAYLOAD};
use crate::{Buffers, Error};

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

/// The bytes of a [`Frame::Data`]'s payload before the data: the request (u32), the offset
/// (u64), the compression flag (u8), the data's length (u32).
pub(crate) const DATA_PREFIX: usize = 4 + 8 + 1 + 4;

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
