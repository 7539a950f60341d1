//! Metadata, applied by fd in the coreutils order: owner, then xattrs (chown clears
//! `security.capability`), then mode (chown clears setuid/setgid), then times (every other
//! change bumps them). Privileged bits and attributes (setuid/setgid, file capabilities)
//! are given as [`Privileged`] says, and never to a copy whose owner is not the source's.

use std::ffi::CStr;
use std::io;
use std::os::fd::BorrowedFd;

use ferry_transfer::Xattr;

use crate::options::{Preserve, Privileged};
use crate::sys::{self, Stat};

/// The setuid and setgid bits.
const SET_ID: u32 = libc::S_ISUID | libc::S_ISGID;

/// The attribute that holds a file's capabilities.
const CAPABILITY: &[u8] = b"security.capability";

/// How metadata is given to a copy: what is kept (the copy's `preserve`), by whom, and
/// whether privileged bits and attributes are (see [`Privileged`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rules<'a> {
    pub preserve: &'a Preserve,
    pub who: &'a Identity,
    pub privileged: Privileged,
}

impl Rules<'_> {
    /// The mode a copy of `st` ends with: [`Identity::final_mode`], less the setuid and
    /// setgid bits where privileged content is dropped (from anything but a directory,
    /// whose setgid bit only passes its group on) or where the copy's owner is not the
    /// source's (`owner_kept`: GNU cp drops them then too).
    pub fn mode(&self, st: &Stat, owner_kept: bool) -> u32 {
        let mode = self.who.final_mode(st, self.preserve);
        let is_dir = st.st_mode & libc::S_IFMT == libc::S_IFDIR;
        match owner_kept && (self.privileged == Privileged::Keep || is_dir) {
            true => mode,
            false => mode & !SET_ID,
        }
    }

    /// Whether attribute `name` is copied: file capabilities only where privileged content
    /// is kept and the copy has the source's owner (the kernel itself drops them when a
    /// file changes owner).
    fn copies_xattr(&self, name: &[u8], owner_kept: bool) -> bool {
        name != CAPABILITY || (owner_kept && self.privileged == Privileged::Keep)
    }

    /// Whether a copy of `st` that is not chowned has the source's owner anyway.
    fn owner_is_ours(&self, st: &Stat) -> bool {
        (st.st_uid, st.st_gid) == (self.who.euid, self.who.egid)
    }
}

/// The extended attributes to give a copy: read from the source's descriptor, or as a
/// record from another node carried them.
pub(crate) enum SrcXattrs<'a> {
    Fd(BorrowedFd<'a>),
    List(&'a [Xattr]),
}

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
        if preserve.permissions {
            st.st_mode & 0o7777
        } else {
            st.st_mode & 0o777 & !self.umask
        }
    }
}

