//! Finding and describing entries beneath the top: a path the receiver names resolved to
//! its parent directory (no symlink, never above the top, never Ferry's own state),
//! entries opened only as what they are (a FIFO or device never), the record of an entry
//! with its attributes, and the count of what a copy of the whole top would carry.

use std::ffi::{CStr, CString};
use std::io::{self, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use ferry_transfer::{Entry, Xattr};

use super::half::Half;
use super::top::SourceTop;
use crate::dirent::DType;
use crate::options::Part;
use crate::plan::{count_dir, Totals};
use crate::record::entry_of;
use crate::sys::{self, Stat};

impl<W: Write + Send> Half<'_, W> {
    /// What a copy of the whole top would carry, counted as `plan_beneath` counts it (the
    /// files the filter selects, a hard-linked one once when `links`), Ferry's own state at
    /// the top left out as it is never served.
    pub(super) fn count(&self, links: bool) -> Result<Totals, (&'static str, io::Error)> {
        match self.top {
            SourceTop::File(fd) => {
                let st = sys::fstat(fd.as_fd()).map_err(|e| ("stat", e))?;
                Ok(Totals {
                    files: 1,
                    bytes: st.st_size as u64,
                    ..Default::default()
                })
            }
            SourceTop::Device(d) => Ok(Totals {
                files: 1,
                bytes: d.size(),
                ..Default::default()
            }),
            SourceTop::Dir(fd) => {
                // A descriptor of its own: a listing moves the offset of every descriptor
                // that shares the top's.
                let dir = self
                    .open_at(fd.as_fd(), c".", DIR_FLAGS)
                    .map_err(|e| ("open directory", e))?;
                let reserved = self.opts.reserved_top.as_deref();
                Ok(count_dir(
                    dir,
                    Part::All,
                    links,
                    &self.opts.filter,
                    reserved,
                ))
            }
        }
    }

    /// Resolve `path` to its parent directory (opened, no symlink on the way, never above
    /// the top) and its last name; `None` for the top itself.
    pub(super) fn resolve(&self, path: &[u8]) -> io::Result<Option<(OwnedFd, CString)>> {
        let SourceTop::Dir(top) = self.top else {
            return match path.is_empty() {
                true => Ok(None),
                false => Err(io::Error::from_raw_os_error(libc::ENOTDIR)),
            };
        };
        if path.is_empty() {
            return Ok(None);
        }
        let mut parts: Vec<&[u8]> = path.split(|&b| b == b'/').collect();
        if let Some(r) = &self.opts.reserved_top {
            if parts[0] == r.to_bytes() {
                return Err(io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    "Ferry's own state is not served",
                ));
            }
        }
        let last = parts.pop().unwrap_or_default();
        let name = CString::new(last).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        let mut dir = sys::open_beneath(top.as_fd(), c".", DIR_PATH)?;
        // A few components per openat2: a path longer than PATH_MAX is walked in pieces.
        let mut piece = Vec::new();
        for (i, part) in parts.iter().enumerate() {
            if !piece.is_empty() {
                piece.push(b'/');
            }
            piece.extend_from_slice(part);
            let end = i + 1 == parts.len() || piece.len() + parts[i + 1].len() + 1 > 3072;
            if end {
                let c = CString::new(std::mem::take(&mut piece))
                    .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
                dir = sys::openat2_beneath(dir.as_fd(), &c, DIR_PATH)?;
            }
        }
        Ok(Some((dir, name)))
    }

    /// Open a directory (`flags` has `O_DIRECTORY`, which refuses anything else before it
    /// is opened), without changing its access time where we may.
    pub(super) fn open_at(
        &self,
        dir: BorrowedFd<'_>,
        name: &CStr,
        flags: libc::c_int,
    ) -> io::Result<OwnedFd> {
        debug_assert!(flags & libc::O_DIRECTORY != 0);
        if self.root {
            match sys::open_beneath(dir, name, flags | libc::O_NOATIME) {
                Err(e) if e.raw_os_error() == Some(libc::EPERM) => {}
                other => return other,
            }
        }
        sys::open_beneath(dir, name, flags)
    }

    /// Open an entry for reading only if it is a regular file (`dirs`: or a directory),
    /// with no window for a swap (see `sys::open_regular`): a device, FIFO, socket or
    /// symlink comes back as its stat, never opened. Access times as [`Half::open_at`].
    pub(super) fn open_data_at(
        &self,
        dir: BorrowedFd<'_>,
        name: &CStr,
        flags: libc::c_int,
        dirs: bool,
    ) -> io::Result<sys::Opened> {
        let flags = if self.root {
            flags | libc::O_NOATIME
        } else {
            flags
        };
        match dirs {
            true => sys::open_regular_or_dir(dir, name, flags),
            false => sys::open_regular(dir, name, flags),
        }
    }

    /// The record of the entry at `path`.
    pub(super) fn stat(&self, path: &[u8]) -> Result<Entry, (&'static str, io::Error)> {
        let name = path.rsplit(|&b| b == b'/').next().unwrap_or_default();
        match self.resolve(path).map_err(|e| ("open", e))? {
            None => {
                let fd = match self.top {
                    SourceTop::Dir(fd) | SourceTop::File(fd) => fd,
                    SourceTop::Device(_) => return Err(("stat", not_a_tree())),
                };
                let st = sys::fstat(fd.as_fd()).map_err(|e| ("stat", e))?;
                // The top has no name of its own in the shard.
                self.record(b"-", &st, Some(fd.as_fd()), None)
                    .map_err(|e| ("read attributes", e))
            }
            Some((dir, c)) => {
                let (st, fd) = self.stat_at(dir.as_fd(), &c).map_err(|e| ("stat", e))?;
                let target = match st.st_mode & libc::S_IFMT == libc::S_IFLNK {
                    true => Some(sys::readlinkat(dir.as_fd(), &c).map_err(|e| ("read link", e))?),
                    false => None,
                };
                self.record(name, &st, fd.as_ref().map(|f| f.as_fd()), target)
                    .map_err(|e| ("read attributes", e))
            }
        }
    }

    /// Stat `name` in `dir`, and for a directory or regular file open it (its attributes
    /// are read through the descriptor, and its stat is then the descriptor's).
    pub(super) fn stat_at(
        &self,
        dir: BorrowedFd<'_>,
        name: &CStr,
    ) -> io::Result<(Stat, Option<OwnedFd>)> {
        self.stat_hinted(dir, name, DType::Unknown, true)
    }

    /// [`Half::stat_at`] with the listing's type: an entry it says is a regular file or a
    /// directory is opened straight away (its stat is then the descriptor's: one `lstat`
    /// less per file). As a local copy opens a listed file: only once it is known to be a
    /// regular file or a directory (see `sys::open_regular`), so a FIFO or device swapped
    /// in meanwhile is never opened. Without `files`, a regular file is only `lstat`ed (no
    /// descriptor, so no attributes in its record).
    pub(super) fn stat_hinted(
        &self,
        dir: BorrowedFd<'_>,
        name: &CStr,
        hint: DType,
        files: bool,
    ) -> io::Result<(Stat, Option<OwnedFd>)> {
        let opens = |kind: u32| kind == libc::S_IFDIR || (files && kind == libc::S_IFREG);
        if !self.opts.xattrs {
            return Ok((sys::lstatat(dir, name)?, None));
        }
        // Opened straight away: a directory, and a regular file when files are.
        let open_now = hint == DType::Dir || (files && hint == DType::Regular);
        if !open_now {
            let st = sys::lstatat(dir, name)?;
            if !opens(st.st_mode & libc::S_IFMT) {
                return Ok((st, None));
            }
        }
        let flags = libc::O_RDONLY | libc::O_NOCTTY;
        match self.open_data_at(dir, name, flags, true) {
            Ok(sys::Opened::Open(fd, st)) => Ok((st, Some(fd))),
            // Something else since the listing (a symlink, FIFO, socket or device): its
            // record as its own stat has it.
            Ok(sys::Opened::Other(st)) => Ok((st, None)),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Err(e),
            // A file or directory this agent may not open: its record as `lstat` has it.
            // (The receiver's read or listing of it then fails by itself, with the reason.)
            Err(_) => Ok((sys::lstatat(dir, name)?, None)),
        }
    }

    /// The record of entry `name` of stat `st` (`fd`: its descriptor, to read its extended
    /// attributes through, when it was opened).
    pub(super) fn record(
        &self,
        name: &[u8],
        st: &Stat,
        fd: Option<BorrowedFd<'_>>,
        target: Option<CString>,
    ) -> io::Result<Entry> {
        let xattrs = match fd.filter(|_| self.opts.xattrs) {
            Some(fd) => read_xattrs(fd)?,
            None => Vec::new(),
        };
        Ok(entry_of(name, st, target, xattrs))
    }
}

pub(super) const DIR_FLAGS: libc::c_int = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW;
pub(super) const DIR_PATH: libc::c_int = libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW;

/// Every extended attribute of the open `fd`.
fn read_xattrs(fd: BorrowedFd<'_>) -> io::Result<Vec<Xattr>> {
    let mut names = Vec::new();
    match sys::flistxattr(fd, &mut names) {
        Ok(()) => {}
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOTSUP) | Some(libc::ENOSYS)) => {
            return Ok(Vec::new())
        }
        Err(e) => return Err(e),
    }
    let mut out = Vec::new();
    let mut value = Vec::new();
    for name in names.split_inclusive(|&b| b == 0) {
        let Ok(c) = CStr::from_bytes_with_nul(name) else {
            continue;
        };
        match sys::fgetxattr(fd, c, &mut value) {
            Ok(()) => out.push(Xattr {
                name: c.to_bytes().to_vec(),
                value: value.clone(),
            }),
            // Removed since the listing.
            Err(e) if e.raw_os_error() == Some(libc::ENODATA) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

/// What a request about paths gets from a device top: it has none.
pub(super) fn not_a_tree() -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        "the source is a raw block device: it is read by range, and has no paths",
    )
}
