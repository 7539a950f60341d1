//! Metadata, applied by fd in the coreutils order: owner, then xattrs (chown clears
//! `security.capability`), then mode (chown clears setuid/setgid), then times (every other
//! change bumps them).

use std::ffi::CStr;
use std::io;
use std::os::fd::BorrowedFd;

use crate::options::Preserve;
use crate::sys::{self, Stat};

/// Process facts the metadata code needs, read once per copy.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Identity {
    pub euid: u32,
    pub egid: u32,
    pub umask: u32,
}

impl Identity {
    pub fn current() -> Self {
        Self {
            euid: sys::geteuid(),
            egid: sys::getegid(),
            umask: sys::current_umask(),
        }
    }

    /// The mode a copied entry ends with: all of it when preserving, otherwise what a
    /// fresh create would get.
    pub fn final_mode(&self, st: &Stat, preserve: &Preserve) -> u32 {
        if preserve.mode {
            st.st_mode & 0o7777
        } else {
            st.st_mode & 0o777 & !self.umask
        }
    }
}

/// Reusable buffers for xattr copies.
#[derive(Debug, Default)]
pub(crate) struct XattrBufs {
    names: Vec<u8>,
    value: Vec<u8>,
}

fn is_unsupported(err: &io::Error) -> bool {
    matches!(err.raw_os_error(), Some(libc::ENOTSUP) | Some(libc::ENOSYS))
}

/// chown a new entry to the source's owner. Without CAP_CHOWN only the group can be kept
/// (if we belong to it), and failing that nothing, which is what `cp -a` does quietly.
fn chown(dst: BorrowedFd<'_>, st: &Stat, who: &Identity, fresh: bool) -> io::Result<()> {
    // A fresh entry already belongs to us; skip the call when that is what the source has.
    if fresh && st.st_uid == who.euid && st.st_gid == who.egid {
        return Ok(());
    }
    match sys::fchown(dst, st.st_uid, st.st_gid) {
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
            let _ = sys::fchown(dst, u32::MAX, st.st_gid);
            Ok(())
        }
        other => other,
    }
}

/// Copy every xattr of `src` onto `dst`. Attributes the destination cannot hold (no xattr
/// support, or a `trusted.`/`security.` namespace we may not write) are skipped, as `cp -a`
/// does; any other error fails the entry.
pub(crate) fn copy_xattrs(
    src: BorrowedFd<'_>,
    dst: BorrowedFd<'_>,
    bufs: &mut XattrBufs,
) -> io::Result<()> {
    match sys::flistxattr(src, &mut bufs.names) {
        Ok(()) => {}
        Err(e) if is_unsupported(&e) => return Ok(()),
        Err(e) => return Err(e),
    }
    if bufs.names.is_empty() {
        return Ok(());
    }
    let names = std::mem::take(&mut bufs.names);
    let result = (|| {
        for name in names.split_inclusive(|&b| b == 0) {
            let Ok(name) = CStr::from_bytes_with_nul(name) else {
                continue;
            };
            match sys::fgetxattr(src, name, &mut bufs.value) {
                Ok(()) => {}
                // Removed since the listing.
                Err(e) if e.raw_os_error() == Some(libc::ENODATA) => continue,
                Err(e) => return Err(e),
            }
            match sys::fsetxattr(dst, name, &bufs.value) {
                Ok(()) => {}
                Err(e) if is_unsupported(&e) || e.raw_os_error() == Some(libc::EPERM) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    })();
    bufs.names = names;
    result
}

/// Apply owner, xattrs, mode and times from `st` (and `src`'s xattrs) to the open `dst`.
/// Returns the name of the step that failed with its error.
pub(crate) fn apply_fd(
    src: BorrowedFd<'_>,
    dst: BorrowedFd<'_>,
    st: &Stat,
    preserve: &Preserve,
    who: &Identity,
    fresh: bool,
    bufs: &mut XattrBufs,
) -> Result<(), (&'static str, io::Error)> {
    if preserve.ownership {
        chown(dst, st, who, fresh).map_err(|e| ("fchown", e))?;
    }
    if preserve.xattrs {
        copy_xattrs(src, dst, bufs).map_err(|e| ("copy xattrs", e))?;
    }
    sys::fchmod(dst, who.final_mode(st, preserve)).map_err(|e| ("fchmod", e))?;
    if preserve.timestamps {
        sys::futimens(dst, st).map_err(|e| ("futimens", e))?;
    }
    Ok(())
}

/// The same for entries that cannot be opened: symlinks (no mode) and special files.
pub(crate) fn apply_at(
    dir: BorrowedFd<'_>,
    name: &CStr,
    st: &Stat,
    preserve: &Preserve,
    who: &Identity,
) -> Result<(), (&'static str, io::Error)> {
    let is_link = st.st_mode & libc::S_IFMT == libc::S_IFLNK;
    if preserve.ownership && (st.st_uid != who.euid || st.st_gid != who.egid) {
        match sys::lchownat(dir, name, st.st_uid, st.st_gid) {
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
                let _ = sys::lchownat(dir, name, u32::MAX, st.st_gid);
            }
            other => other.map_err(|e| ("lchown", e))?,
        }
    }
    if !is_link {
        sys::fchmodat(dir, name, who.final_mode(st, preserve)).map_err(|e| ("fchmodat", e))?;
    }
    if preserve.timestamps {
        sys::lutimensat(dir, name, st).map_err(|e| ("utimensat", e))?;
    }
    Ok(())
}
