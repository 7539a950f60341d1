//! Directory listing through `getdents64` on a directory fd, parsed without `unsafe`.

use std::ffi::CString;
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

#[derive(Debug)]
pub struct DirEntry {
    pub name: CString,
    pub dtype: DType,
}

/// All entries of `dir` except `.` and `..`, read with the caller's reusable buffer.
pub fn read_all(dir: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<Vec<DirEntry>> {
    let mut out = Vec::new();
    loop {
        let n = sys::getdents64(dir, buf)?;
        if n == 0 {
            return Ok(out);
        }
        parse(&buf[..n], &mut out)?;
    }
}

/// `struct linux_dirent64 { u64 d_ino; i64 d_off; u16 d_reclen; u8 d_type; char d_name[]; }`
fn parse(mut records: &[u8], out: &mut Vec<DirEntry>) -> io::Result<()> {
    const HEADER: usize = 19;
    let bad = || io::Error::new(io::ErrorKind::InvalidData, "malformed getdents64 record");
    while !records.is_empty() {
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
        let name_field = &records[HEADER..reclen];
        let len = name_field.iter().position(|&b| b == 0).ok_or_else(bad)?;
        let name = &name_field[..len];
        if name != b"." && name != b".." {
            out.push(DirEntry {
                name: CString::new(name).map_err(|_| bad())?,
                dtype,
            });
        }
        records = &records[reclen..];
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn lists_every_entry_but_dot_and_dotdot() -> io::Result<()> {
        let tmp = tempfile::tempdir()?;
        for i in 0..500 {
            std::fs::write(tmp.path().join(format!("f{i}")), b"")?;
        }
        std::fs::create_dir(tmp.path().join("d"))?;
        let dir = std::fs::File::open(tmp.path())?;
        // A small buffer forces many getdents64 calls.
        let mut buf = vec![0u8; 1024];
        let entries = read_all(dir.as_fd(), &mut buf)?;
        assert_eq!(entries.len(), 501);
        assert!(entries
            .iter()
            .any(|e| e.name.as_bytes() == b"d" && e.dtype != DType::Other));
        Ok(())
    }
}