impl Identity {
    /// The mode to create a file with, and whether that already is its final mode.
    /// It is when nothing would change it later: no chown (which clears setuid/setgid,
    /// and before which a wider mode would expose the data to the wrong group), no
    /// special bits, no bits the umask would strip, and a directory we created (an
    /// existing one may carry a default ACL that overrides the umask).
    pub fn creation_mode(&self, st: &Stat, preserve: &Preserve, fresh_dir: bool) -> (u32, bool) {
        let target = self.final_mode(st, preserve);
        let chown = preserve.ownership && (st.st_uid != self.euid || st.st_gid != self.egid);
        if fresh_dir && !chown && target & 0o7000 == 0 && target & self.umask == 0 {
            (target, true)
        } else {
            (0o600, false)
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
/// `Ok(true)` when the entry has the source's owner and group.
fn chown(dst: BorrowedFd<'_>, st: &Stat, who: &Identity) -> io::Result<bool> {
    // A new entry already belongs to us; skip the call when that is what the source has.
    // (Directories we merge into keep their owner: they get no metadata at all.)
    if st.st_uid == who.euid && st.st_gid == who.egid {
        return Ok(true);
    }
    match sys::fchown(dst, st.st_uid, st.st_gid) {
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
            let _ = sys::fchown(dst, u32::MAX, st.st_gid);
            Ok(false)
        }
        other => other.map(|()| true),
    }
}

/// Set one attribute on `dst`: one the destination cannot hold (no xattr support, or a
/// `trusted.`/`security.` namespace we may not write) is skipped, as `cp -a` does.
fn set_xattr(dst: BorrowedFd<'_>, name: &CStr, value: &[u8]) -> io::Result<()> {
    match sys::fsetxattr(dst, name, value) {
        Ok(()) => Ok(()),
        Err(e) if is_unsupported(&e) || e.raw_os_error() == Some(libc::EPERM) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Copy the xattrs of `src` onto `dst` that `copies` lets through (by name); `Ok(true)` if
/// the source had any. Attributes the destination cannot hold are skipped (see
/// [`set_xattr`]); any other error fails the entry. A source on another node gives its
/// attributes as its record carried them.
pub(crate) fn copy_xattrs(
    src: SrcXattrs<'_>,
    dst: BorrowedFd<'_>,
    bufs: &mut XattrBufs,
    copies: impl Fn(&[u8]) -> bool,
) -> io::Result<bool> {
    let src = match src {
        SrcXattrs::Fd(fd) => fd,
        SrcXattrs::List(list) => {
            for x in list.iter().filter(|x| copies(&x.name)) {
                // (The decoder checked names have no NUL.)
                let Ok(name) = std::ffi::CString::new(x.name.as_slice()) else {
                    continue;
                };
                set_xattr(dst, &name, &x.value)?;
            }
            return Ok(!list.is_empty());
        }
    };
    match sys::flistxattr(src, &mut bufs.names) {
        Ok(()) => {}
        Err(e) if is_unsupported(&e) => return Ok(false),
        Err(e) => return Err(e),
    }
    if bufs.names.is_empty() {
        return Ok(false);
    }
    let names = std::mem::take(&mut bufs.names);
    let result = (|| {
        for name in names.split_inclusive(|&b| b == 0) {
            let Ok(name) = CStr::from_bytes_with_nul(name) else {
                continue;
            };
            if !copies(name.to_bytes()) {
                continue;
            }
            match sys::fgetxattr(src, name, &mut bufs.value) {
                Ok(()) => {}
                // Removed since the listing.
                Err(e) if e.raw_os_error() == Some(libc::ENODATA) => continue,
                Err(e) => return Err(e),
            }
            set_xattr(dst, name, &bufs.value)?;
        }
        Ok(true)
    })();
    bufs.names = names;
    result
}

/// Apply owner, xattrs and mode from `st` (and `src`'s xattrs) to the open `dst`; the
/// times, which come last, are [`apply_times`]'s, so that a caller that finishes a file by
/// its times can check it still owns the copy between the two (nothing after that check
/// but the one syscall that finishes the file).
/// Returns the name of the step that failed with its error.
/// `mode_done`: the entry was created with its final mode (see [`Identity::creation_mode`]);
/// otherwise it is set here, after owner and xattrs.
pub(crate) fn apply_fd(
    src: SrcXattrs<'_>,
    dst: BorrowedFd<'_>,
    st: &Stat,
    rules: Rules<'_>,
    mode_done: bool,
    bufs: &mut XattrBufs,
) -> Result<(), (&'static str, io::Error)> {
    let owner_kept = match rules.preserve.ownership {
        true => chown(dst, st, rules.who).map_err(|e| ("fchown", e))?,
        false => rules.owner_is_ours(st),
    };
    let mut had_xattrs = false;
    if rules.preserve.xattrs {
        let copies = |name: &[u8]| rules.copies_xattr(name, owner_kept);
        had_xattrs = copy_xattrs(src, dst, bufs, copies).map_err(|e| ("copy xattrs", e))?;
    }
    // An access ACL rewrites the group bits, so the mode is set again after it.
    if !mode_done || had_xattrs {
        sys::fchmod(dst, rules.mode(st, owner_kept)).map_err(|e| ("fchmod", e))?;
    }
    Ok(())
}

/// The last step of [`apply_fd`]: `st`'s times on the open `dst`, when they are kept.
pub(crate) fn apply_times(
    dst: BorrowedFd<'_>,
    st: &Stat,
    preserve: &Preserve,
) -> Result<(), (&'static str, io::Error)> {
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
    rules: Rules<'_>,
) -> Result<(), (&'static str, io::Error)> {
    let is_link = st.st_mode & libc::S_IFMT == libc::S_IFLNK;
    let mut owner_kept = rules.owner_is_ours(st);
    if rules.preserve.ownership && !owner_kept {
        match sys::lchownat(dir, name, st.st_uid, st.st_gid) {
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
                let _ = sys::lchownat(dir, name, u32::MAX, st.st_gid);
            }
            other => {
                other.map_err(|e| ("lchown", e))?;
                owner_kept = true;
            }
        }
    }
    if !is_link {
        sys::fchmodat(dir, name, rules.mode(st, owner_kept)).map_err(|e| ("fchmodat", e))?;
    }
    if rules.preserve.timestamps {
        sys::lutimensat(dir, name, st).map_err(|e| ("utimensat", e))?;
    }
    Ok(())
}
