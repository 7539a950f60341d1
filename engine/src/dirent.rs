//! Directory listing through `getdents64` on a directory fd, parsed without `unsafe`, one
//! buffer of records at a time: a directory is never held whole in memory, however many
//! entries it has.

use std::ffi::CStr;
use std::io;
use std::os::fd::BorrowedFd;

use crate::sys;

/// The entry type as `getdents64` reports it (`DT_UNKNOWN` on filesystems that do not say).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DType {
    Dir,
    Regular,
    Other,
    Unknown,
}

/// `struct linux_dirent64 { u64 d_ino; i64 d_off; u16 d_reclen; u8 d_type; char d_name[]; }`
const HEADER: usize = 19;

/// The entries of a directory, read with the caller's reusable buffer as they are needed:
/// what is held at once is one `getdents64` buffer, whatever the directory's size.
pub struct Listing<'a> {
    dir: BorrowedFd<'a>,
    buf: &'a mut [u8],
    /// Bytes of records in `buf` from the last `getdents64`, and how far they are parsed.
    len: usize,
    pos: usize,
    /// Where the record of the entry returned last starts.
    last: usize,
}

impl<'a> Listing<'a> {
    /// List `dir` from its current position (the start, for a directory just opened).
    /// `buf` must hold the longest record (a few hundred bytes); 64 KiB takes ~1,000 names a call.
    pub fn new(dir: BorrowedFd<'a>, buf: &'a mut [u8]) -> Self {
        Self::resume(dir, buf, (0, 0))
    }

    /// Go on with a listing of `dir` from a [`Listing::cursor`] taken earlier, with the
    /// same buffer (its records past the cursor are the next entries; the descriptor's own
    /// position is past them).
    pub fn resume(dir: BorrowedFd<'a>, buf: &'a mut [u8], (len, pos): (usize, usize)) -> Self {
        Self {
            dir,
            buf,
            len,
            pos,
            last: pos,
        }
    }

    /// Where the listing is: past every entry returned.
    pub fn cursor(&self) -> (usize, usize) {
        (self.len, self.pos)
    }

    /// Where the listing was before the entry returned last, so it is returned again.
    pub fn cursor_before_last(&self) -> (usize, usize) {
        (self.len, self.last)
    }

    /// The next entry other than `.` and `..`, or `None` at the end of the directory. The
    /// name lives in the buffer until the next call.
    pub fn next_entry(&mut self) -> io::Result<Option<(&CStr, DType)>> {
        let bad = || io::Error::new(io::ErrorKind::InvalidData, "malformed getdents64 record");
        // Where the next name is; the name is borrowed only once it is found.
        let (start, end, dtype) = loop {
            if self.pos >= self.len {
                self.len = sys::getdents64(self.dir, self.buf)?;
                self.pos = 0;
                if self.len == 0 {
                    return Ok(None);
                }
            }
            let records = &self.buf[self.pos..self.len];
            if records.len() < HEADER {
                return Err(bad());
            }
            let reclen = u16::from_ne_bytes([records[16], records[17]]) as usize;
            if reclen < HEADER || reclen > records.len() {
                return Err(bad());
            }
            let dtype = match records[18] {
                libc::DT_DIR => DType::Dir,
                libc::DT_REG => DType::Regular,
                libc::DT_UNKNOWN => DType::Unknown,
                _ => DType::Other,
            };
            let name = &records[HEADER..reclen];
            let len = name.iter().position(|&b| b == 0).ok_or_else(bad)?;
            let dots = &name[..len] == b"." || &name[..len] == b"..";
            let start = self.pos + HEADER;
            self.last = self.pos;
            self.pos += reclen;
            if !dots {
                break (start, start + len + 1, dtype);
            }
        };
        let name = CStr::from_bytes_with_nul(&self.buf[start..end]).map_err(|_| bad())?;
        Ok(Some((name, dtype)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn lists_every_entry_but_dot_and_dotdot_across_many_buffers() -> io::Result<()> {
        let tmp = tempfile::tempdir()?;
        for i in 0..500 {
            std::fs::write(tmp.path().join(format!("f{i}")), b"")?;
        }
        std::fs::create_dir(tmp.path().join("d"))?;
        let dir = std::fs::File::open(tmp.path())?;
        // A small buffer forces many getdents64 calls.
        let mut buf = vec![0u8; 1024];
        let mut listing = Listing::new(dir.as_fd(), &mut buf);
        let mut names = std::collections::BTreeSet::new();
        let mut saw_dir = false;
        while let Some((name, dtype)) = listing.next_entry()? {
            saw_dir |= name.to_bytes() == b"d" && dtype != DType::Other;
            assert!(names.insert(name.to_owned()), "{name:?} listed twice");
        }
        assert_eq!(names.len(), 501);
        assert!(saw_dir);
        // At the end it stays at the end.
        assert!(listing.next_entry()?.is_none());
        Ok(())
    }
}
