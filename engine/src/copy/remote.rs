//! The source side of a copy, local or on another node. Locally it is descriptors: a
//! directory's fd, entries opened beneath it. Across nodes it is records and requests over
//! a [`Connection`] to the source half (`send`): a directory is its path from the top, an
//! entry is the record its listing carried (stat, extended attributes, symlink target, and
//! for a small file of a fresh directory its bytes), and a file's data is read by a request
//! when it is needed. Everything on the destination side is the same code either way.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use ferry_transfer::frame::{Frame, MAX_DATA};
use ferry_transfer::{Entry, Kind, Xattr};

use crate::data::{self, Moved};
use crate::error::source_changed;
use crate::meta::SrcXattrs;
use crate::progress::Strategy;
use crate::record::{child, fingerprint, stat_of};
use crate::recv::{Connection, CREDIT};
use crate::sys::{self, Stat};

use super::patch::PatchSlot;
use super::{Ctx, Fail, Local, OpenDir};

/// A source directory.
pub(super) enum SrcDir {
    Fd(OwnedFd),
    /// On another node: its path from the shard's top.
    Remote(Vec<u8>),
}

impl SrcDir {
    /// Its descriptor, for a local one.
    pub(super) fn fd(&self) -> Option<BorrowedFd<'_>> {
        match self {
            SrcDir::Fd(fd) => Some(fd.as_fd()),
            SrcDir::Remote(_) => None,
        }
    }
}

/// What a listing from another node said of an entry.
#[derive(Debug)]
pub(super) struct Rec {
    pub st: Stat,
    pub xattrs: Vec<Xattr>,
    pub target: Option<CString>,
    /// A small file's bytes and their hash (when hashing), sent with the listing: a slice
    /// of the listing's payload (cloned without copying).
    pub inline: Option<(Bytes, Option<u128>)>,
    /// Whether `xattrs` are the entry's: a listing that keeps most files by their stats
    /// (a re-run) carries none for regular files, whose record is asked again when one is
    /// copied.
    pub attrs: bool,
}

/// A source entry that was to be a regular file: open, with its stat; or, when it is
/// something else by the time it is opened, that thing's stat (it was not opened).
pub(super) enum SrcEntry {
    File(SrcFile, Stat),
    Other(Stat),
}

/// A source regular file, open.
pub(super) enum SrcFile {
    Fd(OwnedFd),
    Remote(Box<RemoteFile>),
}

pub(super) struct RemoteFile {
    pub(super) path: Vec<u8>,
    pub(super) st: Stat,
    xattrs: Vec<Xattr>,
    inline: Option<(Bytes, Option<u128>)>,
    /// Which chunks differ from the destination's copy, when a comparison found that
    /// mending it pays (see `patch.rs`).
    pub(super) patch: PatchSlot,
}

impl SrcFile {
    pub(super) fn xattrs(&self) -> SrcXattrs<'_> {
        match self {
            SrcFile::Fd(fd) => SrcXattrs::Fd(fd.as_fd()),
            SrcFile::Remote(r) => SrcXattrs::List(&r.xattrs),
        }
    }

    pub(super) fn fd(&self) -> Option<&OwnedFd> {
        match self {
            SrcFile::Fd(fd) => Some(fd),
            SrcFile::Remote(_) => None,
        }
    }
}

pub(super) fn rec_of(e: Entry, inline: Option<(Bytes, Option<u128>)>) -> Rec {
    let st = stat_of(&e);
    let target = match e.kind {
        // (The decoder checked it has no NUL.)
        Kind::Symlink(t) => CString::new(t).ok(),
        _ => None,
    };
    Rec {
        st,
        xattrs: e.xattrs,
        target,
        inline,
        attrs: true,
    }
}

