//! The overwrite policy, decided here only: what happens when the destination already has
//! an entry at a name (keep it, replace it, or refuse), and whether an existing directory
//! takes the source's metadata. Every step that can meet an existing entry (the first look,
//! the commit that may race with a new entry, a hard link) asks here, so the policy cannot
//! drift between them.

use std::ffi::CStr;
use std::io;
use std::os::fd::AsFd;

use crate::options::Overwrite;
use crate::sys::{self, Stat};

use super::{is_type, Ctx, DirNode, Fail};

fn conflict(msg: &str) -> io::Error {
    io::Error::new(io::ErrorKind::AlreadyExists, msg.to_string())
}

impl<'a> Ctx<'a> {
    /// Under a merge, decide whether an existing destination entry stops this one.
    pub(super) fn keep_existing(
        &self,
        dir: &DirNode,
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
}
