//! The fields frames are made of, each checked where it is decoded (and refused where it
//! is encoded, so the error is the sender's): relative paths, reasons, flags, timestamps,
//! optional hashes, and the ranges of a raw block device.

use crate::codec::{Reader, Writer};
use crate::entry::{self, check_name};
use crate::Error;

/// Longest relative path in a request: deeper than `PATH_MAX` (a tree may nest further
/// than one syscall can name; the sender resolves it a few components at a time).
pub const PATH_BYTES_MAX: usize = 1 << 20;
/// Longest reason in a refusal, a failure or an abort.
pub const REASON_MAX: usize = 1024;
/// Longest job or export identity (a Kubernetes UID is 36 bytes).
pub const JOB_MAX: usize = 128;
/// The longest range one [`crate::Frame::ReadRange`] asks for (a block copy's largest chunk).
pub const MAX_RANGE: u32 = 64 << 20;

/// Check a relative path: empty, or components joined by single `/`s.
pub fn check_path(path: &[u8]) -> Result<(), Error> {
    if path.is_empty() {
        return Ok(());
    }
    path.split(|&b| b == b'/')
        .try_for_each(|c| check_name(c, "path component"))
}

pub(crate) fn reason(r: &mut Reader<'_>, what: &'static str) -> Result<String, Error> {
    let bytes = r.bytes(REASON_MAX, what)?;
    String::from_utf8(bytes.to_vec()).map_err(|_| Error::Invalid {
        what,
        why: "is not UTF-8",
    })
}

pub(crate) fn truncated_reason(s: &str) -> &[u8] {
    let mut end = s.len().min(REASON_MAX);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s.as_bytes()[..end]
}

pub(crate) fn path(r: &mut Reader<'_>) -> Result<Vec<u8>, Error> {
    let p = r.bytes(PATH_BYTES_MAX, "path")?;
    check_path(p)?;
    Ok(p.to_vec())
}

pub(crate) fn write_path(w: &mut Writer, p: &[u8]) -> Result<(), Error> {
    Error::at_most("path", p.len(), PATH_BYTES_MAX)?;
    check_path(p)?;
    w.bytes(p);
    Ok(())
}

pub(crate) fn flag(r: &mut Reader<'_>, what: &'static str) -> Result<bool, Error> {
    match r.u8(what)? {
        0 => Ok(false),
        1 => Ok(true),
        tag => Err(Error::Unknown { what, tag }),
    }
}

pub(crate) fn time(r: &mut Reader<'_>) -> Result<entry::Time, Error> {
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

pub(crate) fn optional_hash(r: &mut Reader<'_>) -> Result<Option<u128>, Error> {
    match flag(r, "hash present")? {
        true => Ok(Some(r.u128("hash")?)),
        false => Ok(None),
    }
}

pub(crate) fn write_optional_hash(w: &mut Writer, h: Option<u128>) {
    w.u8(u8::from(h.is_some()));
    if let Some(h) = h {
        w.u128(h);
    }
}

/// A range of a device: not empty, at most [`MAX_RANGE`] bytes, ending before 2^64.
pub(crate) fn check_range(offset: u64, len: u32) -> Result<(), Error> {
    let invalid = |why| Error::Invalid { what: "range", why };
    if len == 0 {
        return Err(invalid("is empty"));
    }
    Error::at_most("range", len as usize, MAX_RANGE as usize)?;
    offset
        .checked_add(u64::from(len))
        .map(drop)
        .ok_or(invalid("ends past the largest offset"))
}