impl Ctx<'_> {
    pub(super) fn conn(&self) -> io::Result<&Arc<Connection>> {
        self.remote
            .as_ref()
            .ok_or_else(|| io::Error::other("internal: a remote directory in a local copy"))
    }

    /// The record of the entry at `path` on the source's node.
    pub(super) fn remote_stat(&self, path: &[u8]) -> io::Result<Rec> {
        Ok(rec_of(self.conn()?.stat(path)?, None))
    }

    /// `lstat` of entry `name` of source directory `dir`: from its record when the
    /// listing gave one, else asked.
    pub(super) fn src_lstat(
        &self,
        dir: &OpenDir,
        name: &CStr,
        rec: Option<&Rec>,
    ) -> io::Result<Stat> {
        if let Some(r) = rec {
            return Ok(r.st);
        }
        match &dir.src {
            SrcDir::Fd(fd) => sys::lstatat(fd.as_fd(), name),
            SrcDir::Remote(p) => self.remote_stat(&child(p, name.to_bytes())).map(|r| r.st),
        }
    }

    /// Open regular file `name` of source directory `dir` (remote: nothing is asked yet;
    /// without a record, its record is). Whatever is not a regular file by now (a symlink,
    /// a FIFO, a device swapped in since the listing) comes back as its stat, unopened.
    pub(super) fn src_open_file(
        &self,
        dir: &OpenDir,
        name: &CStr,
        flags: libc::c_int,
        rec: Option<&Rec>,
    ) -> io::Result<SrcEntry> {
        match &dir.src {
            SrcDir::Fd(_) => Ok(match self.open_source_file(dir, name, flags)? {
                sys::Opened::Open(fd, st) => SrcEntry::File(SrcFile::Fd(fd), st),
                sys::Opened::Other(st) => SrcEntry::Other(st),
            }),
            SrcDir::Remote(p) => {
                let path = child(p, name.to_bytes());
                let (st, xattrs, inline) = match rec {
                    Some(r) if r.attrs => (r.st, r.xattrs.clone(), r.inline.clone()),
                    // Listed without its attributes (or not listed): its whole record now,
                    // with the stat it has now, as a local open takes the file's.
                    _ => {
                        let r = self.remote_stat(&path)?;
                        (r.st, r.xattrs, None)
                    }
                };
                if st.st_mode & libc::S_IFMT != libc::S_IFREG {
                    return Ok(SrcEntry::Other(st));
                }
                let file = RemoteFile {
                    path,
                    st,
                    xattrs,
                    inline,
                    patch: PatchSlot::default(),
                };
                Ok(SrcEntry::File(SrcFile::Remote(Box::new(file)), st))
            }
        }
    }

    /// The target of symlink `name` in source directory `dir`.
    pub(super) fn src_readlink(
        &self,
        dir: &OpenDir,
        name: &CStr,
        rec: Option<&Rec>,
    ) -> io::Result<CString> {
        if let Some(t) = rec.and_then(|r| r.target.clone()) {
            return Ok(t);
        }
        match &dir.src {
            SrcDir::Fd(fd) => sys::readlinkat(fd.as_fd(), name),
            SrcDir::Remote(p) => self
                .remote_stat(&child(p, name.to_bytes()))?
                .target
                .ok_or_else(|| source_changed("the source stopped being a symlink".into())),
        }
    }

    /// Open subdirectory `name` of source directory `parent`: its handle, its stat, and
    /// (remote) its extended attributes.
    pub(super) fn src_open_dir(
        &self,
        parent: &OpenDir,
        name: &CStr,
        flags: libc::c_int,
        rec: Option<&Rec>,
    ) -> io::Result<(SrcDir, Stat, Vec<Xattr>)> {
        match &parent.src {
            SrcDir::Fd(_) => {
                let fd = self.open_source(parent, name, flags)?;
                let st = sys::fstat(fd.as_fd())?;
                Ok((SrcDir::Fd(fd), st, Vec::new()))
            }
            SrcDir::Remote(p) => {
                let path = child(p, name.to_bytes());
                let (st, xattrs) = match rec {
                    Some(r) => (r.st, r.xattrs.clone()),
                    None => {
                        let r = self.remote_stat(&path)?;
                        (r.st, r.xattrs)
                    }
                };
                if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
                    return Err(io::Error::from_raw_os_error(libc::ENOTDIR));
                }
                Ok((SrcDir::Remote(path), st, xattrs))
            }
        }
    }

    /// The hash of a source file's bytes and how many there were.
    pub(super) fn src_hash(
        &self,
        src: &SrcFile,
        len: u64,
        local: &mut Local,
    ) -> io::Result<(u128, u64)> {
        match src {
            SrcFile::Fd(fd) => data::hash_fd(fd.as_fd(), len, &mut local.buf, &self.guard()),
            SrcFile::Remote(r) => {
                if let Some((bytes, Some(h))) = &r.inline {
                    return Ok((*h, bytes.len() as u64));
                }
                let conn = self.conn()?;
                let mut req = conn.request(|req| Frame::Read {
                    req,
                    path: r.path.clone(),
                    expect: fingerprint(&r.st),
                    credit: 0,
                    hash: true,
                    hash_only: true,
                    zstd: false,
                })?;
                match req.next()? {
                    Frame::FileEnd {
                        hash: Some(h),
                        len,
                        changed: false,
                        ..
                    } => Ok((h, len)),
                    Frame::FileEnd { changed: true, .. } => Err(source_changed(
                        "source was modified while it was compared".into(),
                    )),
                    _ => Err(io::Error::other(
                        "the sender answered a hash with something else",
                    )),
                }
            }
        }
    }

    /// Write a remote file's bytes into `dst` (a new, empty staged file): holes as holes
    /// (or zeros when sparseness is not kept), the length set at the end. Returns what
    /// moved, the hash the sender computed of what it read (when hashing), the length, and
    /// under `verify: Checksum` the hash of the bytes as they were written (holes as the
    /// zeros a reader sees), which is what the sender's is checked against: the bytes
    /// crossed the network and passed through this process, so hashing them on their way
    /// to `write` checks the whole way from the source's read, without reading the copy
    /// back (`verify: Full` still re-reads it past the page cache).
    pub(super) fn fill_remote(
        &self,
        src: &RemoteFile,
        dst: BorrowedFd<'_>,
    ) -> Result<(Moved, Option<u128>, u64, Option<u128>), Fail> {
        let moved = |bytes| Moved {
            bytes,
            strategy: Some(Strategy::ReadWrite),
            short: false,
        };
        let as_written = self.hash && self.opts.verify == crate::Verify::Checksum;
        if let Some((bytes, hash)) = &src.inline {
            data::write_all_at(dst, bytes, 0).map_err(|e| ("write", e))?;
            let len = bytes.len() as u64;
            let written = as_written.then(|| twox_hash::XxHash3_128::oneshot(bytes));
            return Ok((moved(len), *hash, len, written));
        }
        let mut hasher = as_written.then(twox_hash::XxHash3_128::new);
        let guard = self.guard();
        let conn = self.conn().map_err(|e| ("read source", e))?;
        let mut req = conn
            .request(|req| Frame::Read {
                req,
                path: src.path.clone(),
                expect: fingerprint(&src.st),
                credit: CREDIT,
                hash: self.hash,
                hash_only: false,
                zstd: self.opts.compress,
            })
            .map_err(|e| ("read source", e))?;
        let keep_holes = self.opts.preserve.sparseness;
        let mut written = 0u64;
        // Where the bytes written so far end: a gap before the next extent is a hole.
        let mut end = 0u64;
        loop {
            if self.stopping() {
                return Err(("copy data", io::Error::other(data::Stopped)));
            }
            match req.next().map_err(|e| ("read source", e))? {
                Frame::Data {
                    offset, zstd, data, ..
                } => {
                    let data = decompressed(zstd, data)?;
                    if offset.checked_add(data.len() as u64).is_none() {
                        let e = io::Error::other("the sender sent data past the largest offset");
                        return Err(("read source", e));
                    }
                    if offset < end {
                        let e = io::Error::other("the sender sent overlapping data");
                        return Err(("read source", e));
                    }
                    if !keep_holes && offset > end {
                        write_zeros(dst, end, offset - end).map_err(|e| ("write", e))?;
                    }
                    if let Some(h) = hasher.as_mut() {
                        data::hash_zeros(h, offset - end, &guard).map_err(|e| ("hash", e))?;
                        h.write(&data);
                    }
                    data::write_all_at(dst, &data, offset).map_err(|e| ("write", e))?;
                    let n = data.len() as u64;
                    (written, end) = (written + n, offset + n);
                    req.send(&Frame::Credit {
                        req: req.id(),
                        bytes: n,
                    })
                    .map_err(|e| ("read source", e))?;
                }
                Frame::FileEnd {
                    len, hash, changed, ..
                } => {
                    if changed {
                        let msg = "source was modified while it was copied".to_string();
                        return Err(("copy data", source_changed(msg)));
                    }
                    if len < end {
                        let e = io::Error::other("the sender sent data past the file's end");
                        return Err(("read source", e));
                    }
                    if !keep_holes && len > end {
                        write_zeros(dst, end, len - end).map_err(|e| ("write", e))?;
                    }
                    sys::ftruncate(dst, len).map_err(|e| ("truncate", e))?;
                    self.counters
                        .bytes_received
                        .fetch_add(written, Ordering::Relaxed);
                    let as_written = match hasher.as_mut() {
                        Some(h) => {
                            data::hash_zeros(h, len - end, &guard).map_err(|e| ("hash", e))?;
                            Some(h.finish_128())
                        }
                        None => None,
                    };
                    return Ok((moved(written), hash, len, as_written));
                }
                _ => {
                    let e = io::Error::other("the sender answered a read with something else");
                    return Err(("read source", e));
                }
            }
        }
    }
}

/// A data frame's bytes, decompressed if the sender compressed them: never more than a
/// frame's worth once decompressed, whatever the sender claims, so a zstd bomb fails the
/// file and does not fill memory.
pub(super) fn decompressed(zstd: bool, data: Bytes) -> Result<Bytes, Fail> {
    if !zstd {
        return Ok(data);
    }
    zstd::bulk::decompress(&data, MAX_DATA)
        .map(Bytes::from)
        .map_err(|e| {
            let e = io::Error::other(format!(
                "the sender's compressed data does not decompress within {MAX_DATA} bytes: {e}"
            ));
            ("read source", e)
        })
}

pub(super) fn write_zeros(dst: BorrowedFd<'_>, mut off: u64, mut n: u64) -> io::Result<()> {
    static ZEROS: [u8; 64 * 1024] = [0; 64 * 1024];
    while n > 0 {
        let k = n.min(ZEROS.len() as u64) as usize;
        data::write_all_at(dst, &ZEROS[..k], off)?;
        (off, n) = (off + k as u64, n - k as u64);
    }
    Ok(())
}
