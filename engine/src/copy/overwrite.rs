//! The overwrite policy, decided here only: what happens when the destination already has
//! an entry at a name (keep it, replace it, or refuse), and whether an existing directory
//! takes the source's metadata. Every step that can meet an existing entry (the first look,
//! the commit that may race with a new entry, a hard link) asks here, so the policy cannot
//! drift between them.

use std::ffi::CStr;
use std::io;
use std::os::fd::AsFd;

use crate::options::{Options, Overwrite, Part};
use crate::sys::{self, Stat};

use super::{is_type, Ctx, Fail, OpenDir};

fn conflict(msg: &str) -> io::Error {
    io::Error::new(io::ErrorKind::AlreadyExists, msg.to_string())
}

/// Whether a directory gets the source directory's metadata once its children are done.
/// Merging under if-changed or always makes existing directories match the source too
/// (that is what finishes an interrupted copy); under never they are left alone.
/// A resumed copy finishes the directories the interrupted one made. A part of a split
/// copy leaves directory metadata to the final `DirsOnly` run.
pub(super) fn takes_source_meta(opts: &Options, fresh: bool) -> bool {
    match opts.select {
        Part::All => fresh || opts.overwrite != Overwrite::Never || opts.resume,
        Part::Slice { .. } => false,
        Part::Directories => true,
    }
}

impl<'a> Ctx<'a> {
    /// Under a merge, decide whether an existing destination entry stops this one.
    pub(super) fn keep_existing(
        &self,
        dir: &OpenDir,
        name: &CStr,
        st: &Stat,
    ) -> Result<bool, Fail> {
        if dir.fresh {
            return Ok(false);
        }
        let existing = match sys::lstatat(dir.dst.as_fd(), name) {
            Ok(d) => d,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(false),
            Err(e) => return Err(("stat destination", e)),
        };
        if is_type(&existing, libc::S_IFDIR) {
            return Err((
                "replace",
                conflict("destination is a directory; the source is not"),
            ));
        }
        Ok(match self.opts.overwrite {
            Overwrite::Never => true,
            // Same type, size, mtime (and device number): the rsync quick check, for
            // links and special files as well as regular files.
            Overwrite::IfChanged => {
                existing.st_mode & libc::S_IFMT == st.st_mode & libc::S_IFMT
                    && existing.st_size == st.st_size
                    && existing.st_rdev == st.st_rdev
                    && existing.st_mtime == st.st_mtime
                    && existing.st_mtime_nsec == st.st_mtime_nsec
            }
            Overwrite::Always => false,
        })
    }

    /// [`Ctx::keep_existing`] for a regular file. Under `overwrite: Always` an existing file
    /// is replaced, except by a resumed copy when an earlier run of this copy listed it and
    /// it is still what it wrote.
    pub(super) fn keep_existing_file(
        &self,
        dir: &OpenDir,
        name: &CStr,
        st: &Stat,
    ) -> Result<bool, Fail> {
        let done_before = self.opts.resume
            && self.opts.overwrite == Overwrite::Always
            && !dir.fresh
            && self.is_listed(&dir.child_path(name))
            && self.may_be_finished(dir, name, st)?;
        Ok(done_before || self.keep_existing(dir, name, st)?)
    }

    /// Whether a commit into `dir` replaces an entry it finds at the name (it was judged
    /// replaceable by `keep_existing` first). In a directory this copy created, an entry at
    /// the name can only have been made by someone else meanwhile: never replaced.
    pub(super) fn may_replace(&self, dir: &OpenDir) -> bool {
        !dir.fresh && self.opts.overwrite != Overwrite::Never
    }

    /// Whether an entry that appeared at a name in `dir` after `keep_existing` looked (the
    /// commit meets `EEXIST`) is kept and this entry skipped, rather than a failure: the
    /// policy keeps whatever it finds in a merge under never.
    pub(super) fn keeps_newcomer(&self, dir: &OpenDir) -> bool {
        !dir.fresh && self.opts.overwrite == Overwrite::Never
    }
}
