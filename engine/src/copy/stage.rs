//! Staging and commit: a file is written where nobody sees it (`O_TMPFILE`, a staging
//! name, or its final name inside a directory that is itself still staged) and only then
//! given its final name, so a crash or a fenced copy never leaves a partial file visible.

use std::ffi::{CStr, CString};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::Ordering;

use crate::data::Caps;
use crate::sys::{self, Stat};

use super::failure::not_owner;
use super::{Ctx, Fail, OpenDir};

/// Where a file being written lives until it is committed.
enum StagedAt {
    /// Under its final name, inside a directory that is itself still staged.
    Final(CString),
    /// Nowhere (`O_TMPFILE`): linked to its name when complete.
    Unnamed,
    /// Under a staging name (filesystems without `O_TMPFILE`): renamed when complete.
    Named(CString),
    /// Committed, or discarded.
    Committed,
}

/// A regular file being written: unnamed (`O_TMPFILE`) until committed, or, where the
/// filesystem cannot do that, under a staging name.
pub(super) struct Staged {
    pub(super) fd: OwnedFd,
    at: StagedAt,
    /// Created with its final mode already (no fchmod needed).
    pub(super) mode_done: bool,
}

impl<'a> Ctx<'a> {
    /// Whether entries of `dir` are created under their final names directly: inside a
    /// staged directory nothing is visible yet, so one rename of the directory stands for
    /// all of them. (A resumed copy that adopts such a directory tells finished files from
    /// the one being written when it died: see `DirNode::ours`.)
    pub(super) fn names_directly(&self, dir: &OpenDir) -> bool {
        dir.hidden
    }

    /// Create the destination file for `st`: unnamed (`O_TMPFILE`) where the filesystem
    /// allows, so nothing is ever visible before it is complete and a crash leaves
    /// nothing behind; under a staging name otherwise.
    pub(super) fn stage(
        &self,
        dir: &OpenDir,
        st: &Stat,
        name: &CStr,
        caps: &mut Caps,
    ) -> Result<Staged, Fail> {
        let access = if self.hash {
            libc::O_RDWR
        } else {
            libc::O_WRONLY
        };
        let (mode, mode_done) = self.who.creation_mode(st, &self.opts.preserve, dir.fresh);
        let create = access | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW;
        if self.names_directly(dir) {
            let fd = sys::openat(dir.dst.as_fd(), name, create, mode).map_err(|e| ("create", e))?;
            return Ok(Staged {
                fd,
                at: StagedAt::Final(name.to_owned()),
                mode_done,
            });
        }
        if caps.tmpfile {
            match sys::open_tmpfile(dir.dst.as_fd(), access, mode) {
                Ok(fd) => {
                    return Ok(Staged {
                        fd,
                        at: StagedAt::Unnamed,
                        mode_done,
                    })
                }
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::EOPNOTSUPP) | Some(libc::EISDIR) | Some(libc::EINVAL)
                    ) =>
                {
                    caps.tmpfile = false;
                }
                Err(e) => return Err(("create", e)),
            }
        }
        let tmp = self.tmp_name();
        let fd = sys::openat(dir.dst.as_fd(), &tmp, create, mode).map_err(|e| ("create", e))?;
        Ok(Staged {
            fd,
            at: StagedAt::Named(tmp),
            mode_done,
        })
    }

    /// Move a finished staging entry to its final name. `Ok(false)` when an entry that
    /// appeared meanwhile is kept by the overwrite policy (the staging entry is removed).
    pub(super) fn commit(&self, dir: &OpenDir, tmp: &CStr, name: &CStr) -> Result<bool, Fail> {
        if !self.owns() {
            let _ = sys::unlinkat(dir.dst.as_fd(), tmp, false);
            return Err(("rename into place", not_owner()));
        }
        let no_replace = !self.may_replace(dir);
        match sys::renameat(dir.dst.as_fd(), tmp, dir.dst.as_fd(), name, no_replace) {
            Ok(()) => Ok(true),
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) && self.keeps_newcomer(dir) => {
                let _ = sys::unlinkat(dir.dst.as_fd(), tmp, false);
                Ok(false)
            }
            Err(e) => {
                let _ = sys::unlinkat(dir.dst.as_fd(), tmp, false);
                Err(("rename into place", e))
            }
        }
    }

    /// Give a finished file its final name. `Ok(false)` when an entry that appeared
    /// meanwhile is kept by the overwrite policy.
    pub(super) fn commit_staged(
        &self,
        dir: &OpenDir,
        staged: &mut Staged,
        name: &CStr,
    ) -> Result<bool, Fail> {
        if !self.owns() {
            return Err(("link into place", not_owner()));
        }
        let replace = self.may_replace(dir);
        match std::mem::replace(&mut staged.at, StagedAt::Committed) {
            StagedAt::Final(_) | StagedAt::Committed => Ok(true),
            StagedAt::Unnamed if !replace => {
                match sys::link_fd(staged.fd.as_fd(), dir.dst.as_fd(), name) {
                    Ok(()) => Ok(true),
                    Err(e)
                        if e.raw_os_error() == Some(libc::EEXIST) && self.keeps_newcomer(dir) =>
                    {
                        Ok(false)
                    }
                    Err(e) => Err(("link into place", e)),
                }
            }
            StagedAt::Unnamed => {
                // linkat cannot replace: name it, then rename over the old entry atomically.
                let tmp = self.tmp_name();
                sys::link_fd(staged.fd.as_fd(), dir.dst.as_fd(), &tmp)
                    .map_err(|e| ("link into place", e))?;
                self.commit(dir, &tmp, name)
            }
            StagedAt::Named(tmp) => self.commit(dir, &tmp, name),
        }
    }

    /// Remove a staged file that will not be committed.
    pub(super) fn discard(&self, dir: &OpenDir, staged: &mut Staged) {
        match std::mem::replace(&mut staged.at, StagedAt::Committed) {
            // A fenced copy leaves a file it was writing under its final name (inside a
            // staging directory) to the new owner, who may already have adopted the
            // directory and made that name again: unlinking it could remove the new
            // owner's file. The new owner tells an unfinished file by its size and mtime.
            StagedAt::Final(_) if self.fenced.load(Ordering::Relaxed) => {}
            StagedAt::Final(name) | StagedAt::Named(name) => {
                let _ = sys::unlinkat(dir.dst.as_fd(), &name, false);
            }
            StagedAt::Unnamed | StagedAt::Committed => {}
        }
    }
}
