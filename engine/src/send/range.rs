//! A raw block device's bytes, a range at a time ([`Frame::ReadRange`]): read in pieces of
//! at most [`MAX_DATA`] bytes, hashed as read, pieces of zeros not sent (the receiver takes
//! what it was not sent as zeros, as a file's holes), compressed where that pays, and the
//! range's hash at its end. A range is at most [`ferry_transfer::frame::MAX_RANGE`] bytes and
//! the receiver has as many in flight as it has workers, so no credit is needed.

use std::io::{self, Write};
use std::sync::atomic::Ordering;

use ferry_transfer::frame::{Frame, MAX_DATA};
use twox_hash::XxHash3_128 as Xxh3;

use super::half::Half;
use super::read::ReadBuf;
use super::top::SourceTop;

impl<W: Write + Send> Half<'_, W> {
    /// Answer request `req` for `[offset, offset + len)` of the device top.
    pub(super) fn range(&self, req: u32, offset: u64, len: u32, (hash_only, zstd): (bool, bool)) {
        let SourceTop::Device(dev) = self.top else {
            self.end(req);
            self.fail(req, "read", &super::entries::not_a_tree());
            return;
        };
        let end = offset + u64::from(len);
        if end > dev.size() {
            self.end(req);
            let e = io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("bytes {offset}..{end} of a device of {} bytes", dev.size()),
            );
            self.fail(req, "read", &e);
            return;
        }
        let mut buf = ReadBuf::take();
        let buf = &mut buf.0;
        let mut hasher = Xxh3::new();
        let mut off = offset;
        while off < end {
            let want = (end - off).min(MAX_DATA as u64) as usize;
            if let Err(e) = crate::block::read_exact_at(dev, &mut buf[..want], off) {
                self.end(req);
                self.fail(req, "read", &e);
                return;
            }
            let data = &buf[..want];
            hasher.write(data);
            if !hash_only && !crate::block::is_zero(data) {
                if let Some(b) = &self.bucket {
                    b.take(want as u64);
                }
                let packed = zstd
                    .then(|| zstd::bulk::compress(data, 1).ok())
                    .flatten()
                    .filter(|p| p.len() < data.len());
                match &packed {
                    Some(p) => self.send_data((req, off, true), p),
                    None => self.send_data((req, off, false), data),
                }
                self.sent.fetch_add(want as u64, Ordering::Relaxed);
            }
            off += want as u64;
        }
        self.end(req);
        self.send(&Frame::FileEnd {
            req,
            len: u64::from(len),
            hash: Some(hasher.finish_128()),
            changed: false,
        });
    }
}
