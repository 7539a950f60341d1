//! Opening the paths a caller names (the CLI's, an admin's: trusted, symlinks followed as
//! `cp` follows them; a tenant's path inside a root is `beneath`'s): a path as the C string a
//! syscall takes, its parent and final name, and the source's top directory opened without
//! moving its access time.

use std::ffi::CString;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use crate::{sys, Error};

/// `p` as the C string a syscall takes; a NUL inside it is refused.
pub(crate) fn cstring(p: &Path) -> Result<CString, Error> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| Error::Usage(format!("{}: path contains a NUL byte", p.display())))
}

/// The directory `p` is in (`.` for a bare name).
pub(crate) fn parent_of(p: &Path) -> &Path {
    match p.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    }
}

/// The last component of `p`, which it must have.
pub(crate) fn final_name(p: &Path) -> Result<CString, Error> {
    let name = p
        .file_name()
        .ok_or_else(|| Error::Usage(format!("{}: needs a final name component", p.display())))?;
    CString::new(name.as_bytes())
        .map_err(|_| Error::Usage(format!("{}: path contains a NUL byte", p.display())))
}

/// Open the directory at `p` (symlinks followed: the caller named it); `op` labels a failure.
pub(crate) fn open_dir(p: &Path, op: &'static str) -> Result<OwnedFd, Error> {
    sys::open(&cstring(p)?, libc::O_RDONLY | libc::O_DIRECTORY).map_err(|e| Error::io(op, p, e))
}

/// The source's top directory, without moving its atime where we may (as a copy opens every source directory: `O_NOATIME`, refused on files of other owners without CAP_FOWNER).
pub(crate) fn open_source_dir(p: &Path) -> Result<OwnedFd, Error> {
    let c = cstring(p)?;
    let flags = libc::O_RDONLY | libc::O_DIRECTORY;
    match sys::open(&c, flags | libc::O_NOATIME) {
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => sys::open(&c, flags),
        other => other,
    }
    .map_err(|e| Error::io("open source directory", p, e))
}
